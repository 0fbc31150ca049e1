"""The action expert's velocity step as a CUDA graph (as Alpamayo 2 ships one): captured once per sampling
context, replayed at every Euler step.

An expert step is ~15 small kernels per layer at 64 tokens per row, so on a GPU its launch overhead rivals the
work; replaying a graph launches it once. The graph reads the context's tensors (cache views, bias, rotary
tables) at fixed addresses, which is what `ExpertContext` holds for one sampling; the step's inputs x and t
are copied into static buffers before each replay and the velocity is copied out of one.
"""

from __future__ import annotations

import torch

from alpamayo.expert.model import ActionExpert, ExpertContext

WARMUP_RUNS = 2  # eager runs on a side stream before capture (cuBLAS/attention workspaces get allocated)


class GraphedVelocity:
    """`expert.velocity(x, t, ctx)` captured for this context's shapes; call it like the eager step."""

    def __init__(self, expert: ActionExpert, ctx: ExpertContext):
        if expert.device.type != "cuda":
            raise ValueError(
                f"CUDA graph capture needs the expert on a CUDA device, it is on {expert.device}"
            )
        self.expert, self.ctx = expert, ctx
        rows = ctx.rows
        self.x = torch.zeros(rows, expert.n_tokens, 2, device=expert.device)
        self.t = torch.zeros(rows, device=expert.device)
        stream = torch.cuda.Stream(expert.device)
        stream.wait_stream(torch.cuda.current_stream(expert.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                expert.velocity(self.x, self.t, ctx)
        torch.cuda.current_stream(expert.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.v = expert.velocity(self.x, self.t, ctx)

    def __call__(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x [rows, T, 2], t [rows] -> velocity [rows, T, 2] (a copy: the graph's output buffer is reused)."""
        if tuple(x.shape) != tuple(self.x.shape) or tuple(t.shape) != tuple(self.t.shape):
            raise ValueError(
                f"the captured step takes x {list(self.x.shape)} and t {list(self.t.shape)}, got "
                f"{list(x.shape)} and {list(t.shape)}"
            )
        self.x.copy_(x)
        self.t.copy_(t)
        self.graph.replay()
        return self.v.clone()
