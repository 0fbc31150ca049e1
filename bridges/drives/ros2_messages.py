"""ROS 2 message definitions that drives are read in and predictions are written in, as rosbag2 embeds them.

rosbag2's MCAP storage stores each topic's type as a schema with encoding `ros2msg` whose data is the type's
`.msg` text followed by every type it depends on, each after a separator line of 80 `=` and a `MSG: pkg/Type`
line. `mcap-ros2-support` decodes and encodes CDR from that text alone, so no ROS install is needed. The texts
below are the fields of the upstream definitions (ros2/common_interfaces, ros2/geometry2 tf2_msgs,
autowarefoundation/autoware_msgs), comments left out.
"""

from __future__ import annotations

SCHEMA_ENCODING = "ros2msg"  # the MCAP schema encoding of these definitions
_SEPARATOR = "=" * 80

# Each type's own fields; `definition()` appends the dependencies.
_FIELDS: dict[str, str] = {
    "builtin_interfaces/Time": "int32 sec\nuint32 nanosec",
    "builtin_interfaces/Duration": "int32 sec\nuint32 nanosec",
    "std_msgs/Header": "builtin_interfaces/Time stamp\nstring frame_id",
    "std_msgs/String": "string data",
    "geometry_msgs/Point": "float64 x\nfloat64 y\nfloat64 z",
    "geometry_msgs/Vector3": "float64 x\nfloat64 y\nfloat64 z",
    "geometry_msgs/Quaternion": "float64 x 0\nfloat64 y 0\nfloat64 z 0\nfloat64 w 1",
    "geometry_msgs/Pose": "Point position\nQuaternion orientation",
    "geometry_msgs/PoseStamped": "std_msgs/Header header\nPose pose",
    "geometry_msgs/PoseWithCovariance": "Pose pose\nfloat64[36] covariance",
    "geometry_msgs/Twist": "Vector3 linear\nVector3 angular",
    "geometry_msgs/TwistWithCovariance": "Twist twist\nfloat64[36] covariance",
    "geometry_msgs/Transform": "Vector3 translation\nQuaternion rotation",
    "geometry_msgs/TransformStamped": "std_msgs/Header header\nstring child_frame_id\nTransform transform",
    "sensor_msgs/CompressedImage": "std_msgs/Header header\nstring format\nuint8[] data",
    "sensor_msgs/Image": (
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\n"
        "uint32 step\nuint8[] data"
    ),
    "nav_msgs/Odometry": (
        "std_msgs/Header header\nstring child_frame_id\ngeometry_msgs/PoseWithCovariance pose\n"
        "geometry_msgs/TwistWithCovariance twist"
    ),
    "nav_msgs/Path": "std_msgs/Header header\ngeometry_msgs/PoseStamped[] poses",
    "tf2_msgs/TFMessage": "geometry_msgs/TransformStamped[] transforms",
    "autoware_planning_msgs/Trajectory": (
        "std_msgs/Header header\nautoware_planning_msgs/TrajectoryPoint[] points"
    ),
    "autoware_planning_msgs/TrajectoryPoint": (
        "builtin_interfaces/Duration time_from_start\ngeometry_msgs/Pose pose\n"
        "float32 longitudinal_velocity_mps\nfloat32 lateral_velocity_mps\nfloat32 acceleration_mps2\n"
        "float32 heading_rate_rps\nfloat32 front_wheel_angle_rad\nfloat32 rear_wheel_angle_rad"
    ),
}
_PRIMITIVES = {
    "bool", "byte", "char", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float32", "float64", "string", "wstring",
}  # fmt: skip


def type_name(name: str) -> str:
    """`pkg/Type` of a ROS 2 type written `pkg/msg/Type` (as rosbag2 names schemas) or `pkg/Type`."""
    parts = name.split("/")
    return f"{parts[0]}/{parts[-1]}" if len(parts) == 3 and parts[1] == "msg" else name


def _dependencies(name: str) -> list[str]:
    """The types `name`'s fields use, `pkg/Type`; a bare type is in `name`'s own package."""
    package = name.split("/")[0]
    found = []
    for line in _FIELDS[name].splitlines():
        field_type = line.split()[0].split("[")[0]
        if field_type in _PRIMITIVES:
            continue
        found.append(field_type if "/" in field_type else f"{package}/{field_type}")
    return found


def definition(name: str) -> str:
    """The schema text rosbag2 writes for `name` (`pkg/msg/Type` or `pkg/Type`): its fields, then each
    dependency once (depth first) after the `MSG:` separator."""
    root = type_name(name)
    if root not in _FIELDS:
        raise KeyError(f"no ROS 2 definition for {name!r}; known: {sorted(_FIELDS)}")
    order: list[str] = []

    def visit(t: str) -> None:
        for dep in _dependencies(t):
            if dep not in order:
                order.append(dep)
                visit(dep)

    visit(root)
    parts = [_FIELDS[root]]
    parts += [f"{_SEPARATOR}\nMSG: {dep}\n{_FIELDS[dep]}" for dep in order]
    return "\n".join(parts) + "\n"


def stamp(t_ns: int) -> dict[str, int]:
    """builtin_interfaces/Time (or Duration) fields of an integer nanosecond time."""
    if t_ns < 0:
        raise ValueError(f"time {t_ns} ns is negative; ROS 2 stamps here are non-negative")
    return {"sec": t_ns // 1_000_000_000, "nanosec": t_ns % 1_000_000_000}


def stamp_ns(value: object) -> int:
    """Integer nanoseconds of a decoded builtin_interfaces/Time (an object with `sec` and `nanosec`)."""
    return int(value.sec) * 1_000_000_000 + int(value.nanosec)  # type: ignore[attr-defined]
