"""The ttnn models at real dimensions on the dry run's mock p150, without their weights.

A real model's weights are gigabytes, and packing them on the host would take minutes for a device that
ignores their values. These builders plan a published config (`alpamayo.config.builtin`) with its layer count cut
and allocate every device weight uninitialised where the checkpoint's would go (`allocate_weights`: same
shape, dtype, layout and memory config), so every op of the model runs its host-side checks at the real
shapes:

    cfg = cut_config("qwen3-vl-32b", layers=2, vision_depth=1)
    with text_model(cfg, "performance", device) as model:   # device: the dry run's (`open_device`)
        model.setup_cache(256)
        model.prefill(torch.arange(130))
"""

from __future__ import annotations

import json
from typing import Any

import torch

from alpamayo.config.builtin import CONFIG_DIR, NAMES, model_block_config
from alpamayo.config.model import ModelConfig, parse_config
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.plan.device_spec import DeviceSpec
from alpamayo.plan.precision import Precision, load_precision
from alpamayo.plan.programs.text import plan_text
from alpamayo.plan.programs.vision import plan_vision
from alpamayo.plan.vision_weights import vision_weight_specs
from alpamayo.plan.weights import text_weight_specs
from alpamayo.tt.text import TTTextModel
from alpamayo.tt.text.weights import TextWeights
from alpamayo.tt.vision import TTVisionEncoder
from alpamayo.tt.weight_cache import allocate_weights


def cut_config(name: str, layers: int, vision_depth: int = 1) -> ModelConfig:
    """The built-in config `name` (e.g. 'qwen3-vl-8b') with `layers` text layers and `vision_depth` vision
    blocks; the DeepStack levels sit at the last blocks (one per block, at most `vision_depth` of them).
    Every other dimension as published."""
    if name not in NAMES:
        raise ValueError(f"unknown built-in config {name!r}; available: {NAMES}")
    raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    text, vision = raw["text_config"], raw["vision_config"]
    if not 1 <= layers <= text["num_hidden_layers"] or not 1 <= vision_depth <= vision["depth"]:
        raise ValueError(
            f"{name}: layers {layers} must be in [1, {text['num_hidden_layers']}] and vision_depth "
            f"{vision_depth} in [1, {vision['depth']}]"
        )
    text["num_hidden_layers"] = layers
    levels = len(vision["deepstack_visual_indexes"])
    vision["depth"] = vision_depth
    vision["deepstack_visual_indexes"] = sorted({max(0, vision_depth - levels + i) for i in range(levels)})
    return parse_config(raw, f"{name} ({layers} layers, {vision_depth} vision blocks)")


def text_model(
    cfg: ModelConfig,
    precision: str | Precision,
    device: Any,
    moe: MoEBlockConfig | None = None,
) -> TTTextModel:
    """`TTTextModel` of `cfg` on `device` (not owned: `close()` frees the weights only) with every weight
    allocated uninitialised and a zero host embedding table (a view, no memory)."""
    precision = load_precision(precision)
    block = model_block_config(cfg.text, moe)
    plan = plan_text(cfg, precision, DeviceSpec.from_device(device), moe=block)
    specs = text_weight_specs(cfg, plan.device.dram_banks)
    weights = allocate_weights(specs, precision, device, plan.device.dram_banks)
    t = cfg.text
    embed = torch.zeros(1, t.hidden_size, dtype=torch.bfloat16).expand(t.vocab_size, t.hidden_size)
    return TTTextModel(cfg, precision, plan, device, TextWeights.take(weights, t.num_hidden_layers), embed)


def vision_encoder(cfg: ModelConfig, precision: str | Precision, device: Any) -> TTVisionEncoder:
    """`TTVisionEncoder` of `cfg.vision` on `device` with every weight allocated uninitialised."""
    precision = load_precision(precision)
    spec = DeviceSpec.from_device(device)
    plan = plan_vision(cfg.vision, spec, cfg.source)
    weights = allocate_weights(vision_weight_specs(cfg.vision), precision, device, spec.dram_banks)
    table = torch.zeros(cfg.vision.num_position_embeddings, cfg.vision.hidden_size)
    return TTVisionEncoder(cfg.vision, precision, plan, device, weights, table)
