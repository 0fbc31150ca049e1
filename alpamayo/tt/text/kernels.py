"""The device operations every decoder block on the chip shares: compute-kernel configs per op group, the
prefill's matmul and norms, the K/V cache fill, and the pre-norm decoder block over all rows of a prompt.

`TextKernels` holds the ttnn module, the device, the tracer and the text model's program plan; the text
layers, the action expert's layers (`alpamayo.tt.expert`) and the DFlash draft's (`alpamayo.tt.draft`) run
their prefill-shaped blocks through its `block_prefill`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alpamayo.config.model import TextConfig
from alpamayo.plan.precision import Precision
from alpamayo.plan.programs.text import TextPlan
from alpamayo.plan.weights import TEXT_GROUPS, LayerGroups, residual_norm_eps
from alpamayo.profiling import Tracer
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceIO, DeviceTensor
from alpamayo.tt.text.weights import DenseMLPWeights, LayerWeights


class TextKernels(DeviceIO):
    """Shared device operations of the text model's blocks (see module docstring): `scale` is the attention
    scale, `hidden_padded` the residual stream's width (hidden rounded up to 32 x DRAM banks), `residual_eps`
    the residual norms' epsilon at that width (`residual_norm_eps`)."""

    def __init__(
        self, ttnn: Any, device: Any, t: TextConfig, precision: Precision, plan: TextPlan, tracer: Tracer
    ):
        self.ttnn, self.device, self.text_cfg, self.plan, self.tracer = ttnn, device, t, plan, tracer
        self.ck = cfgs.ComputeKernels.for_precision(ttnn, precision)
        self.kv_dtype = cfgs.ttnn_dtype(ttnn, precision.dtype("kv_cache"))
        self.scale = t.head_dim**-0.5
        self.hidden_padded = plan.hidden_padded
        self.residual_eps = residual_norm_eps(t, plan.device.dram_banks)

    def mm(self, x: DeviceTensor, w: DeviceTensor, op: str) -> DeviceTensor:
        """Prefill matmul [1, 1, M, K] x [K, N] -> bf16 DRAM interleaved; `op` is its matmul op group."""
        m, k, n = x.shape[-2], x.shape[-1], w.shape[-1]
        mm = cfgs.prefill_matmul(self.ttnn, self.plan.prefill_matmul(m, k, n))
        return self.ttnn.experimental.minimal_matmul(
            x,
            w,
            compute_kernel_config=self.ck.matmul[op],
            config=mm,
            dtype=self.ttnn.bfloat16,
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def rms(self, x: DeviceTensor, gamma: DeviceTensor, eps: float) -> DeviceTensor:
        """Interleaved RMSNorm of x's rows (DRAM in and out)."""
        return self.ttnn.rms_norm(
            x,
            epsilon=eps,
            weight=gamma,
            compute_kernel_config=self.ck.norm,
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def fill_cache(
        self, cache: DeviceTensor, x: DeviceTensor, padded_len: int, start: int = 0, batch: int = 0
    ) -> None:
        """cache[batch, :, start:start+Lp] = x ([1, n_kv, Lp, head_dim]) through a height-sharded copy of x;
        `start` is tile-aligned."""
        ttnn, t = self.ttnn, self.text_cfg
        cast = x.dtype != cache.dtype
        src = ttnn.typecast(x, cache.dtype) if cast else x  # fill_cache copies raw tiles: dtypes must match
        grid = self.plan.kv_fill_grid(padded_len)
        rows = t.num_key_value_heads * padded_len // grid.cores
        xs = ttnn.interleaved_to_sharded(src, cfgs.height_sharded(ttnn, rows, t.head_dim, grid))
        ttnn.fill_cache(cache, xs, batch, update_idx=start)
        self.free(xs, *([src] if cast else []))

    def block_prefill(
        self,
        t: TextConfig,
        w: LayerWeights,
        h: DeviceTensor,
        cos: DeviceTensor,
        sin: DeviceTensor,
        attend: Callable[[Any, Any, Any], Any],
        mlp: Callable[[Any], Any] | None = None,
        ops: LayerGroups = TEXT_GROUPS,
        residual_eps: float | None = None,
    ) -> DeviceTensor:
        """One pre-norm decoder block of dimensions `t` with weights `w` on all rows of h [1, 1, Lp, H_p]
        (freed) at rotary cos/sin [1, 1, Lp, head_dim]; the text layers and the action expert's share it.
        attend(q, k, v): the attention of the normed, rotated heads q [1, nh, Lp, hd], k and v
        [1, nkv, Lp, hd] -> [1, nh, Lp, hd]; mlp(n2): the block's MLP of the normed residual (default: the
        dense SwiGLU); `ops` names the matmuls' op groups (math fidelity)."""
        ttnn = self.ttnn
        eps = self.residual_eps if residual_eps is None else residual_eps
        n1 = self.rms(h, w.attn_norm_tile, eps)
        qkv = self.mm(n1, w.wqkv, ops.qkv)
        self.free(n1)
        q, k, v = ttnn.experimental.nlp_create_qkv_heads(
            qkv,
            num_heads=t.num_attention_heads,
            num_kv_heads=t.num_key_value_heads,
            transpose_k_heads=False,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        self.free(qkv)
        qn, kn = self.rms(q, w.q_norm, t.rms_norm_eps), self.rms(k, w.k_norm, t.rms_norm_eps)
        self.free(q, k)
        q = ttnn.experimental.rotary_embedding_hf(qn, cos, sin, is_decode_mode=False)
        k = ttnn.experimental.rotary_embedding_hf(kn, cos, sin, is_decode_mode=False)
        self.free(qn, kn)
        a = attend(q, k, v)
        self.free(q, k, v)
        ac = ttnn.experimental.nlp_concat_heads(a, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self.free(a)
        o = self.mm(ac, w.wo, ops.o)
        self.free(ac)
        h2 = ttnn.add(h, o, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self.free(h, o)
        n2 = self.rms(h2, w.mlp_norm_tile, eps)
        d = mlp(n2) if mlp is not None else self.mlp_prefill(w.dense, n2, ops)
        self.free(n2)
        out = ttnn.add(h2, d, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self.free(h2, d)
        return out

    def mlp_prefill(
        self, w: DenseMLPWeights, n2: DeviceTensor, ops: LayerGroups = TEXT_GROUPS
    ) -> DeviceTensor:
        """Dense SwiGLU of n2 [1, 1, Lp, H_p] -> [1, 1, Lp, H_p] DRAM (n2 kept)."""
        ttnn = self.ttnn
        g, u = self.mm(n2, w.gate, ops.gate_up), self.mm(n2, w.up, ops.gate_up)
        m = ttnn.mul(
            g, u, input_tensor_a_activations=[ttnn.UnaryOpType.SILU], memory_config=ttnn.DRAM_MEMORY_CONFIG
        )
        self.free(g, u)
        d = self.mm(m, w.down, ops.down)
        self.free(m)
        return d
