"""Replay outputs as MCAP topics that open in Foxglove beside the recording's camera topics.

Per tick, all logged at t0 on the recording clock (so outputs line up with the camera frames they answer):
  /tf                       foxglove.FrameTransform  world -> base_link (the ego pose at t0)
  /alpamayo/trajectory      foxglove.PosesInFrame    predicted waypoints, base_link (t0 ego frame), best sample
  /alpamayo/recorded_future foxglove.PosesInFrame    the recorded 6.4 s after t0, base_link (when recorded)
  /alpamayo/reasoning       foxglove.Log             the best sample's reasoning text
  /alpamayo/prediction      alpamayo.Prediction      every sample: tokens, waypoints, actions, errors, validity,
                                                     the trajectory decoder (expert + flow settings, or tokens)
                                                     and the route text the prompt carried (or null)
  /alpamayo/timings         alpamayo.Timings         per-stage milliseconds (the only non-deterministic topic)
`docs/recordings.md` documents the fields. Serialising and publishing are separate calls so that profiling
times them as the `serialise` and `publish` stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from alpamayo.prediction import EgoHistory, Prediction
from alpamayo.replay.results import TickResult
from alpamayo.rotations import yaw_to_quat
from bridges.drives.mcap_messages import LOG_LEVEL_INFO, encode, pose, timestamp, wire_encoding
from bridges.drives.mcap_writer import RecordingWriter

TIMINGS_TOPIC = "/alpamayo/timings"
EGO_FRAME = "base_link"
WORLD_FRAME = "world"


@dataclass(frozen=True)
class TickOutput:
    """What one tick produced, ready to serialise. errors_m: metric name -> metres (None without a recorded
    future); ego_xyz/ego_quat_xyzw: the t0 pose in the world frame."""

    seq: int
    t0_ns: int
    frame_times_ns: dict[int, list[int]]
    ego_xyz: np.ndarray
    ego_quat_xyzw: np.ndarray
    prediction: Prediction
    future_xyz: np.ndarray | None
    future_heading: np.ndarray | None
    errors_m: dict[str, float] | None
    invalid_reasons: list[str]
    route: str | None = None  # the navigation text the prompt carried (alpamayo.replay.routes)

    @classmethod
    def of(
        cls,
        result: TickResult,
        frame_times_ns: dict[int, list[int]],
        ego: EgoHistory,
        prediction: Prediction,
        future: tuple[np.ndarray, np.ndarray] | None,
        route: str | None = None,
    ) -> TickOutput:
        """The output of a scored tick: `result` with the frames' times, the ego history (its t0 pose is
        recorded), the full prediction, the recorded future (xyz [64, 3], heading [64]) or None, and the
        route text the prompt carried."""
        return cls(
            seq=result.seq,
            t0_ns=result.t0_ns,
            frame_times_ns=frame_times_ns,
            ego_xyz=ego.xyz[-1],
            ego_quat_xyzw=ego.quat_xyzw[-1],
            prediction=prediction,
            future_xyz=result.future_xyz,
            future_heading=None if future is None else future[1],
            errors_m=result.errors_m,
            invalid_reasons=result.invalid_reasons,
            route=route,
        )


Encoded = list[tuple[str, str, str, bytes]]  # (topic, schema, encoding, payload)


def yaw_poses(xyz: np.ndarray, heading: np.ndarray) -> list[dict[str, Any]]:
    """Pose dicts (`bridges.drives.mcap_messages.pose`; Foxglove's Pose and ROS 2's geometry_msgs/Pose alike) of
    positions xyz [N, 3] m with headings [N] rad (yaw about +z)."""
    return [pose(p, q) for p, q in zip(xyz, yaw_to_quat(heading), strict=True)]


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(values).reshape(-1)]


def path_record(xyz: np.ndarray, heading: np.ndarray) -> dict[str, list[float]]:
    """x, y, z (metres) and heading (rad) lists of a path xyz [N, 3], heading [N], as the records store them."""
    return {
        "x": _floats(xyz[:, 0]),
        "y": _floats(xyz[:, 1]),
        "z": _floats(xyz[:, 2]),
        "heading": _floats(heading),
    }


def prediction_record(out: TickOutput) -> dict[str, Any]:
    """The alpamayo.Prediction message of a tick (timings excluded: they live on TIMINGS_TOPIC)."""
    return {
        "seq": out.seq,
        "t0_ns": out.t0_ns,
        "frame_times_ns": {str(c): [int(t) for t in ts] for c, ts in sorted(out.frame_times_ns.items())},
        "valid": not out.invalid_reasons,
        "invalid_reasons": list(out.invalid_reasons),
        "t_s": _floats(out.prediction.t_s),
        "decoder": out.prediction.decoder,  # the action expert ("expert": token_ids empty) or "tokens"
        "flow": out.prediction.flow,
        "route": out.route,  # navigation text in the prompt, or None
        "samples": [
            {
                "reasoning": s.reasoning,
                "reasoning_token_ids": [int(t) for t in s.reasoning_token_ids],
                "reasoning_capped": bool(s.reasoning_capped),
                "token_ids": [int(t) for t in s.token_ids],
                **path_record(s.xyz, s.heading),
                "accel": _floats(s.actions[:, 0]),
                "curvature": _floats(s.actions[:, 1]),
            }
            for s in out.prediction.samples
        ],
        "errors_m": None if out.errors_m is None else {k: float(v) for k, v in sorted(out.errors_m.items())},
    }


def timings_record(seq: int, t0_ns: int, stages_ms: dict[str, float], e2e_age_ms: float) -> dict[str, Any]:
    """The alpamayo.Timings message of a tick."""
    return {
        "seq": seq,
        "t0_ns": t0_ns,
        "stages_ms": {k: float(v) for k, v in sorted(stages_ms.items())},
        "e2e_age_ms": float(e2e_age_ms),
    }


class PredictionRecorder:
    """Writes tick outputs to an MCAP file; Foxglove schemas in `encoding` (protobuf or json)."""

    def __init__(self, writer: RecordingWriter, encoding: str = "protobuf"):
        self.writer = writer
        self.encoding = encoding

    def _encode(self, topic: str, schema: str, message: dict[str, Any]) -> tuple[str, str, str, bytes]:
        encoding = wire_encoding(schema, self.encoding)
        return topic, schema, encoding, encode(schema, message, encoding)

    def serialise(self, out: TickOutput) -> Encoded:
        """A tick's messages for every output topic but timings, encoded and not yet written."""
        stamp = timestamp(out.t0_ns)
        best = out.prediction.best
        x, y, z = (float(v) for v in out.ego_xyz)
        qx, qy, qz, qw = (float(v) for v in out.ego_quat_xyzw)
        encoded = [
            self._encode(
                "/tf",
                "foxglove.FrameTransform",
                {
                    "timestamp": stamp,
                    "parent_frame_id": WORLD_FRAME,
                    "child_frame_id": EGO_FRAME,
                    "translation": {"x": x, "y": y, "z": z},
                    "rotation": {"x": qx, "y": qy, "z": qz, "w": qw},
                },
            ),
            self._encode(
                "/alpamayo/trajectory",
                "foxglove.PosesInFrame",
                {"timestamp": stamp, "frame_id": EGO_FRAME, "poses": yaw_poses(best.xyz, best.heading)},
            ),
            self._encode(
                "/alpamayo/reasoning",
                "foxglove.Log",
                {
                    "timestamp": stamp,
                    "level": LOG_LEVEL_INFO,
                    "message": best.reasoning,
                    "name": "alpamayo",
                    "file": "",
                    "line": 0,
                },
            ),
            self._encode("/alpamayo/prediction", "alpamayo.Prediction", prediction_record(out)),
        ]
        if out.future_xyz is not None and out.future_heading is not None:
            poses = yaw_poses(out.future_xyz, out.future_heading)
            encoded.append(
                self._encode(
                    "/alpamayo/recorded_future",
                    "foxglove.PosesInFrame",
                    {"timestamp": stamp, "frame_id": EGO_FRAME, "poses": poses},
                )
            )
        return encoded

    def publish(self, encoded: Encoded, t0_ns: int) -> None:
        """Write `serialise`'s messages, logged at t0_ns (recording clock)."""
        for topic, schema, encoding, payload in encoded:
            self.writer.write_encoded(topic, schema, encoding, payload, t0_ns)

    def timings(self, seq: int, t0_ns: int, stages_ms: dict[str, float], e2e_age_ms: float) -> None:
        """Per-stage ms of a tick, and its end-to-end age (`TickResult.e2e_ms`)."""
        message = timings_record(seq, t0_ns, stages_ms, e2e_age_ms)
        self.writer.write(TIMINGS_TOPIC, "alpamayo.Timings", message, t0_ns, "json")
