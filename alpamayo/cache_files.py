"""What the on-disk caches of prepared weights share: a content fingerprint and an atomic write.

The ttnn `.tensorbin` cache (`alpamayo.tt.weight_cache`) and the torch backend's packed int8 / int4 cache
(`alpamayo.quant.cache`) both name a file by a digest of the source tensors' bytes, dtypes and shapes plus the
recipe that turns them into the stored form, so a changed checkpoint or recipe never reuses a stale file; and
both write to a temporary name and rename, so a crash leaves no torn file under the real name.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import torch


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of `t` (moved to the host, made contiguous) as one flat buffer."""
    t = t.detach().cpu().contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def content_digest(recipe: object, tensors: Iterable[torch.Tensor]) -> str:
    """16 hex digits (BLAKE2b) of `repr(recipe)` and every tensor's dtype, shape and bytes, in order."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(recipe).encode())
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` to a temporary name beside `path` (same suffix: some writers insist on it), then rename it
    to `path`; the temporary file is removed if `write` fails."""
    tmp = path.with_name(f"{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
