"""The text backbone's weights onto the device, and their per-layer view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.model import ModelConfig
from alpamayo.plan.precision import Precision
from alpamayo.plan.programs.text import TextPlan
from alpamayo.plan.weights import text_weight_specs
from alpamayo.text.moe.weights import ExpertView
from alpamayo.tt.weight_cache import upload_weights


def layer_weights(weights: dict[str, Any], i: int, scope: str = "") -> dict[str, Any]:
    """Layer i's device weights keyed without the `{scope}layers.{i}.` prefix (wqkv, attn_norm.rm, ...);
    `scope` is "expert." for the action expert's layers."""
    prefix = f"{scope}layers.{i}."
    return {name[len(prefix) :]: w for name, w in weights.items() if name.startswith(prefix)}


def upload_text_weights(
    cfg: ModelConfig,
    precision: Precision,
    plan: TextPlan,
    device: Any,
    ckpt: Checkpoint,
    cache_dir: str | Path | None,
) -> dict[str, Any]:
    """Every text `WeightSpec` (experts through their per-projection views) on its device placement."""
    banks = plan.device.dram_banks
    specs = text_weight_specs(cfg, banks)
    return upload_weights(specs, precision, device, ExpertView(cfg.text, ckpt.get), cache_dir, banks)
