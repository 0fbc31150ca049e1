"""One scene driven closed-loop: the world renders each camera from the ego's simulated pose, the driver
plans, the controller moves the ego; other traffic replays its script (non-reactive, as AlpaSim's log-replay
agents).

Per tick at world time t (every TICK_S from T0_S): each camera's JPEG rendered at the ego's pose at t, the ego's
last 16 poses (10 Hz, local = world frame), the route (the road centreline ROUTE_AHEAD_M ahead in the rig
frame), then `drive(t, t)`; the ego follows the answer for one tick (`alpamayo.closed_loop.controller`). During
the first T0_S, and while the driver answers an empty plan, the ego drives its recorded path (the simulator
holds the ego on the log). Frames are exposed over [t - EXPOSURE_US, t].
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from alpamayo.closed_loop import controller
from alpamayo.closed_loop.driver import DrivePlan, Driver, Egomotion
from alpamayo.closed_loop.scene import HISTORY_STEPS, T0_S, TICK_S, Scene, to_us
from alpamayo.demo_drive import FUTURE_NS, JPEG_QUALITY
from alpamayo.demo_drive.render import RIG, Renderer
from alpamayo.demo_drive.world import World
from alpamayo.prediction import FRAMES_PER_CAMERA
from alpamayo.rotations import yaw_to_quat
from bridges.alpasim.service import CAMERA_INDEX

ROUTE_AHEAD_M, ROUTE_STEP_M = 200.0, 10.0
EXPOSURE_US = 1_000
# Alpamayo's default rig: front wide, cross left and right, front tele.
DEFAULT_CAMERAS = (
    "camera_front_wide_120fov",
    "camera_cross_left_120fov",
    "camera_cross_right_120fov",
    "camera_front_tele_30fov",
)


@dataclass
class Rollout:
    """What a scene produced: world times t_s [N] (0, TICK_S, ... T0_S + seconds), the ego's rear-axle poses
    xy [N, 2] metres and yaw [N] rad at them, and each tick's answer (its world time and plan)."""

    scene: Scene
    world: World
    t_s: np.ndarray
    xy: np.ndarray
    yaw: np.ndarray
    plans: list[tuple[float, DrivePlan]] = field(default_factory=list)


def make_world(scene: Scene, seconds: float) -> World:
    """The scene's world, with road and traffic to cover the drive and the plans' 6.4 s past its end."""
    return World(scene.seed, T0_S + seconds + FUTURE_NS / 1e9, scene.script)


def run_scene(
    driver: Driver,
    scene: Scene,
    seconds: float,
    size: tuple[int, int] = (320, 576),
    cameras: Sequence[str] = DEFAULT_CAMERAS,
    seed: int = 0,
) -> Rollout:
    """Drive `scene` for `seconds` after T0_S through `driver` with `cameras` rendered at `size` (height,
    width) pixels, in a session of sampling seed `seed`; the session is closed whatever happens."""
    world = make_world(scene, seconds)
    renderer = Renderer(world, *size)
    ticks = round(seconds / TICK_S)
    n = round(T0_S / TICK_S) + ticks + 1
    t_s = TICK_S * np.arange(n)
    recorded_xyz, recorded_yaw = world.ego_pose(t_s)
    recorded_v = np.gradient(world.arc_length(t_s), t_s)
    xy, yaw, v = recorded_xyz[:, :2].copy(), recorded_yaw.copy(), recorded_v.copy()
    rollout = Rollout(scene, world, t_s, xy, yaw)
    session = scene.scene_id
    driver.start_session(session, seed, cameras)
    try:
        for i in range(round(T0_S / TICK_S) - FRAMES_PER_CAMERA + 1, n - 1):
            _submit_frames(driver, session, renderer, cameras, t_s[i], xy[i], yaw[i])
            if t_s[i] < T0_S - 1e-9:
                continue
            _submit_state(driver, session, world, t_s[: i + 1], xy[: i + 1], yaw[: i + 1], v[: i + 1])
            now = int(to_us(t_s[i]))
            plan = driver.drive(session, now, now)
            rollout.plans.append((float(t_s[i]), plan))
            if plan.empty:
                continue  # the ego stays on its recorded path
            state = controller.EgoState(float(xy[i, 0]), float(xy[i, 1]), float(yaw[i]), float(v[i]))
            plan_t = (plan.timestamps_us - to_us(0.0)) / 1e6
            after = plan_t > t_s[i]
            accel, steer = controller.controls(state, plan_t[after], plan.xyz[after, :2], float(t_s[i]))
            nxt = controller.step(state, accel, steer)
            xy[i + 1], yaw[i + 1], v[i + 1] = nxt.xy, nxt.yaw, nxt.v
            # Once the ego drives itself its path diverges from the log: later poses follow from it.
            xy[i + 2 :], yaw[i + 2 :], v[i + 2 :] = nxt.xy, nxt.yaw, nxt.v
    finally:
        driver.close_session(session)
    return rollout


def _submit_frames(driver, session, renderer, cameras, t, xy, yaw) -> None:
    end_us = int(to_us(t))
    for name in cameras:
        image = renderer.render_at(RIG[CAMERA_INDEX[name]], float(t), xy, float(yaw))
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=JPEG_QUALITY)
        driver.submit_image(session, name, end_us - EXPOSURE_US, end_us, buf.getvalue())


def _submit_state(driver, session, world: World, t_s, xy, yaw, v) -> None:
    """The last HISTORY_STEPS poses with their rig-frame velocity and acceleration, and the route."""
    k = slice(-HISTORY_STEPS, None)
    count = len(t_s[k])
    accel = np.gradient(v[k], TICK_S) if count > 1 else np.zeros(count)
    zeros = np.zeros(count)
    driver.submit_egomotion(
        session,
        Egomotion(
            to_us(t_s[k]),
            np.concatenate([xy[k], zeros[:, None]], axis=1),
            yaw_to_quat(yaw[k]),
            np.stack([v[k], zeros, zeros], axis=1),
            np.stack([accel, zeros, zeros], axis=1),
        ),
    )
    s0, _ = world.project(xy[-1])
    ahead, _ = world.at(s0 + np.arange(0.0, ROUTE_AHEAD_M + 1e-9, ROUTE_STEP_M))
    c, s = np.cos(yaw[-1]), np.sin(yaw[-1])
    d = ahead - xy[-1]
    rig = np.stack([d[:, 0] * c + d[:, 1] * s, -d[:, 0] * s + d[:, 1] * c, np.zeros(len(d))], axis=1)
    driver.submit_route(session, int(to_us(t_s[-1])), rig)
