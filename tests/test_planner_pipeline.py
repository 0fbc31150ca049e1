"""The planner facade on the demo checkpoint: world-frame history -> prompt -> generated plans -> samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alpamayo.config.loader import load_model_config
from alpamayo.decoding.loop import generate_plans
from alpamayo.generation import Sampling, TokenSampler
from alpamayo.prediction import EgoHistory
from alpamayo.runtime import planner_config
from alpamayo.text import TextModel
from alpamayo.tokenizer import load_tokenizer
from planner.metrics import ade, fde
from planner.pipeline import Planner
from planner.plans import GeneratedPlan


@pytest.fixture(scope="module")
def planner(demo_checkpoint):
    return Planner.from_config(
        planner_config(load_model_config(demo_checkpoint)), load_tokenizer(demo_checkpoint)
    )


def world_history(speed: float, yaw: float) -> EgoHistory:
    """Straight drive at `speed` m/s along world heading `yaw`, from an arbitrary world origin."""
    s = speed * 0.1 * np.arange(16)
    xyz = np.stack([500 + s * np.cos(yaw), -200 + s * np.sin(yaw), np.full(16, 12.0)], -1)
    quat = np.tile([0.0, 0.0, np.sin(yaw / 2), np.cos(yaw / 2)], (16, 1))
    return EgoHistory(xyz=xyz, quat_xyzw=quat, t_ns=1_000_000_000 + np.arange(16) * 100_000_000)


def test_prompt_history_tokens_are_the_t0_frame_deltas(planner):
    history = planner.history(world_history(speed=12.0, yaw=2.5))
    prompt = planner.prompt([0, 1, 2, 6], 4, history)
    ids = np.array(prompt.token_ids)
    slots = np.isin(ids, planner.vocab.history_ids)
    bins = np.searchsorted(planner.vocab.history_ids, ids[slots])
    # in the t0 frame the car drives along +x at 1.2 m per step, whatever its world heading
    assert bins[3::3].tolist() == [round((1.2 + 4) / 8 * 999)] * 15
    # a zero delta sits exactly between bins 499 and 500 (999 steps over [-4, 4]); round-off picks either
    assert set(bins[4::3].tolist()) <= {499, 500} and set(bins[5::3].tolist()) <= {499, 500}
    assert planner.action_space.estimate_v0(history) == pytest.approx(12.0, abs=1e-3)


def test_generated_plans_become_trajectory_samples(planner, demo_checkpoint):
    history = planner.history(world_history(speed=8.0, yaw=-0.4))
    prompt = planner.prompt([1], 1, history, route="Turn right in 40 m")
    limits = planner.limits(max_reasoning_tokens=6)
    model = TextModel.from_checkpoint(demo_checkpoint)
    model.setup_cache(len(prompt.token_ids) + limits.decode_positions, 2)
    logits = model.prefill(torch.tensor(prompt.token_ids))
    sampler = TokenSampler.for_request(Sampling(0.6, 0.98), 3, 2)
    plans = generate_plans(model, logits, planner.vocab, sampler, limits, model.cfg.eos_token_ids)
    samples = planner.samples(plans, history)
    for plan, sample in zip(plans, samples, strict=True):
        assert sample.token_ids == plan.future_token_ids and len(sample.token_ids) == 128
        assert (
            sample.actions.shape == (64, 2) and sample.xyz.shape == (64, 3) and sample.heading.shape == (64,)
        )
        np.testing.assert_array_equal(sample.actions, planner.future_tokenizer.decode(plan.future_bins))
        xyz, _ = planner.action_space.rollout(sample.actions, v0=planner.action_space.estimate_v0(history))
        np.testing.assert_array_equal(sample.xyz, xyz)
        assert sample.reasoning == planner.reasoning_text(plan.reasoning_token_ids)
        assert sample.reasoning_capped == plan.reasoning_capped


def test_reasoning_text_stops_at_cot_end_and_drops_markers(planner):
    tok = planner.tokenizer
    ids = tok("Stop for the red light.<|cot_end|><|traj_future_start|> ignored", add_special_tokens=False)[
        "input_ids"
    ]
    assert planner.reasoning_text(ids) == "Stop for the red light."


def test_ground_truth_tokenisation_round_trip(planner, record_figure):
    """A recorded-style future (braking into a left curve) -> actions -> 128 tokens -> waypoints."""
    t = 0.1 * np.arange(1, 65)
    true_actions = np.stack([-1.0 + 0.02 * t, 0.04 * np.clip(t - 1.0, 0.0, 2.0) / 2.0], -1)
    gt_xyz, gt_heading = planner.action_space.rollout(true_actions, v0=14.0)
    actions = planner.action_space.actions_from_trajectory(gt_xyz, gt_heading, v0=14.0)
    bins = planner.future_tokenizer.encode(actions)
    plan = GeneratedPlan([], False, bins, planner.vocab.future_ids[bins].tolist())
    history = planner.history(world_history(speed=14.0, yaw=0.3))
    (sample,) = planner.samples([plan], history)
    record_figure("ADE m", float(ade(sample.xyz, gt_xyz)))
    record_figure("FDE m", float(fde(sample.xyz, gt_xyz)))
    assert ade(sample.xyz, gt_xyz) < 0.1 and fde(sample.xyz, gt_xyz) < 0.3
