"""AlpaSim's metrics on scripted plans with known outcomes, driven through the closed loop (renderer, controller,
non-reactive traffic): the recorded path is a perfect plan, a plan that veers right leaves the road when its box
crosses the road edge, a plan that speeds up runs into the lead car."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from alpamayo.closed_loop.driver import DrivePlan, Egomotion
from alpamayo.closed_loop.metrics import MIN_GT_DISTANCE_M, SATURATION, scene_score, score
from alpamayo.closed_loop.rollout import make_world, run_scene
from alpamayo.closed_loop.scene import (
    EGO_CENTER_AHEAD_M,
    EGO_LENGTH_M,
    EGO_WIDTH_M,
    SHRINK,
    START_US,
    T0_S,
    Scene,
)
from alpamayo.demo_drive.world import ROAD_HALF_WIDTH_M, World
from alpamayo.rotations import yaw_to_quat

SIZE = (48, 80)
CAMERAS = ("camera_front_wide_120fov",)
PLAN_T = 0.1 * np.arange(0, 65)  # the current pose, then 64 waypoints at 10 Hz


class ScriptedDriver:
    """A driver whose plan at world time t is `path(world, t + PLAN_T)` -> (s, d): arc length and lateral offset
    of the rear axle on the road; it checks the session calls arrive in AlpaSim's order."""

    def __init__(self, world: World, path: Callable[[World, np.ndarray], tuple[np.ndarray, np.ndarray]]):
        self.world, self.path = world, path
        self.images: list[tuple[str, int]] = []
        self.egomotion: Egomotion | None = None
        self.open = False

    def start_session(self, session_id: str, seed: int, cameras: Sequence[str]) -> None:
        self.open = True

    def submit_image(self, session_id, logical_id, frame_start_us, frame_end_us, image: bytes) -> None:
        assert image[:2] == b"\xff\xd8" and frame_start_us < frame_end_us
        self.images.append((logical_id, frame_end_us))

    def submit_egomotion(self, session_id: str, egomotion: Egomotion) -> None:
        self.egomotion = egomotion

    def submit_route(self, session_id, timestamp_us, waypoints_rig) -> None:
        assert waypoints_rig[0, 0] == pytest.approx(0.0, abs=1.0)  # the route starts at the ego

    def drive(self, session_id: str, time_now_us: int, time_query_us: int) -> DrivePlan:
        assert self.egomotion.timestamps_us[-1] == time_now_us and self.images[-1][1] == time_now_us
        t = (time_now_us - START_US) / 1e6 + PLAN_T
        s, d = self.path(self.world, t)
        xy, yaw = self.world.at(s, d)
        xyz = np.concatenate([xy, np.zeros((len(xy), 1))], axis=1)
        return DrivePlan(START_US + np.round(t * 1e6).astype(np.int64), xyz, yaw_to_quat(yaw))

    def close_session(self, session_id: str) -> None:
        self.open = False


def drive(path, seconds: float, seed: int = 3):
    scene = Scene(seed)
    driver = ScriptedDriver(make_world(scene, seconds), path)
    rollout = run_scene(driver, scene, seconds, SIZE, CAMERAS)
    assert not driver.open
    return rollout, score(rollout)


def recorded(world: World, t: np.ndarray):
    return world.arc_length(t), np.zeros_like(t)


def test_following_the_recorded_path_scores_full_progress_without_incident():
    rollout, m = drive(recorded, 4.0)
    xyz, _ = rollout.world.ego_pose(rollout.t_s)
    assert np.abs(rollout.xy - xyz[:, :2]).max() < 0.3  # pure pursuit tracks the plan
    assert m.progress == pytest.approx(1.0)
    assert not m.collision_any and not m.offroad
    assert m.scene_score == 1.0 and m.failure_reason is None
    assert m.plan_deviation < 0.05  # consecutive plans are the same path
    assert m.dist_traveled_m == pytest.approx(m.gt_dist_traveled_m, rel=0.02)


def test_a_plan_veering_right_is_off_road_once_its_box_crosses_the_road_edge():
    rate = 1.0  # m/s to the right from T0

    def veer(world, t):
        return world.arc_length(t), -rate * np.clip(t - T0_S, 0, None)

    rollout, m = drive(veer, 6.0)
    assert m.offroad and m.scene_score == 0.0 and m.failure_reason in ("offroad", "collision")
    # The box's right front corner reaches the edge when the rear axle is its half width (and a little for the
    # slight yaw) inside it: measure where the driven path actually is at the reported time.
    (i,) = np.flatnonzero(np.isclose(rollout.t_s, m.first_offroad_s))
    lateral = [rollout.world.project(xy)[1] for xy in rollout.xy[i - 1 : i + 1]]
    half_width = (1 - SHRINK) * EGO_WIDTH_M / 2
    assert -lateral[0] + half_width < ROAD_HALF_WIDTH_M + 0.1  # still inside one step before
    assert -lateral[1] + half_width > ROAD_HALF_WIDTH_M - 0.3  # touching the edge at it
    # ~4.5 m of lateral travel at 1 m/s after T0, with the controller's lag
    assert T0_S + 3.8 < m.first_offroad_s < T0_S + 5.5


def test_a_plan_speeding_into_the_lead_car_collides_front():
    def rush(world, t):
        return world.arc_length(T0_S) + world.v0 * (t - T0_S) + 8.0 * np.clip(t - T0_S, 0, None) ** 1.2, 0 * t

    rollout, m = drive(rush, 8.0)
    assert m.collision_any and m.collision_front and not m.offroad
    assert m.scene_score == 0.0 and m.failure_reason == "collision"
    # at the first collision the gap between the lead car's rear and the ego's front bumper is closed
    lead = rollout.world.cars[0]
    (i,) = np.flatnonzero(np.isclose(rollout.t_s, m.first_collision_s))
    s_ego = rollout.world.project(rollout.xy[i])[0] + EGO_CENTER_AHEAD_M + EGO_LENGTH_M / 2
    s_ego_before = rollout.world.project(rollout.xy[i - 1])[0] + EGO_CENTER_AHEAD_M + EGO_LENGTH_M / 2
    rear = lambda k: lead.s0 + lead.speed * rollout.t_s[k] - EGO_LENGTH_M / 2  # noqa: E731
    assert s_ego_before < rear(i - 1) + 0.1 and s_ego > rear(i) - 0.3


def test_scene_score_follows_alpasim_score_rollout():
    assert scene_score(0.4, 100.0, False, False) == (
        pytest.approx(0.4 / SATURATION),
        pytest.approx(0.5),
        None,
    )
    assert scene_score(0.95, 100.0, False, False)[0] == 1.0
    assert scene_score(0.1, MIN_GT_DISTANCE_M - 1, False, False)[0] == 1.0  # short clip: full progress score
    assert scene_score(0.95, 100.0, True, True) == (0.0, 1.0, "collision")
    assert scene_score(0.95, 100.0, False, True) == (0.0, 1.0, "offroad")
