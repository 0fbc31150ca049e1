"""`--reproducible` (YAML `reproducible: true`): outputs that do not depend on how many threads compute them.

A float32 reduction split over another number of threads rounds differently. Seen in this project: MKL's GEMM
on an Intel (AMX) host, where an eval clip's ade@1s was 0.288 m on one torch thread against 0.283 m on two;
OpenBLAS under numpy and scipy, where the closed loop's planner matmuls put a waypoint 5.7e-14 m apart with two
OpenBLAS threads. So an in-process run, a Ray worker given one CPU and a machine with more cores could each
publish other bytes for the same inputs. (On this project's AMD host MKL's generic code path does not split
the reductions it runs, so the torch side happens to agree there.)

The mode fixes the partition: the process computes on one torch (OpenMP and MKL) thread and one BLAS thread
(numpy's and scipy's OpenBLAS), whatever it was given, so every run of the same inputs gives the same bytes on
any thread count and any worker layout. MKL's own switch for this (MKL_CBWR=...,STRICT) is read once, at MKL's
first call, which happens when torch is imported (`alpamayo.reproducibility.process`), before a command has
read its flags. Cost: the parallel speed-up of the torch CPU backend (`benchmarks/reproducible.py`,
docs/eval.md). Other devices (CUDA, ttnn) are not changed by it.
"""

from __future__ import annotations

import os

import torch
from threadpoolctl import threadpool_limits


def compute_on_one_thread() -> None:
    """One torch intra-op thread (OpenMP and MKL) and one thread for every BLAS library, for the rest of the
    process: the loaded ones now (numpy's and scipy's OpenBLAS), one loaded later by its environment variable."""
    torch.set_num_threads(1)
    threadpool_limits(limits=1, user_api="blas")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
