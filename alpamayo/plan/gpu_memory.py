"""GPU memory of the torch backend per weight-only recipe (`alpamayo plan --backend torch`), from the config
alone: no weights need to be on disk.

The model is built on PyTorch's meta device from the config's tensor shapes by the same builders the loaders
run (`TextModel.from_weights`, `VisionEncoder.from_weights`, `build_expert`), so every linear carries the role
that decides whether a recipe quantises it (`QuantRecipe.applies_to`). Then, as the torch backend holds them:

  * weights: every checkpoint tensor of the text backbone, the vision tower and the action expert at the model
    dtype, except the linears the recipe quantises, which count the packed tensors their kernel reads
    (`packed_nbytes`): int8 codes [N, K] (1 byte each) and scales [N]; int4 codes N' x K / 2 bytes and
    scales_and_zeros [K / group, N', 2], N' being N padded to the packer's multiple on the device
    (`alpamayo.quant.kernels.INT4_OUT_MULTIPLE`); under int4 a linear whose width the group or the device's
    int4 kernel does not divide counts at int8, as the load packs it (`alpamayo.quant.kernels.layer_mode`). A head tied to the embedding table keeps the table too.
    The token embeddings, norms, biases, the MoE routers and the expert's Fourier in-projection stay at the
    model dtype (the head too unless `QuantRecipe.head`).
  * KV cache: the text backbone's static `KVCache`, K rows (the samples share one prefill, `KVCache.fork`)
    x `max_seq_len` positions x layers x (K and V) x kv_heads x head_dim at the model dtype.
  * unguided cache: navigation guidance's second cache (`ExpertDecoder.unguided_context`: the prompt without
    its route, prefilled into a cache of its own), the same rows and at most the same length.
  * activations: an ESTIMATE of the peak, the largest of one prefill decoder layer over the prompt (the
    residual, its normed copy and the widest of attention's fused QKV plus its rotated q/k/v and output, or
    the MLP's gate_up, activated product and output; SDPA's fused kernels keep no score matrix), the vision
    tower's block over the prompt's patches (the same terms at its widths), and one expert Euler step over K
    samples (each layer's widest terms per action row plus the float32 attention bias over the cache); plus
    the float32 logits of K rows. Allocator slack and the CUDA context are not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from alpamayo.config.expert import ExpertConfig
from alpamayo.config.model import ModelConfig
from alpamayo.expert.in_proj import default_freqs
from alpamayo.expert.weights import build_expert
from alpamayo.prediction import FUTURE_STEPS
from alpamayo.quant.kernels import INT4_OUT_MULTIPLE, check_kernel, layer_mode
from alpamayo.quant.recipe import QuantRecipe
from alpamayo.text import TextModel
from alpamayo.text.linear import Linear
from alpamayo.text.weights import text_tensor_shapes
from vision.encoder import VisionEncoder
from vision.weights import vision_tensor_shapes

GPUS_GB = (16, 24, 40, 80)  # the common GPU memory sizes a plan names the smallest of
FLOAT32 = 4


def packed_nbytes(
    out_features: int, in_features: int, recipe: QuantRecipe, dtype: torch.dtype, device: str
) -> int:
    """Bytes of the packed tensors `alpamayo.quant.quantise_weight` makes of one [out, in] weight in `dtype`
    on `device` ("cpu" / "cuda"), at the mode `layer_mode` picks for its width; the layouts are in the module
    docstring."""
    scale = torch.empty((), dtype=dtype).element_size()
    if layer_mode(recipe, in_features, device) == "int8":
        return out_features * in_features + out_features * scale
    padded = -(-out_features // INT4_OUT_MULTIPLE[device]) * INT4_OUT_MULTIPLE[device]
    return padded * in_features // 2 + in_features // recipe.group_size * padded * 2 * scale


@dataclass
class WeightCount:
    """Bytes of one part's weights: `quantised` (the packed linears) and `plain` (at the model dtype);
    `linears`: how many the recipe quantises, `fallback` the (name, input width) of those an int4 recipe packs
    at int8 (`layer_mode`); `refused`: the errors of linears the recipe has no kernel for on the device and
    dtype (one per layer)."""

    quantised: int = 0
    plain: int = 0
    linears: int = 0
    fallback: list[tuple[str, int]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.quantised + self.plain


def _meta_getter(
    shapes: dict[str, list[tuple[int, ...]]], dtype: torch.dtype
) -> Callable[[str], torch.Tensor]:
    return lambda name: torch.empty(shapes[name][0], dtype=dtype, device="meta")


def count_weights(
    root: nn.Module,
    shapes: Iterable[tuple[int, ...]],
    recipe: QuantRecipe,
    dtype: torch.dtype,
    device: str,
    tied: torch.Tensor | None = None,
) -> WeightCount:
    """The bytes of `root` (built on the meta device) under `recipe`: its checkpoint tensors `shapes` at
    `dtype`, less the weight of each linear the recipe quantises, plus its packed tensors (at the mode
    `layer_mode` picks for the linear on `device`, as the load packs it); a linear whose weight is `tied` (the
    embedding table) keeps the table as well."""
    size = torch.empty((), dtype=dtype).element_size()
    count = WeightCount(plain=sum(_numel(s) for s in shapes) * size)
    if not recipe.enabled:
        return count
    for name, module in root.named_modules():
        if not (isinstance(module, Linear) and recipe.applies_to(module.role)):
            continue
        n, k = module.out_features, module.in_features
        try:
            check_kernel(recipe.mode, device, dtype)
        except ValueError as e:
            count.refused.append(str(e))
            continue
        count.linears += 1
        if layer_mode(recipe, k, device) != recipe.mode:
            count.fallback.append((name, k))
        count.quantised += packed_nbytes(n, k, recipe, dtype, device)
        if module.weight is not tied:
            count.plain -= n * k * size
    return count


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def weight_counts(
    cfg: ModelConfig, expert: ExpertConfig | None, recipe: QuantRecipe, dtype: torch.dtype, device: str
) -> dict[str, WeightCount]:
    """Per part ("text", "vision", "expert": those the model has) its `WeightCount` under `recipe`."""
    shapes = text_tensor_shapes(cfg)
    text = TextModel.from_weights(cfg, _meta_getter(shapes, dtype))
    tied = text.embed_weight if cfg.tie_word_embeddings else None
    counts = {"text": count_weights(text, (s[0] for s in shapes.values()), recipe, dtype, device, tied)}
    if cfg.vision is not None:
        shapes = vision_tensor_shapes(cfg.vision)
        vision = VisionEncoder.from_weights(cfg.vision, _meta_getter(shapes, dtype))
        counts["vision"] = count_weights(vision, (s[0] for s in shapes.values()), recipe, dtype, device)
    if expert is not None:
        shapes = expert.tensor_shapes()
        freqs = [default_freqs(expert.in_proj).to("meta") for _ in expert.freqs_keys()]
        model = build_expert(expert, _meta_getter(shapes, dtype), freqs)
        counts["expert"] = count_weights(model, (s[0] for s in shapes.values()), recipe, dtype, device)
    return counts


def kv_cache_nbytes(cfg: ModelConfig, rows: int, positions: int, dtype: torch.dtype) -> int:
    """Bytes of the text backbone's `KVCache` of `rows` sequences x `positions` at `dtype`."""
    t = cfg.text
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * t.num_hidden_layers * rows * t.num_key_value_heads * positions * t.head_dim * size


def activation_nbytes(
    cfg: ModelConfig,
    expert: ExpertConfig | None,
    prompt_tokens: int,
    patches: int,
    samples: int,
    max_seq_len: int,
    dtype: torch.dtype,
) -> int:
    """ESTIMATE of the peak activation bytes (see the module docstring): a prefill of `prompt_tokens`, the
    vision tower over `patches` patches, an expert step of `samples` samples attending to `max_seq_len`."""
    size = torch.empty((), dtype=dtype).element_size()
    t = cfg.text
    qkv = t.q_dim + 2 * t.kv_dim
    text = prompt_tokens * (2 * t.hidden_size + max(2 * qkv + t.q_dim, 4 * t.intermediate_size)) * size
    peak = text + samples * t.vocab_size * FLOAT32
    if cfg.vision is not None and patches:
        v = cfg.vision
        vision = patches * (2 * v.hidden_size + max(7 * v.hidden_size, 3 * v.intermediate_size)) * size
        peak = max(peak, vision)
    if expert is not None:
        e = expert.text
        rows = samples * FUTURE_STEPS  # the action tokens of each sample
        widest = max(2 * (e.q_dim + 2 * e.kv_dim) + e.q_dim, 4 * e.intermediate_size)
        step = rows * (2 * e.hidden_size + widest) * size + rows * (max_seq_len + FUTURE_STEPS) * FLOAT32
        peak = max(peak, step)
    return peak


@dataclass(frozen=True)
class GpuPlan:
    """GPU bytes of one recipe: weights by part, KV cache, unguided cache, activations (ESTIMATE)."""

    recipe: str  # QuantRecipe.name, or the model dtype's name for none
    weights: dict[str, WeightCount]
    kv_cache: int
    unguided_cache: int
    activations: int

    @property
    def weight_bytes(self) -> int:
        return sum(w.total for w in self.weights.values())

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_cache + self.unguided_cache + self.activations

    @property
    def refused(self) -> list[str]:
        return [r for w in self.weights.values() for r in w.refused]

    @property
    def linears(self) -> int:
        return sum(w.linears for w in self.weights.values())

    @property
    def fallback(self) -> int:
        """How many linears an int4 recipe packs at int8 (`layer_mode`), over all parts."""
        return sum(len(w.fallback) for w in self.weights.values())

    @property
    def smallest_gpu_gb(self) -> int | None:
        """The smallest of `GPUS_GB` the total fits in (GB = 1e9 bytes; None: none does, or it cannot load)."""
        if self.refused:
            return None
        return next((g for g in GPUS_GB if self.total <= g * 1e9), None)


def plan_gpu_memory(
    cfg: ModelConfig,
    expert: ExpertConfig | None,
    recipe: QuantRecipe,
    dtype: torch.dtype,
    max_seq_len: int,
    samples: int,
    prompt_tokens: int,
    patches: int,
    guidance: bool = True,
    device: str = "cuda",
) -> GpuPlan:
    """The torch backend's memory on `device` for `cfg` (and its action `expert`) under `recipe` in `dtype`,
    with a cache of `samples` rows x `max_seq_len` positions (and the unguided one when `guidance` and the
    model has an expert), activations for a prompt of `prompt_tokens` tokens from `patches` image patches."""
    if max_seq_len < 1 or samples < 1:
        raise ValueError(f"max_seq_len and samples must be >= 1, got {max_seq_len} and {samples}")
    kv = kv_cache_nbytes(cfg, samples, max_seq_len, dtype)
    return GpuPlan(
        recipe=recipe.name or str(dtype).removeprefix("torch."),
        weights=weight_counts(cfg, expert, recipe, dtype, device),
        kv_cache=kv,
        unguided_cache=kv if guidance and expert is not None else 0,
        activations=activation_nbytes(cfg, expert, prompt_tokens, patches, samples, max_seq_len, dtype),
    )
