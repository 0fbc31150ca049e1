"""A DFlash draft (`alpamayo.drafts.dflash`, z-lab's layout) on one Blackhole p150, beside its `TTTextModel`
target: the same `Draft` interface and maths as the torch `DFlashDraft`, its layers on the target's device.

    draft = TTDFlashDraft.load(directory, text)      # text: a TTTextModel; refused before any weight is read
    draft.begin(ctx); draft.propose(...); draft.accepted(row, tokens, features)

Weights: `alpamayo.plan.draft_weights` (the draft's layers, `fc` and norms, interleaved in DRAM on the
draft's `hidden_p` = hidden rounded to a tile); the embedding table (host) and `lm_head` (device) are the
target's.

Cache: the draft's own device K/V cache, per draft layer [slots, n_kv, rows, head_dim] in the recipe's
kv_cache dtype (slot b: row b, as the target's): positions [0, lengths[b]) hold the k/v projections (k_norm,
rotary at the cache index) of fc + hidden_norm of the target's features there, and the tile-aligned region
[region, region + 32) the current block's K/V. Context is written with the prefill's K/V fill, which starts on
a tile: an append re-projects the row's last partial tile (at most 31 positions, whose target features the
host keeps) with the new positions, so each context position is projected at most twice per 32 appended.

Block step (one program, captured as a trace like the target's verify and replayed with its persistent
inputs rewritten: embeddings, cos, sin, mask): slot b's block [anchor, mask, ...] on rows 32b .. 32b + bs - 1
of [1, 1, 32 x slots, hidden_p]; each layer is the text backbone's `block_prefill` with the draft's weights
and an attention that writes the block's K/V into slot b's region and runs SDPA batched over the slots, the
block's queries over the whole slot with the mask [slots, 1, 32, rows]: 0 on [0, lengths[b]) and on the
block's own bs region rows, -inf elsewhere (non-causal, as z-lab's `is_causal=False`). The final norm, then
the target's device `lm_head` on each slot's tile; the host downloads rows 1..bs-1 and applies
`output_multiplier` and `final_logit_softcapping`.

The prompt's features are read where the target's prefill left them, on the device
(`TTTextModel.captured_device`, sliced to the real columns and concatenated there; only the last partial
tile's, at most 31 rows, is downloaded for the appends). The verify's accepted positions arrive as the host
features `TTTextModel.verify(capture=...)` returns (`Draft.accepted`'s contract: at most 32 rows per block) and
are uploaded with that tail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.model import TextConfig
from alpamayo.decoding.draft import DraftContext
from alpamayo.drafts.dflash import (
    BlockDraft,
    DFlashConfig,
    DraftConfigError,
    draft_tensor_shapes,
    read_config,
)
from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.plan.draft_weights import (
    DRAFT_BANKS,
    FC_GROUP,
    block_region,
    draft_cache_rows,
    draft_weight_specs,
)
from alpamayo.plan.programs.text import TextPlan
from alpamayo.plan.weights import TEXT_GROUPS, padded_hidden, residual_norm_eps
from alpamayo.profiling import Tracer
from alpamayo.text.rope import MRope
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceIO, DeviceTensor, TensorGroup, opened
from alpamayo.tt.slot_attention import attend_by_slot
from alpamayo.tt.text import DeviceKVCache, TTTextModel
from alpamayo.tt.text.decode_inputs import Shaped
from alpamayo.tt.text.trace import DecodeTrace
from alpamayo.tt.text.weights import LayerWeights, NamedTensors
from alpamayo.tt.weight_cache import upload_weights


def check_device_draft(cfg: DFlashConfig, target: TextConfig, where: str) -> None:
    """DraftConfigError unless the device can run this draft beside `target` (after `check_target`): its
    context is written with the target's K/V fill plan (`TextPlan.kv_fill_grid`), so its K/V heads and
    head_dim must be the target's, as z-lab's drafts (the target's attention config) have them; no biases."""
    t = cfg.text
    if (t.num_key_value_heads, t.head_dim) != (target.num_key_value_heads, target.head_dim):
        raise DraftConfigError(
            f"{where}: on --backend ttnn a DFlash draft needs the target's K/V heads and head_dim "
            f"({target.num_key_value_heads} x {target.head_dim}), got {t.num_key_value_heads} x {t.head_dim}"
        )
    if t.attention_bias:
        raise DraftConfigError(f"{where}: attention_bias is not supported on --backend ttnn")


@dataclass
class DraftWeights(TensorGroup):
    """The draft's device weights (`draft_weight_specs`): its decoder layers, `fc` [n_target H, hidden_p] (the
    target features' projection) and the TILE gammas of `hidden_norm` (on fc's output) and the final `norm`."""

    layers: list[LayerWeights]
    fc: DeviceTensor
    hidden_norm: DeviceTensor
    norm: DeviceTensor

    @classmethod
    def take(cls, named: NamedTensors, layers: int) -> DraftWeights:
        """The draft of `layers` layers from its tensors by `draft_weight_specs` name."""
        stack = [LayerWeights.take(named, f"draft.layers.{i}.") for i in range(layers)]
        return cls(stack, *(named[f"draft.{name}"] for name in ("fc", "hidden_norm.tile", "norm.tile")))


T = TypeVar("T", bound=Shaped)
U = TypeVar("U", bound=Shaped)


@dataclass
class BlockInputs(TensorGroup, Generic[T]):
    """The block program's persistent inputs, host tensors (`torch.Tensor`) or their device copies: x
    [1, 1, 32 slots, hidden_p] bf16 (slot b's block embedded on rows 32b..), cos and sin [1, 1, 32 slots, hd]
    (row 32b + j at the slot's length + j) and the attention mask [slots, 1, 32, rows] (0 where slot b's
    block may attend, -inf elsewhere)."""

    x: T
    cos: T
    sin: T
    mask: T

    def map(self, fn: Callable[[T], U]) -> BlockInputs[U]:
        """`fn` of every tensor, in the order of `tensors()`."""
        x, cos, sin, mask = fn(self.x), fn(self.cos), fn(self.sin), fn(self.mask)
        return BlockInputs(x, cos, sin, mask)


@dataclass
class DraftState:
    """The draft's device state for one target cache (`target`: a new target cache means a new state): the
    target's `slots`, the block's `region` and the `rows` per slot of the draft cache (`block_region`,
    `draft_cache_rows`), the draft cache (per layer K and V [slots, n_kv, rows, head_dim]), the block
    program's persistent inputs and its captured trace (None until captured)."""

    target: DeviceKVCache | None
    slots: int
    region: int
    rows: int
    cache: list[tuple[DeviceTensor, DeviceTensor]]
    inputs: BlockInputs[DeviceTensor]
    trace: DecodeTrace | None = None


class TTDFlashDraft(BlockDraft, DeviceIO):
    """Device weights, K/V cache and block program of a DFlash draft beside one `TTTextModel`."""

    name = "dflash"
    reads_target_context = True  # the prompt's features stay on the device (`begin`)

    def __init__(self, cfg: DFlashConfig, text: TTTextModel, weights: DraftWeights):
        super().__init__(cfg.block_size)
        self.cfg, self.text, self.ttnn, self.device = cfg, text, text.ttnn, text.device
        self.capture = cfg.target_layer_ids
        self._weights: DraftWeights | None = weights
        t = cfg.text
        self.hidden_padded = padded_hidden(t, DRAFT_BANKS)
        self.residual_eps = residual_norm_eps(t, DRAFT_BANKS)
        self.scale = t.head_dim**-0.5
        self.rope = MRope(t)
        self.lengths: list[int] = []  # per row: context positions in the draft's cache
        self.tails: list[torch.Tensor] = []  # per row: target features of its last partial tile [< 32, n H]
        self._state: DraftState | None = None  # per target cache: the draft cache, inputs and trace

    @property
    def weights(self) -> DraftWeights:
        """The device weights (refused once `close`d)."""
        return opened(self._weights, "the DFlash draft")

    @property
    def tracer(self) -> Tracer:
        """The target's (its stages are the prediction's)."""
        return self.text.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        """`DeviceIO.tracer` is writable: the draft has no tracer of its own, so this sets the target's."""
        self.text.tracer = tracer

    @classmethod
    def load(cls, directory: str | Path, text: TTTextModel) -> TTDFlashDraft:
        """Read a DFlash draft for the device target `text`: config, device limits and tensor names/shapes are
        checked before any weight is read; the weights go to the target's device in its recipe."""
        cfg = read_config(directory)
        cfg.check_target(text.text_cfg, str(directory))
        check_device_draft(cfg, text.text_cfg, str(directory))
        ckpt = Checkpoint(directory)
        ckpt.validate(draft_tensor_shapes(cfg), ("",))
        specs = draft_weight_specs(cfg)
        named = upload_weights(specs, text.precision, text.device, ckpt.get, None, DRAFT_BANKS)
        return cls(cfg, text, DraftWeights.take(named, cfg.text.num_hidden_layers))

    def close(self) -> None:
        """Release the block trace and free the draft's device tensors (the device is the target's)."""
        self._drop_state()
        if self._weights is not None:
            self.free(*self._weights.tensors())
        self._weights = None

    # ------------------------------------------------------------------ cache and persistent inputs
    def _drop_state(self) -> None:
        if self._state is None:
            return
        if self._state.trace is not None:
            self._state.trace.release()
        self.free(*self._state.inputs.tensors(), *(x for kv in self._state.cache for x in kv))
        self._state = None

    def _setup(self) -> DraftState:
        """The draft cache and the block program's inputs for the target's current cache (its slots and
        positions; a new target cache means a new draft cache and a new trace)."""
        text = self.text
        if self._state is not None and self._state.target is text.cache:
            return self._state
        self._drop_state()
        ttnn, t = self.ttnn, self.cfg.text
        slots = text.max_batch
        region, rows = block_region(text.max_seq_len), draft_cache_rows(text.max_seq_len)
        shape = (slots, t.num_key_value_heads, rows, t.head_dim)
        cache = [
            tuple(
                ttnn.zeros(
                    shape,
                    dtype=text.kernels.kv_dtype,
                    layout=ttnn.TILE_LAYOUT,
                    device=self.device,
                    memory_config=ttnn.DRAM_MEMORY_CONFIG,
                )
                for _ in range(2)
            )
            for _ in range(t.num_hidden_layers)
        ]
        host = self._block_inputs([0] * slots, [0] * slots, slots, region, rows)
        self._state = DraftState(text.cache, slots, region, rows, cache, host.map(self.upload))
        return self._state

    def _block_inputs(
        self, anchors: Sequence[int], lengths: Sequence[int], slots: int, region: int, rows: int
    ) -> BlockInputs[torch.Tensor]:
        """Host values of the block program's inputs: x [1, 1, 32 slots, hidden_p] (slot b's block embedded on
        rows 32b.., zero rows elsewhere), cos/sin [1, 1, 32 slots, hd] (row 32b + j at lengths[b] + j), mask
        [slots, 1, 32, rows] (0 on slot b's context and its block's region rows, -inf elsewhere). Slots past
        len(anchors) hold a zero block at position 0 that sees its own region only (unread)."""
        c, t, bs = self.cfg, self.cfg.text, self.block_size
        x = torch.zeros(1, 1, slots * TILE, self.hidden_padded, dtype=torch.bfloat16)
        pos = torch.arange(TILE).repeat(slots)
        mask = torch.full((slots, 1, TILE, rows), float("-inf"))
        mask[..., region : region + bs] = 0
        for b, (anchor, n) in enumerate(zip(anchors, lengths, strict=False)):
            ids = torch.tensor([anchor] + [c.mask_token_id] * (bs - 1))
            x[0, 0, b * TILE : b * TILE + bs, : t.hidden_size] = self.text.embed(ids)
            pos[b * TILE : (b + 1) * TILE] += n
            mask[b, ..., :n] = 0
        cos, sin = self.rope.cos_sin_1d(pos, torch.bfloat16)
        return BlockInputs(x, cos.view(1, 1, -1, t.head_dim), sin.view(1, 1, -1, t.head_dim), mask)

    def _write(self, state: DraftState, host: BlockInputs[torch.Tensor]) -> None:
        """Rewrite the persistent inputs in place (a trace captured over them stays valid)."""
        ttnn = self.ttnn
        with self.tracer.span("tt.host_to_device"):
            for v, d in zip(host.tensors(), state.inputs.tensors(), strict=True):
                h = ttnn.from_torch(v.to(torch.bfloat16), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT)
                ttnn.copy_host_to_device_tensor(h, d)

    # ------------------------------------------------------------------ context
    def begin(self, ctx: DraftContext) -> None:
        """The prompt's context into slots 0..rows-1: the target's captured layers where they are, on the
        device (`TTTextModel.captured_device`, `ctx.features` None: they never cross to the host) or the
        host features [L, n H] a caller passes."""
        state = self._setup()
        if ctx.rows > state.slots:
            raise ValueError(f"{ctx.rows} rows for the target cache's {state.slots} slot(s)")
        rows = list(range(ctx.rows))
        if ctx.features is not None:
            self.lengths, self.tails = [0] * ctx.rows, [ctx.features[:0]] * ctx.rows
            self._append(state, rows, ctx.features)
            return
        tensors, length = self.text.captured_device
        if len(tensors) != len(self.capture) or length == 0:
            raise ValueError(
                "a DFlash draft needs the prompt's captured target layers: prefill with capture=draft.capture"
            )
        ttnn, h = self.ttnn, self.cfg.text.hidden_size
        padded = round_up(length, TILE)
        with self.tracer.span("tt.draft_context", rows=ctx.rows, positions=length):
            parts = [ttnn.slice(x, [0, 0, 0, 0], [1, 1, padded, h]) for x in tensors]  # the real columns
            x = ttnn.concat(parts, dim=-1) if len(parts) > 1 else parts[0]
            if len(parts) > 1:
                self.free(*parts)
            if (pad := round_up(x.shape[-1], TILE) - x.shape[-1]) > 0:
                wide = ttnn.pad(x, [(0, 0), (0, 0), (0, 0), (0, pad)], 0.0)
                self.free(x)
                x = wide
            start = length // TILE * TILE  # the host keeps the last partial tile's features for the appends
            if start < length:
                tile = ttnn.slice(x, [0, 0, start, 0], [1, 1, start + TILE, x.shape[-1]])
                tail = self.download(tile)[0, 0, : length - start, : len(self.capture) * h]
                self.free(tile)
            else:
                tail = torch.zeros(0, len(self.capture) * h, dtype=torch.bfloat16)
            self._project(state, rows, x, 0)
        self.lengths, self.tails = [length] * ctx.rows, [tail] * ctx.rows

    def accepted(self, row: int, tokens: Sequence[int], features: torch.Tensor | None) -> None:
        if features is None:
            raise ValueError(
                "a DFlash draft needs the accepted positions' captured target layers (capture=...)"
            )
        self._append(self._setup(), [row], features)

    def _append(self, state: DraftState, rows: list[int], features: torch.Tensor) -> None:
        """Project the target's host features [n, n_target H] at the next n positions of `rows` (one common
        context) into the draft cache, from the rows' last tile boundary (its partial tile re-projected with
        them)."""
        r0 = rows[0]
        feats = torch.cat([self.tails[r0], features.to(self.tails[r0].dtype)])
        first = self.lengths[r0] - self.tails[r0].shape[0]  # a tile boundary
        n = feats.shape[0]
        with self.tracer.span("tt.draft_context", rows=len(rows), positions=n):
            self._project(
                state, rows, self.upload_rows(feats, round_up(n, TILE), round_up(feats.shape[1], TILE)), first
            )
        end = first + n
        for row in rows:
            self.lengths[row], self.tails[row] = end, feats[n - end % TILE :] if end % TILE else feats[:0]

    def _project(self, state: DraftState, rows: list[int], x: Any, first: int) -> None:
        """Target features x [1, 1, P, n_target H (tile-padded)] (freed) at cache positions [first, first + P)
        (`first` on a tile) through fc, hidden_norm and every layer's k/v projection (k_norm, rotary) into
        the draft cache of slots `rows`."""
        ttnn, text, t = self.ttnn, self.text, self.cfg.text
        padded, weights = x.shape[-2], self.weights
        fc = text.kernels.mm(x, weights.fc, FC_GROUP)
        self.free(x)
        context = text.kernels.rms(fc, weights.hidden_norm, self.residual_eps)
        self.free(fc)
        cos, sin = self.rope.cos_sin_1d(torch.arange(first, first + padded), torch.bfloat16)
        cos, sin = self.upload(cos.view(1, 1, padded, -1)), self.upload(sin.view(1, 1, padded, -1))
        for i, w in enumerate(weights.layers):
            qkv = text.kernels.mm(context, w.wqkv, TEXT_GROUPS.qkv)
            q, k, v = ttnn.experimental.nlp_create_qkv_heads(
                qkv,
                num_heads=t.num_attention_heads,
                num_kv_heads=t.num_key_value_heads,
                transpose_k_heads=False,
                memory_config=ttnn.DRAM_MEMORY_CONFIG,
            )
            self.free(qkv, q)
            kn = text.kernels.rms(k, w.k_norm, t.rms_norm_eps)
            self.free(k)
            kr = ttnn.experimental.rotary_embedding_hf(kn, cos, sin, is_decode_mode=False)
            self.free(kn)
            cache_k, cache_v = state.cache[i]
            for row in rows:
                text.kernels.fill_cache(cache_k, kr, padded, first, batch=row)
                text.kernels.fill_cache(cache_v, v, padded, first, batch=row)
            self.free(kr, v)
        self.free(context, cos, sin)

    # ------------------------------------------------------------------ the block program
    def _attend(self, i: int, state: DraftState) -> Any:
        """Layer i's attention: slot b's block K/V into its region, then SDPA batched over the slots, slot b's
        32 query rows over slot b in place with the mask."""
        ttnn, text = self.ttnn, self.text
        slots, region, mask = state.slots, state.region, state.inputs.mask

        def sdpa(qb: Any, cache_k: Any, cache_v: Any) -> Any:
            return ttnn.transformer.scaled_dot_product_attention(
                qb,
                cache_k,
                cache_v,
                attn_mask=mask,
                is_causal=False,
                scale=self.scale,
                program_config=cfgs.sdpa(
                    ttnn, text.plan.prefill_grid, TILE, TextPlan.prefill_sdpa_chunk(state.rows)
                ),
                compute_kernel_config=text.kernels.ck.sdpa_prefill,
            )

        def attend(q: Any, k: Any, v: Any) -> Any:
            return attend_by_slot(self, text, state.cache[i], q, k, v, slots, TILE, region, sdpa)

        return attend

    def _block_graph(self, state: DraftState) -> list[Any]:
        """Every slot's block through the draft -> per slot the target head's logits rows 0..bs-1
        [1, 1, bs, V_p] (the traced body: allocates, computes, frees)."""
        ttnn, text, b, weights = self.ttnn, self.text, state.inputs, self.weights
        h = ttnn.multiply(b.x, self.cfg.input_embedding_scale)  # a new tensor: x stays for the replays
        for i, w in enumerate(weights.layers):
            attend = self._attend(i, state)
            h = text.kernels.block_prefill(
                self.cfg.text, w, h, b.cos, b.sin, attend, residual_eps=self.residual_eps
            )
        normed = text.kernels.rms(h, weights.norm, self.residual_eps)
        self.free(h)
        if (pad := text.kernels.hidden_padded - self.hidden_padded) > 0:  # the target head's K (zero columns)
            wide = ttnn.pad(normed, [(0, 0), (0, 0), (0, 0), (0, pad)], 0.0)
            self.free(normed)
            normed = wide
        out = []
        for s in range(state.slots):
            tile = ttnn.slice(normed, [0, 0, s * TILE, 0], [1, 1, (s + 1) * TILE, text.kernels.hidden_padded])
            l1 = ttnn.to_memory_config(tile, ttnn.L1_MEMORY_CONFIG)
            self.free(tile)
            out.append(text.head.logits(l1, self.block_size - 1))
            self.free(l1)
        self.free(normed)
        return out

    def block_logits(self, anchors: Sequence[int], traced: bool = True) -> torch.Tensor:
        """Draft logits [B, block_size - 1, V] float32 of positions 1.. of each row's block [anchor, mask, ...]
        after its cached context (B = len(anchors), rows 0..B-1), as the torch `DFlashDraft.block_logits`.
        Traced (card only; a dry run runs it eagerly): the first call per draft cache compiles the program
        and captures it, later calls replay it."""
        state = self._setup()
        traced = self.text.trace_switch.traced(traced)
        self._write(
            state,
            self._block_inputs(anchors, self.lengths, state.slots, state.region, state.rows),
        )
        trace = state.trace
        with self.tracer.span("tt.draft_block", rows=len(anchors), traced=traced):
            out = trace.replay() if traced and trace is not None else self._block_graph(state)
        c, vocab = self.cfg, self.cfg.text.vocab_size
        logits = torch.stack(
            [self.download(o)[0, 0, 1 : self.block_size, :vocab].float() for o in out[: len(anchors)]]
        )
        if not (traced and trace is not None):
            self.free(*out)
            if traced:
                state.trace = DecodeTrace(self.ttnn, self.device)
                state.trace.capture(lambda: self._block_graph(state))
        return c.scale_logits(logits)
