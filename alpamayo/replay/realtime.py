"""Real-time replay: a recorded drive published over ZeroMQ to the real inference node at the recorded pace.

The node (`bridges.node.server.InferenceNode`, started in this process on loopback TCP with the predictor) receives
the drive's camera frames (JPEG passed through, raw images as rgb8) and ego poses from a `FramePublisher`, each
sent when its recorded time, divided by `speed`, has elapsed since the first one. The node windows, predicts
on the newest complete window (dropping what it cannot keep up with) and publishes; a `TrajectorySubscriber`
collects the outputs. Outputs are matched to the drive's ticks by t0, scored against the recorded future and
written like lock-step outputs. Drops are the drive's ticks that got no output; staleness is each output's
frame age (publish time minus the arrival of its newest frame, as the node measures it) and the node's
valid=false outputs.

The node's own warm-up predictions run before the first frame is sent and are excluded (the tracer is cleared).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from alpamayo.input_window import FRAME_OFFSETS_NS, HISTORY_OFFSETS_NS
from alpamayo.prediction import Prediction, TrajectorySample
from alpamayo.replay.accuracy import score_tick
from alpamayo.replay.outputs import PredictionRecorder, TickOutput
from alpamayo.replay.results import ReplayRun, TickResult
from alpamayo.replay.settings import ReplayJob, ReplaySettings
from alpamayo.replay.ticks import FRAME_TOLERANCE_NS, TickAssembler, recorded_future, recorded_history
from bridges.drives import DriveSource
from bridges.drives.recording import FrameError, RecordedFrame, Warn
from bridges.node.config import (
    ControlSection,
    InputSection,
    ModelSection,
    NodeConfig,
    OutputSection,
    WarmupSection,
)
from bridges.node.server import InferenceNode
from bridges.wire.client import FramePublisher, TrajectorySubscriber
from bridges.wire.protocol import ProtocolError, TrajectoryMessage, encode_ego, encode_frame

LOOPBACK = "tcp://127.0.0.1:*"
WARMUP_TIMEOUT_S = 600.0
SUBSCRIBE_TIMEOUT_S = 10.0
# After the last message the node finishes its prediction and then answers the newest window, the last tick. The
# replay waits for that answer as long as the node is working: a fixed 120 s once ran out on a loaded machine with
# neither tick answered (the demo model's tick took 14 s at load 15 here, and a real model on CPU takes minutes).
# It stops early only when the node shows it cannot answer (`_drain`), and calls the node stalled when one
# prediction runs STALL_FACTOR times as long as its warm-up prediction did on this machine.
STALL_FACTOR = 20.0


def node_config(drive: DriveSource, settings: ReplaySettings, frame_size: tuple[int, int]) -> NodeConfig:
    """The node set up for this drive: its cameras, loopback endpoints on free ports, the replay's model and
    sampling settings (the node calls the predictor it is given with them), and warm-up on frames of the drive's
    size."""
    height, width = frame_size
    return NodeConfig(
        model=ModelSection(
            **settings.model.to_dict(),
            num_samples=settings.num_samples,
            seed=settings.seed,
            route=settings.route,  # a fixed text only: per-tick sources are refused in real-time mode
        ),
        input=InputSection(endpoints=[LOOPBACK], bind=True),
        output=OutputSection(endpoint=LOOPBACK, bind=True),
        control=ControlSection(endpoint=LOOPBACK),
        cameras={c.name or str(c.camera): c.camera for c in drive.layout.cameras},
        warmup=WarmupSection(runs=max(1, settings.warmup), width=width, height=height),
    )


def _frame_message(frame: RecordedFrame, frame_id: int) -> bytearray:
    """The node's message for a recorded frame: a JPEG passes through (the node decodes it), anything else is
    sent as rgb8. Raises FrameError when the frame cannot be read."""
    size = frame.jpeg_size()
    if size is not None:
        return encode_frame(
            frame.camera, frame_id, frame.t_ns, frame.t_ns, frame.image["data"], "jpeg", *size
        )
    return encode_frame(frame.camera, frame_id, frame.t_ns, frame.t_ns, frame.rgb())


class _Collector(threading.Thread):
    """Receives the node's outputs until stopped: (arrival perf_counter ns, message). An output that does not
    decode is kept by its error (`undecodable`, reported with the outputs that carry no trajectory) and the
    collector goes on; any other error ends it, is kept in `error` and ends the drain, and the replay raises
    it (a silently dead collector would leave the replay waiting for answers it cannot receive)."""

    def __init__(self, subscriber: TrajectorySubscriber):
        super().__init__(name="replay-collector", daemon=True)
        self.subscriber = subscriber
        self.outputs: list[tuple[int, TrajectoryMessage]] = []
        self.undecodable: list[str] = []
        self.error: Exception | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    msg = self.subscriber.recv(0.1)
                except ProtocolError as e:
                    self.undecodable.append(f"an output that does not decode ({e.reason}): {e}")
                    continue
                if msg is not None:
                    self.outputs.append((time.perf_counter_ns(), msg))
        except Exception as e:  # kept for the replay to raise: this thread has no one to tell
            self.error = e


def replay_realtime(job: ReplayJob) -> ReplayRun:
    """Publish the drive's messages for the ticks in [start_s, start_s + duration_s) (at most `max_ticks`) to
    an in-process node at the recorded pace x `speed`, and score its answers (see the module docstring)."""
    drive, tracer, settings = job.drive, job.tracer, job.settings
    settings.validate()
    assembler = TickAssembler(drive, settings.start_s, settings.duration_s, job.warn)
    offered = [t.t0_ns for t in itertools.islice(assembler, settings.max_ticks)]
    if not offered:
        raise assembler.no_ticks_error()
    begin = offered[0] + min(HISTORY_OFFSETS_NS[0], FRAME_OFFSETS_NS[0]) - FRAME_TOLERANCE_NS
    end = offered[-1] + FRAME_TOLERANCE_NS + 1
    size = drive.frame_size(begin, end)
    if size is None:
        raise ValueError(f"{drive.path}: no camera frame between {begin} and {end} ns decodes")
    config = node_config(drive, settings, size)
    node = InferenceNode(job.predictor, config, tracer).start()
    try:
        _wait_warm(node)
        tracer.clear()  # the node's warm-up predictions are not part of the measurement
        with (
            FramePublisher(node.endpoints["input"][0]) as publisher,
            TrajectorySubscriber(node.endpoints["output"]) as subscriber,
        ):
            if not publisher.wait_for_subscriber(SUBSCRIBE_TIMEOUT_S):
                raise RuntimeError(f"the node did not subscribe to {node.endpoints['input'][0]} in time")
            collector = _Collector(subscriber)
            collector.start()
            try:  # the collector stops before its socket closes, whatever happens
                wall_start = time.perf_counter()
                first_send_ns = time.perf_counter_ns()
                late_ms = _publish_drive(drive, publisher, begin, end, settings.speed, job.progress, job.warn)
                _drain(collector, node, offered[-1])
            finally:
                collector.stop.set()
                collector.join()
            if collector.error is not None:
                raise RuntimeError(
                    f"receiving the node's outputs failed: {collector.error}"
                ) from collector.error
            wall_s = time.perf_counter() - wall_start
        status = node.status()
    finally:
        node.stop()
    # Outputs published before the first frame was sent (inputs not yet flowing) say nothing about the replay.
    outputs = [(t, m) for t, m in collector.outputs if t >= first_send_ns]
    ticks, stale = _results(drive, outputs, set(offered), job.recorder, settings.route)
    stale += collector.undecodable
    answered = {t.t0_ns for t in ticks}
    info = {
        **job.info,
        "node": {
            "warmup_runs": config.warmup.runs,
            "frame_drop_perc": status["frame_drop_perc"],
            "ticks_dropped": status["ticks_dropped"],
            "counters": status["counters"],
        },
        "send_late_ms": {"mean": float(np.mean(late_ms)), "max": float(np.max(late_ms))} if late_ms else None,
    }
    dropped = len(set(offered) - answered)
    # `skipped` counts the node's outputs without a trajectory; what the drive's reader skipped is kept apart.
    info["input_skips"] = dict(assembler.skipped + drive.skipped)
    return ReplayRun("realtime", ticks, tracer, len(offered), wall_s, info, Counter(stale), dropped)


def _wait_warm(node: InferenceNode) -> None:
    deadline = time.monotonic() + WARMUP_TIMEOUT_S
    while not node.warmed_up:
        status = node.status()
        if status["last_error"] is not None and status["last_error"]["reason"] == "warmup":
            raise RuntimeError(f"the node's warm-up failed: {status['last_error']['message']}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node did not warm up within {WARMUP_TIMEOUT_S:g} s")
        time.sleep(0.05)


def _publish_drive(
    drive: DriveSource,
    publisher: FramePublisher,
    begin: int,
    end: int,
    speed: float,
    progress: Callable[[int], None],
    warn: Warn,
) -> list[float]:
    """Send frames and poses in [begin, end) at the recorded pace / speed; returns how late each send was (ms).
    A frame that cannot be read is skipped with a warning: the node then lacks it, as after a camera glitch."""
    poses = drive.poses
    pose_index = int(np.searchsorted(poses.t_ns, begin))
    frame_ids: Counter = Counter()
    late: list[float] = []
    wall0 = time.perf_counter()
    reference = drive.layout.cameras[0].camera

    def send_at(t_ns: int, message: bytes | bytearray) -> None:
        delay = wall0 + (t_ns - begin) / 1e9 / speed - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        late.append(max(0.0, -delay) * 1e3)
        publisher.send(message)

    for frame in drive.frames(begin, end):
        while pose_index < len(poses.t_ns) and poses.t_ns[pose_index] <= frame.t_ns:
            t = int(poses.t_ns[pose_index])
            send_at(max(t, begin), encode_ego(t, poses.xyz[pose_index], poses.quat_xyzw[pose_index]))
            pose_index += 1
        frame_ids[frame.camera] += 1  # also for a skipped frame: the node counts the gap as a lost frame
        try:
            send_at(frame.t_ns, _frame_message(frame, frame_ids[frame.camera]))
        except FrameError as e:
            warn(f"skipped a frame: {e}")
        if frame.camera == reference and frame.t_ns >= begin - HISTORY_OFFSETS_NS[0]:
            progress(1)
    return late


def _drain(collector: _Collector, node: InferenceNode, last_t0_ns: int) -> None:
    """Wait until the node has answered the last tick, or shows that it cannot: no prediction in flight, every
    input stream silent (or never heard) for longer than the node's staleness limit, and then one more output
    without a trajectory (its predict thread looked for a window after the inputs ended and found none).
    Returns when the collector stops (the replay raises its error). Raises RuntimeError when one prediction
    runs STALL_FACTOR times as long as a warm-up prediction did, or when the node's threads stopped."""
    stale_ms = node.config.timing.stale_after_ms
    warmup_s = (node.warmup_s or 0.0) / max(1, node.config.warmup.runs)  # one warm-up prediction
    published_when_quiet: int | None = None  # the node's output count once it was idle with stale inputs
    while collector.is_alive():
        if any(m.t0_ns is not None and m.t0_ns >= last_t0_ns for _, m in collector.outputs):
            return
        status = node.status()
        if not status["alive"]:
            raise RuntimeError(f"the node's threads stopped (node counters {status['counters']})")
        running = status["prediction_running_s"]
        if running is not None:
            if warmup_s and running > STALL_FACTOR * warmup_s:
                raise RuntimeError(
                    f"the node's prediction has run {running:.0f} s, {STALL_FACTOR:g}x its warm-up prediction "
                    f"({warmup_s:.1f} s): stalled (node counters {status['counters']})"
                )
            published_when_quiet = None
        elif published_when_quiet is None:
            ages = [s["age_ms"] for s in status["streams"].values()]
            if all(age is None or age > stale_ms for age in ages):
                published_when_quiet = status["counters"]["published"]
        elif status["counters"]["published"] > published_when_quiet:
            last = status["last_output"]
            if last is not None and last["t0_ns"] is None:
                return
            published_when_quiet = None
        time.sleep(0.05)


def _results(
    drive: DriveSource,
    outputs: list[tuple[int, TrajectoryMessage]],
    offered: set[int],
    recorder: PredictionRecorder | None,
    route: str | None,
) -> tuple[list[TickResult], list[str]]:
    """TickResults of the outputs that answer an offered tick (offered ticks have a full pose history by
    construction), and the reasons of the outputs that carry no trajectory; `route`: the node's fixed route."""
    ticks: list[TickResult] = []
    stale: list[str] = []
    for _, msg in outputs:
        if msg.t0_ns not in offered or not msg.x:
            stale.extend(msg.invalid_reasons or ["output without a trajectory"])
            continue
        # The node sends sample 0's waypoints, tokens and reasoning; actions are not on the wire.
        xyz = np.stack([msg.x, msg.y, msg.z], axis=1)
        sample = TrajectorySample(
            msg.reasoning, [], list(msg.token_ids), np.zeros((0, 2)), xyz, np.asarray(msg.heading)
        )
        prediction = Prediction([sample], np.asarray(msg.t))
        history = recorded_history(drive.poses, msg.t0_ns)  # offered ticks have one
        future = recorded_future(drive.poses, msg.t0_ns)
        # decode_tokens 0: the node's message carries the trajectory tokens only, so no decode speed
        result = score_tick(msg.seq, msg.t0_ns, history, prediction, future, list(msg.invalid_reasons), 0)
        result.stages_ms = {**msg.timings_ms, "e2e_age": msg.frame_age_ms or 0.0}
        result.e2e_ms = result.stages_ms["e2e_age"]
        ticks.append(result)
        if recorder is not None:
            frame_times_ns = {c.index: list(c.t_sof_ns) for c in msg.cameras}
            output = TickOutput.of(result, frame_times_ns, history, prediction, future, route)
            recorder.publish(recorder.serialise(output), msg.t0_ns)
            recorder.timings(msg.seq, msg.t0_ns, result.stages_ms, result.e2e_ms)
    return ticks, stale
