"""Decode of the text backbone: up to 32 rows of one tile (each at its own cache index), every layer on L1.

Residual stream width-sharded in L1, sharded RMSNorm, DRAM-sharded matmuls (SiLU fused into the gate
matmul), decode-mode head split, q/k norm and rotary, paged cache update and flash-decode SDPA reading the
position from a device tensor, head concat, lm_head with the rows untilized. The step's persistent
inputs (embedding rows, cos, sin, positions; a verify block's page tables and its block attention's
positions) are rewritten in place before each run, so the step can be captured as a trace
(`alpamayo.tt.text.trace`) and replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.plan.programs.grid import SDPA_DECODE_K_CHUNK
from alpamayo.plan.programs.text import (
    BLOCK_SDPA_POSITIONS,
    DecodeMatmul,
    block_sdpa_applies,
    check_decode_rows,
)
from alpamayo.text.inputs import check_decode_room, check_token_ids
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.text.state import TextState
from alpamayo.tt.text.trace import DecodeTrace, TraceSwitch

MAX_ROWS = TILE  # decode rows per program: one tile, so every decode matmul reads its weights once for all
# Flash-decode SDPA (paged or not) validates 1..8 rows and multiples of 8 only: 9..31 others fail "bad
# optional access" in ttnn 0.81.1 (measured on the dry run, every count 2..32; the heads are sharded one
# row per core over 8 columns, so those counts leave a ragged last core row).
ROW_GROUP = 8


def program_rows(rows: int) -> int:
    """The decode program's row count for `rows` real rows: `rows` up to 8, else the next multiple of 8."""
    return rows if rows <= ROW_GROUP else round_up(rows, ROW_GROUP)


def block_chunks(pages: Sequence[int]) -> list[tuple[int, int]]:
    """(first program row, rows) of each block attention call of a verify program whose row r is on cache
    slot pages[r] (`TextDecode._block_sdpa`): every run of consecutive rows on one slot (one sequence's
    consecutive tokens; the padding rows, copies of the last row, extend the last run) in pieces of up to
    `BLOCK_SDPA_POSITIONS` rows."""
    chunks, first = [], 0
    for r in range(1, len(pages) + 1):
        if r == len(pages) or pages[r] != pages[first]:
            chunks += [(c, min(BLOCK_SDPA_POSITIONS, r - c)) for c in range(first, r, BLOCK_SDPA_POSITIONS)]
            first = r
    return chunks


def head_select(n_heads: int, n_kv: int, head_dim: int) -> torch.Tensor:
    """[n_kv, 1, 32, head_dim] bf16: 1 on rows g * n_heads / n_kv .. (g + 1) * n_heads / n_kv - 1 of
    user g (the query heads that K/V head g serves), 0 elsewhere (`TextDecode._block_sdpa`)."""
    group = n_heads // n_kv
    sel = torch.zeros(n_kv, 1, TILE, head_dim, dtype=torch.bfloat16)
    for g in range(n_kv):
        sel[g, 0, g * group : (g + 1) * group] = 1
    return sel


def kv_write_passes(pages: Sequence[int], positions: Sequence[int]) -> list[list[int]]:
    """The K/V writes of a verify program whose row r holds cache index positions[r] of slot pages[r], as
    passes of `paged_update_cache`: pass p's update index per program row, the row's position where the
    row writes in pass p, else -1 (ttnn skips that row's read and write).

    `paged_update_cache` runs its rows at once, one per core, and each rewrites its row's whole 32-row
    tile (read, untilize, patch the row, tilize, write back: ttnn 0.81.1's `reader_`/`writer_update_cache_
    interleaved_start_id.cpp`; only `share_cache`, refused with a page table, chains the cores). A block's
    consecutive positions share tiles, so in one call the rows' rewrites of a tile would race and the last
    one would win. Pass p writes the p-th row of every slot: no two rows of a pass touch one slot. A row at
    a slot and position an earlier row holds (the padding rows, copies of the last row: the same K/V) is
    written by that row only."""
    order: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    passes: list[int | None] = []
    for page, pos in zip(pages, positions, strict=True):
        if (page, pos) in seen:
            passes.append(None)
            continue
        seen.add((page, pos))
        passes.append(order.get(page, 0))
        order[page] = order.get(page, 0) + 1
    return [
        [pos if p == q else -1 for p, pos in zip(passes, positions, strict=True)]
        for q in range(max(order.values()))
    ]


ProgramKey = tuple[int, bool, tuple[int, ...], int]  # `program_key`


def program_key(values: dict[str, Any]) -> ProgramKey:
    """What fixes a decode program's graph, from its persistent inputs (host or device tensors): (rows,
    paged, the block attention's rows per call: `block_chunks`' sizes, () on the per-row path, the K/V
    write passes: `kv_write_passes`, 0 unpaged). The slots and positions are values of the inputs,
    rewritten before each replay."""
    chunks: list[int] = []
    while f"kv_pos.{len(chunks)}" in values:
        chunks.append(values[f"kv_pos.{len(chunks)}"].shape[0] // values[f"kv_page.{len(chunks)}"].shape[0])
    return values["pos"].shape[0], "page" in values, tuple(chunks), len(kv_writes(values))


def kv_writes(values: dict[str, Any]) -> list[Any]:
    """The K/V write passes' update indices among a decode program's persistent inputs ("kv_write.p")."""
    writes: list[Any] = []
    while f"kv_write.{len(writes)}" in values:
        writes.append(values[f"kv_write.{len(writes)}"])
    return writes


class TextDecode(TextState):
    """Decode half of `TTTextModel` (a mixin: the attributes below and `TextState`'s are the model's)."""

    max_verify_rows = MAX_ROWS  # rows x tokens of one `verify` (a speculative block is capped to fit)

    embed_table: torch.Tensor
    trace_switch: TraceSwitch
    _inputs: dict[ProgramKey, dict[str, Any]]
    _traces: dict[tuple[ProgramKey, tuple[int, ...]], DecodeTrace]
    lengths: list[int]
    _head: Callable[[Any, int], Any]  # the prefill's lm_head (`TextPrefill._head`)

    if TYPE_CHECKING:  # read-only properties of the model

        @property
        def max_batch(self) -> int: ...

        @property
        def batch(self) -> int: ...

    def _decode_setup(self) -> None:
        """Memory and program configs of the decode step (fixed per model)."""
        ttnn, plan, t = self.ttnn, self.plan, self.text_cfg
        self.res_mem = cfgs.width_sharded(ttnn, self.hidden_padded, plan.residual_grid)
        self.in_mem = {m.name: cfgs.width_sharded(ttnn, m.k, m.grid) for m in plan.decode_matmuls}
        self.pc = {m.name: cfgs.decode_matmul(ttnn, m) for m in plan.decode_matmuls}
        self.norm_pc = cfgs.sharded_norm(ttnn, plan.residual_grid, plan.norm_block_w, plan.norm_subblock_w)
        heads = round_up(t.num_attention_heads, TILE)
        # per decode row count: cos/sin and the attention heads, one row per core
        self.rot_mem = [cfgs.per_row_sharded(ttnn, b, TILE, t.head_dim) for b in range(1, MAX_ROWS + 1)]
        self.heads_mem = [cfgs.per_row_sharded(ttnn, b, heads, t.head_dim) for b in range(1, MAX_ROWS + 1)]
        self.sdpa_decode_pc = cfgs.sdpa(ttnn, plan.sdpa_decode_grid, TILE, SDPA_DECODE_K_CHUNK)
        self.block_sdpa_pc = cfgs.sdpa(ttnn, plan.block_sdpa_grid, TILE, SDPA_DECODE_K_CHUNK)
        self.block_sdpa = block_sdpa_applies(t.num_attention_heads)

    def _res_norm(self, x: Any, gamma: Any) -> Any:
        """Sharded RMSNorm of the residual stream (input and output width-sharded on the residual grid)."""
        return self.ttnn.rms_norm(
            x,
            epsilon=self.residual_eps,
            weight=gamma,
            program_config=self.norm_pc,
            compute_kernel_config=self.ck["norm"],
            memory_config=self.res_mem,
        )

    def _reshard(self, x: Any, mem: Any) -> Any:
        """x moved to `mem` (x freed) unless it is already there. `to_memory_config` returns x itself then
        (nlp_concat_heads_decode already writes the o-projection's input layout when head_dim is 32 and the o
        grid has one core per head: the demo checkpoint, the tiny MoE model), which must not be freed."""
        if x.memory_config() == mem:
            return x
        y = self.ttnn.to_memory_config(x, mem)
        self._free(x)
        return y

    def _ds_linear(self, x: Any, w: Any, mm: DecodeMatmul, op: str) -> Any:
        """DRAM-sharded decode matmul of x (width-sharded on mm.grid); output width-sharded on mm.grid."""
        return self.ttnn.linear(
            x,
            w,
            compute_kernel_config=self.ck[op],
            program_config=self.pc[mm.name],
            memory_config=self.ttnn.L1_WIDTH_SHARDED_MEMORY_CONFIG,
            dtype=self.ttnn.bfloat16,
        )

    def _head_norm(self, x: Any, gamma: Any) -> Any:
        """Per-head RMSNorm of decode q or k (height-sharded heads) through an L1 interleaved copy."""
        ttnn = self.ttnn
        mem = x.memory_config()
        xi = ttnn.to_memory_config(x, ttnn.L1_MEMORY_CONFIG)
        self._free(x)
        xn = ttnn.rms_norm(
            xi,
            epsilon=self.text_cfg.rms_norm_eps,
            weight=gamma,
            compute_kernel_config=self.ck["norm"],
            memory_config=ttnn.L1_MEMORY_CONFIG,
        )
        self._free(xi)
        return self._reshard(xn, mem)

    def _layer_decode(
        self,
        i: int,
        x: Any,
        cos: Any,
        sin: Any,
        pos: Any,
        page: Any = None,
        block: dict[str, Any] | None = None,
        writes: Sequence[Any] = (),
    ) -> Any:
        """One decoder layer for B rows: x [1, 1, 32, H_p] (freed; rows 0..B-1 real) width-sharded on the
        residual grid, cos/sin [1, B, 32(1), head_dim] one row per core, pos [B] int32 (row b's cache index)
        -> x in the same layout; writes row b's K/V at pos[b] of cache slot b. With `page` (verify blocks:
        consecutive rows are one sequence's consecutive tokens) row r reads and writes slot page[r] instead:
        the cache [slots, n_kv, S, hd] is written as a paged cache of `slots` blocks of S rows, and `page`
        [B, 1] int32 maps row r to its block (ttnn's `share_cache` wants a one-slot cache, and its SDPA
        returns one user's rows: measured on the dry run); the K/V are written in the passes `writes` ([B]
        int32 update indices each, `kv_write_passes`), so no two rows of one call share a cache tile. The
        attention then reads each slot's K/V once
        per `BLOCK_SDPA_POSITIONS` of its rows with `block` (the block attention's persistent inputs of
        `_decode_host_inputs`; `_block_sdpa`), else once per row (paged flash-decode)."""
        ttnn, t, plan, w = self.ttnn, self.text_cfg, self.plan, self.layer_weights[i]
        rows = pos.shape[0]
        n1 = self._reshard(self._res_norm(x, w["attn_norm.rm"]), self.in_mem["qkv"])
        qkv = self._ds_linear(n1, w["wqkv"], plan.qkv, "qkv")
        self._free(n1)
        qkv_i = self._reshard(qkv, ttnn.L1_MEMORY_CONFIG)
        width = qkv_i.shape[-1]
        qkv_1 = ttnn.reshape(qkv_i, (1, 1, rows, width), (1, 1, TILE, width))  # B users: rows 0..B-1
        q, k, v = ttnn.experimental.nlp_create_qkv_heads_decode(
            qkv_1,
            num_heads=t.num_attention_heads,
            num_kv_heads=t.num_key_value_heads,
            memory_config=ttnn.L1_HEIGHT_SHARDED_MEMORY_CONFIG,
        )
        self._free(qkv_1)
        q, k = self._head_norm(q, w["q_norm.rm"]), self._head_norm(k, w["k_norm.rm"])
        qr = ttnn.experimental.rotary_embedding_hf(q, cos, sin, is_decode_mode=True)
        kr = ttnn.experimental.rotary_embedding_hf(k, cos, sin, is_decode_mode=True)
        self._free(q, k)
        cache_k, cache_v = self.kv_cache[i]
        if (page is None) == bool(writes):
            raise ValueError(
                "a paged decode layer writes its K/V in passes (`kv_write_passes`), unpaged in one"
            )
        # bf16 K/V rows: paged_update_cache repacks them into the cache dtype itself
        for idxs in writes or [pos]:
            ttnn.experimental.paged_update_cache(cache_k, kr, update_idxs_tensor=idxs, page_table=page)
            ttnn.experimental.paged_update_cache(cache_v, v, update_idxs_tensor=idxs, page_table=page)
        self._free(kr, v)
        sdpa = dict(
            cur_pos_tensor=pos,
            scale=self.scale,
            program_config=self.sdpa_decode_pc,
            compute_kernel_config=self.ck["sdpa_decode"],
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        if page is None:
            a = ttnn.transformer.scaled_dot_product_attention_decode(qr, cache_k, cache_v, **sdpa)
        elif block is not None:
            a = self._block_sdpa(qr, cache_k, cache_v, block, sdpa)
        else:
            a = ttnn.transformer.paged_scaled_dot_product_attention_decode(qr, cache_k, cache_v, page, **sdpa)
        self._free(qr)
        a_sh = self._reshard(a, self.heads_mem[rows - 1])
        heads = ttnn.experimental.nlp_concat_heads_decode(a_sh, num_heads=t.num_attention_heads)
        self._free(a_sh)
        attn = self._reshard(heads, self.in_mem["o"])
        o = self._reshard(self._ds_linear(attn, w["wo"], plan.o, "o"), self.res_mem)
        self._free(attn)
        h = ttnn.add(x, o, memory_config=self.res_mem)
        self._free(x, o)
        n2 = self._res_norm(h, w["mlp_norm.rm"])
        d = self._moe_decode(i, n2) if i in self.moe else self._mlp_decode(w, n2)  # MoE: B = 1 (checked)
        out = ttnn.add(h, d, memory_config=self.res_mem)
        self._free(h, d)
        return out

    def _block_sdpa(self, q: Any, cache_k: Any, cache_v: Any, block: dict[str, Any], sdpa: dict) -> Any:
        """Attention of a verify program's rows reading each slot's K/V once per `BLOCK_SDPA_POSITIONS` of
        its rows, not once per row: q [1, B, 32, hd] (the rows' heads, height-sharded), the cache
        [slots, n_kv, S, hd] -> [1, B, 32, hd] in DRAM, the layout of the per-row flash-decode it replaces.

        ttnn's flash-decode takes several query positions per user (`spec_multi_pos_tiles`: one 32-row tile
        per position, each masked at its own `cur_pos` entry) for one K/V head only. So the n_kv K/V heads of
        a slot are the users: the cache is read as a paged cache of slots x n_kv one-head blocks
        ([slots * n_kv, 1, S, hd], the same tiles in the same order), and call c (rows `first .. first + n`
        of one slot s, `block_chunks`) has the page table `block["kv_page.c"]` [n_kv, 1] = s * n_kv + 0..n_kv-1
        and `block["kv_pos.c"]` [n_kv * n], its rows' positions repeated per user; every user's query tile j
        holds all 32 head rows of row first + j (the rows' q repeated n_kv times). Row (j, head h) is then
        read from user h // (n_heads / n_kv): `block["head_select"]` [n_kv, 1, 32, hd] is 1 on the heads of
        each user's group, 0 elsewhere, and the masked users are summed (adding zeros: exact; one K/V head
        needs no pick). The calls' outputs are concatenated back in row order (a padding row, a copy of the
        last row, attends as it on the last slot; its output is unread). Its FLOPs are the per-row
        flash-decodes' (there too every K/V head runs the whole tile of heads: 32 / (n_heads / n_kv) times
        what its group needs, 8x at 32 heads over 8), so what it saves is the K/V reads; at 8 rows they are
        compute-bound, so the calls run on the whole grid (`block_sdpa_pc`: Q and the output are in DRAM, so
        no shard ties them to the decode grid), 16 cores per K/V head on a p150 against the decode grid's 8
        (`alpamayo.plan.estimate.verify_estimate`: 1.02x a decode step at 8 rows, against 1.31x per row)."""
        ttnn, t = self.ttnn, self.text_cfg
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
        for c, n in enumerate(program_key(block)[2]):
            whole = n == rows  # one call covers every row: q as it is
            qc = (
                qi
                if whole
                else ttnn.slice(qi, (0, first, 0, 0), (1, first + n, TILE, hd), memory_config=dram)
            )
            q1 = ttnn.reshape(qc, (1, 1, n * TILE, hd))  # a view of qc's buffer, freed once through qc
            # one K/V head (MQA): q is its one user's query as it is
            qg = q1 if n_kv == 1 else ttnn.repeat(q1, ttnn.Shape((1, n_kv, 1, 1)), memory_config=dram)
            args = {**sdpa, "cur_pos_tensor": block[f"kv_pos.{c}"], "program_config": self.block_sdpa_pc}
            a = ttnn.transformer.paged_scaled_dot_product_attention_decode(
                qg, k, v, block[f"kv_page.{c}"], spec_multi_pos_tiles=n, **args
            )
            if n_kv > 1:
                self._free(qg)
            if not whole:
                self._free(qc)
            first += n
            a = ttnn.reshape(a, (n_kv, n, TILE, hd))
            if n_kv == 1:  # every head is the one user's (rows past n_heads are padding, dropped later)
                parts.append(a)
                continue
            picked = ttnn.mul(a, block["head_select"])
            self._free(a)
            parts.append(ttnn.sum(picked, dim=0, keepdim=True, memory_config=dram))
            self._free(picked)
        self._free(qi)
        if len(parts) == 1:
            return parts[0]
        out = ttnn.concat(parts, dim=1, memory_config=dram)
        self._free(*parts)
        return out

    def _mlp_decode(self, w: dict[str, Any], n2: Any) -> Any:
        """Dense SwiGLU of the normed residual n2 (freed) -> [1, 1, 32, H_p] on the residual grid."""
        ttnn = self.ttnn
        gate, up, down = self.plan.dense_mlp()
        n2 = self._reshard(n2, self.in_mem["gate"])
        g = self._ds_linear(n2, w["w_gate"], gate, "mlp_gate_up")  # SiLU fused
        u = self._ds_linear(n2, w["w_up"], up, "mlp_gate_up")
        self._free(n2)
        m = self._reshard(ttnn.mul(g, u, memory_config=g.memory_config()), self.in_mem["down"])
        self._free(g, u)
        d = self._reshard(self._ds_linear(m, w["w_down"], down, "mlp_down"), self.res_mem)
        self._free(m)
        return d

    def _moe_decode(self, i: int, n2: Any) -> Any:
        """MoE block of sparse layer i on the normed residual n2 (freed) -> [1, 1, 32, H_p] on the residual grid."""
        n2i = self._reshard(n2, self.ttnn.L1_MEMORY_CONFIG)
        d = self.moe[i].decode(n2i)
        self._free(n2i)
        return self._reshard(d, self.res_mem)

    def _sharded_inputs(self, inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
        """L1 copies of the persistent x (on the residual grid), cos and sin (one row per core) for the
        decode layers."""
        ttnn = self.ttnn
        rot = self.rot_mem[inputs["pos"].shape[0] - 1]
        x = ttnn.to_memory_config(inputs["x"], self.res_mem)
        cos = ttnn.to_memory_config(inputs["cos"], rot)
        sin = ttnn.to_memory_config(inputs["sin"], rot)
        return x, cos, sin

    def _decode_graph(self, inputs: dict[str, Any], capture: Sequence[int] = ()) -> Any:
        """Every layer, final norm and lm_head for the persistent `inputs` of B rows (`_layer_decode`; a
        verify block's inputs hold the page table "page"); returns logits [1, 1, B, V_p] row-major bf16 in
        DRAM, with `capture` a list [logits, the outputs [1, 1, 32, H_p] of those layers in DRAM] (the
        last layer's normed, as transformers' last hidden state). Captured as a decode trace, so it only
        allocates, computes and frees."""
        ttnn = self.ttnn
        rows, last = inputs["pos"].shape[0], self.text_cfg.num_hidden_layers - 1
        taken: dict[int, Any] = {}
        x, cos, sin = self._sharded_inputs(inputs)
        block = inputs if program_key(inputs)[2] else None
        writes = kv_writes(inputs)
        for i in range(last + 1):
            x = self._layer_decode(i, x, cos, sin, inputs["pos"], inputs.get("page"), block, writes)
            if i in capture and i != last:
                taken[i] = ttnn.to_memory_config(x, ttnn.DRAM_MEMORY_CONFIG)
        self._free(cos, sin)
        xn = self._res_norm(x, self.weights["norm.rm"])
        self._free(x)
        if last in capture:
            taken[last] = ttnn.to_memory_config(xn, ttnn.DRAM_MEMORY_CONFIG)
        xi = self._reshard(xn, ttnn.L1_MEMORY_CONFIG)  # the 1D multicast head wants interleaved in0
        logits = self._head(xi, rows - 1)
        self._free(xi)
        return [logits, *(taken[i] for i in capture)] if capture else logits

    def _decode_host_inputs(
        self, tokens: Sequence[int], positions: Sequence[int], pages: Sequence[int] | None = None
    ) -> dict[str, torch.Tensor]:
        """Host values of the persistent decode inputs: row b holds `tokens[b]` at cache index
        `positions[b]` (rope position `positions[b] + rope_delta`); `pages`: row b's cache slot (the page
        table of `_layer_decode` and its K/V write passes "kv_write.p", `kv_write_passes`; None: row b in
        slot b), and where `block_sdpa_applies` the block
        attention's inputs per call c of `block_chunks(pages)` ("kv_pos.c", "kv_page.c") and "head_select"
        (`_block_sdpa`)."""
        t, rows = self.text_cfg, len(tokens)
        x = torch.zeros(1, 1, TILE, self.hidden_padded, dtype=torch.bfloat16)
        x[0, 0, :rows, : t.hidden_size] = self.embed_table[torch.tensor(tokens, dtype=torch.long)]
        pos = torch.tensor(positions, dtype=torch.int32)
        cos, sin = self.rope.cos_sin_1d(pos.long() + self.rope_delta, torch.bfloat16)
        values = {"x": x, "cos": cos.view(1, rows, 1, -1), "sin": sin.view(1, rows, 1, -1), "pos": pos}
        if pages is not None:
            values["page"] = torch.tensor(pages, dtype=torch.int32).view(rows, 1)
            for p, idxs in enumerate(kv_write_passes(pages, positions)):
                values[f"kv_write.{p}"] = torch.tensor(idxs, dtype=torch.int32)
            if self.block_sdpa:
                n_kv = t.num_key_value_heads
                for c, (first, n) in enumerate(block_chunks(pages)):
                    values[f"kv_pos.{c}"] = pos[first : first + n].repeat(n_kv)
                    values[f"kv_page.{c}"] = (
                        pages[first] * n_kv + torch.arange(n_kv, dtype=torch.int32)
                    ).view(n_kv, 1)
                if n_kv > 1:
                    values["head_select"] = head_select(t.num_attention_heads, n_kv, t.head_dim)
        return values

    def _write_inputs(self, values: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Rewrite the persistent decode inputs of this row count in place (allocated on first use, never
        reallocated: a trace captured over them stays valid)."""
        ttnn = self.ttnn
        key = program_key(values)
        with self.tracer.span("tt.host_to_device"):
            hosts = {
                name: ttnn.from_torch(
                    v,
                    dtype=ttnn.int32 if v.dtype == torch.int32 else ttnn.bfloat16,
                    layout=ttnn.ROW_MAJOR_LAYOUT if v.dtype == torch.int32 else ttnn.TILE_LAYOUT,
                )
                for name, v in values.items()
            }
            if key not in self._inputs:
                self._inputs[key] = {
                    name: ttnn.allocate_tensor_on_device(
                        h.shape, h.dtype, h.layout, self.device, ttnn.DRAM_MEMORY_CONFIG
                    )
                    for name, h in hosts.items()
                }
            for name, h in hosts.items():
                ttnn.copy_host_to_device_tensor(h, self._inputs[key][name])
        return self._inputs[key]

    def _check_rows(self, ids: torch.Tensor, positions: Sequence[int]) -> None:
        """Refuses, before any device call, what the decode program cannot run."""
        self._require_cache()
        rows = len(positions)
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"the ttnn decode program runs 1..{MAX_ROWS} rows (one tile), got {rows}")
        check_decode_rows(rows, bool(self.moe))
        check_decode_room(max(positions), self.max_seq_len)
        check_token_ids(ids, self.text_cfg.vocab_size)

    def _run_rows(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        pages: Sequence[int] | None,
        traced: bool,
        capture: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the decode program of len(tokens) rows (`pages`: each row's cache slot, None: row b in slot
        b) -> (float32 logits [B, V], the `capture` layers' outputs concatenated [B, len(capture) x H] bf16,
        or None). Traced: the first call per (`program_key`, capture) compiles the program, captures it
        and returns the compile run's results (the capture rewrites the same K/V rows: idempotent); later
        calls replay it (the page tables and the block attention's positions are persistent inputs, rewritten
        like the others)."""
        traced = self.trace_switch.traced(traced)
        capture = tuple(capture)
        values = self._decode_host_inputs(tokens, positions, pages)
        inputs = self._write_inputs(values)
        key = (program_key(values), capture)
        trace = self._traces.get(key)
        rows = len(tokens)
        if not traced:
            with self.tracer.span("tt.decode_untraced", rows=rows):
                out = self._decode_graph(inputs, capture)
            result = self._results(out, rows, capture)
            self._free(*(out if capture else [out]))
        elif trace is None:
            with self.tracer.span("tt.decode_compile_and_capture", rows=rows):
                out = self._decode_graph(inputs, capture)
                result = self._results(out, rows, capture)
                self._free(*(out if capture else [out]))
                trace = self._traces[key] = DecodeTrace(self.ttnn, self.device)
                trace.capture(lambda: self._decode_graph(inputs, capture))
        else:
            with self.tracer.span("tt.decode_trace_execute", rows=rows):
                out = trace.replay()
            result = self._results(out, rows, capture)
        return result

    def _results(
        self, out: Any, rows: int, capture: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [rows, V] float32, captured layer outputs [rows, len(capture) x H] bf16 or None)."""
        logits = self._download(out[0] if capture else out).reshape(rows, -1)
        logits = logits[:, : self.text_cfg.vocab_size].float()
        if not capture:
            return logits, None
        h = self.text_cfg.hidden_size
        feats = [self._download(t)[0, 0, :rows, :h] for t in out[1:]]
        return logits, torch.cat(feats, dim=-1)

    def decode(self, tokens: int | torch.Tensor, traced: bool = True) -> torch.Tensor:
        """Append one token to each active row, row b at its own cache index `lengths[b]`: float32 logits
        [V] for an int (one active row), [B, V] for ids [B] (the torch backend's contract). The B rows run
        as one program (rows of one tile: the weights are read once for all of them)."""
        single = isinstance(tokens, int)
        ids = torch.tensor([tokens]) if isinstance(tokens, int) else tokens.reshape(-1)
        if ids.numel() != len(self.lengths):
            raise ValueError(f"decode got {ids.numel()} token(s) for {len(self.lengths)} active row(s)")
        positions = list(self.lengths)
        self._check_rows(ids, positions)
        # paged_update_cache wants a row per cache slot ("Expect batch in input tensor match the batch in cache
        # tensor"): idle slots get token 0 at their position 0, unread until a fork rewrites them
        idle = self.max_batch - len(positions)
        logits, _ = self._run_rows(ids.tolist() + [0] * idle, positions + [0] * idle, None, traced)
        self.lengths = [n + 1 for n in positions]
        return logits[0] if single else logits[: len(positions)]

    def verify(
        self, tokens: torch.Tensor, capture: Sequence[int] = (), traced: bool = True
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append T tokens to each active row in one forward, causal among them (ids [B, T]) -> float32
        logits [B, T, V]: logits[b, j] follow tokens[b, :j + 1]; with `capture` (layer indices) also the
        concatenated outputs of those layers [B, T, len(capture) x H] bf16 (a DFlash draft's context
        features; the last layer's normed), as the torch `TextModel.verify`. Row b's T tokens run as T
        consecutive rows of the decode program on row b's cache slot (`_layer_decode`'s page table), token j
        at cache index lengths[b] + j (ragged rows allowed), so B x T <= 32 rows read the weights once
        (`max_verify_rows`). T = 1 runs the rows on their own slots, as `decode`."""
        ids = torch.as_tensor(tokens)
        if ids.dim() != 2 or ids.shape[0] != self.batch or ids.shape[1] < 1:
            raise ValueError(f"verify takes ids [{self.batch}, T >= 1], got shape {list(ids.shape)}")
        length = ids.shape[1]
        if self.batch * length > self.max_verify_rows:
            raise ValueError(
                f"verify of {self.batch} row(s) x {length} tokens = {self.batch * length} program rows: the "
                f"ttnn decode program runs 1..{self.max_verify_rows} (one tile); allowed: T <= "
                f"{self.max_verify_rows // self.batch} for {self.batch} row(s)"
            )
        if length == 1:
            positions = list(self.lengths)
            self._check_rows(ids, positions)
            idle = self.max_batch - len(positions)
            run_tokens, run_positions, pages = ids[:, 0].tolist() + [0] * idle, positions + [0] * idle, None
        else:
            # row-major: (row b, token j) is program row b * T + j
            run_positions = [n + j for n in self.lengths for j in range(length)]
            self._check_rows(ids.reshape(-1), run_positions)
            run_tokens = ids.reshape(-1).tolist()
            pages = [b for b in range(self.batch) for _ in range(length)]
            # padding rows repeat the last real row: the same K/V written to the same place, logits unread
            pad = program_rows(len(run_tokens)) - len(run_tokens)
            run_tokens, run_positions = (
                run_tokens + run_tokens[-1:] * pad,
                run_positions + run_positions[-1:] * pad,
            )
            pages += pages[-1:] * pad
        logits, feats = self._run_rows(run_tokens, run_positions, pages, traced, capture)
        rows = self.batch * length
        self.lengths = [n + length for n in self.lengths]
        logits = logits[:rows].reshape(self.batch, length, -1)
        if feats is None:
            return logits
        return logits, feats[:rows].reshape(self.batch, length, -1)
