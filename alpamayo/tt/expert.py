"""The flow-matching action expert on one Blackhole p150: the Euler step as one captured device trace.

Same weights (every family's names, `ExpertConfig.prefixes`) and tensor contract as the torch reference
`alpamayo.expert.ActionExpert`; it runs on the device of a `TTTextModel` and reads that model's KV cache:

    expert = TTActionExpert.from_checkpoint(ckpt, text, expert_cfg)   # text: a TTTextModel
    text.setup_cache(max_seq_len, max_batch=K)                        # reserves the expert's rows per slot
    ... prefill, fork(K), reasoning decode of row b up to and including its <|traj_future_start|> at cache
    index offsets[b] - 1 of slot b ...
    actions = expert.sample(noise, offsets, text.rope_delta)         # noise [K, 64, 2] -> [K, 64, 2] float32

Per prediction (`sample`), host transfers are the initial noise in and the final actions out, nothing else:

  * on the device, once per prediction: the attention's causal bounds [S x n_kv x tiles] int32
    (`ExpertPlan.cur_pos`: sample b attends to its own expert region plus cache slot b's columns
    [0, offsets[b]), built with `where(slot == b, cur_pos(offsets[b]), 0)` summed over the slots from the
    entries' slot indices uploaded with the step's inputs) and cos/sin of positions arange(64) + rope_delta
    + offsets[b] on all three M-RoPE rows (slices of rope tables uploaded with the step's inputs, one per
    sample);
  * the Euler step, captured once per sample count as a trace whose persistent inputs are x (float32
    [1, 1, 64K, 32], columns 0-1 the normalised (accel, curvature)), the step's t features, cos, sin and the
    causal bounds: Fourier features of x, the in-projection MLP, every expert layer (the text backbone's
    `block_prefill` with the expert's weights and attention), the final norm, `action_out_proj` and
    x <- x + v / N written into x itself; between replays the next step's t features are copied into their
    buffer on the device.

Fourier features and the in-projection run on the device: x never leaves it between steps. On the host the
in-projection alone took 30.5 ms per step at K = 1 and 97.8 ms at K = 6 (float32 torch, this project's 2-core
CPU, mean of 50), against ~5.4 ms estimated for the whole device step (`alpamayo plan`), plus a download of x
and an upload of the [64K, hidden] embeddings per step (256 KB per sample at hidden 2048) that would split the
ten replays with host work. sin/cos of 2 pi f u for |f u| up to a few hundred need float32 arguments
reduced exactly: u = x * f in float32 (a matmul would round x to the FPU's 10-bit mantissa, 0.1-0.3 rad
at |f x| ~ 300), then frac, a quarter-period phase for the cosines, and sin of at most 2.5 pi. The t features
are one row per step, computed on the host with the reference's own `fourier_features` once per step count.

Attention (`ExpertPlan`): sample b reads cache slot b, where the text backbone decoded row b of the K rows
(each its own length). Each layer writes sample b's 64 K/V rows into slot b at the fixed cache rows
[region_start, cache_rows) and runs one paged flash-decode over the S cache slots in place, each slot's K/V
heads its users, each user's page table listing its own region's page, then its slot's pages, cut at the
causal bound: it reads only the region and the prefix (3200 of 8320 rows per layer at a 3.1k prompt in an
8k cache; `ExpertPlan.attended_rows`), the VLM's cache is never copied, and no step's program depends on
the prompt or reasoning lengths (the bounds are a persistent input, rewritten per prediction). The step runs
one sample per cache slot (S = the text model's `max_batch`, as its decode runs every slot): with K < S
active rows the idle samples attend to their own region only and are not read back.

The traced step is card-only (trace capture segfaults on the mock p150); `sample(traced=False)` runs the same
step graph eagerly, which the dry run exercises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import ACTION_DIMS, ExpertConfig, InProjConfig
from alpamayo.config.flow import DEFAULT_FLOW, FlowSettings
from alpamayo.contract import DecoderContext, TextBackbone
from alpamayo.expert.decoding import offsets_after_reasoning
from alpamayo.expert.in_proj import OUT_NORM_EPS, TRUNK_NORM_EPS, default_freqs, fourier_features
from alpamayo.expert.sampler import check_noise, noise_for
from alpamayo.expert.weights import validate_expert_tensors
from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.plan.expert_weights import EXPERT_BANKS, EXPERT_GROUPS, expert_weight_specs
from alpamayo.plan.programs.expert import ExpertPlan, plan_expert
from alpamayo.plan.weights import residual_norm_eps
from alpamayo.prediction import FUTURE_STEPS, Cancellation
from alpamayo.profiling import Tracer
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device_io import DeviceIO, DeviceTensor, TensorGroup, opened
from alpamayo.tt.slot_attention import attend_by_slot
from alpamayo.tt.text import DeviceKVCache, TTTextModel
from alpamayo.tt.text.decode_inputs import Shaped
from alpamayo.tt.text.weights import LayerWeights
from alpamayo.tt.weight_cache import NamedTensors, upload_weights
from planner.plans import GeneratedPlan

X_WIDTH = TILE  # x, v: [rows, 32] float32 tiles, columns 0..1 real (accel, curvature), the rest exactly 0


@dataclass
class DeviceLinear(TensorGroup):
    """A linear layer's weight [K_p, N_p] and bias row [1, 1, 1, N_p] (None without a bias), tile-padded."""

    weight: DeviceTensor
    bias: DeviceTensor | None

    @classmethod
    def take(cls, named: NamedTensors, name: str) -> DeviceLinear:
        """`name` and, where uploaded, `name`.bias (`linear_specs`)."""
        return cls(named[name], named.get(name + ".bias"))


@dataclass
class InProjWeights(TensorGroup):
    """The in-projection MLP (`in_proj_specs`): the first linear on the feature row, then per extra layer its
    RMSNorm gamma (TILE) and linear, and the closing LayerNorm's weight and bias rows [1, 1, 1, hidden]."""

    first: DeviceLinear
    trunk: list[tuple[DeviceTensor, DeviceLinear]]
    ln_weight: DeviceTensor
    ln_bias: DeviceTensor

    @classmethod
    def take(cls, named: NamedTensors, layers: int) -> InProjWeights:
        trunk = []
        for layer in range(layers):
            norm = 2 + 3 * layer  # the trunk's module indices: (RMSNorm, Linear, SiLU) per layer after 0, 1
            trunk.append(
                (
                    named[f"expert.in_proj.norm{norm}.tile"],
                    DeviceLinear.take(named, f"expert.in_proj.{norm + 1}"),
                )
            )
        return cls(
            DeviceLinear.take(named, "expert.in_proj.0"),
            trunk,
            named["expert.in_proj.ln.weight"],
            named["expert.in_proj.ln.bias"],
        )


@dataclass
class ExpertWeights(TensorGroup):
    """Every device weight of the expert (`expert_weight_specs`): its decoder layers, the final RMSNorm's TILE
    gamma, the in-projection and the action out-projection [hidden_p, 32] (+ bias)."""

    layers: list[LayerWeights]
    norm: DeviceTensor
    in_proj: InProjWeights
    out_proj: DeviceLinear

    @classmethod
    def take(cls, named: NamedTensors, cfg: ExpertConfig) -> ExpertWeights:
        """The expert of `cfg` from its tensors by `expert_weight_specs` name."""
        layers = [LayerWeights.take(named, f"expert.layers.{i}.") for i in range(cfg.text.num_hidden_layers)]
        in_proj = InProjWeights.take(named, cfg.in_proj.num_enc_layers)
        return cls(layers, named["expert.norm.tile"], in_proj, DeviceLinear.take(named, "expert.out_proj"))


T = TypeVar("T", bound=Shaped)
U = TypeVar("U", bound=Shaped)


@dataclass
class FeatureRows(TensorGroup, Generic[T]):
    """The device Fourier features' fixed rows [1, 1, 1, F_p] float32 (`feature_rows`), host or device: the
    accel and the curvature frequencies at their sine and cosine columns, and the phase (a quarter turn at
    the cosine columns)."""

    freq_a: T
    freq_k: T
    phase: T

    def map(self, fn: Callable[[T], U]) -> FeatureRows[U]:
        """`fn` of every row, in the order of `tensors()`."""
        freq_a, freq_k, phase = fn(self.freq_a), fn(self.freq_k), fn(self.phase)
        return FeatureRows(freq_a, freq_k, phase)


@dataclass
class StepBuffers(TensorGroup):
    """The Euler step's persistent inputs on the device: the action rows x and their pre-capture copy
    x_saved [1, 1, rows, 32] float32, the t feature row [1, 1, 1, F_p] float32, the action tokens' cos and
    sin [1, 1, rows, hd] bf16, the slot of every (user, query tile) entry [1, 1, 1, entries] float32, the
    attention's page table (int32 row-major) and causal bounds `cur_pos` [entries] int32, and the rope tables
    [1, 1, P, hd] (row-major bf16, `TTActionExpert._rope_tables`) cos and sin are sliced from."""

    x: DeviceTensor
    x_saved: DeviceTensor
    t: DeviceTensor
    cos: DeviceTensor
    sin: DeviceTensor
    slot_of: DeviceTensor
    page_table: DeviceTensor
    cur_pos: DeviceTensor
    cos_table: DeviceTensor
    sin_table: DeviceTensor


@dataclass
class StepState:
    """What the step runs with for `samples` samples and `steps` Euler steps over one text KV cache (`cache`,
    whose buffers a trace binds): the plan, the persistent inputs, the t rows per step [1, 1, 1, F_p]
    float32, and the captured step's trace id (None until captured)."""

    samples: int
    steps: int
    cache: DeviceKVCache | None
    plan: ExpertPlan
    buffers: StepBuffers
    t_rows: list[DeviceTensor]
    trace: Any = None


class TTActionExpert(DeviceIO):
    """Device weights, step inputs and traces of the action expert beside one `TTTextModel`."""

    def __init__(
        self,
        text: TTTextModel,
        cfg: ExpertConfig,
        weights: ExpertWeights,
        freqs: list[torch.Tensor],
        tracer: Tracer | None = None,
    ):
        self.ttnn, self.text, self.cfg, self.device = text.ttnn, text, cfg, text.device
        self.n_tokens = FUTURE_STEPS  # action tokens per sample, as `ActionExpert.n_tokens`
        self._weights: ExpertWeights | None = weights
        self.freqs = [f.float().reshape(-1) for f in freqs]  # per action dim, then t: [num_freqs] each
        self.tracer = tracer or text.tracer
        self.residual_eps = residual_norm_eps(cfg.text, EXPERT_BANKS)
        self.scale = cfg.text.head_dim**-0.5
        # the feature rows, fixed for the model's life
        self._statics: FeatureRows[DeviceTensor] | None = feature_rows(cfg.in_proj, self.freqs).map(
            lambda row: self.upload(row, self.ttnn.float32)
        )
        self._state: StepState | None = None  # per (samples, steps): persistent inputs and trace

    @property
    def weights(self) -> ExpertWeights:
        """The device weights (refused once `close`d)."""
        return opened(self._weights, "the action expert")

    @property
    def statics(self) -> FeatureRows[DeviceTensor]:
        """The device feature rows (refused once `close`d)."""
        return opened(self._statics, "the action expert")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(
        cls,
        source: str | Path | Checkpoint,
        text: TTTextModel,
        cfg: ExpertConfig,
        cache_dir: str | Path | None = None,
        tracer: Tracer | None = None,
        samples: int = 1,
    ) -> TTActionExpert:
        """Validate the expert's tensors against its config and the text model's VLM (layer count, K/V layout),
        plan it, and upload its weights in the text model's recipe to the text model's device. The text model's
        later caches reserve the K/V region of `samples` samples (`TTTextModel.reserved_rows`)."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)
        validate_expert_tensors(ckpt, cfg, text.text_cfg)
        # refuses what the device cannot run, before any upload
        plan = plan_expert(text.cfg, cfg, text.precision, 1, samples, text.plan.device)
        text.reserved_rows = plan.region_rows
        banks = text.plan.device.dram_banks
        named = upload_weights(
            expert_weight_specs(cfg), text.precision, text.device, ckpt.get, cache_dir, banks
        )
        freqs = [
            ckpt.get(name, torch.float32) if name in ckpt else default_freqs(cfg.in_proj)
            for name in cfg.freqs_keys()
        ]
        return cls(text, cfg, ExpertWeights.take(named, cfg), freqs, tracer)

    def plan_for(self, max_seq_len: int, samples: int) -> ExpertPlan:
        return plan_expert(
            self.text.cfg, self.cfg, self.text.precision, max_seq_len, samples, self.text.plan.device
        )

    def close(self) -> None:
        """Release the step trace and free the expert's device tensors (the device belongs to the text model)."""
        self._drop_state()
        if self._statics is not None and self._weights is not None:
            self.free(*self._statics.tensors(), *self._weights.tensors())
        self._statics, self._weights = None, None

    def _drop_state(self) -> None:
        if self._state is None:
            return
        if self._state.trace is not None:
            self.ttnn.release_trace(self.device, self._state.trace)
        self.free(*self._state.buffers.tensors(), *self._state.t_rows)
        self._state = None

    # ------------------------------------------------------------------ static device tensors
    def _rope_tables(self) -> tuple[DeviceTensor, DeviceTensor]:
        """Row-major bf16 cos/sin [1, 1, P, hd] over every position an action token can take with the text
        model's cache (P = max_seq_len + 64: M-RoPE deltas are <= 0, images compress positions)."""
        rows = self.text.max_seq_len + FUTURE_STEPS
        cos, sin = self.text.rope.cos_sin_1d(torch.arange(rows), torch.bfloat16)
        layout = self.ttnn.ROW_MAJOR_LAYOUT
        return (
            self.upload(cos.view(1, 1, rows, -1), layout=layout),
            self.upload(sin.view(1, 1, rows, -1), layout=layout),
        )

    def _setup(self, samples: int, steps: int) -> StepState:
        """Persistent step inputs for `samples` (the cache's slots) samples and `steps` Euler steps over the
        text model's current cache (allocated once and reused; a new cache, set up since, means new inputs
        and a new trace, which binds the cache's buffers)."""
        text = self.text
        state = self._state
        if (
            state is not None
            and (state.samples, state.steps) == (samples, steps)
            and state.cache is text.cache
        ):
            return state
        self._drop_state()
        ttnn = self.ttnn
        plan = self.plan_for(text.max_seq_len, samples)
        if text.kv_cache[0][0].shape[-2] != plan.cache_rows:
            raise RuntimeError(
                f"the text model's KV cache has {text.kv_cache[0][0].shape[-2]} rows, the expert needs "
                f"{plan.cache_rows}: call text.setup_cache({text.max_seq_len}, reserve_rows={plan.region_rows})"
            )
        rows, entries = plan.rows, plan.users * plan.q_tiles
        # the causal bounds' input: the slot of every (user, query tile) entry, in entry order
        slot_of = torch.arange(samples, dtype=torch.float32).repeat_interleave(entries // samples)
        hd = self.cfg.text.head_dim
        width = round_up(self.cfg.in_proj.num_features, TILE)
        buffers = StepBuffers(
            x=self.upload(torch.zeros(1, 1, rows, X_WIDTH), ttnn.float32),
            x_saved=self.upload(torch.zeros(1, 1, rows, X_WIDTH), ttnn.float32),
            t=self.upload(torch.zeros(1, 1, 1, width), ttnn.float32),
            cos=self.upload(torch.zeros(1, 1, rows, hd)),
            sin=self.upload(torch.zeros(1, 1, rows, hd)),
            slot_of=self.upload(slot_of.view(1, 1, 1, entries), ttnn.float32),
            page_table=self.upload(
                torch.tensor(plan.page_table(), dtype=torch.int32), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT
            ),
            cur_pos=ttnn.allocate_tensor_on_device(
                ttnn.Shape([entries]), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT, self.device, ttnn.DRAM_MEMORY_CONFIG
            ),
            cos_table=(tables := self._rope_tables())[0],  # after the others: the upload order as before
            sin_table=tables[1],
        )
        t_rows = [self.upload(r, ttnn.float32) for r in t_feature_rows(self.cfg.in_proj, self.freqs, steps)]
        self._state = StepState(samples, steps, text.cache, plan, buffers, t_rows)
        return self._state

    # ------------------------------------------------------------------ per prediction (device only)
    def _prepare(self, state: StepState, offsets: Sequence[int], rope_delta: int) -> None:
        """The attention's causal bounds and cos/sin of one prediction (sample b: cache slot b, `offsets[b]`),
        built on the device into the persistent inputs; the slots past len(offsets) see their own region
        only, at offsets[0]'s positions."""
        ttnn, b, text = self.ttnn, state.buffers, self.text
        last = text.max_seq_len
        if len(offsets) > text.batch:
            raise ValueError(f"{len(offsets)} offsets for the text model's {text.batch} active row(s)")
        for row, offset in enumerate(offsets):
            base, filled = rope_delta + offset, text.lengths[row]
            if not 1 <= offset <= filled or not 0 <= base <= last:
                raise ValueError(
                    f"row {row}: offset {offset} must be in [1, its length {filled}] (after "
                    f"<|traj_future_start|>) and rope_delta + offset = {base} in [0, {last}]"
                )
        slots, plan = state.samples, state.plan
        bound = None  # the causal bound of every (user, query tile) entry: its slot's `ExpertPlan.cur_pos`
        for slot, offset in enumerate([*offsets, *[0] * (slots - len(offsets))]):
            mine = ttnn.eq(b.slot_of, float(slot))
            term = ttnn.where(mine, float(plan.cur_pos(offset)), 0.0)
            self.free(mine)
            if bound is not None:
                total = ttnn.add(bound, term)
                self.free(bound, term)
                term = total
            bound = term
        as_int = ttnn.typecast(bound, ttnn.int32)
        self.free(bound)
        flat = ttnn.to_layout(as_int, ttnn.ROW_MAJOR_LAYOUT)  # the op reads int32 rows
        self.free(as_int)
        self._into(ttnn.reshape(flat, [plan.users * plan.q_tiles]), b.cur_pos)  # a view of flat
        bases = [rope_delta + o for o in offsets] + [rope_delta + offsets[0]] * (slots - len(offsets))
        for table, dst in ((b.cos_table, b.cos), (b.sin_table, b.sin)):
            parts = [
                ttnn.slice(table, [0, 0, base, 0], [1, 1, base + FUTURE_STEPS, self.cfg.text.head_dim])
                for base in bases
            ]
            rows = ttnn.concat(parts, dim=2) if slots > 1 else parts[0]
            tiled = ttnn.to_layout(rows, ttnn.TILE_LAYOUT)
            self._into(tiled, dst)
            self.free(*parts, *([rows] if slots > 1 else []))

    def _into(self, src: Any, dst: Any) -> None:
        """dst <- src on the device (src freed)."""
        self.ttnn.copy(src, dst)
        self.free(src)

    # ------------------------------------------------------------------ the step graph
    def _features(self, b: StepBuffers) -> Any:
        """The in-projection's input [1, 1, rows, F_p] bf16: FE(accel), FE(curvature), FE(t), zero padding."""
        ttnn, s = self.ttnn, self.statics
        x = b.x
        rows = x.shape[-2]
        a = ttnn.slice(x, [0, 0, 0, 0], [1, 1, rows, 1])
        k = ttnn.slice(x, [0, 0, 0, 1], [1, 1, rows, 2])
        ua, uk = ttnn.multiply(a, s.freq_a), ttnn.multiply(k, s.freq_k)  # float32, exact products
        self.free(a, k)
        u = ttnn.add(ua, uk)  # one of the two is 0 in every column
        self.free(ua, uk)
        turns = ttnn.frac(u)
        self.free(u)
        phased = ttnn.add(turns, s.phase)
        self.free(turns)
        angle = ttnn.multiply(phased, 2 * math.pi)
        self.free(phased)
        sines = ttnn.sin(angle)
        self.free(angle)
        scaled = ttnn.multiply(sines, math.sqrt(2))
        self.free(sines)
        feats = ttnn.add(scaled, b.t)  # the t row already carries sqrt(2)
        self.free(scaled)
        out = ttnn.typecast(feats, ttnn.bfloat16)
        self.free(feats)
        return out

    def _linear(self, x: Any, w: DeviceLinear, silu: bool = False) -> Any:
        """x [1, 1, rows, K_p] @ w's weight + its bias (SiLU fused when asked), bf16 DRAM."""
        ttnn = self.ttnn
        return ttnn.linear(
            x,
            w.weight,
            bias=w.bias,
            activation="silu" if silu else None,
            compute_kernel_config=self.text.kernels.ck.matmul["expert"],
            dtype=ttnn.bfloat16,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )

    def _in_proj(self, feats: Any, plan: ExpertPlan) -> Any:
        """Trunk (Linear, SiLU, (RMSNorm, Linear, SiLU)..., RMSNorm, Linear) and LayerNorm -> [1, 1, rows,
        H_p] bf16, the residual stream (zero-padded past hidden)."""
        ttnn, w = self.ttnn, self.weights.in_proj
        h = self._linear(feats, w.first, silu=True)
        self.free(feats)
        for layer, (gamma, linear) in enumerate(w.trunk):
            n = self.text.kernels.rms(h, gamma, TRUNK_NORM_EPS)
            self.free(h)
            h = self._linear(n, linear, silu=layer < len(w.trunk) - 1)
            self.free(n)
        out = ttnn.layer_norm(
            h,
            epsilon=OUT_NORM_EPS,
            weight=w.ln_weight,
            bias=w.ln_bias,
            compute_kernel_config=self.text.kernels.ck.norm,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        self.free(h)
        pad = plan.hidden_padded - self.cfg.text.hidden_size
        if pad:
            padded = ttnn.pad(out, [(0, 0), (0, 0), (0, 0), (0, pad)], 0.0)
            self.free(out)
            out = padded
        return out

    def _attend(self, i: int, plan: ExpertPlan, b: StepBuffers) -> Callable[[Any, Any, Any], Any]:
        """Layer i's attention: sample b's K/V into slot b's cache region, then one paged flash-decode over
        every slot in place (`ExpertPlan`): the queries [S, n_heads, 64, hd] read as [1, S x n_kv, 64 x group,
        hd] (user s x n_kv + g: the rows of K/V head g's query heads, head-major), the cache
        [S, n_kv, cache_rows, hd] as pages [S x n_kv x pages, 1, 64, hd], the persistent page table and
        causal bounds `b.page_table`, `b.cur_pos`; the output is read back as [S, n_heads, 64, hd]."""
        ttnn, text = self.ttnn, self.text
        slots, block, hd = plan.samples, plan.region_rows, self.cfg.text.head_dim
        config = cfgs.sdpa(ttnn, plan.sdpa_grid, TILE, plan.k_chunk)

        def sdpa(qb: Any, cache_k: Any, cache_v: Any) -> Any:
            # reshapes of whole tiles in the same order: views of their inputs' buffers
            q = ttnn.reshape(qb, (1, plan.users, plan.q_tiles * TILE, hd))
            pages = (plan.users * plan.pages, 1, block, hd)
            a = ttnn.transformer.paged_scaled_dot_product_attention_decode(
                q,
                ttnn.reshape(cache_k, pages),
                ttnn.reshape(cache_v, pages),
                b.page_table,
                cur_pos_tensor=b.cur_pos,
                spec_multi_pos_tiles=plan.q_tiles,
                scale=self.scale,
                program_config=config,
                compute_kernel_config=text.kernels.ck.sdpa_prefill,
                memory_config=ttnn.DRAM_MEMORY_CONFIG,
            )
            return ttnn.reshape(a, (slots, self.cfg.text.num_attention_heads, block, hd))

        def attend(q: Any, k: Any, v: Any) -> Any:
            return attend_by_slot(
                self, text, text.kv_cache[i], q, k, v, slots, block, plan.region_start, sdpa
            )

        return attend

    def _velocity(self, state: StepState) -> Any:
        """v [1, 1, rows, 32] float32 (columns 0..1) of the persistent x at the persistent t, cos, sin, bounds."""
        ttnn, b, plan, text, weights = self.ttnn, state.buffers, state.plan, self.text, self.weights
        h = self._in_proj(self._features(b), plan)
        for i, layer in enumerate(weights.layers):
            attend = self._attend(i, plan, b)
            h = text.kernels.block_prefill(
                self.cfg.text,
                layer,
                h,
                b.cos,
                b.sin,
                attend,
                ops=EXPERT_GROUPS,
                residual_eps=self.residual_eps,
            )
        hn = text.kernels.rms(h, weights.norm, self.residual_eps)
        self.free(h)
        v = self._linear(hn, weights.out_proj)
        self.free(hn)
        v32 = ttnn.typecast(v, ttnn.float32)
        self.free(v)
        return v32

    def _euler_step(self, state: StepState) -> None:
        """x <- x + v(x, t) / N, written into the persistent x (the traced body: allocates, computes, frees)."""
        ttnn, x = self.ttnn, state.buffers.x
        v = self._velocity(state)
        dv = ttnn.multiply(v, 1.0 / state.steps)
        self.free(v)
        ttnn.add(x, dv, output_tensor=x)
        self.free(dv)

    # ------------------------------------------------------------------ public
    def _write_noise(self, state: StepState, noise: torch.Tensor) -> None:
        """x <- `noise` [K, 64, 2] in its first K x 64 rows (idle slots' rows: zeros)."""
        x = torch.zeros(1, 1, state.plan.rows, X_WIDTH)
        x[0, 0, : noise.shape[0] * FUTURE_STEPS, :ACTION_DIMS] = noise.reshape(-1, ACTION_DIMS)
        ttnn = self.ttnn
        with self.tracer.span("tt.host_to_device"):
            host = ttnn.from_torch(x, dtype=ttnn.float32, layout=ttnn.TILE_LAYOUT)
            ttnn.copy_host_to_device_tensor(host, state.buffers.x)

    def _actions(self, state: StepState, samples: int) -> torch.Tensor:
        return self._download_actions(state.buffers.x, samples)

    def _download_actions(self, rows: Any, samples: int) -> torch.Tensor:
        """[samples, 64, 2] float32 of a device [1, 1, rows, 32] x or v (columns 0..1 real)."""
        out = self.download(rows)[0, 0, : samples * FUTURE_STEPS, :ACTION_DIMS]
        return out.float().reshape(samples, FUTURE_STEPS, ACTION_DIMS)

    def _check(self, noise: torch.Tensor, offsets: int | Sequence[int]) -> tuple[torch.Tensor, list[int]]:
        """(noise, one offset per sample: an int is every sample's) after the checks the host can make."""
        if not self.text.kv_cache:
            raise RuntimeError("the text model has no KV cache: setup_cache, prefill and decode first")
        noise = check_noise(noise, noise.shape[0] if noise.dim() else 0, FUTURE_STEPS)
        k = noise.shape[0]
        offsets = [int(offsets)] * k if isinstance(offsets, int) else [int(o) for o in offsets]
        if len(offsets) != k:
            raise ValueError(f"{len(offsets)} offsets for {k} samples: one per sample (its cache slot's)")
        if k > self.text.max_batch:
            raise ValueError(
                f"{k} samples over a KV cache of {self.text.max_batch} slot(s): sample b reads slot b; call "
                f"text.setup_cache({self.text.max_seq_len}, max_batch={k}) and fork({k}) the prompt"
            )
        return noise, offsets

    def sample(
        self,
        noise: torch.Tensor,
        offsets: int | Sequence[int],
        rope_delta: int,
        steps: int | None = None,
        traced: bool = True,
        cancel: Cancellation | None = None,
    ) -> torch.Tensor:
        """Integrate `noise` [K, 64, 2] (float32, normalised) over `steps` Euler steps (the config's by
        default), sample b against cache slot b -> [K, 64, 2] float32 normalised (accel, curvature).

        `offsets`: per sample, its slot's cache index of `<|traj_future_start|>` plus 1 (an int: every
        sample's); `rope_delta`: the text model's M-RoPE delta. Traced (default; card only, a dry run falls
        back to untraced): step 0 compiles the step eagerly, the step is captured once per slot count and
        replayed for the rest; untraced: every step runs eagerly. `cancel` is checked before each step."""
        noise, offsets = self._check(torch.as_tensor(noise), offsets)
        steps = steps or self.cfg.num_inference_steps
        samples = noise.shape[0]
        traced = self.text.trace_switch.traced(traced)
        ttnn = self.ttnn
        state = self._setup(self.text.max_batch, steps)
        b = state.buffers
        cancel = cancel or Cancellation()
        with self.tracer.span("tt.expert_prepare"):
            self._write_noise(state, noise)
            self._prepare(state, offsets, rope_delta)
        for k in range(steps):
            cancel.check()
            ttnn.copy(state.t_rows[k], b.t)
            with self.tracer.span("expert_step", step=k, traced=traced):
                if traced and state.trace is not None:
                    ttnn.execute_trace(self.device, state.trace, cq_id=0, blocking=False)
                else:
                    self._euler_step(state)
                    if traced:
                        self._capture(state)
        with self.tracer.span("tt.expert_actions"):
            return self._actions(state, samples)

    def _capture(self, state: StepState) -> None:
        """Capture the step for the next replays; x is saved around the capture (on the device), so a capture
        that also executes its commands cannot advance the state."""
        ttnn, b = self.ttnn, state.buffers
        ttnn.copy(b.x, b.x_saved)
        trace = ttnn.begin_trace_capture(self.device, cq_id=0)
        self._euler_step(state)
        ttnn.end_trace_capture(self.device, trace, cq_id=0)
        ttnn.copy(b.x_saved, b.x)
        ttnn.synchronize_device(self.device)
        state.trace = trace


def step_times(steps: int) -> torch.Tensor:
    """t_k of the `steps` Euler steps, linspace(0, 1, steps + 1)[:steps] (the reference sampler's times)."""
    return torch.linspace(0.0, 1.0, steps + 1)[:steps]


def feature_rows(cfg: InProjConfig, freqs: Sequence[torch.Tensor]) -> FeatureRows[torch.Tensor]:
    """[1, 1, 1, F_p] float32 rows of the device Fourier features (F_p: the in-projection's K padded to a tile):
    the accel frequencies and the curvature frequencies, each at their sine and cosine columns, and the phase
    (a quarter turn makes the cosine columns' sines cosines). With x = (a, k) per row the device computes
    sqrt(2) sin(2 pi (frac(a freq_a + k freq_k) + phase)), and the step's t row fills the t columns."""
    width = round_up(cfg.num_features, TILE)
    rows = FeatureRows(*(torch.zeros(1, 1, 1, width) for _ in range(3)))
    n, f = cfg.num_freqs, cfg.num_fourier_feats
    for dim, row in enumerate((rows.freq_a, rows.freq_k)):
        row[..., dim * f : dim * f + n] = freqs[dim]
        row[..., dim * f + n : (dim + 1) * f] = freqs[dim]
        rows.phase[..., dim * f + n : (dim + 1) * f] = 0.25
    return rows


def t_feature_rows(cfg: InProjConfig, freqs: Sequence[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """Per Euler step k, the [1, 1, 1, F_p] float32 row holding FE(t_k) at the t-feature columns, t_k =
    linspace(0, 1, steps + 1)[k] (the reference sampler's times), computed with its `fourier_features`."""
    start = ACTION_DIMS * cfg.num_fourier_feats
    rows = []
    for t in step_times(steps):
        row = torch.zeros(1, 1, 1, round_up(cfg.num_features, TILE))
        row[..., start : start + cfg.num_fourier_feats] = fourier_features(t.view(1), freqs[-1])
        rows.append(row)
    return rows


@dataclass(frozen=True)
class TTExpertContext:
    """Where one sampling reads the device cache: per sample row b, `offsets[b]` (cache index of its
    `<|traj_future_start|>` in slot b, plus 1), the text model's `rope_delta` and the number of sample rows."""

    offsets: tuple[int, ...]
    rope_delta: int
    rows: int


class TTExpertDecoder:
    """The action expert's trajectory decoder on the device (`alpamayo.contract.TrajectoryDecoder`): `context`
    / `sample` / `record` over a `TTTextModel` (row b of its K decoded rows in cache slot b, at its own
    offset). It holds the device expert and the flow settings; navigation guidance is not among its
    capabilities (`unguided` is None: its unguided branch needs a second prompt's cache on the device)."""

    unguided: None = None  # the declared capability: no unguided branch on the device

    def __init__(self, expert: TTActionExpert, settings: FlowSettings = DEFAULT_FLOW):
        self.check_settings(settings)
        self.expert, self.settings = expert, settings

    @staticmethod
    def check_settings(settings: FlowSettings) -> None:
        """ValueError for settings the device expert cannot run, before anything is loaded: navigation guidance
        (every family's, Alpamayo 1.5's and 2 Super's alike)."""
        if settings.guidance is not None:
            raise ValueError(
                "navigation guidance (--nav-guidance) is not implemented on --backend ttnn: its unguided branch "
                "is a second prompt's KV cache, and the device expert reads only the cache the text model decodes "
                "into; use --backend torch for guided sampling"
            )

    @property
    def steps(self) -> int:
        return self.settings.steps_for(self.expert.cfg)

    @property
    def n_tokens(self) -> int:
        return self.expert.n_tokens

    def record(self) -> dict[str, float | int | None]:
        return self.settings.record(self.expert.cfg)

    def close(self) -> None:
        self.expert.close()

    def context(self, text: TextBackbone, prompt_len: int, plans: Sequence[GeneratedPlan]) -> TTExpertContext:
        offsets = tuple(offsets_after_reasoning(prompt_len, plans))
        return TTExpertContext(offsets, text.rope_delta, len(plans))

    def sample(
        self,
        ctx: DecoderContext,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        unguided: DecoderContext | None = None,
        tracer: Tracer | None = None,
        cancel: Cancellation | None = None,
    ) -> torch.Tensor:
        """[K, 64, 2] float32 normalised actions, K = ctx.rows (traced Euler steps on the device); `ctx`: this
        decoder's `context`."""
        if not isinstance(ctx, TTExpertContext):
            raise TypeError(
                f"the ttnn action expert samples its own TTExpertContext, got {type(ctx).__name__}"
            )
        if unguided is not None:
            raise ValueError("navigation guidance is not implemented on --backend ttnn")
        x0 = noise_for(ctx.rows, FUTURE_STEPS, self.settings, seed, noise)
        if tracer is not None:
            self.expert.tracer = tracer
        return self.expert.sample(x0, ctx.offsets, ctx.rope_delta, self.steps, cancel=cancel)
