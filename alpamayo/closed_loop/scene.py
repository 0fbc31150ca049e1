"""A closed-loop scene: the synthetic world of a seed (or a script of it), the ego's box, the rollout's timeline,
and an episode: one scene driven by one policy, the unit a run's results are kept by.

Timeline (world seconds from the world's start): the ego drives its recorded path for the first HISTORY_S
(16 poses at 10 Hz, the model's ego history, and 4 frames per camera), then from T0_S on it follows the
policy's plans, one `drive` every TICK_S, until T0_S + seconds. Scene clock: microseconds, START_US at t = 0
(the demo drive's recording clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from alpamayo.demo_drive import START_NS
from alpamayo.prediction import DT_S, HISTORY_STEPS

START_US = START_NS // 1000
TICK_S = DT_S  # the policy and the controller run at 10 Hz, the model's frame rate
T0_S = (HISTORY_STEPS - 1) * TICK_S  # the first closed-loop tick: 1.5 s, a full ego history behind it
# The ego's box: the demo car (4.5 x 1.85 m like the world's cars), its centre 1.35 m ahead of the rear axle
# the poses name. AlpaSim shrinks every box by 2% before testing overlaps (vehicle_shrink_factor 0.02).
EGO_LENGTH_M, EGO_WIDTH_M, EGO_CENTER_AHEAD_M = 4.5, 1.85, 1.35
CAR_LENGTH_M, CAR_WIDTH_M = 4.5, 1.85
SHRINK = 0.02


@dataclass(frozen=True)
class Scene:
    """One scene: the synthetic world of `seed`, or its `script` (`alpamayo.demo_drive.world.SCRIPTS`)."""

    seed: int
    script: str | None = None

    @property
    def scene_id(self) -> str:
        """scene-00003, or the script's name and seed: lead-brakes-00003."""
        return f"{self.script or 'scene'}-{self.seed:05d}"


@dataclass(frozen=True)
class Episode:
    """`scene` driven by `policy` (`alpamayo.closed_loop.policies.POLICIES`). clip_id, result_name and as_dict()
    are what the evaluation's run directory and Ray dispatch key results by (`alpamayo.eval.results.RunDir`)."""

    scene: Scene
    policy: str

    @property
    def clip_id(self) -> str:
        return f"{self.scene.scene_id}.{self.policy}"

    @property
    def result_name(self) -> str:
        return f"{self.clip_id}.json"

    def as_dict(self) -> dict[str, Any]:
        s = self.scene
        return {"scene_id": s.scene_id, "seed": s.seed, "script": s.script, "policy": self.policy}


def to_us(t_s: float | np.ndarray) -> np.ndarray:
    """Scene clock microseconds of world seconds t_s."""
    return START_US + np.round(np.asarray(t_s, dtype=np.float64) * 1e6).astype(np.int64)


def box_corners(xy: np.ndarray, yaw: float, length: float, width: float, ahead: float = 0.0) -> np.ndarray:
    """[4, 2] world corners (front left, front right, rear right, rear left) of a box `length` x `width`
    metres whose centre lies `ahead` metres in front of `xy` along `yaw`, shrunk by SHRINK."""
    c, s = np.cos(yaw), np.sin(yaw)
    fwd, left = np.array([c, s]), np.array([-s, c])
    centre = np.asarray(xy, dtype=np.float64) + ahead * fwd
    half_l, half_w = (1 - SHRINK) * length / 2, (1 - SHRINK) * width / 2
    return np.array(
        [centre + sx * half_l * fwd + sy * half_w * left for sx, sy in ((1, 1), (1, -1), (-1, -1), (-1, 1))]
    )
