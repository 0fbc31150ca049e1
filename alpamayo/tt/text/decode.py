"""Decode of the text backbone: one token as row 0 of a 32-row tile, through every layer on L1.

Residual stream width-sharded in L1, sharded RMSNorm, DRAM-sharded matmuls (SiLU fused into the gate
matmul), decode-mode head split, q/k norm and rotary, paged cache update and flash-decode SDPA reading the
position from a device tensor, head concat, lm_head with row 0 untilized. The step's persistent inputs
(embedding row, cos, sin, position) are rewritten in place before each run, so the step can be captured as a
trace (`alpamayo.tt.text.trace`) and replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from alpamayo.config import TextConfig
from alpamayo.profiling import Tracer
from alpamayo.text.inputs import check_decode_room, check_token_ids
from alpamayo.text.rope import MRope
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceIO
from alpamayo.tt.device_spec import TILE, round_up
from alpamayo.tt.moe import TTMoE
from alpamayo.tt.program_config import SDPA_DECODE_K_CHUNK, CoreGrid, DecodeMatmul, TextPlan
from alpamayo.tt.text.trace import DecodeTrace, TraceSwitch


class TextDecode(DeviceIO):
    """Decode half of `TTTextModel` (a mixin: the attributes below are the model's)."""

    text_cfg: TextConfig
    plan: TextPlan
    tracer: Tracer
    rope: MRope
    ck: dict[str, Any]
    weights: dict[str, Any]
    layer_weights: list[dict[str, Any]]
    moe: dict[int, TTMoE]
    scale: float
    hidden_padded: int
    residual_eps: float
    embed_table: torch.Tensor
    cache_len: int
    rope_delta: int
    max_seq_len: int
    kv_cache: list[tuple[Any, Any]]
    trace_switch: TraceSwitch
    _trace: DecodeTrace
    _inputs: dict[str, Any] | None
    _require_cache: Callable[[], None]

    def _decode_setup(self) -> None:
        """Memory and program configs of the decode step (fixed per model)."""
        ttnn, plan, t = self.ttnn, self.plan, self.text_cfg
        self.res_mem = cfgs.width_sharded(ttnn, self.hidden_padded, plan.residual_grid)
        self.in_mem = {m.name: cfgs.width_sharded(ttnn, m.k, m.grid) for m in plan.decode_matmuls}
        self.pc = {m.name: cfgs.decode_matmul(ttnn, m) for m in plan.decode_matmuls}
        self.norm_pc = cfgs.sharded_norm(ttnn, plan.residual_grid, plan.norm_block_w, plan.norm_subblock_w)
        single = CoreGrid(1, 1)
        self.rot_mem = cfgs.height_sharded(ttnn, TILE, t.head_dim, single)
        heads = round_up(t.num_attention_heads, TILE)
        self.heads_mem = cfgs.height_sharded(ttnn, heads, t.head_dim, single)
        self.sdpa_decode_pc = cfgs.sdpa(ttnn, plan.sdpa_decode_grid, TILE, SDPA_DECODE_K_CHUNK)

    def _res_norm(self, x: Any, gamma: Any) -> Any:
        """Sharded RMSNorm of the residual stream (input and output width-sharded on the residual grid)."""
        return self.ttnn.rms_norm(
            x,
            epsilon=self.residual_eps,
            weight=gamma,
            program_config=self.norm_pc,
            compute_kernel_config=self.ck["norm"],
            memory_config=self.res_mem,
        )

    def _reshard(self, x: Any, mem: Any) -> Any:
        """x moved to `mem` (x freed) unless it is already there. `to_memory_config` returns x itself then
        (nlp_concat_heads_decode already writes the o-projection's input layout when head_dim is 32 and the o
        grid has one core per head: the demo checkpoint, the tiny MoE model), which must not be freed."""
        if x.memory_config() == mem:
            return x
        y = self.ttnn.to_memory_config(x, mem)
        self._free(x)
        return y

    def _ds_linear(self, x: Any, w: Any, mm: DecodeMatmul, op: str) -> Any:
        """DRAM-sharded decode matmul of x (width-sharded on mm.grid); output width-sharded on mm.grid."""
        return self.ttnn.linear(
            x,
            w,
            compute_kernel_config=self.ck[op],
            program_config=self.pc[mm.name],
            memory_config=self.ttnn.L1_WIDTH_SHARDED_MEMORY_CONFIG,
            dtype=self.ttnn.bfloat16,
        )

    def _head_norm(self, x: Any, gamma: Any) -> Any:
        """Per-head RMSNorm of decode q or k (height-sharded heads) through an L1 interleaved copy."""
        ttnn = self.ttnn
        mem = x.memory_config()
        xi = ttnn.to_memory_config(x, ttnn.L1_MEMORY_CONFIG)
        self._free(x)
        xn = ttnn.rms_norm(
            xi,
            epsilon=self.text_cfg.rms_norm_eps,
            weight=gamma,
            compute_kernel_config=self.ck["norm"],
            memory_config=ttnn.L1_MEMORY_CONFIG,
        )
        self._free(xi)
        return self._reshard(xn, mem)

    def _layer_decode(self, i: int, x: Any, cos: Any, sin: Any, pos: Any) -> Any:
        """One decoder layer for the token at `pos`; x (freed) and the result as in `DecodeLayer`."""
        ttnn, t, plan, w = self.ttnn, self.text_cfg, self.plan, self.layer_weights[i]
        n1 = self._reshard(self._res_norm(x, w["attn_norm.rm"]), self.in_mem["qkv"])
        qkv = self._ds_linear(n1, w["wqkv"], plan.qkv, "qkv")
        self._free(n1)
        qkv_i = self._reshard(qkv, ttnn.L1_MEMORY_CONFIG)
        width = qkv_i.shape[-1]
        qkv_1 = ttnn.reshape(qkv_i, (1, 1, 1, width), (1, 1, TILE, width))  # one user: row 0 of the tile
        q, k, v = ttnn.experimental.nlp_create_qkv_heads_decode(
            qkv_1,
            num_heads=t.num_attention_heads,
            num_kv_heads=t.num_key_value_heads,
            memory_config=ttnn.L1_HEIGHT_SHARDED_MEMORY_CONFIG,
        )
        self._free(qkv_1)
        q, k = self._head_norm(q, w["q_norm.rm"]), self._head_norm(k, w["k_norm.rm"])
        qr = ttnn.experimental.rotary_embedding_hf(q, cos, sin, is_decode_mode=True)
        kr = ttnn.experimental.rotary_embedding_hf(k, cos, sin, is_decode_mode=True)
        self._free(q, k)
        cache_k, cache_v = self.kv_cache[i]
        # bf16 K/V rows: paged_update_cache repacks them into the cache dtype itself
        ttnn.experimental.paged_update_cache(cache_k, kr, update_idxs_tensor=pos)
        ttnn.experimental.paged_update_cache(cache_v, v, update_idxs_tensor=pos)
        self._free(kr, v)
        a = ttnn.transformer.scaled_dot_product_attention_decode(
            qr,
            cache_k,
            cache_v,
            cur_pos_tensor=pos,
            scale=self.scale,
            program_config=self.sdpa_decode_pc,
            compute_kernel_config=self.ck["sdpa_decode"],
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        self._free(qr)
        a_sh = self._reshard(a, self.heads_mem)
        heads = ttnn.experimental.nlp_concat_heads_decode(a_sh, num_heads=t.num_attention_heads)
        self._free(a_sh)
        attn = self._reshard(heads, self.in_mem["o"])
        o = self._reshard(self._ds_linear(attn, w["wo"], plan.o, "o"), self.res_mem)
        self._free(attn)
        h = ttnn.add(x, o, memory_config=self.res_mem)
        self._free(x, o)
        n2 = self._res_norm(h, w["mlp_norm.rm"])
        d = self._moe_decode(i, n2) if i in self.moe else self._mlp_decode(w, n2)
        out = ttnn.add(h, d, memory_config=self.res_mem)
        self._free(h, d)
        return out

    def _mlp_decode(self, w: dict[str, Any], n2: Any) -> Any:
        """Dense SwiGLU of the normed residual n2 (freed) -> [1, 1, 32, H_p] on the residual grid."""
        ttnn, plan = self.ttnn, self.plan
        n2 = self._reshard(n2, self.in_mem["gate"])
        g = self._ds_linear(n2, w["w_gate"], plan.gate, "mlp_gate_up")  # SiLU fused
        u = self._ds_linear(n2, w["w_up"], plan.up, "mlp_gate_up")
        self._free(n2)
        m = self._reshard(ttnn.mul(g, u, memory_config=g.memory_config()), self.in_mem["down"])
        self._free(g, u)
        d = self._reshard(self._ds_linear(m, w["w_down"], plan.down, "mlp_down"), self.res_mem)
        self._free(m)
        return d

    def _moe_decode(self, i: int, n2: Any) -> Any:
        """MoE block of sparse layer i on the normed residual n2 (freed) -> [1, 1, 32, H_p] on the residual grid."""
        n2i = self._reshard(n2, self.ttnn.L1_MEMORY_CONFIG)
        d = self.moe[i].decode(n2i)
        self._free(n2i)
        return self._reshard(d, self.res_mem)

    def _sharded_inputs(self, inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
        """L1 copies of the persistent x (on the residual grid), cos and sin (core (0, 0)) for `DecodeLayer`."""
        ttnn = self.ttnn
        x = ttnn.to_memory_config(inputs["x"], self.res_mem)
        cos = ttnn.to_memory_config(inputs["cos"], self.rot_mem)
        sin = ttnn.to_memory_config(inputs["sin"], self.rot_mem)
        return x, cos, sin

    def _decode_graph(self, inputs: dict[str, Any]) -> Any:
        """Every layer, final norm and lm_head for the persistent `inputs`; returns logits [1, 1, 1, V_p]
        row-major bf16 in DRAM. Captured as the decode trace, so it only allocates, computes and frees."""
        ttnn = self.ttnn
        x, cos, sin = self._sharded_inputs(inputs)
        for i in range(self.text_cfg.num_hidden_layers):
            x = self._layer_decode(i, x, cos, sin, inputs["pos"])
        self._free(cos, sin)
        xn = self._res_norm(x, self.weights["norm.rm"])
        self._free(x)
        xi = self._reshard(xn, ttnn.L1_MEMORY_CONFIG)  # the 1D multicast head wants interleaved in0
        logits = self._head(xi, 0)
        self._free(xi)
        return logits

    def _decode_host_inputs(self, token: int, position: int) -> dict[str, torch.Tensor]:
        """Host values of the persistent decode inputs for `token` at cache index `position`."""
        t = self.text_cfg
        x = torch.zeros(1, 1, TILE, self.hidden_padded, dtype=torch.bfloat16)
        x[0, 0, 0, : t.hidden_size] = self.embed_table[token]
        cos, sin = self.rope.cos_sin_1d(torch.tensor([position + self.rope_delta]), torch.bfloat16)
        return {
            "x": x,
            "cos": cos.view(1, 1, 1, -1),
            "sin": sin.view(1, 1, 1, -1),
            "pos": torch.tensor([position], dtype=torch.int32),
        }

    def _write_inputs(self, values: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Rewrite the persistent decode inputs in place (allocated on first use, never reallocated)."""
        ttnn = self.ttnn
        with self.tracer.span("tt.host_to_device"):
            hosts = {
                name: ttnn.from_torch(
                    v,
                    dtype=ttnn.int32 if name == "pos" else ttnn.bfloat16,
                    layout=ttnn.ROW_MAJOR_LAYOUT if name == "pos" else ttnn.TILE_LAYOUT,
                )
                for name, v in values.items()
            }
            if self._inputs is None:
                self._inputs = {
                    name: ttnn.allocate_tensor_on_device(
                        h.shape, h.dtype, h.layout, self.device, ttnn.DRAM_MEMORY_CONFIG
                    )
                    for name, h in hosts.items()
                }
            for name, h in hosts.items():
                ttnn.copy_host_to_device_tensor(h, self._inputs[name])
        return self._inputs

    def _check_decode(self, token: int) -> None:
        self._require_cache()
        check_decode_room(self.cache_len, self.max_seq_len)
        check_token_ids(torch.tensor([token]), self.text_cfg.vocab_size)

    def _logits(self, row: Any) -> torch.Tensor:
        return self._download(row).reshape(-1)[: self.text_cfg.vocab_size].float()

    def decode(self, tokens: int | torch.Tensor, traced: bool = True) -> torch.Tensor:
        """Append one token at position cache_len; float32 logits [V] for an int, [1, V] for ids [1] (the
        torch backend's contract with one active row). The first traced call compiles the step, captures it
        and returns the compile run's logits; later calls replay the trace."""
        if isinstance(tokens, torch.Tensor):
            if tokens.numel() != 1:
                raise ValueError(f"the ttnn backend decodes one sequence: got {tokens.numel()} tokens")
            return self.decode(int(tokens.reshape(-1)[0]), traced).unsqueeze(0)
        token = tokens
        self._check_decode(token)
        traced = self.trace_switch.traced(traced)
        inputs = self._write_inputs(self._decode_host_inputs(token, self.cache_len))
        if not traced:
            with self.tracer.span("tt.decode_untraced"):
                row = self._decode_graph(inputs)
            logits = self._logits(row)
            self._free(row)
        elif not self._trace.captured:
            with self.tracer.span("tt.decode_compile_and_capture"):
                row = self._decode_graph(inputs)
                logits = self._logits(row)
                self._free(row)
                # recapturing the same position rewrites the same K/V row: idempotent
                self._trace.capture(lambda: self._decode_graph(inputs))
        else:
            with self.tracer.span("tt.decode_trace_execute"):
                out = self._trace.replay()
            logits = self._logits(out)
        self.cache_len += 1
        return logits
