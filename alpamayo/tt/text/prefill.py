"""Prefill of the text backbone: the whole prompt in one pass (rows padded to a multiple of 128).

Each layer (`alpamayo.tt.text.layer.DecoderLayer.prefill`) runs `minimal_matmul` on 11x10 with the
DRAM-sharded weights, interleaved RMSNorm with TILE gammas, per-head q/k RMSNorm, HF rotary on host cos/sin,
K/V written to the cache, causal SDPA chunked by the padded length, SiLU fused into the gate * up multiply;
DeepStack level k is added after layer k, then the final norm and the lm_head on the last prompt row's tile
only (`prefill_block`: on the tiles of the last n + 1 rows, n tokens drafted after the prompt that the
prefill verifies; they cost no rows while they fit the padding, 128 more when they cross a multiple of 128,
and one more lm_head pass when they cross a tile). Pad rows continue the text positions after the prompt,
which causal attention keeps away from the real rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from alpamayo.plan.device_spec import TILE
from alpamayo.text.inputs import check_prefill, prompt_hidden, rope_delta, text_position_ids
from alpamayo.text.rope import MRope
from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.text.cache import DeviceKVCache, RowState
from alpamayo.tt.text.head import TextHead
from alpamayo.tt.text.kernels import TextKernels
from alpamayo.tt.text.layer import DecoderLayer


class TextPrefill:
    """Runs prompts through the layers into a KV cache; owns the layer outputs a prefill captured (a DFlash
    draft's context) until the next prefill."""

    def __init__(
        self, kernels: TextKernels, layers: list[DecoderLayer], head: TextHead, rope: MRope, rows: RowState
    ):
        self.kernels, self.layers, self.head, self.rope, self.rows = kernels, layers, head, rope, rows
        # the captured layer outputs on the device [1, 1, Lp, H_p] and the prompt length; their host view
        # [L, H] is downloaded when `captured` is first read
        self._captured: tuple[list[DeviceTensor], int] = ([], 0)
        self._captured_host: list[torch.Tensor] | None = None

    def rope_tables(self, position_ids: torch.Tensor, padded_len: int) -> tuple[DeviceTensor, DeviceTensor]:
        """cos/sin [1, 1, Lp, head_dim] on device; pad rows continue the text positions after the prompt."""
        length = position_ids.shape[1]
        pad = torch.arange(length, padded_len) + rope_delta(position_ids)
        rows = torch.cat([position_ids, pad.view(1, -1).expand(3, -1)], 1)
        cos, sin = self.rope.cos_sin(rows, torch.bfloat16)
        upload = self.kernels.upload
        return upload(cos.view(1, 1, padded_len, -1)), upload(sin.view(1, 1, padded_len, -1))

    def deepstack_rows(self, feats: torch.Tensor, mask: torch.Tensor, padded_len: int) -> DeviceTensor:
        """DeepStack level [n_visual, H] scattered into zero rows [1, 1, Lp, H_p] (exact) on device.

        Scattered straight into the padded host tensor: going through a dense [L, H] copy took 56 ms instead
        of 25 ms per level for a 3000-row prompt at hidden 4096 (CPU, 2 cores)."""
        kern = self.kernels
        x = torch.zeros(1, 1, padded_len, kern.hidden_padded, dtype=torch.bfloat16)
        x[0, 0, : mask.numel(), : kern.text_cfg.hidden_size][mask.cpu()] = feats.cpu().to(torch.bfloat16)
        return kern.upload(x)

    def run(
        self,
        cache: DeviceKVCache,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None,
        visual_pos_mask: torch.Tensor | None,
        deepstack: Sequence[torch.Tensor] | None,
        capture: Sequence[int] = (),
    ) -> tuple[DeviceTensor, int]:
        """Fresh prompt through every layer and the final norm into `cache` (slot 0; the rows become that one
        prompt); returns (normed hidden [1,1,Lp,H_p], L). The outputs of the layers in `capture` (after their
        DeepStack level; the last layer's normed: transformers' `hidden_states[i + 1]`) stay on the device,
        in that order (`captured_device`; `captured` downloads them when read)."""
        kern = self.kernels
        ttnn, t = kern.ttnn, kern.text_cfg
        with kern.tracer.span("tt.prefill_setup"):
            h = prompt_hidden(t, inputs, self.head.embed)
            length = h.shape[0]
            position_ids = check_prefill(
                t, length, cache.max_seq_len, position_ids, visual_pos_mask, deepstack
            )
            self.rows.reset()
            padded = kern.plan.padded_length(length)
            hidden = kern.upload_rows(h, padded, kern.hidden_padded)
            cos, sin = self.rope_tables(position_ids, padded)
        last = t.num_hidden_layers - 1
        taken: dict[int, DeviceTensor] = {}
        with kern.tracer.span("tt.prefill_layers", layers=last + 1, rows=padded):
            for i, layer in enumerate(self.layers):
                hidden = layer.prefill(hidden, cos, sin, cache.layers[i], length)
                if deepstack is not None and visual_pos_mask is not None and i < len(deepstack):
                    extra = self.deepstack_rows(deepstack[i], visual_pos_mask, padded)
                    added = ttnn.add(hidden, extra, memory_config=ttnn.DRAM_MEMORY_CONFIG)
                    kern.free(hidden, extra)
                    hidden = added
                if i in capture and i != last:
                    taken[i] = ttnn.clone(hidden, memory_config=ttnn.DRAM_MEMORY_CONFIG)
            kern.free(cos, sin)
            normed = kern.rms(hidden, self.head.norm_tile, kern.residual_eps)
            kern.free(hidden)
            if last in capture:
                taken[last] = ttnn.clone(normed, memory_config=ttnn.DRAM_MEMORY_CONFIG)
            ttnn.synchronize_device(kern.device)
        self.keep_captured([taken[i] for i in capture], length)
        self.rows.lengths, self.rows.rope_delta = [length], rope_delta(position_ids)
        return normed, length

    def prefill_hidden(
        self,
        cache: DeviceKVCache,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """Final-normed hidden [L, H] bf16 (as `TextModel.prefill_hidden`); fills `cache`."""
        kern = self.kernels
        normed, length = self.run(cache, inputs, position_ids, visual_pos_mask, deepstack, capture)
        out = kern.download(normed)[0, 0, :length, : kern.text_cfg.hidden_size]
        kern.free(normed)
        return out

    def prefill_block(
        self,
        cache: DeviceKVCache,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
        drafted: torch.Tensor | Sequence[int] = (),
    ) -> torch.Tensor:
        """Prefill a prompt and the token ids `drafted` [n] after it as one prompt of L + n rows (causal
        attention scores the drafted rows as a verify would; they sit at the positions decode steps would give
        them) -> float32 logits [n + 1, V] of its last n + 1 rows (`TextModel.prefill_block`); only the tiles
        holding those rows reach the head. `captured` holds the L + n rows."""
        kern = self.kernels
        ttnn = kern.ttnn
        ids = torch.as_tensor(drafted, dtype=torch.long).reshape(-1)
        n = ids.numel()
        if n:
            inputs, position_ids, visual_pos_mask = self.with_drafted(
                inputs, position_ids, visual_pos_mask, ids
            )
        normed, length = self.run(cache, inputs, position_ids, visual_pos_mask, deepstack, capture)
        first, rows = length - 1 - n, []
        with kern.tracer.span("tt.prefill_head", rows=n + 1):
            for r0 in range(first // TILE * TILE, length, TILE):
                tile = ttnn.slice(normed, [0, 0, r0, 0], [1, 1, r0 + TILE, kern.hidden_padded])
                tile_l1 = ttnn.to_memory_config(tile, ttnn.L1_MEMORY_CONFIG)
                kern.free(tile)
                end = min(length, r0 + TILE)
                logits = self.head.logits(tile_l1, end - 1 - r0)
                kern.free(tile_l1)
                rows.append(kern.download(logits)[0, 0, max(first, r0) - r0 : end - r0].float())
                kern.free(logits)
            kern.free(normed)
        return torch.cat(rows)[:, : kern.text_cfg.vocab_size]

    def with_drafted(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None,
        visual_pos_mask: torch.Tensor | None,
        ids: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The prompt's inputs (ids [L] or embeddings [L, H]), M-RoPE ids [3, L] (None: text positions) and
        image-row mask with the drafted ids [n] appended as text rows at rope positions L + j + rope_delta."""
        length, n = inputs.shape[0], ids.numel()
        if position_ids is None:
            position_ids = text_position_ids(length)
        extra = self.head.embed(ids).to(inputs.dtype) if inputs.dim() == 2 else ids.to(inputs.device)
        steps = torch.arange(length, length + n) + rope_delta(position_ids)
        positions = torch.cat([position_ids, steps.expand(3, -1)], 1)
        mask = None if visual_pos_mask is None else torch.cat([visual_pos_mask, visual_pos_mask.new_zeros(n)])
        return torch.cat([inputs, extra.to(inputs.device)]), positions, mask

    # ------------------------------------------------------------------ captured layers (a DFlash draft's)
    def keep_captured(self, tensors: list[DeviceTensor], length: int) -> None:
        """The prefill's captured layer outputs (device [1, 1, Lp, H_p], rows [0, length) real) replace the
        previous prompt's, which are freed."""
        self.kernels.free(*self._captured[0])
        self._captured, self._captured_host = (tensors, length), None

    @property
    def captured_device(self) -> tuple[list[DeviceTensor], int]:
        """The last prefill's captured layer outputs on the device, each [1, 1, Lp, H_p] bf16 (zero columns
        past hidden), and the prompt length L (rows past it are padding)."""
        return self._captured

    @property
    def captured(self) -> list[torch.Tensor]:
        """The last prefill's captured layer outputs [L, H] bf16 on the host, downloaded on first read."""
        if self._captured_host is None:
            tensors, length = self._captured
            h = self.kernels.text_cfg.hidden_size
            self._captured_host = [self.kernels.download(t)[0, 0, :length, :h] for t in tensors]
        return self._captured_host
