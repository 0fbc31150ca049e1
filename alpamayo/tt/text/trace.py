"""Decode trace capture and replay, and the switch that keeps traces off the dry run's mock device and out of
the golden mode.

A trace is captured once per program (compile run first, then `begin_trace_capture` over the same graph with
the same persistent inputs) and replayed after its inputs are rewritten in place; `release` frees it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from alpamayo.tt.device import dry_run_active, is_golden

# Trace capture crashes the dry run's mock device (alpamayo.tt.dryrun): there the decode runs untraced.
DRY_RUN_NOTICE = "ttnn dry run: trace capture is card-only (it crashes the mock p150); decoding untraced"
# The golden mode runs each op as it is called: a traced step runs as its untraced ops.
GOLDEN_NOTICE = "ttnn golden mode: traces are card-only; every traced step runs as its untraced ops"


class TraceSwitch:
    """Whether a requested trace is captured on `device`: not under a dry run, nor in the golden mode (each
    said once on stderr)."""

    def __init__(self, device: Any = None) -> None:
        self.notice = GOLDEN_NOTICE if is_golden(device) else DRY_RUN_NOTICE if dry_run_active() else None
        self._noticed = False

    def traced(self, requested: bool) -> bool:
        """`requested`, except under a dry run or in the golden mode: False then (the text model's decode,
        the action expert's steps and the draft's block run untraced)."""
        if requested and self.notice is not None:
            if not self._noticed:
                print(self.notice, file=sys.stderr)
                self._noticed = True
            return False
        return requested


class DecodeTrace:
    """One captured device program and the output tensor (or list of them) its replays rewrite."""

    def __init__(self, ttnn: Any, device: Any) -> None:
        self.ttnn, self.device = ttnn, device
        self.trace_id: Any = None
        self.out: Any = None

    @property
    def captured(self) -> bool:
        return self.trace_id is not None

    def capture(self, graph: Callable[[], Any]) -> None:
        """Capture `graph()` (already compiled by one eager run on the same inputs); keeps its output."""
        ttnn = self.ttnn
        self.trace_id = ttnn.begin_trace_capture(self.device, cq_id=0)
        self.out = graph()
        ttnn.end_trace_capture(self.device, self.trace_id, cq_id=0)
        ttnn.synchronize_device(self.device)

    def replay(self) -> Any:
        """Run the captured program on the current contents of its inputs; returns its output tensor."""
        self.ttnn.execute_trace(self.device, self.trace_id, cq_id=0, blocking=True)
        return self.out

    def release(self) -> None:
        if self.trace_id is not None:
            self.ttnn.release_trace(self.device, self.trace_id)
            for t in self.out if isinstance(self.out, list) else [self.out]:
                self.ttnn.deallocate(t)
            self.trace_id, self.out = None, None
