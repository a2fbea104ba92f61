"""The graph verifier: every zoo graph passes; each broken promise is named."""

from __future__ import annotations

import dataclasses

import pytest

from t10c import frontend
from t10c.cli import main
from t10c.driver import load_source
from t10c.graphcheck import GraphError, verify_graph
from t10c.ir import Graph, Operand, View


def graph_of(name: str) -> Graph:
    return frontend.to_graph(load_source(name, seq_len=16, weights=False))


@pytest.mark.parametrize("name", ["mlp", "bert-tiny", "gpt2-tiny", "vit-tiny", "llama-tiny",
                                  "llama-tiny-decode", "resnet-tiny", "matmul-8x16x4"])
def test_zoo_graphs_keep_the_frontends_promises(name: str) -> None:
    verify_graph(graph_of(name))


def _with_op(graph: Graph, index: int, **changes: object) -> Graph:
    ops = list(graph.ops)
    ops[index] = dataclasses.replace(ops[index], **changes)
    return dataclasses.replace(graph, ops=tuple(ops))


def test_every_violation_is_named_at_once() -> None:
    g = graph_of("mlp")
    first, second = g.ops[0], g.ops[1]
    g = _with_op(g, 0, axes=tuple((a, e + 1) for a, e in first.axes))  # extents off by one
    g = _with_op(g, 1, body=("frobnicate", ("in", 0)))
    with pytest.raises(GraphError) as info:
        verify_graph(g)
    text = str(info.value)
    assert f"op {first.name}" in text and f"op {second.name}" in text
    assert "has extent" in text and "unknown body function 'frobnicate'" in text


def test_an_op_that_reads_a_later_result_is_out_of_order() -> None:
    g = graph_of("mlp")
    ops = list(g.ops)
    ops[0], ops[1] = ops[1], ops[0]
    with pytest.raises(GraphError, match="read before anything computes it"):
        verify_graph(dataclasses.replace(g, ops=tuple(ops)))


def test_a_reduction_without_a_combine_and_a_bad_view() -> None:
    g = graph_of("matmul-8x16x4")
    g = _with_op(g, 0, combine=None)
    source = g.ops[0].output.tensor
    bad = View("odd", source, (3, 5))
    g = dataclasses.replace(g, views={**g.views, "odd": bad})
    with pytest.raises(GraphError) as info:
        verify_graph(g)
    assert "nothing combines" in str(info.value) and "view odd" in str(info.value)


def test_an_unknown_tensor_and_a_missing_output() -> None:
    g = graph_of("matmul-8x16x4")
    op = g.ops[0]
    g = _with_op(g, 0, inputs=(Operand("ghost", op.inputs[0].axes), *op.inputs[1:]))
    g = dataclasses.replace(g, outputs=(*g.outputs, "nowhere"))
    with pytest.raises(GraphError) as info:
        verify_graph(g)
    assert "ghost is not a tensor" in str(info.value)
    assert "graph output nowhere is never computed" in str(info.value)


def test_an_output_grown_in_place_is_checked() -> None:
    """An output grown in place (`t10c.ir.Append`, a KV cache on a chip with DRAM) needs a
    graph input that begins it, new rows that fill the rest, and no op computing it."""
    from t10c.ir import Append
    from t10c.partition.dram import grow_in_place

    split = frontend.to_graph(load_source("llama-tiny-decode", seq_len=16, weights=False),
                              split_cache=True)
    grown = grow_in_place(split)
    verify_graph(grown)
    out, good = next(iter(grown.appends.items()))
    bad = {out: dataclasses.replace(good, base="input_ids"),
           "logits": Append(good.base, good.rows, good.axis, good.length)}
    with pytest.raises(GraphError) as info:
        verify_graph(dataclasses.replace(grown, appends={**grown.appends, **bad}))
    text = str(info.value)
    assert f"graph output {out}: does not begin with input_ids" in text
    assert "graph output logits: is grown in place and computed by an op too" in text


def test_an_input_gathered_from_a_table_is_checked() -> None:
    """Rows gathered from a table (`t10c.ir.Gathered`, an embedding on a chip with DRAM)
    need a weight table, integer ids the caller feeds, and one row for every id."""
    from t10c.ir import Gathered
    from t10c.partition.dram import gather_by_dma

    graph = gather_by_dma(frontend.to_graph(load_source("llama-tiny-decode", seq_len=16,
                                                        weights=False)))
    verify_graph(graph)
    (rows, good), = graph.gathers.items()
    assert good == Gathered("embed_tokens.weight", "input_ids")
    past = next(t for t in graph.inputs if t.startswith("past"))
    bad = {rows: Gathered(good.table, past), "logits": good}
    with pytest.raises(GraphError) as info:
        verify_graph(dataclasses.replace(graph, gathers=bad))
    text = str(info.value)
    assert f"gathered input {rows}: its ids {past} are not an integer input" in text
    assert "gathered input logits: is gathered from a table but is no graph input" in text
    wrong = dataclasses.replace(graph, tensors={**graph.tensors, rows: dataclasses.replace(
        graph.tensors[rows], shape=(2, 128))})
    with pytest.raises(GraphError, match=f"gathered input {rows}: holds 256 elements, not "
                                         "one row of embed_tokens.weight for each of the 1"):
        verify_graph(wrong)


def test_compile_check_runs_the_verifiers(capsys) -> None:
    assert main(["compile", "bert-tiny", "--chip", "test16", "--seq-len", "16", "--check",
                 "--run", "--no-table"]) == 0
    assert "OK" in capsys.readouterr().out
