"""The persistent inputs of a decode program, and the row layout a verify block gives them.

A decode program of B rows (`program_rows`) reads its embedding rows, cos, sin and cache positions (and, on a
verify block's paged path, its page table, K/V write passes and the block attention's inputs) from device
tensors that are rewritten in place before each run, so the program can be captured as a trace and replayed
(`alpamayo.tt.text.decode`). `DecodeInputs` holds them: host tensors as built, or their device copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.plan.programs.text import BLOCK_SDPA_POSITIONS

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
    slot pages[r] (`DecoderLayer.block_sdpa`): every run of consecutive rows on one slot (one sequence's
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
    user g (the query heads that K/V head g serves), 0 elsewhere (`DecoderLayer.block_sdpa`)."""
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


ProgramKey = tuple[int, bool, tuple[int, ...], int]  # `DecodeInputs.key`


class Shaped(Protocol):
    """A host (`torch.Tensor`) or device (`ttnn.Tensor`) tensor: what `DecodeInputs` reads of its tensors."""

    @property
    def shape(self) -> Any: ...


T = TypeVar("T", bound=Shaped)
U = TypeVar("U", bound=Shaped)


@dataclass
class DecodeInputs(Generic[T]):
    """A decode program's persistent inputs for B rows, host tensors (`torch.Tensor`) or their device copies:
    x [1, 1, 32, H_p] bf16 (row b: its token's embedding), cos and sin [1, B, 1, head_dim] bf16, pos [B]
    int32 (row b's cache index). On a verify block's paged path also `page` [B, 1] int32 (row b's cache slot)
    and `kv_write` [B] int32 per K/V write pass (`kv_write_passes`); where `block_sdpa_applies`, per block
    attention call c of `block_chunks` `kv_pos[c]` [n_kv * n] and `kv_page[c]` [n_kv, 1] int32, and with
    several K/V heads `head_select` [n_kv, 1, 32, head_dim] bf16 (`DecoderLayer.block_sdpa`)."""

    x: T
    cos: T
    sin: T
    pos: T
    page: T | None = None
    kv_write: list[T] = field(default_factory=list)
    kv_pos: list[T] = field(default_factory=list)
    kv_page: list[T] = field(default_factory=list)
    head_select: T | None = None

    def key(self) -> ProgramKey:
        """What fixes the program's graph: (rows, paged, the block attention's rows per call: `block_chunks`'
        sizes, () on the per-row path, the K/V write passes: `kv_write_passes`, 0 unpaged). The slots and
        positions are values of the inputs, rewritten before each replay."""
        chunks = tuple(p.shape[0] // g.shape[0] for p, g in zip(self.kv_pos, self.kv_page, strict=True))
        return self.pos.shape[0], self.page is not None, chunks, len(self.kv_write)

    @property
    def rows(self) -> int:
        return int(self.pos.shape[0])

    def map(self, fn: Callable[[T], U]) -> DecodeInputs[U]:
        """`fn` of every tensor, in the order of `tensors()`."""
        x, cos, sin, pos = fn(self.x), fn(self.cos), fn(self.sin), fn(self.pos)
        page = None if self.page is None else fn(self.page)
        kv_write = [fn(w) for w in self.kv_write]
        kv_pos: list[U] = []
        kv_page: list[U] = []
        for p, g in zip(self.kv_pos, self.kv_page, strict=True):
            kv_pos.append(fn(p))
            kv_page.append(fn(g))
        select = None if self.head_select is None else fn(self.head_select)
        return DecodeInputs(x, cos, sin, pos, page, kv_write, kv_pos, kv_page, select)

    def tensors(self) -> list[T]:
        """Every tensor: x, cos, sin, pos, page, the write passes, each call's positions and page table, the
        head selection (those present)."""
        out = [self.x, self.cos, self.sin, self.pos]
        out += [self.page] if self.page is not None else []
        out += self.kv_write
        for p, g in zip(self.kv_pos, self.kv_page, strict=True):
            out += [p, g]
        out += [self.head_select] if self.head_select is not None else []
        return out
