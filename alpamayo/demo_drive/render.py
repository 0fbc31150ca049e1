"""Pinhole rendering of the synthetic world into Alpamayo's camera rig with Pillow.

Camera frame: depth along the optical axis (forward), `lat` to the left, `up` up, metres. Image: u right,
v down, pixels; the horizon is the image centre row (cameras are level). Polygons are clipped at a 0.3 m near
plane and drawn far to near (painter's algorithm): ground layers first (shoulder, asphalt, markings), then boxes
sorted by distance with back faces culled. Colours fade toward the horizon haze with distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from alpamayo.demo_drive.world import LANE_WIDTH_M, ROAD_HALF_WIDTH_M, SHOULDER_M, Box, World

NEAR_M = 0.3
HAZE_M = 600.0  # distance at which a colour has faded 63% of the way to the haze colour
HAZE = np.array([205.0, 215.0, 225.0])
SKY_TOP = np.array([95.0, 145.0, 210.0])
GRASS_NEAR = np.array([70.0, 105.0, 45.0])
SUN = np.array([0.35, 0.45, 0.82]) / np.linalg.norm([0.35, 0.45, 0.82])
DASH_M, DASH_PERIOD_M = 3.0, 12.0
# Ground is drawn from 40 m behind to 400 m ahead of the ego (the tele camera's road otherwise visibly ends):
# finer steps near the car, where curvature shows.
GROUND_STEPS_M = np.concatenate(
    [
        np.arange(-40.0, 30.0, 2.0),
        np.arange(30.0, 80.0, 4.0),
        np.arange(80.0, 160.0, 8.0),
        np.arange(160.0, 401, 20.0),
    ]
)
DRAW_RANGE_M = (-60.0, 300.0)
# Box corner i has signs (x, y) in {-1, +1} along the box's forward and left axes and z in {0, 1} (bottom, top):
# i = 4 ix + 2 iy + iz. Faces list their corners counter-clockwise seen from outside; the top face has no
# bottom counterpart (boxes stand on the ground or on another box).
_UNIT_BOX = np.array([[2 * ix - 1, 2 * iy - 1, iz] for ix in (0, 1) for iy in (0, 1) for iz in (0, 1)], float)
_BOX_FACES = (
    ((0, 1.0), (4, 6, 7, 5)),
    ((0, -1.0), (0, 1, 3, 2)),
    ((1, 1.0), (2, 3, 7, 6)),
    ((1, -1.0), (0, 4, 5, 1)),
    ((2, 1.0), (1, 5, 7, 3)),
)


@dataclass(frozen=True)
class CameraSpec:
    """A camera on the ego car: `yaw` (rad, left of the ego x axis), horizontal field of view `hfov` (rad),
    and mount position (x forward, y left, z up; metres from the rear axle on the ground)."""

    camera: int
    yaw: float
    hfov: float
    mount: tuple[float, float, float]


# Alpamayo's seven cameras by index (wide 120 deg, rear 70 deg, tele 30 deg), mounted on a 4.8 m car.
RIG = {
    0: CameraSpec(0, np.radians(60.0), np.radians(120.0), (2.0, 0.9, 1.3)),
    1: CameraSpec(1, 0.0, np.radians(120.0), (1.8, 0.0, 1.4)),
    2: CameraSpec(2, np.radians(-60.0), np.radians(120.0), (2.0, -0.9, 1.3)),
    3: CameraSpec(3, np.radians(140.0), np.radians(70.0), (0.2, 0.9, 1.3)),
    4: CameraSpec(4, np.pi, np.radians(30.0), (-0.9, 0.0, 1.4)),
    5: CameraSpec(5, np.radians(-140.0), np.radians(70.0), (0.2, -0.9, 1.3)),
    6: CameraSpec(6, 0.0, np.radians(30.0), (1.8, 0.0, 1.45)),
}


class Renderer:
    """Renders `world` at time t for any camera of RIG at height x width pixels."""

    def __init__(self, world: World, height: int, width: int):
        self.world = world
        self.height, self.width = height, width
        self._background = self._sky_and_ground()

    def _sky_and_ground(self) -> Image.Image:
        rows = np.arange(self.height, dtype=np.float64)[:, None]
        horizon = self.height / 2
        sky = SKY_TOP + (HAZE - SKY_TOP) * (rows / horizon) ** 0.6
        ground = (
            HAZE + (GRASS_NEAR - HAZE) * np.clip((rows - horizon) / (self.height - horizon), 0, 1) ** 0.25
        )
        column = np.where(rows < horizon, sky, ground)
        img = np.broadcast_to(column[:, None, :], (self.height, self.width, 3))
        return Image.fromarray(np.ascontiguousarray(img.astype(np.uint8)))

    def render(self, spec: CameraSpec, t: float) -> Image.Image:
        """The view of camera `spec` at t seconds into the drive from the recorded ego pose: an RGB image of
        height x width pixels."""
        s_ego = float(self.world.arc_length(t))
        (ego_xy,), (ego_yaw,) = self.world.at(np.array([s_ego]))
        return self._render(spec, t, ego_xy, float(ego_yaw), s_ego)

    def render_at(self, spec: CameraSpec, t: float, ego_xy: np.ndarray, ego_yaw: float) -> Image.Image:
        """The view of camera `spec` at t seconds from the ego rear axle at world `ego_xy` [2] metres, yaw
        `ego_yaw` rad (a closed-loop ego off its recorded path): traffic at its scripted place at t."""
        s_ego, _ = self.world.project(ego_xy)
        return self._render(spec, t, np.asarray(ego_xy, dtype=np.float64), ego_yaw, s_ego)

    def _render(
        self, spec: CameraSpec, t: float, ego_xy: np.ndarray, ego_yaw: float, s_ego: float
    ) -> Image.Image:
        cos_e, sin_e = np.cos(ego_yaw), np.sin(ego_yaw)
        mx, my, mz = spec.mount
        position = np.array([ego_xy[0] + cos_e * mx - sin_e * my, ego_xy[1] + sin_e * mx + cos_e * my, mz])
        view = _View(
            position, ego_yaw + spec.yaw, 0.5 * self.width / np.tan(spec.hfov / 2), self.width, self.height
        )
        img = self._background.copy()
        draw = ImageDraw.Draw(img)
        self._draw_ground(draw, view, s_ego)
        boxes = [b for car in self.world.cars for b in car.boxes(t)] + self.world.statics
        near = [b for b in boxes if DRAW_RANGE_M[0] < b.s - s_ego < DRAW_RANGE_M[1]]
        faces = [f for b in near for f in self._box_faces(view, b)]
        for _, poly, color in sorted(faces, key=lambda f: -f[0]):
            draw.polygon(poly, fill=color)
        return img

    def _draw_ground(self, draw: ImageDraw.ImageDraw, view: _View, s_ego: float) -> None:
        s = s_ego + GROUND_STEPS_M
        edge = ROAD_HALF_WIDTH_M
        strips = [
            (-(edge + SHOULDER_M), edge + SHOULDER_M, (150, 146, 136)),  # gravel shoulders under the asphalt
            (-edge, edge, (88, 88, 94)),
            (-edge + 0.1, -edge + 0.25, (235, 235, 235)),  # solid edge lines
            (edge - 0.25, edge - 0.1, (235, 235, 235)),
            (LANE_WIDTH_M / 2 - 0.08, LANE_WIDTH_M / 2 + 0.08, (230, 190, 40)),  # yellow line to oncoming
        ]
        for d0, d1, color in strips:
            self._draw_strips(draw, view, s[:-1], s[1:], d0, d1, color)
        first = np.ceil((s_ego + GROUND_STEPS_M[0]) / DASH_PERIOD_M) * DASH_PERIOD_M
        dashes = np.arange(first, s_ego + GROUND_STEPS_M[-1], DASH_PERIOD_M)
        d = -LANE_WIDTH_M / 2  # dashed white line to the right lane
        self._draw_strips(draw, view, dashes, dashes + DASH_M, d - 0.08, d + 0.08, (235, 235, 235))

    def _draw_strips(
        self,
        draw: ImageDraw.ImageDraw,
        view: _View,
        s0: np.ndarray,
        s1: np.ndarray,
        d0: float,
        d1: float,
        color,
    ) -> None:
        """Ground quads between arc lengths s0[i]..s1[i] and lateral offsets d0..d1."""
        corners = [self.world.at(s, d)[0] for s, d in ((s0, d0), (s0, d1), (s1, d1), (s1, d0))]
        quads = np.stack([np.concatenate([c, np.zeros((len(c), 1))], axis=1) for c in corners], axis=1)
        for quad in view.to_camera(quads):
            self._fill(draw, view, quad, color)

    def _box_faces(self, view: _View, box: Box) -> list[tuple[float, list[tuple[float, float]], tuple]]:
        """(mean depth, projected polygon, shaded colour) of each face of `box` that faces the camera."""
        (center,), (road_yaw,) = self.world.at(np.array([box.s]), box.d)
        yaw = road_yaw + box.yaw_offset
        axes = np.array([[np.cos(yaw), np.sin(yaw), 0.0], [-np.sin(yaw), np.cos(yaw), 0.0], [0.0, 0.0, 1.0]])
        length, width, height = box.size
        base = np.array([center[0], center[1], box.z0])
        corners = base + _UNIT_BOX * np.array([length / 2, width / 2, height]) @ axes
        faces = []
        for (axis, sign), idx in _BOX_FACES:
            normal = sign * axes[axis]
            quad = corners[list(idx)]
            if np.dot(normal, quad.mean(axis=0) - view.position) >= 0:
                continue  # back face
            light = 0.55 + 0.45 * max(0.0, float(normal @ SUN))
            cam = view.to_camera(quad)
            depth = float(cam[:, 2].mean())
            poly = view.project(cam)
            if poly is not None:
                faces.append((depth, poly, _haze(np.array(box.color) * light, depth)))
        return faces

    def _fill(self, draw: ImageDraw.ImageDraw, view: _View, cam: np.ndarray, color) -> None:
        poly = view.project(cam)
        if poly is not None:
            draw.polygon(poly, fill=_haze(np.array(color, dtype=np.float64), float(cam[:, 2].mean())))


def _haze(color: np.ndarray, depth: float) -> tuple[int, int, int]:
    k = 1.0 - np.exp(-max(depth, 0.0) / HAZE_M)
    r, g, b = np.clip(color + (HAZE - color) * k, 0, 255).astype(int)
    return int(r), int(g), int(b)


@dataclass(frozen=True)
class _View:
    position: np.ndarray  # world xyz of the camera centre
    yaw: float  # world yaw of the optical axis
    focal: float  # pixels
    width: int
    height: int

    def to_camera(self, pts: np.ndarray) -> np.ndarray:
        """[..., 3] world points -> [..., 3] (lat, up, depth) camera coordinates."""
        d = pts - self.position
        c, s = np.cos(self.yaw), np.sin(self.yaw)
        depth = d[..., 0] * c + d[..., 1] * s
        lat = -d[..., 0] * s + d[..., 1] * c
        return np.stack([lat, d[..., 2], depth], axis=-1)

    def project(self, cam: np.ndarray) -> list[tuple[float, float]] | None:
        """Clip a camera-frame polygon [k, 3] at the near plane and project it; None when nothing is left or
        it is entirely off-screen."""
        poly = _clip_near(cam)
        if len(poly) < 3:
            return None
        u = self.width / 2 - self.focal * poly[:, 0] / poly[:, 2]
        v = self.height / 2 - self.focal * poly[:, 1] / poly[:, 2]
        if u.max() < 0 or u.min() > self.width or v.max() < 0 or v.min() > self.height:
            return None
        # Points just past the near plane project thousands of widths away; Pillow's scanline fill copes.
        return list(zip(u.tolist(), v.tolist(), strict=True))


def _clip_near(poly: np.ndarray) -> np.ndarray:
    """Sutherland-Hodgman clip of a polygon [k, 3] (lat, up, depth) to depth >= NEAR_M."""
    inside = poly[:, 2] >= NEAR_M
    if inside.all():
        return poly
    if not inside.any():
        return poly[:0]
    out = []
    for i in range(len(poly)):
        a, b = poly[i], poly[(i + 1) % len(poly)]
        a_in, b_in = a[2] >= NEAR_M, b[2] >= NEAR_M
        if a_in:
            out.append(a)
        if a_in != b_in:
            out.append(a + (b - a) * (NEAR_M - a[2]) / (b[2] - a[2]))
    return np.array(out)
