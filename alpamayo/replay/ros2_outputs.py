"""Replay outputs as a rosbag2 MCAP file (`replay --format ros2`): CDR messages with their ROS 2 definitions.

Per tick, all stamped and logged at t0 on the recording clock (Autoware's convention: consumers see staleness):
  /tf                       tf2_msgs/msg/TFMessage                 map -> base_link, the ego pose at t0
  /alpamayo/trajectory      autoware_planning_msgs/msg/Trajectory  sample 0's 64 points, base_link
  /alpamayo/recorded_future nav_msgs/msg/Path                      the recorded 6.4 s after t0, base_link
  /alpamayo/reasoning       std_msgs/msg/String                    sample 0's reasoning text
  /alpamayo/route           std_msgs/msg/String                    the route text the prompt carried (when one)
  /alpamayo/timings         std_msgs/msg/String                    alpamayo.Timings as JSON (not deterministic)
Trajectory points: `time_from_start` the waypoint's time after t0, `pose` its position and heading (yaw
quaternion), `longitudinal_velocity_mps` the rollout's speed (distance between consecutive waypoints, the first
from the origin, over 0.1 s), `acceleration_mps2` the decoded acceleration, `heading_rate_rps` the heading's
change per second; the other fields 0. Each schema is the type's .msg text with its dependencies
(`bridges.drives.ros2_messages`), as rosbag2 writes it, so `ros2 bag play` and Foxglove read the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from mcap.records import Channel, Message, Schema
from mcap_ros2.decoder import DecoderFactory
from mcap_ros2.writer import Writer

from alpamayo.prediction import DT_S, FUTURE_STEPS
from alpamayo.replay.outputs import EGO_FRAME, TIMINGS_TOPIC, TickOutput, timings_record, yaw_poses
from bridges.drives.ros2_messages import SCHEMA_ENCODING, definition, stamp

WORLD_FRAME = "map"  # ROS's fixed world frame name (REP 105)
TYPES = {
    "/tf": "tf2_msgs/msg/TFMessage",
    "/alpamayo/trajectory": "autoware_planning_msgs/msg/Trajectory",
    "/alpamayo/recorded_future": "nav_msgs/msg/Path",
    "/alpamayo/reasoning": "std_msgs/msg/String",
    "/alpamayo/route": "std_msgs/msg/String",
    TIMINGS_TOPIC: "std_msgs/msg/String",
}

Encoded = list[tuple[str, dict[str, Any]]]  # (topic, message fields)


def trajectory_points(
    t_s: np.ndarray, xyz: np.ndarray, heading: np.ndarray, actions: np.ndarray
) -> list[dict[str, Any]]:
    """TrajectoryPoint fields of a rollout: t_s [64] s after t0, xyz [64, 3] m and heading [64] rad in the t0
    ego frame, actions [64, 2] (acceleration m/s^2, curvature 1/m), or [0, 2] when unknown (acceleration 0)."""
    steps = np.diff(np.vstack([np.zeros(3), xyz]), axis=0)
    speed = np.linalg.norm(steps, axis=1) / DT_S
    heading_rate = np.diff(np.concatenate([[0.0], heading])) / DT_S
    accel = actions[:, 0] if actions.shape == (FUTURE_STEPS, 2) else np.zeros(len(xyz))
    return [
        {
            "time_from_start": stamp(round(float(t) * 1e9)),
            "pose": p,
            "longitudinal_velocity_mps": float(v),
            "lateral_velocity_mps": 0.0,
            "acceleration_mps2": float(a),
            "heading_rate_rps": float(r),
            "front_wheel_angle_rad": 0.0,
            "rear_wheel_angle_rad": 0.0,
        }
        for t, p, v, a, r in zip(t_s, yaw_poses(xyz, heading), speed, accel, heading_rate, strict=True)
    ]


class Ros2Recorder:
    """Writes tick outputs to a rosbag2 MCAP file; the same calls as `PredictionRecorder` plus the writer's
    `copy` and `close` (no metadata record: the run settings are in the JSON report)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._writer = Writer(self._file)
        self._schemas: dict[str, Schema] = {}
        self._sequence: dict[str, int] = {}
        self._decoders = DecoderFactory()

    def _schema(self, ros_type: str, recorded: Schema | None = None) -> Schema:
        """The registered schema of `ros_type`: a recorded message's own definition, else ours."""
        if ros_type not in self._schemas:
            text = definition(ros_type) if recorded is None else recorded.data.decode()
            self._schemas[ros_type] = self._writer.register_msgdef(ros_type, text)
        return self._schemas[ros_type]

    def _write(
        self,
        topic: str,
        ros_type: str,
        message: Any,
        log_time: int,
        publish_time: int | None = None,
        recorded: Schema | None = None,
    ) -> None:
        self._sequence[topic] = self._sequence.get(topic, 0) + 1
        schema = self._schema(ros_type, recorded)
        publish = log_time if publish_time is None else publish_time
        self._writer.write_message(topic, schema, message, log_time, publish, self._sequence[topic])

    def serialise(self, out: TickOutput) -> Encoded:
        """A tick's messages (field dicts) for every topic but timings; `publish` encodes them as CDR."""
        header = {"stamp": stamp(out.t0_ns), "frame_id": EGO_FRAME}
        best = out.prediction.best
        encoded: Encoded = [
            (
                "/tf",
                {
                    "transforms": [
                        {
                            "header": {"stamp": stamp(out.t0_ns), "frame_id": WORLD_FRAME},
                            "child_frame_id": EGO_FRAME,
                            "transform": {
                                "translation": dict(zip("xyz", map(float, out.ego_xyz), strict=True)),
                                "rotation": dict(zip("xyzw", map(float, out.ego_quat_xyzw), strict=True)),
                            },
                        }
                    ]
                },
            ),
            (
                "/alpamayo/trajectory",
                {
                    "header": header,
                    "points": trajectory_points(out.prediction.t_s, best.xyz, best.heading, best.actions),
                },
            ),
            ("/alpamayo/reasoning", {"data": best.reasoning}),
        ]
        if out.route is not None:
            encoded.append(("/alpamayo/route", {"data": out.route}))
        if out.future_xyz is not None and out.future_heading is not None:
            poses = [
                {
                    "header": {"stamp": stamp(out.t0_ns + round(float(t) * 1e9)), "frame_id": EGO_FRAME},
                    "pose": p,
                }
                for t, p in zip(
                    out.prediction.t_s, yaw_poses(out.future_xyz, out.future_heading), strict=True
                )
            ]
            encoded.append(("/alpamayo/recorded_future", {"header": header, "poses": poses}))
        return encoded

    def publish(self, encoded: Encoded, t0_ns: int) -> None:
        """Encode `serialise`'s messages as CDR and write them, logged at t0_ns (recording clock)."""
        for topic, message in encoded:
            self._write(topic, TYPES[topic], message, t0_ns)

    def timings(self, seq: int, t0_ns: int, stages_ms: dict[str, float], e2e_age_ms: float) -> None:
        """Per-stage ms of a tick as JSON text (`alpamayo.Timings` fields)."""
        message = timings_record(seq, t0_ns, stages_ms, e2e_age_ms)
        self._write(TIMINGS_TOPIC, TYPES[TIMINGS_TOPIC], {"data": json.dumps(message, sort_keys=True)}, t0_ns)

    def copy(self, schema: Schema, channel: Channel, message: Message) -> None:
        """Copy a recorded ROS 2 message (decoded and re-encoded with its own definition); messages of other
        encodings (a Foxglove drive's) have no place in a bag and are left out."""
        if schema.encoding != SCHEMA_ENCODING or channel.message_encoding != "cdr":
            return
        decoded = self._decoders.decoder_for(channel.message_encoding, schema)(message.data)
        self._write(channel.topic, schema.name, decoded, message.log_time, message.publish_time, schema)

    def close(self) -> None:
        if not self._file.closed:
            self._writer.finish()
            self._file.close()
