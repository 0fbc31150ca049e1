"""Worker faults for the fleet-evaluation tests: kill a Ray worker process of this test session while it is
inside a clip. Ray titles an actor's process `ray::ClipEvaluator.evaluate` while that method runs, and the
session's workers inherit MARKER_ENV from the driver, which tells them apart from any other Ray on the machine."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

MARKER_ENV = "ALPAMAYO_TEST_RAY_SESSION"
INSIDE_A_CLIP = b"ray::ClipEvaluator.evaluate"
POLL_S = 0.02  # a demo clip takes about a second


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended, or is not ours to read
        return b""


def evaluating_workers(marker: str) -> list[int]:
    """Pids of this session's Ray workers that are evaluating a clip right now (Linux /proc)."""
    tag = f"{MARKER_ENV}={marker}".encode()
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and _read(entry / "cmdline").startswith(INSIDE_A_CLIP)
        and tag in _read(entry / "environ").split(b"\0")
    ]


class KillInsideAClip(threading.Thread):
    """Kills (SIGKILL) the first of the session's workers seen inside a clip; `killed` is its pid."""

    def __init__(self, marker: str):
        super().__init__(daemon=True)
        self.marker = marker
        self.killed: int | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = evaluating_workers(self.marker)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                self.killed = pids[0]
                return
            time.sleep(POLL_S)
