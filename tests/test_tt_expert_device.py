"""The ttnn action expert on a Blackhole p150 against the torch expert (marked `blackhole`), and the same checks
at the `accuracy` recipe in the ttnn golden mode (marked `golden`, `alpamayo.tt.golden`; traces are card-only).

A tiny VLM (`TT_TINY["gqa2"]`) prefills a 100-token prompt on the device and in the torch reference; the tiny
expert (`tests.tt_expert_cases`) then samples K = 1, 3 and 6 trajectories from a fixed noise on each, in both
presets: the prompt forked into K cache slots, three decode steps and a rollback leave the rows ragged, and
sample b reads slot b at its own offset. The torch expert runs in float32 on the recipe-rounded weights (`alpamayo.tt.quantized`, bit-exact with
ttnn's packer) over the torch text model's recipe-rounded cache, so the thresholds measure the device
implementation; the drift from the unrounded float32 expert is recorded beside them.

  * velocity PCC >= 0.99 at every Euler step, the device and the reference evaluated at the reference's own x_k,
    and relative error within what that PCC allows for noise (`alpamayo.numerics.assert_agrees`);
  * waypoint ADE of the device's trajectory to the reference's (unicycle rollout at 10 m/s, 6.4 s) at most what
    the device's own velocity error explains: ADE_MARGIN (2) x the drift the recipe's weight rounding alone
    causes (the reference against the float32 expert on unrounded weights) x the ratio of the two velocity
    errors (RMS over the steps of the relative error, each at the reference's x_k), plus ADE_FLOOR_M (1 mm,
    float32 accumulation in another order: the device's x is float32 throughout, as the reference's).
    The expert's out-projection is scaled by OUT_SCALE (0.02, as tests/test_expert_golden.py does), which
    makes its flow as smooth in x as a trained one's: with the random one the flow is chaotic and any velocity
    error, a tenth of the rounding's as much as all of it, drifted 0.5-2.8 m, so no bound could tell a good
    device from a bad one (the former max(0.5 m, 4 x rounding) allowed up to 3.2 m). Smooth, the drift is
    linear in the error: on the host (benchmarks/expert_ade_sensitivity.py), the rounded reference against
    itself plus a velocity error of 0.1, 0.3
    and 1 x the rounding's (white, or along the rounding's own direction), K = 1, 3, 6, both presets, drifted
    0.09-1.42 x (rounding drift x error ratio); the rounding alone drifts 4.7 mm (accuracy) and 3.7 mm
    (performance). The margin 2 covers the worst 1.42 with 40 % to spare;
  * the attention's causal bounds the device builds are `ExpertPlan.cur_pos` of each slot's offset, one per
    query tile of each of the slot's K/V heads, and its page table is `ExpertPlan.page_table`;
  * the traced sampling equals the untraced one bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from alpamayo.expert.sampler import euler_sample
from alpamayo.expert.weights import load_expert
from alpamayo.numerics import assert_agrees, relative_error
from alpamayo.plan.precision import load_precision
from alpamayo.precision.recipes import kv_store
from alpamayo.text import TextModel
from alpamayo.tt.quantized import QuantizedCheckpoint, rounded_expert
from planner.action_space import UnicycleActionSpace
from planner.metrics import ade
from tests.tt_checkpoints import save_tt_checkpoint
from tests.tt_expert_cases import TINY_VLM, save_expert_weights, tiny_expert
from tests.tt_expert_seams import velocity as tt_velocity
from tests.tt_modes import card_only, case_device, device_cases

VELOCITY_PCC, ADE_MARGIN, ADE_FLOOR_M, OUT_SCALE = 0.99, 2.0, 0.001, 0.02
PROMPT_LEN, MAX_SEQ_LEN, V0 = 100, 256, 10.0
CASES = [f"{recipe}-K{k}" for recipe in ("accuracy", "performance") for k in (1, 3, 6)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    vlm = tmp_path_factory.mktemp("vlm")
    save_tt_checkpoint(vlm, TINY_VLM, seed=23)
    expert = tiny_expert()
    directory = save_expert_weights(tmp_path_factory.mktemp("expert"), expert, seed=5)
    # the smooth flow of a trained expert (as tests/test_expert_golden.py): a random out-projection makes the
    # field chaotic in x, where any velocity error, 10 % of the rounding's as much as all of it, drifts ~1 m
    tensors = load_file(directory / "model.safetensors")
    out = tensors["action_out_proj.weight"]
    tensors["action_out_proj.weight"] = (out.float() * OUT_SCALE).to(out.dtype)
    save_file(tensors, directory / "model.safetensors")
    return vlm, directory, expert


class Case:
    """The device pair (text model, expert) and the torch pair on the recipe-rounded weights, K samples."""

    def __init__(self, recipe, samples, device, checkpoints, tmp_path):
        from alpamayo.checkpoint import Checkpoint
        from alpamayo.tt.expert import TTActionExpert
        from alpamayo.tt.text import TTTextModel

        vlm, expert_dir, self.cfg = checkpoints
        self.samples, self.precision = samples, load_precision(recipe)
        self.tt_text = TTTextModel.from_checkpoint(vlm, precision=self.precision, device=device)
        self.tt = TTActionExpert.from_checkpoint(expert_dir, self.tt_text, self.cfg)
        self.tt_text.setup_cache(MAX_SEQ_LEN, max_batch=samples)  # reserves the expert's rows per slot
        rounded = QuantizedCheckpoint(vlm, self.precision)
        self.ref_text = TextModel.from_checkpoint(rounded, rounded.config)
        self.ref_text.kv_store = kv_store(self.precision)
        self.ref_text.setup_cache(MAX_SEQ_LEN, max_batch=samples)
        tensors = rounded_expert(Checkpoint(expert_dir).get, self.cfg, self.precision)
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "model.safetensors")
        vlm_text = self.ref_text.text_cfg
        self.ref = load_expert(tmp_path, self.cfg, vlm_text)
        self.fp32 = load_expert(expert_dir, self.cfg, vlm_text)
        prompt = torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
        steps = torch.randint(0, 256, (3, samples), generator=torch.Generator().manual_seed(4))
        for text in (self.tt_text, self.ref_text):
            text.prefill(prompt)
            text.fork(samples)
            for ids in steps:  # each row its own tokens
                text.decode(ids)
            text.rollback([PROMPT_LEN + 1 + b % 3 for b in range(samples)])  # ragged rows
        self.offset, self.rope_delta = list(self.tt_text.lengths), self.tt_text.rope_delta
        filled = max(self.offset)
        self.ctx = self.ref.context(self.ref_text.cache, self.offset, self.rope_delta, filled)
        self.ctx_fp32 = self.fp32.context(self.ref_text.cache, self.offset, self.rope_delta, filled)
        self.noise = torch.randn(samples, 64, 2, generator=torch.Generator().manual_seed(11))

    def close(self):
        self.tt.close()
        self.tt_text.close()


@pytest.fixture(scope="module", params=device_cases(CASES))
def case(request, checkpoints, tmp_path_factory):
    param, device = case_device(request)
    recipe, k = param.split("-K")
    c = Case(recipe, int(k), device, checkpoints, tmp_path_factory.mktemp(param))
    yield c
    c.close()


def reference_run(expert, ctx, noise, steps):
    """The torch sampling's final x and its (x_k, t_k, v_k) at every step."""
    seen = []

    def velocity(x, t):
        v = expert.velocity(x, t, ctx)
        seen.append((x.clone(), float(t[0]), v.float().clone()))
        return v

    return euler_sample(noise, steps, velocity), seen


def waypoints(actions: torch.Tensor):
    space = UnicycleActionSpace()
    return [space.rollout(space.denormalise(a.double().numpy()), V0)[0] for a in actions]


def test_velocity_matches_the_torch_expert_at_every_step(case, record_figure):
    steps = case.cfg.num_inference_steps
    _, seen = reference_run(case.ref, case.ctx, case.noise, steps)
    worst, worst_rel = 1.0, 0.0
    for k, (x, t, v) in enumerate(seen):
        got = tt_velocity(case.tt, x, t, case.offset, case.rope_delta, steps)
        value = assert_agrees(v, got, min_pcc=VELOCITY_PCC, what=f"step {k} (t = {t}) velocity")
        worst = min(worst, value.pcc)
        worst_rel = max(worst_rel, value.relative)
    record_figure("velocity PCC, worst step", worst)
    record_figure("velocity relative error, worst step", worst_rel)


def test_sampled_waypoints_match_the_torch_expert(case, record_figure):
    steps = case.cfg.num_inference_steps
    ref, seen = reference_run(case.ref, case.ctx, case.noise, steps)
    fp32, _ = reference_run(case.fp32, case.ctx_fp32, case.noise, steps)
    got = case.tt.sample(case.noise, case.offset, case.rope_delta)
    drift = max(ade(a, b) for a, b in zip(waypoints(got), waypoints(ref), strict=True))
    rounding = max(ade(a, b) for a, b in zip(waypoints(ref), waypoints(fp32), strict=True))
    record_figure("waypoint ADE to the rounded torch expert m", drift)
    record_figure("waypoint ADE of the rounding alone m", rounding)
    record_figure(
        "waypoint ADE to the float32 torch expert m",
        max(ade(a, b) for a, b in zip(waypoints(got), waypoints(fp32), strict=True)),
    )
    # the two velocity errors at the reference's own x_k: the device's, and the rounding's (float32 expert)
    device_rel, rounding_rel = [], []
    for x, t, v in seen:
        device_rel.append(relative_error(v, tt_velocity(case.tt, x, t, case.offset, case.rope_delta, steps)))
        times = torch.full((x.shape[0],), t)
        rounding_rel.append(relative_error(case.fp32.velocity(x, times, case.ctx_fp32).float(), v))
    ratio = math.sqrt(sum(e * e for e in device_rel) / sum(e * e for e in rounding_rel))
    bound = ADE_MARGIN * rounding * ratio + ADE_FLOOR_M
    record_figure("velocity error, device / rounding (RMS over steps)", ratio)
    record_figure("waypoint ADE bound m", bound)
    assert drift <= bound, (
        f"ADE {drift:.3f} m > {bound:.3f} m (rounding {rounding:.3f} m, error ratio {ratio:.3f})"
    )


def test_the_device_builds_each_slots_causal_bound_and_keeps_the_page_table(case):
    """The bounds the device builds per prediction are `ExpertPlan.cur_pos` of slot s's offset on each of
    its n_kv x q_tiles entries (an idle slot: its own region only), the uploaded page table the plan's."""
    state = case.tt._setup(case.tt_text.max_batch, case.cfg.num_inference_steps)
    case.tt._prepare(state, case.offset, case.rope_delta)
    plan, b = state.plan, state.buffers
    got = case.tt.download(b.cur_pos).reshape(plan.samples, -1)
    offsets = [*case.offset, *[0] * (plan.samples - len(case.offset))]
    assert got.tolist() == [[plan.cur_pos(o)] * (plan.kv_heads * plan.q_tiles) for o in offsets]
    assert case.tt.download(b.page_table).tolist() == plan.page_table()


def test_traced_sampling_is_identical_to_untraced(case):
    card_only(case.tt_text, "traced against untraced sampling")
    traced = case.tt.sample(case.noise, case.offset, case.rope_delta, traced=True)
    again = case.tt.sample(case.noise, case.offset, case.rope_delta, traced=True)  # replays every step
    untraced = case.tt.sample(case.noise, case.offset, case.rope_delta, traced=False)
    assert torch.equal(traced, untraced) and torch.equal(again, untraced)
