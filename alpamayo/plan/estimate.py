"""Time estimates of the ttnn stages on one chip, from the device's compute and bandwidth figures (no device).

An ESTIMATE, a roofline lower bound: every matmul costs the larger of its FLOPs at the grid's peak rate for its
math fidelity (`DeviceSpec.matmul_flops_per_cycle` per core per cycle, divided by the fidelity's passes) and
its weight bytes at the DRAM bandwidth; every attention the larger of its FLOPs and its K/V reads. Norms,
eltwise ops, activation traffic, dispatch and the kernels' real efficiency are not modelled, so a card runs
slower than this; what the figures are for is comparing recipes and seeing which resource bounds a stage.

The ops are read off the `WeightSpec`s the device holds (`alpamayo.plan.weights`), so the estimate uses exactly
the padded shapes and the recipe's dtypes and fidelities the memory plan counts:

  * a linear weight `[K, N]` applied to M rows: 2 M K N FLOPs, its tile bytes read once;
  * routed MoE experts `[1, E, K, N]`: each row runs through k of the E experts (k/E of the FLOPs); decode
    reads the k experts' weights, prefill every expert's;
  * a prefill-style SDPA (prefill, vision, the DFlash draft) of Sq query rows to Sk keys over all heads:
    4 Sq Sk n_heads head_dim FLOPs (halved when causal), on the cores its batch x heads x Q chunks fill
    (`sdpa_cores`); a flash-decode (decode, verify) of one row: its tile of heads against every K/V head,
    4 x 32 x Sk x head_dim FLOPs per K/V head at up to 32 heads, on its grid (`flash_decode_cores`); the
    action expert's flash-decode: each slot's K/V heads' query tiles (`ExpertPlan`) over their keys; each
    reads K and V once per layer at the KV cache dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from alpamayo.config.expert import ExpertConfig
from alpamayo.config.model import ModelConfig, TextConfig
from alpamayo.drafts.dflash import DFlashConfig
from alpamayo.plan.device_spec import P150, TILE, DeviceSpec, round_up
from alpamayo.plan.draft_weights import draft_cache_rows, draft_weight_specs
from alpamayo.plan.dram import kv_bytes, spec_bytes
from alpamayo.plan.expert_weights import expert_weight_specs
from alpamayo.plan.precision import Precision
from alpamayo.plan.programs.expert import plan_expert
from alpamayo.plan.programs.grid import flash_decode_cores, model_name, sdpa_cores
from alpamayo.plan.programs.text import BLOCK_SDPA_POSITIONS, block_sdpa_applies, plan_text
from alpamayo.plan.programs.vision import VISION_SDPA_CHUNK, plan_vision
from alpamayo.plan.vision_weights import vision_weight_specs
from alpamayo.plan.weights import (
    BF16_GROUPS,
    WeightSpec,
    rotary_head_dim,
    text_weight_specs,
    weight_dtype,
)

Timer = Callable[["StageEstimate"], float]  # ms of one pass of a stage (the roofline, the expected model)
FIDELITY_PASSES = {"lofi": 1, "hifi2": 2, "hifi3": 3, "hifi4": 4}
MATMUL_GROUPS_BF16 = ("router",)  # bf16 tensors that are matmul weights (norms and biases are not)
# Device programs of one decode layer, from the dry run's graph capture (docs/ttnn.md, "Dry run": 29 per dense
# layer at 2B/8B/32B, 57 per MoE layer): an MoE layer's norms, eltwise ops and dispatches count ~twice.
DENSE_LAYER_PROGRAMS, MOE_LAYER_PROGRAMS = 29, 57
BF16_BYTES = 2  # host <-> device activations, logits rows and embeddings are bf16


def layer_passes(cfg: TextConfig) -> float:
    """The decoder layers of `cfg` in dense-layer equivalents of device programs (`MOE_LAYER_PROGRAMS`)."""
    sparse = len(cfg.sparse_layers)
    return cfg.num_hidden_layers - sparse + sparse * MOE_LAYER_PROGRAMS / DENSE_LAYER_PROGRAMS


def logits_bytes(cfg: TextConfig, rows: int) -> float:
    """Host bytes of `rows` bf16 logits rows (the device untilizes the rows it returns: padded vocabulary)."""
    return rows * round_up(cfg.vocab_size, TILE) * BF16_BYTES


@dataclass(frozen=True)
class OpCost:
    """One device op: FLOPs at `fidelity` on `cores` cores (busy on average: `sdpa_cores`) and the DRAM bytes
    it must read."""

    name: str
    flops: float
    dram_bytes: float
    fidelity: str
    cores: float

    def _times(self, device: DeviceSpec) -> tuple[float, float]:
        """Seconds of the op's FLOPs at the grid's rate for its fidelity, and of its DRAM reads."""
        rate = self.cores * device.clock_hz * device.matmul_flops_per_cycle / FIDELITY_PASSES[self.fidelity]
        return self.flops / rate, self.dram_bytes / device.dram_bandwidth

    def seconds(self, device: DeviceSpec) -> float:
        return max(self._times(device))

    def bound(self, device: DeviceSpec) -> str:
        compute, dram = self._times(device)
        return "compute" if compute >= dram else "DRAM"


@dataclass(frozen=True)
class StageEstimate:
    """The ops of one pass of a stage (a prefill, one decode step, one expert Euler step), `repeat` passes per
    prediction, and what the roofline leaves out but the expected model (`alpamayo.plan.calibration`) counts:
    `layers` decoder layers (or vision blocks) per pass, MoE layers weighted by their device programs
    (`layer_passes`), dispatched from a trace (`traced`: decode, verify, expert, draft) or op by op from the
    host (prefill, vision), and `host_bytes` copied between host and device per pass."""

    name: str
    ops: tuple[OpCost, ...]
    repeat: int = 1
    layers: float = 0.0
    traced: bool = True
    host_bytes: float = 0.0

    def ms(self, device: DeviceSpec) -> float:
        """Estimated ms of one pass."""
        return 1e3 * sum(op.seconds(device) for op in self.ops)

    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    def dram_bytes(self) -> float:
        return sum(op.dram_bytes for op in self.ops)

    def compute_share(self, device: DeviceSpec) -> float:
        """Fraction of the estimated time in compute-bound ops."""
        total = sum(op.seconds(device) for op in self.ops)
        return sum(op.seconds(device) for op in self.ops if op.bound(device) == "compute") / total

    def describe(self, device: DeviceSpec) -> str:
        per = self.ms(device)
        times = f" x {self.repeat} = {per * self.repeat:.2f} ms" if self.repeat > 1 else ""
        return (
            f"{self.name:<22} {per:8.3f} ms{times} ({self.flops() / 1e9:.1f} GFLOP, "
            f"{self.dram_bytes() / 1e9:.3f} GB read, {100 * self.compute_share(device):.0f}% of it compute-bound)"
        )


def _is_matmul(spec: WeightSpec) -> bool:
    return (
        spec.layout == "tile"
        and (spec.group not in BF16_GROUPS or spec.group in MATMUL_GROUPS_BF16)
        # [K, N] linears and [1, E, K, N] routed experts (the 4-D test once read padded[0], always 1 for the
        # experts, which left every MoE estimate without its experts)
        and ((len(spec.padded) == 2 and spec.padded[0] > 1) or (len(spec.padded) == 4 and spec.padded[1] > 1))
    )


def matmul_ops(
    specs: Iterable[WeightSpec],
    rows: int,
    precision: Precision,
    cores: int,
    experts_per_token: int = 0,
    all_experts_read: bool = True,
) -> list[OpCost]:
    """OpCosts of every matmul weight in `specs` applied to `rows` activation rows (padded to whole tiles).

    Routed experts (`[1, E, K, N]`) run each row through `experts_per_token` of them; their weights are all
    read when `all_experts_read` (prefill), else those the rows can reach: at most rows x k of them (decode,
    verify)."""
    m = round_up(rows, TILE)
    ops = []
    for spec in specs:
        if not _is_matmul(spec):
            continue
        dtype = weight_dtype(spec, precision)
        k, n = spec.padded[-2], spec.padded[-1]
        weight: float = spec_bytes(spec, dtype)
        flops = 2.0 * m * k * n
        if len(spec.padded) == 4:  # routed experts
            experts = spec.padded[1]
            flops *= experts_per_token
            reached = min(experts, rows * experts_per_token)
            weight = weight if all_experts_read else weight * reached / experts
        ops.append(OpCost(spec.name, flops, weight, precision.math_fidelity(spec.group), cores))
    return ops


def attention_ops(
    cfg: TextConfig, q_rows: int, keys: int, precision: Precision, cores: float, causal: bool, name: str
) -> list[OpCost]:
    """One prefill-style attention OpCost per layer of `cfg`: `q_rows` queries over `keys` cached positions."""
    flops = 4.0 * round_up(q_rows, TILE) * keys * cfg.num_attention_heads * cfg.head_dim
    return _layer_attention(cfg, flops * (0.5 if causal else 1.0), keys, precision, cores, name)


def decode_attention_ops(
    cfg: TextConfig, keys: int, precision: Precision, cores: float, name: str
) -> list[OpCost]:
    """One flash-decode OpCost per layer of `cfg` (`ttnn.transformer.scaled_dot_product_attention_decode`)
    for one query row over `keys` cached positions: its query heads, padded to whole 32-row tiles, are one Q
    chunk that every K/V head multiplies in full (the kernel reads the chunk once and runs it against each of
    its K/V heads' chunks; the writer keeps the n_heads / n_kv rows of that head's group: ttnn 0.81.1's
    `sdpa_flash_decode.cpp` and `writer_decode_all.cpp`), so 4 x round_up(n_heads, 32) x keys x head_dim
    FLOPs per K/V head, and K and V read once."""
    flops = 4.0 * round_up(cfg.num_attention_heads, TILE) * keys * cfg.head_dim * cfg.num_key_value_heads
    return _layer_attention(cfg, flops, keys, precision, cores, name)


def _layer_attention(
    cfg: TextConfig, flops: float, keys: int, precision: Precision, cores: float, name: str
) -> list[OpCost]:
    """One attention OpCost per layer of `cfg`: `flops` at the `sdpa` fidelity, `keys` positions of K and V
    read at the KV cache dtype."""
    kv = kv_bytes(cfg, keys, precision.dtype("kv_cache"))
    fidelity = precision.math_fidelity("sdpa")
    return [OpCost(f"{name}.{i}", flops, kv, fidelity, cores) for i in range(cfg.num_hidden_layers)]


def vision_estimate(
    cfg: ModelConfig, precision: Precision, frames: int, frame_hw: tuple[int, int]
) -> StageEstimate:
    """The vision tower over `frames` images of `frame_hw` pixels, one forward per image as the runtime
    encodes them (`alpamayo.runtime.AlpamayoVLA._features`: each frame its cache misses, on its own): the
    image's patches padded to whole SDPA chunks (`VisionPlan.padded_length`), the mergers on a quarter of
    those rows, and its windowed SDPA over every padded row (the padding rows are a window of their own in
    the last chunk, which the image's window reaches too)."""
    v = cfg.vision
    if v is None:
        raise ValueError(f"{model_name(cfg)} has no vision tower to estimate")
    plan = plan_vision(v)
    rows = plan.padded_length((frame_hw[0] // v.patch_size) * (frame_hw[1] // v.patch_size))
    cores = plan.grid.cores
    specs = vision_weight_specs(v)
    ops = matmul_ops([s for s in specs if "merger" not in s.name], rows, precision, cores)
    ops += matmul_ops(
        [s for s in specs if "merger" in s.name], rows // v.spatial_merge_size**2, precision, cores
    )
    lanes = v.num_heads * rotary_head_dim(v.head_dim)
    flops = 4.0 * rows * rows * lanes
    busy = sdpa_cores(cores, v.num_heads * rows // VISION_SDPA_CHUNK)
    ops += [
        OpCost(f"vision.sdpa.{j}", flops, 0.0, precision.math_fidelity("sdpa"), busy)  # `TTVisionEncoder.ck`
        for j in range(v.depth)
    ]
    # per frame: its patch rows in, the merger's image rows and every DeepStack level out
    io = rows * v.patch_dim + rows // v.spatial_merge_size**2 * v.out_hidden_size * (
        1 + len(v.deepstack_visual_indexes)
    )
    return StageEstimate(
        f"vision ({frames} frames)", tuple(ops), frames, v.depth, traced=False, host_bytes=io * BF16_BYTES
    )


def prefill_estimate(
    cfg: ModelConfig, precision: Precision, prompt: int, image_rows: int = 0
) -> StageEstimate:
    """The text prefill of `prompt` rows (padded as the device pads them); the lm_head on the last tile only.
    Host traffic: the token ids, `image_rows` image embeddings with every DeepStack level in (the vision
    tower's host outputs), the last row's logits out."""
    plan = plan_text(cfg, precision)
    rows = plan.padded_length(prompt)
    cores = plan.prefill_grid.cores
    specs = text_weight_specs(cfg, plan.device.dram_banks)
    k = cfg.text.moe.num_experts_per_tok if cfg.text.moe is not None else 0
    ops = matmul_ops([s for s in specs if s.name != "lm_head"], rows, precision, cores, k)
    ops += matmul_ops([s for s in specs if s.name == "lm_head"], TILE, precision, cores)
    busy = sdpa_cores(cores, cfg.text.num_attention_heads * rows // plan.prefill_sdpa_chunk(rows))
    ops += attention_ops(cfg.text, rows, rows, precision, busy, causal=True, name="prefill.sdpa")
    levels = 1 + (len(cfg.vision.deepstack_visual_indexes) if cfg.vision is not None else 0)
    io = 4 * prompt + image_rows * cfg.text.hidden_size * levels * BF16_BYTES + logits_bytes(cfg.text, 1)
    return StageEstimate(
        f"prefill ({prompt} rows)", tuple(ops), 1, layer_passes(cfg.text), traced=False, host_bytes=io
    )


def decode_estimate(cfg: ModelConfig, precision: Precision, context: int, tokens: int) -> StageEstimate:
    """One decode step at `context` cached positions, `tokens` steps per prediction."""
    plan = plan_text(cfg, precision)
    cores = plan.qkv.grid.cores
    k = cfg.text.moe.num_experts_per_tok if cfg.text.moe is not None else 0
    specs = text_weight_specs(cfg, plan.device.dram_banks)
    ops = matmul_ops(specs, 1, precision, cores, k, all_experts_read=False)  # one row of a 32-row tile
    ops += decode_attention_ops(cfg.text, context, precision, plan.sdpa_decode_grid.cores, "decode.sdpa")
    return StageEstimate(
        "decode step", tuple(ops), tokens, layer_passes(cfg.text), host_bytes=logits_bytes(cfg.text, 1)
    )


def expert_estimate(
    cfg: ModelConfig, expert: ExpertConfig, precision: Precision, max_seq_len: int, samples: int, offset: int
) -> StageEstimate:
    """One Euler step of the action expert (`plan_expert`): every layer on the 64 x K action rows, its
    attention a paged flash-decode of every slot's K/V heads (`ExpertPlan`: each user's 64 x group query
    rows over the K chunks of its own region and prefix, `ExpertPlan.attended_rows` for samples at cache
    `offset`, prompt plus reasoning, on `flash_decode_cores` of the whole grid), the in- and out-projections."""
    plan = plan_expert(cfg, expert, precision, max_seq_len, samples)
    ops = matmul_ops(expert_weight_specs(expert), plan.rows, precision, plan.grid.cores)
    keys = plan.attended_rows(offset)
    flops = 4.0 * plan.q_tiles * TILE * keys * expert.text.head_dim * plan.users
    busy = flash_decode_cores(plan.sdpa_grid, plan.users)
    ops += _layer_attention(expert.text, flops, keys * samples, precision, busy, "expert.sdpa")
    # the noise goes in and the actions come out once per prediction, not per step
    return StageEstimate(
        f"expert step (K={samples})",
        tuple(ops),
        expert.num_inference_steps,
        layer_passes(expert.text),
    )


def verify_estimate(
    cfg: ModelConfig, precision: Precision, context: int, block: int, steps: int
) -> StageEstimate:
    """One verify of a `block`-token speculative block at `context` cached positions, `steps` per prediction:
    the block's tokens are rows of one decode program (`alpamayo.tt.text.decode`), so up to 32 of them read
    every weight once, as one decode step does. Its attention (`DecoderLayer.block_sdpa`, where
    `block_sdpa_applies`) reads the context's K/V once per `BLOCK_SDPA_POSITIONS` rows, each of its n_kv
    users attending with one full 32-row tile of heads per position, on the whole grid (`block_sdpa_grid`);
    otherwise each row's flash-decode reads the K/V itself, on the decode grid. One row (T = 1) is a decode
    step. One sequence's block, as the plan's reasoning; K rows' blocks in one program read the weights once
    for all K x T rows and each slot's K/V as here."""
    plan = plan_text(cfg, precision)
    t = cfg.text
    k = t.moe.num_experts_per_tok if t.moe is not None else 0
    specs = text_weight_specs(cfg, plan.device.dram_banks)
    ops = matmul_ops(specs, block, precision, plan.qkv.grid.cores, k, all_experts_read=False)
    if block > 1 and block_sdpa_applies(t.num_attention_heads):
        reads, cores = (
            -(-block // BLOCK_SDPA_POSITIONS),
            flash_decode_cores(plan.block_sdpa_grid, t.num_key_value_heads),
        )
    else:
        reads, cores = block, plan.sdpa_decode_grid.cores
    sdpa = decode_attention_ops(t, context, precision, cores, "verify.sdpa")
    # either way each row's tile of heads meets every K/V head once: block x one row's FLOPs
    ops += [replace(op, flops=op.flops * block, dram_bytes=op.dram_bytes * reads) for op in sdpa]
    return StageEstimate(
        f"verify ({block} rows)", tuple(ops), steps, layer_passes(t), host_bytes=logits_bytes(t, block)
    )


# z-lab's DFlash drafts (dflash/model.py): a few dense Qwen3 layers at the target's dimensions reading the
# concatenated hidden states of `target_layer_ids` through `fc`, and the target's own lm_head
DFLASH_LAYERS, DFLASH_CONTEXT_LAYERS = 2, 5


def dflash_draft_estimate(
    cfg: ModelConfig,
    precision: Precision,
    block: int,
    steps: int,
    context: int,
    layers: int = DFLASH_LAYERS,
    context_layers: int = DFLASH_CONTEXT_LAYERS,
) -> StageEstimate:
    """One DFlash block on the device as `alpamayo.tt.draft` runs it, `steps` per prediction, with the
    device's own tensors (`draft_weight_specs`) at the recipe's dtypes, prefill-style on the prefill grid:
    the block program (every draft layer on the block's 32-row tile, a masked SDPA of the tile over the
    draft's whole cache slot per layer, `draft_cache_rows(context)` keys; the target's lm_head on the tile)
    and the context append (fc and every layer's qkv on the accepted positions with the re-projected partial
    tile: at most 31 + `block` rows)."""
    t = replace(cfg.text, moe=None, num_hidden_layers=layers)
    draft = DFlashConfig(t, block, 0, tuple(range(context_layers)))
    plan = plan_text(cfg, precision)
    cores = plan.prefill_grid.cores
    specs = draft_weight_specs(draft)
    head = [s for s in text_weight_specs(cfg, plan.device.dram_banks) if s.name == "lm_head"]
    ops = matmul_ops([s for s in specs if s.name != "draft.fc"] + head, TILE, precision, cores)
    ops += attention_ops(t, TILE, draft_cache_rows(context), precision, cores, False, "draft.sdpa")
    append = [s for s in specs if s.name == "draft.fc" or s.name.endswith(".wqkv")]
    ops += [
        replace(op, name=f"{op.name}.append") for op in matmul_ops(append, TILE - 1 + block, precision, cores)
    ]
    return StageEstimate(
        f"DFlash draft ({layers} layers, {block} rows)",
        tuple(ops),
        steps,
        layers,
        host_bytes=logits_bytes(
            cfg.text, block - 1
        ),  # the drafted rows' logits (`TTDFlashDraft.block_logits`)
    )


def roofline_timer(device: DeviceSpec = P150) -> Timer:
    """The roofline's ms of one pass of a stage (`StageEstimate.ms`), as a `Timer`."""
    return lambda stage: stage.ms(device)


def first_block_ms(
    cfg: ModelConfig,
    precision: Precision,
    prompt: int,
    drafted: int,
    device: DeviceSpec = P150,
    timer: Timer | None = None,
) -> float:
    """What verifying `drafted` tokens inside the prefill of `prompt` rows adds to it
    (`TextPrefill.prefill_block`): the padded rows they need beyond the prompt's (none while they fit its
    padding to a multiple of 128) and one more lm_head pass per tile their scored rows cross into; timed
    by `timer` (ms of one pass; default the roofline)."""
    time = timer or roofline_timer(device)
    extra = time(prefill_estimate(cfg, precision, prompt + drafted))
    extra -= time(prefill_estimate(cfg, precision, prompt))
    plan = plan_text(cfg, precision)
    head = [s for s in text_weight_specs(cfg, plan.device.dram_banks) if s.name == "lm_head"]
    tiles = (prompt + drafted - 1) // TILE - (prompt - 1) // TILE
    head_ms = StageEstimate("lm_head", tuple(matmul_ops(head, TILE, precision, plan.prefill_grid.cores)))
    return extra + tiles * time(head_ms)


def hz(ms: float) -> str:
    """Predictions per second of `ms` per prediction."""
    return f"{1e3 / ms:.2f} Hz"


def both(values: dict[str, float]) -> str:
    """'roofline X ms (Y Hz), expected Z ms (W Hz)' of a total per prediction in each of `values`' columns."""
    return ", ".join(f"{name} {ms:7.1f} ms ({hz(ms)})" for name, ms in values.items())


def speculative_lines(
    cfg: ModelConfig,
    precision: Precision,
    context: int,
    tokens: int,
    accept_len: float,
    block: int,
    plain_total: dict[str, float],
    timers: dict[str, Timer],
    device: DeviceSpec = P150,
    tick_total: dict[str, float] | None = None,
    stage_lines: Callable[[StageEstimate], list[str]] | None = None,
) -> list[str]:
    """The per-prediction estimate with speculation, in every column of `timers` (ms of one pass of a stage:
    the roofline and the expected model; `plain_total` and `tick_total` are their totals without it):
    `tokens` reasoning tokens at `accept_len` tokens per verify (the accepted prefix plus the target's own
    token), so ceil(tokens / accept_len) verifies of `block` rows replace the `tokens` decode steps inside
    the plain total of a first prediction and of a stream's tick (where given); with a model-free draft
    (lookup, previous: host only, which proposes the first block before the prefill: it is verified there,
    at `first_block_ms` for its block - 1 drafted rows, and one verify fewer runs) and with a DFlash draft on
    the device (it drafts from the prefill's features: every block is a verify). `context`: the prompt plus
    the `tokens`. `stage_lines` prints a stage (default its roofline line). The last lines are the roofline's
    model-free floor at this accepted length: the rest of the prediction, the first block and the verifies'
    reads (every weight and the context's K/V once each), and what fidelity trades (for a user recipe) or a
    longer accepted length would take off it."""
    if not 1 <= accept_len <= block:
        raise ValueError(f"--accept-len {accept_len}: must be in [1, block size {block}]")
    if not 1 <= block <= TILE:
        raise ValueError(f"--block-size {block}: must be in [1, {TILE}] (the rows of one decode program)")
    steps = int(-(-tokens // accept_len))
    plain = decode_estimate(cfg, precision, context, tokens)
    verify = verify_estimate(cfg, precision, context, block, steps)
    draft = dflash_draft_estimate(cfg, precision, block, steps, context)
    show = stage_lines or (lambda stage: [f"  {stage.describe(device)}"])
    first, free, dflash, per_verify = {}, {}, {}, {}
    for name, time in timers.items():
        first[name] = first_block_ms(cfg, precision, context - tokens, block - 1, device, time)
        # what speculation changes in a prediction: model-free (first block in the prefill), DFlash (every block)
        free[name] = first[name] + time(verify) * (steps - 1) - time(plain) * tokens
        dflash[name] = (time(verify) + time(draft)) * steps - time(plain) * tokens
        per_verify[name] = f"{time(verify) / time(plain):.2f}x"
    costs = ", ".join(f"{v} ({k})" for k, v in per_verify.items())
    lines = [
        f"WITH SPECULATION at {accept_len:g} tokens per verify ({tokens} tokens: {steps} verifies of {block} "
        f"rows; a verify costs {costs} a decode step)",
        *show(verify),
        *show(draft),
        f"  first block verified in the prefill ({block - 1} drafted rows, model-free drafts): "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in first.items())
        + f" instead of a verify, then {steps - 1} verifies",
        "  total per prediction, model-free draft (lookup, previous): "
        + both({k: plain_total[k] + free[k] for k in timers}),
        "  total per prediction, DFlash draft on the device:          "
        + both({k: plain_total[k] + dflash[k] for k in timers}),
    ]
    roof = timers["roofline"]
    if tick_total is not None:
        lines += [
            "  a stream's tick, model-free draft: " + both({k: tick_total[k] + free[k] for k in timers}),
            "  a stream's tick, DFlash draft:     " + both({k: tick_total[k] + dflash[k] for k in timers}),
        ]
    rest = (tick_total or plain_total)["roofline"] - roof(plain) * tokens
    # a verify cannot read less than every weight once and the context's K/V once (its block attends over it)
    weights = sum(op.dram_bytes for op in verify.ops if ".sdpa." not in op.name)
    kv = verify.dram_bytes() - weights
    floor = 1e3 * (steps - 1) * verify.dram_bytes() / device.dram_bandwidth

    def trade(groups: tuple[str, ...]) -> str:
        """Roofline ms the model-free verifies would take less with `groups` at bfp4 (their weight reads)."""
        bfp4 = replace(
            precision, name="bfp4 trade", dtypes={**precision.dtypes, **dict.fromkeys(groups, "bfp4")}
        )
        less = roof(verify) - roof(verify_estimate(cfg, bfp4, context, block, steps))
        return f"{(steps - 1) * less:.1f}"

    longer = ""
    if accept_len + 1 <= block:
        fewer = steps - int(-(-tokens // (accept_len + 1)))
        gain = fewer * roof(verify)
        longer = f"; or by more tokens per verify: at {accept_len + 1:g}, {fewer} verifies fewer, {gain:.1f} ms less"
    of = "a stream's tick" if tick_total is not None else "the prediction"
    lines += [
        f"  roofline floor, model-free: the rest of {of} (vision, prefill, expert) {rest:.1f} ms, the first "
        f"block {first['roofline']:.1f} ms and the {steps - 1} verifies' reads alone {floor:.1f} ms "
        f"({weights / 1e9:.3f} GB of weights and {kv / 1e9:.3f} GB of K/V each at "
        f"{device.dram_bandwidth / 1e9:.0f} GB/s): {rest + first['roofline'] + floor:.1f} ms at the least at "
        "this accepted length",
        f"  below it only by reading less per verify, fidelity trades for a user recipe (measured with `alpamayo "
        f"precision`, not presets): a bfp4 lm_head {trade(('lm_head',))} ms less, bfp4 lm_head, qkv and o "
        f"{trade(('lm_head', 'qkv', 'o'))} ms less (roofline){longer}",
    ]
    return lines
