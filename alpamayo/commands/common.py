"""Arguments shared by several sub-commands, and the text model they select."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from alpamayo.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BACKENDS = ("torch", "ttnn")
RECIPE_HELP = "ttnn precision recipe: accuracy, performance or a recipe YAML file (see alpamayo.tt.precision)"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (HF or Alpamayo layout)")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="torch",
        help="torch (CPU/CUDA reference) or ttnn (one Tenstorrent Blackhole p150)",
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float32", help="torch backend: weights and activations"
    )
    parser.add_argument("--device", default="cpu", help="torch backend: cpu or cuda[:N]")
    parser.add_argument("--recipe", default="performance", help=RECIPE_HELP)
    parser.add_argument(
        "--tt-cache",
        default=None,
        help="ttnn backend: directory for the packed weight cache (.tensorbin files)",
    )


def resolve_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: supported devices are cpu and cuda")
    return device


@contextmanager
def text_model(args: argparse.Namespace, cfg: ModelConfig, max_seq_len: int) -> Iterator[Any]:
    """The text backbone of `--backend` with its cache set up for `max_seq_len`; closed on exit (ttnn)."""
    if args.backend == "ttnn":
        from alpamayo.tt.text import TTTextModel

        with TTTextModel.from_checkpoint(
            args.checkpoint, cfg, precision=args.recipe, cache_dir=args.tt_cache
        ) as model:
            model.setup_cache(max_seq_len)
            yield model
        return
    from alpamayo.text import TextModel

    model = TextModel.from_checkpoint(args.checkpoint, cfg, DTYPES[args.dtype], resolve_device(args.device))
    model.setup_cache(max_seq_len)
    yield model
