"""The strategy table: one place says what each strategy sets, and every command reads it."""

from __future__ import annotations

import pytest

from t10c.cli import build_parser
from t10c.partition.search import SearchOptions
from t10c.strategies import DEFAULT_STRATEGIES, STRATEGIES, search_options

USER = SearchOptions(min_util=0.25, max_pad=0.1, max_steps=8, chains=True)


@pytest.mark.parametrize("name, rot_axes, weights_home, mesh_aware", [
    ("t10", 2, False, True),
    ("no-rotation", 0, False, True),
    ("vgm", 0, True, True),
    ("all-to-all", 2, False, False),
])
def test_each_strategy_sets_its_options(name: str, rot_axes: int, weights_home: bool,
                                        mesh_aware: bool) -> None:
    got = search_options(name, USER)
    assert (got.max_rot_axes, got.weights_home, got.mesh_aware) == (rot_axes, weights_home,
                                                                    mesh_aware)
    # and keeps what the user asked for
    assert (got.min_util, got.max_pad, got.max_steps, got.chains) == (0.25, 0.1, 8, True)


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="t10, no-rotation, vgm, all-to-all"):
        search_options("rotation")


def test_commands_read_the_table() -> None:
    parser = build_parser()
    compile_help = parser.parse_args(["compile", "mlp"])  # parses: the default is known
    assert compile_help.strategy == "t10"
    assert parser.parse_args(["compare", "mlp"]).strategies == list(DEFAULT_STRATEGIES)
    assert DEFAULT_STRATEGIES == ("t10", "no-rotation", "vgm")
    text = parser._subparsers._group_actions[0].choices["compile"].format_help()  # type: ignore
    text = " ".join(text.split())  # argparse wraps the help
    for name, strategy in STRATEGIES.items():
        assert f"{name}: {strategy.description}" in text
