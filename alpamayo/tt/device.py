"""The one place that imports `ttnn` and opens the Blackhole device.

Importing `alpamayo` (or `alpamayo.tt`) never imports `ttnn`: every ttnn user calls `import_ttnn()`, and
the models take the `ttnn` they run on from their device (`ttnn_for`), so the mode is the device's:

* `device` (default): a card, ttsim, or the dry run's mock p150 (`alpamayo.tt.dryrun`);
* `golden`: no device is opened; `open_device` returns an `alpamayo.tt.golden.GoldenDevice` and the models
  run every op through ttnn's golden functions on the host (`alpamayo.tt.golden`). Chosen with
  `--tt-mode golden` (`BackendOptions.tt_mode`) or `ALPAMAYO_TT_MODE=golden`.

Without a card, ttnn 0.81.1 cannot even convert a tensor on the host (`TT_FATAL … No chips detected`, measured
in ../shared/reference/ttmetal.md §4.1) unless `TT_METAL_MOCK_CLUSTER_DESC_PATH` names a cluster descriptor.
So when no card is present and the variable is unset, `import_ttnn()` points it at the one-chip p150 descriptor
shipped beside this module before ttnn initialises its cluster. Host work then runs (tilize, bfloat8_b /
bfloat4_b packing, `.tensorbin` dump/load); opening a device does not, and `open_device()` says so up front.
With a card present the variable is left alone, since it would make ttnn open a mock device instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alpamayo.errors import BackendUnavailable

MOCK_ENV = "TT_METAL_MOCK_CLUSTER_DESC_PATH"
SIMULATOR_ENV = "TT_METAL_SIMULATOR"
SLOW_DISPATCH_ENV = "TT_METAL_SLOW_DISPATCH_MODE"
RUNTIME_ROOT_ENV = "TT_METAL_RUNTIME_ROOT"  # default: the ttnn package directory
MODE_ENV = "ALPAMAYO_TT_MODE"
MODES = ("device", "golden")
# Where tt-metal 0.81.1 looks for the SFPI RISC-V compiler (kernels and firmware are compiled for the chip):
# under the runtime root, then the system install; the compiler sits at the same place in both SFPI trees.
SFPI_BINARY = Path("compiler/bin/riscv-tt-elf-g++")
SFPI_COMPILER = Path("runtime/sfpi") / SFPI_BINARY
SYSTEM_SFPI = Path("/opt/tenstorrent/sfpi")
MOCK_DESCRIPTOR = Path(__file__).resolve().with_name("p150_mock_cluster.yaml")
# The Tenstorrent kernel driver (tt-kmd) creates one character device per card here.
DEVICE_DIR = Path("/dev/tenstorrent")
# The file that marks a runtime root as the dry run's (`alpamayo.tt.dryrun` writes it).
DRY_RUN_MARKER = "alpamayo-dryrun"
INSTALL_HINT = (
    "install the 'tt' extra (pip install -e '.[tt]'); ttnn 0.81.1 has wheels for CPython 3.10 and 3.12 "
    "on x86_64 Linux"
)


def card_present() -> bool:
    """A Blackhole card (tt-kmd device node) is present or the ttsim simulator (`TT_METAL_SIMULATOR`) named:
    either way ttnn must not be pointed at the mock descriptor."""
    if os.environ.get(SIMULATOR_ENV):
        return True
    return DEVICE_DIR.is_dir() and any(DEVICE_DIR.iterdir())


def configure_host_mode() -> None:
    """Point ttnn at the shipped p150 mock descriptor when no card is present (and nothing else was chosen)."""
    if not card_present() and not os.environ.get(MOCK_ENV):
        os.environ[MOCK_ENV] = str(MOCK_DESCRIPTOR)


def import_ttnn() -> Any:
    """The `ttnn` module, host mode configured first; `BackendUnavailable` when it is not installed."""
    configure_host_mode()
    try:
        import ttnn
    except ImportError as e:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise BackendUnavailable(
            f"ttnn is not installed in this Python {version} environment ({e}); {INSTALL_HINT}"
        ) from e
    return ttnn


def tt_mode(mode: str | None = None) -> str:
    """The ttnn backend's mode: `mode`, else `ALPAMAYO_TT_MODE`, else "device"; ValueError for another."""
    mode = mode or os.environ.get(MODE_ENV) or "device"
    if mode not in MODES:
        raise ValueError(f"ttnn mode must be one of {list(MODES)}, got {mode!r} ({MODE_ENV} or --tt-mode)")
    return mode


def is_golden(device: Any) -> bool:
    """`device` is the golden mode's (no device opened)."""
    from alpamayo.tt.golden.device import GoldenDevice

    return isinstance(device, GoldenDevice)


def ttnn_for(device: Any) -> Any:
    """The `ttnn` the models on `device` call: the golden mode's `GoldenTTNN` for a `GoldenDevice`, else the
    ttnn module."""
    return device.ttnn if is_golden(device) else import_ttnn()


def is_dry_run_root(root: str | Path | None) -> bool:
    """`root` (a `TT_METAL_RUNTIME_ROOT` value) is a dry-run runtime root (it holds the `DRY_RUN_MARKER` file).

    Here rather than in `alpamayo.tt.dryrun`, which builds such roots on top of this module: the runtime only
    needs to recognise one."""
    if not root:  # unset or empty
        return False
    return (Path(root) / DRY_RUN_MARKER).is_file()


def dry_run_active(environ: Mapping[str, str] = os.environ) -> bool:
    """ttnn in this environment opens the dry run's mock p150 (a dry-run root and the mock descriptor)."""
    return bool(environ.get(MOCK_ENV)) and is_dry_run_root(environ.get(RUNTIME_ROOT_ENV))


def device_unavailable_reason(dry_run: bool = True, mode: str | None = None) -> str | None:
    """None when a ttnn model can run here; otherwise why not (ttnn missing, or no Blackhole device).

    The dry run's mock p150 (`alpamayo.tt.dryrun`) counts as a device unless `dry_run` is False (the
    `blackhole` tests, which check numbers that the mock does not compute). In the golden mode (`tt_mode`)
    only ttnn itself is needed."""
    try:
        import_ttnn()
    except BackendUnavailable as e:
        return str(e)
    if tt_mode(mode) == "golden":
        return None
    root = os.environ.get(RUNTIME_ROOT_ENV)
    if dry_run_active():
        if dry_run:
            return None
        return f"the ttnn dry run ({RUNTIME_ROOT_ENV}={root}) opens a mock p150 that runs no kernels"
    simulator = os.environ.get(SIMULATOR_ENV)
    if simulator:
        if (problem := simulator_problem(Path(simulator))) is not None:
            return problem
    elif not card_present():
        return (
            f"ttnn is installed but no Blackhole device is present ({DEVICE_DIR} has no card "
            f"and {SIMULATOR_ENV} is unset); host-side work such as `alpamayo plan` still runs, and "
            "`scripts/ttnn-dryrun` runs the ttnn backend's host side on a mock p150"
        )
    elif mock := os.environ.get(MOCK_ENV):
        return f"{MOCK_ENV}={mock} makes ttnn open a mock device; unset it to use the card"
    target = f"ttsim ({simulator})" if simulator else "the card"
    if is_dry_run_root(root):
        return f"{RUNTIME_ROOT_ENV}={root} is a dry-run root whose stand-in compiler builds no kernels for {target}"
    if sfpi_compiler() is None:
        return (
            f"{target} runs real kernels, compiled by the SFPI RISC-V compiler, which is neither at "
            f"{ttnn_runtime_root() / SFPI_COMPILER} nor under {SYSTEM_SFPI}; install the SFPI release that "
            f"{ttnn_runtime_root() / 'tt_metal/sfpi-version'} names"
        )
    return None


def ttnn_runtime_root() -> Path:
    """The tt-metal runtime root: `TT_METAL_RUNTIME_ROOT`, else the installed ttnn package directory."""
    root = os.environ.get(RUNTIME_ROOT_ENV)
    return Path(root) if root else Path(import_ttnn().__file__).resolve().parent


def sfpi_compiler() -> Path | None:
    """The SFPI compiler tt-metal will use (under the runtime root, else the system install), or None."""
    for compiler in (ttnn_runtime_root() / SFPI_COMPILER, SYSTEM_SFPI / SFPI_BINARY):
        if compiler.is_file():
            return compiler
    return None


def simulator_problem(simulator: Path) -> str | None:
    """Why ttnn cannot open the ttsim Blackhole simulator `simulator` (libttsim.so) here, or None."""
    if not simulator.is_file():
        return f"{SIMULATOR_ENV}={simulator} is not a file (build libttsim.so from Tenstorrent's ttsim, docs/ttnn.md)"
    if not (simulator.parent / "soc_descriptor.yaml").is_file():
        soc = ttnn_runtime_root() / "tt_metal/soc_descriptors/blackhole_140_arch.yaml"
        return f"ttsim reads soc_descriptor.yaml beside {simulator}: copy {soc} there"
    if os.environ.get(SLOW_DISPATCH_ENV) != "1":
        return f"ttsim needs slow dispatch: set {SLOW_DISPATCH_ENV}=1"
    if mock := os.environ.get(MOCK_ENV):
        return f"{MOCK_ENV}={mock} is set beside {SIMULATOR_ENV}: unset it to open the simulated Blackhole"
    return None


def open_device(trace_region_size: int, mode: str | None = None) -> Any:
    """Open Blackhole device 0 with a trace region of `trace_region_size` bytes (for the decode trace); in
    the golden mode (`tt_mode(mode)`) a `GoldenDevice`, opening nothing."""
    reason = device_unavailable_reason(mode=mode)
    if reason is not None:
        raise BackendUnavailable(reason)
    ttnn = import_ttnn()
    if tt_mode(mode) == "golden":
        from alpamayo.tt.golden.device import GoldenDevice

        return GoldenDevice(ttnn, trace_region_size)
    device = ttnn.open_device(device_id=0, trace_region_size=trace_region_size)
    arch = device.arch()
    if arch != ttnn.device.Arch.BLACKHOLE:
        ttnn.close_device(device)
        raise BackendUnavailable(f"device 0 is {arch}; the ttnn backend targets a Blackhole p150")
    return device


def close_device(device: Any) -> None:
    if is_golden(device):
        device.close()
    else:
        import_ttnn().close_device(device)
