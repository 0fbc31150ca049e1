"""What a stretch of device code does, from `ttnn.graph` capture: device programs and host <-> device copies.

A captured trace may contain device programs only: ttnn refuses a host write inside a trace capture ("Writes
are not supported during trace capture") and a read would return the capture's stale data. Trace capture
itself crashes the dry run's mock device, so the dry run checks this rule on the graph of the traced code run
untraced:

    with Capture(ttnn) as graph:
        model.decoder.graph(model.cache, inputs)
    assert not graph.host_transfers(), graph.host_transfers()
    graph.programs()   # device programs the step runs
"""

from __future__ import annotations

from typing import Any

# The graph nodes that move tensor data between host and device, as ttnn 0.81.1 names them (measured: an
# upload `from_torch(..., device=)` records `Tensor::to_device`, `to_torch` / `from_device` record
# `Tensor::cpu`, `copy_host_to_device_tensor` records `tt::tt_metal::copy_to_device`).
HOST_TRANSFERS = frozenset(
    {
        "Tensor::to_device",
        "Tensor::cpu",
        "tt::tt_metal::copy_to_device",
        "ttnn.from_torch",
        "ttnn.to_torch",
        "ttnn.to_device",
        "ttnn.from_device",
        "ttnn.copy_host_to_device_tensor",
        "ttnn.copy_device_to_host_tensor",
    }
)


class Capture:
    """`ttnn.graph` capture of the code inside `with` (normal run mode: the ops also run)."""

    def __init__(self, ttnn: Any):
        self.ttnn = ttnn
        self.nodes: list[dict[str, Any]] = []

    def __enter__(self) -> Capture:
        self.ttnn.graph.begin_graph_capture(self.ttnn.graph.RunMode.NORMAL)
        return self

    def __exit__(self, *exc: object) -> None:
        self.nodes = self.ttnn.graph.end_graph_capture()

    def functions(self) -> list[str]:
        """Every function the capture recorded (ttnn ops, device operations, tensor methods), in call order."""
        return [n["params"]["name"] for n in self.nodes if n["node_type"] == "function_start"]

    def host_transfers(self) -> list[str]:
        """The recorded functions that copy data between host and device (`HOST_TRANSFERS`), in call order."""
        return [name for name in self.functions() if name in HOST_TRANSFERS]

    def programs(self) -> int:
        """Device programs run (one per device operation launched)."""
        return sum(n["node_type"] == "program_execution" for n in self.nodes)
