"""The MoE block of Qwen3-VL-MoE sparse layers on one Blackhole p150 (router, routed experts, combine).

Configured by the validated `alpamayo.config.moe.MoEBlockConfig` of the model (planned by
`alpamayo.plan.programs.moe.plan_moe`, which refuses what this block does not implement: several chips,
shared experts, expert biases). Weights (`alpamayo.plan.weights.expert_specs`): router `[H_p, E]` bf16, experts
gate and up `[1, E, H_p, I_p]` and down `[1, E, I_p, H_p]` in the recipe's `experts` dtype (bfp8 or bfp4).

Router, as the torch reference `alpamayo.text.moe.router.TopKRouter`: logits in float32 (`ttnn.linear(..., dtype=float32)`:
a bf16 logit rounding can flip a near-tie expert choice), softmax and top-k in float32, the k probabilities
renormalised to sum to 1 and applied in bf16.

Decode (one token, row 0 of a 32-row tile), after tt-metal's single-chip MoE1D: the weights are scattered into
a dense `[1, 1, 1, E]` routing row, and a 0/1 row with exactly k ones is the `sparse_matmul` sparsity, so gate,
up and down read only the k chosen experts (`nnz = k`: the op deadlocks when nnz differs from the count of
nonzeros, which weights could break by underflowing to zero). The down outputs `[1, E, 1, H_p]` (zero for
skipped experts) are combined as one matmul by the routing row. Only device ops: the step is traced.

Prefill (grouped): the router runs on the device; the top-k ids and probabilities of the prompt's rows come
to the host, which sorts the (token, choice) pairs by expert into groups of 32 rows (`group_rows`). The device
gathers those rows (`ttnn.embedding` on the normed hidden states), runs each group through its expert only
(`sparse_matmul` with a one-hot sparsity row per group, compact output), weights the rows, and gathers each
token's k outputs back for a sum. Each active expert's weights are read once for all its rows; masked
computation (every expert on every row, as MoE1D's prefill) would do E/k = 16x the expert work for 30B-A3B.
The group count is padded to its bound for the prompt length (`max_groups`; padding groups hold zero-weight
rows), so the shapes, hence the compiled programs, depend on the padded prompt length only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from alpamayo.plan.device_spec import TILE
from alpamayo.plan.programs.moe import MoEPlan
from alpamayo.profiling import Tracer
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceIO, DeviceTensor, TensorGroup
from alpamayo.tt.ttnn_configs import ComputeKernels


@dataclass(frozen=True)
class Grouping:
    """A prompt's (token, choice) pairs sorted into expert groups of 32 rows.

    gather:  [G * 32] long, the token of every grouped row (padding rows: token 0);
    weights: [G * 32] float32, the routing weight of every grouped row (padding rows: 0);
    experts: [G] long, the expert of every group;
    combine: [k, L_p] long, the grouped row of each token's j-th choice (prompt padding rows: row 0).
    """

    gather: torch.Tensor
    weights: torch.Tensor
    experts: torch.Tensor
    combine: torch.Tensor


def max_groups(padded_length: int, k: int, num_experts: int) -> int:
    """Upper bound of the 32-row groups of a prompt: every expert may start a partly filled group."""
    return -(-padded_length * k // TILE) + num_experts


def group_rows(ids: torch.Tensor, weights: torch.Tensor, num_experts: int, padded_length: int) -> Grouping:
    """Group the routing of L prompt rows (ids, weights [L, k]) by expert, padded to `max_groups` groups.

    Within an expert, rows keep token order (a stable sort: deterministic, and what the reference does)."""
    length, k = ids.shape
    pairs = ids.reshape(-1).long()
    order = torch.sort(pairs, stable=True).indices
    counts = torch.bincount(pairs, minlength=num_experts)
    groups = -(-counts // TILE)  # per expert
    total = max_groups(padded_length, k, num_experts)
    gather = torch.zeros(total * TILE, dtype=torch.long)
    row_weights = torch.zeros(total * TILE, dtype=torch.float32)
    experts = torch.zeros(total, dtype=torch.long)
    experts[: int(groups.sum())] = torch.repeat_interleave(torch.arange(num_experts), groups)
    # first grouped row of each expert, then the rank of each pair within its expert
    start = torch.cumsum(groups, 0) * TILE - groups * TILE
    sorted_experts = pairs[order]
    rank = torch.arange(pairs.numel()) - torch.cumsum(counts, 0).sub(counts)[sorted_experts]
    rows = start[sorted_experts] + rank
    gather[rows] = order // k
    row_weights[rows] = weights.reshape(-1).float()[order]
    combine = torch.zeros(k, padded_length, dtype=torch.long)
    slot = torch.empty_like(pairs)
    slot[order] = rows
    combine[:, :length] = slot.view(length, k).t()
    return Grouping(gather, row_weights, experts, combine)


@dataclass
class DeviceGrouping(TensorGroup):
    """A `Grouping` on the device: gather and combine row indices [1, N] (uint32 row-major), row weights
    [1, G, 32, 1] bf16, and the one-hot expert of every group as the sparsity [1, G, 1, E] (bf16 row-major)."""

    gather: DeviceTensor
    combine: DeviceTensor
    weights: DeviceTensor
    sparsity: DeviceTensor


@dataclass
class MoEWeights(TensorGroup):
    """A sparse layer's router [H_p, E_p] (bf16, interleaved) and routed experts, gate and up
    [1, E, H_p, I_p], down [1, E, I_p, H_p] (`alpamayo.plan.weights.expert_specs`)."""

    router: DeviceTensor
    gate: DeviceTensor
    up: DeviceTensor
    down: DeviceTensor


class TTMoE(DeviceIO):
    """Router and routed experts of one sparse layer on the device (see module docstring).

    weights: the router and the routed experts' projections; ck: the model's compute-kernel configs (its
    `router` and `experts` matmul groups run here).
    """

    def __init__(
        self,
        ttnn: Any,
        device: Any,
        plan: MoEPlan,
        weights: MoEWeights,
        ck: ComputeKernels,
        tracer: Tracer | None = None,
    ):
        self.ttnn, self.device, self.plan, self.w, self.ck = ttnn, device, plan, weights, ck
        self.tracer = tracer or Tracer(enabled=False)
        self.k, self.experts = plan.block.select_experts_k, plan.block.num_routed_experts
        self.pc_gate_up = cfgs.sparse_matmul(ttnn, plan.gate_up)
        self.pc_down = cfgs.sparse_matmul(ttnn, plan.down)

    def _router(self, x: Any, memory: Any) -> tuple[Any, Any, Any]:
        """x [1, 1, M, H_p] bf16 -> (softmax [1, 1, M, E], top-k probabilities [1, 1, M, k], expert ids
        [1, 1, M, k]), all float32 but the ids."""
        ttnn = self.ttnn
        logits = ttnn.linear(
            x,
            self.w.router,
            dtype=ttnn.float32,
            compute_kernel_config=self.ck.matmul["router"],
            memory_config=memory,
        )
        probs = ttnn.softmax(logits, dim=-1, memory_config=memory)
        self.free(logits)
        top, ids = ttnn.topk(probs, k=self.k, dim=-1)
        return probs, top, ids

    def _sparse(self, x: Any, weight: Any, sparsity: Any, nnz: int, pc: Any, **kw: Any) -> Any:
        return self.ttnn.sparse_matmul(
            x,
            weight,
            sparsity=sparsity,
            nnz=nnz,
            program_config=pc,
            compute_kernel_config=self.ck.matmul["experts"],
            dtype=self.ttnn.bfloat16,
            **kw,
        )

    # ------------------------------------------------------------------ decode
    def decode(self, x: Any) -> Any:
        """x [1, 1, 32, H_p] bf16 L1 interleaved (row 0: the token) -> [1, 1, 32, H_p] (row 0: its MoE output)."""
        ttnn, hp, e = self.ttnn, self.plan.hidden_padded, self.experts
        L1 = ttnn.L1_MEMORY_CONFIG
        x1 = ttnn.reshape(x, (1, 1, 1, hp), (1, 1, TILE, hp))
        probs, top, ids = self._router(x1, L1)
        # zeros_like with another dtype builds the zeros on the host and writes them to the device, which a
        # trace capture refuses; a typecast of same-dtype zeros stays on the device (ttnn.graph, dry run)
        zeros_f32 = ttnn.zeros_like(probs)
        zeros = ttnn.typecast(zeros_f32, ttnn.bfloat16)  # [1, 1, 1, E]
        norm = ttnn.sum(top, dim=-1, keepdim=True)
        renormed = ttnn.div(top, norm)
        scores = ttnn.typecast(renormed, ttnn.bfloat16)
        self.free(probs, zeros_f32, top, norm, renormed)
        routing = ttnn.scatter(zeros, -1, ids, scores)  # [1, 1, 1, E] weights, 0 off the top-k
        ones = ttnn.ones_like(scores)
        mask = ttnn.scatter(zeros, -1, ids, ones)  # exactly k ones: nnz = k holds whatever the weights are
        sparsity = ttnn.to_layout(mask, ttnn.ROW_MAJOR_LAYOUT)
        self.free(scores, ids, zeros, ones, mask)
        gate = self._sparse(x1, self.w.gate, sparsity, self.k, self.pc_gate_up, memory_config=L1)
        up = self._sparse(x1, self.w.up, sparsity, self.k, self.pc_gate_up, memory_config=L1)
        act = ttnn.mul(gate, up, input_tensor_a_activations=[ttnn.UnaryOpType.SILU], memory_config=L1)
        self.free(gate, up)
        # sparse_matmul's [1, 1, 1, E, 1, I_p] as one row per expert for the down projection
        act4 = ttnn.reshape(act, (1, e, 1, self.plan.intermediate_padded))
        down = self._sparse(
            act4,
            self.w.down,
            sparsity,
            self.k,
            self.pc_down,
            is_input_a_sparse=True,
            memory_config=L1,
        )  # [1, E, 1, H_p], zero for skipped experts
        self.free(act4, sparsity)
        rows = ttnn.permute(down, (0, 2, 1, 3))  # [1, 1, E, H_p]
        self.free(down)
        out = ttnn.matmul(routing, rows, compute_kernel_config=self.ck.matmul["experts"], memory_config=L1)
        self.free(routing, rows)
        return ttnn.reshape(out, (1, 1, TILE, hp), (1, 1, TILE, hp))

    # ------------------------------------------------------------------ prefill
    def _routing_to_host(self, x: Any, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k ids and renormalised weights [L, k] of the prompt rows of x [1, 1, L_p, H_p]."""
        probs, top, ids = self._router(x, self.ttnn.DRAM_MEMORY_CONFIG)
        chosen = self.download(top)[0, 0, :length].float()
        choice = self.download(ids)[0, 0, :length].long()
        self.free(probs, top, ids)
        return choice, chosen / chosen.sum(-1, keepdim=True)

    def _upload_grouping(self, g: Grouping) -> DeviceGrouping:
        """The grouping on the device: row indices (uint32 row-major), row weights [1, G, 32, 1] bf16, and the
        one-hot expert of every group as the sparsity [1, G, 1, E] (bf16 row-major: exactly G nonzeros)."""
        ttnn = self.ttnn
        groups = g.experts.numel()
        onehot = torch.zeros(1, groups, 1, self.experts, dtype=torch.bfloat16)
        onehot[0, torch.arange(groups), 0, g.experts] = 1
        index = {"dtype": ttnn.uint32, "layout": ttnn.ROW_MAJOR_LAYOUT}
        return DeviceGrouping(
            self.upload(g.gather.view(1, -1).to(torch.int32), **index),
            self.upload(g.combine.view(1, -1).to(torch.int32), **index),
            self.upload(g.weights.view(1, groups, TILE, 1)),
            self.upload(onehot, ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT),
        )

    def _grouped(self, rows: Any, weight: Any, sparsity: Any, groups: int, width: int, pc: Any) -> Any:
        """One expert per 32-row group: rows [1, G, 32, K] -> compact [1, G, 32, width]."""
        ttnn = self.ttnn
        out = ttnn.allocate_tensor_on_device(
            ttnn.Shape((1, groups, TILE, width)),
            ttnn.bfloat16,
            ttnn.TILE_LAYOUT,
            self.device,
            ttnn.DRAM_MEMORY_CONFIG,
        )
        self._sparse(
            rows,
            weight,
            sparsity,
            groups,
            pc,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
            optional_output_tensor=out,
        )
        return out

    def _gather(self, index: Any, table: Any, rows: int) -> Any:
        """Rows `index` [1, N] of table [1, 1, rows, H_p] (TILE) -> [1, 1, N, H_p] TILE."""
        ttnn, hp = self.ttnn, self.plan.hidden_padded
        flat = ttnn.to_layout(table, ttnn.ROW_MAJOR_LAYOUT)
        picked = ttnn.embedding(
            index,
            ttnn.reshape(flat, (rows, hp)),
            layout=ttnn.TILE_LAYOUT,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        self.free(flat)
        return ttnn.reshape(picked, (1, 1, -1, hp))

    def prefill(self, x: Any, length: int) -> Any:
        """x [1, 1, L_p, H_p] bf16 DRAM (rows >= `length` are padding) -> MoE output [1, 1, L_p, H_p] DRAM."""
        ttnn, hp, ip, k = self.ttnn, self.plan.hidden_padded, self.plan.intermediate_padded, self.k
        padded = x.shape[-2]
        ids, weights = self._routing_to_host(x, length)
        grouping = group_rows(ids, weights, self.experts, padded)
        dev = self._upload_grouping(grouping)
        groups = grouping.experts.numel()
        rows = ttnn.reshape(self._gather(dev.gather, x, padded), (1, groups, TILE, hp))
        gate = self._grouped(rows, self.w.gate, dev.sparsity, groups, ip, self.pc_gate_up)
        up = self._grouped(rows, self.w.up, dev.sparsity, groups, ip, self.pc_gate_up)
        self.free(rows)
        act = ttnn.mul(gate, up, input_tensor_a_activations=[ttnn.UnaryOpType.SILU])
        self.free(gate, up)
        weighted = ttnn.mul(act, dev.weights)  # a row's routing weight, before down: down is linear
        self.free(act)
        down = self._grouped(weighted, self.w.down, dev.sparsity, groups, hp, self.pc_down)
        self.free(weighted)
        picked = self._gather(dev.combine, ttnn.reshape(down, (1, 1, groups * TILE, hp)), groups * TILE)
        self.free(down)
        out = ttnn.experimental.fast_reduce_nc(ttnn.reshape(picked, (1, k, padded, hp)), dims=[1])
        self.free(picked, *dev.tensors())
        return ttnn.reshape(out, (1, 1, padded, hp))
