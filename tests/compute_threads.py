"""Test isolation for in-process commands that pin the process's compute threads (`--reproducible`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits


@contextmanager
def threads_restored() -> Iterator[None]:
    """Gives the test process back what an in-process `--reproducible` command pinned for the rest of its
    process: torch's thread count, every loaded BLAS library's and OPENBLAS_NUM_THREADS."""
    threads, env = torch.get_num_threads(), os.environ.get("OPENBLAS_NUM_THREADS")
    try:
        with threadpool_limits(limits=None):  # restores the BLAS libraries' thread counts on exit
            yield
    finally:
        torch.set_num_threads(threads)
        if env is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = env
