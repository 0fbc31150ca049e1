"""How soon `alpamayo serve` exits 0 after SIGTERM, in each phase where work may still be running.

The requirement (docs/protocol.md, "Shutdown") is an exit within a second during the model load and during the
warm-up predictions; serving with no prediction in progress is measured beside them. The tests check that the exit is clean and abandons the work
(tests/test_bridge_serve.py) but cannot assert a time on a shared machine; this measures it, `--rounds` times
per phase, each a fresh `alpamayo serve` of the demo checkpoint (built once in a temporary directory):

  * load: SIGTERM right after "loading model from" is printed (the load runs on a worker thread);
  * warmup: SIGTERM once serving, during `warmup.runs=100` predictions at the default 1080p (minutes of work);
  * serving: SIGTERM once ready (`warmup.runs=0`), no frames coming in (no requirement: reported).

    python -m benchmarks.node_shutdown [--rounds 5] [--phase load warmup serving] [--json out.json]    (from the checkout root)

Prints per phase the median and the worst seconds from the signal to the exit, the exit codes, and for load
and warm-up whether every exit was 0 and within the second.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOPBACK = "tcp://127.0.0.1:*"
REQUIREMENT_S = 1.0
WAIT_S = 30.0  # a run that has not exited by then counts as a hang
PHASES = {"load": ["warmup.runs=0"], "warmup": ["warmup.runs=100"], "serving": ["warmup.runs=0"]}
REQUIRED = ("load", "warmup")


def exit_after_signal(checkpoint: Path, phase: str) -> tuple[float, int]:
    """(seconds from SIGTERM to the exit, exit code) of one `alpamayo serve` signalled in `phase`."""
    cmd = [sys.executable, "-m", "alpamayo.cli", "serve", "--checkpoint", str(checkpoint)]
    cmd += ["--input", LOOPBACK, "--output", LOOPBACK, "--control", LOOPBACK]
    cmd += [arg for item in PHASES[phase] for arg in ("--set", item)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        marker = "loading model from " if phase == "load" else "serving: "
        for line in proc.stdout:
            if line.startswith(marker):
                break
        if phase == "serving":
            time.sleep(0.5)  # past the start-up, into the serving loop
        start = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(WAIT_S)
        return time.perf_counter() - start, code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--phase", nargs="+", choices=sorted(PHASES), default=list(PHASES))
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    from alpamayo.demo_release import make_demo_checkpoint

    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_demo_checkpoint(Path(tmp) / "ckpt", seed=0)
        for phase in args.phase:
            runs = [exit_after_signal(checkpoint, phase) for _ in range(args.rounds)]
            seconds = [s for s, _ in runs]
            figures[phase] = {
                "median_s": statistics.median(seconds),
                "max_s": max(seconds),
                "exit_codes": sorted({c for _, c in runs}),
            }
            f = figures[phase]
            line = f"{phase:8s} SIGTERM -> exit: median {f['median_s']:.3f} s, max {f['max_s']:.3f} s, exit codes {f['exit_codes']}"
            if phase in REQUIRED:
                f["meets_requirement"] = all(c == 0 and s <= REQUIREMENT_S for s, c in runs)
                line += f", every exit 0 within {REQUIREMENT_S:g} s: {f['meets_requirement']}"
            print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
