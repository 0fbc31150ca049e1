"""Canonical tensor names and shapes of the vision tower, and how they are read into modules.

Names follow `alpamayo.checkpoint` (`visual.` namespace, on-disk prefixes removed). Linear weights are
`[out_features, in_features]`; the patch embedding is a Conv3d weight `[C, 3, T, P, P]` whose stride equals
its kernel, so it is applied as a matmul with the weight flattened to `[C, 3 * T * P * P]`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from alpamayo.checkpoint import Checkpoint, Getter, Shape
from alpamayo.config.model import ModelConfig, VisionConfig
from alpamayo.errors import ConfigError
from alpamayo.text.linear import Linear
from vision.block import LayerNorm, PatchMerger, VisionAttention, VisionBlock, VisionMLP

VISION_NAMESPACES = ("visual.",)
PATCH_EMBED = "visual.patch_embed.proj."
POS_EMBED = "visual.pos_embed.weight"
MERGER = "visual.merger."
# transformers' ACT2FN names for the block MLP activation
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def block_prefix(j: int) -> str:
    return f"visual.blocks.{j}."


def deepstack_prefix(k: int) -> str:
    return f"visual.deepstack_merger_list.{k}."


def _linear(shapes: dict[str, list[Shape]], prefix: str, out_features: int, in_features: int) -> None:
    shapes[prefix + "weight"] = [(out_features, in_features)]
    shapes[prefix + "bias"] = [(out_features,)]


def vision_tensor_shapes(cfg: VisionConfig) -> dict[str, list[Shape]]:
    """Every vision-tower tensor the checkpoint must hold -> its allowed shapes."""
    c, p = cfg.hidden_size, cfg.patch_size
    fused = c * cfg.spatial_merge_size**2
    shapes: dict[str, list[Shape]] = {
        PATCH_EMBED + "weight": [(c, cfg.in_channels, cfg.temporal_patch_size, p, p)],
        PATCH_EMBED + "bias": [(c,)],
        POS_EMBED: [(cfg.num_position_embeddings, c)],
    }
    for j in range(cfg.depth):
        b = block_prefix(j)
        for norm in ("norm1", "norm2"):
            shapes[f"{b}{norm}.weight"] = [(c,)]
            shapes[f"{b}{norm}.bias"] = [(c,)]
        _linear(shapes, b + "attn.qkv.", 3 * c, c)
        _linear(shapes, b + "attn.proj.", c, c)
        _linear(shapes, b + "mlp.linear_fc1.", cfg.intermediate_size, c)
        _linear(shapes, b + "mlp.linear_fc2.", c, cfg.intermediate_size)
    mergers = [(MERGER, c)] + [(deepstack_prefix(k), fused) for k in range(len(cfg.deepstack_visual_indexes))]
    for prefix, norm_dim in mergers:
        shapes[prefix + "norm.weight"] = [(norm_dim,)]
        shapes[prefix + "norm.bias"] = [(norm_dim,)]
        _linear(shapes, prefix + "linear_fc1.", fused, fused)
        _linear(shapes, prefix + "linear_fc2.", cfg.out_hidden_size, fused)
    return shapes


def validate_vision_tensors(ckpt: Checkpoint, cfg: ModelConfig) -> VisionConfig:
    """The vision tower's config, once every `visual.*` tensor's name and shape is checked (before any is read;
    `Checkpoint.validate`); ConfigError when the checkpoint has no vision tower. For both backends."""
    if cfg.vision is None:
        raise ConfigError(f"{cfg.source}: no vision_config, so the checkpoint has no vision tower")
    ckpt.validate(vision_tensor_shapes(cfg.vision), VISION_NAMESPACES)
    return cfg.vision


def _load_linear(prefix: str, get: Getter) -> Linear:
    return Linear(get(prefix + "weight"), get(prefix + "bias"))


def _load_norm(prefix: str, get: Getter) -> LayerNorm:
    return LayerNorm(get(prefix + "weight"), get(prefix + "bias"))


def build_patch_embed(cfg: VisionConfig, get: Getter) -> Linear:
    return Linear(
        get(PATCH_EMBED + "weight").reshape(cfg.hidden_size, cfg.patch_dim), get(PATCH_EMBED + "bias")
    )


def build_block(cfg: VisionConfig, j: int, get: Getter) -> VisionBlock:
    if cfg.hidden_act not in ACTIVATIONS:
        raise ConfigError(
            f"unsupported vision_config.hidden_act {cfg.hidden_act!r}; supported: {sorted(ACTIVATIONS)}"
        )
    b = block_prefix(j)
    attn = VisionAttention(
        _load_linear(b + "attn.qkv.", get), _load_linear(b + "attn.proj.", get), cfg.num_heads
    )
    mlp = VisionMLP(
        _load_linear(b + "mlp.linear_fc1.", get),
        _load_linear(b + "mlp.linear_fc2.", get),
        ACTIVATIONS[cfg.hidden_act],
    )
    return VisionBlock(_load_norm(b + "norm1.", get), attn, _load_norm(b + "norm2.", get), mlp)


def build_merger(prefix: str, post_shuffle_norm: bool, get: Getter) -> PatchMerger:
    return PatchMerger(
        _load_norm(prefix + "norm.", get),
        _load_linear(prefix + "linear_fc1.", get),
        _load_linear(prefix + "linear_fc2.", get),
        post_shuffle_norm,
    )
