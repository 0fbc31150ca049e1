"""Prefill of the text backbone: the whole prompt in one pass (rows padded to a multiple of 128).

`minimal_matmul` on 11x10 with the DRAM-sharded weights, interleaved RMSNorm with TILE gammas, per-head q/k
RMSNorm, HF rotary on host cos/sin, K/V written to the cache from a height-sharded copy (`fill_cache`
mis-addresses interleaved multi-head inputs), causal SDPA chunked by the padded length, SiLU fused into the
gate * up multiply, DeepStack level k added after layer k, final norm and the lm_head on the last prompt row's
tile only (`prefill_block`: on the tiles of the last n + 1 rows, n tokens drafted after the prompt that the
prefill verifies; they cost no rows while they fit the padding, 128 more when they cross a multiple of 128,
and one more lm_head pass when they cross a tile). Pad rows continue the text positions after the prompt,
which causal attention keeps away from the real rows. `block_prefill` is shared with the action expert's layers (`alpamayo.tt.expert`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from alpamayo.config.model import TextConfig
from alpamayo.plan.device_spec import TILE
from alpamayo.plan.weights import TEXT_GROUPS, LayerGroups
from alpamayo.text.inputs import check_prefill, prompt_hidden, rope_delta, text_position_ids
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.text.state import TextState


class TextPrefill(TextState):
    """Prefill half of `TTTextModel` (a mixin: the attributes below and `TextState`'s are the model's)."""

    _keep_captured: Callable[[list[Any], int], None]
    embed: Callable[[torch.Tensor], torch.Tensor]
    reset: Callable[[], None]

    def _mm(self, x: Any, w: Any, op: str) -> Any:
        """Prefill matmul [1, 1, M, K] x [K, N] -> bf16 DRAM interleaved."""
        m, k, n = x.shape[-2], x.shape[-1], w.shape[-1]
        mm = cfgs.prefill_matmul(self.ttnn, self.plan.prefill_matmul(m, k, n))
        return self.ttnn.experimental.minimal_matmul(
            x,
            w,
            compute_kernel_config=self.ck[op],
            config=mm,
            dtype=self.ttnn.bfloat16,
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def _rms(self, x: Any, gamma: Any, eps: float) -> Any:
        return self.ttnn.rms_norm(
            x,
            epsilon=eps,
            weight=gamma,
            compute_kernel_config=self.ck["norm"],
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def _fill_cache(self, cache: Any, x: Any, padded_len: int, start: int = 0, batch: int = 0) -> None:
        """cache[batch, :, start:start+Lp] = x ([1, n_kv, Lp, head_dim]) through a height-sharded copy of x;
        `start` is tile-aligned."""
        ttnn, t = self.ttnn, self.text_cfg
        cast = x.dtype != cache.dtype
        src = ttnn.typecast(x, cache.dtype) if cast else x  # fill_cache copies raw tiles: dtypes must match
        grid = self.plan.kv_fill_grid(padded_len)
        rows = t.num_key_value_heads * padded_len // grid.cores
        xs = ttnn.interleaved_to_sharded(src, cfgs.height_sharded(ttnn, rows, t.head_dim, grid))
        ttnn.fill_cache(cache, xs, batch, update_idx=start)
        self._free(xs, *([src] if cast else []))

    def _layer_prefill(self, i: int, h: Any, cos: Any, sin: Any, length: int) -> Any:
        """One decoder layer on h [1, 1, Lp, H_p] (freed; `length` prompt rows, the rest padding); fills K/V
        rows [0, Lp) of layer i and attends causally."""
        ttnn = self.ttnn
        padded_len = h.shape[-2]

        def attend(q: Any, k: Any, v: Any) -> Any:
            cache_k, cache_v = self.kv_cache[i]
            self._fill_cache(cache_k, k, padded_len)
            self._fill_cache(cache_v, v, padded_len)
            chunk = self.plan.prefill_sdpa_chunk(padded_len)
            return ttnn.transformer.scaled_dot_product_attention(
                q,
                k,
                v,
                is_causal=True,
                scale=self.scale,
                program_config=cfgs.sdpa(ttnn, self.plan.prefill_grid, chunk, chunk),
                compute_kernel_config=self.ck["sdpa_prefill"],
            )

        mlp = (lambda n2: self.moe[i].prefill(n2, length)) if i in self.moe else None
        return self.block_prefill(self.text_cfg, self.layer_weights[i], h, cos, sin, attend, mlp)

    def block_prefill(
        self,
        t: TextConfig,
        w: dict[str, Any],
        h: Any,
        cos: Any,
        sin: Any,
        attend: Callable[[Any, Any, Any], Any],
        mlp: Callable[[Any], Any] | None = None,
        ops: LayerGroups = TEXT_GROUPS,
        residual_eps: float | None = None,
    ) -> Any:
        """One pre-norm decoder block of dimensions `t` with weights `w` (`decoder_layer_specs` names) on all
        rows of h [1, 1, Lp, H_p] (freed) at rotary cos/sin [1, 1, Lp, head_dim]; the text layers and the
        action expert's share it. attend(q, k, v): the attention of the normed, rotated heads q
        [1, nh, Lp, hd], k and v [1, nkv, Lp, hd] -> [1, nh, Lp, hd]; mlp(n2): the block's MLP of the normed
        residual (default: the dense SwiGLU); `ops` names the matmuls' op groups (math fidelity)."""
        ttnn = self.ttnn
        eps = self.residual_eps if residual_eps is None else residual_eps
        n1 = self._rms(h, w["attn_norm.tile"], eps)
        qkv = self._mm(n1, w["wqkv"], ops.qkv)
        self._free(n1)
        q, k, v = ttnn.experimental.nlp_create_qkv_heads(
            qkv,
            num_heads=t.num_attention_heads,
            num_kv_heads=t.num_key_value_heads,
            transpose_k_heads=False,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        self._free(qkv)
        qn, kn = self._rms(q, w["q_norm.rm"], t.rms_norm_eps), self._rms(k, w["k_norm.rm"], t.rms_norm_eps)
        self._free(q, k)
        q = ttnn.experimental.rotary_embedding_hf(qn, cos, sin, is_decode_mode=False)
        k = ttnn.experimental.rotary_embedding_hf(kn, cos, sin, is_decode_mode=False)
        self._free(qn, kn)
        a = attend(q, k, v)
        self._free(q, k, v)
        ac = ttnn.experimental.nlp_concat_heads(a, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self._free(a)
        o = self._mm(ac, w["wo"], ops.o)
        self._free(ac)
        h2 = ttnn.add(h, o, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self._free(h, o)
        n2 = self._rms(h2, w["mlp_norm.tile"], eps)
        d = mlp(n2) if mlp is not None else self._mlp_prefill(w, n2, ops)
        self._free(n2)
        out = ttnn.add(h2, d, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self._free(h2, d)
        return out

    def _mlp_prefill(self, w: dict[str, Any], n2: Any, ops: LayerGroups = TEXT_GROUPS) -> Any:
        """Dense SwiGLU of n2 [1, 1, Lp, H_p] -> [1, 1, Lp, H_p] DRAM (n2 kept)."""
        ttnn = self.ttnn
        g, u = self._mm(n2, w["w_gate"], ops.gate_up), self._mm(n2, w["w_up"], ops.gate_up)
        m = ttnn.mul(
            g, u, input_tensor_a_activations=[ttnn.UnaryOpType.SILU], memory_config=ttnn.DRAM_MEMORY_CONFIG
        )
        self._free(g, u)
        d = self._mm(m, w["w_down"], ops.down)
        self._free(m)
        return d

    def _prefill_rope(self, position_ids: torch.Tensor, padded_len: int) -> tuple[Any, Any]:
        """cos/sin [1, 1, Lp, head_dim] on device; pad rows continue the text positions after the prompt."""
        length = position_ids.shape[1]
        pad = torch.arange(length, padded_len) + rope_delta(position_ids)
        rows = torch.cat([position_ids, pad.view(1, -1).expand(3, -1)], 1)
        cos, sin = self.rope.cos_sin(rows, torch.bfloat16)
        return self._upload(cos.view(1, 1, padded_len, -1)), self._upload(sin.view(1, 1, padded_len, -1))

    def _deepstack_rows(self, feats: torch.Tensor, mask: torch.Tensor, padded_len: int) -> Any:
        """DeepStack level [n_visual, H] scattered into zero rows [1, 1, Lp, H_p] (exact) on device.

        Scattered straight into the padded host tensor: going through a dense [L, H] copy took 56 ms instead
        of 25 ms per level for a 3000-row prompt at hidden 4096 (CPU, 2 cores)."""
        x = torch.zeros(1, 1, padded_len, self.hidden_padded, dtype=torch.bfloat16)
        x[0, 0, : mask.numel(), : self.text_cfg.hidden_size][mask.cpu()] = feats.cpu().to(torch.bfloat16)
        return self._upload(x)

    def _prefill_device(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None,
        visual_pos_mask: torch.Tensor | None,
        deepstack: Sequence[torch.Tensor] | None,
        capture: Sequence[int] = (),
    ) -> tuple[Any, int]:
        """Fresh prompt through every layer and the final norm; returns (normed hidden [1,1,Lp,H_p], L).
        The outputs of the layers in `capture` (after their DeepStack level; the last layer's normed:
        transformers' `hidden_states[i + 1]`) stay on the device, in that order (`captured_device`;
        `captured` downloads them when read)."""
        self._require_cache()
        ttnn = self.ttnn
        with self.tracer.span("tt.prefill_setup"):
            h = prompt_hidden(self.text_cfg, inputs, self.embed)
            length = h.shape[0]
            position_ids = check_prefill(
                self.text_cfg, length, self.max_seq_len, position_ids, visual_pos_mask, deepstack
            )
            self.reset()
            padded = self.plan.padded_length(length)
            hidden = self._rows(h, padded, self.hidden_padded)
            cos, sin = self._prefill_rope(position_ids, padded)
        last = self.text_cfg.num_hidden_layers - 1
        taken: dict[int, torch.Tensor] = {}
        with self.tracer.span("tt.prefill_layers", layers=last + 1, rows=padded):
            for i in range(last + 1):
                hidden = self._layer_prefill(i, hidden, cos, sin, length)
                if deepstack is not None and visual_pos_mask is not None and i < len(deepstack):
                    extra = self._deepstack_rows(deepstack[i], visual_pos_mask, padded)
                    added = ttnn.add(hidden, extra, memory_config=ttnn.DRAM_MEMORY_CONFIG)
                    self._free(hidden, extra)
                    hidden = added
                if i in capture and i != last:
                    taken[i] = ttnn.clone(hidden, memory_config=ttnn.DRAM_MEMORY_CONFIG)
            self._free(cos, sin)
            normed = self._rms(hidden, self.weights["norm.tile"], self.residual_eps)
            self._free(hidden)
            if last in capture:
                taken[last] = ttnn.clone(normed, memory_config=ttnn.DRAM_MEMORY_CONFIG)
            ttnn.synchronize_device(self.device)
        self._keep_captured([taken[i] for i in capture], length)
        self.cache_len, self.rope_delta = length, rope_delta(position_ids)
        return normed, length

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
        normed, length = self._prefill_device(inputs, position_ids, visual_pos_mask, deepstack, capture)
        out = self._download(normed)[0, 0, :length, : self.text_cfg.hidden_size]
        self._free(normed)
        return out

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
        """Prefill a prompt and the token ids `drafted` [n] after it as one prompt of L + n rows (causal
        attention scores the drafted rows as a verify would; they sit at the positions decode steps would give
        them) -> float32 logits [n + 1, V] of its last n + 1 rows (`TextModel.prefill_block`); only the tiles
        holding those rows reach the head. `captured` holds the L + n rows."""
        ttnn = self.ttnn
        ids = torch.as_tensor(drafted, dtype=torch.long).reshape(-1)
        n = ids.numel()
        if n:
            inputs, position_ids, visual_pos_mask = self._with_drafted(
                inputs, position_ids, visual_pos_mask, ids
            )
        normed, length = self._prefill_device(inputs, position_ids, visual_pos_mask, deepstack, capture)
        first, rows = length - 1 - n, []
        with self.tracer.span("tt.prefill_head", rows=n + 1):
            for r0 in range(first // TILE * TILE, length, TILE):
                tile = ttnn.slice(normed, [0, 0, r0, 0], [1, 1, r0 + TILE, self.hidden_padded])
                tile_l1 = ttnn.to_memory_config(tile, ttnn.L1_MEMORY_CONFIG)
                self._free(tile)
                end = min(length, r0 + TILE)
                logits = self._head(tile_l1, end - 1 - r0)
                self._free(tile_l1)
                rows.append(self._download(logits)[0, 0, max(first, r0) - r0 : end - r0].float())
                self._free(logits)
            self._free(normed)
        return torch.cat(rows)[:, : self.text_cfg.vocab_size]

    def _with_drafted(
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
        extra = self.embed(ids).to(inputs.dtype) if inputs.dim() == 2 else ids.to(inputs.device)
        steps = torch.arange(length, length + n) + rope_delta(position_ids)
        positions = torch.cat([position_ids, steps.expand(3, -1)], 1)
        mask = None if visual_pos_mask is None else torch.cat([visual_pos_mask, visual_pos_mask.new_zeros(n)])
        return torch.cat([inputs, extra.to(inputs.device)]), positions, mask

    def _head(self, x: Any, row: int) -> Any:
        """lm_head of [1, 1, 32, H_p] (L1 interleaved) -> row `row` (and those above it) untilized, [.., V_p]."""
        ttnn = self.ttnn
        logits = ttnn.linear(
            x,
            self.weights["lm_head"],
            compute_kernel_config=self.ck["lm_head"],
            program_config=cfgs.head_matmul(ttnn, self.plan.head),
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
            dtype=ttnn.bfloat16,
        )
        # untilizing only the needed rows: 0.03 ms + 0.06 ms read vs 2.6 ms for the padded tile (seed, measured)
        rows = ttnn.untilize_with_unpadding(
            logits, [0, 0, row, self.plan.head.n_padded - 1], memory_config=ttnn.DRAM_MEMORY_CONFIG
        )
        self._free(logits)
        return rows
