"""Canonical tensor names and shapes of the text decoder, and how they are read into modules.

Names follow `alpamayo.checkpoint` (on-disk prefixes already removed). Every shape states the layout on
disk, `[out_features, in_features]` for linear weights.
"""

from __future__ import annotations

import torch
from torch import nn

from alpamayo.checkpoint import Checkpoint, Getter, Shape
from alpamayo.config.model import ModelConfig, TextConfig
from alpamayo.errors import CheckpointError
from alpamayo.text.attention import Attention
from alpamayo.text.layer import DecoderLayer
from alpamayo.text.mlp import SwiGLU
from alpamayo.text.moe.weights import disk_layout
from alpamayo.text.norm import RMSNorm

EMBED = "language_model.embed_tokens.weight"
FINAL_NORM = "language_model.norm.weight"
LM_HEAD = "lm_head.weight"
TEXT_NAMESPACES = ("language_model.", "lm_head.")


def layer_prefix(i: int) -> str:
    return f"language_model.layers.{i}."


def text_tensor_shapes(cfg: ModelConfig) -> dict[str, list[Shape]]:
    """Every text-decoder tensor the checkpoint must hold -> its allowed shapes."""
    t = cfg.text
    h = t.hidden_size
    shapes: dict[str, list[Shape]] = {EMBED: [(t.vocab_size, h)], FINAL_NORM: [(h,)]}
    if not cfg.tie_word_embeddings:
        shapes[LM_HEAD] = [(t.vocab_size, h)]
    for i in range(t.num_hidden_layers):
        shapes.update(t.layer_shapes(i, layer_prefix(i)))
    return shapes


def validate_text_tensors(ckpt: Checkpoint, cfg: ModelConfig) -> None:
    """Check the checkpoint's text tensors before any is read (and, on ttnn, before the device is opened).

    Names and shapes as `text_tensor_shapes` says (`Checkpoint.validate`); then each sparse layer's two fused
    expert tensors must be in the same on-disk layout (each alone may fit either). Every error names the
    tensors and their files.
    """
    ckpt.validate(text_tensor_shapes(cfg), TEXT_NAMESPACES + (("visual.",) if cfg.vision is None else ()))
    t = cfg.text
    for i in t.sparse_layers:
        prefix = layer_prefix(i) + "mlp."
        gate_up, down = ckpt.entry(prefix + "experts.gate_up_proj"), ckpt.entry(prefix + "experts.down_proj")
        try:
            disk_layout(t, prefix, gate_up.shape, down.shape)
        except CheckpointError as e:
            raise CheckpointError(
                f"{ckpt.directory}: {e}; on disk: '{gate_up.key}' in {gate_up.file.name}, '{down.key}' in "
                f"{down.file.name}"
            ) from None


def build_mlp(cfg: TextConfig, i: int, get: Getter, prefix: str) -> nn.Module:
    """The feed-forward block of layer i, tensors under `{prefix}mlp.` (`prefix`: the layer's, as `build_layer`
    resolved it): dense SwiGLU, or the sparse MoE block where the config says so."""
    p = prefix + "mlp."
    if cfg.is_sparse(i):
        from alpamayo.text.moe.block import SparseMoE

        return SparseMoE.from_weights(cfg, p, get)
    return SwiGLU(get(p + "gate_proj.weight"), get(p + "up_proj.weight"), get(p + "down_proj.weight"))


def build_layer(cfg: TextConfig, i: int, get: Getter, prefix: str | None = None) -> DecoderLayer:
    """Decoder layer i from tensors named `{prefix}self_attn.…`, `{prefix}mlp.…` (default `layer_prefix(i)`;
    the action expert's layers live under their own prefix)."""
    p = prefix or layer_prefix(i)
    a = p + "self_attn."
    qkv = torch.cat([get(a + "q_proj.weight"), get(a + "k_proj.weight"), get(a + "v_proj.weight")], 0)
    qkv_bias = o_bias = None
    if cfg.attention_bias:
        qkv_bias = torch.cat([get(a + "q_proj.bias"), get(a + "k_proj.bias"), get(a + "v_proj.bias")], 0)
        o_bias = get(a + "o_proj.bias")
    attn = Attention(
        cfg,
        i,
        qkv,
        qkv_bias,
        get(a + "o_proj.weight"),
        o_bias,
        get(a + "q_norm.weight"),
        get(a + "k_norm.weight"),
    )
    return DecoderLayer(
        attn,
        build_mlp(cfg, i, get, p),
        RMSNorm(get(p + "input_layernorm.weight"), cfg.rms_norm_eps),
        RMSNorm(get(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps),
    )
