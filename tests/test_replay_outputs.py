"""Replay outputs: per-horizon errors and the MCAP records Foxglove reads."""

from __future__ import annotations

import json

import numpy as np
from mcap.reader import make_reader

from alpamayo.prediction import FUTURE_STEPS, Prediction, TrajectorySample
from alpamayo.replay.accuracy import invalid_reasons, summarize_accuracy, tick_errors
from alpamayo.replay.outputs import PredictionRecorder, TickOutput
from alpamayo.replay.results import TickResult
from bridges.drives.mcap_messages import MessageDecoder
from bridges.drives.mcap_writer import RecordingWriter

T = 0.1 * np.arange(1, FUTURE_STEPS + 1)
RECORDED = np.stack([12.0 * T, 0.01 * (12.0 * T) ** 2, 0 * T], axis=1)


def sample(xyz: np.ndarray) -> TrajectorySample:
    heading = np.arctan2(np.gradient(xyz[:, 1]), np.gradient(xyz[:, 0]))
    return TrajectorySample(
        "Follow the lane.", [7, 8], list(range(128)), np.zeros((FUTURE_STEPS, 2)), xyz, heading
    )


def test_errors_per_horizon_take_sample_zero_and_the_best_sample():
    shifted = RECORDED + np.array([0.0, 1.0, 0.0])  # 1 m to the left everywhere
    errors = tick_errors(np.stack([shifted, RECORDED]), RECORDED)
    for h in ("1s", "2s", "3s", "6.4s"):
        assert errors[f"ade@{h}"] == errors[f"fde@{h}"] == 1.0
        assert errors[f"min_ade@{h}"] == 0.0
    assert tick_errors(shifted[None], None) is None
    assert tick_errors(np.full((1, FUTURE_STEPS, 3), np.nan), RECORDED) is None


def test_summary_scores_the_constant_velocity_baseline_on_the_same_ticks():
    """History at a constant 12 m/s along x: the baseline extrapolates it exactly and is off by the recorded
    future's lateral drift; the model (here: the recorded future itself) is exact."""
    history = np.stack([12.0 * 0.1 * np.arange(-15, 1), np.zeros(16), np.zeros(16)], axis=1)
    tick = TickResult(
        0,
        0,
        False,
        RECORDED[None],
        RECORDED,
        history,
        tick_errors(RECORDED[None], RECORDED),
        [],
        {},
        0.0,
        0,
        0,
    )
    summary = summarize_accuracy([tick, tick])
    lateral = RECORDED[:, 1]
    for h, steps in (("1s", 10), ("6.4s", 64)):
        assert summary.mean_m[f"ade@{h}"] == 0.0
        assert np.isclose(summary.baseline_ade_m[f"ade@{h}"], np.abs(lateral[:steps]).mean())
    assert "const-vel ADE m" in summary.table()
    assert summary.as_dict()["constant_velocity_ade_m"] == summary.baseline_ade_m


def test_non_finite_waypoints_make_a_prediction_invalid_with_the_sample_named():
    bad = RECORDED.copy()
    bad[5, 0] = np.inf
    assert invalid_reasons(Prediction([sample(RECORDED)])) == []
    assert invalid_reasons(Prediction([sample(RECORDED), sample(bad)])) == [
        "sample 1: non-finite waypoints or headings"
    ]


def test_recorded_outputs_read_back_as_foxglove_and_project_messages(tmp_path):
    out = TickOutput(
        seq=3,
        t0_ns=1_700_000_001_500_000_000,
        frame_times_ns={1: [1, 2, 3, 4]},
        ego_xyz=np.array([10.0, 20.0, 0.0]),
        ego_quat_xyzw=np.array([0.0, 0.0, 0.0, 1.0]),
        prediction=Prediction([sample(RECORDED)]),
        future_xyz=RECORDED,
        future_heading=np.zeros(FUTURE_STEPS),
        errors_m=tick_errors(RECORDED[None], RECORDED),
        invalid_reasons=[],
    )
    with RecordingWriter(tmp_path / "out.mcap") as writer:
        recorder = PredictionRecorder(writer, "protobuf")
        recorder.publish(recorder.serialise(out), out.t0_ns)
        recorder.timings(out.seq, out.t0_ns, {"prefill": 12.5}, 40.0)
    decoder = MessageDecoder()
    with open(tmp_path / "out.mcap", "rb") as f:
        read = {
            channel.topic: (
                schema.name,
                channel.message_encoding,
                message.log_time,
                decoder.decode(schema, channel.message_encoding, message.data),
            )
            for schema, channel, message in make_reader(f).iter_messages()
        }
    assert {topic: r[:3] for topic, r in read.items()} == {
        "/tf": ("foxglove.FrameTransform", "protobuf", out.t0_ns),
        "/alpamayo/trajectory": ("foxglove.PosesInFrame", "protobuf", out.t0_ns),
        "/alpamayo/recorded_future": ("foxglove.PosesInFrame", "protobuf", out.t0_ns),
        "/alpamayo/reasoning": ("foxglove.Log", "protobuf", out.t0_ns),
        "/alpamayo/prediction": ("alpamayo.Prediction", "json", out.t0_ns),
        "/alpamayo/timings": ("alpamayo.Timings", "json", out.t0_ns),
    }
    poses = read["/alpamayo/trajectory"][3]["poses"]
    assert len(poses) == FUTURE_STEPS and poses[-1]["position"]["x"] == RECORDED[-1, 0]
    assert read["/alpamayo/reasoning"][3]["message"] == "Follow the lane."
    prediction = read["/alpamayo/prediction"][3]
    assert prediction["frame_times_ns"] == {"1": [1, 2, 3, 4]} and prediction["valid"]
    assert prediction["samples"][0]["y"] == RECORDED[:, 1].tolist()
    assert prediction["errors_m"]["fde@6.4s"] == 0.0
    assert json.loads(json.dumps(read["/alpamayo/timings"][3])) == {
        "seq": 3,
        "t0_ns": out.t0_ns,
        "stages_ms": {"prefill": 12.5},
        "e2e_age_ms": 40.0,
    }
