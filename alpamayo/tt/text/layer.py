"""One decoder layer of the text backbone on the device: its weights, its MoE block (sparse layers), and its
prefill (all rows of a prompt) and decode (up to 32 rows of one tile) passes.

Prefill: `TextKernels.block_prefill` with causal SDPA chunked by the padded length, K/V written to the cache
from a height-sharded copy (`fill_cache` mis-addresses interleaved multi-head inputs). Decode: the residual
stream width-sharded in L1, sharded RMSNorm, DRAM-sharded matmuls (SiLU fused into the gate matmul),
decode-mode head split, q/k norm and rotary, paged cache update and flash-decode SDPA reading the position
from a device tensor, head concat (`alpamayo.tt.text.decode_programs` holds the configs).
"""

from __future__ import annotations

from typing import Any

from alpamayo.plan.device_spec import TILE
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.moe import TTMoE
from alpamayo.tt.text.decode_inputs import DecodeInputs
from alpamayo.tt.text.decode_programs import DecodePrograms
from alpamayo.tt.text.kernels import TextKernels
from alpamayo.tt.text.weights import DenseMLPWeights, LayerWeights


class DecoderLayer:
    """Layer `index` of the text decoder: its device weights and, on a sparse layer, its `TTMoE` block."""

    def __init__(
        self,
        index: int,
        weights: LayerWeights,
        moe: TTMoE | None,
        kernels: TextKernels,
        programs: DecodePrograms,
    ):
        self.index, self.weights, self.moe = index, weights, moe
        self.kernels, self.programs = kernels, programs

    def prefill(
        self,
        h: DeviceTensor,
        cos: DeviceTensor,
        sin: DeviceTensor,
        kv: tuple[DeviceTensor, DeviceTensor],
        length: int,
    ) -> DeviceTensor:
        """The layer on h [1, 1, Lp, H_p] (freed; `length` prompt rows, the rest padding) at rotary cos/sin
        [1, 1, Lp, head_dim]; fills rows [0, Lp) of slot 0 of its (K, V) cache `kv` and attends causally."""
        kern = self.kernels
        ttnn = kern.ttnn
        padded_len = h.shape[-2]

        def attend(q: Any, k: Any, v: Any) -> Any:
            cache_k, cache_v = kv
            kern.fill_cache(cache_k, k, padded_len)
            kern.fill_cache(cache_v, v, padded_len)
            chunk = kern.plan.prefill_sdpa_chunk(padded_len)
            return ttnn.transformer.scaled_dot_product_attention(
                q,
                k,
                v,
                is_causal=True,
                scale=kern.scale,
                program_config=cfgs.sdpa(ttnn, kern.plan.prefill_grid, chunk, chunk),
                compute_kernel_config=kern.ck.sdpa_prefill,
            )

        moe = self.moe
        mlp = (lambda n2: moe.prefill(n2, length)) if moe is not None else None
        return kern.block_prefill(kern.text_cfg, self.weights, h, cos, sin, attend, mlp)

    def decode(
        self,
        x: DeviceTensor,
        cos: DeviceTensor,
        sin: DeviceTensor,
        kv: tuple[DeviceTensor, DeviceTensor],
        inputs: DecodeInputs[DeviceTensor],
    ) -> DeviceTensor:
        """One decoder layer for B rows: x [1, 1, 32, H_p] (freed; rows 0..B-1 real) width-sharded on the
        residual grid, cos/sin [1, B, 32(1), head_dim] one row per core, pos [B] int32 (row b's cache index)
        -> x in the same layout; writes row b's K/V at pos[b] of cache slot b. With `page` (verify blocks:
        consecutive rows are one sequence's consecutive tokens) row r reads and writes slot page[r] instead:
        the cache [slots, n_kv, S, hd] is written as a paged cache of `slots` blocks of S rows, and `page`
        [B, 1] int32 maps row r to its block (ttnn's `share_cache` wants a one-slot cache, and its SDPA
        returns one user's rows: measured on the dry run); the K/V are written in the passes `inputs.kv_write` ([B]
        int32 update indices each, `kv_write_passes`), so no two rows of one call share a cache tile. The
        attention then reads each slot's K/V once per `BLOCK_SDPA_POSITIONS` of its rows where the inputs hold
        the block attention's (`block_sdpa`), else once per row (paged flash-decode)."""
        kern, prog, w = self.kernels, self.programs, self.weights
        ttnn, t, plan = kern.ttnn, kern.text_cfg, kern.plan
        pos, page, writes = inputs.pos, inputs.page, inputs.kv_write
        rows = pos.shape[0]
        n1 = prog.reshard(prog.res_norm(x, w.attn_norm_rm), prog.in_mem["qkv"])
        qkv = prog.ds_linear(n1, w.wqkv, plan.qkv, "qkv")
        kern.free(n1)
        qkv_i = prog.reshard(qkv, ttnn.L1_MEMORY_CONFIG)
        width = qkv_i.shape[-1]
        qkv_1 = ttnn.reshape(qkv_i, (1, 1, rows, width), (1, 1, TILE, width))  # B users: rows 0..B-1
        q, k, v = ttnn.experimental.nlp_create_qkv_heads_decode(
            qkv_1,
            num_heads=t.num_attention_heads,
            num_kv_heads=t.num_key_value_heads,
            memory_config=ttnn.L1_HEIGHT_SHARDED_MEMORY_CONFIG,
        )
        kern.free(qkv_1)
        q, k = prog.head_norm(q, w.q_norm), prog.head_norm(k, w.k_norm)
        qr = ttnn.experimental.rotary_embedding_hf(q, cos, sin, is_decode_mode=True)
        kr = ttnn.experimental.rotary_embedding_hf(k, cos, sin, is_decode_mode=True)
        kern.free(q, k)
        cache_k, cache_v = kv
        if (page is None) == bool(writes):
            raise ValueError(
                "a paged decode layer writes its K/V in passes (`kv_write_passes`), unpaged in one"
            )
        # bf16 K/V rows: paged_update_cache repacks them into the cache dtype itself
        for idxs in writes or [pos]:
            ttnn.experimental.paged_update_cache(cache_k, kr, update_idxs_tensor=idxs, page_table=page)
            ttnn.experimental.paged_update_cache(cache_v, v, update_idxs_tensor=idxs, page_table=page)
        kern.free(kr, v)
        sdpa = dict(
            cur_pos_tensor=pos,
            scale=kern.scale,
            program_config=prog.sdpa_decode_pc,
            compute_kernel_config=kern.ck.sdpa_decode,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        if page is None:
            a = ttnn.transformer.scaled_dot_product_attention_decode(qr, cache_k, cache_v, **sdpa)
        elif inputs.kv_pos:
            a = self.block_sdpa(qr, cache_k, cache_v, inputs, sdpa)
        else:
            a = ttnn.transformer.paged_scaled_dot_product_attention_decode(qr, cache_k, cache_v, page, **sdpa)
        kern.free(qr)
        a_sh = prog.reshard(a, prog.heads_mem[rows - 1])
        heads = ttnn.experimental.nlp_concat_heads_decode(a_sh, num_heads=t.num_attention_heads)
        kern.free(a_sh)
        attn = prog.reshard(heads, prog.in_mem["o"])
        o = prog.reshard(prog.ds_linear(attn, w.wo, plan.o, "o"), prog.res_mem)
        kern.free(attn)
        h = ttnn.add(x, o, memory_config=prog.res_mem)
        kern.free(x, o)
        n2 = prog.res_norm(h, w.mlp_norm_rm)
        d = (
            self.moe_decode(n2) if self.moe is not None else self.mlp_decode(w.dense, n2)
        )  # MoE: B = 1 (checked)
        out = ttnn.add(h, d, memory_config=prog.res_mem)
        kern.free(h, d)
        return out

    def block_sdpa(
        self,
        q: DeviceTensor,
        cache_k: DeviceTensor,
        cache_v: DeviceTensor,
        block: DecodeInputs[DeviceTensor],
        sdpa: dict[str, object],
    ) -> DeviceTensor:
        """Attention of a verify program's rows reading each slot's K/V once per `BLOCK_SDPA_POSITIONS` of
        its rows, not once per row: q [1, B, 32, hd] (the rows' heads, height-sharded), the cache
        [slots, n_kv, S, hd] -> [1, B, 32, hd] in DRAM, the layout of the per-row flash-decode it replaces.

        ttnn's flash-decode takes several query positions per user (`spec_multi_pos_tiles`: one 32-row tile
        per position, each masked at its own `cur_pos` entry) for one K/V head only. So the n_kv K/V heads of
        a slot are the users: the cache is read as a paged cache of slots x n_kv one-head blocks
        ([slots * n_kv, 1, S, hd], the same tiles in the same order), and call c (rows `first .. first + n`
        of one slot s, `block_chunks`) has the page table `block.kv_page[c]` [n_kv, 1] = s * n_kv + 0..n_kv-1
        and `block.kv_pos[c]` [n_kv * n], its rows' positions repeated per user; every user's query tile j
        holds all 32 head rows of row first + j (the rows' q repeated n_kv times). Row (j, head h) is then
        read from user h // (n_heads / n_kv): `block.head_select` [n_kv, 1, 32, hd] is 1 on the heads of
        each user's group, 0 elsewhere, and the masked users are summed (adding zeros: exact; one K/V head
        needs no pick). The calls' outputs are concatenated back in row order (a padding row, a copy of the
        last row, attends as it on the last slot; its output is unread). Its FLOPs are the per-row
        flash-decodes' (there too every K/V head runs the whole tile of heads: 32 / (n_heads / n_kv) times
        what its group needs, 8x at 32 heads over 8), so what it saves is the K/V reads; at 8 rows they are
        compute-bound, so the calls run on the whole grid (`block_sdpa_pc`: Q and the output are in DRAM, so
        no shard ties them to the decode grid), 16 cores per K/V head on a p150 against the decode grid's 8
        (`alpamayo.plan.estimate.verify_estimate`: 1.02x a decode step at 8 rows, against 1.31x per row)."""
        kern = self.kernels
        ttnn, t = kern.ttnn, kern.text_cfg
        rows, n_kv, hd = q.shape[1], t.num_key_value_heads, t.head_dim
        dram = ttnn.DRAM_MEMORY_CONFIG
        qi = ttnn.to_memory_config(q, dram)  # an unsharded Q must be in DRAM (the op checks)
        if t.num_attention_heads < TILE:
            # the heads' logical rows to the whole tile (padding rows, dropped by the head concat): on a tile
            # tensor already padded there, a view of qi's buffer (measured on the dry run), freed once as qi
            qi = ttnn.pad(qi, ((0, 0), (0, 0), (0, TILE - t.num_attention_heads), (0, 0)), 0.0)
        slots, s = cache_k.shape[0], cache_k.shape[2]
        # ttnn.reshape returns a view of its input's buffer (the cache stays owned by kv_cache)
        k = ttnn.reshape(cache_k, (slots * n_kv, 1, s, hd))
        v = ttnn.reshape(cache_v, (slots * n_kv, 1, s, hd))
        parts, first = [], 0
        for c, n in enumerate(block.key()[2]):
            whole = n == rows  # one call covers every row: q as it is
            qc = (
                qi
                if whole
                else ttnn.slice(qi, (0, first, 0, 0), (1, first + n, TILE, hd), memory_config=dram)
            )
            q1 = ttnn.reshape(qc, (1, 1, n * TILE, hd))  # a view of qc's buffer, freed once through qc
            # one K/V head (MQA): q is its one user's query as it is
            qg = q1 if n_kv == 1 else ttnn.repeat(q1, ttnn.Shape((1, n_kv, 1, 1)), memory_config=dram)
            args = {**sdpa, "cur_pos_tensor": block.kv_pos[c], "program_config": self.programs.block_sdpa_pc}
            a = ttnn.transformer.paged_scaled_dot_product_attention_decode(
                qg, k, v, block.kv_page[c], spec_multi_pos_tiles=n, **args
            )
            if n_kv > 1:
                kern.free(qg)
            if not whole:
                kern.free(qc)
            first += n
            a = ttnn.reshape(a, (n_kv, n, TILE, hd))
            if n_kv == 1:  # every head is the one user's (rows past n_heads are padding, dropped later)
                parts.append(a)
                continue
            picked = ttnn.mul(a, block.head_select)
            kern.free(a)
            parts.append(ttnn.sum(picked, dim=0, keepdim=True, memory_config=dram))
            kern.free(picked)
        kern.free(qi)
        if len(parts) == 1:
            return parts[0]
        out = ttnn.concat(parts, dim=1, memory_config=dram)
        kern.free(*parts)
        return out

    def mlp_decode(self, w: DenseMLPWeights, n2: DeviceTensor) -> DeviceTensor:
        """Dense SwiGLU of the normed residual n2 (freed) -> [1, 1, 32, H_p] on the residual grid."""
        kern, prog = self.kernels, self.programs
        ttnn = kern.ttnn
        gate, up, down = kern.plan.dense_mlp()
        n2 = prog.reshard(n2, prog.in_mem["gate"])
        g = prog.ds_linear(n2, w.gate, gate, "mlp_gate_up")  # SiLU fused
        u = prog.ds_linear(n2, w.up, up, "mlp_gate_up")
        kern.free(n2)
        m = prog.reshard(ttnn.mul(g, u, memory_config=g.memory_config()), prog.in_mem["down"])
        kern.free(g, u)
        d = prog.reshard(prog.ds_linear(m, w.down, down, "mlp_down"), prog.res_mem)
        kern.free(m)
        return d

    def moe_decode(self, n2: DeviceTensor) -> DeviceTensor:
        """The MoE block of this sparse layer on the normed residual n2 (freed) -> [1, 1, 32, H_p] on the residual grid."""
        kern, prog = self.kernels, self.programs
        assert self.moe is not None
        n2i = prog.reshard(n2, kern.ttnn.L1_MEMORY_CONFIG)
        d = self.moe.decode(n2i)
        kern.free(n2i)
        return prog.reshard(d, prog.res_mem)
