"""DRAM budget of the ttnn backend: weights, KV cache, prefill activations and the decode trace.

Bytes are counted the way the device stores them: whole 32x32 tiles of the padded shapes in
`alpamayo.plan.weights.text_weight_specs` (dense MLPs, MoE routers and experts included) and, for a model with
a vision tower, `alpamayo.plan.vision_weights.vision_weight_specs`, at the tile sizes of
`alpamayo.plan.precision.TILE_BYTES` (row-major gammas at 2 bytes per element). The token embedding table and
the vision position table stay on the host and are not counted.

Prefill activations are the bf16 tensors alive at once at the peak of one decoder layer at
`max_seq_len` (text.py frees everything else as it goes): in a dense MLP the residual plus gate, up and their
product (`H + 3 I` per row); in an MoE block the residual, the k expert rows of every token in gate, up and
their product, their outputs and the gathered sum (`H + k (3 I + 2 H)`); in attention the residual, the fused
QKV, the q/k/v heads and their normed and rotated copies (`H + 3 (q_dim + 2 kv_dim)`); plus the cos/sin tables
and, for images, one DeepStack level. The vision tower runs before the prefill and frees its activations, so
the peak is the larger of the two; a vision forward encodes at most 4 patches per prompt position.

With the flow-matching action expert (`expert`, by default the config's own: `expert_config_of`), its
weights join the budget (the recipe's `expert` group for
its linears), the KV cache grows by the expert's K/V region (`alpamayo.plan.programs.expert.ExpertPlan`), its
step's trace region is added, and its step's activations compete for the peak: the residual and the layer's
widest intermediate per action row as in a text layer, plus what lives through a prediction: the attention's
page table and causal bounds (int32), cos/sin, x (float32) and the in-projection's widest rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from alpamayo.config.expert import ExpertConfig, expert_config_of
from alpamayo.config.model import ModelConfig, TextConfig
from alpamayo.errors import ConfigError
from alpamayo.plan.device_spec import P150, TILE, DeviceSpec, round_up
from alpamayo.plan.expert_weights import expert_weight_specs
from alpamayo.plan.precision import PRESETS, TILE_BYTES, Precision
from alpamayo.plan.programs.expert import ExpertPlan, plan_expert
from alpamayo.plan.programs.grid import model_name
from alpamayo.plan.programs.text import TextPlan, plan_text
from alpamayo.plan.programs.vision import VisionPlan
from alpamayo.plan.vision_weights import vision_weight_specs
from alpamayo.plan.weights import (
    WeightSpec,
    rotary_head_dim,
    text_weight_specs,
    weight_dtype,
)

BF16 = 2


def spec_bytes(spec: WeightSpec, dtype: str) -> int:
    """DRAM bytes of one prepared weight in `dtype` (row-major tensors are bf16, unpadded)."""
    if spec.layout == "row_major":
        return math.prod(spec.padded) * BF16
    *outer, rows, cols = spec.padded
    tiles = math.prod(outer) * round_up(rows, TILE) * round_up(cols, TILE) // (TILE * TILE)
    return tiles * TILE_BYTES[dtype]


class DoesNotFit(ConfigError):
    """The model with this recipe and context does not fit in the device's DRAM (message suggests one that does)."""


@dataclass(frozen=True)
class MemoryPlan:
    """DRAM bytes by component for one config, recipe and max_seq_len."""

    model: str
    recipe: str
    max_seq_len: int
    weights: dict[str, int]  # precision group (or a bf16 group: norm, bias, router) -> bytes
    kv_cache: int
    activations: int
    trace_region: int
    capacity: int
    samples: int = 0  # action-expert samples per step; 0 without the expert

    @property
    def weight_bytes(self) -> int:
        return sum(self.weights.values())

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_cache + self.activations + self.trace_region

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def describe(self) -> list[str]:
        gb = 1e9
        expert = f", action expert with {self.samples} sample(s)" if self.samples else ""
        lines = [f"DRAM plan: {self.model}{expert}, recipe '{self.recipe}', max_seq_len {self.max_seq_len}"]
        lines += [f"  weights {group:<12} {size / gb:8.3f} GB" for group, size in self.weights.items()]
        lines += [
            f"  weights total        {self.weight_bytes / gb:8.3f} GB",
            f"  KV cache             {self.kv_cache / gb:8.3f} GB",
            f"  prefill activations  {self.activations / gb:8.3f} GB",
            f"  trace regions        {self.trace_region / gb:8.3f} GB",
            f"  total                {self.total / gb:8.3f} GB of {self.capacity / gb:.3f} GB "
            f"({'fits' if self.fits else 'does NOT fit'})",
        ]
        return lines


def kv_bytes(cfg: TextConfig, keys: int, dtype: str) -> int:
    """Bytes of one layer's K and V for `keys` positions in the cache dtype (whole tiles)."""
    tiles = cfg.num_key_value_heads * round_up(keys, TILE) // TILE * (cfg.head_dim // TILE)
    return 2 * tiles * TILE_BYTES[dtype]


def _activation_bytes(cfg: ModelConfig, plan: TextPlan, max_seq_len: int) -> int:
    t = cfg.text
    rows = plan.padded_length(max_seq_len)
    h = plan.hidden_padded
    qkv = t.q_dim + 2 * t.kv_dim
    per_row = h + 3 * qkv
    if plan.gate is not None:  # some layers have a dense MLP
        per_row = max(per_row, h + 3 * t.intermediate_size)
    if t.moe is not None:
        per_row = max(per_row, h + t.moe.num_experts_per_tok * (3 * t.moe.moe_intermediate_size + 2 * h))
    per_row += 2 * t.head_dim + h  # cos, sin and one DeepStack level
    text = rows * per_row * BF16
    v = cfg.vision
    if v is None:
        return text
    patches = VisionPlan.padded_length(4 * max_seq_len)
    lanes = v.num_heads * rotary_head_dim(v.head_dim)
    vision = patches * (2 * v.hidden_size + 5 * lanes + round_up(v.intermediate_size, TILE)) * BF16
    return max(text, vision)


def _expert_activation_bytes(expert: ExpertConfig, plan: ExpertPlan) -> int:
    t = expert.text
    widest = max(3 * (t.q_dim + 2 * t.kv_dim), 3 * round_up(t.intermediate_size, TILE))
    step = plan.rows * (plan.hidden_padded + widest + 3 * round_up(expert.in_proj.hidden_size, TILE)) * BF16
    # the page table and the bounds (int32; the bounds' float32 slot indices, a tile row)
    tables = plan.users * plan.pages * 4 + plan.users * plan.q_tiles * (4 + TILE * 4)
    persistent = plan.rows * (2 * t.head_dim * BF16 + 2 * TILE * 4)  # cos, sin; x and v in float32
    return step + tables + persistent


def plan_memory(
    cfg: ModelConfig,
    precision: Precision,
    max_seq_len: int,
    device: DeviceSpec = P150,
    expert: ExpertConfig | None = None,
    samples: int = 1,
    slots: int = 1,
) -> MemoryPlan:
    """DRAM bytes of `cfg` in `precision` with a KV cache of `max_seq_len` positions for each of `slots`
    sequences, and with the action expert (`expert`, default the config's own) running `samples` samples per
    step, sample b over cache slot b (so at least `samples` slots; no check of the total)."""
    expert = expert if expert is not None else expert_config_of(cfg)
    if max_seq_len < 1:
        raise ConfigError(f"max_seq_len must be >= 1, got {max_seq_len}")
    t = cfg.text
    weights: dict[str, int] = {}
    specs = text_weight_specs(cfg, device.dram_banks)
    specs += vision_weight_specs(cfg.vision) if cfg.vision is not None else []
    specs += expert_weight_specs(expert) if expert is not None else []
    for spec in specs:
        weights[spec.group] = weights.get(spec.group, 0) + spec_bytes(spec, weight_dtype(spec, precision))
    plan = plan_text(cfg, precision, device)
    activations = _activation_bytes(cfg, plan, max_seq_len)
    trace = plan.trace_region_bytes
    cache_rows = TextPlan.cache_length(max_seq_len)
    if expert is not None:
        step = plan_expert(cfg, expert, precision, max_seq_len, samples, device)
        cache_rows, slots = step.cache_rows, max(slots, samples)
        activations = max(activations, _expert_activation_bytes(expert, step))
        trace += step.trace_region_bytes
    kv = slots * t.num_hidden_layers * kv_bytes(t, cache_rows, precision.dtype("kv_cache"))
    return MemoryPlan(
        model=model_name(cfg),
        recipe=precision.name,
        max_seq_len=max_seq_len,
        weights=weights,
        kv_cache=kv,
        activations=activations,
        trace_region=trace,
        capacity=device.dram_bytes,
        samples=samples if expert is not None else 0,
    )


def _largest_fitting_length(
    cfg: ModelConfig, precision: Precision, device: DeviceSpec, expert: ExpertConfig | None, samples: int
) -> int:
    """Longest max_seq_len (a multiple of the cache granule) that fits in `precision`; 0 if none does."""
    granule = TextPlan.cache_length(1)
    lo, hi = 0, cfg.text.max_position_embeddings // granule
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan_memory(cfg, precision, mid * granule, device, expert, samples).fits:
            lo = mid
        else:
            hi = mid - 1
    return lo * granule


def check_fits(
    cfg: ModelConfig,
    precision: Precision,
    max_seq_len: int,
    device: DeviceSpec = P150,
    expert: ExpertConfig | None = None,
    samples: int = 1,
    slots: int = 1,
) -> MemoryPlan:
    """The memory plan, or `DoesNotFit` naming the shortfall and a preset (or a shorter context) that fits."""
    expert = expert if expert is not None else expert_config_of(cfg)  # parsed once, not per plan below
    plan = plan_memory(cfg, precision, max_seq_len, device, expert, samples, slots)
    if plan.fits:
        return plan
    need = f"{plan.total / 1e9:.2f} GB (weights {plan.weight_bytes / 1e9:.2f} GB, KV cache {plan.kv_cache / 1e9:.2f} GB)"
    head = (
        f"{plan.model}: recipe '{precision.name}' at max_seq_len {max_seq_len}"
        f"{f' x {slots} sequences' if slots > 1 else ''} needs {need} but "
        f"{device.name} has {device.dram_bytes / 1e9:.2f} GB of DRAM"
    )
    for name, preset in PRESETS.items():
        other = plan_memory(cfg, preset, max_seq_len, device, expert, samples, slots)
        if other.fits:
            raise DoesNotFit(f"{head}; recipe '{name}' fits ({other.total / 1e9:.2f} GB)")
    lengths = {
        name: _largest_fitting_length(cfg, preset, device, expert, samples)
        for name, preset in PRESETS.items()
    }
    best = max(lengths, key=lengths.__getitem__)
    if lengths[best]:
        raise DoesNotFit(
            f"{head}; no preset fits at this length, recipe '{best}' fits up to max_seq_len {lengths[best]}"
        )
    raise DoesNotFit(f"{head}; no preset fits even at max_seq_len {TextPlan.cache_length(1)}")
