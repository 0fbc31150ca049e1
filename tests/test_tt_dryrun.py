"""The ttnn dry-run kit (`alpamayo.tt.dryrun`, `scripts/ttnn-dryrun`): runtime root, stand-in SFPI compiler,
the mock p150 opening, and the availability check (marked `dryrun`)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from alpamayo.tt import dryrun
from alpamayo.tt.device import RUNTIME_ROOT_ENV, SFPI_COMPILER, device_unavailable_reason, dry_run_active

pytestmark = pytest.mark.dryrun
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ttnn_dir():
    from alpamayo.errors import BackendUnavailable

    try:
        return dryrun.ttnn_package_dir()
    except BackendUnavailable as e:
        pytest.skip(f"ttnn is not importable here: {e}")


@pytest.fixture(scope="module")
def root(ttnn_dir, tmp_path_factory):
    return dryrun.build_runtime_root(tmp_path_factory.mktemp("dry") / "root")


def readelf(*args: str) -> str:
    if shutil.which("readelf") is None:
        pytest.skip("binutils' readelf is not installed: it is the independent ELF parser of this test")
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def test_runtime_root_mirrors_the_installed_ttnn_with_symlinks(root, ttnn_dir):
    for entry in ttnn_dir.iterdir():
        if entry.name != "runtime":
            assert (root / entry.name).resolve() == entry.resolve()
    assert (root / "runtime" / "hw").resolve() == (ttnn_dir / "runtime" / "hw").resolve()
    assert os.access(root / SFPI_COMPILER, os.X_OK)
    assert dry_run_active({RUNTIME_ROOT_ENV: str(root), "TT_METAL_MOCK_CLUSTER_DESC_PATH": "p150.yaml"})
    assert not dry_run_active(
        {RUNTIME_ROOT_ENV: str(ttnn_dir), "TT_METAL_MOCK_CLUSTER_DESC_PATH": "p150.yaml"}
    )
    with pytest.raises(FileExistsError, match="not empty"):
        dryrun.build_runtime_root(root)


def compiler(root: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(root / SFPI_COMPILER), *args], capture_output=True, text=True, cwd=cwd)


def test_stand_in_compiler_answers_versions_and_compiles_to_empty_objects(root, tmp_path):
    assert compiler(root, "--version").stdout.startswith("riscv-tt-elf-g++")
    assert re.fullmatch(r"\d+\.\d+\.\d+\n", compiler(root, "-dumpversion").stdout)
    source = tmp_path / "kernel.cc"
    source.write_text("int main() { return 0; }\n")
    obj, dep = tmp_path / "kernel.o", tmp_path / "kernel.d"
    proc = compiler(
        root, "-O3", "-MMD", "-c", "-o", str(obj), str(source), "-MF", str(dep), "-include", "gone.h"
    )
    assert proc.returncode == 0, proc.stderr
    assert obj.read_bytes() == b""
    assert dep.read_text() == f"{obj}: {source}\n"  # files that do not exist are not dependencies


def link(root: Path, script: str, out: Path, *extra: str) -> None:
    ld = root / "runtime/hw/toolchain/blackhole" / script
    proc = compiler(root, "-Os", "-nostartfiles", f"-T{ld}", "crt0.o", "x.o", *extra, "-o", str(out))
    assert proc.returncode == 0, proc.stderr


def segments(path: Path) -> list[tuple[int, int]]:
    """(virtual, physical) address of every PT_LOAD, as binutils reads them."""
    rows = re.findall(r"^\s*LOAD\s+\S+\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)", readelf("-l", str(path)), re.M)
    return [(int(v, 16), int(p, 16)) for v, p in rows]


def symbols(path: Path) -> dict[str, int]:
    rows = re.findall(
        r"^\s*\d+:\s+([0-9a-f]+)\s+\d+\s+\w+\s+GLOBAL\s+\w+\s+\S+\s+(\S+)$", readelf("-s", str(path)), re.M
    )
    return {name: int(value, 16) for value, name in rows}


def test_stand_in_links_rv32_executables_that_kernels_link_against(root, tmp_path):
    firmware, kernel = tmp_path / "brisc.elf", tmp_path / "brisck.elf"
    link(root, "firmware_brisc.ld", firmware)
    link(root, "kernel_brisc.ld", kernel, f"-Wl,--just-symbols={firmware}")
    header = readelf("-h", str(firmware))
    assert "ELF32" in header and "RISC-V" in header and "EXEC" in header and "little endian" in header
    fw, k = symbols(firmware), symbols(kernel)
    assert set(fw) == {"_start", "__fw_export_text_end", "__fw_export_ldm_end", "__ldm_data_start"}
    (fw_text, _), (fw_data, _) = segments(firmware)
    assert fw["_start"] == fw_text and fw["__ldm_data_start"] == fw_data
    assert fw["__fw_export_text_end"] > fw_text and fw["__fw_export_ldm_end"] > fw_data
    # the kernel's text follows the firmware's, its data runs after the firmware's data but loads after its text
    (k_text, _), (k_data, k_data_lma) = segments(kernel)
    assert k_text == fw["__fw_export_text_end"] == k["_start"]
    assert k_data == fw["__fw_export_ldm_end"] == k["__ldm_data_start"]
    assert k_text < k_data_lma <= k_text + 16
    assert re.search(r"\.rela\.text\s+RELA\s+\S+\s+\S+\s+000000\s", readelf("-S", str(kernel)))  # empty
    again = tmp_path / "again.elf"  # the same script and firmware: the ELF comes from the link cache
    link(root, "kernel_brisc.ld", again, f"-Wl,--just-symbols={firmware}")
    assert again.read_bytes() == kernel.read_bytes()
    assert len(list((root / "link-cache").glob("kernel_brisc.ld.*.elf"))) == 1


def test_dry_run_opens_a_blackhole_mock_whose_ops_run_their_host_side(dryrun_device):
    import torch

    from alpamayo.tt.device import import_ttnn

    ttnn = import_ttnn()
    assert dryrun_device.arch() == ttnn.device.Arch.BLACKHOLE
    grid = dryrun_device.compute_with_storage_grid_size()
    assert (grid.x, grid.y) == (13, 10)
    a = ttnn.from_torch(torch.ones(1, 1, 64, 128), layout=ttnn.TILE_LAYOUT, device=dryrun_device)
    b = ttnn.from_torch(torch.ones(1, 1, 128, 96), layout=ttnn.TILE_LAYOUT, device=dryrun_device)
    out = ttnn.matmul(a, b)
    assert tuple(out.shape) == (1, 1, 64, 96)
    assert not ttnn.to_torch(out).any()  # nothing executes: device reads return zeros
    with pytest.raises(RuntimeError, match="width of the first tensor must be equal to the height"):
        ttnn.matmul(b, b)  # ttnn's own validation still runs
    ttnn.deallocate(a), ttnn.deallocate(b), ttnn.deallocate(out)


def test_availability_accepts_the_dry_run_but_the_blackhole_tests_need_a_card(dryrun_device):
    assert device_unavailable_reason() is None
    reason = device_unavailable_reason(dry_run=False)
    assert "dry run" in reason and "runs no kernels" in reason


def test_script_runs_a_command_under_a_fresh_dry_run_and_removes_it(tmp_path, ttnn_dir):
    code = f"import os; from alpamayo.tt.device import dry_run_active; print(dry_run_active(), os.environ[{RUNTIME_ROOT_ENV!r}])"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    env.pop(RUNTIME_ROOT_ENV, None)
    proc = subprocess.run(
        [str(REPO / "scripts/ttnn-dryrun"), sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    active, root = proc.stdout.split()
    assert active == "True" and not Path(root).exists()  # built for the run, removed after it
    shell = subprocess.run(
        [str(REPO / "scripts/ttnn-dryrun"), "--env", str(tmp_path / "kept")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert f"export {RUNTIME_ROOT_ENV}={tmp_path / 'kept' / 'root'}" in shell.stdout
    assert (tmp_path / "kept" / "root" / SFPI_COMPILER).is_file()


def test_script_passes_sigterm_on_and_removes_the_root_after_the_command(ttnn_dir):
    """A timeout stopping `scripts/ttnn-dryrun` stops the command too, before its root is removed."""
    code = (
        f"import os, time; print(os.getpid(), os.environ[{RUNTIME_ROOT_ENV!r}], flush=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    script = subprocess.Popen(
        [str(REPO / "scripts/ttnn-dryrun"), sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    pid, root = script.stdout.readline().split()
    assert Path(root).is_dir()
    script.terminate()
    assert script.wait(timeout=30) == 128 + signal.SIGTERM  # the command's status: it got the signal
    assert not Path(root).exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)
