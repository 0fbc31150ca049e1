"""Process-wide numerics set-up, done when `alpamayo` is imported, before torch loads MKL or computes anything.

**MKL_CBWR.** MKL's float32 GEMM picks code paths by memory alignment, so the same weights loaded at other
addresses gave logits differing by up to 3.6e-7 (measured on the golden checkpoints). Conditional numerical
reproducibility makes runs bit-identical on one machine (lock-step replay relies on it). MKL reads it at its
first call.

**MKL's first vector-math call.** torch's float32 `cos`, `sin`, `exp`, `log`, `tanh`, `erf` ... on CPU call MKL's
VML (`vmsCos` etc.; torch 2.14 links MKL 2024.2 statically into libtorch_cpu.so). VML's
`mkl_vml_serv_cpu_detect` caches the CPU type in a static without a lock, in two stores: first the raw type,
then the raw type mapped through a table. A thread whose first VML call reads the cache between the two stores
indexes the kernel table with the raw type: on an AVX-512 Intel CPU raw 9 instead of mapped 5, so the
high-accuracy row (index 9 + 6 = 15 instead of 5 + 6) holds `mkl_vml_kernel_sCos_L9EPnnn`, the "enhanced
performance" kernel that keeps about 11 bits. torch splits a tensor of 2048 elements or more over its threads,
so when the process's first VML call is such a tensor, the worker thread can be that thread. Measured: the lock-
step replay test failed in 10 of 150 fresh runs (an earlier session's host); each time the first call of the
vision rotary tables (`vision.positions.rotary_cos_sin`, [680, 16] float32) had the worker's half, elements
5440-10879, wrong in 5360 of 5440 values by up to 1.5e-4 (2534 ulp), and the first tick's waypoints moved by
0.85 m. Holding one thread under gdb right after the raw store, with MKL's Intel AVX-512 types (raw 9, mapped 5),
and letting a second thread make its first call reproduces exactly that: 5360 of 5440 values, 1.5e-4, 2534 ulp.
On AMD the raw and the mapped type are both 0, so nothing shows (0 of 119 fresh runs on this project's AMD EPYC
host). One element's `cos` on the importing thread right after torch loads fills the cache before any parallel
call (`_warm_vml`); every VML function shares that cache.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType


def prepare() -> None:
    """Set MKL's environment (unless the user set it) and have MKL's vector-math CPU type cached by one call on
    one thread as soon as torch is imported (at once if it already is). Idempotent."""
    os.environ.setdefault("MKL_CBWR", "AUTO")
    if "torch" in sys.modules:
        _warm_vml(sys.modules["torch"])
    elif not any(isinstance(finder, _AfterTorchImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())


def _warm_vml(torch: ModuleType) -> None:
    """One element's cos on this thread (torch runs it serially): MKL's first VML call fills its CPU-type cache."""
    torch.zeros(1).cos()


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch` is about to be imported it takes torch's own spec and has `_warm_vml`
    run once torch's module has executed. It leaves `sys.meta_path` at its first use."""

    def find_spec(
        self, name: str, path: object = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            _warm_vml(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
