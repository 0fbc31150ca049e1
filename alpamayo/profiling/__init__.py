"""Latency tracing shared by every backend and process (runtime, node, replay, profiling)."""

from alpamayo.profiling.tracer import STAGES, Span, Tracer

__all__ = ["STAGES", "Span", "Tracer"]
