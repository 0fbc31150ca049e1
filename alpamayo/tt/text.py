"""The Qwen3-VL text backbone on one Blackhole p150: prefill and traced decode, batch 1.

Same interface and tensor contract as the torch reference `alpamayo.text.TextModel`:

    model = TTTextModel.from_checkpoint(ckpt_dir, precision="performance")
    model.setup_cache(max_seq_len=4096)
    logits = model.prefill(inputs, position_ids, visual_pos_mask, deepstack)   # [V] float32
    logits = model.decode(next_id)                                             # [V] float32
    model.close()                                                              # releases trace and device

Host side (as tt-metal's Qwen-VL demos): token embedding lookup, M-RoPE cos/sin tables (`alpamayo.text.rope`),
the scatter of DeepStack features into zero rows. Device side, every grid and block size from
`alpamayo.tt.program_config.plan_text`:

Prefill (the whole prompt in one pass, rows padded to a multiple of 128 with continuation positions, which
causal attention keeps away from the real rows): `minimal_matmul` on 11x10 with the DRAM-sharded weights,
interleaved RMSNorm with TILE gammas, per-head q/k RMSNorm, HF rotary on host cos/sin, K/V written to the
cache from a height-sharded copy (`fill_cache` mis-addresses interleaved multi-head inputs), causal SDPA
chunked by the padded length, SiLU fused into the gate * up multiply, DeepStack level k added after layer k,
final norm and the lm_head on the last prompt row's tile only.

Decode (one token as row 0 of a 32-row tile): residual stream width-sharded in L1, sharded RMSNorm,
DRAM-sharded matmuls (SiLU fused into the gate matmul), decode-mode head split, q/k norm and rotary, paged
cache update and flash-decode SDPA reading the position from a device tensor, head concat, lm_head with row 0
untilized. The step is captured once as a trace whose persistent inputs (embedding row, cos, sin, position)
are rewritten in place before each replay; `close()` releases it. `decode_layers[i]` is the per-layer seam: a
fused decode layer installed there (before the first traced step) replaces the per-op one.

Sparse MoE layers (Qwen3-VL-MoE) run their MLP as `alpamayo.tt.moe.TTMoE`, configured by the model's
validated `MoEBlockConfig` (`alpamayo.moe.config.block_config_for`): top-k sparse expert matmuls in decode
(inside the trace), expert-grouped matmuls in prefill.

The residual stream is `hidden_p` = hidden rounded up to 32 x DRAM banks wide (zero columns; see
`alpamayo.tt.weights`): host inputs are zero-padded to it and outputs cut back to hidden.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from alpamayo.checkpoint import Checkpoint, open_checkpoint
from alpamayo.config import ModelConfig, TextConfig
from alpamayo.errors import BackendUnavailable
from alpamayo.moe.config import MoEBlockConfig, model_block_config
from alpamayo.moe.weights import ExpertView
from alpamayo.profiling import Tracer
from alpamayo.text.inputs import check_decode_room, check_prefill, check_token_ids, prompt_hidden, rope_delta
from alpamayo.text.rope import MRope
from alpamayo.text.weights import EMBED, validate_text_tensors
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceIO
from alpamayo.tt.device_spec import TILE, DeviceSpec, round_up
from alpamayo.tt.memory import check_fits
from alpamayo.tt.moe import TTMoE
from alpamayo.tt.precision import Precision, load_precision
from alpamayo.tt.program_config import (
    PREFILL_PAD,
    SDPA_DECODE_K_CHUNK,
    CoreGrid,
    DecodeMatmul,
    TextPlan,
    plan_text,
)
from alpamayo.tt.runtime import (
    close_device,
    device_unavailable_reason,
    dry_run_active,
    import_ttnn,
    open_device,
)
from alpamayo.tt.weight_cache import upload_weights
from alpamayo.tt.weights import TEXT_GROUPS, LayerGroups, residual_norm_eps, text_weight_specs

# Trace capture crashes the dry run's mock device (alpamayo.tt.dryrun): there the decode runs untraced.
DRY_RUN_NOTICE = "ttnn dry run: trace capture is card-only (it crashes the mock p150); decoding untraced"

# decode_layers[i](i, x, cos, sin, pos) -> x: x the residual [1, 1, 32, H_p] bf16 width-sharded over the plan's
# residual grid, cos/sin [1, 1, 32(1), head_dim] height-sharded on core (0, 0), pos [1] int32; the layer must
# return x in the same layout and write K/V row `pos` of kv_cache[i].
DecodeLayer = Callable[[int, Any, Any, Any, Any], Any]


@dataclass
class DeviceKVCache:
    """The device KV cache of one sequence: per layer (K, V), each [1, n_kv, rows, head_dim] in the recipe's
    kv_cache dtype (rows: `TextPlan.cache_length(max_seq_len + reserve_rows)`, see `setup_cache`)."""

    layers: list[tuple[Any, Any]]
    max_seq_len: int
    max_batch: int = 1


class TTTextModel(DeviceIO):
    """Device weights, KV cache and generation state of one text decoder on one Blackhole chip."""

    def __init__(
        self,
        cfg: ModelConfig,
        precision: Precision,
        plan: TextPlan,
        device: Any,
        weights: dict[str, Any],
        embed: torch.Tensor,
        tracer: Tracer | None = None,
        owns_device: bool = False,
    ):
        self.ttnn = ttnn = import_ttnn()
        self.cfg, self.text_cfg, self.precision, self.plan = cfg, cfg.text, precision, plan
        self.device, self.weights, self.owns_device = device, weights, owns_device
        self.layer_weights = [_layer_weights(weights, i) for i in range(cfg.text.num_hidden_layers)]
        self.embed_table = embed  # [V, H] bf16, host
        self.moe: dict[int, TTMoE] = {}
        self.tracer = tracer or Tracer(enabled=False)
        self.rope = MRope(cfg.text)
        self.cache: DeviceKVCache | None = None
        self.cache_len, self.rope_delta = 0, 0
        self.decode_layers: dict[int, DecodeLayer] = {}
        # cache rows kept behind max_seq_len by default: the action expert's K/V region (see setup_cache)
        self.reserved_rows = 0
        self._trace: dict[str, Any] | None = None
        self._inputs: dict[str, Any] | None = None
        self.dry_run, self._dry_run_noticed = dry_run_active(), False
        t = cfg.text
        self.scale = t.head_dim**-0.5
        self.hidden_padded = plan.hidden_padded
        self.residual_eps = residual_norm_eps(t, plan.device.dram_banks)
        matmuls = ("qkv", "o", "mlp_gate_up", "mlp_down", "experts", "router", "lm_head", "expert")
        ck = {op: cfgs.compute_config(ttnn, precision.math_fidelity(op)) for op in matmuls}
        ck["norm"] = cfgs.compute_config(ttnn, precision.math_fidelity("norm"), l1_acc=False)
        # fp32 accumulation in prefill SDPA overflows L1 at ~4.6K rows (seed design, measured); decode keeps it.
        ck["sdpa_prefill"] = cfgs.compute_config(
            ttnn, precision.math_fidelity("sdpa"), fp32_acc=False, l1_acc=False
        )
        ck["sdpa_decode"] = cfgs.compute_config(ttnn, precision.math_fidelity("sdpa"), l1_acc=False)
        self.ck = ck
        self.kv_dtype = cfgs.ttnn_dtype(ttnn, precision.dtype("kv_cache"))
        self.moe = {
            i: TTMoE(ttnn, device, plan.moe, self.layer_weights[i], ck, self.tracer) for i in t.sparse_layers
        }
        self._decode_setup()

    @property
    def tracer(self) -> Tracer:
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        """Stages of this model and of its MoE blocks go to `tracer`."""
        self._tracer = tracer
        for block in self.moe.values():
            block.tracer = tracer

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(
        cls,
        source: str | Path | Checkpoint,
        cfg: ModelConfig | None = None,
        precision: str | Precision = "performance",
        device: Any = None,
        cache_dir: str | Path | None = None,
        tracer: Tracer | None = None,
        moe: str | Path | MoEBlockConfig | None = None,
        extra_trace_bytes: int = 0,
    ) -> TTTextModel:
        """Plan, check the DRAM budget, open the device (unless given) and upload every weight.

        `cache_dir` keeps the packed weights as `.tensorbin` files (see `alpamayo.tt.weight_cache`). `moe`: the
        MoE block config (or its YAML file) of a model with sparse layers; see `model_block_config`.
        `extra_trace_bytes`: trace region for other models' traces on the device this opens (the action
        expert's step, `ExpertPlan.trace_region_bytes`).
        Everything that can be refused (no ttnn or no device, unsupported config, recipe, MoE block, plan,
        DRAM) is refused before the device is opened.
        """
        if device is None and (reason := device_unavailable_reason()) is not None:
            raise BackendUnavailable(reason)
        ckpt, cfg = open_checkpoint(source, cfg)
        block = model_block_config(cfg.text, moe)
        validate_text_tensors(ckpt, cfg)
        precision = load_precision(precision)
        plan = plan_text(cfg, precision, moe=block)
        check_fits(cfg, precision, PREFILL_PAD)
        owns = device is None
        device = open_device(plan.trace_region_bytes + extra_trace_bytes) if owns else device
        try:
            plan = plan_text(cfg, precision, DeviceSpec.from_device(device), moe=block)
            weights = _upload_weights(cfg, precision, plan, device, ckpt, cache_dir)
            embed = ckpt.get(EMBED, torch.bfloat16)
            return cls(cfg, precision, plan, device, weights, embed, tracer, owns_device=owns)
        except BaseException:
            if owns:
                close_device(device)
            raise

    def setup_cache(self, max_seq_len: int, max_batch: int = 1, reserve_rows: int | None = None) -> None:
        """Allocate the KV cache for `max_seq_len` positions (prompt + generated); refused if it cannot fit.
        `reserve_rows` (default `reserved_rows`, which a `TTActionExpert` sets) more rows are kept behind them
        for the action expert's K/V (`ExpertPlan`)."""
        reserve_rows = self.reserved_rows if reserve_rows is None else reserve_rows
        if max_batch != 1:
            raise ValueError(f"the ttnn backend decodes one sequence: max_batch must be 1, got {max_batch}")
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        check_fits(self.cfg, self.precision, max_seq_len, self.plan.device)
        self._release_trace()
        self._free_cache()
        ttnn, t = self.ttnn, self.text_cfg
        shape = (1, t.num_key_value_heads, self.plan.cache_length(max_seq_len + reserve_rows), t.head_dim)
        layers = [
            tuple(
                ttnn.zeros(
                    shape,
                    dtype=self.kv_dtype,
                    layout=ttnn.TILE_LAYOUT,
                    device=self.device,
                    memory_config=ttnn.DRAM_MEMORY_CONFIG,
                )
                for _ in range(2)
            )
            for _ in range(t.num_hidden_layers)
        ]
        self.cache = DeviceKVCache(layers, max_seq_len)
        self.reset()

    @property
    def kv_cache(self) -> list[tuple[Any, Any]]:
        """Per layer (K, V) device tensors; empty before `setup_cache`."""
        return self.cache.layers if self.cache is not None else []

    @property
    def max_seq_len(self) -> int:
        return self.cache.max_seq_len if self.cache is not None else 0

    def reset(self) -> None:
        self.cache_len, self.rope_delta = 0, 0

    def fork(self, n: int) -> None:
        if n != 1:
            raise ValueError(f"fork({n}): the ttnn backend decodes one sequence (n must be 1)")

    def close(self) -> None:
        """Release the decode trace, the KV cache, the weights and (when this model opened it) the device. The
        weights are freed even then: on a device shared with other models they would otherwise stay in DRAM."""
        self._release_trace()
        self._free_cache()
        if self._inputs is not None:
            self._free(*self._inputs.values())
            self._inputs = None
        self._free(*self.weights.values())
        self.weights, self.layer_weights, self.moe = {}, [], {}
        if self.owns_device and self.device is not None:
            close_device(self.device)
        self.device = None

    def __enter__(self) -> TTTextModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free_cache(self) -> None:
        for k, v in self.kv_cache:
            self._free(k, v)
        self.cache = None

    def _release_trace(self) -> None:
        if self._trace is not None:
            self.ttnn.release_trace(self.device, self._trace["id"])
            self._free(self._trace["out"])
            self._trace = None

    def _require_cache(self) -> None:
        if not self.kv_cache:
            raise RuntimeError("call setup_cache(max_seq_len) before prefill/decode")

    # ------------------------------------------------------------------ host <-> device
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> bf16 embeddings [..., H] (host lookup)."""
        check_token_ids(ids, self.text_cfg.vocab_size)
        return self.embed_table[ids.long()]

    # ------------------------------------------------------------------ prefill
    def _mm(self, x: Any, w: Any, op: str) -> Any:
        """Prefill matmul [1, 1, M, K] x [K, N] -> bf16 DRAM interleaved."""
        m, k, n = x.shape[-2], x.shape[-1], w.shape[-1]
        mm = cfgs.prefill_matmul(self.ttnn, self.plan.prefill_matmul(m, k, n))
        return self.ttnn.experimental.minimal_matmul(
            x,
            w,
            compute_kernel_config=self.ck[op],
            config=mm,
            dtype=self.ttnn.bfloat16,
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def _rms(self, x: Any, gamma: Any, eps: float) -> Any:
        return self.ttnn.rms_norm(
            x,
            epsilon=eps,
            weight=gamma,
            compute_kernel_config=self.ck["norm"],
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def _fill_cache(self, cache: Any, x: Any, padded_len: int, start: int = 0) -> None:
        """cache[0, :, start:start+Lp] = x ([1, n_kv, Lp, head_dim]) through a height-sharded copy of x;
        `start` is tile-aligned."""
        ttnn, t = self.ttnn, self.text_cfg
        cast = x.dtype != cache.dtype
        src = ttnn.typecast(x, cache.dtype) if cast else x  # fill_cache copies raw tiles: dtypes must match
        grid = self.plan.kv_fill_grid(padded_len)
        rows = t.num_key_value_heads * padded_len // grid.cores
        xs = ttnn.interleaved_to_sharded(src, cfgs.height_sharded(ttnn, rows, t.head_dim, grid))
        ttnn.fill_cache(cache, xs, 0, update_idx=start)
        self._free(xs, *([src] if cast else []))

    def _layer_prefill(self, i: int, h: Any, cos: Any, sin: Any, length: int) -> Any:
        """One decoder layer on h [1, 1, Lp, H_p] (freed; `length` prompt rows, the rest padding); fills K/V
        rows [0, Lp) of layer i and attends causally."""
        ttnn = self.ttnn
        padded_len = h.shape[-2]

        def attend(q: Any, k: Any, v: Any) -> Any:
            cache_k, cache_v = self.kv_cache[i]
            self._fill_cache(cache_k, k, padded_len)
            self._fill_cache(cache_v, v, padded_len)
            chunk = self.plan.prefill_sdpa_chunk(padded_len)
            return ttnn.transformer.scaled_dot_product_attention(
                q,
                k,
                v,
                is_causal=True,
                scale=self.scale,
                program_config=cfgs.sdpa(ttnn, self.plan.prefill_grid, chunk, chunk),
                compute_kernel_config=self.ck["sdpa_prefill"],
            )

        mlp = (lambda n2: self.moe[i].prefill(n2, length)) if i in self.moe else None
        return self.block_prefill(self.text_cfg, self.layer_weights[i], h, cos, sin, attend, mlp)

    def block_prefill(
        self,
        t: TextConfig,
        w: dict[str, Any],
        h: Any,
        cos: Any,
        sin: Any,
        attend: Callable[[Any, Any, Any], Any],
        mlp: Callable[[Any], Any] | None = None,
        ops: LayerGroups = TEXT_GROUPS,
        residual_eps: float | None = None,
    ) -> Any:
        """One pre-norm decoder block of dimensions `t` with weights `w` (`decoder_layer_specs` names) on all
        rows of h [1, 1, Lp, H_p] (freed) at rotary cos/sin [1, 1, Lp, head_dim]; the text layers and the
        action expert's share it. attend(q, k, v): the attention of the normed, rotated heads q
        [1, nh, Lp, hd], k and v [1, nkv, Lp, hd] -> [1, nh, Lp, hd]; mlp(n2): the block's MLP of the normed
        residual (default: the dense SwiGLU); `ops` names the matmuls' op groups (math fidelity)."""
        ttnn = self.ttnn
        eps = self.residual_eps if residual_eps is None else residual_eps
        n1 = self._rms(h, w["attn_norm.tile"], eps)
        qkv = self._mm(n1, w["wqkv"], ops.qkv)
        self._free(n1)
        q, k, v = ttnn.experimental.nlp_create_qkv_heads(
            qkv,
            num_heads=t.num_attention_heads,
            num_kv_heads=t.num_key_value_heads,
            transpose_k_heads=False,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        self._free(qkv)
        qn, kn = self._rms(q, w["q_norm.rm"], t.rms_norm_eps), self._rms(k, w["k_norm.rm"], t.rms_norm_eps)
        self._free(q, k)
        q = ttnn.experimental.rotary_embedding_hf(qn, cos, sin, is_decode_mode=False)
        k = ttnn.experimental.rotary_embedding_hf(kn, cos, sin, is_decode_mode=False)
        self._free(qn, kn)
        a = attend(q, k, v)
        self._free(q, k, v)
        ac = ttnn.experimental.nlp_concat_heads(a, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self._free(a)
        o = self._mm(ac, w["wo"], ops.o)
        self._free(ac)
        h2 = ttnn.add(h, o, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self._free(h, o)
        n2 = self._rms(h2, w["mlp_norm.tile"], eps)
        d = mlp(n2) if mlp is not None else self._mlp_prefill(w, n2, ops)
        self._free(n2)
        out = ttnn.add(h2, d, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self._free(h2, d)
        return out

    def _mlp_prefill(self, w: dict[str, Any], n2: Any, ops: LayerGroups = TEXT_GROUPS) -> Any:
        """Dense SwiGLU of n2 [1, 1, Lp, H_p] -> [1, 1, Lp, H_p] DRAM (n2 kept)."""
        ttnn = self.ttnn
        g, u = self._mm(n2, w["w_gate"], ops.gate_up), self._mm(n2, w["w_up"], ops.gate_up)
        m = ttnn.mul(
            g, u, input_tensor_a_activations=[ttnn.UnaryOpType.SILU], memory_config=ttnn.DRAM_MEMORY_CONFIG
        )
        self._free(g, u)
        d = self._mm(m, w["w_down"], ops.down)
        self._free(m)
        return d

    def _prefill_rope(self, position_ids: torch.Tensor, padded_len: int) -> tuple[Any, Any]:
        """cos/sin [1, 1, Lp, head_dim] on device; pad rows continue the text positions after the prompt."""
        length = position_ids.shape[1]
        pad = torch.arange(length, padded_len) + rope_delta(position_ids)
        rows = torch.cat([position_ids, pad.view(1, -1).expand(3, -1)], 1)
        cos, sin = self.rope.cos_sin(rows, torch.bfloat16)
        return self._upload(cos.view(1, 1, padded_len, -1)), self._upload(sin.view(1, 1, padded_len, -1))

    def _deepstack_rows(self, feats: torch.Tensor, mask: torch.Tensor, padded_len: int) -> Any:
        """DeepStack level [n_visual, H] scattered into zero rows [1, 1, Lp, H_p] (exact) on device.

        Scattered straight into the padded host tensor: going through a dense [L, H] copy took 56 ms instead
        of 25 ms per level for a 3000-row prompt at hidden 4096 (CPU, 2 cores)."""
        x = torch.zeros(1, 1, padded_len, self.hidden_padded, dtype=torch.bfloat16)
        x[0, 0, : mask.numel(), : self.text_cfg.hidden_size][mask.cpu()] = feats.cpu().to(torch.bfloat16)
        return self._upload(x)

    def _prefill_device(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None,
        visual_pos_mask: torch.Tensor | None,
        deepstack: Sequence[torch.Tensor] | None,
    ) -> tuple[Any, int]:
        """Fresh prompt through every layer and the final norm; returns (normed hidden [1,1,Lp,H_p], L)."""
        self._require_cache()
        ttnn = self.ttnn
        with self.tracer.span("tt.prefill_setup"):
            h = prompt_hidden(self.text_cfg, inputs, self.embed)
            length = h.shape[0]
            position_ids = check_prefill(
                self.text_cfg, length, self.max_seq_len, position_ids, visual_pos_mask, deepstack
            )
            self.reset()
            padded = self.plan.padded_length(length)
            hidden = self._rows(h, padded, self.hidden_padded)
            cos, sin = self._prefill_rope(position_ids, padded)
        with self.tracer.span("tt.prefill_layers", layers=self.text_cfg.num_hidden_layers, rows=padded):
            for i in range(self.text_cfg.num_hidden_layers):
                hidden = self._layer_prefill(i, hidden, cos, sin, length)
                if deepstack is not None and i < len(deepstack):
                    extra = self._deepstack_rows(deepstack[i], visual_pos_mask, padded)
                    added = ttnn.add(hidden, extra, memory_config=ttnn.DRAM_MEMORY_CONFIG)
                    self._free(hidden, extra)
                    hidden = added
            self._free(cos, sin)
            normed = self._rms(hidden, self.weights["norm.tile"], self.residual_eps)
            self._free(hidden)
            ttnn.synchronize_device(self.device)
        self.cache_len, self.rope_delta = length, rope_delta(position_ids)
        return normed, length

    def prefill_hidden(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden [L, H] bf16 (arguments as `TextModel.prefill_hidden`); fills the KV cache."""
        normed, length = self._prefill_device(inputs, position_ids, visual_pos_mask, deepstack)
        out = self._download(normed)[0, 0, :length, : self.text_cfg.hidden_size]
        self._free(normed)
        return out

    def prefill(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Prefill a prompt; float32 logits [V] of its last position (only that row's tile reaches the head)."""
        ttnn = self.ttnn
        normed, length = self._prefill_device(inputs, position_ids, visual_pos_mask, deepstack)
        with self.tracer.span("tt.prefill_head"):
            r0 = (length - 1) // TILE * TILE
            last = ttnn.slice(normed, [0, 0, r0, 0], [1, 1, r0 + TILE, self.hidden_padded])
            self._free(normed)
            last_l1 = ttnn.to_memory_config(last, ttnn.L1_MEMORY_CONFIG)
            self._free(last)
            logits = self._head(last_l1, length - 1 - r0)
            self._free(last_l1)
            out = self._download(logits)[0, 0, length - 1 - r0, : self.text_cfg.vocab_size].float()
            self._free(logits)
        return out

    def _head(self, x: Any, row: int) -> Any:
        """lm_head of [1, 1, 32, H_p] (L1 interleaved) -> row `row` (and those above it) untilized, [.., V_p]."""
        ttnn = self.ttnn
        logits = ttnn.linear(
            x,
            self.weights["lm_head"],
            compute_kernel_config=self.ck["lm_head"],
            program_config=cfgs.head_matmul(ttnn, self.plan.head),
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
            dtype=ttnn.bfloat16,
        )
        # untilizing only the needed rows: 0.03 ms + 0.06 ms read vs 2.6 ms for the padded tile (seed, measured)
        rows = ttnn.untilize_with_unpadding(
            logits, [0, 0, row, self.plan.head.n_padded - 1], memory_config=ttnn.DRAM_MEMORY_CONFIG
        )
        self._free(logits)
        return rows

    def layer_prefill(self, i: int, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Decoder layer `i` alone on hidden [L, H] at position_ids [3, L] -> [L, H] bf16 (tests, per-layer
        PCC). Writes K/V rows [0, Lp) of layer i and sets the decode position state as a prefill would."""
        self._require_cache()
        length = hidden.shape[0]
        position_ids = check_prefill(self.text_cfg, length, self.max_seq_len, position_ids, None, None)
        padded = self.plan.padded_length(length)
        cos, sin = self._prefill_rope(position_ids, padded)
        out = self._layer_prefill(i, self._rows(hidden, padded, self.hidden_padded), cos, sin, length)
        result = self._download(out)[0, 0, :length, : self.text_cfg.hidden_size]
        self._free(out, cos, sin)
        self.cache_len, self.rope_delta = length, rope_delta(position_ids)
        return result

    # ------------------------------------------------------------------ decode
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
            x = self.decode_layers.get(i, self._layer_decode)(i, x, cos, sin, inputs["pos"])
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

    def traced_here(self, traced: bool) -> bool:
        """`traced`, except under a dry run, where trace capture crashes the mock device: False then (the text
        model's decode and the action expert's steps run untraced), said once on stderr."""
        if traced and self.dry_run:
            if not self._dry_run_noticed:
                print(DRY_RUN_NOTICE, file=sys.stderr)
                self._dry_run_noticed = True
            return False
        return traced

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
        ttnn = self.ttnn
        traced = self.traced_here(traced)
        inputs = self._write_inputs(self._decode_host_inputs(token, self.cache_len))
        if not traced:
            with self.tracer.span("tt.decode_untraced"):
                row = self._decode_graph(inputs)
            logits = self._logits(row)
            self._free(row)
        elif self._trace is None:
            with self.tracer.span("tt.decode_compile_and_capture"):
                row = self._decode_graph(inputs)
                logits = self._logits(row)
                self._free(row)
                # recapturing the same position rewrites the same K/V row: idempotent
                trace_id = ttnn.begin_trace_capture(self.device, cq_id=0)
                out = self._decode_graph(inputs)
                ttnn.end_trace_capture(self.device, trace_id, cq_id=0)
                ttnn.synchronize_device(self.device)
            self._trace = {"id": trace_id, "out": out}
        else:
            with self.tracer.span("tt.decode_trace_execute"):
                ttnn.execute_trace(self.device, self._trace["id"], cq_id=0, blocking=True)
            logits = self._logits(self._trace["out"])
        self.cache_len += 1
        return logits

    def layer_decode(self, i: int, hidden: torch.Tensor, position: int) -> torch.Tensor:
        """Decoder layer `i` alone on hidden [H] at cache index `position` (untraced) -> [H] bf16 (tests,
        per-layer PCC). Writes K/V row `position` of layer i; the rope position is `position + rope_delta`."""
        self._require_cache()
        if not 0 <= position < self.max_seq_len:
            raise ValueError(f"position {position} must be in [0, max_seq_len={self.max_seq_len})")
        t = self.text_cfg
        values = self._decode_host_inputs(0, position)
        values["x"][0, 0, 0, : t.hidden_size] = hidden.to(torch.bfloat16)
        inputs = self._write_inputs(values)
        x, cos, sin = self._sharded_inputs(inputs)
        out = self.decode_layers.get(i, self._layer_decode)(i, x, cos, sin, inputs["pos"])
        result = self._download(out)[0, 0, 0, : t.hidden_size]
        self._free(out, cos, sin)
        return result

    def kv_cache_host(self, i: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of layer i, positions [0, length): [n_kv, length, head_dim] float32 each (tests)."""
        return tuple(self._download(c)[0, :, :length].float() for c in self.kv_cache[i])


def _layer_weights(weights: dict[str, Any], i: int, scope: str = "") -> dict[str, Any]:
    """Layer i's device weights keyed without the `{scope}layers.{i}.` prefix (wqkv, attn_norm.rm, ...);
    `scope` is "expert." for the action expert's layers."""
    prefix = f"{scope}layers.{i}."
    return {name[len(prefix) :]: w for name, w in weights.items() if name.startswith(prefix)}


def _upload_weights(
    cfg: ModelConfig,
    precision: Precision,
    plan: TextPlan,
    device: Any,
    ckpt: Checkpoint,
    cache_dir: str | Path | None,
) -> dict[str, Any]:
    """Every text `WeightSpec` (experts through their per-projection views) on its device placement."""
    banks = plan.device.dram_banks
    specs = text_weight_specs(cfg, banks)
    return upload_weights(specs, precision, device, ExpertView(cfg.text, ckpt.get), cache_dir, banks)
