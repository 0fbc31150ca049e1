"""A checkpoint whose weights read back exactly as the ttnn backend holds them under a precision recipe.

`QuantizedCheckpoint(directory, recipe)` serves every tensor the device stores (text decoder with MoE routers
and experts, vision tower, the flow-matching action expert of an Alpamayo checkpoint) prepared in its device
layout (`alpamayo.plan.weights.prepare`), rounded there to its
dtype (bfp8 / bfp4 by `alpamayo.plan.block_float`, bit-exact with ttnn's packer; bf16 round-to-nearest-even,
as ttnn converts), and restored to the checkpoint's layout (`alpamayo.plan.weights.restore`). Block-float blocks
run along the device layout's rows (for a linear `[K, N]`, 16 consecutive outputs of one input), so this
differs from rounding the checkpoint tensor as stored. The token embedding table, which the backend looks up
on the host in bf16, reads back in bf16. No ttnn is needed.

A torch model built from it (`TextModel.from_checkpoint(q, q.config)`) computes with the device's weights: the
reference that isolates a device implementation's error from the recipe's rounding, and the model whose
drift from the unrounded one `alpamayo precision` reports. A tied lm_head is rounded in the `lm_head` dtype
while the embedding stays bf16, as on the device, so `q.config` unties the head and `lm_head.weight` is
served.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from alpamayo.checkpoint import Checkpoint, Getter
from alpamayo.config.expert import ExpertConfig, expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.expert.weights import has_expert_weights
from alpamayo.plan.block_float import quantize
from alpamayo.plan.device_spec import P150
from alpamayo.plan.expert_weights import expert_weight_specs
from alpamayo.plan.precision import Precision, load_precision
from alpamayo.plan.vision_weights import vision_weight_specs
from alpamayo.plan.weights import WeightSpec, prepare, restore, text_weight_specs, weight_dtype
from alpamayo.text.moe.weights import (
    DOWN,
    EXPERT_DOWN,
    EXPERT_GATE,
    EXPERT_UP,
    GATE_UP,
    ExpertView,
    disk_layout,
    fused_expert_tensors,
)
from alpamayo.text.weights import EMBED, LM_HEAD


def rounded(spec: WeightSpec, get: Getter, precision: Precision) -> dict[str, torch.Tensor]:
    """The sources of `spec` (as `restore` names them) with the device's rounding applied in its layout."""
    return restore(spec, round_to(prepare(spec, get), weight_dtype(spec, precision)))


def rounded_expert(get: Getter, expert: ExpertConfig, precision: str | Precision) -> dict[str, torch.Tensor]:
    """Every tensor of the action `expert` read through `get`, as the device holds it under `precision`,
    in its checkpoint name, shape and layout (the torch expert built from these computes with the device's
    weights)."""
    precision = load_precision(precision)
    shapes = expert.weight_shapes()
    out = {}
    for spec in expert_weight_specs(expert):
        out.update({name: t.reshape(shapes[name]) for name, t in rounded(spec, get, precision).items()})
    return out


def round_to(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """`t` (any float dtype) as float32 values the device holds in `dtype` (bf16, bfp8 or bfp4; blocks of 16
    along the last dim)."""
    if dtype == "bf16":
        return t.to(torch.bfloat16).float()
    return torch.from_numpy(quantize(t.detach().float().cpu().numpy(), dtype))


class QuantizedCheckpoint(Checkpoint):
    """See module docstring. `config` is the model config to build from it (tied heads untied)."""

    def __init__(
        self,
        directory: str | Path,
        recipe: str | Precision,
        dram_banks: int = P150.dram_banks,
        base_model: str | Path | None = None,
    ):
        cfg = load_model_config(directory, base_model)
        super().__init__(directory, cfg.weight_prefix)
        self.precision = load_precision(recipe)
        self.config = replace(cfg, tie_word_embeddings=False)
        self._view = ExpertView(cfg.text, super().get)
        specs = text_weight_specs(cfg, dram_banks)
        specs += vision_weight_specs(cfg.vision) if cfg.vision is not None else []
        expert = expert_config_of(cfg)
        if expert is not None and has_expert_weights(self, expert):
            specs += expert_weight_specs(expert)
        self._specs: dict[str, list[WeightSpec]] = {}  # checkpoint name -> the specs that produce it
        for spec in specs:
            if spec.group == "experts":  # the three views of a layer's two fused tensors
                prefix = spec.sources[0].rpartition("experts.")[0]
                for name in (prefix + GATE_UP, prefix + DOWN):
                    self._specs.setdefault(name, []).append(spec)
            elif spec.name == "lm_head":
                self._specs[LM_HEAD] = [spec]
            else:
                for name in spec.sources:
                    self._specs[name] = [spec]
        if cfg.tie_word_embeddings:
            self._entries[LM_HEAD] = self._entries[EMBED]
        self._ready: dict[str, torch.Tensor] = {}

    def _experts(self, name: str) -> None:
        """Round a sparse layer's three expert specs and queue both fused tensors in the on-disk layout."""
        prefix = name.rpartition("experts.")[0]
        views: dict[str, torch.Tensor] = {}
        for spec in self._specs[name]:
            views.update(rounded(spec, self._view, self.precision))
        layout = disk_layout(
            self.config.text, prefix, self.shape(prefix + GATE_UP), self.shape(prefix + DOWN)
        )
        gate, up, down = (views[prefix + view] for view in (EXPERT_GATE, EXPERT_UP, EXPERT_DOWN))
        self._ready[prefix + GATE_UP], self._ready[prefix + DOWN] = fused_expert_tensors(
            gate, up, down, layout
        )

    def get(
        self, name: str, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        if name not in self._ready:
            specs = self._specs.get(name)
            if specs is None:
                t = super().get(name)
                self._ready[name] = t.to(torch.bfloat16).to(t.dtype) if name == EMBED else t
            elif name.endswith((GATE_UP, DOWN)):
                self._experts(name)
            else:
                for source, tensor in rounded(specs[0], self._view, self.precision).items():
                    key = LM_HEAD if specs[0].name == "lm_head" else source
                    self._ready[key] = tensor.reshape(self.shape(source))
        t = self._ready.pop(name)
        if dtype is not None:
            t = t.to(dtype)
        return t.to(device) if torch.device(device).type != "cpu" else t
