"""Intra-op threads of a few-row forward on CPU: element-wise ops on one thread, matmuls and attention on all.

torch runs an element-wise op or reduction on its thread pool once it has 32768 elements (its grain size). A
verify of 8 tokens crosses that ([8, 4096] norms, [8, 12288] SiLU products) where a decode step never does,
and on a loaded machine every such parallel region waits for the pool's other threads to be scheduled.
Measured on the 2 shared cores under load (8B text shape, 2 layers, context 1024, `benchmarks/speculative.py`'s
op breakdown): a verify of 8 spent 296 ms in the element-wise rest against 2 ms for a decode step, its
linears 672 ms against 603; with the element-wise ops on one thread a verify of 8 went from 1.57x to 1.19x a
decode step (medians of 5 interleaved rounds), its logits bitwise equal (element-wise results do not depend
on the thread count; the row reductions split over rows). Each op here is tens of microseconds, so one
thread costs nothing measurable when the machine is idle.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# token rows (batch x block) up to which `few_rows` applies: a DFlash block of 8, up to 16 verified tokens
SERIAL_ROWS = 16

_wide: int | None = None  # inside `few_rows`: the thread count `wide` restores


@contextmanager
def few_rows(rows: int, device: torch.device) -> Iterator[None]:
    """While a forward of `rows` token rows runs on CPU with 1 < rows <= SERIAL_ROWS, intra-op threads are 1
    except inside `wide`; elsewhere (one row, more rows, other devices, one thread, nested) nothing changes."""
    global _wide
    threads = torch.get_num_threads()
    if not 1 < rows <= SERIAL_ROWS or device.type != "cpu" or threads == 1 or _wide is not None:
        yield
        return
    _wide = threads
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _wide = None


@contextmanager
def wide() -> Iterator[None]:
    """Every thread for one matmul or attention kernel inside `few_rows`; outside it, nothing changes."""
    if _wide is None:
        yield
        return
    torch.set_num_threads(_wide)
    try:
        yield
    finally:
        torch.set_num_threads(1)
