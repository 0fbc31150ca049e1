"""Host-side preparation of the text decoder's device weights (pure torch functions; no ttnn).

Every device tensor is described by a `WeightSpec` (name, checkpoint sources, transform, logical and padded
shape, placement); `prepare` turns a spec into the padded torch tensor that is then tilized / packed to the
spec's dtype. Layouts:

  * linear weights are transposed to `[K, N]` (in_features x out_features), so `x @ W` runs on device;
  * the fused QKV weight is `[hidden, (n_heads + 2 n_kv) head_dim]` with columns q heads, k heads, v heads,
    each head's `head_dim` columns contiguous: the order `nlp_create_qkv_heads(_decode)` splits;
  * decode matmuls read their weights DRAM width-sharded, `[K, N_p / banks]` per bank, so N is zero-padded to
    a multiple of 32 x banks (256 on a p150); the MLP's intermediate dimension padded this way is padded as
    the down projection's K too (zero rows), so padding never changes a result: silu(0) * 0 = 0;
  * the lm_head `[hidden, vocab]` is zero-padded to whole tiles; logits are cut back to `vocab` on the host;
  * RMSNorm gammas come in two forms: row-major `[1, 1, dim/32, 32]` (sharded decode norms and the per-head
    q/k norms) and TILE `[1, 1, 1, dim]` (the interleaved prefill norms: with a row-major gamma `rms_norm`
    skips its L1 budget check and allocates ~1.45 MB of circular buffers per core; seed design, measured).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from alpamayo.config import ModelConfig
from alpamayo.text.weights import EMBED, FINAL_NORM, LM_HEAD, layer_prefix
from alpamayo.tt.device_spec import TILE

Getter = Callable[[str], torch.Tensor]


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class WeightSpec:
    """One device tensor: what it is built from and how it is laid out.

    group: precision tensor group (`Precision.dtypes` key) or "norm" (always bf16).
    transform: "linear" | "fused_qkv" | "gamma_row_major" | "gamma_tile".
    shape / padded: logical and zero-padded device shape. placement: "dram_sharded" or "dram" (interleaved).
    layout: "tile" or "row_major".
    """

    name: str
    sources: tuple[str, ...]
    group: str
    transform: str
    shape: tuple[int, ...]
    padded: tuple[int, ...]
    placement: str = "dram"
    layout: str = "tile"


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
    """RMSNorm weight `[dim]` -> `[1, 1, 1, dim]` (tilized on upload)."""
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


def prepare(spec: WeightSpec, get: Getter) -> torch.Tensor:
    """The host tensor of `spec`, transformed and zero-padded to `spec.padded` (source dtype kept)."""
    sources = [get(name) for name in spec.sources]
    if spec.transform == "fused_qkv":
        t = fused_qkv(*sources)
    elif spec.transform == "linear":
        t = linear_weight(sources[0])
    elif spec.transform == "gamma_row_major":
        t = gamma_row_major(sources[0])
    elif spec.transform == "gamma_tile":
        t = gamma_tile(sources[0])
    else:
        raise ValueError(f"weight {spec.name}: unknown transform {spec.transform!r}")
    if tuple(t.shape) != spec.shape:
        raise ValueError(
            f"weight {spec.name}: transform gave shape {list(t.shape)}, spec says {list(spec.shape)}"
        )
    return zero_pad(t, spec.padded)


def _norm_specs(name: str, source: str, dim: int, forms: tuple[str, ...]) -> list[WeightSpec]:
    specs = []
    if "row_major" in forms:
        shape = (1, 1, dim // TILE, TILE)
        specs.append(
            WeightSpec(f"{name}.rm", (source,), "norm", "gamma_row_major", shape, shape, layout="row_major")
        )
    if "tile" in forms:
        shape = (1, 1, 1, dim)
        specs.append(WeightSpec(f"{name}.tile", (source,), "norm", "gamma_tile", shape, shape))
    return specs


def text_weight_specs(cfg: ModelConfig, dram_banks: int) -> list[WeightSpec]:
    """Every device tensor of a dense text decoder (embeddings stay on the host), in load order."""
    t = cfg.text
    h, hd = t.hidden_size, t.head_dim
    bank_multiple = TILE * dram_banks
    inter_p = round_up(t.intermediate_size, bank_multiple)
    qkv_n = t.q_dim + 2 * t.kv_dim
    specs: list[WeightSpec] = []

    def sharded(name: str, sources: tuple[str, ...], group: str, transform: str, k: int, n: int, k_p: int):
        specs.append(
            WeightSpec(
                name, sources, group, transform, (k, n), (k_p, round_up(n, bank_multiple)), "dram_sharded"
            )
        )

    for i in range(t.num_hidden_layers):
        p, a, m, d = layer_prefix(i), layer_prefix(i) + "self_attn.", layer_prefix(i) + "mlp.", f"layers.{i}."
        qkv_sources = (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
        sharded(d + "wqkv", qkv_sources, "qkv", "fused_qkv", h, qkv_n, h)
        sharded(d + "wo", (a + "o_proj.weight",), "o", "linear", t.q_dim, h, t.q_dim)
        sharded(d + "w_gate", (m + "gate_proj.weight",), "mlp_gate_up", "linear", h, t.intermediate_size, h)
        sharded(d + "w_up", (m + "up_proj.weight",), "mlp_gate_up", "linear", h, t.intermediate_size, h)
        sharded(
            d + "w_down", (m + "down_proj.weight",), "mlp_down", "linear", t.intermediate_size, h, inter_p
        )
        specs += _norm_specs(d + "attn_norm", p + "input_layernorm.weight", h, ("row_major", "tile"))
        specs += _norm_specs(d + "mlp_norm", p + "post_attention_layernorm.weight", h, ("row_major", "tile"))
        specs += _norm_specs(d + "q_norm", a + "q_norm.weight", hd, ("row_major",))
        specs += _norm_specs(d + "k_norm", a + "k_norm.weight", hd, ("row_major",))
    specs += _norm_specs("norm", FINAL_NORM, h, ("row_major", "tile"))
    head = EMBED if cfg.tie_word_embeddings else LM_HEAD
    specs.append(
        WeightSpec(
            "lm_head", (head,), "lm_head", "linear", (h, t.vocab_size), (h, round_up(t.vocab_size, TILE))
        )
    )
    return specs
