"""Torch implementations of the ttnn ops that have no golden function in ttnn 0.81.1 (and of one argument
that an op's golden function ignores), for the golden mode (`alpamayo.tt.golden.namespace`).

These carry our reading of each op, so each cites what it follows: the op's docstring (`ttnn.<op>.__doc__`)
and, where that is not enough, the op's kernels in tt-metal as the ttnn 0.81.1 wheel ships them (paths below
are under `ttnn/ttnn/cpp/ttnn/operations/` of the installed wheel). Every function takes and returns float32
(or int64 index) torch tensors with ttnn's logical shapes; the caller rounds outputs into their dtypes.
`tests/test_tt_golden_ops.py` checks each against a composition from the op's definition, or against a golden
sibling where ttnn has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

TILE = 32


def minimal_matmul(
    a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, fused_activation: Any = None
) -> torch.Tensor:
    """`ttnn.experimental.minimal_matmul`: A [..., M, K] @ W [K, N] (W's leading dims 1) + bias [..., N]
    (row broadcast), then the fused activation (docstring: "applied after bias", "Upper (leading) dimensions
    are broadcast over rows"; kernels `experimental/minimal_matmul/device/kernels/compute.cpp`)."""
    if fused_activation is not None:
        raise NotImplementedError("golden mode: minimal_matmul's fused_activation (the product passes none)")
    w2 = w.reshape(w.shape[-2], w.shape[-1])
    out = a @ w2
    if bias is not None:
        out = out + bias.reshape(-1)[: w2.shape[-1]]
    return out


def nlp_create_qkv_heads(
    x: torch.Tensor, num_heads: int, num_kv_heads: int, transpose_k_heads: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`ttnn.experimental.nlp_create_qkv_heads`: fused qkv [B, 1, S, (nh + 2 nkv) hd] -> q [B, nh, S, hd],
    k [B, nkv, S, hd] ([B, nkv, hd, S] with `transpose_k_heads`), v [B, nkv, S, hd]; the columns are the q
    heads, then the k heads, then the v heads, each head's hd columns contiguous (docstring; reader
    `experimental/transformer/nlp_create_qkv_heads/device/kernels/dataflow/
    reader_tm_tile_layout_nlp_create_qkv_heads.cpp`)."""
    b, one, s, width = x.shape
    if one != 1:
        raise ValueError(f"nlp_create_qkv_heads reads [B, 1, S, W], got {list(x.shape)}")
    hd, rest = divmod(width, num_heads + 2 * num_kv_heads)
    if rest:
        raise ValueError(
            f"width {width} is not (num_heads + 2 num_kv_heads) = {num_heads + 2 * num_kv_heads} heads"
        )
    heads = x.reshape(b, s, num_heads + 2 * num_kv_heads, hd).permute(0, 2, 1, 3)
    q = heads[:, :num_heads]
    k = heads[:, num_heads : num_heads + num_kv_heads]
    v = heads[:, num_heads + num_kv_heads :]
    if transpose_k_heads:
        k = k.transpose(-2, -1)
    return q.contiguous(), k.contiguous(), v.contiguous()


def nlp_create_qkv_heads_decode(
    x: torch.Tensor, num_heads: int, num_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`ttnn.experimental.nlp_create_qkv_heads_decode`: fused qkv [1, 1, B, (nh + 2 nkv) hd] (row b: user b)
    -> q [1, B, nh, hd], k and v [1, B, nkv, hd] (logical; ttnn pads the heads to 32, one user per core). The
    columns are read as q heads, then k heads, then v heads (docstring; reader `experimental/transformer/
    nlp_create_qkv_heads_decode/device/kernels/reader_tm_tile_layout_nlp_create_qkv_heads_decode.cpp`:
    user b's row of the input tile becomes head rows 0..nh-1 of its output tile)."""
    one, s, users, width = x.shape
    if one != 1 or s != 1:
        raise ValueError(f"nlp_create_qkv_heads_decode reads [1, 1, B, W], got {list(x.shape)}")
    hd, rest = divmod(width, num_heads + 2 * num_kv_heads)
    if rest:
        raise ValueError(
            f"width {width} is not (num_heads + 2 num_kv_heads) = {num_heads + 2 * num_kv_heads} heads"
        )
    heads = x.reshape(1, users, num_heads + 2 * num_kv_heads, hd)
    q = heads[:, :, :num_heads]
    k = heads[:, :, num_heads : num_heads + num_kv_heads]
    v = heads[:, :, num_heads + num_kv_heads :]
    return q.contiguous(), k.contiguous(), v.contiguous()


def nlp_concat_heads(x: torch.Tensor) -> torch.Tensor:
    """`ttnn.experimental.nlp_concat_heads`: [B, nh, S, hd] -> [B, 1, S, nh hd], head h in columns
    h hd .. (h + 1) hd (docstring; reader `experimental/transformer/nlp_concat_heads/device/kernels/dataflow/
    reader_tm_tile_layout_nlp_concat_heads.cpp`)."""
    b, nh, s, hd = x.shape
    return x.permute(0, 2, 1, 3).reshape(b, 1, s, nh * hd).contiguous()


def nlp_concat_heads_decode(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """`ttnn.experimental.nlp_concat_heads_decode`: heads [1, B, nh (padded to 32), hd] -> [1, 1, 32, nh hd]:
    user b in row b, head h in columns h hd .. (h + 1) hd; rows B..31 are the tile's padding rows (zero here;
    on a card whatever the op leaves: docstring "[S=1, B=32, 32(num_heads), head_dim] -> [S=1, 1, B=32,
    num_heads * head_dim]"; reader `experimental/transformer/nlp_concat_heads_decode/device/kernels/dataflow/
    reader_tm_tile_layout_nlp_concat_heads_decode.cpp`)."""
    users, heads, hd = x.shape[1:]
    if heads < num_heads:
        raise ValueError(f"nlp_concat_heads_decode: {heads} head rows for num_heads={num_heads}")
    out = torch.zeros(1, 1, max(users, TILE), num_heads * hd, dtype=x.dtype)
    out[0, 0, :users] = x[0, :, :num_heads].reshape(users, num_heads * hd)
    return out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension (HuggingFace's rotate_half)."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotary_embedding_hf(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_decode_mode: bool
) -> torch.Tensor:
    """`ttnn.experimental.rotary_embedding_hf`: x cos + rotate_half(x) sin, HuggingFace's rotate-half layout.
    Prefill: x [1, nh, S, hd], cos/sin [1, 1, S, hd]; decode: x [1, B, nh, hd], cos/sin [1, B, 1, hd] (row b's
    own position, broadcast over its heads) (docstring; compute kernel `experimental/transformer/
    rotary_embedding_hf/device/kernels/compute/rotary_embedding_hf.cpp`: "out = input*cos +
    rotate_half(input)*sin", the first half of the rotated tiles negated)."""
    if is_decode_mode:
        if cos.shape[1] != x.shape[1] or cos.shape[2] != 1:
            raise ValueError(
                f"decode rotary: cos {list(cos.shape)} for x {list(x.shape)} (want [1, B, 1, hd])"
            )
    elif cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"prefill rotary: cos {list(cos.shape)} for x {list(x.shape)} (want [1, 1, S, hd])")
    return x * cos + rotate_half(x) * sin


def paged_update_cache(
    cache: torch.Tensor,
    rows: torch.Tensor,
    update_idxs: torch.Tensor,
    page_table: torch.Tensor | None,
    repack: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """`ttnn.experimental.paged_update_cache`, in place: user b's K/V heads rows[0, b, :nkv] are written at
    cache index update_idxs[b] of cache slot b ([B, nkv, S, hd]), or with a page table [B, blocks] of the block
    page_table[b, i // S] ([blocks, nkv, S, hd]) at row i % S; index -1 skips user b. `repack` rounds the
    rows into the cache's dtype (the op owns the repack: docstring). Reader `experimental/paged_cache/device/
    kernels/dataflow/reader_update_cache_interleaved_start_id.cpp` (the -1 skip, the block address
    `physical_block_id * num_heads * block_size_t * Wt`).

    Each user runs on its own core, which reads its row's whole 32-row cache tile, patches the row and
    writes the tile back; two users of one call on one tile race, and the last writer drops the other's row.
    That is refused here (`RuntimeError`), as a program a card would run wrongly."""
    users = rows.shape[1]
    kv_heads, block = cache.shape[1], cache.shape[2]
    idxs = update_idxs.reshape(-1).tolist()
    if len(idxs) < users:
        raise ValueError(f"paged_update_cache: {len(idxs)} update indices for {users} users")
    if page_table is None and cache.shape[0] != users:
        raise ValueError(
            f"paged_update_cache: {users} users for a cache of {cache.shape[0]} slots (one row per slot)"
        )
    tiles: dict[tuple[int, int], int] = {}
    for b in range(users):
        i = int(idxs[b])
        if i == -1:
            continue
        if page_table is None:
            slot, row = b, i
        else:
            slot, row = int(page_table[b, i // block]), i % block
        if not 0 <= row < block or not 0 <= slot < cache.shape[0]:
            raise IndexError(
                f"paged_update_cache: user {b} index {i} is outside the cache {list(cache.shape)}"
            )
        tile = (slot, row // TILE)
        if tile in tiles:
            raise RuntimeError(
                f"golden mode: paged_update_cache users {tiles[tile]} and {b} write cache tile rows "
                f"{row // TILE * TILE}..{row // TILE * TILE + TILE - 1} of slot {slot} in one call: their "
                "cores race on the tile's read-patch-write and the last writer drops the other's row"
            )
        tiles[tile] = b
        cache[slot, :, row] = repack(rows[0, b, :kv_heads].reshape(1, kv_heads, -1))[0]


def fast_reduce_nc(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """`ttnn.experimental.fast_reduce_nc`: the sum over dims 0 and/or 1, kept as size-1 dimensions (docstring
    "reduction operation on dim 0, 1, or [0,1]"; compute kernel `experimental/reduction/fast_reduce_nc/
    device/kernels/reduce_nc.cpp` adds the tiles along the reduced dims)."""
    if not dims or any(d not in (0, 1) for d in dims):
        raise ValueError(f"fast_reduce_nc reduces dims 0 and/or 1, got {list(dims)}")
    return x.sum(dim=dims, keepdim=True)


def paged_sdpa_decode_multi_pos(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    page_table: torch.Tensor,
    cur_pos: torch.Tensor,
    positions: int,
    scale: float | None,
) -> torch.Tensor:
    """`ttnn.transformer.paged_scaled_dot_product_attention_decode(..., spec_multi_pos_tiles=n)`, which its
    golden function ignores: q [1, U, n x 32, hd] holds n query tiles per user u (one K/V head each: the paged
    cache [blocks, 1, S, hd]); query tile j of user u attends to the user's pages (page_table [U, pages])
    up to and including cache index cur_pos[u x n + j] (`alpamayo.tt.text.layer.DecoderLayer.block_sdpa`, as
    the flash-decode of one row masks at its `cur_pos`) -> [1, U, n x 32, hd]."""
    users, rows, hd = q.shape[1], q.shape[2], q.shape[3]
    if rows != positions * TILE:
        raise ValueError(
            f"spec_multi_pos_tiles={positions}: q has {rows} rows per user, want {positions * TILE}"
        )
    if k.shape[1] != 1:
        raise ValueError(f"spec_multi_pos_tiles reads one K/V head per page, got a cache {list(k.shape)}")
    pos = cur_pos.reshape(-1).tolist()
    if len(pos) != users * positions:
        raise ValueError(f"spec_multi_pos_tiles={positions}: {len(pos)} positions for {users} users")
    scale = hd**-0.5 if scale is None else scale
    pages = page_table.long()
    keys = k[pages, 0].reshape(users, -1, hd)  # [U, pages x S, hd]: each user's pages in table order
    values = v[pages, 0].reshape(users, -1, v.shape[-1])
    bound = torch.tensor(pos, dtype=torch.long).view(users, positions, 1, 1)
    visible = torch.arange(keys.shape[1]).view(1, 1, 1, -1) <= bound  # [U, n, 1, L]
    scores = (q[0].view(users, positions, TILE, hd) @ keys[:, None].transpose(-1, -2)) * scale
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    out = torch.nan_to_num(probs) @ values[:, None]  # a user row with no visible key (bound -1): zeros
    return out.reshape(1, users, rows, -1)
