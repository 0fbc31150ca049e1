"""Memory and program configs of the decode step (fixed per model) and the L1-sharded operations that use them.

Residual stream width-sharded in L1 on the residual grid, sharded RMSNorm, DRAM-sharded matmuls whose inputs
are width-sharded on their own grids, cos/sin and the attention heads one row per core, flash-decode SDPA
program configs (per row, and the verify block's block attention).
"""

from __future__ import annotations

from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.plan.programs.grid import SDPA_DECODE_K_CHUNK
from alpamayo.plan.programs.text import DecodeMatmul, block_sdpa_applies
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.text.decode_inputs import MAX_ROWS, DecodeInputs
from alpamayo.tt.text.kernels import TextKernels


class DecodePrograms:
    """The decode step's configs: `res_mem` (the residual stream), `in_mem` and `pc` by decode matmul name
    (`TextPlan.decode_matmuls`: its input's memory config and its program config), `norm_pc` (sharded norm),
    `rot_mem[B - 1]` and `heads_mem[B - 1]` (cos/sin and attention heads of B rows), the SDPA program configs
    and whether a verify block attends per block (`block_sdpa_applies`)."""

    def __init__(self, k: TextKernels):
        ttnn, plan, t = k.ttnn, k.plan, k.text_cfg
        self.k = k
        self.res_mem = cfgs.width_sharded(ttnn, k.hidden_padded, plan.residual_grid)
        self.in_mem = {m.name: cfgs.width_sharded(ttnn, m.k, m.grid) for m in plan.decode_matmuls}
        self.pc = {m.name: cfgs.decode_matmul(ttnn, m) for m in plan.decode_matmuls}
        self.norm_pc = cfgs.sharded_norm(ttnn, plan.residual_grid, plan.norm_block_w, plan.norm_subblock_w)
        heads = round_up(t.num_attention_heads, TILE)
        # per decode row count: cos/sin and the attention heads, one row per core
        self.rot_mem = [cfgs.per_row_sharded(ttnn, b, TILE, t.head_dim) for b in range(1, MAX_ROWS + 1)]
        self.heads_mem = [cfgs.per_row_sharded(ttnn, b, heads, t.head_dim) for b in range(1, MAX_ROWS + 1)]
        self.sdpa_decode_pc = cfgs.sdpa(ttnn, plan.sdpa_decode_grid, TILE, SDPA_DECODE_K_CHUNK)
        self.block_sdpa_pc = cfgs.sdpa(ttnn, plan.block_sdpa_grid, TILE, SDPA_DECODE_K_CHUNK)
        self.block_sdpa = block_sdpa_applies(t.num_attention_heads)

    def res_norm(self, x: DeviceTensor, gamma: DeviceTensor) -> DeviceTensor:
        """Sharded RMSNorm of the residual stream (input and output width-sharded on the residual grid)."""
        k = self.k
        return k.ttnn.rms_norm(
            x,
            epsilon=k.residual_eps,
            weight=gamma,
            program_config=self.norm_pc,
            compute_kernel_config=k.ck.norm,
            memory_config=self.res_mem,
        )

    def reshard(self, x: DeviceTensor, mem: object) -> DeviceTensor:
        """x moved to `mem` (x freed) unless it is already there. `to_memory_config` returns x itself then
        (nlp_concat_heads_decode already writes the o-projection's input layout when head_dim is 32 and the o
        grid has one core per head: the demo checkpoint, the tiny MoE model), which must not be freed."""
        if x.memory_config() == mem:
            return x
        y = self.k.ttnn.to_memory_config(x, mem)
        self.k.free(x)
        return y

    def ds_linear(self, x: DeviceTensor, w: DeviceTensor, mm: DecodeMatmul, op: str) -> DeviceTensor:
        """DRAM-sharded decode matmul of x (width-sharded on mm.grid); output width-sharded on mm.grid. `op` is
        its matmul op group."""
        ttnn = self.k.ttnn
        return ttnn.linear(
            x,
            w,
            compute_kernel_config=self.k.ck.matmul[op],
            program_config=self.pc[mm.name],
            memory_config=ttnn.L1_WIDTH_SHARDED_MEMORY_CONFIG,
            dtype=ttnn.bfloat16,
        )

    def head_norm(self, x: DeviceTensor, gamma: DeviceTensor) -> DeviceTensor:
        """Per-head RMSNorm of decode q or k (height-sharded heads) through an L1 interleaved copy."""
        k = self.k
        ttnn = k.ttnn
        mem = x.memory_config()
        xi = ttnn.to_memory_config(x, ttnn.L1_MEMORY_CONFIG)
        k.free(x)
        xn = ttnn.rms_norm(
            xi,
            epsilon=k.text_cfg.rms_norm_eps,
            weight=gamma,
            compute_kernel_config=k.ck.norm,
            memory_config=ttnn.L1_MEMORY_CONFIG,
        )
        k.free(xi)
        return self.reshard(xn, mem)

    def sharded_inputs(
        self, inputs: DecodeInputs[DeviceTensor]
    ) -> tuple[DeviceTensor, DeviceTensor, DeviceTensor]:
        """L1 copies of the persistent x (on the residual grid), cos and sin (one row per core) for the
        decode layers."""
        ttnn = self.k.ttnn
        rot = self.rot_mem[inputs.rows - 1]
        x = ttnn.to_memory_config(inputs.x, self.res_mem)
        cos = ttnn.to_memory_config(inputs.cos, rot)
        sin = ttnn.to_memory_config(inputs.sin, rot)
        return x, cos, sin
