"""Decode of the text backbone: up to 32 rows of one tile (each at its own cache index), every layer on L1.

Each layer (`alpamayo.tt.text.layer.DecoderLayer.decode`) runs on the residual stream width-sharded in L1;
then the final norm and the lm_head with the rows untilized. The step's persistent inputs
(`alpamayo.tt.text.decode_inputs.DecodeInputs`: embedding rows, cos, sin, positions; a verify block's page
tables and its block attention's positions) are rewritten in place before each run, so the step can be
captured as a trace (`alpamayo.tt.text.trace`) and replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from alpamayo.plan.device_spec import TILE
from alpamayo.plan.programs.text import check_decode_rows
from alpamayo.text.inputs import check_decode_room, check_token_ids
from alpamayo.text.rope import MRope
from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.text.cache import DeviceKVCache, RowState
from alpamayo.tt.text.decode_inputs import (
    MAX_ROWS,
    DecodeInputs,
    ProgramKey,
    block_chunks,
    head_select,
    kv_write_passes,
    program_rows,
)
from alpamayo.tt.text.decode_programs import DecodePrograms
from alpamayo.tt.text.head import TextHead
from alpamayo.tt.text.kernels import TextKernels
from alpamayo.tt.text.layer import DecoderLayer
from alpamayo.tt.text.trace import DecodeTrace, TraceSwitch


class TextDecode:
    """Runs decode and verify steps over the layers and a KV cache; owns the steps' persistent inputs (per
    program: `persistent`) and their captured traces (per program and captured layers: `traces`)."""

    max_verify_rows = MAX_ROWS  # rows x tokens of one `verify` (a speculative block is capped to fit)

    def __init__(
        self,
        kernels: TextKernels,
        programs: DecodePrograms,
        layers: list[DecoderLayer],
        head: TextHead,
        rope: MRope,
        rows: RowState,
    ):
        self.kernels, self.programs, self.layers, self.head = kernels, programs, layers, head
        self.rope, self.rows = rope, rows
        self.trace_switch = TraceSwitch(kernels.device)
        self.traces: dict[tuple[ProgramKey, tuple[int, ...]], DecodeTrace] = {}
        self.persistent: dict[ProgramKey, DecodeInputs[DeviceTensor]] = {}

    def graph(
        self, cache: DeviceKVCache, inputs: DecodeInputs[DeviceTensor], capture: Sequence[int] = ()
    ) -> Any:
        """Every layer, final norm and lm_head for the persistent `inputs` of B rows over `cache`; returns
        logits [1, 1, B, V_p] row-major bf16 in DRAM, with `capture` a list [logits, the outputs
        [1, 1, 32, H_p] of those layers in DRAM] (the last layer's normed, as transformers' last hidden
        state). Captured as a decode trace, so it only allocates, computes and frees."""
        kern, prog = self.kernels, self.programs
        ttnn = kern.ttnn
        rows, last = inputs.rows, len(self.layers) - 1
        taken: dict[int, DeviceTensor] = {}
        x, cos, sin = prog.sharded_inputs(inputs)
        for i, layer in enumerate(self.layers):
            x = layer.decode(x, cos, sin, cache.layers[i], inputs)
            if i in capture and i != last:
                taken[i] = ttnn.to_memory_config(x, ttnn.DRAM_MEMORY_CONFIG)
        kern.free(cos, sin)
        xn = prog.res_norm(x, self.head.norm_rm)
        kern.free(x)
        if last in capture:
            taken[last] = ttnn.to_memory_config(xn, ttnn.DRAM_MEMORY_CONFIG)
        xi = prog.reshard(xn, ttnn.L1_MEMORY_CONFIG)  # the 1D multicast head wants interleaved in0
        logits = self.head.logits(xi, rows - 1)
        kern.free(xi)
        return [logits, *(taken[i] for i in capture)] if capture else logits

    def host_inputs(
        self, tokens: Sequence[int], positions: Sequence[int], pages: Sequence[int] | None = None
    ) -> DecodeInputs[torch.Tensor]:
        """Host values of the persistent decode inputs: row b holds `tokens[b]` at cache index
        `positions[b]` (rope position `positions[b] + rope_delta`); `pages`: row b's cache slot (the page
        table of `DecoderLayer.decode` and its K/V write passes, `kv_write_passes`; None: row b in slot b),
        and where `block_sdpa_applies` the block attention's inputs per call of `block_chunks(pages)`."""
        t, rows = self.kernels.text_cfg, len(tokens)
        x = torch.zeros(1, 1, TILE, self.kernels.hidden_padded, dtype=torch.bfloat16)
        x[0, 0, :rows, : t.hidden_size] = self.head.embed_table[torch.tensor(tokens, dtype=torch.long)]
        pos = torch.tensor(positions, dtype=torch.int32)
        cos, sin = self.rope.cos_sin_1d(pos.long() + self.rows.rope_delta, torch.bfloat16)
        values = DecodeInputs(x, cos.view(1, rows, 1, -1), sin.view(1, rows, 1, -1), pos)
        if pages is not None:
            values.page = torch.tensor(pages, dtype=torch.int32).view(rows, 1)
            values.kv_write = [
                torch.tensor(idxs, dtype=torch.int32) for idxs in kv_write_passes(pages, positions)
            ]
            if self.programs.block_sdpa:
                n_kv = t.num_key_value_heads
                for first, n in block_chunks(pages):
                    values.kv_pos.append(pos[first : first + n].repeat(n_kv))
                    values.kv_page.append(
                        (pages[first] * n_kv + torch.arange(n_kv, dtype=torch.int32)).view(n_kv, 1)
                    )
                if n_kv > 1:
                    values.head_select = head_select(t.num_attention_heads, n_kv, t.head_dim)
        return values

    def write_inputs(self, values: DecodeInputs[torch.Tensor]) -> DecodeInputs[DeviceTensor]:
        """Rewrite the persistent decode inputs of this program in place (allocated on first use, never
        reallocated: a trace captured over them stays valid)."""
        kern = self.kernels
        ttnn = kern.ttnn
        key = values.key()
        with kern.tracer.span("tt.host_to_device"):
            hosts = values.map(
                lambda v: ttnn.from_torch(
                    v,
                    dtype=ttnn.int32 if v.dtype == torch.int32 else ttnn.bfloat16,
                    layout=ttnn.ROW_MAJOR_LAYOUT if v.dtype == torch.int32 else ttnn.TILE_LAYOUT,
                )
            )
            if key not in self.persistent:
                self.persistent[key] = hosts.map(
                    lambda h: ttnn.allocate_tensor_on_device(
                        h.shape, h.dtype, h.layout, kern.device, ttnn.DRAM_MEMORY_CONFIG
                    )
                )
            inputs = self.persistent[key]
            for h, d in zip(hosts.tensors(), inputs.tensors(), strict=True):
                ttnn.copy_host_to_device_tensor(h, d)
        return inputs

    def check_rows(self, cache: DeviceKVCache, ids: torch.Tensor, positions: Sequence[int]) -> None:
        """Refuses, before any device call, what the decode program cannot run."""
        rows = len(positions)
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"the ttnn decode program runs 1..{MAX_ROWS} rows (one tile), got {rows}")
        check_decode_rows(rows, any(layer.moe is not None for layer in self.layers))
        check_decode_room(max(positions), cache.max_seq_len)
        check_token_ids(ids, self.kernels.text_cfg.vocab_size)

    def run_rows(
        self,
        cache: DeviceKVCache,
        tokens: Sequence[int],
        positions: Sequence[int],
        pages: Sequence[int] | None,
        traced: bool,
        capture: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the decode program of len(tokens) rows (`pages`: each row's cache slot, None: row b in slot
        b) -> (float32 logits [B, V], the `capture` layers' outputs concatenated [B, len(capture) x H] bf16,
        or None). Traced: the first call per (`DecodeInputs.key`, capture) compiles the program, captures it
        and returns the compile run's results (the capture rewrites the same K/V rows: idempotent); later
        calls replay it (the page tables and the block attention's positions are persistent inputs, rewritten
        like the others)."""
        kern = self.kernels
        traced = self.trace_switch.traced(traced)
        capture = tuple(capture)
        values = self.host_inputs(tokens, positions, pages)
        inputs = self.write_inputs(values)
        key = (values.key(), capture)
        trace = self.traces.get(key)
        rows = len(tokens)
        if not traced:
            with kern.tracer.span("tt.decode_untraced", rows=rows):
                out = self.graph(cache, inputs, capture)
            result = self.results(out, rows, capture)
            kern.free(*(out if capture else [out]))
        elif trace is None:
            with kern.tracer.span("tt.decode_compile_and_capture", rows=rows):
                out = self.graph(cache, inputs, capture)
                result = self.results(out, rows, capture)
                kern.free(*(out if capture else [out]))
                trace = self.traces[key] = DecodeTrace(kern.ttnn, kern.device)
                trace.capture(lambda: self.graph(cache, inputs, capture))
        else:
            with kern.tracer.span("tt.decode_trace_execute", rows=rows):
                out = trace.replay()
            result = self.results(out, rows, capture)
        return result

    def results(
        self, out: Any, rows: int, capture: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [rows, V] float32, captured layer outputs [rows, len(capture) x H] bf16 or None)."""
        logits = self.kernels.download(out[0] if capture else out).reshape(rows, -1)
        logits = logits[:, : self.kernels.text_cfg.vocab_size].float()
        if not capture:
            return logits, None
        h = self.kernels.text_cfg.hidden_size
        feats = [self.kernels.download(t)[0, 0, :rows, :h] for t in out[1:]]
        return logits, torch.cat(feats, dim=-1)

    def decode(self, cache: DeviceKVCache, tokens: int | torch.Tensor, traced: bool = True) -> torch.Tensor:
        """Append one token to each active row, row b at its own cache index `lengths[b]`: float32 logits
        [V] for an int (one active row), [B, V] for ids [B] (the torch backend's contract). The B rows run
        as one program (rows of one tile: the weights are read once for all of them)."""
        single = isinstance(tokens, int)
        ids = torch.tensor([tokens]) if isinstance(tokens, int) else tokens.reshape(-1)
        if ids.numel() != len(self.rows.lengths):
            raise ValueError(f"decode got {ids.numel()} token(s) for {len(self.rows.lengths)} active row(s)")
        positions = list(self.rows.lengths)
        self.check_rows(cache, ids, positions)
        # paged_update_cache wants a row per cache slot ("Expect batch in input tensor match the batch in cache
        # tensor"): idle slots get token 0 at their position 0, unread until a fork rewrites them
        idle = cache.max_batch - len(positions)
        logits, _ = self.run_rows(cache, ids.tolist() + [0] * idle, positions + [0] * idle, None, traced)
        self.rows.lengths = [n + 1 for n in positions]
        return logits[0] if single else logits[: len(positions)]

    def verify(
        self, cache: DeviceKVCache, tokens: torch.Tensor, capture: Sequence[int] = (), traced: bool = True
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append T tokens to each active row in one forward, causal among them (ids [B, T]) -> float32
        logits [B, T, V]: logits[b, j] follow tokens[b, :j + 1]; with `capture` (layer indices) also the
        concatenated outputs of those layers [B, T, len(capture) x H] bf16 (a DFlash draft's context
        features; the last layer's normed), as the torch `TextModel.verify`. Row b's T tokens run as T
        consecutive rows of the decode program on row b's cache slot (`DecoderLayer.decode`'s page table), token j
        at cache index lengths[b] + j (ragged rows allowed), so B x T <= 32 rows read the weights once
        (`max_verify_rows`). T = 1 runs the rows on their own slots, as `decode`."""
        ids, batch = torch.as_tensor(tokens), len(self.rows.lengths)
        if ids.dim() != 2 or ids.shape[0] != batch or ids.shape[1] < 1:
            raise ValueError(f"verify takes ids [{batch}, T >= 1], got shape {list(ids.shape)}")
        length = ids.shape[1]
        if batch * length > self.max_verify_rows:
            raise ValueError(
                f"verify of {batch} row(s) x {length} tokens = {batch * length} program rows: the "
                f"ttnn decode program runs 1..{self.max_verify_rows} (one tile); allowed: T <= "
                f"{self.max_verify_rows // batch} for {batch} row(s)"
            )
        if length == 1:
            positions = list(self.rows.lengths)
            self.check_rows(cache, ids, positions)
            idle = cache.max_batch - len(positions)
            run_tokens, run_positions, pages = ids[:, 0].tolist() + [0] * idle, positions + [0] * idle, None
        else:
            # row-major: (row b, token j) is program row b * T + j
            run_positions = [n + j for n in self.rows.lengths for j in range(length)]
            self.check_rows(cache, ids.reshape(-1), run_positions)
            run_tokens = ids.reshape(-1).tolist()
            pages = [b for b in range(batch) for _ in range(length)]
            # padding rows repeat the last real row: the same K/V written to the same place, logits unread
            pad = program_rows(len(run_tokens)) - len(run_tokens)
            run_tokens, run_positions = (
                run_tokens + run_tokens[-1:] * pad,
                run_positions + run_positions[-1:] * pad,
            )
            pages += pages[-1:] * pad
        logits, feats = self.run_rows(cache, run_tokens, run_positions, pages, traced, capture)
        rows = batch * length
        self.rows.lengths = [n + length for n in self.rows.lengths]
        logits = logits[:rows].reshape(batch, length, -1)
        if feats is None:
            return logits
        return logits, feats[:rows].reshape(batch, length, -1)

    def release_traces(self) -> None:
        """Release every captured trace (they are bound to the KV cache's buffers)."""
        for trace in self.traces.values():
            trace.release()
        self.traces = {}

    def close(self) -> None:
        """Release the traces and free the persistent inputs."""
        self.release_traces()
        for inputs in self.persistent.values():
            self.kernels.free(*inputs.tensors())
        self.persistent = {}
