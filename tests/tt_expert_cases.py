"""Action-expert configs and random expert checkpoints for the ttnn expert's tests.

`TINY_EXPERT` sits on the tiny `gqa2` text model of `tests.tt_checkpoints` (2 layers, 2 KV heads of 128): a
hidden size of 128 (the residual stream is padded to 256 on the device), an MLP width off the tile grid and a
small in-projection. `release_cut(layers)` is Alpamayo 1.5 (Qwen3-VL-8B + the 2.3 B expert) with both models cut
to `layers` layers, the real dimensions the dry run places.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from alpamayo.config.builtin import builtin_expert
from alpamayo.config.expert import ExpertConfig, parse_expert_config
from alpamayo.config.model import ModelConfig
from alpamayo.expert.demo import random_expert_weights
from tests.tt_checkpoints import TT_TINY, save_tt_checkpoint

TINY_EXPERT_FIELDS = {
    "expert_cfg": {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 128, "intermediate_size": 200},
    "action_in_proj_cfg": {
        "num_enc_layers": 2,
        "hidden_size": 64,
        "num_fourier_feats": 20,
        "max_freq": 100.0,
    },
    "diffusion_cfg": {"int_method": "euler", "num_inference_steps": 10},
}
TINY_VLM = "gqa2"


def tiny_expert() -> ExpertConfig:
    """The tiny expert over `TT_TINY[TINY_VLM]`'s text config."""
    return parse_expert_config(TINY_EXPERT_FIELDS, TT_TINY[TINY_VLM]["text"], "tiny expert")


def release_cut(layers: int) -> tuple[ModelConfig, ExpertConfig]:
    """Alpamayo 1.5 10B with the VLM and the expert cut to `layers` layers (and no vision tower); the VLM's
    config keeps no expert fields of its own (they describe the uncut expert)."""
    cfg, expert = builtin_expert("alpamayo-1.5-10b")
    cfg = replace(cfg, text=replace(cfg.text, num_hidden_layers=layers), vision=None, extra={})
    return cfg, replace(expert, text=replace(expert.text, num_hidden_layers=layers))


def save_expert_weights(directory: Path, expert: ExpertConfig, seed: int = 0) -> Path:
    """`alpamayo.expert.demo.random_expert_weights` stored in bf16 as `directory`/model.safetensors."""
    tensors = random_expert_weights(expert, seed)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, directory / "model.safetensors"
    )
    return directory


def save_alpamayo_checkpoint(path: Path, seed: int = 0) -> Path:
    """`TT_TINY[TINY_VLM]` with `tiny_expert()` as one Alpamayo checkpoint: the Qwen3-VL config nested under
    `vlm_config` with the expert's fields beside it, the VLM's tensors under `vlm.` and the expert's under
    their own names (`random_expert_weights`, float32), one model.safetensors."""
    save_tt_checkpoint(path, TINY_VLM, seed)
    config = path / "config.json"
    raw = json.loads(config.read_text())
    config.write_text(
        json.dumps({"model_type": "alpamayo_test", "vlm_config": raw, **TINY_EXPERT_FIELDS}, indent=2)
    )
    file = path / "model.safetensors"
    tensors = {f"vlm.{k}": v for k, v in load_file(file).items()}
    tensors.update(random_expert_weights(tiny_expert(), seed))
    save_file({k: v.contiguous() for k, v in tensors.items()}, file, metadata={"format": "pt"})
    return path
