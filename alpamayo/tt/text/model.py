"""The Qwen3-VL text backbone on one Blackhole p150: construction, KV cache and generation state.

`TTTextModel` composes the prefill (`alpamayo.tt.text.prefill`) and the decode step
(`alpamayo.tt.text.decode`, captured as a trace by `alpamayo.tt.text.trace`) over the weights that
`alpamayo.tt.text.upload` puts on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
from alpamayo.plan.weights import residual_norm_eps
from alpamayo.profiling import Tracer
from alpamayo.text.inputs import check_token_ids
from alpamayo.text.rope import MRope
from alpamayo.text.weights import EMBED, validate_text_tensors
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device import close_device, device_unavailable_reason, open_device, ttnn_for
from alpamayo.tt.moe import TTMoE
from alpamayo.tt.text.decode import MAX_ROWS, ProgramKey, TextDecode, program_rows
from alpamayo.tt.text.prefill import TextPrefill
from alpamayo.tt.text.trace import DecodeTrace, TraceSwitch
from alpamayo.tt.text.upload import layer_weights, upload_text_weights


@dataclass
class DeviceKVCache:
    """The device KV cache: per layer (K, V), each [max_batch, n_kv, rows, head_dim] (slot b: row b's
    sequence) in the recipe's kv_cache dtype (rows: `TextPlan.cache_length(max_seq_len + reserve_rows)`, see `setup_cache`)."""

    layers: list[tuple[Any, Any]]
    max_seq_len: int
    max_batch: int = 1


class TTTextModel(TextPrefill, TextDecode):
    """Device weights, KV cache and generation state of one text decoder on one Blackhole chip."""

    def __init__(
        self,
        cfg: ModelConfig,
        precision: Precision,
        plan: TextPlan,
        device: Any,
        weights: dict[str, Any],
        embed: torch.Tensor,
        tracer: Tracer | None = None,
        owns_device: bool = False,
    ):
        self.ttnn = ttnn = ttnn_for(device)
        self.cfg, self.text_cfg, self.precision, self.plan = cfg, cfg.text, precision, plan
        self.device, self.weights, self.owns_device = device, weights, owns_device
        self.layer_weights = [layer_weights(weights, i) for i in range(cfg.text.num_hidden_layers)]
        self.embed_table = embed  # [V, H] bf16, host
        self.moe: dict[int, TTMoE] = {}
        self.tracer = tracer or Tracer(enabled=False)
        self.rope = MRope(cfg.text)
        self.cache: DeviceKVCache | None = None
        self.lengths, self.rope_delta = [0], 0  # positions filled per active row (cache slot b: row b)
        # prefill(capture=...)'s layer outputs on the device [1, 1, Lp, H_p] and the prompt length; their host
        # view [L, H] is downloaded when `captured` is first read
        self._captured: tuple[list[Any], int] = ([], 0)
        self._captured_host: list[torch.Tensor] | None = None
        # cache rows kept behind max_seq_len by default: the action expert's K/V region (see setup_cache)
        self.reserved_rows = 0
        # (program_key, capture) -> trace; program_key -> persistent inputs (alpamayo.tt.text.decode)
        self._traces: dict[tuple[ProgramKey, tuple[int, ...]], DecodeTrace] = {}
        self._inputs: dict[ProgramKey, dict[str, Any]] = {}
        self.trace_switch = TraceSwitch(device)
        t = cfg.text
        self.scale = t.head_dim**-0.5
        self.hidden_padded = plan.hidden_padded
        self.residual_eps = residual_norm_eps(t, plan.device.dram_banks)
        matmuls = ("qkv", "o", "mlp_gate_up", "mlp_down", "experts", "router", "lm_head", "expert")
        ck = {op: cfgs.compute_config(ttnn, precision.math_fidelity(op)) for op in matmuls}
        ck["norm"] = cfgs.compute_config(ttnn, precision.math_fidelity("norm"), l1_acc=False)
        # fp32 accumulation in prefill SDPA overflows L1 at ~4.6K rows (seed design, measured); decode keeps it.
        ck["sdpa_prefill"] = cfgs.compute_config(
            ttnn, precision.math_fidelity("sdpa"), fp32_acc=False, l1_acc=False
        )
        ck["sdpa_decode"] = cfgs.compute_config(ttnn, precision.math_fidelity("sdpa"), l1_acc=False)
        self.ck = ck
        self.kv_dtype = cfgs.ttnn_dtype(ttnn, precision.dtype("kv_cache"))
        if (moe := plan.moe) is not None:  # None for a dense model, which has no sparse layers
            self.moe = {
                i: TTMoE(ttnn, device, moe, self.layer_weights[i], ck, self.tracer) for i in t.sparse_layers
            }
        self._decode_setup()

    @property
    def tracer(self) -> Tracer:
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        """Stages of this model and of its MoE blocks go to `tracer`."""
        self._tracer = tracer
        for block in self.moe.values():
            block.tracer = tracer

    def trace_into(self, tracer: Tracer) -> None:
        """Time the device work (`tt.prefill_layers`, `tt.decode_trace_execute`, host <-> device copies) as
        spans of `tracer`."""
        self.tracer = tracer

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
        self._release_trace()
        self._free_cache()
        ttnn, t = self.ttnn, self.text_cfg
        shape = (
            max_batch,
            t.num_key_value_heads,
            self.plan.cache_length(max_seq_len + reserve_rows),
            t.head_dim,
        )
        layers = [
            tuple(
                ttnn.zeros(
                    shape,
                    dtype=self.kv_dtype,
                    layout=ttnn.TILE_LAYOUT,
                    device=self.device,
                    memory_config=ttnn.DRAM_MEMORY_CONFIG,
                )
                for _ in range(2)
            )
            for _ in range(t.num_hidden_layers)
        ]
        self.cache = DeviceKVCache(layers, max_seq_len, max_batch)
        self.reset()

    @property
    def kv_cache(self) -> list[tuple[Any, Any]]:
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
    def cache_len(self) -> int:
        """Positions filled in the longest active row (all rows, unless a speculative block left them
        ragged)."""
        return max(self.lengths)

    @cache_len.setter
    def cache_len(self, length: int) -> None:
        self.lengths = [length] * len(self.lengths)

    @property
    def batch(self) -> int:
        """Active rows (cache slots 0..batch-1)."""
        return len(self.lengths)

    def reset(self) -> None:
        """Forget the prompt (the cache buffers stay allocated)."""
        self.lengths, self.rope_delta = [0], 0

    def fork(self, n: int) -> None:
        """Continue the prefilled prompt as `n` independent rows: slot 0's K/V rows are copied on the device
        into slots 1..n-1 (through `_fill_cache`, the prefill's own K/V write)."""
        self._require_cache()
        assert self.cache is not None
        if not 1 <= n <= self.cache.max_batch:
            raise ValueError(f"fork({n}): the cache was set up for 1..{self.cache.max_batch} rows")
        if self.batch != 1 or self.lengths[0] == 0:
            raise RuntimeError("fork() needs a prefilled prompt in one row")
        length = self.lengths[0]
        if n > 1:
            ttnn, t = self.ttnn, self.text_cfg
            padded = self.plan.padded_length(length)  # what the prefill wrote: whole 128-row blocks
            with self.tracer.span("tt.fork", rows=n, positions=length):
                for layer in self.kv_cache:
                    for cache in layer:
                        rows = ttnn.slice(cache, [0, 0, 0, 0], [1, t.num_key_value_heads, padded, t.head_dim])
                        for slot in range(1, n):
                            self._fill_cache(cache, rows, padded, batch=slot)
                        self._free(rows)
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
        """Release the decode trace, the KV cache, the weights and (when this model opened it) the device. The
        weights are freed even then: on a device shared with other models they would otherwise stay in DRAM."""
        self._release_trace()
        self._free_cache()
        self._keep_captured([], 0)
        for inputs in self._inputs.values():
            self._free(*inputs.values())
        self._inputs = {}
        self._free(*self.weights.values())
        self.weights, self.layer_weights, self.moe = {}, [], {}
        if self.owns_device and self.device is not None:
            close_device(self.device)
        self.device = None

    def __enter__(self) -> TTTextModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free_cache(self) -> None:
        for k, v in self.kv_cache:
            self._free(k, v)
        self.cache = None

    def _release_trace(self) -> None:
        for trace in self._traces.values():
            trace.release()
        self._traces = {}

    def _require_cache(self) -> None:
        if not self.kv_cache:
            raise RuntimeError("call setup_cache(max_seq_len) before prefill/decode")

    # ------------------------------------------------------------------ captured layers (a DFlash draft's)
    def _keep_captured(self, tensors: list[Any], length: int) -> None:
        """The prefill's captured layer outputs (device [1, 1, Lp, H_p], rows [0, length) real) replace the
        previous prompt's, which are freed."""
        self._free(*self._captured[0])
        self._captured, self._captured_host = (tensors, length), None

    @property
    def captured_device(self) -> tuple[list[Any], int]:
        """The last prefill's captured layer outputs on the device, each [1, 1, Lp, H_p] bf16 (zero columns
        past hidden), and the prompt length L (rows past it are padding): what a device draft reads in place."""
        return self._captured

    @property
    def captured(self) -> list[torch.Tensor]:
        """The last prefill's captured layer outputs [L, H] bf16 on the host (the torch `TextModel`'s
        contract), downloaded on first read: a draft on the device reads `captured_device` instead, and the
        prompt's features (L x layers x H, 128 MB for 5 layers of 3136 x 4096) never cross to the host."""
        if self._captured_host is None:
            tensors, length = self._captured
            h = self.text_cfg.hidden_size
            self._captured_host = [self._download(t)[0, 0, :length, :h] for t in tensors]
        return self._captured_host

    # ------------------------------------------------------------------ host <-> device
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> bf16 embeddings [..., H] (host lookup)."""
        check_token_ids(ids, self.text_cfg.vocab_size)
        return self.embed_table[ids.long()]
