"""What a measurement ran on: hardware, software versions and the source commit, recorded in every profile,
trace and replay output (tt-metal pins each published figure to a release and commit)."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit() -> str:
    """`git rev-parse HEAD` of this checkout, suffixed "-dirty" with uncommitted changes; "unknown" outside
    a git checkout (an installed wheel)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(_REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(_REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def hardware(device: str) -> dict[str, object]:
    """CPU model and cores, torch threads, machine and OS, and the CUDA device's name when `device` is one."""
    info: dict[str, object] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "os": platform.platform(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(torch.device(device))
    return info


def software() -> dict[str, str | None]:
    """Python and package versions (None for a package not installed)."""
    return {
        "python": platform.python_version(),
        **{name: _version(name) for name in ("alpamayo-tt", "torch", "transformers", "ttnn")},
    }
