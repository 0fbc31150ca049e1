"""DFlash block drafts (z-lab/dflash) in z-lab's checkpoint layout, on the torch text layer code.

A DFlash draft is a few Qwen3 decoder layers that draft a whole block at once. Its input is the block
[anchor, mask, ..., mask] (`block_size` tokens: the anchor is the token about to enter the target's cache,
the rest `mask_token_id`), embedded with the *target's* table (times `input_embedding_scale` where given).
Its context is the target's hidden states at every cached position: the outputs of the target layers
`target_layer_ids` (transformers' `hidden_states[i + 1]`), concatenated and mapped to the draft's width by
`fc` then `hidden_norm`. In each draft layer the block's queries attend, without a causal mask, over the keys
and values of the context features and of the block itself (both through the layer's k/v projections and
k_norm), rotary positions being cache indices (context 0..N-1, block N..N+block_size-1). The final `norm`,
then the *target's* output head (times `output_multiplier`, soft-capped by `final_logit_softcapping` where
given) score positions 1..block_size-1; their argmax is the draft.

Layout (z-lab's `DFlashDraftModel.save_pretrained`): config.json is a Qwen3 text config with `block_size`,
`num_target_layers` and `dflash_config` {`mask_token_id`, `target_layer_ids`, `block_size`, ...}; weights
`layers.{i}.…` as Qwen3 decoder layers, `fc.weight` [H, n * H_target], `hidden_norm.weight`, `norm.weight`
in safetensors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from alpamayo.checkpoint import Checkpoint
from alpamayo.config import TextConfig
from alpamayo.drafts.base import Draft, DraftContext
from alpamayo.text.linear import Linear
from alpamayo.text.norm import RMSNorm
from alpamayo.text.rope import MRope
from alpamayo.text.weights import build_layer

ARCHITECTURE = "DFlashDraftModel"
REFUSED = {"DFlash2DraftModel": "DFlash2 (grouped dynamic convolutions and a candidate selector)"}


class DraftConfigError(ValueError):
    """A DFlash draft directory that cannot serve this target; raised before any weight is read."""


@dataclass(frozen=True)
class DFlashConfig:
    """The fields of a DFlash config.json this stack reads (names as z-lab writes them)."""

    text: TextConfig
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str) -> DFlashConfig:
        archs = raw.get("architectures") or [ARCHITECTURE]
        for arch in archs:
            if arch in REFUSED:
                raise DraftConfigError(
                    f"{where}: architecture {arch} ({REFUSED[arch]}) is not supported; this stack reads "
                    f"{ARCHITECTURE} drafts"
                )
        dflash = raw.get("dflash_config")
        if not isinstance(dflash, dict):
            raise DraftConfigError(f"{where}: no 'dflash_config' object: not a DFlash draft config")
        if dflash.get("mask_token_id") is None:
            raise DraftConfigError(
                f"{where}: dflash_config.mask_token_id is missing (the block's filler token)"
            )
        block = dflash.get("block_size", raw.get("block_size"))
        if not isinstance(block, int) or not 2 <= block <= 32:
            raise DraftConfigError(f"{where}: block_size must be an integer in [2, 32], got {block!r}")
        layers = dflash.get("target_layer_ids")
        if (
            not isinstance(layers, list)
            or not layers
            or not all(isinstance(i, int) and i >= 0 for i in layers)
        ):
            raise DraftConfigError(
                f"{where}: dflash_config.target_layer_ids must be a non-empty list of layer indices, got {layers!r}"
            )
        rope = raw.get("rope_parameters") or {}
        heads = raw["num_attention_heads"]
        text = TextConfig(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 1_000_000.0))),
            attention_bias=bool(raw.get("attention_bias", False)),
        )
        cap = raw.get("final_logit_softcapping", dflash.get("final_logit_softcapping"))
        return cls(
            text,
            block,
            int(dflash["mask_token_id"]),
            tuple(layers),
            float(raw.get("input_embedding_scale", dflash.get("input_embedding_scale", 1.0))),
            float(raw.get("output_multiplier", dflash.get("output_multiplier", 1.0))),
            None if cap is None else float(cap),
        )

    def check_target(self, target: TextConfig, where: str) -> None:
        """DraftConfigError unless the draft fits `target` (its hidden size, vocabulary and layers)."""
        t = self.text
        if t.hidden_size != target.hidden_size:
            raise DraftConfigError(
                f"{where}: draft hidden_size {t.hidden_size} != the target's {target.hidden_size} "
                "(a draft for another target)"
            )
        if t.vocab_size != target.vocab_size:
            raise DraftConfigError(
                f"{where}: draft vocab_size {t.vocab_size} != the target's {target.vocab_size} "
                "(a draft for another target)"
            )
        bad = [i for i in self.target_layer_ids if i >= target.num_hidden_layers]
        if bad:
            raise DraftConfigError(
                f"{where}: target_layer_ids {bad} beyond the target's layers [0, {target.num_hidden_layers})"
            )
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise DraftConfigError(
                f"{where}: mask_token_id {self.mask_token_id} outside the vocabulary [0, {target.vocab_size})"
            )


def draft_tensor_shapes(cfg: DFlashConfig) -> dict[str, list[tuple[int, ...]]]:
    """Every tensor of a DFlash checkpoint -> its allowed shapes (its layers are Qwen3 decoder layers)."""
    t = cfg.text
    h = t.hidden_size
    shapes: dict[str, list[tuple[int, ...]]] = {
        "fc.weight": [(h, len(cfg.target_layer_ids) * h)],
        "hidden_norm.weight": [(h,)],
        "norm.weight": [(h,)],
    }
    for i in range(t.num_hidden_layers):
        shapes.update(t.layer_shapes(i, f"layers.{i}."))
    return shapes


def read_config(directory: str | Path) -> DFlashConfig:
    """DFlashConfig of `directory`/config.json (DraftConfigError naming the problem)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise DraftConfigError(
            f"{directory}: no config.json (a DFlash draft directory holds config.json and safetensors)"
        )
    try:
        raw = json.loads(path.read_text())
        return DFlashConfig.from_dict(raw, str(path))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise DraftConfigError(
            f"{path}: not a readable Qwen3 text config with dflash_config ({e!r})"
        ) from None


class DFlashDraft(Draft):
    """A DFlash draft over a torch `TextModel` target (uses its embedding table and output head)."""

    name = "dflash"

    def __init__(self, cfg: DFlashConfig, get, target: Any):
        super().__init__(cfg.block_size)
        self.cfg, self.target = cfg, target
        t = cfg.text
        self.capture = cfg.target_layer_ids
        self.layers = [build_layer(t, i, get, f"layers.{i}.") for i in range(t.num_hidden_layers)]
        self.fc = Linear(get("fc.weight"))
        self.hidden_norm = RMSNorm(get("hidden_norm.weight"), t.rms_norm_eps)
        self.norm = RMSNorm(get("norm.weight"), t.rms_norm_eps)
        self.rope = MRope(t, target.device)
        self.dtype = target.dtype
        self.context: list[torch.Tensor] = []  # per row: fc + hidden_norm of the context features [N, H]

    @classmethod
    def load(cls, directory: str | Path, target: Any) -> DFlashDraft:
        """Read a DFlash draft for `target` (a torch `TextModel`): config and tensor names/shapes are checked
        against the target before any weight is read."""
        cfg = read_config(directory)
        cfg.check_target(target.text_cfg, str(directory))
        ckpt = Checkpoint(directory)
        ckpt.validate(draft_tensor_shapes(cfg), ("",))
        return cls(cfg, ckpt.getter(target.dtype, target.device), target)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """Target layer outputs [N, n * H] -> the draft's context [N, H] (fc, then hidden_norm)."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def begin(self, ctx: DraftContext) -> None:
        if ctx.features is None:
            raise ValueError("a DFlash draft needs the prompt's captured target layers (prefill capture=...)")
        with torch.inference_mode():
            prompt = self.project_context(ctx.features)
        self.context = [prompt] * ctx.rows

    def accepted(self, row: int, tokens: Sequence[int], features: torch.Tensor | None) -> None:
        with torch.inference_mode():
            self.context[row] = torch.cat([self.context[row], self.project_context(features)])

    @torch.inference_mode()
    def block_logits(self, context: torch.Tensor, anchor: int) -> torch.Tensor:
        """Draft logits [block_size - 1, V] float32 of positions 1.. of the block [anchor, mask, ...] after
        `context` [N, H] (already through fc and hidden_norm)."""
        c = self.cfg
        n, bs = context.shape[0], c.block_size
        ids = torch.tensor([anchor] + [c.mask_token_id] * (bs - 1), device=context.device)
        h = (self.target.embed(ids) * c.input_embedding_scale).unsqueeze(0)  # [1, bs, H]
        cos, sin = self.rope.cos_sin_1d(torch.arange(n + bs), self.dtype)
        ctx = context.unsqueeze(0)
        for layer in self.layers:
            attn = layer.attn
            x = layer.input_norm(h)
            q, k, v = attn.project(torch.cat([ctx, x], dim=1), cos, sin)
            out = F.scaled_dot_product_attention(q[:, :, n:], k, v, scale=attn.scale, enable_gqa=True)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(1, bs, -1))
            h = h + layer.mlp(layer.post_norm(h))
        logits = self.target.logits(self.norm(h)[0, 1:]) * c.output_multiplier
        if c.final_logit_softcapping is not None:
            cap = c.final_logit_softcapping
            logits = cap * torch.tanh(logits / cap)
        return logits

    def propose(self, generated: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        out = []
        for r, (g, limit) in enumerate(zip(generated, limits, strict=True)):
            if limit <= 0:
                out.append([])
                continue
            out.append(self.block_logits(self.context[r], g[-1]).argmax(-1)[:limit].tolist())
        return out
