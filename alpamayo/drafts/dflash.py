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
from alpamayo.config.model import TextConfig
from alpamayo.decoding.draft import Draft, DraftContext
from alpamayo.text.kv_cache import KVCache
from alpamayo.text.linear import Linear, pack_linears
from alpamayo.text.norm import RMSNorm
from alpamayo.text.rope import MRope
from alpamayo.text.threads import few_rows, wide
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

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The target head's logits of the draft's positions -> the draft's: times `output_multiplier`, then
        soft-capped by `final_logit_softcapping` where given (z-lab's order)."""
        logits = logits * self.output_multiplier
        if self.final_logit_softcapping is not None:
            cap = self.final_logit_softcapping
            logits = cap * torch.tanh(logits / cap)
        return logits

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


class BlockDraft(Draft):
    """A draft that scores every row's whole block in one forward (`block_logits`) and proposes its argmax:
    the DFlash draft on either backend."""

    def block_logits(self, anchors: Sequence[int]) -> torch.Tensor:
        """Draft logits [B, block_size - 1, V] float32 of positions 1.. of each row's block [anchor, mask, ...]
        (B = len(anchors))."""
        raise NotImplementedError

    def propose(self, generated: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        if not any(n > 0 for n in limits):
            return [[] for _ in limits]
        drafted = self.block_logits([g[-1] for g in generated]).argmax(-1)
        return [drafted[r, :n].tolist() if n > 0 else [] for r, n in enumerate(limits)]


class DFlashDraft(BlockDraft):
    """A DFlash draft over a torch `TextModel` target (uses its embedding table and output head).

    It keeps its own per-layer K/V cache of the context (z-lab's `past_key_values_draft`): row r holds the
    k/v projections (k_norm, rotary at their cache index) of the fc + hidden_norm of the target's features at
    the row's first `lengths[r]` cached positions. A block writes its own K/V after them, attends over the
    row's context and itself, and is then forgotten by leaving `lengths` where it was (z-lab's `crop`): the
    next `accepted` overwrites it with the accepted positions' K/V. So each context position is projected
    once, not once per block, and rows are ragged as the target's."""

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
        for module in (*self.layers, self.fc):  # the target's packed bf16 layout (bit-identical, faster)
            pack_linears(module)
        self.rope = MRope(t, target.device)
        self.dtype = target.dtype
        self.cache: KVCache | None = None
        self.lengths: list[int] = []  # per row: context positions in the draft's cache

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
        """Target layer outputs [..., n * H] -> the draft's context [..., H] (fc, then hidden_norm)."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def begin(self, ctx: DraftContext) -> None:
        """Allocate the draft's cache for `ctx.rows` rows (kept while the target's shape stays) and fill it
        with the prompt's context, once for every row."""
        if ctx.features is None:
            raise ValueError("a DFlash draft needs the prompt's captured target layers (prefill capture=...)")
        t = self.cfg.text
        positions = self.target.cache.max_seq_len + self.block_size  # a block after the longest context
        if self.cache is None or (self.cache.max_batch, self.cache.max_seq_len) != (ctx.rows, positions):
            self.cache = KVCache(
                t.num_hidden_layers,
                ctx.rows,
                t.num_key_value_heads,
                positions,
                t.head_dim,
                self.dtype,
                self.target.device,
            )
        self.lengths = [0]
        with torch.inference_mode():
            self._append_context(0, ctx.features)
            self.cache.fork(ctx.rows, self.lengths[0])
        self.lengths = self.lengths * ctx.rows

    def accepted(self, row: int, tokens: Sequence[int], features: torch.Tensor | None) -> None:
        with torch.inference_mode():
            self._append_context(row, features)

    def _append_context(self, row: int, features: torch.Tensor) -> None:
        """Project the target's features [n, n_target * H] at row `row`'s next n positions into its cache."""
        n, start = features.shape[0], self.lengths[row]
        cos, sin = self.rope.cos_sin_1d(torch.arange(start, start + n), self.dtype)
        with few_rows(n, self.target.device):  # element-wise ops on one thread (`alpamayo.text.threads`)
            x = self.project_context(features).unsqueeze(0)
            for layer in self.layers:
                _, k, v = layer.attn.project(x, cos, sin)
                self.cache.k[layer.attn.layer][row, :, start : start + n] = k[0]
                self.cache.v[layer.attn.layer][row, :, start : start + n] = v[0]
        self.lengths[row] += n

    @torch.inference_mode()
    def block_logits(self, anchors: Sequence[int]) -> torch.Tensor:
        """Draft logits [B, block_size - 1, V] float32 of positions 1.. of each row's block [anchor, mask, ...]
        after its cached context (B = len(anchors), rows 0..B-1). The blocks' K/V are written after each row's
        context and left there (the next `accepted` overwrites them): the cache's lengths do not move."""
        c, cache = self.cfg, self.cache
        b, bs = len(anchors), c.block_size
        starts = self.lengths[:b]
        ids = torch.tensor([[a] + [c.mask_token_id] * (bs - 1) for a in anchors], device=self.target.device)
        h = self.target.embed(ids) * c.input_embedding_scale  # [B, bs, H]
        pos = torch.tensor(starts)[:, None] + torch.arange(bs)
        cos, sin = (x.view(b, 1, bs, -1) for x in self.rope.cos_sin_1d(pos.reshape(-1), self.dtype))
        end = max(starts) + bs
        # non-causal: row i's block sees its context and the whole block, keys [0, starts[i] + bs); what lies
        # past a shorter row's bound is another block's or a rejected position's K/V
        visible = (torch.arange(end) < torch.tensor(starts)[:, None] + bs).to(self.target.device)
        with few_rows(b * bs, self.target.device):  # as the target's verify
            for layer in self.layers:
                attn = layer.attn
                q, k, v = attn.project(layer.input_norm(h), cos, sin)
                cache.write_rows(attn.layer, k, v, starts)
                keys, values = cache.read(attn.layer, b, end)
                with wide():
                    out = F.scaled_dot_product_attention(
                        q, keys, values, attn_mask=visible[:, None, None], scale=attn.scale, enable_gqa=True
                    )
                h = h + attn.o_proj(out.transpose(1, 2).reshape(b, bs, -1))
                h = h + layer.mlp(layer.post_norm(h))
            h = self.norm(h)
        return c.scale_logits(self.target.logits(h[:, 1:]))
