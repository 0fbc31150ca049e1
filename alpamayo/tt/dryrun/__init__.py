"""The ttnn dry run: every device code path through ttnn's own host-side checks on a mock p150, without a card.

ttnn 0.81.1 opens the mock p150 (`TT_METAL_MOCK_CLUSTER_DESC_PATH`) only once it finds the SFPI RISC-V
compiler, which the wheel does not ship. `build_runtime_root` makes, in a directory of the caller's (a
temporary one in `dry_run` and `scripts/ttnn-dryrun`), a runtime root that mirrors the installed `ttnn` package
with symlinks and holds a stand-in compiler (`alpamayo.tt.dryrun.compiler`) at the place tt-metal looks for
SFPI. It is built from the installed ttnn on every run, so no path of one machine is baked in.

Under it `ttnn.open_device` works and every op runs its real host side: argument validation, program
creation, circular-buffer and L1/DRAM allocation, the L1-clash and out-of-memory checks. Nothing executes:
device writes are dropped and reads return zeros, so a dry run proves that ttnn accepts every call at the
planned shapes and memory configs, and nothing about the numbers. Trace capture crashes the mock, so the text
model decodes untraced under a dry run (`TTTextModel.decode` says so once).

tt-metal reads the runtime root once per process, when it first initialises (any host conversion does), so
the environment must be in place before the first ttnn call: `dry_run()` at the start of a process, or the
environment of a child process (`python -m alpamayo.tt.dryrun CMD...`, which `scripts/ttnn-dryrun` runs).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from alpamayo.errors import BackendUnavailable
from alpamayo.tt.runtime import INSTALL_HINT, MOCK_DESCRIPTOR, MOCK_ENV

ROOT_ENV = "TT_METAL_RUNTIME_ROOT"
JIT_CACHE_ENV = "TT_METAL_CACHE"
# tt-metal writes `generated/` (fabric maps, watcher kernel lists) here, else into the working directory.
LOGS_ENV = "TT_METAL_LOGS_PATH"
# Where tt-metal 0.81.1 looks for SFPI under the runtime root (before /opt/tenstorrent/sfpi).
COMPILER = Path("runtime/sfpi/compiler/bin/riscv-tt-elf-g++")
# A file in the root saying it is a dry-run root (what `active()` checks), naming the ttnn it mirrors.
MARKER = "alpamayo-dryrun"
COMPILER_SOURCE = Path(__file__).resolve().with_name("compiler.py")


def ttnn_package_dir() -> Path:
    """The installed `ttnn` package directory, found without importing ttnn (which would initialise it)."""
    spec = importlib.util.find_spec("ttnn")
    if spec is None or not spec.submodule_search_locations:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise BackendUnavailable(
            f"ttnn is not installed in this Python {version} environment; {INSTALL_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def build_runtime_root(directory: Path, ttnn_dir: Path | None = None) -> Path:
    """Build the dry-run runtime root in `directory` (created; must be empty or absent) and return it.

    Every entry of the ttnn package is a symlink to the wheel's own (`tt_metal/`, the headers the JIT build
    names), `runtime/` is a directory whose entries (`hw/`: linker scripts, crt0) link to the wheel's, and
    `runtime/sfpi/compiler/bin/riscv-tt-elf-g++` runs the stand-in compiler with this Python."""
    ttnn_dir = ttnn_dir or ttnn_package_dir()
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"dry-run root {root} is not empty")
    for entry in ttnn_dir.iterdir():
        if entry.name != "runtime":
            (root / entry.name).symlink_to(entry)
    (root / "runtime").mkdir()
    for entry in (ttnn_dir / "runtime").iterdir():
        (root / "runtime" / entry.name).symlink_to(entry)
    compiler = root / COMPILER
    compiler.parent.mkdir(parents=True)
    # -S -I: the stand-in is standard library only and runs for every compile and link, so start bare
    compiler.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -I "{COMPILER_SOURCE}" "$@"\n')
    compiler.chmod(0o755)
    (root / MARKER).write_text(f"ttnn runtime root for the alpamayo dry run, mirroring {ttnn_dir}\n")
    return root


def environment(directory: Path) -> dict[str, str]:
    """The variables of a dry run whose runtime root is `directory/root` (JIT cache `directory/jit-cache`,
    tt-metal's generated files in `directory/logs`): nothing is written outside `directory`."""
    directory = Path(directory)
    return {
        ROOT_ENV: str(directory / "root"),
        MOCK_ENV: str(MOCK_DESCRIPTOR),
        JIT_CACHE_ENV: str(directory / "jit-cache"),
        LOGS_ENV: str(directory / "logs"),
    }


def prepare(directory: Path) -> dict[str, str]:
    """Build a dry run in `directory` (root and JIT cache) and return its environment variables."""
    env = environment(directory)
    build_runtime_root(Path(env[ROOT_ENV]))
    return env


def active(environ: Mapping[str, str] = os.environ) -> bool:
    """ttnn in this environment opens the dry run's mock p150 (a dry-run root and the mock descriptor)."""
    root = environ.get(ROOT_ENV)
    return bool(root and environ.get(MOCK_ENV) and (Path(root) / MARKER).is_file())


@contextmanager
def dry_run(directory: Path | None = None) -> Iterator[dict[str, str]]:
    """Set up a dry run for this process (before its first ttnn call) and yield its environment; the
    variables are restored and a temporary directory (used when `directory` is None) removed on exit."""
    tmp = None if directory is not None else tempfile.mkdtemp(prefix="alpamayo-dryrun-")
    env = prepare(Path(directory or tmp))
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def run(command: list[str]) -> int:
    """Run `command` under a fresh dry run (a temporary root, removed afterwards); its exit status."""
    with tempfile.TemporaryDirectory(prefix="alpamayo-dryrun-") as tmp:
        env = {**os.environ, **prepare(Path(tmp))}
        return subprocess.run(command, env=env, check=False).returncode
