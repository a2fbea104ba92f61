"""Export Hugging Face architectures with random weights to ONNX, as users' models come.

    python -m t10c.models.export OUT_DIR [--names bert,gpt2,vit,llama,llama-mask,resnet]
                                         [--dynamic] [--fixtures]

Needs PyTorch and transformers (``pip install torch transformers onnxscript``); without them it
prints what is missing and exits 0, so that scripts and tests can call it unconditionally.
Nothing is downloaded: every model is built from a config with seeded random weights
(``torch.manual_seed``), tiny enough that each file stays under 2 MB, and exported with
``torch.onnx.export`` (the dynamo exporter, opset 18). The committed test fixtures under
``tests/fixtures/`` were made by this script (see `FIXTURES`).

With ``--dynamic`` the batch and sequence dimensions are exported as dynamic, so that the model
needs ``--shape`` to compile (``t10c compile gpt2-dynamic.onnx --shape input_ids=1x16``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

SEQ = 16
IMAGE = 32
SEED = 0

#: file name -> (architecture, dynamic)
FIXTURES = {
    "bert-hf.onnx": ("bert", False),
    "gpt2-hf.onnx": ("gpt2", False),
    "vit-hf.onnx": ("vit", False),
    "llama-hf.onnx": ("llama", False),
    "resnet-hf.onnx": ("resnet", False),
    "gpt2-hf-dynamic.onnx": ("gpt2", True),
    "llama-hf-mask-dynamic.onnx": ("llama-mask", True),
}


def missing() -> list[str]:
    """The packages this script needs that are not installed."""
    return [p for p in ("torch", "transformers", "onnxscript")
            if importlib.util.find_spec(p) is None]


def _bert():
    import torch
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=64)
    model = BertModel(cfg, add_pooling_layer=False)
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ))
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    return model, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"]


def _gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                     use_cache=False)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ))
    return model, (ids,), ["input_ids"], ["logits"]


def _vit():
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=IMAGE, patch_size=8, num_channels=3, hidden_size=64,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                    num_labels=10)
    model = ViTForImageClassification(cfg)
    pixels = torch.randn(1, 3, IMAGE, IMAGE)
    return model, (pixels,), ["pixel_values"], ["logits"]


def _llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, use_cache=False)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ))
    return model, (ids,), ["input_ids"], ["logits"]


def _llama_mask():
    """LLaMA with a padding mask input and a batch of two (the second row padded)."""
    import torch

    model, (ids,), inputs, outputs = _llama()
    ids = torch.cat([ids, ids.flip(1)])
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    mask[1, SEQ - 4:] = 0
    return model, (ids, mask), inputs + ["attention_mask"], outputs


def _resnet():
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32, 64],
                       depths=[1, 1, 1], layer_type="bottleneck", num_labels=10)
    model = ResNetForImageClassification(cfg)
    pixels = torch.randn(1, 3, IMAGE, IMAGE)
    return model, (pixels,), ["pixel_values"], ["logits"]


BUILDERS: dict[str, Callable] = {"bert": _bert, "gpt2": _gpt2, "vit": _vit, "llama": _llama,
                                 "llama-mask": _llama_mask, "resnet": _resnet}


class _Logits:
    """Wraps a Hugging Face model so that it returns a plain tensor (the first output)."""

    def __new__(cls, model, names):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args):
                kwargs = dict(zip(names, args))
                out = self.model(**kwargs, return_dict=True)
                return out[0]

        return Wrapper()


def export(arch: str, path: Path, dynamic: bool = False) -> Path:
    """Export one architecture to ``path`` (random weights from seed `SEED`)."""
    import torch

    torch.manual_seed(SEED)
    model, args, inputs, outputs = BUILDERS[arch]()
    model.eval()
    wrapped = _Logits(model, inputs).eval()
    dynamic_shapes = None
    if dynamic:
        batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=64)
        # one entry for the wrapper's *args, holding one spec per input
        dynamic_shapes = (tuple({0: batch, 1: seq} if a.dim() == 2 else {0: batch}
                                for a in args),)
    with torch.no_grad():
        torch.onnx.export(wrapped, args, str(path), input_names=inputs, output_names=outputs,
                          dynamo=True, opset_version=18, dynamic_shapes=dynamic_shapes,
                          external_data=False, verbose=False)
    _strip(path)
    return path


def _strip(path: Path) -> None:
    """Drop the exporter's per-node metadata (stack traces with local paths) and doc strings:
    the files get smaller and do not depend on where they were made."""
    import onnx

    model = onnx.load(str(path))
    model.doc_string = ""
    model.graph.doc_string = ""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for value in [*model.graph.value_info, *model.graph.input, *model.graph.output]:
        del value.metadata_props[:]
    onnx.save(model, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the .onnx files")
    parser.add_argument("--names", default=",".join(BUILDERS),
                        help=f"architectures, comma-separated (default: all of {list(BUILDERS)})")
    parser.add_argument("--dynamic", action="store_true",
                        help="export batch and sequence as dynamic dimensions")
    parser.add_argument("--fixtures", action="store_true",
                        help="write the committed test fixtures (FIXTURES) instead")
    args = parser.parse_args(argv)
    lacking = missing()
    if lacking:
        print(f"skipping the export: {', '.join(lacking)} not installed "
              f"(pip install {' '.join(lacking)})")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = (list(FIXTURES.items()) if args.fixtures else
            [(f"{a}-hf{'-dynamic' if args.dynamic else ''}.onnx", (a, args.dynamic))
             for a in args.names.split(",")])
    for name, (arch, dynamic) in jobs:
        if arch not in BUILDERS:
            print(f"unknown architecture {arch!r}; known: {', '.join(BUILDERS)}",
                  file=sys.stderr)
            return 2
        path = export(arch, args.out / name, dynamic)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
