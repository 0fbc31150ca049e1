"""Route sources for recorded drives (`--route TEXT | auto`, `--route-file`) on replay, profile and eval: the
text each tick's prompt carries, recorded in the outputs, and the combinations refused before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader

from alpamayo.cli import main
from alpamayo.demo_drive import make_demo_drive
from alpamayo.eval.ray_workers import start_local_ray
from alpamayo.input_window import PoseTrack
from alpamayo.replay.routes import RecordedRoute, RouteTable, check_route_options
from alpamayo.rotations import yaw_to_quat
from bridges.drives import open_drive
from tests.compute_threads import threads_restored

DRIVE = {"seconds": 1.7, "cameras": 1, "seed": 5, "size": (72, 128)}  # ticks at t0 = 1.5 and 1.6 s
FAST = ["--max-reasoning-tokens", "4", "--no-progress"]
PERIOD_NS = 100_000_000


@pytest.fixture(scope="module")
def drive(tmp_path_factory) -> Path:
    return make_demo_drive(tmp_path_factory.mktemp("drive") / "drive.mcap", **DRIVE).path


def turning_track(turn_at_m: float, heading: float = 0.0, origin=(100.0, -50.0), seconds: float = 20.0):
    """Poses every 0.1 s at 5 m/s from t = 0: straight for `turn_at_m`, then a 90-degree left corner, the
    whole path at world `heading` from `origin`; the ego faces along its path."""
    s = 5.0 * 0.1 * np.arange(round(seconds / 0.1) + 1)
    local = np.where(
        s[:, None] <= turn_at_m, np.stack([s, 0 * s], 1), np.stack([0 * s + turn_at_m, s - turn_at_m], 1)
    )
    yaw = np.where(s < turn_at_m, 0.0, np.pi / 2) + heading
    c, si = np.cos(heading), np.sin(heading)
    xy = local @ np.array([[c, si], [-si, c]]) + np.asarray(origin)
    xyz = np.concatenate([xy, np.zeros((len(s), 1))], axis=1)
    return PoseTrack(np.arange(len(s), dtype=np.int64) * PERIOD_NS, xyz, yaw_to_quat(yaw))


@pytest.mark.parametrize("heading", [0.0, 2.0, -2.5])
def test_auto_route_reads_the_recorded_path_in_the_t0_frame(heading):
    route = RecordedRoute(turning_track(30.0, heading))
    # At t = 0 the corner is 30 m ahead: the first segment past it ends at (30, 0.5), 30.004 m away.
    assert route.text_at(0) == "Turn left in 30m"
    # 2 s later the ego is 10 m along: 20 m to go, whatever the world heading.
    assert route.text_at(20 * PERIOD_NS) == "Turn left in 20m"
    # Past the corner the road runs straight along the ego's new heading.
    assert route.text_at(80 * PERIOD_NS) == "Continue straight"


def test_auto_route_stops_at_the_recording_end():
    route = RecordedRoute(turning_track(30.0, seconds=4.0))  # 20 m of path: the corner is never reached
    assert route.text_at(0) == "Continue straight"
    assert route.text_at(40 * PERIOD_NS) is None  # the last pose: nothing ahead


def test_route_file_rows_hold_until_the_next(tmp_path):
    path = tmp_path / "routes.csv"
    path.write_text("t0_ns,route\n1000,Turn left in 30m\n2000,\n3000,Continue straight\n")
    table = RouteTable.load(path)
    assert [table.text_at(t) for t in (999, 1000, 1999, 2000, 2500, 3000, 10**12)] == [
        None,
        "Turn left in 30m",
        "Turn left in 30m",
        None,
        None,
        "Continue straight",
        "Continue straight",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t0,route\n1,x\n", r"columns t0_ns,route .* got columns \['t0', 'route'\]"),
        ("t0_ns,route\n1.5e9,x\n", r"line 2: t0_ns '1.5e9' is not an integer"),
        ("t0_ns,route\n10,x\n10,y\n", r"line 3: t0_ns 10 is not after the previous row's 10"),
    ],
)
def test_bad_route_files_name_the_line_and_value(tmp_path, text, message):
    path = tmp_path / "routes.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        RouteTable.load(path)


def test_route_option_combinations(tmp_path):
    with pytest.raises(ValueError, match=r"--nav-guidance 1\.5 needs a route source"):
        check_route_options(None, None, 1.5)
    with pytest.raises(ValueError, match="real-time replay drives the node, which takes one fixed route"):
        check_route_options("auto", None, None, "realtime")
    with pytest.raises(ValueError, match=r"--route-file .*missing\.csv cannot be read"):
        check_route_options(None, tmp_path / "missing.csv", None)
    check_route_options("Turn left in 20m", None, 1.5, "realtime")


@pytest.mark.parametrize("command", ["replay", "profile", "eval"])
def test_guidance_without_a_route_is_refused_before_the_model_loads(tmp_path, drive, command, capsys):
    # The checkpoint does not exist: the refusal must come first.
    args = [command, str(drive), "--checkpoint", str(tmp_path / "no-checkpoint"), "--nav-guidance", "1.5"]
    args += ["--out", str(tmp_path / ("out" if command == "eval" else "out.mcap"))]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--nav-guidance 1.5 needs a route source" in err and "no-checkpoint" not in err


def predictions(path: Path) -> list[dict]:
    with open(path, "rb") as f:
        return [
            json.loads(m.data)
            for _, c, m in make_reader(f).iter_messages(log_time_order=True)
            if c.topic == "/alpamayo/prediction"
        ]


def test_replay_with_the_auto_route_records_each_ticks_text(tmp_path, demo_checkpoint, drive):
    out = tmp_path / "out.mcap"
    args = ["replay", str(drive), "--checkpoint", str(demo_checkpoint), "--out", str(out), *FAST]
    assert main([*args, "--route", "auto", "--nav-guidance", "1.5"]) == 0
    records = predictions(out)
    source = open_drive(drive)
    try:
        expected = [RecordedRoute(source.poses).text_at(r["t0_ns"]) for r in records]
    finally:
        source.close()
    assert len(records) == 2 and [r["route"] for r in records] == expected
    assert all(t == "Continue straight" or t.startswith("Turn ") for t in expected)
    assert records[0]["flow"]["guidance"] == 1.5


def test_profile_with_a_fixed_route(tmp_path, demo_checkpoint, drive):
    out = tmp_path / "out.mcap"
    args = ["profile", str(drive), "--checkpoint", str(demo_checkpoint), "--out", str(out), *FAST]
    assert (
        main([*args, "--warmup", "0", "--iters", "2", "--route", "Turn left in 20m", "--nav-guidance", "1"])
        == 0
    )
    assert [r["route"] for r in predictions(out)] == ["Turn left in 20m"] * 2


def test_eval_with_a_route_file_records_the_text_per_clip(tmp_path, demo_checkpoint, drive):
    routes = tmp_path / "routes.csv"
    routes.write_text("t0_ns,route\n0,Turn right in 12m\n")
    out = tmp_path / "run"
    args = ["eval", str(drive), "--checkpoint", str(demo_checkpoint), "--out", str(out), *FAST]
    assert main([*args, "--samples", "1", "--route-file", str(routes), "--nav-guidance", "1.5"]) == 0
    (record,) = [json.loads(p.read_text()) for p in (out / "clips").glob("*.json")]
    assert record["status"] == "done" and record["prediction"]["route"] == "Turn right in 12m"
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["settings"]["route_file"] == str(routes.resolve())


def test_eval_on_ray_workers_uses_the_auto_route_as_in_process(tmp_path, demo_checkpoint, drive):
    ray = pytest.importorskip("ray")
    args = ["eval", str(drive), "--checkpoint", str(demo_checkpoint), *FAST, "--samples", "1"]
    args += ["--route", "auto", "--nav-guidance", "1.5", "--reproducible"]
    # --reproducible: this process's threads and the worker's one CPU give the same bytes
    with threads_restored():
        assert main([*args, "--out", str(tmp_path / "local")]) == 0
    start_local_ray(ray, num_cpus=1, object_store_bytes=80 * 1024**2)
    try:
        assert main([*args, "--out", str(tmp_path / "ray"), "--ray", "--workers", "1"]) == 0
    finally:
        ray.shutdown()
    local, remote = (
        [json.loads(p.read_text()) for p in (tmp_path / run / "clips").glob("*.json")]
        for run in ("local", "ray")
    )
    assert remote[0]["worker"]["pid"] != local[0]["worker"]["pid"]
    assert remote[0]["prediction"]["route"] == local[0]["prediction"]["route"] is not None
    assert remote[0]["prediction"] == local[0]["prediction"]
