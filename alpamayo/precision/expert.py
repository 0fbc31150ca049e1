"""What a precision recipe costs the flow-matching action expert, on the CPU (part of `alpamayo precision`).

The expert of an Alpamayo checkpoint samples over the text model's cache of the evaluation prompt (the corpus
rows `alpamayo.precision.reference` evaluates; offset = their count, as if the last one were
`<|traj_future_start|>`), one sample from a fixed noise:

  * the unrounded float32 expert over the unrounded model's cache is the reference: its x_k, t_k, v_k at
    every Euler step and its final actions;
  * each recipe's expert (weights rounded as the device holds them, `QuantizedCheckpoint`) over that
    recipe's model's cache (K/V rounded to the recipe's cache dtype) gives the per-step velocity PCC, at the
    reference's own x_k (each step's own error), and the final waypoint drift: the ADE between the two
    samplings' waypoints, both rolled out by the unicycle action space at `V0` for 6.4 s.

With a recorded drive, the drive columns of the report compare the two whole pipelines, expert included when it
is the checkpoint's trajectory decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import expert_config_of
from alpamayo.config.model import ModelConfig
from alpamayo.expert.sampler import euler_sample, initial_noise
from alpamayo.expert.weights import has_expert_weights, load_expert
from alpamayo.numerics import pcc
from alpamayo.prediction import FUTURE_STEPS
from alpamayo.quant import QuantRecipe
from planner.action_space import UnicycleActionSpace
from planner.metrics import ade

V0 = 10.0  # m/s: rollout speed of the waypoint drift (urban driving; a drive's own speeds are in its columns)
NOISE_SEED = 0


@dataclass
class ExpertRun:
    """One sampling: per Euler step (x_k [1, 64, 2], t_k, v_k [1, 64, 2] float32) and the final actions."""

    steps: list[tuple[torch.Tensor, float, torch.Tensor]]
    actions: torch.Tensor


def _waypoints(actions: torch.Tensor) -> np.ndarray:
    space = UnicycleActionSpace()
    return space.rollout(space.denormalise(actions[0].double().numpy()), V0)[0]


def expert_run(
    source: Checkpoint,
    cfg: ModelConfig,
    text: Any,
    length: int,
    reference: ExpertRun | None = None,
    quant: QuantRecipe | None = None,
) -> tuple[ExpertRun, list[float]] | None:
    """The checkpoint's expert sampling over `text`'s cache of `length` rows (None without an expert), and,
    given the `reference` run, this expert's velocity PCC at the reference's x_k of every step; `quant`: the
    torch backend's weight-only recipe of the expert's linears."""
    expert_cfg = expert_config_of(cfg)
    if expert_cfg is None or not has_expert_weights(source, expert_cfg):
        return None
    expert = load_expert(source, expert_cfg, cfg.text, quant=quant)
    ctx = expert.context(text.cache, [length], text.rope_delta, length)
    seen: list[tuple[torch.Tensor, float, torch.Tensor]] = []

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        v = expert.velocity(x, t, ctx)
        seen.append((x.clone(), float(t[0]), v.float().clone()))
        return v

    actions = euler_sample(expert_noise(), expert_cfg.num_inference_steps, velocity)
    pccs = []
    if reference is not None:
        t_rows = [torch.tensor([t]) for _, t, _ in reference.steps]
        pccs = [
            pcc(v, expert.velocity(x, t, ctx)) for (x, _, v), t in zip(reference.steps, t_rows, strict=True)
        ]
    return ExpertRun(seen, actions), pccs


def expert_noise() -> torch.Tensor:
    """The one sample's initial noise [1, 64, 2] of every expert run (`NOISE_SEED`)."""
    return initial_noise(1, FUTURE_STEPS, 1.0, NOISE_SEED)


def waypoint_drift(actions: torch.Tensor, reference: ExpertRun) -> float:
    """ADE (m) between the waypoints of `actions` [1, 64, 2] and the reference run's, rolled out at `V0`."""
    return float(ade(_waypoints(actions), _waypoints(reference.actions)))


def expert_figures(reference: ExpertRun, run: ExpertRun, pccs: list[float]) -> dict[str, Any]:
    """velocity_pcc (per step), velocity_pcc_min, ade_drift_m (waypoints at V0), v0_mps."""
    return {
        "velocity_pcc": pccs,
        "velocity_pcc_min": min(pccs),
        "ade_drift_m": waypoint_drift(run.actions, reference),
        "v0_mps": V0,
    }
