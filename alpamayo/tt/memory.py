"""DRAM budget of the ttnn text backbone: weights, KV cache, prefill activations and the decode trace.

Bytes are counted the way the device stores them: whole 32x32 tiles of the padded shapes in
`alpamayo.tt.weights.text_weight_specs`, at the tile sizes of `alpamayo.tt.precision.TILE_BYTES` (row-major
gammas at 2 bytes per element). The token embedding table stays on the host and is not counted. MoE expert
weights (when the config has them) are counted at the recipe's MLP dtypes, the router in bf16.

Prefill activations are the bf16 tensors alive at once at the peak of one decoder layer at
`max_seq_len` (text.py frees everything else as it goes): in the MLP the residual plus gate, up and their
product (`H + 3 I` per row); in attention the residual, the fused QKV, the q/k/v heads and their normed and
rotated copies (`H + 3 (q_dim + 2 kv_dim)`); plus the cos/sin tables and, for images, one DeepStack level.
"""

from __future__ import annotations

from dataclasses import dataclass

from alpamayo.config import ModelConfig
from alpamayo.errors import ConfigError
from alpamayo.tt.device_spec import P150, TILE, DeviceSpec
from alpamayo.tt.precision import PRESETS, TILE_BYTES, Precision
from alpamayo.tt.program_config import TextPlan, model_name, plan_text
from alpamayo.tt.weights import WeightSpec, round_up, text_weight_specs

BF16 = 2


def _tiles(shape: tuple[int, ...]) -> int:
    *outer, rows, cols = shape
    n = -(-rows // TILE) * -(-cols // TILE)
    for d in outer:
        n *= d
    return n


def spec_bytes(spec: WeightSpec, dtype: str) -> int:
    """DRAM bytes of one prepared weight in `dtype` (row-major tensors are bf16, unpadded)."""
    if spec.layout == "row_major":
        n = 1
        for d in spec.padded:
            n *= d
        return n * BF16
    return _tiles(spec.padded) * TILE_BYTES[dtype]


def weight_dtype(spec: WeightSpec, precision: Precision) -> str:
    return "bf16" if spec.group == "norm" else precision.dtype(spec.group)


class DoesNotFit(ConfigError):
    """The model with this recipe and context does not fit in the device's DRAM (message suggests one that does)."""


@dataclass(frozen=True)
class MemoryPlan:
    """DRAM bytes by component for one config, recipe and max_seq_len."""

    model: str
    recipe: str
    max_seq_len: int
    weights: dict[str, int]  # precision group (and "norm", "experts") -> bytes
    kv_cache: int
    activations: int
    trace_region: int
    capacity: int

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
        lines = [f"DRAM plan: {self.model}, recipe '{self.recipe}', max_seq_len {self.max_seq_len}"]
        lines += [f"  weights {group:<12} {size / gb:8.3f} GB" for group, size in self.weights.items()]
        lines += [
            f"  weights total        {self.weight_bytes / gb:8.3f} GB",
            f"  KV cache             {self.kv_cache / gb:8.3f} GB",
            f"  prefill activations  {self.activations / gb:8.3f} GB",
            f"  decode trace region  {self.trace_region / gb:8.3f} GB",
            f"  total                {self.total / gb:8.3f} GB of {self.capacity / gb:.3f} GB "
            f"({'fits' if self.fits else 'does NOT fit'})",
        ]
        return lines


def _expert_bytes(cfg: ModelConfig, precision: Precision) -> int:
    t, moe = cfg.text, cfg.text.moe
    if moe is None:
        return 0
    sparse = sum(moe.is_sparse(i) for i in range(t.num_hidden_layers))
    h, i = t.hidden_size, moe.moe_intermediate_size
    per_expert = _tiles((h, 2 * i)) * TILE_BYTES[precision.dtype("mlp_gate_up")]
    per_expert += _tiles((i, h)) * TILE_BYTES[precision.dtype("mlp_down")]
    router = _tiles((h, moe.num_experts)) * TILE_BYTES["bf16"]
    return sparse * (moe.num_experts * per_expert + router)


def _activation_bytes(cfg: ModelConfig, max_seq_len: int) -> int:
    t = cfg.text
    rows = TextPlan.padded_length(max_seq_len)
    qkv = t.q_dim + 2 * t.kv_dim
    dense = t.moe is None or any(not t.moe.is_sparse(i) for i in range(t.num_hidden_layers))
    inter = t.intermediate_size if dense else t.moe.moe_intermediate_size * t.moe.num_experts_per_tok
    per_row = max(t.hidden_size + 3 * inter, t.hidden_size + 3 * qkv)
    per_row += 2 * t.head_dim + t.hidden_size  # cos, sin and one DeepStack level
    return rows * per_row * BF16


def plan_memory(
    cfg: ModelConfig, precision: Precision, max_seq_len: int, device: DeviceSpec = P150
) -> MemoryPlan:
    """DRAM bytes of `cfg` in `precision` with a KV cache of `max_seq_len` positions (no check of the total)."""
    if max_seq_len < 1:
        raise ConfigError(f"max_seq_len must be >= 1, got {max_seq_len}")
    t = cfg.text
    weights: dict[str, int] = {}
    dense_layers = {i for i in range(t.num_hidden_layers) if t.moe is None or not t.moe.is_sparse(i)}
    for spec in text_weight_specs(cfg, device.dram_banks):
        layer = int(spec.name.split(".")[1]) if spec.name.startswith("layers.") else None
        if spec.group.startswith("mlp_") and layer not in dense_layers:
            continue
        weights[spec.group] = weights.get(spec.group, 0) + spec_bytes(spec, weight_dtype(spec, precision))
    if t.moe is not None:
        weights["experts"] = _expert_bytes(cfg, precision)
    cache_rows = TextPlan.cache_length(max_seq_len)
    kv_tiles = t.num_key_value_heads * round_up(cache_rows, TILE) // TILE * (t.head_dim // TILE)
    kv = 2 * t.num_hidden_layers * kv_tiles * TILE_BYTES[precision.dtype("kv_cache")]
    return MemoryPlan(
        model=model_name(cfg),
        recipe=precision.name,
        max_seq_len=max_seq_len,
        weights=weights,
        kv_cache=kv,
        activations=_activation_bytes(cfg, max_seq_len),
        trace_region=plan_text(cfg, precision, device).trace_region_bytes,
        capacity=device.dram_bytes,
    )


def _largest_fitting_length(cfg: ModelConfig, precision: Precision, device: DeviceSpec) -> int:
    """Longest max_seq_len (a multiple of the cache granule) that fits in `precision`; 0 if none does."""
    granule = TextPlan.cache_length(1)
    lo, hi = 0, cfg.text.max_position_embeddings // granule
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan_memory(cfg, precision, mid * granule, device).fits:
            lo = mid
        else:
            hi = mid - 1
    return lo * granule


def check_fits(
    cfg: ModelConfig, precision: Precision, max_seq_len: int, device: DeviceSpec = P150
) -> MemoryPlan:
    """The memory plan, or `DoesNotFit` naming the shortfall and a preset (or a shorter context) that fits."""
    plan = plan_memory(cfg, precision, max_seq_len, device)
    if plan.fits:
        return plan
    need = f"{plan.total / 1e9:.2f} GB (weights {plan.weight_bytes / 1e9:.2f} GB, KV cache {plan.kv_cache / 1e9:.2f} GB)"
    head = (
        f"{plan.model}: recipe '{precision.name}' at max_seq_len {max_seq_len} needs {need} but "
        f"{device.name} has {device.dram_bytes / 1e9:.2f} GB of DRAM"
    )
    for name, preset in PRESETS.items():
        other = plan_memory(cfg, preset, max_seq_len, device)
        if other.fits:
            raise DoesNotFit(f"{head}; recipe '{name}' fits ({other.total / 1e9:.2f} GB)")
    best = max(PRESETS.values(), key=lambda p: _largest_fitting_length(cfg, p, device))
    length = _largest_fitting_length(cfg, best, device)
    if length:
        raise DoesNotFit(
            f"{head}; no preset fits at this length, recipe '{best.name}' fits up to max_seq_len {length}"
        )
    raise DoesNotFit(f"{head}; no preset fits even at max_seq_len {TextPlan.cache_length(1)}")
