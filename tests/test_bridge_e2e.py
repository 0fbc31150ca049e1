"""The node end to end with the demo checkpoint's AlpamayoVLA: frames in over ZeroMQ, a trajectory out.

One demo-model prediction takes several seconds on a small CPU, so each test makes only a few; the camera
simulator runs 10x faster than sensor time, which also makes every camera outpace the model.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from alpamayo.model_spec import ModelSpec
from alpamayo.prediction import EgoHistory
from alpamayo.runtime import AlpamayoVLA
from bridges.camera_sim import CameraSim, SyntheticCamera, SyntheticDrive
from bridges.wire.client import FramePublisher
from tests.bridge_nodes import CAMERAS, HEIGHT, WIDTH, answering_window, node_config, running_node, wait_until
from tests.protocol_doc import doc_problems, plain_subscriber, received

MS = 1_000_000
PERIOD_NS = 100 * MS
T_START = 7_000_000 * MS  # sensor clock of the simulated rig
MODEL_TIMEOUT_S = 300.0  # a few predictions on a loaded 2-core machine
SPEEDUP = 10.0


@pytest.fixture(scope="module")
def vla(demo_checkpoint):
    return AlpamayoVLA.from_spec(ModelSpec(checkpoint=demo_checkpoint, max_reasoning_tokens=4))


def simulate(publisher: FramePublisher, ticks: int, drive: SyntheticDrive | None = None) -> None:
    sim = CameraSim(publisher, list(CAMERAS), WIDTH, HEIGHT, drive=drive, speedup=SPEEDUP)
    assert sim.run(ticks=ticks, t_start_ns=T_START).ticks == ticks


def window_inputs(t0_tick: int, drive: SyntheticDrive) -> tuple[dict, EgoHistory]:
    """The frames and ego history CameraSim sent for the window ending at t0_tick, as the node decodes them."""
    frames = {
        index: [
            SyntheticCamera(pos, WIDTH, HEIGHT).render(drive.distance(k / 10))
            for k in range(t0_tick - 3, t0_tick + 1)
        ]
        for pos, index in enumerate(CAMERAS.values())
    }
    poses = [drive.pose(k / 10) for k in range(t0_tick - 15, t0_tick + 1)]
    quat = np.array([q for _, q, _ in poses])
    ego = EgoHistory(
        xyz=np.array([xyz for xyz, _, _ in poses]),
        quat_xyzw=quat / np.linalg.norm(quat, axis=1, keepdims=True),
        t_ns=T_START + PERIOD_NS * np.arange(t0_tick - 15, t0_tick + 1),
    )
    return frames, ego


def test_frames_in_valid_trajectory_out_equal_to_a_direct_prediction(vla, record_figure):
    config = node_config(warmup={"runs": 1}, timing={"stale_after_ms": 600_000})
    seen: list[bytes] = []
    # The model served before: it holds features of another drive's frames at this window's camera times (its
    # cache keys are camera and frame time), which a node must not reuse: its camera streams start afresh.
    other, other_ego = window_inputs(15, SyntheticDrive(speed_mps=4.0))
    vla.predict(other, other_ego, frame_times_ns={i: list(other_ego.t_ns[-4:]) for i in other})
    with running_node(vla, config) as c:
        assert "model not warmed up yet" in c.control.status()["not_ready_reasons"]
        wait_until(lambda: c.node.warmed_up, MODEL_TIMEOUT_S, "the warm-up prediction")
        # a plain SUB socket beside the subscriber, for the output's bytes as published (read once subscribed:
        # the node publishes once per period while it has no window)
        with plain_subscriber(c.node.endpoints["output"]) as plain:
            wait_until(lambda: plain.poll(100), 10.0, "a first output on a plain SUB socket")
            simulate(c.publisher, ticks=16)
            msg = wait_until(
                lambda: answering_window(c.subscriber.recv(1.0)), MODEL_TIMEOUT_S, "the trajectory"
            )
            published = wait_until(lambda: received(plain, seen, msg.seq), 10.0, "the trajectory, plain")
        status = c.control.status()
        assert status["ready"], status["not_ready_reasons"]
    # docs/protocol.md's table read with plain msgpack, as a subscriber written from the doc would
    assert doc_problems(published) == []
    assert msg.valid and msg.invalid_reasons == []
    assert msg.t0_ns == T_START + 15 * PERIOD_NS
    assert [(w.name, w.frame_ids) for w in msg.cameras] == [(n, [12, 13, 14, 15]) for n in CAMERAS]
    # The demo checkpoint's default decoder, the action expert: 64 waypoints, no trajectory tokens.
    assert msg.decoder == "expert" and msg.token_ids == [] and len(msg.x) == 64
    np.testing.assert_allclose(msg.t, 0.1 * np.arange(1, 65))
    assert np.isfinite([msg.x, msg.y, msg.z, msg.heading]).all()
    assert msg.model_execution_ms > 0 and {"vision", "prefill", "expert", "expert_step"} <= set(
        msg.timings_ms
    )
    assert msg.frame_age_ms >= msg.model_execution_ms

    # The same inputs straight into the model (frames re-encoded from pixels: frame_times_ns=None).
    frames, ego = window_inputs(15, SyntheticDrive())
    direct = vla.predict(frames, ego).best
    # The expert decodes no trajectory tokens, so the reasoning is what pins the text side: it must be real text.
    assert direct.token_ids == [] and direct.reasoning_token_ids
    assert msg.reasoning == direct.reasoning and msg.reasoning
    np.testing.assert_array_equal(np.stack([msg.x, msg.y, msg.z], 1), direct.xyz)
    np.testing.assert_array_equal(msg.heading, direct.heading)
    record_figure("model_execution_ms (demo, 2 cameras)", msg.model_execution_ms)
    record_figure("frame_age_ms", msg.frame_age_ms)


class GatedModel:
    """The demo model behind a gate: its predictions wait until `gate` is set (then run as the model's own)."""

    def __init__(self, vla: AlpamayoVLA) -> None:
        self.vla, self.gate = vla, threading.Event()

    def predict(self, *args, **kwargs):
        assert self.gate.wait(MODEL_TIMEOUT_S), "the gate was never opened"
        return self.vla.predict(*args, **kwargs)

    def reset(self) -> None:
        self.vla.reset()


def test_fast_camera_drops_stale_inputs_and_a_restarted_rig_recovers(vla, record_figure):
    config = node_config(warmup={"runs": 0}, timing={"stale_after_ms": 1000})
    # The camera outpaces the model on any machine: the first prediction is held until the camera has sent
    # all 30 ticks (a model fast enough to keep up with the 10x sensor rate would otherwise drop nothing).
    model = GatedModel(vla)
    with (
        running_node(model, config) as c,
        FramePublisher(c.node.endpoints["input"][0], hwm=1000) as publisher,
    ):
        assert publisher.wait_for_subscriber(5.0)
        simulate(publisher, ticks=30)
        model.gate.set()
        outputs = []
        while len(outputs) < 2 or outputs[-1].t0_ns < T_START + 29 * PERIOD_NS:
            msg = wait_until(lambda: answering_window(c.subscriber.recv(1.0)), MODEL_TIMEOUT_S, "outputs")
            outputs.append(msg)
        status = c.control.status()
        # every 10 Hz slot between consecutive windows that was not predicted is a dropped tick
        t0s = [m.t0_ns for m in outputs]
        assert t0s == sorted(set(t0s)) and t0s[-1] == T_START + 29 * PERIOD_NS
        skipped = sum((b - a) // PERIOD_NS - 1 for a, b in itertools.pairwise(t0s))
        assert status["ticks_dropped"] == skipped > 0  # certain: the model was held while the camera ran on
        assert outputs[-1].frame_drop_perc == pytest.approx(100 * skipped / (skipped + len(outputs)))
        used = {k for m in outputs for k in m.cameras[0].frame_ids}
        for name in CAMERAS:
            s = status["streams"][name]
            assert (s["accepted"], s["lost"], s["used"]) == (30, 0, len(used))
            assert s["accepted"] == s["used"] + s["dropped"] + s["pending"] and s["dropped"] > 0
        for m in outputs:
            ids = m.cameras[0].frame_ids
            assert ids == list(range(ids[0], ids[0] + 4))  # 10 Hz slots: consecutive frames
            assert ("frame age" in "; ".join(m.invalid_reasons)) == (m.frame_age_ms > 1000)

        # The rig stops: outputs turn invalid with the stale streams named, and the node is not ready. The
        # rig's last messages arrive a few ms apart, so the first stale output may name only the streams
        # that went quiet first; within a period or two every stream is named.
        every_stream = {*(f"camera {n!r}" for n in CAMERAS), "ego"}
        stale_outputs = []
        while not stale_outputs or len(stale_outputs[-1].invalid_reasons) < len(every_stream):
            stale = wait_until(lambda: _stale_output(c.subscriber.recv(1.0)), 10.0, "a stale-inputs output")
            assert len(stale_outputs) < 5, [m.invalid_reasons for m in stale_outputs]
            stale_outputs.append(stale)
        for stale in stale_outputs:
            assert not stale.valid and stale.t0_ns is None
            streams = [r.split(":")[0] for r in stale.invalid_reasons]
            assert set(streams) <= every_stream and len(set(streams)) == len(streams), stale.invalid_reasons
            assert all(": stale, last message " in r for r in stale.invalid_reasons), stale.invalid_reasons
        assert {r.split(":")[0] for r in stale_outputs[-1].invalid_reasons} == every_stream
        assert not c.control.status()["ready"]

        # It restarts with frame ids and clock reset to the same times but other images: accepted as a
        # restart, and the model's feature cache (keyed by frame time) is cleared, so all 8 frames of the
        # next window are encoded anew.
        encoded = vla.frames_encoded
        simulate(publisher, ticks=16, drive=SyntheticDrive(speed_mps=13.0))
        msg = wait_until(
            lambda: answering_window(c.subscriber.recv(1.0)), MODEL_TIMEOUT_S, "after the restart"
        )
        assert msg.t0_ns == T_START + 15 * PERIOD_NS
        assert vla.frames_encoded - encoded == 4 * len(CAMERAS)
        restarted = c.control.status()
        assert all(restarted["streams"][n]["restarts"] == 1 for n in CAMERAS)
        assert restarted["streams"]["ego"]["restarts"] == 1
        assert restarted["counters"]["rejected_total"] == 0
    record_figure("ticks dropped / predicted", f"{skipped} / {len(outputs)}")


def _stale_output(msg):
    return (
        msg
        if msg is not None and msg.t0_ns is None and any("stale" in r for r in msg.invalid_reasons)
        else None
    )
