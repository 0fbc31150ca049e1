"""`alpamayo serve` stops with exit status 0 from any state: SIGTERM during its imports, when idle, in the
middle of a prediction (cancelled at its next step), and on `alpamayo node-ctl shutdown`. Each stop's time is
printed in the measured figures (benchmarks/node_hardening.py measures them on a quiet host); the last output
says why the node stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from alpamayo.cli import COMMANDS, build_parser, command_name
from bridges.wire.client import ControlClient, TrajectorySubscriber
from bridges.wire.protocol import TrajectoryMessage
from tests.bridge_nodes import wait_until
from tests.test_bridge_serve import camera_sim, sigterm_during_imports, start_serve, stop


def outputs_until_closed(sub: TrajectorySubscriber) -> list[TrajectoryMessage]:
    """Every output still to come, until none arrives for 2 s (the node has closed its output)."""
    out = []
    while (msg := sub.recv(2.0)) is not None:
        out.append(msg)
    return out


def exit_after(proc: subprocess.Popen, sig: signal.Signals | None = signal.SIGTERM) -> tuple[int, float]:
    """Send `sig` (None: nothing, the stop was asked otherwise) and wait; (exit status, seconds to exit)."""
    start = time.monotonic()
    if sig is not None:
        proc.send_signal(sig)
    return proc.wait(60), time.monotonic() - start


def test_sigterm_during_the_imports_exits_0(record_figure):
    status, elapsed, out, err = sigterm_during_imports()
    record_figure("SIGTERM during the imports: exit after (s)", elapsed)
    assert status == 0
    assert "alpamayo serve: SIGTERM received during start-up: exiting" in err and "serving:" not in out


def test_sigterm_when_idle_exits_0_and_the_last_output_says_why(record_figure):
    serve, endpoints = start_serve("--no-model")
    try:
        with TrajectorySubscriber(endpoints["output"]) as sub:
            assert sub.recv(5.0) is not None  # the stale-input outputs, one a period
            code, elapsed = exit_after(serve)
            outputs = outputs_until_closed(sub)
    finally:
        stop(serve)
    record_figure("SIGTERM when idle: exit after (s)", elapsed)
    assert code == 0
    last = outputs[-1]
    assert not last.valid and last.t0_ns is None
    assert last.invalid_reasons == ["node stopped: SIGTERM received"]
    assert serve.stdout.read().rstrip().endswith("stopped\nalpamayo serve: SIGTERM received: stopped")


def test_sigterm_mid_prediction_cancels_it_at_its_next_step_and_exits_0(demo_checkpoint, record_figure):
    serve, endpoints = start_serve(
        "--checkpoint",
        str(demo_checkpoint),
        "--set",
        "warmup.runs=0",
        "--set",
        "model.max_reasoning_tokens=4096",  # the demo model reasons until the cap: thousands of decode steps
        "--set",
        "timing.stale_after_ms=600000",
        # the cancellation, not the time: a step (the first prefill) may take longer than the default 0.5 s on a
        # loaded host, and would then be abandoned (benchmarks/node_hardening.py times the default)
        "--set",
        "timing.shutdown_timeout_s=60",
    )
    sim = None
    try:
        with TrajectorySubscriber(endpoints["output"]) as sub, ControlClient(endpoints["control"]) as ctl:
            sim = camera_sim(endpoints["input"][0], 3.0, "--speedup", "10")
            status = wait_until(
                lambda: (s := ctl.status())["prediction_running_s"] is not None and s, 300.0, "a prediction"
            )
            assert status["counters"]["predictions"] == 0
            code, elapsed = exit_after(serve)
            outputs = outputs_until_closed(sub)
    finally:
        stop(serve, sim)
    record_figure("SIGTERM mid-prediction: exit after (s)", elapsed)
    assert code == 0
    last = outputs[-1]
    assert last.invalid_reasons == ["node stopped: SIGTERM received, prediction cancelled"]
    assert (
        not last.valid and last.t0_ns is not None and len(last.cameras) == 2
    )  # the window it was predicting
    assert (
        serve.stdout.read()
        .rstrip()
        .endswith(
            "stopped (prediction cancelled)\nalpamayo serve: SIGTERM received: stopped, prediction cancelled"
        )
    )


def test_node_ctl_shutdown_exits_0_and_so_does_the_node(record_figure):
    serve, endpoints = start_serve("--no-model")
    try:
        with TrajectorySubscriber(endpoints["output"]) as sub:
            assert sub.recv(5.0) is not None
            start = time.monotonic()
            ctl = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "alpamayo.cli",
                    "node-ctl",
                    "shutdown",
                    "--control",
                    endpoints["control"],
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            node_ctl_s = time.monotonic() - start
            code, node_s = exit_after(serve, None)
            outputs = outputs_until_closed(sub)
    finally:
        stop(serve)
    record_figure("node-ctl shutdown: node-ctl exits after (s)", node_ctl_s)
    record_figure("node-ctl shutdown: the node exits after node-ctl's exit (s)", node_s)
    assert ctl.returncode == 0, ctl.stdout + ctl.stderr
    assert '"cmd": "shutdown"' in ctl.stdout
    assert code == 0
    assert outputs[-1].invalid_reasons == ["node stopped: shutdown requested over the control socket"]


def test_main_imports_only_the_named_command_and_each_module_registers_its_name():
    """`alpamayo node-ctl` must not pay for torch: `main` imports the one module named by `command_name`."""
    for module in COMMANDS:
        (action,) = build_parser([module])._subparsers._group_actions
        assert list(action.choices) == [command_name(module)]
    probe = (
        "import sys\nfrom alpamayo.cli import main\ntry:\n    main(['node-ctl', '--help'])\nexcept SystemExit:\n"
        "    pass\nprint('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("False"), done.stderr
