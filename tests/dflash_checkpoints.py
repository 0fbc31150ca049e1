"""Random tiny DFlash drafts in z-lab's layout, and the reference forward composed from transformers' Qwen3
modules the way z-lab's `dflash/model.py` composes them (`DFlashDraftModel.forward` + `lm_head` of the
target)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn


def dflash_config(target, layers: int = 2, block_size: int = 8, **over: Any) -> dict[str, Any]:
    """A Qwen3 text config + dflash_config for `target` (an `alpamayo.config.model.TextConfig`), z-lab's names."""
    n = target.num_hidden_layers
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": 96,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 4096,
        "attention_bias": False,
        "hidden_act": "silu",
        "block_size": block_size,
        "num_target_layers": n,
        "dflash_config": {
            "mask_token_id": target.vocab_size - 1,
            "target_layer_ids": sorted({0, n // 2, n - 1}),
        },
    }
    for k, v in over.items():
        if k in ("mask_token_id", "target_layer_ids"):
            cfg["dflash_config"][k] = v
        else:
            cfg[k] = v
    return cfg


def target_heads(target) -> dict[str, int]:
    """`dflash_config` overrides giving the draft `target`'s attention heads, K/V heads, head_dim and MLP
    width: what a draft on the device must share with its target (`alpamayo.tt.draft`)."""
    return {
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "intermediate_size": target.intermediate_size,
    }


def save_dflash(directory: Path, cfg: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Write config.json and model.safetensors of random weights (z-lab's tensor names); returns them."""
    g = torch.Generator().manual_seed(seed)
    h, d, i = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    n_ctx = len(cfg["dflash_config"]["target_layer_ids"])

    def w(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    def norm(n: int) -> torch.Tensor:
        return 1 + 0.1 * torch.randn(n, generator=g)

    t = {"fc.weight": w(h, n_ctx * h), "hidden_norm.weight": norm(h), "norm.weight": norm(h)}
    for li in range(cfg["num_hidden_layers"]):
        p = f"layers.{li}."
        t |= {
            p + "self_attn.q_proj.weight": w(nh * d, h),
            p + "self_attn.k_proj.weight": w(nkv * d, h),
            p + "self_attn.v_proj.weight": w(nkv * d, h),
            p + "self_attn.o_proj.weight": w(h, nh * d),
            p + "self_attn.q_norm.weight": norm(d),
            p + "self_attn.k_norm.weight": norm(d),
            p + "input_layernorm.weight": norm(h),
            p + "post_attention_layernorm.weight": norm(h),
            p + "mlp.gate_proj.weight": w(i, h),
            p + "mlp.up_proj.weight": w(i, h),
            p + "mlp.down_proj.weight": w(h, i),
        }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in t.items()}, directory / "model.safetensors")
    return t


def reference_block_logits(
    cfg: dict[str, Any],
    weights: dict[str, torch.Tensor],
    target_hidden: torch.Tensor,
    noise_embedding: torch.Tensor,
    lm_head: nn.Module,
) -> torch.Tensor:
    """z-lab's draft forward on one row, from transformers' Qwen3 modules: target_hidden [1, N, n*H] (the
    target's hidden_states[i + 1] concatenated), noise_embedding [1, bs, H] (target embeddings of the block
    [anchor, mask...]) -> lm_head(draft output)[:, 1 - bs:] float32 [1, bs - 1, V]."""
    from transformers.models.qwen3.modeling_qwen3 import (
        Qwen3Config,
        Qwen3MLP,
        Qwen3RMSNorm,
        Qwen3RotaryEmbedding,
        rotate_half,
    )

    config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "dflash_config")})
    d, eps = cfg["head_dim"], cfg["rms_norm_eps"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def linear(name: str) -> nn.Linear:
        wt = weights[name]
        m = nn.Linear(wt.shape[1], wt.shape[0], bias=False)
        m.weight.data.copy_(wt)
        return m

    def rms(name: str) -> Qwen3RMSNorm:
        m = Qwen3RMSNorm(weights[name].shape[0], eps=eps)
        m.weight.data.copy_(weights[name])
        return m

    bsz, q_len = noise_embedding.shape[:2]
    ctx_len = target_hidden.shape[1]
    target = rms("hidden_norm.weight")(linear("fc.weight")(target_hidden))
    position_ids = torch.arange(ctx_len + q_len)[None]
    cos, sin = Qwen3RotaryEmbedding(config)(noise_embedding, position_ids)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x = noise_embedding
    for li in range(cfg["num_hidden_layers"]):
        p = f"layers.{li}."
        a = p + "self_attn."
        residual, y = x, rms(p + "input_layernorm.weight")(x)
        q = rms(a + "q_norm.weight")(linear(a + "q_proj.weight")(y).view(bsz, q_len, nh, d)).transpose(1, 2)
        k = torch.cat([linear(a + "k_proj.weight")(target), linear(a + "k_proj.weight")(y)], 1)
        v = torch.cat([linear(a + "v_proj.weight")(target), linear(a + "v_proj.weight")(y)], 1)
        k = rms(a + "k_norm.weight")(k.view(bsz, ctx_len + q_len, nkv, d)).transpose(1, 2)
        v = v.view(bsz, ctx_len + q_len, nkv, d).transpose(1, 2)
        q = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
        k = k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        attn = (
            torch.softmax((q @ k.transpose(-1, -2)) * d**-0.5, dim=-1) @ v
        )  # non-causal, as is_causal=False
        x = residual + linear(a + "o_proj.weight")(attn.transpose(1, 2).reshape(bsz, q_len, nh * d))
        mlp = Qwen3MLP(config)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mlp, name).weight.data.copy_(weights[f"{p}mlp.{name}.weight"])
        x = x + mlp(rms(p + "post_attention_layernorm.weight")(x))
    return lm_head(rms("norm.weight")(x)[:, 1 - q_len :]).float()
