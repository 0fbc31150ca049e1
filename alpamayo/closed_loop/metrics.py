"""A rollout scored with AlpaSim's definitions (`src/eval/src/eval/scorers/*.py`, `aggregation/scene_score.py`).

Per time step (every pose of the rollout, history included, as AlpaSim scores every simulated timestamp):
  * collision (CollisionScorer): the ego box intersects another vehicle's box; `front` when that box touches
    the ego's front bumper line, else `rear` for the rear bumper line, else `lateral`; `collision_any` any of
    them. Aggregated over time by MAX. Boxes are shrunk 2% (AlpaSim's vehicle_shrink_factor);
  * offroad (OffRoadScorer): the ego box is not inside the road (the drivable surface between the road edges,
    all three lanes). AlpaSim tests the map's lanes and then contact with the closest road edge; with the whole
    road known here, "not contained" is the same event from the step the box first crosses an edge. MAX;
  * progress (GroundTruthScorer): the ego box centroid projected onto the recorded ego path of the scene,
    normalised by its length (`progress_rel_to_total`, LAST); `gt_dist_traveled_m` that length;
  * plan_deviation (PlanDeviationScorer): for consecutive answers, the selected plans' XY distance at the
    current plan's timestamps (its first point, the current pose, excluded) that the previous plan covers,
    averaged with weights exp(-DECAY i); the mean over ticks;
  * scene_score (score_rollout): progress_score = 1 if the recorded path is shorter than
    MIN_GT_DISTANCE_M, else min(clip(progress, 0, 1) / SATURATION, 1); 0 on a collision or off-road.
    AlpaSim zeroes only an at-fault collision; the synthetic world assigns no fault, so any collision counts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import shapely

from alpamayo.closed_loop.rollout import Rollout
from alpamayo.closed_loop.scene import (
    CAR_LENGTH_M,
    CAR_WIDTH_M,
    EGO_CENTER_AHEAD_M,
    EGO_LENGTH_M,
    EGO_WIDTH_M,
    box_corners,
)
from alpamayo.demo_drive.world import ROAD_HALF_WIDTH_M, World

# AlpaSim's shipped evaluation config (src/wizard/configs/base_config.yaml).
PLAN_DEVIATION_DECAY = 0.1
SATURATION = 0.8  # scene_score.progress_saturation_threshold
MIN_GT_DISTANCE_M = 5.0  # scene_score.min_gt_distance_for_full_score_m
ROAD_WINDOW_M = 40.0  # the road polygon spans this far behind and ahead of the ego (m of arc length)


@dataclass(frozen=True)
class SceneMetrics:
    """A scene's metrics: the per-time aggregates, the first time (s after t = 0) of a collision and of
    off-road (None: never), and scene_score with its progress_score and failure reason."""

    collision_front: bool
    collision_rear: bool
    collision_lateral: bool
    collision_any: bool
    offroad: bool
    progress: float
    gt_dist_traveled_m: float
    dist_traveled_m: float
    plan_deviation: float | None
    first_collision_s: float | None
    first_offroad_s: float | None
    scene_score: float
    progress_score: float
    failure_reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def ego_polygon(xy: np.ndarray, yaw: float) -> shapely.Polygon:
    return shapely.Polygon(box_corners(xy, yaw, EGO_LENGTH_M, EGO_WIDTH_M, EGO_CENTER_AHEAD_M))


def car_polygons(world: World, t: float) -> list[shapely.Polygon]:
    """Every scripted car's box at world time t (its replayed position: traffic does not react)."""
    polygons = []
    for car in world.cars:
        (xy,), (yaw,) = world.at(np.array([car.s_at(t)]), car.d)
        polygons.append(shapely.Polygon(box_corners(xy, yaw, CAR_LENGTH_M, CAR_WIDTH_M)))
    return polygons


def road_polygon(world: World, s_center: float) -> shapely.Polygon:
    """The road between its edges over arc lengths s_center +- ROAD_WINDOW_M."""
    s = np.arange(s_center - ROAD_WINDOW_M, s_center + ROAD_WINDOW_M, 1.0)
    left, _ = world.at(s, ROAD_HALF_WIDTH_M)
    right, _ = world.at(s, -ROAD_HALF_WIDTH_M)
    return shapely.Polygon(np.concatenate([left, right[::-1]]))


def collision_kind(ego: shapely.Polygon, corners: np.ndarray, others: list[shapely.Polygon]) -> str | None:
    """'front', 'rear', 'lateral' (AlpaSim's order of tests) or None for the ego box against `others`;
    corners [4, 2] the ego's (front left, front right, rear right, rear left)."""
    front = shapely.LineString(corners[[0, 1]])
    rear = shapely.LineString(corners[[2, 3]])
    kind = None
    for other in others:
        if not other.intersects(ego):
            continue
        # AlpaSim keeps the last intersecting box's kind.
        kind = "front" if other.intersects(front) else "rear" if other.intersects(rear) else "lateral"
    return kind


def plan_deviation(rollout: Rollout) -> float | None:
    """Mean over consecutive non-empty answers of the exp-weighted XY distance between the plans."""
    values = []
    answers = [p for _, p in rollout.plans if not p.empty]
    for prev, cur in itertools.pairwise(answers):
        ts = cur.timestamps_us[1:]
        ts = ts[ts <= prev.timestamps_us[-1]]
        if len(ts) == 0:
            continue
        a = np.stack([np.interp(ts, cur.timestamps_us, cur.xyz[:, i]) for i in (0, 1)], axis=-1)
        b = np.stack([np.interp(ts, prev.timestamps_us, prev.xyz[:, i]) for i in (0, 1)], axis=-1)
        distances = np.linalg.norm(a - b, axis=-1)
        values.append(
            float(np.average(distances, weights=np.exp(-PLAN_DEVIATION_DECAY * np.arange(len(ts)))))
        )
    return float(np.mean(values)) if values else None


def scene_score(
    progress: float, gt_distance_m: float, collided: bool, offroad: bool
) -> tuple[float, float, str | None]:
    """(score, progress_score, failure_reason) as AlpaSim's score_rollout."""
    if gt_distance_m < MIN_GT_DISTANCE_M:
        progress_score = 1.0
    else:
        progress_score = min(min(max(progress, 0.0), 1.0) / SATURATION, 1.0)
    reason = "collision" if collided else "offroad" if offroad else None
    return (0.0 if reason else progress_score), progress_score, reason


def score(rollout: Rollout) -> SceneMetrics:
    """The metrics of `rollout` (see the module docstring)."""
    world = rollout.world
    gt_xyz, _ = world.ego_pose(rollout.t_s)
    gt = shapely.LineString(gt_xyz[:, :2])
    kinds, offroad = [], []
    centroid = None
    for t, xy, yaw in zip(rollout.t_s, rollout.xy, rollout.yaw, strict=True):
        corners = box_corners(xy, yaw, EGO_LENGTH_M, EGO_WIDTH_M, EGO_CENTER_AHEAD_M)
        ego = shapely.Polygon(corners)
        kinds.append(collision_kind(ego, corners, car_polygons(world, float(t))))
        offroad.append(not road_polygon(world, world.project(xy)[0]).contains(ego))
        centroid = ego.centroid
    progress = float(gt.project(centroid, normalized=True))
    collided = any(k is not None for k in kinds)
    score_, progress_score, reason = scene_score(progress, gt.length, collided, any(offroad))
    return SceneMetrics(
        collision_front="front" in kinds,
        collision_rear="rear" in kinds,
        collision_lateral="lateral" in kinds,
        collision_any=collided,
        offroad=any(offroad),
        progress=progress,
        gt_dist_traveled_m=float(gt.length),
        dist_traveled_m=float(np.sum(np.linalg.norm(np.diff(rollout.xy, axis=0), axis=1))),
        plan_deviation=plan_deviation(rollout),
        first_collision_s=_first(rollout.t_s, [k is not None for k in kinds]),
        first_offroad_s=_first(rollout.t_s, offroad),
        scene_score=score_,
        progress_score=progress_score,
        failure_reason=reason,
    )


def _first(t_s: np.ndarray, flags: list[bool]) -> float | None:
    return next((float(t) for t, f in zip(t_s, flags, strict=True) if f), None)
