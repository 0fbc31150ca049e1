"""Shared fixtures: offline golden checkpoints and the figures table printed at the end of the run."""

from __future__ import annotations

import os

import pytest
import torch

import alpamayo  # noqa: F401  (sets MKL_CBWR before torch loads MKL)

# Golden numbers are compared across libraries; keep the thread count fixed so runs are repeatable.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_FIGURES: list[tuple[str, str]] = []


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory):
    """The embedded demo checkpoint (seed 0), built once per run (~4 s)."""
    from alpamayo.demo_checkpoint import make_demo_checkpoint

    return make_demo_checkpoint(tmp_path_factory.mktemp("demo") / "ckpt", seed=0)


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
    reason says whether ttnn or the card is missing); each skip is conditional on that capability."""
    no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
    blackhole = [item for item in items if "blackhole" in item.keywords]
    reason = None
    if blackhole:
        from alpamayo.tt.runtime import device_unavailable_reason

        reason = device_unavailable_reason()  # imports ttnn (host mode) only when such tests are collected
    no_card = pytest.mark.skipif(reason is not None, reason=f"needs a Blackhole p150: {reason}")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(no_cuda)
    for item in blackhole:
        item.add_marker(no_card)


@pytest.fixture(scope="session")
def ttnn_host():
    """ttnn for host-side work (mock p150 descriptor when no card is present); skipped where not installed."""
    from alpamayo.errors import BackendUnavailable
    from alpamayo.tt.runtime import import_ttnn

    try:
        return import_ttnn()
    except BackendUnavailable as e:
        pytest.skip(f"ttnn is not importable here: {e}")
