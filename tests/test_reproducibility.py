"""The process set-up every run gets (`alpamayo.reproducibility.process`), checked in fresh processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Prints MKL's VML CPU-type cache (the static `vml_cpu_type` of `mkl_vml_serv_cpu_detect` in torch's statically
# linked MKL, -1 until the process's first vector-math call), found through libtorch_cpu.so's symbol table.
READ_CACHE = """
import ctypes, os, subprocess, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
symbols = {}
for line in subprocess.run(["nm", lib], capture_output=True, text=True).stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[2] in ("mkl_vml_serv_cpu_detect", "mkl_vml_serv_cpu_detect.vml_cpu_type"):
        symbols[parts[2]] = int(parts[0], 16)
if len(symbols) < 2:
    print("absent")
else:
    base = ctypes.cast(ctypes.CDLL(lib).mkl_vml_serv_cpu_detect, ctypes.c_void_p).value
    base -= symbols["mkl_vml_serv_cpu_detect"]
    print(ctypes.c_int.from_address(base + symbols["mkl_vml_serv_cpu_detect.vml_cpu_type"]).value)
"""


def cache_after(imports: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", imports + READ_CACHE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm to find MKL's private cache")
def test_mkls_vector_math_cpu_type_is_cached_on_one_thread_before_any_torch_op():
    # torch alone leaves the cache empty until the first vector-math op, which may run on several threads
    bare = cache_after("")
    if bare == "absent":
        pytest.skip("this torch build has no MKL vector math with a symbol table")
    assert bare == "-1"
    # importing alpamayo first (as every entry point does) has torch's import fill it, on the importing thread
    warmed = cache_after("import alpamayo\n")
    assert warmed != "-1"
    # torch imported before alpamayo: filled when alpamayo is imported
    assert cache_after("import torch\nimport alpamayo\n") == warmed
