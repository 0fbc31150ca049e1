"""Tiny random Qwen3-VL configs whose dimensions the ttnn backend can place on a Blackhole p150.

Device constraints (see `alpamayo.plan.programs`): head_dim 32 or a multiple of 64 (device rotary), the
fused QKV width a multiple of 256 (32 x 8 DRAM banks), MoE expert counts a multiple of 32. The intermediate
sizes, vocabularies and some hidden sizes deliberately are not multiples of their device granule, so the zero
padding of the MLP, the experts, the lm_head and the residual stream is exercised. `VISION_72` has the real
models' 72-wide vision heads (padded to 128 lanes on the device) and an MLP width off the tile grid.

The device tests (tests/test_tt_*_device.py) also run on a real checkpoint named by `REAL_ENV`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from alpamayo.config.model import ModelConfig, parse_config
from alpamayo.plan.precision import Precision
from alpamayo.text import TextModel
from alpamayo.tt.quantized import QuantizedCheckpoint
from tests.hf_checkpoints import hf_config, save_checkpoint, text_config

# A real Qwen3-VL checkpoint directory for the device tests, its recipe, and where its packed weights are cached.
REAL_ENV, RECIPE_ENV, CACHE_ENV = "ALPAMAYO_TT_CHECKPOINT", "ALPAMAYO_TT_RECIPE", "ALPAMAYO_TT_CACHE"


def real_recipe() -> str:
    """The recipe of the real-checkpoint device tests: `RECIPE_ENV`, default performance."""
    return os.environ.get(RECIPE_ENV, "performance")


REAL_ROPE = {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20]}

TT_TINY = {
    # GQA 2:1, real head_dim and M-RoPE sections, intermediate 640 (padded to 768), vocab 317 (padded to 320)
    "gqa2": dict(
        text=text_config(
            vocab_size=317,
            hidden_size=256,
            intermediate_size=640,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            rope_parameters=REAL_ROPE,
        ),
        tie=False,
    ),
    # GQA 8:1 as in Qwen3-VL-32B, tied head, hidden 512 over a 16-core residual grid
    "gqa8-tied": dict(
        text=text_config(
            vocab_size=300,
            hidden_size=512,
            intermediate_size=768,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=128,
            rope_parameters=REAL_ROPE,
        ),
        tie=True,
    ),
    # Qwen3-VL-MoE: hidden 128 (a 256-wide residual stream), 32 experts of width 48 (padded to 64), top-4
    "moe": dict(
        text=text_config(
            vocab_size=300,
            hidden_size=128,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [8, 4, 4]},
            num_experts=32,
            num_experts_per_tok=4,
            moe_intermediate_size=48,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        ),
        tie=False,
        moe=True,
    ),
}

# Random routers (logit std ~1 over 32 experts) left 3 of 8 decode tokens of the tiny MoE model within 2% of a
# top-k tie, where bf16 rounding may pick the other expert; x4 makes the routing as decisive as a trained one.
ROUTER_SCALE = 4.0

# The real Qwen3-VL vision heads are 72 wide (hidden 1152 / 16 heads): 4 such heads, MLP width 300.
VISION_72 = dict(
    depth=2,
    hidden_size=288,
    intermediate_size=300,
    num_heads=4,
    in_channels=3,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=64,
    deepstack_visual_indexes=[0, 1],
    hidden_act="gelu_pytorch_tanh",
)


def tiny_config(spec: dict, name: str) -> ModelConfig:
    """The parsed config of a test checkpoint spec (a `TT_TINY` or `GOLDEN` entry) without saving weights."""
    cfg = hf_config(spec["text"], tie=spec["tie"], moe=spec.get("moe", False))
    return parse_config(cfg.to_dict(), f"{name}/config.json")


def save_tt_checkpoint(path: Path, name: str, seed: int, vision: dict | None = None) -> torch.nn.Module:
    """Save TT_TINY[name] (random weights, tokenizer; the vision tower `vision`, default the small test one) to
    `path`; returns the transformers model.

    An untied lm_head is overwritten on disk with a copy of the token embeddings (still a separate tensor, so
    the untied load path is what runs). Random heads give near-tied logits: for 'gqa2' 30% of greedy steps have
    a top-1/top-2 gap under 0.1 logit std, so even the torch bfloat16 model agrees with float32 on only 95.3%
    of 128 teacher-forced tokens; an embedding-shaped head peaks like a trained one and keeps the top-1 test
    about the device rather than about ties. MoE routers are scaled by `ROUTER_SCALE` for the same reason.
    """
    spec = TT_TINY[name]
    hf = save_checkpoint(path, spec["text"], vision, tie=spec["tie"], moe=spec.get("moe", False), seed=seed)
    file = path / "model.safetensors"
    tensors = load_file(file)
    if not spec["tie"]:
        head = next(k for k in tensors if k.endswith("lm_head.weight"))
        embed = next(k for k in tensors if k.endswith("embed_tokens.weight"))
        tensors[head] = tensors[embed].clone()
    for key in [k for k in tensors if k.endswith("mlp.gate.weight")]:
        tensors[key] = tensors[key] * ROUTER_SCALE
    save_file(tensors, file, metadata={"format": "pt"})
    return hf


def reference_and_device(
    path: str | Path,
    precision: Precision,
    device: Any,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | None = None,
) -> tuple[TextModel, Any]:
    """A card test's pair: the torch text model on `path`'s weights rounded as `precision` stores them on the
    device (`QuantizedCheckpoint`, in `dtype`), so that a comparison measures the device program and not the
    recipe, and the ttnn `TTTextModel` of `path` on `device` (with its packed-weight `cache_dir`)."""
    from alpamayo.tt.text import TTTextModel

    rounded = QuantizedCheckpoint(Path(path), precision)
    ref = TextModel.from_checkpoint(rounded, rounded.config, dtype=dtype)
    tt = TTTextModel.from_checkpoint(path, precision=precision, device=device, cache_dir=cache_dir)
    return ref, tt
