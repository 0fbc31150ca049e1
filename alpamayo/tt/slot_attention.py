"""Attention of a block of rows per cache slot over that slot in place: the action expert's Euler step and the
DFlash draft's block (`alpamayo.tt.expert`, `alpamayo.tt.draft`) both run it.

Row block b ([b x block, (b + 1) x block) of q, k, v [1, heads, S x block, hd]) belongs to cache slot b: its
K/V are written into the slot's region (`TTTextModel._fill_cache` at `region_start`), its queries become batch
entry b of one SDPA over every slot, and the outputs are joined back into [1, heads, S x block, hd].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alpamayo.tt.device_io import DeviceIO

Sdpa = Callable[[Any, Any, Any], Any]  # (q [S, heads, block, hd], cache K, cache V) -> [S, heads, block, hd]


def attend_by_slot(
    io: DeviceIO,
    text: Any,
    cache: tuple[Any, Any],
    q: Any,
    k: Any,
    v: Any,
    slots: int,
    block: int,
    region_start: int,
    sdpa: Sdpa,
) -> Any:
    """`slots` row blocks of `block` rows of q, k, v, each over its own slot of `cache` (K, V) in place ->
    [1, heads, slots x block, hd] (q is kept: the caller frees it; with one slot the SDPA's own output)."""
    ttnn = io.ttnn
    cache_k, cache_v = cache
    for dst, x in ((cache_k, k), (cache_v, v)):
        for slot in range(slots):
            end = [1, x.shape[1], (slot + 1) * block, x.shape[3]]
            rows = ttnn.slice(x, [0, 0, slot * block, 0], end) if slots > 1 else x
            text.kernels.fill_cache(dst, rows, block, region_start, batch=slot)
            if slots > 1:
                io.free(rows)
    if slots == 1:
        return sdpa(q, cache_k, cache_v)
    # [1, heads, S x block, hd] -> [S, heads, block, hd]: one batch entry per cache slot (new tensors)
    n, d = q.shape[1], q.shape[3]
    parts = [ttnn.slice(q, [0, 0, s * block, 0], [1, n, (s + 1) * block, d]) for s in range(slots)]
    qb = ttnn.concat(parts, dim=0)
    io.free(*parts)
    a = sdpa(qb, cache_k, cache_v)
    io.free(qb)
    end = [a.shape[1], a.shape[2], a.shape[3]]
    parts = [ttnn.slice(a, [s, 0, 0, 0], [s + 1, *end]) for s in range(slots)]
    io.free(a)
    out = ttnn.concat(parts, dim=2)
    io.free(*parts)
    return out
