"""The node's configuration: one YAML file (`node.yaml`) plus command-line overrides, validated on load.

Every key has a default (`NodeConfig()` is a complete config), unknown keys are errors, and each error names
the key path, the value and the allowed range. `NodeConfig.to_dict()` is the effective config the node prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alpamayo.errors import ConfigError
from alpamayo.json_fields import build_dataclass, check
from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import FRAMES_PER_CAMERA
from bridges.wire.protocol import ALPAMAYO_CAMERAS, CHANNELS, ENCODINGS, CameraFormat, Limits
from bridges.wire.sockets import DEFAULT_HEARTBEAT_MS, DEFAULT_LINGER_MS

# Alpamayo's default four cameras and their model indices (reference/alpamayo.md §1.3).
DEFAULT_CAMERAS = {ALPAMAYO_CAMERAS[i]: i for i in (0, 1, 2, 6)}


def _check_endpoint(key: str, endpoint: str) -> None:
    scheme = endpoint.split("://", 1)[0]
    check(
        "://" in endpoint and scheme in ("tcp", "ipc", "inproc"),
        key,
        endpoint,
        "a ZeroMQ endpoint tcp://HOST:PORT, ipc://PATH or inproc://NAME",
    )


@dataclass(frozen=True)
class ModelSection(ModelSpec):
    """What to load and how to run it (`alpamayo.model_spec.ModelSpec`: its keys, checks and defaults), and what
    each prediction asks for: the route, the sample count and the seed."""

    route: str | None = None  # navigation text passed to every prediction
    num_samples: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(1 <= self.num_samples <= 64, "model.num_samples", self.num_samples, "1..64")
        check(
            self.nav_guidance is None or self.route is not None,
            "model.nav_guidance",
            self.nav_guidance,
            "null without model.route (the unguided branch is the prompt without the route)",
        )
        check(
            self.num_samples == 1 or self.temperature != 0,
            "model.num_samples",
            self.num_samples,
            "1 with greedy decoding (set model.temperature > 0 to draw several samples)",
        )

    @property
    def spec(self) -> ModelSpec:
        """The model's part of the section."""
        return ModelSpec.from_dict(self.to_dict())


@dataclass(frozen=True)
class InputSection:
    """Camera frames and ego poses arrive on one SUB socket, bound (drivers connect) or connected."""

    endpoints: list[str] = field(default_factory=lambda: ["tcp://*:5555"])
    bind: bool = True
    # Messages queued per publisher before ZeroMQ drops new ones. Small, so a backlog never holds more than a
    # fraction of a second of 1080p frames (newest wins); the intake thread drains continuously.
    hwm: int = 32

    def __post_init__(self) -> None:
        check(len(self.endpoints) >= 1, "input.endpoints", self.endpoints, "at least one endpoint")
        check(
            not self.bind or len(self.endpoints) == 1, "input.endpoints", self.endpoints, "one when binding"
        )
        for i, ep in enumerate(self.endpoints):
            _check_endpoint(f"input.endpoints[{i}]", ep)
        check(1 <= self.hwm <= 10_000, "input.hwm", self.hwm, "1..10000")


@dataclass(frozen=True)
class OutputSection:
    """Trajectories are published on a PUB socket (bound: consumers connect; or connected to a proxy)."""

    endpoint: str = "tcp://*:5556"
    bind: bool = True

    def __post_init__(self) -> None:
        _check_endpoint("output.endpoint", self.endpoint)


@dataclass(frozen=True)
class ControlSection:
    """The control socket (ROUTER, always bound): status, reset, shutdown."""

    endpoint: str = "tcp://127.0.0.1:5557"

    def __post_init__(self) -> None:
        _check_endpoint("control.endpoint", self.endpoint)


@dataclass(frozen=True)
class TimingSection:
    """Cadence and freshness, in the units of each name."""

    rate_hz: float = 10.0  # the model's frame cadence: window frames at t0 - k/rate_hz
    sync_tolerance_ms: float = 50.0  # a window slot takes the frame nearest its time, at most this far off
    cadence_tolerance_ms: float = 10.0  # a new window needs t0 >= last t0 + 1/rate_hz - this
    # Inputs silent for longer, or an output whose frames arrived longer ago, are stale: output valid=false.
    # 10 periods at 10 Hz, openpilot SubMaster's `alive` rule (reference/bridge.md §1.2).
    stale_after_ms: float = 1000.0
    max_ego_extrapolation_ms: float = 50.0  # the newest ego pose may lag t0 by this much
    # How long a stop waits for the running prediction to reach its next step boundary, where it is cancelled
    # (`alpamayo.prediction.Cancellation`); a step that takes longer (a prefill on a slow host) is abandoned,
    # still running, and `alpamayo serve` exits at once (os._exit), so a stop takes under a second either way.
    shutdown_timeout_s: float = 0.5
    linger_ms: int = DEFAULT_LINGER_MS
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS  # ZMTP ping interval; peers are dropped after 3 missed
    # Clock sanity (docs/protocol.md "Clock rules"). A message further ahead of the other streams' clocks is
    # rejected as `future` without moving its stream's clock: one frame stamped 1 h ahead must not make every
    # later good frame `backwards`.
    max_future_ms: float = 2000.0
    # A frame_id step above this is a restart of the camera's id sequence, not that many lost frames (a
    # 30 Hz camera loses 1000 frames in 33 s, long after stale_after_ms has restarted it anyway).
    max_frame_id_jump: int = 1000
    # This many consecutive `backwards` messages on a fresh stream mean its clock was reset: the last one
    # restarts the stream at once instead of after stale_after_ms of rejections.
    backwards_restart_after: int = 3

    def __post_init__(self) -> None:
        check(0.1 <= self.rate_hz <= 100, "timing.rate_hz", self.rate_hz, "0.1..100")
        period_ms = 1000.0 / self.rate_hz
        check(
            0 < self.sync_tolerance_ms <= period_ms / 2,
            "timing.sync_tolerance_ms",
            self.sync_tolerance_ms,
            f"(0, {period_ms / 2:g}] (half a period)",
        )
        check(
            0 <= self.cadence_tolerance_ms < period_ms,
            "timing.cadence_tolerance_ms",
            self.cadence_tolerance_ms,
            f"[0, {period_ms:g})",
        )
        check(self.stale_after_ms > 0, "timing.stale_after_ms", self.stale_after_ms, "> 0")
        check(
            0 <= self.max_ego_extrapolation_ms <= period_ms,
            "timing.max_ego_extrapolation_ms",
            self.max_ego_extrapolation_ms,
            f"[0, {period_ms:g}]",
        )
        check(self.shutdown_timeout_s > 0, "timing.shutdown_timeout_s", self.shutdown_timeout_s, "> 0")
        check(0 <= self.linger_ms <= 10_000, "timing.linger_ms", self.linger_ms, "0..10000")
        check(100 <= self.heartbeat_ms <= 60_000, "timing.heartbeat_ms", self.heartbeat_ms, "100..60000")
        check(self.max_future_ms > 0, "timing.max_future_ms", self.max_future_ms, "> 0")
        check(
            1 <= self.max_frame_id_jump <= 2**31,
            "timing.max_frame_id_jump",
            self.max_frame_id_jump,
            "1..2^31",
        )
        check(
            2 <= self.backwards_restart_after <= 1000,
            "timing.backwards_restart_after",
            self.backwards_restart_after,
            "2..1000",
        )


@dataclass(frozen=True)
class LimitsSection:
    """Input size limits; the message limit (and ZMQ_MAXMSGSIZE) follow from them."""

    max_width: int = 3840
    max_height: int = 2160
    ring_frames: int = 16  # frames kept per camera (0.4 s of a 30 Hz camera, enough for a 4-frame window)
    # Memory of all frame rings (pixels and compressed JPEG bytes), MB, shared equally by the cameras; the
    # oldest frames go first. Each camera's share must hold a window (4 frames of its largest size).
    ring_mb: float = 1024.0
    max_jpeg_ratio: float = (
        1024.0  # decoded bytes / wire bytes of a JPEG (bridges.wire.jpeg: real frames <= 497)
    )
    decode_threads: int = 2  # JPEG decoding pool (Pillow releases the GIL while decoding)
    # A JPEG whose decode uses more CPU time is rejected (`jpeg_decode`): 1080p decodes in 15 ms, 4K in 60 ms here.
    decode_budget_ms: float = 250.0

    def __post_init__(self) -> None:
        check(1 <= self.max_width <= 16384, "limits.max_width", self.max_width, "1..16384")
        check(1 <= self.max_height <= 16384, "limits.max_height", self.max_height, "1..16384")
        check(4 <= self.ring_frames <= 256, "limits.ring_frames", self.ring_frames, "4..256")
        check(self.ring_mb > 0, "limits.ring_mb", self.ring_mb, "> 0")
        check(1 <= self.max_jpeg_ratio <= 1e6, "limits.max_jpeg_ratio", self.max_jpeg_ratio, "1..1e6")
        check(1 <= self.decode_threads <= 64, "limits.decode_threads", self.decode_threads, "1..64")
        check(self.decode_budget_ms > 0, "limits.decode_budget_ms", self.decode_budget_ms, "> 0")

    @property
    def protocol(self) -> Limits:
        return Limits(self.max_width, self.max_height, self.max_jpeg_ratio)


@dataclass(frozen=True)
class WarmupSection:
    """Predictions on synthetic frames before the node reports ready (compiles kernels, fills caches)."""

    runs: int = 1
    width: int = 1920
    height: int = 1080

    def __post_init__(self) -> None:
        check(0 <= self.runs <= 100, "warmup.runs", self.runs, "0..100")
        check(1 <= self.width <= 16384, "warmup.width", self.width, "1..16384")
        check(1 <= self.height <= 16384, "warmup.height", self.height, "1..16384")


@dataclass(frozen=True)
class CurveSection:
    """CURVE on every node socket: the node's secret key file and a directory of authorised client public keys
    (`*.key` files as written by `zmq.auth.create_certificates`)."""

    server_secret_key: str
    authorized_keys: str

    def __post_init__(self) -> None:
        secret, allowed = Path(self.server_secret_key), Path(self.authorized_keys)
        check(secret.is_file(), "curve.server_secret_key", str(secret), "an existing NAME.key_secret file")
        check(allowed.is_dir(), "curve.authorized_keys", str(allowed), "an existing directory of *.key files")


@dataclass(frozen=True)
class NodeConfig:
    model: ModelSection = field(default_factory=ModelSection)
    input: InputSection = field(default_factory=InputSection)
    output: OutputSection = field(default_factory=OutputSection)
    control: ControlSection = field(default_factory=ControlSection)
    cameras: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_CAMERAS))
    # camera name -> declared {width, height, encoding, allow_resize}; cameras not named send any format
    camera_formats: dict[str, CameraFormat] = field(default_factory=dict)
    timing: TimingSection = field(default_factory=TimingSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    warmup: WarmupSection = field(default_factory=WarmupSection)
    curve: CurveSection | None = None

    def __post_init__(self) -> None:
        check(1 <= len(self.cameras) <= 16, "cameras", self.cameras, "1..16 cameras")
        for name, index in self.cameras.items():
            check(0 <= index <= 15, f"cameras.{name}", index, "0..15")
        check(
            len(set(self.cameras.values())) == len(self.cameras), "cameras", self.cameras, "distinct indices"
        )
        limits = self.limits
        share = limits.ring_mb * 1e6 / len(self.cameras)
        for name in self.cameras:
            fmt = self.camera_formats.get(name, CameraFormat())
            need = (
                FRAMES_PER_CAMERA
                * (fmt.width or limits.max_width)
                * (fmt.height or limits.max_height)
                * CHANNELS
            )
            check(
                share >= need,
                "limits.ring_mb",
                limits.ring_mb,
                f">= {len(self.cameras) * need / 1e6:g} ({len(self.cameras)} cameras, each holding a window of "
                f"{FRAMES_PER_CAMERA} frames of up to {need / FRAMES_PER_CAMERA / 1e6:g} MB)",
            )
        for name, fmt in self.camera_formats.items():
            key = f"camera_formats.{name}"
            check(name in self.cameras, key, name, f"a configured camera: {', '.join(self.cameras)}")
            check(
                fmt.width is None or 1 <= fmt.width <= limits.max_width,
                f"{key}.width",
                fmt.width,
                f"1..{limits.max_width} (limits.max_width)",
            )
            check(
                fmt.height is None or 1 <= fmt.height <= limits.max_height,
                f"{key}.height",
                fmt.height,
                f"1..{limits.max_height} (limits.max_height)",
            )
            check(
                fmt.encoding is None or fmt.encoding in ENCODINGS,
                f"{key}.encoding",
                fmt.encoding,
                ", ".join(ENCODINGS),
            )
        if self.curve is not None:
            endpoints = [*self.input.endpoints, self.output.endpoint, self.control.endpoint]
            for ep in endpoints:
                check(ep.startswith("tcp://"), "curve", ep, "tcp:// endpoints only (CURVE needs TCP)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeConfig:
        return build_dataclass(cls, data, "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, overrides: Sequence[str | tuple[str, Any]]) -> NodeConfig:
        """A copy with overrides applied: "section.key=value" strings (the value parsed as YAML) or
        ("section.key", value) pairs."""
        data = self.to_dict()
        for item in overrides:
            if isinstance(item, str):
                key, sep, raw = item.partition("=")
                check(bool(sep) and bool(key), "override", item, "KEY=VALUE, e.g. timing.stale_after_ms=500")
                value = yaml.safe_load(raw)
            else:
                key, value = item
            *parents, leaf = key.split(".")
            node = data
            for part in parents:
                child = node.get(part)
                if child is None:  # an optional section that is off (curve) or a key the file did not set
                    child = node[part] = {}
                check(isinstance(child, dict), "override", item, f"{part!r} names a section")
                node = child
            node[leaf] = value
        return NodeConfig.from_dict(data)


def load_node_config(path: str | Path | None, overrides: Sequence[str | tuple[str, Any]] = ()) -> NodeConfig:
    """Defaults, then the YAML file (if given), then the overrides (see `NodeConfig.replace`)."""
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as e:
            raise ConfigError(f"{path}: cannot read node config: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: node config must be a YAML mapping, got {type(data).__name__}")
    try:
        config = NodeConfig.from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path is not None else str(e)) from None
    return config.replace(overrides) if overrides else config
