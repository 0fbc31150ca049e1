"""The Qwen3-VL text backbone on one Blackhole p150: prefill and traced decode of up to 32 rows.

Same interface and tensor contract as the torch reference `alpamayo.text.TextModel`:

    model = TTTextModel.from_checkpoint(ckpt_dir, precision="performance")
    model.setup_cache(max_seq_len=4096)
    logits = model.prefill(inputs, position_ids, visual_pos_mask, deepstack)   # [V] float32
    logits = model.decode(next_id)                                             # [V] float32
    model.fork(k); logits = model.decode(ids)                                  # ids [K] -> [K, V]
    logits = model.verify(block)                                               # [1, T] -> [1, T, V]
    model.rollback(lengths)                                                    # per-row accepted prefix
    model.close()                                                              # releases trace and device

Host side (as tt-metal's Qwen-VL demos): token embedding lookup, M-RoPE cos/sin tables (`alpamayo.text.rope`),
the scatter of DeepStack features into zero rows. Device side, every grid and block size from
`alpamayo.plan.programs.text.plan_text`:

Prefill (the whole prompt in one pass, rows padded to a multiple of 128 with continuation positions, which
causal attention keeps away from the real rows): `minimal_matmul` on 11x10 with the DRAM-sharded weights,
interleaved RMSNorm with TILE gammas, per-head q/k RMSNorm, HF rotary on host cos/sin, K/V written to the
cache from a height-sharded copy (`fill_cache` mis-addresses interleaved multi-head inputs), causal SDPA
chunked by the padded length, SiLU fused into the gate * up multiply, DeepStack level k added after layer k,
final norm and the lm_head on the last prompt row's tile only.

Decode (up to 32 rows of one tile, each at its own cache index: K samples in their own cache slots, or the T
tokens of a verify block on one slot): residual stream width-sharded in L1, sharded RMSNorm,
DRAM-sharded matmuls (SiLU fused into the gate matmul), decode-mode head split, q/k norm and rotary, paged
cache update and flash-decode SDPA reading the position from a device tensor, head concat, lm_head with the rows
untilized. Each program is captured once as a trace whose persistent inputs (embedding row, cos, sin, position)
are rewritten in place before each replay; `close()` releases it.

Sparse MoE layers (Qwen3-VL-MoE) run their MLP as `alpamayo.tt.moe.TTMoE`, configured by the model's
validated `MoEBlockConfig` (`alpamayo.config.builtin.block_config_for`): top-k sparse expert matmuls in decode
(inside the trace), expert-grouped matmuls in prefill.

The residual stream is `hidden_p` = hidden rounded up to 32 x DRAM banks wide (zero columns; see
`alpamayo.plan.weights`): host inputs are zero-padded to it and outputs cut back to hidden.

Modules, one block each: `model` (`TTTextModel`: construction, KV cache set-up, rows; delegates to the
blocks), `weights` (`TextWeights` / `LayerWeights`: the device weights, uploaded by name and held per block),
`kernels` (`TextKernels`: ttnn, device, tracer, plan, compute-kernel configs and the shared prefill ops),
`head` (`TextHead`: embedding table, final norm, lm_head), `layer` (`DecoderLayer`: one layer's weights,
MoE block, prefill and decode), `cache` (`DeviceKVCache`, `RowState`), `prefill` (`TextPrefill`: the prompt
pass and its captured layers), `decode_programs` (`DecodePrograms`: the decode step's memory and program
configs and sharded ops), `decode_inputs` (`DecodeInputs`: a decode program's persistent inputs), `decode`
(`TextDecode`: decode and verify steps, their persistent inputs and traces), `trace` (capture and replay,
and the dry-run switch that keeps traces off the mock device).
"""

from alpamayo.tt.text.model import DeviceKVCache, TTTextModel
from alpamayo.tt.text.trace import DRY_RUN_NOTICE, GOLDEN_NOTICE

__all__ = ["DRY_RUN_NOTICE", "GOLDEN_NOTICE", "DeviceKVCache", "TTTextModel"]
