"""Shared fixtures: offline golden checkpoints and the figures table printed at the end of the run."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import alpamayo  # noqa: F401  (MKL set-up before torch loads: alpamayo.reproducibility.process)

# Golden numbers are compared across libraries; keep the thread count fixed so runs are repeatable.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_FIGURES: list[tuple[str, str]] = []
# Trace region of the shared dry-run device: nothing is captured on the mock (trace capture crashes it).
DRYRUN_TRACE_REGION = 0


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory):
    """The embedded demo checkpoint (seed 0), built once per run (~4 s)."""
    from alpamayo.demo_release import make_demo_checkpoint

    return make_demo_checkpoint(tmp_path_factory.mktemp("demo") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def device(request):
    """Device 0 of a Blackhole p150 for one `blackhole` test module, closed at the module's end so that the next
    module can open it, with the module's `TRACE_REGION` bytes of trace region (default 64 MiB; the tiny
    models' decode and expert-step traces need ~10-12 MiB)."""
    from alpamayo.tt.device import close_device, open_device

    dev = open_device(getattr(request.module, "TRACE_REGION", 64 << 20))
    yield dev
    close_device(dev)


@pytest.fixture(scope="module")
def golden_device():
    """The ttnn golden mode's device (`alpamayo.tt.golden.GoldenDevice`: nothing is opened) for one module."""
    from alpamayo.tt.device import close_device, open_device

    dev = open_device(0, mode="golden")
    yield dev
    close_device(dev)


@pytest.fixture
def record_figure(request):
    """record_figure("PCC", 0.9999) -> a row in the 'measured figures' table at the end of the run."""

    def record(name: str, value: float | str) -> None:
        text = f"{value:.10g}" if isinstance(value, float) else str(value)
        _FIGURES.append((f"{request.node.name}: {name}", text))

    return record


def pytest_terminal_summary(terminalreporter):
    if _FIGURES:
        terminalreporter.section("measured figures")
        width = max(len(k) for k, _ in _FIGURES)
        for key, value in _FIGURES:
            terminalreporter.write_line(f"{key:<{width}}  {value}")


def pytest_collection_modifyitems(config, items):
    """`cuda` tests skip where torch sees no CUDA device, `blackhole` tests where no p150 can be opened (the
    reason says whether ttnn or the card is missing), `golden` tests where ttnn cannot be imported; each skip
    is conditional on that capability.

    When `dryrun` tests are collected, ttnn is installed and no card or simulator is present, the session
    runs under a dry run built now (before any ttnn call: tt-metal reads its runtime root once per process)
    in a temporary directory; child processes inherit it."""
    no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
    blackhole = [item for item in items if "blackhole" in item.keywords]
    reason = None
    if blackhole:
        from alpamayo.tt.device import device_unavailable_reason

        reason = device_unavailable_reason(dry_run=False)  # imports ttnn (host mode) only for such tests
    if any("dryrun" in item.keywords for item in items):
        _start_dry_run(config)
    no_card = pytest.mark.skipif(reason is not None, reason=f"needs a Blackhole p150: {reason}")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(no_cuda)
    for item in blackhole:
        item.add_marker(no_card)
    golden = [item for item in items if "golden" in item.keywords]
    if golden:
        from alpamayo.errors import BackendUnavailable
        from alpamayo.tt.device import import_ttnn

        try:
            import_ttnn()
            missing = None
        except BackendUnavailable as e:
            missing = str(e)
        no_ttnn = pytest.mark.skipif(
            missing is not None, reason=f"the ttnn golden mode needs ttnn: {missing}"
        )
        for item in golden:
            item.add_marker(no_ttnn)


def _start_dry_run(config) -> None:
    """Put this session under a fresh dry run unless one is already set up, a card or ttsim is present (the
    `dryrun_device` fixture then skips) or ttnn is not installed (it skips with that reason)."""
    from alpamayo.errors import BackendUnavailable
    from alpamayo.tt import dryrun
    from alpamayo.tt.device import card_present, dry_run_active

    if dry_run_active() or card_present():
        return
    try:
        dryrun.ttnn_package_dir()
    except BackendUnavailable:
        return
    directory = tempfile.mkdtemp(prefix="alpamayo-dryrun-")
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    os.environ.update(dryrun.prepare(Path(directory)))


@pytest.fixture(scope="session")
def dryrun_device():
    """The dry run's open mock p150 (`alpamayo.tt.dryrun`), shared by the session's `dryrun` tests; models
    built on it free their weights on close. Skipped where ttnn cannot be imported or no dry run is set up."""
    from alpamayo.errors import BackendUnavailable
    from alpamayo.tt.device import close_device, dry_run_active, import_ttnn, open_device

    try:
        import_ttnn()
    except BackendUnavailable as e:
        pytest.skip(f"ttnn is not importable here: {e}")
    if not dry_run_active():
        pytest.skip(
            "no ttnn dry run in this session (a Blackhole card or ttsim is present, or mark the test dryrun)"
        )
    device = open_device(DRYRUN_TRACE_REGION)
    yield device
    close_device(device)


@pytest.fixture(scope="session")
def ttnn_host():
    """ttnn for host-side work (mock p150 descriptor when no card is present); skipped where not installed."""
    from alpamayo.errors import BackendUnavailable
    from alpamayo.tt.device import import_ttnn

    try:
        return import_ttnn()
    except BackendUnavailable as e:
        pytest.skip(f"ttnn is not importable here: {e}")
