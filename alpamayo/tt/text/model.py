"""The Qwen3-VL text backbone on one Blackhole p150: construction, KV cache and generation state.

`TTTextModel` builds its blocks over the weights `alpamayo.tt.text.weights` puts on the device and delegates
to them:

- `kernels` (`TextKernels`): the ttnn module, device, tracer, plan and compute-kernel configs, and the
  operations every block shares (prefill matmul and norms, the K/V cache fill, the pre-norm block);
- `head` (`TextHead`): the host embedding table, the final norm and the lm_head;
- `layers` (`DecoderLayer` each): a layer's weights, its MoE block on sparse layers, its prefill and decode;
- `cache` (`DeviceKVCache`, from `setup_cache`) and `rows` (`RowState`: the active rows' lengths and rope
  offset);
- `prefiller` (`TextPrefill`) and `decoder` (`TextDecode`, with its persistent inputs and traces).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from alpamayo.checkpoint import Checkpoint, open_checkpoint
from alpamayo.config.builtin import model_block_config
from alpamayo.config.model import ModelConfig
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.errors import BackendUnavailable
from alpamayo.plan.device_spec import DeviceSpec
from alpamayo.plan.dram import check_fits
from alpamayo.plan.precision import Precision, load_precision
from alpamayo.plan.programs.text import PREFILL_PAD, TextPlan, plan_text
from alpamayo.profiling import Tracer
from alpamayo.text.rope import MRope
from alpamayo.text.weights import EMBED, validate_text_tensors
from alpamayo.tt.device import close_device, device_unavailable_reason, open_device, ttnn_for
from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.moe import TTMoE
from alpamayo.tt.text.cache import DeviceKVCache, RowState
from alpamayo.tt.text.decode import TextDecode
from alpamayo.tt.text.decode_inputs import MAX_ROWS, program_rows
from alpamayo.tt.text.decode_programs import DecodePrograms
from alpamayo.tt.text.head import TextHead
from alpamayo.tt.text.kernels import TextKernels
from alpamayo.tt.text.layer import DecoderLayer
from alpamayo.tt.text.prefill import TextPrefill
from alpamayo.tt.text.weights import TextWeights, upload_text_weights


class TTTextModel:
    """One text decoder on one Blackhole chip: its blocks (see module docstring), KV cache and rows."""

    def __init__(
        self,
        cfg: ModelConfig,
        precision: Precision,
        plan: TextPlan,
        device: Any,
        weights: TextWeights,
        embed: torch.Tensor,
        tracer: Tracer | None = None,
        owns_device: bool = False,
    ):
        ttnn = ttnn_for(device)
        t = cfg.text
        self.cfg, self.text_cfg, self.precision, self.plan = cfg, t, precision, plan
        self.owns_device = owns_device
        self.kernels = kern = TextKernels(ttnn, device, t, precision, plan, tracer or Tracer(enabled=False))
        self.head = TextHead(kern, embed, weights.norm_rm, weights.norm_tile, weights.lm_head)
        programs = DecodePrograms(kern)
        moe_plan = plan.moe  # None for a dense model, which has no sparse layers
        self.layers: list[DecoderLayer] = []
        for i, w in enumerate(weights.layers):
            moe = None
            if moe_plan is not None and w.moe is not None:
                moe = TTMoE(ttnn, device, moe_plan, w.moe, kern.ck, kern.tracer)
            self.layers.append(DecoderLayer(i, w, moe, kern, programs))
        self.rope = MRope(t)
        self.rows = RowState()  # positions filled per active row (cache slot b: row b)
        self.cache: DeviceKVCache | None = None
        # cache rows kept behind max_seq_len by default: the action expert's K/V region (see setup_cache)
        self.reserved_rows = 0
        self.prefiller = TextPrefill(kern, self.layers, self.head, self.rope, self.rows)
        self.decoder = TextDecode(kern, programs, self.layers, self.head, self.rope, self.rows)

    @property
    def ttnn(self) -> Any:
        return self.kernels.ttnn

    @property
    def device(self) -> Any:
        """The device (None once closed)."""
        return self.kernels.device

    @property
    def tracer(self) -> Tracer:
        return self.kernels.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        """Stages of this model and of its MoE blocks go to `tracer`."""
        self.kernels.tracer = tracer
        for layer in self.layers:
            if layer.moe is not None:
                layer.moe.tracer = tracer

    def trace_into(self, tracer: Tracer) -> None:
        """Time the device work (`tt.prefill_layers`, `tt.decode_trace_execute`, host <-> device copies) as
        spans of `tracer`."""
        self.tracer = tracer

    @property
    def moe(self) -> dict[int, TTMoE]:
        """The MoE blocks of the sparse layers by layer index (empty for a dense model)."""
        return {layer.index: layer.moe for layer in self.layers if layer.moe is not None}

    @property
    def trace_switch(self) -> Any:
        """Whether requested traces are captured on this device (`alpamayo.tt.text.trace.TraceSwitch`)."""
        return self.decoder.trace_switch

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(
        cls,
        source: str | Path | Checkpoint,
        cfg: ModelConfig | None = None,
        precision: str | Precision = "performance",
        device: Any = None,
        cache_dir: str | Path | None = None,
        tracer: Tracer | None = None,
        moe: str | Path | MoEBlockConfig | None = None,
        extra_trace_bytes: int = 0,
        mode: str | None = None,
    ) -> TTTextModel:
        """Plan, check the DRAM budget, open the device (unless given) and upload every weight.

        `cache_dir` keeps the packed weights as `.tensorbin` files (see `alpamayo.tt.weight_cache`). `moe`: the
        MoE block config (or its YAML file) of a model with sparse layers; see `model_block_config`.
        `extra_trace_bytes`: trace region for other models' traces on the device this opens (the action
        expert's step, `ExpertPlan.trace_region_bytes`). `mode`: the device mode when this opens the device
        (`alpamayo.tt.device.tt_mode`: "device", or "golden" for ttnn's golden functions on the host).
        Everything that can be refused (no ttnn or no device, unsupported config, recipe, MoE block, plan,
        DRAM) is refused before the device is opened.
        """
        if device is None and (reason := device_unavailable_reason(mode=mode)) is not None:
            raise BackendUnavailable(reason)
        ckpt, cfg = open_checkpoint(source, cfg)
        block = model_block_config(cfg.text, moe)
        validate_text_tensors(ckpt, cfg)
        precision = load_precision(precision)
        plan = plan_text(cfg, precision, moe=block)
        check_fits(cfg, precision, PREFILL_PAD)
        owns = device is None
        device = open_device(plan.trace_region_bytes + extra_trace_bytes, mode) if owns else device
        try:
            plan = plan_text(cfg, precision, DeviceSpec.from_device(device), moe=block)
            weights = upload_text_weights(cfg, precision, plan, device, ckpt, cache_dir)
            embed = ckpt.get(EMBED, torch.bfloat16)
            return cls(cfg, precision, plan, device, weights, embed, tracer, owns_device=owns)
        except BaseException:
            if owns:
                close_device(device)
            raise

    def setup_cache(self, max_seq_len: int, max_batch: int = 1, reserve_rows: int | None = None) -> None:
        """Allocate the KV cache for `max_seq_len` positions (prompt + generated) in each of `max_batch` slots
        (1..32: the rows of one decode program); refused if it cannot fit. `reserve_rows` (default
        `reserved_rows`, which a `TTActionExpert` sets) more rows are kept behind them in every slot for the
        action expert's K/V (`ExpertPlan`: sample b's in slot b). Above 8 the slots are rounded up to a
        multiple of 8 (`program_rows`: every slot is a row of the decode program), so `max_batch` may exceed
        the count asked for."""
        reserve_rows = self.reserved_rows if reserve_rows is None else reserve_rows
        if not 1 <= max_batch <= MAX_ROWS:
            raise ValueError(
                f"max_batch must be in 1..{MAX_ROWS} (the rows of one decode tile), got {max_batch}"
            )
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        max_batch = program_rows(max_batch)
        check_fits(self.cfg, self.precision, max_seq_len, self.plan.device, slots=max_batch)
        self.decoder.release_traces()
        self._free_cache()
        rows = self.plan.cache_length(max_seq_len + reserve_rows)
        self.cache = DeviceKVCache.allocate(self.kernels, max_seq_len, max_batch, rows)
        self.reset()

    @property
    def kv_cache(self) -> list[tuple[DeviceTensor, DeviceTensor]]:
        """Per layer (K, V) device tensors; empty before `setup_cache`."""
        return self.cache.layers if self.cache is not None else []

    @property
    def max_seq_len(self) -> int:
        return self.cache.max_seq_len if self.cache is not None else 0

    @property
    def max_batch(self) -> int:
        """Cache slots: the rows of every decode step (idle ones included)."""
        return self.cache.max_batch if self.cache is not None else 0

    @property
    def lengths(self) -> list[int]:
        """Positions filled per active row (cache slot b: row b)."""
        return self.rows.lengths

    @lengths.setter
    def lengths(self, lengths: list[int]) -> None:
        self.rows.lengths = lengths

    @property
    def rope_delta(self) -> int:
        """Rope offset of the positions after the prompt (decode position = cache index + rope_delta)."""
        return self.rows.rope_delta

    @rope_delta.setter
    def rope_delta(self, delta: int) -> None:
        self.rows.rope_delta = delta

    @property
    def cache_len(self) -> int:
        """Positions filled in the longest active row (all rows, unless a speculative block left them
        ragged)."""
        return max(self.rows.lengths)

    @cache_len.setter
    def cache_len(self, length: int) -> None:
        self.rows.lengths = [length] * len(self.rows.lengths)

    @property
    def batch(self) -> int:
        """Active rows (cache slots 0..batch-1)."""
        return len(self.rows.lengths)

    def reset(self) -> None:
        """Forget the prompt (the cache buffers stay allocated)."""
        self.rows.reset()

    def fork(self, n: int) -> None:
        """Continue the prefilled prompt as `n` independent rows: slot 0's K/V rows are copied on the device
        into slots 1..n-1 (`DeviceKVCache.copy_slot0`)."""
        cache = self._require_cache()
        if not 1 <= n <= cache.max_batch:
            raise ValueError(f"fork({n}): the cache was set up for 1..{cache.max_batch} rows")
        if self.batch != 1 or self.lengths[0] == 0:
            raise RuntimeError("fork() needs a prefilled prompt in one row")
        length = self.lengths[0]
        if n > 1:
            padded = self.plan.padded_length(length)  # what the prefill wrote: whole 128-row blocks
            with self.tracer.span("tt.fork", rows=n, positions=length):
                cache.copy_slot0(self.kernels, padded, n)
        self.lengths = [length] * n

    def rollback(self, lengths: Sequence[int]) -> None:
        """Keep each row's first `lengths[b]` positions (a speculative block's accepted prefix): no copy, the
        K/V past them are stale and the next append overwrites them."""
        lengths = [int(n) for n in lengths]
        if len(lengths) != self.batch:
            raise ValueError(f"rollback got {len(lengths)} length(s) for {self.batch} active row(s)")
        for b, (n, now) in enumerate(zip(lengths, self.lengths, strict=True)):
            if not 1 <= n <= now:
                raise ValueError(f"rollback: row {b} length {n} must be in [1, {now}]")
        self.lengths = lengths

    def close(self) -> None:
        """Release the decode traces, the KV cache, the weights and (when this model opened it) the device. The
        weights are freed even then: on a device shared with other models they would otherwise stay in DRAM."""
        kern = self.kernels
        self.decoder.close()
        self._free_cache()
        self.prefiller.keep_captured([], 0)
        kern.free(*(t for layer in self.layers for t in layer.weights.tensors()), *self.head.tensors())
        self.layers.clear()  # the runners hold this list
        if self.owns_device and kern.device is not None:
            close_device(kern.device)
        kern.device = None

    def __enter__(self) -> TTTextModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free_cache(self) -> None:
        if self.cache is not None:
            self.cache.free(self.kernels)
        self.cache = None

    def _require_cache(self) -> DeviceKVCache:
        if self.cache is None or not self.cache.layers:
            raise RuntimeError("call setup_cache(max_seq_len) before prefill/decode")
        return self.cache

    # ------------------------------------------------------------------ prefill, decode, verify
    def prefill_hidden(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """Final-normed hidden [L, H] bf16 (arguments as `TextModel.prefill_hidden`); fills the KV cache.
        `capture`: layer indices whose outputs [L, H] are left in `self.captured` (a DFlash draft's
        context)."""
        cache = self._require_cache()
        return self.prefiller.prefill_hidden(cache, inputs, position_ids, visual_pos_mask, deepstack, capture)

    def prefill(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """Prefill a prompt; float32 logits [V] of its last position (only that row's tile reaches the head).
        `capture` as in `prefill_hidden`."""
        return self.prefill_block(inputs, position_ids, visual_pos_mask, deepstack, capture)[0]

    def prefill_block(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
        drafted: torch.Tensor | Sequence[int] = (),
    ) -> torch.Tensor:
        """Prefill a prompt and the token ids `drafted` [n] after it as one prompt of L + n rows -> float32
        logits [n + 1, V] of its last n + 1 rows (`TextPrefill.prefill_block`, `TextModel.prefill_block`)."""
        cache = self._require_cache()
        prefiller = self.prefiller
        return prefiller.prefill_block(
            cache, inputs, position_ids, visual_pos_mask, deepstack, capture, drafted
        )

    def decode(self, tokens: int | torch.Tensor, traced: bool = True) -> torch.Tensor:
        """Append one token to each active row (`TextDecode.decode`): float32 logits [V] for an int (one
        active row), [B, V] for ids [B]."""
        return self.decoder.decode(self._require_cache(), tokens, traced)

    def verify(
        self, tokens: torch.Tensor, capture: Sequence[int] = (), traced: bool = True
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append T tokens to each active row in one forward (ids [B, T]) -> float32 logits [B, T, V], with
        `capture` also those layers' outputs [B, T, len(capture) x H] (`TextDecode.verify`)."""
        return self.decoder.verify(self._require_cache(), tokens, capture, traced)

    @property
    def max_verify_rows(self) -> int:
        """Rows x tokens of one `verify` (a speculative block is capped to fit)."""
        return self.decoder.max_verify_rows

    # ------------------------------------------------------------------ captured layers (a DFlash draft's)
    @property
    def captured_device(self) -> tuple[list[DeviceTensor], int]:
        """The last prefill's captured layer outputs on the device, each [1, 1, Lp, H_p] bf16 (zero columns
        past hidden), and the prompt length L (rows past it are padding): what a device draft reads in place."""
        return self.prefiller.captured_device

    @property
    def captured(self) -> list[torch.Tensor]:
        """The last prefill's captured layer outputs [L, H] bf16 on the host (the torch `TextModel`'s
        contract), downloaded on first read: a draft on the device reads `captured_device` instead, and the
        prompt's features (L x layers x H, 128 MB for 5 layers of 3136 x 4096) never cross to the host."""
        return self.prefiller.captured

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> bf16 embeddings [..., H] (host lookup)."""
        return self.head.embed(ids)
