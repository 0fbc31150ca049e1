"""SIGINT and SIGTERM for a command that runs until stopped (`alpamayo serve`), from the first line of
`alpamayo.cli.main`, before the command's imports (torch, seconds of them), to the command's return.

Light on purpose (standard library only): installed before anything heavy is imported. Until the command takes
the signals over (`take_over`), a signal ends the process at once with exit status 0: nothing has started
that needs stopping, and a supervisor (systemd, a vehicle's process manager) stopping a service during its
start-up expects a clean exit, not death by the signal. A handler runs between two Python bytecodes of the main
thread, so a signal that arrives during one long C call (loading torch's extension module takes the longest:
0.7-2.2 s measured with `-X importtime` on 2 cores shared with other work) is acted on when that call returns.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Records SIGINT/SIGTERM for `command` ("alpamayo serve"): `received` (the signals' names, in order) and
    `event` (set at the first). Before `take_over`, the first signal exits the process with status 0."""

    def __init__(self, command: str):
        self.command = command
        self.received: list[str] = []
        self.event = threading.Event()
        self._on_stop: Callable[[str], None] | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        """Handle SIGINT and SIGTERM from now on (main thread only); `restore` puts the previous handlers back."""
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def take_over(self, on_stop: Callable[[str], None]) -> None:
        """From now on a signal calls `on_stop(cause)` ("SIGTERM received") instead of exiting; a signal that
        came before is passed on at once."""
        self._on_stop = on_stop
        if self.received:
            on_stop(f"{self.received[0]} received")

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        self.event.set()
        if self._on_stop is not None:
            self._on_stop(f"{name} received")
            return
        print(f"{self.command}: {name} received during start-up: exiting", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Mid-import (a half-initialised torch): leave without finalising the interpreter, which has nothing of
        # ours to release yet.
        os._exit(0)
