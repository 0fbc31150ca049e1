"""Preallocated (static) key/value cache of the text decoder."""

from __future__ import annotations

from collections.abc import Callable

import torch


class KVCache:
    """Per layer, K and V buffers [max_batch, kv_heads, max_seq_len, head_dim], allocated once.

    Static shapes keep the hot path free of allocation (and are what CUDA graphs and device traces need).
    Rows are sequences: a prompt is prefilled into row 0 and `fork(n)` copies it into rows 1..n-1 so that
    n samples share one prefill. `store`, when given, maps K and V on their way in (e.g. to the values a
    device's cache format holds: `alpamayo.tt.quantized.round_to`).
    """

    def __init__(
        self,
        n_layers: int,
        max_batch: int,
        kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        store: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        shape = (max_batch, kv_heads, max_seq_len, head_dim)
        self.store = store
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_batch, self.max_seq_len = max_batch, max_seq_len

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        """Store k, v [B, kv_heads, T, head_dim] at positions [start, start+T) of rows [0, B)."""
        b, _, t, _ = k.shape
        if self.store is not None:
            k, v = self.store(k), self.store(v)
        self.k[layer][:b, :, start : start + t] = k
        self.v[layer][:b, :, start : start + t] = v

    def write_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor, starts: list[int]) -> None:
        """Store row i of k, v [B, kv_heads, T, head_dim] at positions [starts[i], starts[i]+T) of row i
        (ragged rows: each row appends at its own length)."""
        if self.store is not None:
            k, v = self.store(k), self.store(v)
        t = k.shape[2]
        for i, s in enumerate(starts):
            self.k[layer][i, :, s : s + t] = k[i]
            self.v[layer][i, :, s : s + t] = v[i]

    def read(self, layer: int, batch: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of rows [0, batch) and positions [0, end): K, V [batch, kv_heads, end, head_dim]."""
        return self.k[layer][:batch, :, :end], self.v[layer][:batch, :, :end]

    def fork(self, n: int, length: int) -> None:
        """Copy row 0's first `length` positions into rows 1..n-1."""
        for buf in (*self.k, *self.v):
            buf[1:n, :, :length] = buf[:1, :, :length]
