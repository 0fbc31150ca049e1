"""Host-side preparation of the device weights (pure torch functions; no ttnn), and its exact inverse.

Every device tensor is described by a `WeightSpec` (name, checkpoint sources, transform, logical and padded
shape, placement); `prepare` turns a spec into the padded torch tensor that is then tilized / packed to the
spec's dtype, and `restore` maps a device-layout tensor back to its sources (the precision planner uses it to
put block-float rounding done in the device layout back into a checkpoint). Layouts:

  * linear weights are transposed to `[K, N]` (in_features x out_features), so `x @ W` runs on device;
  * the fused QKV weight is `[hidden, (n_heads + 2 n_kv) head_dim]` with columns q heads, k heads, v heads,
    each head's `head_dim` columns contiguous: the order `nlp_create_qkv_heads(_decode)` splits;
  * the text residual stream is `hidden_p` wide, hidden rounded up to 32 x DRAM banks (256 on a p150): the
    decode matmuls writing it (o_proj, down_proj, experts' down) are DRAM width-sharded over the banks. The
    extra columns are zero: embeddings and image features are zero-padded on the host, every weight reading
    the stream has zero rows there and every weight writing it zero columns. Its RMSNorms then average over
    hidden_p columns, which `residual_norm_eps` and the gamma `scale` sqrt(hidden / hidden_p) undo exactly:
    rsqrt(sum/hidden_p + eps h/h_p) = sqrt(h_p/h) rsqrt(sum/h + eps);
  * decode matmuls read their weights DRAM width-sharded, `[K, N_p / banks]` per bank, so N is zero-padded to
    a multiple of 32 x banks; the MLP's intermediate dimension padded this way is padded as the down
    projection's K too (zero rows), so padding never changes a result: silu(0) * 0 = 0;
  * routed experts are `[1, E, K, N]` per projection (gate, up: `[1, E, hidden_p, I_p]`; down:
    `[1, E, I_p, hidden_p]`), the weight layout of `ttnn.sparse_matmul`, read from the experts' canonical
    per-projection view (`alpamayo.text.moe.weights.ExpertView`); the router is a bf16 `[hidden_p, E]` linear;
  * the lm_head `[hidden_p, vocab]` is zero-padded to whole tiles; logits are cut back to `vocab` on the host;
  * RMSNorm gammas come in two forms: row-major `[1, 1, dim/32, 32]` (sharded decode norms and the per-head
    q/k norms) and TILE `[1, 1, 1, dim]` (the interleaved prefill norms: with a row-major gamma `rms_norm`
    skips its L1 budget check and allocates ~1.45 MB of circular buffers per core; seed design, measured);
    biases and LayerNorm weights use the TILE row form;
  * vision attention heads are padded from head_dim to `padded_head_dim` lanes in a split-half layout (see
    `head_positions`), so the device's rotate-half rotary pairs the same lanes as the reference and every
    padded lane of q, k and v is exactly zero (zero weight columns and bias entries); the output projection
    has zero rows at those lanes, so nothing in them can reach the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from alpamayo.checkpoint import Getter
from alpamayo.config.model import ModelConfig, TextConfig
from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.plan.precision import Precision
from alpamayo.text.moe.weights import EXPERT_DOWN, EXPERT_GATE, EXPERT_UP, GATE
from alpamayo.text.weights import EMBED, FINAL_NORM, LM_HEAD, layer_prefix

# Groups whose tensors are bf16 in every recipe (not `Precision.dtypes` keys): norm weights, biases, the router.
BF16_GROUPS = ("norm", "bias", "router")


def weight_dtype(spec: WeightSpec, precision: Precision) -> str:
    """The dtype `spec` is stored in under `precision` (bf16 for the `BF16_GROUPS`)."""
    return "bf16" if spec.group in BF16_GROUPS else precision.dtype(spec.group)


def padded_hidden(cfg: TextConfig, dram_banks: int) -> int:
    """Width of the device residual stream: hidden_size rounded up to 32 x `dram_banks` (see module docstring)."""
    return round_up(cfg.hidden_size, TILE * dram_banks)


def residual_norm_eps(cfg: TextConfig, dram_banks: int) -> float:
    """RMSNorm epsilon of the `padded_hidden`-wide residual stream that reproduces the model's norm exactly."""
    return cfg.rms_norm_eps * cfg.hidden_size / padded_hidden(cfg, dram_banks)


def rotary_head_dim(head_dim: int) -> int:
    """Lanes per head on the device: the device rotary (`rotary_embedding_hf`) takes 32 or a multiple of 64."""
    return TILE if head_dim <= TILE else round_up(head_dim, 2 * TILE)


def head_positions(head_dim: int, padded: int) -> torch.Tensor:
    """[head_dim] long: the lane of each reference dimension in a `padded`-lane head.

    Split-half layout: dimensions [0, d/2) sit at lanes [0, d/2) and [d/2, d) at [p/2, p/2 + d/2), so
    rotate-half over p lanes pairs lane i with i + p/2 exactly as the reference pairs i with i + d/2.
    """
    if head_dim % 2 or padded % 2 or padded < head_dim:
        raise ValueError(f"head_dim {head_dim} must be even and fit in an even padded width, got {padded}")
    half = head_dim // 2
    return torch.cat([torch.arange(half), padded // 2 + torch.arange(half)])


@dataclass(frozen=True)
class WeightSpec:
    """One device tensor: what it is built from and how it is laid out.

    group: precision tensor group (`Precision.dtypes` key) or one of `BF16_GROUPS`.
    transform: a key of `TRANSFORMS` (see there). shape / padded: logical and zero-padded device shape.
    placement: "dram_sharded" or "dram" (interleaved). layout: "tile" or "row_major".
    scale: factor applied to the values (residual-stream gammas, see module docstring).
    splits: column widths of the sources of a fused transform (fused_qkv: q, k, v widths).
    heads: attention heads of a head-padded vision transform (0 otherwise).
    """

    name: str
    sources: tuple[str, ...]
    group: str
    transform: str
    shape: tuple[int, ...]
    padded: tuple[int, ...]
    placement: str = "dram"
    layout: str = "tile"
    scale: float = 1.0
    splits: tuple[int, ...] = ()
    heads: int = 0


def fused_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """HF q/k/v projections ([out, hidden] each, rows head-major) -> `[hidden, q_dim + 2 kv_dim]`."""
    return torch.cat([q, k, v], 0).t().contiguous()


def linear_weight(w: torch.Tensor) -> torch.Tensor:
    """HF `[out_features, in_features]` -> `[K, N]` = `[in_features, out_features]`."""
    return w.t().contiguous()


def gamma_row_major(w: torch.Tensor) -> torch.Tensor:
    """RMSNorm weight `[dim]` -> row-major `[1, 1, dim/32, 32]` (dim must be a multiple of 32)."""
    if w.shape[-1] % TILE:
        raise ValueError(f"row-major gamma needs dim % {TILE} == 0, got dim {w.shape[-1]}")
    return w.reshape(1, 1, -1, TILE)


def gamma_tile(w: torch.Tensor) -> torch.Tensor:
    """A vector `[dim]` (norm weight or bias) -> `[1, 1, 1, dim]` (tilized on upload)."""
    return w.reshape(1, 1, 1, -1)


def zero_pad(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`t` zero-padded at the end of each dim up to `shape` (returned as is when it already has it)."""
    if tuple(t.shape) == tuple(shape):
        return t
    if len(shape) != t.dim() or any(s < d for s, d in zip(shape, t.shape, strict=True)):
        raise ValueError(f"cannot pad shape {list(t.shape)} to {list(shape)}")
    out = t.new_zeros(shape)
    out[tuple(slice(0, d) for d in t.shape)] = t
    return out


def _crop(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return t[tuple(slice(0, d) for d in shape)]


def _head_lanes(spec: WeightSpec) -> tuple[torch.Tensor, int]:
    """(lane of every reference column [C], padded head width) of a head-padded vision tensor; C is
    `spec.splits[0]`, split into `spec.heads` heads."""
    width = spec.splits[0]
    head_dim = width // spec.heads
    padded = rotary_head_dim(head_dim)
    heads = torch.arange(spec.heads).repeat_interleave(head_dim) * padded
    return heads + head_positions(head_dim, padded).repeat(spec.heads), padded


def _qkv_heads(spec: WeightSpec, w: torch.Tensor) -> torch.Tensor:
    """Vision fused qkv `[3C, ...]` (rows [q | k | v], heads contiguous) -> columns in the padded head layout.

    A weight `[3C, C]` gives `[C, 3 H p]`; a bias `[3C]` gives `[3 H p]`."""
    width = spec.splits[0]
    lanes, padded = _head_lanes(spec)
    out = w.new_zeros((3, spec.heads * padded, *w.shape[1:]))
    out[:, lanes] = w.reshape(3, width, *w.shape[1:])
    out = out.reshape(3 * spec.heads * padded, *w.shape[1:])
    return out.t().contiguous() if w.dim() == 2 else out


def _qkv_heads_back(spec: WeightSpec, t: torch.Tensor) -> torch.Tensor:
    cols = t if t.dim() == 1 else t.t()
    lanes, _ = _head_lanes(spec)
    picked = cols.reshape(3, cols.shape[0] // 3, *cols.shape[1:])[:, lanes]
    return picked.reshape(3 * spec.splits[0], *cols.shape[1:])


def _proj_heads(spec: WeightSpec, w: torch.Tensor) -> torch.Tensor:
    """Vision attention output projection `[C, C]` (out, in) -> `[H p, C]`: zero rows at the padded lanes."""
    lanes, padded = _head_lanes(spec)
    out = w.new_zeros((spec.heads * padded, w.shape[0]))
    out[lanes] = w.t()
    return out


def _experts(w: torch.Tensor) -> torch.Tensor:
    """Per-expert linear weights `[E, out, in]` -> the sparse-matmul layout `[1, E, in, out]`."""
    return w.transpose(1, 2).contiguous().unsqueeze(0)


# transform name -> (prepare: (spec, sources) -> device tensor of spec.shape, restore: (spec, device tensor
# cropped to spec.shape) -> the sources, each in its reference form: linear weights [out, in], vectors [dim],
# the patch embedding [C, 3 T P P], experts [E, out, in]).
Transform = tuple[
    Callable[[WeightSpec, list[torch.Tensor]], torch.Tensor],
    Callable[[WeightSpec, torch.Tensor], list[torch.Tensor]],
]
TRANSFORMS: dict[str, Transform] = {
    "linear": (lambda spec, s: linear_weight(s[0]), lambda spec, t: [t.t()]),
    "fused_qkv": (
        lambda spec, s: fused_qkv(*s),
        lambda spec, t: [c.t() for c in t.split(list(spec.splits), dim=1)],
    ),
    "gamma_row_major": (
        lambda spec, s: gamma_row_major(s[0] * spec.scale),
        lambda spec, t: [t.reshape(-1) / spec.scale],
    ),
    "gamma_tile": (
        lambda spec, s: gamma_tile(s[0] * spec.scale),
        lambda spec, t: [t.reshape(-1) / spec.scale],
    ),
    "patch_embed": (
        lambda spec, s: linear_weight(s[0].reshape(s[0].shape[0], -1)),
        lambda spec, t: [t.t()],
    ),
    "experts": (lambda spec, s: _experts(s[0]), lambda spec, t: [t[0].transpose(1, 2)]),
    "qkv_heads": (lambda spec, s: _qkv_heads(spec, s[0]), lambda spec, t: [_qkv_heads_back(spec, t)]),
    "qkv_heads_bias": (
        lambda spec, s: gamma_tile(_qkv_heads(spec, s[0])),
        lambda spec, t: [_qkv_heads_back(spec, t.reshape(-1))],
    ),
    "proj_heads": (
        lambda spec, s: _proj_heads(spec, s[0]),
        lambda spec, t: [t[_head_lanes(spec)[0]].t()],
    ),
}


def prepare(spec: WeightSpec, get: Getter) -> torch.Tensor:
    """The host tensor of `spec`, transformed and zero-padded to `spec.padded` (source dtype kept)."""
    if spec.transform not in TRANSFORMS:
        raise ValueError(
            f"weight {spec.name}: unknown transform {spec.transform!r}; allowed: {', '.join(TRANSFORMS)}"
        )
    t = TRANSFORMS[spec.transform][0](spec, [get(name) for name in spec.sources])
    if tuple(t.shape) != spec.shape:
        raise ValueError(
            f"weight {spec.name}: transform gave shape {list(t.shape)}, spec says {list(spec.shape)}"
        )
    return zero_pad(t, spec.padded)


def restore(spec: WeightSpec, device: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inverse of `prepare` on a device-layout tensor of `spec.padded` (e.g. after block-float rounding):
    source name -> tensor in its reference form (see `TRANSFORMS`); padding is dropped."""
    if tuple(device.shape) != spec.padded:
        raise ValueError(
            f"weight {spec.name}: restore needs shape {list(spec.padded)}, got {list(device.shape)}"
        )
    parts = TRANSFORMS[spec.transform][1](spec, _crop(device, spec.shape))
    return dict(zip(spec.sources, parts, strict=True))


def norm_specs(
    name: str, source: str, dim: int, forms: tuple[str, ...], padded: int | None = None
) -> list[WeightSpec]:
    """Gamma specs of a norm over `dim` values; `padded` > dim for the residual stream (scaled, see above)."""
    padded = padded or dim
    scale = math.sqrt(dim / padded)
    specs = []
    if "row_major" in forms:
        shape, padded_shape = (1, 1, dim // TILE, TILE), (1, 1, padded // TILE, TILE)
        specs.append(
            WeightSpec(
                f"{name}.rm",
                (source,),
                "norm",
                "gamma_row_major",
                shape,
                padded_shape,
                "dram",
                "row_major",
                scale,
            )
        )
    if "tile" in forms:
        specs.append(
            WeightSpec(
                f"{name}.tile",
                (source,),
                "norm",
                "gamma_tile",
                (1, 1, 1, dim),
                (1, 1, 1, padded),
                scale=scale,
            )
        )
    return specs


def linear_specs(
    name: str,
    source: str,
    group: str,
    k: int,
    n: int,
    transform: str = "linear",
    bias: bool = True,
    k_padded: int | None = None,
) -> list[WeightSpec]:
    """An interleaved linear `source` + "weight" as `[K, N]` zero-padded to whole tiles (K to `k_padded` where
    given: the residual stream's width), and with `bias` its bias row `[1, 1, 1, N]` padded to a tile."""
    n_padded = round_up(n, TILE)
    padded = (k_padded or round_up(k, TILE), n_padded)
    specs = [WeightSpec(name, (source + "weight",), group, transform, (k, n), padded)]
    if bias:
        specs.append(
            WeightSpec(
                name + ".bias", (source + "bias",), "bias", "gamma_tile", (1, 1, 1, n), (1, 1, 1, n_padded)
            )
        )
    return specs


def layer_norm_specs(name: str, source: str, dim: int) -> list[WeightSpec]:
    """A LayerNorm's `source` + "weight" / "bias" as bf16 TILE rows `[1, 1, 1, dim]` (`name`.weight, .bias)."""
    shape = (1, 1, 1, dim)
    return [
        WeightSpec(name + ".weight", (source + "weight",), "norm", "gamma_tile", shape, shape),
        WeightSpec(name + ".bias", (source + "bias",), "bias", "gamma_tile", shape, shape),
    ]


def expert_specs(cfg: TextConfig, i: int, dram_banks: int) -> list[WeightSpec]:
    """Router and routed-expert tensors of sparse layer `i` (names `layers.{i}.router`, `layers.{i}.experts.*`)."""
    moe = cfg.moe
    if moe is None:
        raise ValueError(f"layer {i} has routed experts, but its text config describes no MoE")
    h, hp = cfg.hidden_size, padded_hidden(cfg, dram_banks)
    e, inter = moe.num_experts, moe.moe_intermediate_size
    ip = round_up(inter, TILE)
    m, d = layer_prefix(i) + "mlp.", f"layers.{i}."
    return [
        WeightSpec(d + "router", (m + GATE,), "router", "linear", (h, e), (hp, round_up(e, TILE))),
        WeightSpec(
            d + "experts.gate", (m + EXPERT_GATE,), "experts", "experts", (1, e, h, inter), (1, e, hp, ip)
        ),
        WeightSpec(
            d + "experts.up", (m + EXPERT_UP,), "experts", "experts", (1, e, h, inter), (1, e, hp, ip)
        ),
        WeightSpec(
            d + "experts.down", (m + EXPERT_DOWN,), "experts", "experts", (1, e, inter, h), (1, e, ip, hp)
        ),
    ]


@dataclass(frozen=True)
class LayerGroups:
    """Precision groups of a decoder layer's projections (the action expert puts all four in `expert`)."""

    qkv: str = "qkv"
    o: str = "o"
    gate_up: str = "mlp_gate_up"
    down: str = "mlp_down"


TEXT_GROUPS = LayerGroups()


def _sharded_spec(
    name: str,
    sources: tuple[str, ...],
    group: str,
    transform: str,
    k: int,
    n: int,
    k_p: int,
    dram_banks: int,
    splits: tuple[int, ...] = (),
) -> WeightSpec:
    """A decode-matmul weight `[K, N]`, DRAM width-sharded: N padded to 32 x banks, K to `k_p`; `splits` as
    `WeightSpec`'s."""
    padded = (k_p, round_up(n, TILE * dram_banks))
    return WeightSpec(name, sources, group, transform, (k, n), padded, "dram_sharded", splits=splits)


def decoder_layer_specs(
    t: TextConfig, source: str, name: str, dram_banks: int, groups: LayerGroups = TEXT_GROUPS, i: int = 0
) -> list[WeightSpec]:
    """Device tensors of one dense-or-MoE decoder layer whose checkpoint tensors start with `source`
    (`…layers.{i}.`), named `name` + wqkv, wo, w_gate, w_up, w_down, attn_norm.*, mlp_norm.*, q_norm.rm,
    k_norm.rm; `i` is the layer index for the MoE test."""
    h, hd, hp = t.hidden_size, t.head_dim, padded_hidden(t, dram_banks)
    inter_p = round_up(t.intermediate_size, TILE * dram_banks)
    a, m = source + "self_attn.", source + "mlp."
    qkv_sources = (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
    splits = (t.q_dim, t.kv_dim, t.kv_dim)
    qkv_n = t.q_dim + 2 * t.kv_dim
    specs = [
        _sharded_spec(
            name + "wqkv", qkv_sources, groups.qkv, "fused_qkv", h, qkv_n, hp, dram_banks, splits=splits
        ),
        _sharded_spec(
            name + "wo", (a + "o_proj.weight",), groups.o, "linear", t.q_dim, h, t.q_dim, dram_banks
        ),
    ]
    if t.is_sparse(i):
        specs += expert_specs(t, i, dram_banks)
    else:
        inter = t.intermediate_size
        for key, proj in (("w_gate", "gate_proj"), ("w_up", "up_proj")):
            specs.append(
                _sharded_spec(
                    name + key, (m + proj + ".weight",), groups.gate_up, "linear", h, inter, hp, dram_banks
                )
            )
        specs.append(
            _sharded_spec(
                name + "w_down",
                (m + "down_proj.weight",),
                groups.down,
                "linear",
                inter,
                h,
                inter_p,
                dram_banks,
            )
        )
    specs += norm_specs(name + "attn_norm", source + "input_layernorm.weight", h, ("row_major", "tile"), hp)
    specs += norm_specs(
        name + "mlp_norm", source + "post_attention_layernorm.weight", h, ("row_major", "tile"), hp
    )
    specs += norm_specs(name + "q_norm", a + "q_norm.weight", hd, ("row_major",))
    specs += norm_specs(name + "k_norm", a + "k_norm.weight", hd, ("row_major",))
    return specs


def text_weight_specs(cfg: ModelConfig, dram_banks: int) -> list[WeightSpec]:
    """Every device tensor of the text decoder, dense or MoE (embeddings stay on the host), in load order."""
    t = cfg.text
    h, hp = t.hidden_size, padded_hidden(t, dram_banks)
    specs: list[WeightSpec] = []
    for i in range(t.num_hidden_layers):
        specs += decoder_layer_specs(t, layer_prefix(i), f"layers.{i}.", dram_banks, i=i)
    specs += norm_specs("norm", FINAL_NORM, h, ("row_major", "tile"), hp)
    head = EMBED if cfg.tie_word_embeddings else LM_HEAD
    specs.append(
        WeightSpec(
            "lm_head", (head,), "lm_head", "linear", (h, t.vocab_size), (hp, round_up(t.vocab_size, TILE))
        )
    )
    return specs
