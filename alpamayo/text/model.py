"""Torch reference Qwen3-VL text decoder (dense or MoE) with a static KV cache.

Usage:
    model = TextModel.from_checkpoint(ckpt_dir, dtype=torch.bfloat16)
    model.setup_cache(max_seq_len=4096)
    logits = model.prefill(input_ids, position_ids)      # [V] float32, last prompt position
    logits = model.decode(next_id)                       # [V] float32, one new token
    logits = model.verify(block)                         # [B, T, V] float32, T tokens per row in one forward
    model.rollback([n_0, ..., n_{B-1}])                  # keep each row's first n_i positions

Rows: after `fork(n)` the cache holds n sequences. Each row has its own length (`lengths[i]`, positions
filled in row i), so rows may be ragged: after a speculative block each row keeps its own accepted prefix
(`rollback`). A token appended to row i sits at cache index `lengths[i]` and rope position
`lengths[i] + rope_delta`; its query sees exactly the row's first `lengths[i]` positions plus the tokens
before it in the same call. K/V past a row's length are stale and never read; the next append overwrites
them. While every row has the same length, appending runs the uniform path (one scalar start), bit-identical
to plain decoding before rows could be ragged.

Positions: prefill takes the 3-row M-RoPE ids [3, L] (T, H, W; text-only prompts may omit them). It stores
`rope_delta = max(position_ids) + 1 - L`, and every decoded token then sits at `cache_len + rope_delta` on all
three rows, which is transformers' rule. DeepStack features are added to the output of decoder layer k at
the visual positions, during prefill only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from alpamayo.checkpoint import Checkpoint, Getter, open_checkpoint
from alpamayo.config.model import ModelConfig
from alpamayo.profiling.tracer import Tracer
from alpamayo.quant import PART_NAMES, QuantRecipe
from alpamayo.quant.cache import PackedWeightCache
from alpamayo.text.inputs import check_decode_room, check_prefill, check_token_ids, prompt_hidden, rope_delta
from alpamayo.text.kv_cache import KVCache
from alpamayo.text.layer import DecoderLayer
from alpamayo.text.linear import Linear, pack_linears
from alpamayo.text.norm import RMSNorm
from alpamayo.text.rope import MRope
from alpamayo.text.threads import few_rows
from alpamayo.text.weights import EMBED, FINAL_NORM, LM_HEAD, build_layer, validate_text_tensors


class TextModel(nn.Module):
    """Embeddings, decoder layers, final RMSNorm and LM head, plus the generation state (cache, positions)."""

    max_verify_rows: int | None = None  # rows x tokens of one `verify`: no bound (ttnn: one tile)

    def __init__(
        self,
        cfg: ModelConfig,
        embed: torch.Tensor,
        layers: Sequence[DecoderLayer],
        norm: RMSNorm,
        head: Linear,
    ):
        super().__init__()
        self.cfg, self.text_cfg = cfg, cfg.text
        self.embed_weight = embed  # [V, H]
        self.layers = nn.ModuleList(layers)
        self.norm, self.head = norm, head
        self.dtype, self.device = embed.dtype, embed.device
        self.rope = MRope(cfg.text, self.device)
        self.cache: KVCache | None = None
        # applied to K/V on their way into the cache (None: stored as computed); see KVCache
        self.kv_store: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.captured: list[torch.Tensor] = []  # prefill_hidden(capture=...)'s layer outputs [L, H]
        self.reset()

    @classmethod
    def from_checkpoint(
        cls,
        source: str | Path | Checkpoint,
        cfg: ModelConfig | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        quant: QuantRecipe | None = None,
        quant_cache: PackedWeightCache | None = None,
    ) -> TextModel:
        """Build from a checkpoint directory (or an open `Checkpoint`), validating every text tensor first;
        `quant`: weight-only quantisation of the linears at load (see `alpamayo.quant`), through `quant_cache`
        (`alpamayo.quant.cache`) when given."""
        ckpt, cfg = open_checkpoint(source, cfg)
        validate_text_tensors(ckpt, cfg)
        return cls.from_weights(cfg, ckpt.getter(dtype, device), quant, quant_cache)

    @classmethod
    def from_weights(
        cls,
        cfg: ModelConfig,
        get: Getter,
        quant: QuantRecipe | None = None,
        quant_cache: PackedWeightCache | None = None,
    ) -> TextModel:
        """Build from tensors by canonical name (`get(name)`, already in the model's dtype and device; not
        validated: `from_checkpoint` validates the checkpoint first)."""
        t = cfg.text
        embed = get(EMBED)
        layers = [build_layer(t, i, get) for i in range(t.num_hidden_layers)]
        head = Linear(embed if cfg.tie_word_embeddings else get(LM_HEAD), role="head")
        model = cls(cfg, embed, layers, RMSNorm(get(FINAL_NORM), t.rms_norm_eps), head)
        pack_linears(model, keep_plain=embed, quant=quant, cache=quant_cache, part=PART_NAMES["text"])
        return model.eval()

    # ------------------------------------------------------------------ state
    def setup_cache(self, max_seq_len: int, max_batch: int = 1) -> None:
        """Allocate the static KV cache: `max_seq_len` positions (prompt + generated) for `max_batch` rows."""
        if max_seq_len < 1 or max_batch < 1:
            raise ValueError(f"max_seq_len and max_batch must be >= 1, got {max_seq_len}, {max_batch}")
        self.cache = self.new_cache(max_seq_len, max_batch)
        self.reset()

    def new_cache(self, max_seq_len: int, max_batch: int) -> KVCache:
        """A static KV cache of this model's layers, K/V heads, head_dim, dtype and device (K/V through
        `kv_store` on their way in), `max_batch` rows x `max_seq_len` positions; not made the active one."""
        t = self.text_cfg
        return KVCache(
            t.num_hidden_layers,
            max_batch,
            t.num_key_value_heads,
            max_seq_len,
            t.head_dim,
            self.dtype,
            self.device,
            self.kv_store,
        )

    def reset(self) -> None:
        """Forget the prompt (the cache buffers stay allocated)."""
        self.lengths = [0]  # per active row: positions filled in its cache row (see the module docstring)
        self.rope_delta = 0  # decode positions are lengths[i] + rope_delta (see the module docstring)

    @property
    def batch(self) -> int:
        """Active cache rows."""
        return len(self.lengths)

    @property
    def cache_len(self) -> int:
        """The longest row's length: the extent of the cache a reader must view (rows past their own length
        hold stale K/V that a per-row mask hides, e.g. `alpamayo.expert`'s offsets)."""
        return max(self.lengths)

    @cache_len.setter
    def cache_len(self, n: int) -> None:
        """Give every active row length n (positions [0, n) then count as filled)."""
        self.lengths = [int(n)] * self.batch

    def fork(self, n: int) -> None:
        """Continue the prefilled prompt as `n` independent sequences (rows) sharing its KV cache."""
        cache = self._require_cache()
        if not 1 <= n <= cache.max_batch:
            raise ValueError(f"fork({n}): the cache was set up for 1..{cache.max_batch} rows")
        if self.cache_len == 0:
            raise RuntimeError("fork() needs a prefilled prompt")
        cache.fork(n, self.lengths[0])
        self.lengths = [self.lengths[0]] * n

    def rollback(self, lengths: Sequence[int]) -> None:
        """Keep the first `lengths[i]` positions of each active row i (one int per row, each in
        [1, current length]): a speculative block's rejected tokens are forgotten without recompute or copy;
        the next append to the row overwrites them."""
        lengths = [int(n) for n in lengths]
        if len(lengths) != self.batch:
            raise ValueError(f"rollback got {len(lengths)} length(s) for {self.batch} active row(s)")
        for i, (n, have) in enumerate(zip(lengths, self.lengths, strict=True)):
            if not 1 <= n <= have:
                raise ValueError(f"rollback: row {i} length {n} must be in [1, {have}] (its current length)")
        self.lengths = lengths

    def save_state(self) -> tuple[KVCache | None, list[int], int]:
        """The cache and generation state, for `restore_state` after the model served another prompt in a
        different cache (the action expert's unguided branch)."""
        return self.cache, list(self.lengths), self.rope_delta

    def restore_state(self, state: tuple[KVCache | None, list[int], int]) -> None:
        self.cache, lengths, self.rope_delta = state
        self.lengths = list(lengths)

    def trace_into(self, tracer: Tracer) -> None:
        """The torch backbone has no stages finer than the runtime's (`alpamayo.runtime`): nothing to record."""

    def close(self) -> None:
        """The torch backbone holds nothing but host or CUDA tensors, which go with the model: nothing to
        release."""

    def _require_cache(self) -> KVCache:
        if self.cache is None:
            raise RuntimeError("call setup_cache(max_seq_len) before prefill/decode")
        return self.cache

    # ------------------------------------------------------------------ compute
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> embeddings [..., H] in the model dtype."""
        check_token_ids(ids, self.text_cfg.vocab_size)
        return F.embedding(ids.to(self.device), self.embed_weight)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [..., H] -> float32 logits [..., V]."""
        return self.head(hidden).float()

    def _layers(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start: int | list[int],
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
        stepwise: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """h [B, T, H] through every layer -> (final-normed hidden [B, T, H], the outputs [B, T, H] of the
        layers in `capture`, in that order: transformers' `hidden_states[i + 1]`, the normed output for the
        last layer). `start`: the rows' common cache index, or one per row (ragged); `stepwise`: every query
        attends as a one-token decode would (`Attention.forward`)."""
        cache = self._require_cache()
        taken: dict[int, torch.Tensor] = {}
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, cache, start, stepwise)
            if deepstack is not None and i < len(deepstack):
                h[0, visual_pos_mask] += deepstack[i].to(h.dtype)
            if i in capture and i != last:
                taken[i] = h
        out = self.norm(h)
        if last in capture:
            taken[last] = out
        return out, [taken[i] for i in capture]

    @torch.inference_mode()
    def prefill_hidden(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """Run a fresh prompt through the decoder and fill the cache; returns final-normed hidden [L, H].
        `capture`: layer indices whose outputs [L, H] are left in `self.captured` (a DFlash draft's context).

        inputs: token ids [L] (int) or embeddings [L, H] (image embeds already scattered in).
        position_ids: [3, L] M-RoPE rows (T, H, W); default arange on all rows (text only).
        visual_pos_mask: [L] bool, the image-token positions; deepstack: per level k, [n_visual, H] added to
        the output of layer k at those positions.
        """
        cache = self._require_cache()
        h = prompt_hidden(self.text_cfg, inputs, self.embed).to(self.device, self.dtype)
        length = h.shape[0]
        position_ids = check_prefill(
            self.text_cfg, length, cache.max_seq_len, position_ids, visual_pos_mask, deepstack
        )
        self.reset()
        cos, sin = self.rope.cos_sin(position_ids, self.dtype)
        if visual_pos_mask is not None:
            visual_pos_mask = visual_pos_mask.to(self.device)
        out, taken = self._layers(h.unsqueeze(0), cos, sin, 0, visual_pos_mask, deepstack, capture)
        self.lengths = [length]
        self.rope_delta = rope_delta(position_ids)
        self.captured = [t[0] for t in taken]
        return out[0]

    def prefill(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """`prefill_hidden` (with its `capture`), then float32 logits [V] of the last prompt position."""
        hidden = self.prefill_hidden(inputs, position_ids, visual_pos_mask, deepstack, capture)
        with torch.inference_mode():
            return self.logits(hidden[-1])

    def prefill_block(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
        drafted: torch.Tensor | Sequence[int] = (),
    ) -> torch.Tensor:
        """A prompt (arguments as `prefill`) and the token ids `drafted` [n] after it, at the positions decode
        steps would give them -> float32 logits [n + 1, V]: row 0 the prompt's last position's, row j the
        next-token logits after its j-th drafted token. The cache then holds the prompt and all n; `rollback`
        keeps each row's accepted prefix. `captured` holds the prompt's rows only.

        Here the prompt's `prefill`, then a `verify` of the drafted tokens, so both are bit for bit what plain
        decoding computes (one masked forward over prompt + drafts rounds the prompt's rows with their number:
        float32 GEMMs and the MoE's per-expert groups change M; the tiny MoE's prompt K/V moved by ~1e-7);
        on the host that is one weight pass more, on the device (`alpamayo.tt`) they run as one prefill."""
        first = self.prefill(inputs, position_ids, visual_pos_mask, deepstack, capture)[None]
        ids = torch.as_tensor(drafted, dtype=torch.long).reshape(1, -1)
        return torch.cat([first, self.verify(ids)[0]]) if ids.shape[1] else first

    @torch.inference_mode()
    def decode(self, tokens: int | torch.Tensor) -> torch.Tensor:
        """Append one token per active row (rows may be ragged) and return float32 logits: [V] for an int,
        [B, V] for ids [B]."""
        check_decode_room(self.cache_len, self._require_cache().max_seq_len)
        single = isinstance(tokens, int)
        ids = torch.tensor([tokens]) if isinstance(tokens, int) else tokens.reshape(-1)
        if ids.numel() != self.batch:
            raise ValueError(f"decode got {ids.numel()} token(s) for {self.batch} active row(s)")
        logits = self.logits(self._append(ids[:, None])[0][:, 0])
        return logits[0] if single else logits

    @torch.inference_mode()
    def extend(self, tokens: torch.Tensor) -> None:
        """Append T tokens to each active row in one forward (ids [B, T]), causal among them; no logits.

        Replays a known continuation, e.g. the generated reasoning into another prompt's cache."""
        ids = tokens.reshape(self.batch, -1)
        check_decode_room(self.cache_len, self._require_cache().max_seq_len, ids.shape[1])
        self._append(ids)

    @torch.inference_mode()
    def verify(
        self, tokens: torch.Tensor, capture: Sequence[int] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append a block of T tokens to each active row in one forward and score every one of them.

        tokens: ids [B, T] (B = active rows, ragged allowed), row i's at cache indices lengths[i] ..
        lengths[i] + T - 1, causal among them. Returns float32 logits [B, T, V] (position j: the next-token
        logits after tokens[:, j]); with `capture` (layer indices) also the concatenated outputs of those
        layers [B, T, len(capture) * H] in the model dtype (a DFlash draft's context features). Every row's
        length grows by T; `rollback` then keeps each row's accepted prefix.

        Each token's logits and K/V are bit for bit what a one-token `decode` at its position computes, where
        the linears' kernels give every row the same result whatever the number of rows (on CPU in float32 and
        bfloat16 `alpamayo.text.linear`'s packed ones do; CUDA's cuBLAS and the quantised kernels past their
        dequantise threshold need not, docs/speculative.md): the attention runs stepwise
        (`Attention._stepwise`). So what reads the cache after a speculative reasoning (the action expert)
        reads what plain decoding leaves."""
        if tokens.dim() != 2 or tokens.shape[0] != self.batch or tokens.shape[1] < 1:
            raise ValueError(f"verify takes ids [{self.batch}, T >= 1], got shape {list(tokens.shape)}")
        check_decode_room(self.cache_len, self._require_cache().max_seq_len, tokens.shape[1])
        hidden, taken = self._append(tokens, capture, stepwise=True)
        logits = self.logits(hidden)
        return (logits, torch.cat(taken, dim=-1)) if capture else logits

    def _append(
        self, ids: torch.Tensor, capture: Sequence[int] = (), stepwise: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Ids [B, T], row i's at positions lengths[i] + rope_delta onwards (callers checked the room) ->
        (final-normed hidden [B, T, H], captured layer outputs); every row then holds T more positions.
        `stepwise`: the attention of `Attention.forward` (a verify's block; a decode's one token always is)."""
        b, t = ids.shape
        steps = torch.arange(t)
        if len(set(self.lengths)) == 1:  # uniform rows: one scalar start, the plain decoding path
            first = self.lengths[0]
            start: int | list[int] = first
            cos, sin = self.rope.cos_sin_1d(steps + first + self.rope_delta, self.dtype)
        else:
            start = rows = list(self.lengths)
            pos = torch.tensor(rows)[:, None] + steps + self.rope_delta  # [B, T]
            cos, sin = (c.view(b, 1, t, -1) for c in self.rope.cos_sin_1d(pos.reshape(-1), self.dtype))
        with few_rows(b * t, self.device):  # element-wise ops on one thread (`alpamayo.text.threads`)
            h, taken = self._layers(self.embed(ids), cos, sin, start, capture=capture, stepwise=stepwise)
        self.lengths = [n + t for n in self.lengths]
        return h, taken
