"""The model's input window at t0, one home for every reader of frames and poses: the node's window
(`bridges.node.window`), the recorded drives and their ticks (`bridges.drives.recording`, `bridges.drives`,
`alpamayo.replay.ticks`) and the AlpaSim service (`bridges.alpasim`).

Timing (the constants themselves live in `alpamayo.prediction`, defined once): the window at t0 holds per
camera FRAMES_PER_CAMERA frames at t0 - 0.3, -0.2, -0.1, 0 s and HISTORY_STEPS ego poses at t0 - 1.5 .. 0 s, 0.1 s
apart; the plan and the recorded future are FUTURE_STEPS poses at t0 + 0.1 .. 6.4 s. Times are integers in any
one unit for frame slots (ns in the node and replay, µs at AlpaSim's and PhysicalAI-AV's wire; the period in
the same unit) and ns for poses.

Frame slots (`frame_slots`): per slot the frame nearest its time within a tolerance, no frame in two slots (the
node, replay ticks, AlpaSim); or NVIDIA's PhysicalAI-AV loader's rule, the newest frame at or before the slot
time, at most a tolerance older (`rule="at_or_before"`; a frame may then serve two slots, as in the loader).

Ego poses (`PoseTrack.at`, `PoseTrack.history_at`): linear in xyz and slerp in rotation between the two poses
around a time (the first pose at or after it and the one before), refused across a gap over `max_gap_ns`; beyond
the newest pose by at most `extrapolate_ns` (0: refused), the position follows the newest pose's velocity when
the track has one, else the last two poses' motion continued, and the rotation the last two poses' turn continued
(held when the pose before is missing or a gap away). A time on a pose takes the same formula (weight 1 of the
pair before it), so a track gives one pose per time whichever reader asks. PhysicalAI-AV clips give their own
in-between poses (`PoseTrack.interpolator`: the devkit's cubic-spline position, slerp rotation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from alpamayo.prediction import FRAMES_PER_CAMERA, FUTURE_STEPS, HISTORY_STEPS, PERIOD_NS, EgoHistory
from alpamayo.rotations import slerp

# Offsets from t0 (ns) of the window's poses, frames and the future, oldest first.
HISTORY_OFFSETS_NS = PERIOD_NS * np.arange(-(HISTORY_STEPS - 1), 1, dtype=np.int64)
FRAME_OFFSETS_NS = PERIOD_NS * np.arange(-(FRAMES_PER_CAMERA - 1), 1, dtype=np.int64)
FUTURE_OFFSETS_NS = PERIOD_NS * np.arange(1, FUTURE_STEPS + 1, dtype=np.int64)
# A recorded drive's poses are not interpolated across a longer gap: it would bend a curved path into a chord
# (0.25 s at 20 m/s on a 100 m radius is a 3 cm sagitta; 1 s would be 50 cm, more than a history token's 8 mm bin).
MAX_POSE_GAP_NS = 250_000_000

SlotRule = Literal["nearest", "at_or_before"]
# (xyz [M, 3] metres, quat_xyzw [M, 4]) at times [M] in the track's unit: another interpolation between poses
Interpolator = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


class SlotMissing(ValueError):
    """A window slot has no frame: `missing` lists (k, error) for each slot k periods before t0 that has none
    within the tolerance, oldest first (error: the distance of the nearest frame, or for `at_or_before` the
    age of the newest frame at or before the slot, None when there is none); `shared` when every slot has a
    frame but two nearest slots take the same one."""

    def __init__(self, missing: list[tuple[int, int | None]], shared: bool = False) -> None:
        self.missing = missing
        self.shared = shared
        what = "two slots share a frame" if shared else f"no frame for slots {[k for k, _ in missing]}"
        super().__init__(what)


def frame_slots(
    times: np.ndarray, t0: int, tolerance: int, period: int = PERIOD_NS, rule: SlotRule = "nearest"
) -> list[int]:
    """Indices into one camera's frame times `times` [N] (ascending, the unit of t0) of its frames for the
    slots t0 - 3, -2, -1, 0 periods, oldest first; SlotMissing when a slot has none (see the module docstring:
    `nearest` within `tolerance` either way, no frame in two slots; `at_or_before`, at most `tolerance` old)."""
    times = np.asarray(times, dtype=np.int64)
    slots = t0 - period * np.arange(FRAMES_PER_CAMERA - 1, -1, -1, dtype=np.int64)
    if len(times) == 0:
        raise SlotMissing([(FRAMES_PER_CAMERA - 1 - n, None) for n in range(FRAMES_PER_CAMERA)])
    if rule == "nearest":
        error = np.abs(times[None, :] - slots[:, None])
        picked = error.argmin(axis=1)
        errors = error[np.arange(FRAMES_PER_CAMERA), picked]
        ok = errors <= tolerance
    else:
        picked = np.searchsorted(times, slots, side="right") - 1
        errors = slots - times[np.maximum(picked, 0)]
        ok = (picked >= 0) & (errors <= tolerance)
    if not ok.all():
        raise SlotMissing(
            [
                (FRAMES_PER_CAMERA - 1 - n, None if picked[n] < 0 else int(errors[n]))
                for n in np.flatnonzero(~ok)
            ]
        )
    if rule == "nearest" and np.any(picked[1:] == picked[:-1]):
        raise SlotMissing([], shared=True)
    return [int(j) for j in picked]


class HistoryUnavailable(ValueError):
    """The track cannot give a pose at `t`: `reason` "empty" (no pose), "after" (t is more than the
    extrapolation limit past the newest pose), "before" (t precedes the first pose), "gap" (the poses around t
    are `gap` apart, over the limit) or "no_velocity" (one pose, no velocity: nothing to extrapolate with)."""

    def __init__(self, reason: str, t: int | None = None, gap: int | None = None) -> None:
        self.reason, self.t, self.gap = reason, t, gap
        super().__init__(f"no pose at {t}: {reason}" + ("" if gap is None else f" ({gap} between poses)"))


@dataclass(frozen=True)
class PoseTrack:
    """Ego poses in a fixed world frame: t_ns [N] strictly increasing, xyz [N, 3] metres, quat_xyzw [N, 4]
    ego->world; velocity: the newest pose's [3] m/s, which extrapolates the position when given; interpolator:
    the poses at times ns [M] within the track from another interpolation (NVIDIA's PhysicalAI-AV devkit), None
    for linear xyz and slerp."""

    t_ns: np.ndarray
    xyz: np.ndarray
    quat_xyzw: np.ndarray
    velocity: np.ndarray | None = None
    interpolator: Interpolator | None = None

    def at(
        self, times: np.ndarray, max_gap_ns: int | None = MAX_POSE_GAP_NS, extrapolate_ns: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Poses at `times` [M] ns: xyz [M, 3] and quat_xyzw [M, 4] float64 (module docstring). HistoryUnavailable
        names the first time that cannot be had, oldest first, once the newest is checked against the
        extrapolation limit; max_gap_ns None interpolates across any gap."""
        t = np.asarray(self.t_ns, dtype=np.int64)
        times = np.asarray(times, dtype=np.int64)
        if len(t) == 0:
            raise HistoryUnavailable("empty")
        newest = int(times.max())
        if newest - t[-1] > extrapolate_ns:
            raise HistoryUnavailable("after", newest)
        single = len(t) == 1
        hi = np.zeros(len(times), np.int64) if single else np.clip(np.searchsorted(t, times), 1, len(t) - 1)
        lo = np.maximum(hi - 1, 0)
        gap = t[hi] - t[lo]
        beyond = times > t[-1]
        # beyond the newest pose the last two continue, when they are close enough; else velocity or nothing
        pair_ok = not single and (max_gap_ns is None or t[-1] - t[-2] <= max_gap_ns)
        before = times < t[0]
        too_far = ~beyond & (gap > max_gap_ns) if max_gap_ns is not None else np.zeros(len(times), bool)
        stuck = beyond & (not pair_ok and self.velocity is None)
        bad = before | too_far | stuck
        if bad.any():
            n = int(np.argmax(bad))
            reason = "before" if before[n] else "gap" if too_far[n] else "no_velocity"
            raise HistoryUnavailable(reason, int(times[n]), int(gap[n]) if reason == "gap" else None)
        if single:
            xyz = np.repeat(np.asarray(self.xyz, np.float64)[:1], len(times), axis=0)
            quat = np.repeat(np.asarray(self.quat_xyzw, np.float64)[:1], len(times), axis=0)
        else:
            w = (times - t[lo]) / gap
            xyz = self.xyz[lo] + w[:, None] * (self.xyz[hi] - self.xyz[lo])
            quat = slerp(self.quat_xyzw[lo], self.quat_xyzw[hi], w)
            # a time on a pose is that pose, bit for bit: the blend at weight 1 and scipy's renormalising slerp
            # round it by up to 3e-14 m (the node's window then differed from the drive's own poses)
            hit = ~beyond & (times == t[hi])
            xyz[hit], quat[hit] = self.xyz[hi[hit]], self.quat_xyzw[hi[hit]]
            if not pair_ok:  # beyond the newest pose with a gap before it: the rotation is held
                xyz[beyond], quat[beyond] = self.xyz[-1], self.quat_xyzw[-1]
        if self.interpolator is not None and not beyond.all():
            xyz[~beyond], quat[~beyond] = self.interpolator(times[~beyond])
        if self.velocity is not None and beyond.any():
            xyz[beyond] = self.xyz[-1] + self.velocity * (times[beyond] - t[-1])[:, None] / 1e9
        return xyz, quat

    def history_at(
        self,
        t0_ns: int,
        period_ns: int = PERIOD_NS,
        max_gap_ns: int | None = MAX_POSE_GAP_NS,
        extrapolate_ns: int = 0,
    ) -> EgoHistory:
        """The HISTORY_STEPS poses at t0 - 15 .. 0 periods by `at`'s rules, with their times (the period is the
        model's 0.1 s unless the node is set to another rate); HistoryUnavailable when one cannot be had."""
        times = t0_ns - period_ns * np.arange(HISTORY_STEPS - 1, -1, -1, dtype=np.int64)
        xyz, quat = self.at(times, max_gap_ns, extrapolate_ns)
        return EgoHistory(xyz=xyz, quat_xyzw=quat, t_ns=times)
