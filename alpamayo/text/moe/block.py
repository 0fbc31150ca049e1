"""The MoE block as the hardware runs it (dispatch -> compute -> combine) and the Qwen3-VL-MoE sparse layer.

`MoEBlock` follows tt-metal's `TTMoEDecode` pipeline, on torch tensors:
  1. dispatch: every token is sent to its `k` routed experts (and to every shared expert); the (token, expert)
     rows are grouped by where the experts are stored, slot-major as `expert_mapping` places them;
  2. compute: each *active* expert runs its SwiGLU on its rows only; an expert no token chose is never read;
  3. combine: each token's expert outputs are weighted by its routing scores (shared experts by the fixed
     `shared_expert_scale`) and summed.
For one decoded token this reads k of the E experts' weights, which is the point of MoE on a bandwidth-bound
chip; a prompt reads each active expert once for all the rows routed to it.

`SparseMoE` is a Qwen3-VL-MoE decoder layer's MLP: the top-k router, then an `MoEBlock` with one slot, no
shared experts and no biases. Numerics follow transformers' `grouped_mm` experts: per-row products in the
model dtype, then one sum over the token's k experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from alpamayo.checkpoint import Getter
from alpamayo.config.model import TextConfig
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.text.mlp import SwiGLU
from alpamayo.text.moe.router import TopKRouter
from alpamayo.text.moe.weights import GATE, expert_weights


@dataclass(frozen=True)
class Dispatch:
    """(token, expert) rows grouped by expert, S = tokens * effective_k of them.

    rows:   [S, H] the token's input, one row per pair, grouped slot-major by expert (shared experts last);
    pairs:  [S] int64, the pair of each row: t * effective_k + j, where j < k is the token's j-th routed choice
            and j >= k is shared expert `num_routed_experts + j - k`;
    groups: (expert id, row count) of each active expert, in row order.
    """

    rows: torch.Tensor
    pairs: torch.Tensor
    groups: tuple[tuple[int, int], ...]


class MoEBlock(nn.Module):
    """Routed (and optional shared) SwiGLU experts behind a dispatch -> compute -> combine interface.

    gate_up [E, 2I, H] (gate rows first) and down [E, H, I] per routed expert, in expert-id order;
    shared_gate_up [S, 2I, H] / shared_down [S, H, I] for shared experts `E .. E+S-1`; with `has_bias`,
    gate_up_bias [E, 2I] and down_bias [E, H]. Each expert is stored once, as its own SwiGLU, in storage
    order (slot-major by `expert_mapping`, then the shared experts).
    """

    position: torch.Tensor  # [E + S] int64: expert id -> storage position (a buffer)
    shared_ids: torch.Tensor  # [S] int64: the shared experts' ids E .. E+S-1 (a buffer)

    def __init__(
        self,
        config: MoEBlockConfig,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        shared_gate_up: torch.Tensor | None = None,
        shared_down: torch.Tensor | None = None,
        gate_up_bias: torch.Tensor | None = None,
        down_bias: torch.Tensor | None = None,
    ):
        super().__init__()
        c = config
        e, s, h, i = c.num_routed_experts, c.num_shared_experts, c.hidden_size, c.intermediate_size
        _check_shape("gate_up", gate_up, (e, 2 * i, h))
        _check_shape("down", down, (e, h, i))
        _check_optional("shared_gate_up", shared_gate_up, (s, 2 * i, h), s > 0, f"num_shared_experts = {s}")
        _check_optional("shared_down", shared_down, (s, h, i), s > 0, f"num_shared_experts = {s}")
        _check_optional("gate_up_bias", gate_up_bias, (e, 2 * i), c.has_bias, f"has_bias = {c.has_bias}")
        _check_optional("down_bias", down_bias, (e, h), c.has_bias, f"has_bias = {c.has_bias}")
        self.config = c
        self.storage_ids = (*c.storage_order, *range(e, e + s))  # expert id at each storage position
        experts = [_swiglu(gate_up, down, gate_up_bias, down_bias, i, x) for x in c.storage_order]
        if shared_gate_up is not None and shared_down is not None:  # given exactly when s > 0 (checked above)
            experts += [_swiglu(shared_gate_up, shared_down, None, None, i, x) for x in range(s)]
        self.experts = nn.ModuleList(experts)
        self._position = {x: p for p, x in enumerate(self.storage_ids)}  # expert id -> storage position
        position = torch.tensor([self._position[x] for x in range(e + s)], device=gate_up.device)
        self.register_buffer("position", position, persistent=False)
        self.register_buffer("shared_ids", torch.arange(e, e + s, device=gate_up.device), persistent=False)

    def dispatch(self, x: torch.Tensor, indices: torch.Tensor) -> Dispatch:
        """x [T, H], routed expert ids [T, k] -> rows grouped by expert (see `Dispatch`)."""
        c = self.config
        t = x.shape[0]
        self._check_inputs(x, indices)
        ids = indices if c.num_shared_experts == 0 else torch.cat([indices, self.shared_ids.expand(t, -1)], 1)
        # A stable sort keeps each expert's rows in token order: deterministic, and the order transformers uses.
        positions, pairs = torch.sort(self.position[ids.reshape(-1)], stable=True)
        active, counts = torch.unique_consecutive(positions, return_counts=True)
        groups = tuple(
            (self.storage_ids[p], n) for p, n in zip(active.tolist(), counts.tolist(), strict=True)
        )
        return Dispatch(x[pairs // c.effective_k], pairs, groups)

    def compute(self, dispatch: Dispatch) -> torch.Tensor:
        """Each active expert's SwiGLU on its own rows: [S, H] outputs aligned with `dispatch.rows`."""
        outputs, start = [], 0
        for expert, n in dispatch.groups:
            outputs.append(self.experts[self._position[expert]](dispatch.rows[start : start + n]))
            start += n
        return torch.cat(outputs)

    def combine(self, outputs: torch.Tensor, dispatch: Dispatch, scores: torch.Tensor) -> torch.Tensor:
        """sum_j weight[t, j] * output[t, j] -> [T, H]; routed weights are `scores` [T, k], shared ones the scale."""
        c = self.config
        t = scores.shape[0]
        per_pair = torch.empty_like(outputs)
        per_pair[dispatch.pairs] = outputs
        weights = scores.to(outputs.dtype)
        if c.num_shared_experts:
            shared = weights.new_full((t, c.num_shared_experts), c.shared_expert_scale)
            weights = torch.cat([weights, shared], 1)
        return (per_pair.view(t, c.effective_k, -1) * weights.unsqueeze(-1)).sum(1)

    def forward(self, x: torch.Tensor, scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """x [T, H], routing scores [T, k] and expert ids [T, k] -> [T, H]."""
        if tuple(scores.shape) != tuple(indices.shape):
            raise ValueError(
                f"scores {list(scores.shape)} and indices {list(indices.shape)} must have the same shape"
            )
        dispatch = self.dispatch(x, indices)
        return self.combine(self.compute(dispatch), dispatch, scores)

    def _check_inputs(self, x: torch.Tensor, indices: torch.Tensor) -> None:
        c = self.config
        if x.dim() != 2 or x.shape[1] != c.hidden_size:
            raise ValueError(f"MoE block input must be [tokens, {c.hidden_size}], got {list(x.shape)}")
        if tuple(indices.shape) != (x.shape[0], c.select_experts_k):
            raise ValueError(
                f"expert indices must be [{x.shape[0]}, {c.select_experts_k}] (tokens, select_experts_k), "
                f"got {list(indices.shape)}"
            )
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= c.num_routed_experts:
            raise ValueError(
                f"expert indices must be routed expert ids in [0, {c.num_routed_experts}), got range [{lo}, {hi}]"
            )


class SparseMoE(nn.Module):
    """A Qwen3-VL-MoE sparse MLP: `TopKRouter`, then an `MoEBlock` (one slot, no shared experts, no bias)."""

    def __init__(self, router: TopKRouter, block: MoEBlock):
        super().__init__()
        self.router, self.block = router, block

    @classmethod
    def from_weights(cls, cfg: TextConfig, prefix: str, get: Getter) -> SparseMoE:
        """Build from checkpoint tensors under `prefix` ('language_model.layers.{i}.mlp.'), either expert layout."""
        block_cfg = MoEBlockConfig.for_text(cfg)
        gate_up, down = expert_weights(cfg, prefix, get)
        return cls(
            TopKRouter(get(prefix + GATE), block_cfg.select_experts_k), MoEBlock(block_cfg, gate_up, down)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] -> [..., H]; every token is routed on its own."""
        flat = x.reshape(-1, x.shape[-1])
        scores, indices = self.router(flat)
        return self.block(flat, scores, indices).view(x.shape)


def _swiglu(
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_bias: torch.Tensor | None,
    inter: int,
    e: int,
) -> SwiGLU:
    """Expert e of stacked weights as its own SwiGLU (a copy, so the stacked tensor can be released).

    One module per expert lets `text.linear.pack_linears` give each expert the packed oneDNN layout on CPU
    bfloat16: 8 experts of the 30B-A3B shape (2048 x 768) for one token took 2.8 ms packed vs 5.6 ms with
    `F.linear` on views of the stacked [E, 2I, H] tensor and 47 ms gathering the 8 into a `bmm` (2 cores).
    """
    biases: tuple[torch.Tensor | None, ...] = (None, None, None)
    if gate_up_bias is not None and down_bias is not None:  # both or neither (`has_bias`)
        biases = (gate_up_bias[e, :inter], gate_up_bias[e, inter:], down_bias[e])
    return SwiGLU(gate_up[e, :inter], gate_up[e, inter:], down[e].clone(), *biases)


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"MoE block tensor '{name}' has shape {list(tensor.shape)}, expected {list(shape)}")


def _check_optional(
    name: str, tensor: torch.Tensor | None, shape: tuple[int, ...], needed: bool, why: str
) -> None:
    if needed and tensor is None:
        raise ValueError(f"MoE block tensor '{name}' {list(shape)} is required with {why}")
    if not needed and tensor is not None:
        raise ValueError(f"MoE block tensor '{name}' was given but {why} does not use it")
    if tensor is not None:
        _check_shape(name, tensor, shape)
