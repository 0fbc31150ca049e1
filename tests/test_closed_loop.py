"""`alpamayo closed-loop` on the demo checkpoint with its reference policies: 2 scenes driven by the model and the
3 baselines in-process and on a local Ray of 2 workers give the same results, a resumed run skips the done
episodes and adds policies; on the scripted scenes each baseline has its known outcome; the cameras see the world
from the simulated pose."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from alpamayo.cli import main
from alpamayo.closed_loop.controller import MAX_BRAKE
from alpamayo.closed_loop.policies import BASELINES, POLICIES
from alpamayo.closed_loop.report import REPORT_SCHEMA
from alpamayo.closed_loop.rollout import make_world
from alpamayo.closed_loop.scene import T0_S, Scene
from alpamayo.demo_drive.render import RIG, Renderer
from alpamayo.demo_drive.world import SCRIPT_SPEED_MPS
from alpamayo.eval.ray_workers import start_local_ray
from tests.compute_threads import threads_restored

# 0.5 s closed loop (5 drives) of 4 small cameras; the random demo weights never end their reasoning, so a
# 4-token cap keeps a drive to about a second on one core.
FAST = [
    "--scenes",
    "2",
    "--seconds",
    "0.5",
    "--size",
    "64x112",
    "--max-reasoning-tokens",
    "4",
    "--no-progress",
]
RAY_OBJECT_STORE_BYTES = 80 * 1024**2  # Ray's minimum
ROOT = Path(__file__).resolve().parents[1]


def closed_loop(checkpoint: Path, out: Path, *args: str) -> int:
    return main(["closed-loop", "--checkpoint", str(checkpoint), "--out", str(out), *FAST, *args])


def records(out: Path) -> dict[str, dict]:
    docs = [json.loads(p.read_text()) for p in sorted((out / "clips").glob("*.json"))]
    return {d["clip_id"]: d for d in docs}


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def outcome(record: dict) -> dict:
    """What a scene produced, less who ran it and how long it took."""
    return {k: v for k, v in record.items() if k not in ("worker", "wall_s")}


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, demo_checkpoint) -> Path:
    """The console script in a fresh process, with whatever threads it is given (2 on the CI's machine) and
    --reproducible."""
    out = tmp_path_factory.mktemp("in_process") / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["closed-loop", "--checkpoint", str(demo_checkpoint), "--out", str(out), *FAST, "--baselines"]
    args += ["--reproducible"]
    done = subprocess.run(
        [sys.executable, "-m", "alpamayo.cli", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    table = done.stdout.splitlines()
    assert "scene_score" in done.stdout
    for policy in POLICIES:  # a row per scene and policy, and an aggregate row per policy
        assert sum(policy in line.split() for line in table) == 3, policy
    return out


@pytest.fixture(scope="module")
def on_ray(tmp_path_factory, demo_checkpoint) -> Path:
    ray = pytest.importorskip("ray")
    out = tmp_path_factory.mktemp("on_ray") / "run"
    start_local_ray(ray, num_cpus=2, object_store_bytes=RAY_OBJECT_STORE_BYTES)
    try:
        args = ["--baselines", "--ray", "--workers", "2", "--cpus-per-worker", "1", "--reproducible"]
        assert closed_loop(demo_checkpoint, out, *args) == 0
    finally:
        ray.shutdown()
    return out


def test_two_ray_workers_drive_the_in_process_scenes_identically(in_process, on_ray, record_figure):
    a, b = records(in_process), records(on_ray)
    assert sorted(a) == sorted(f"scene-0000{i}.{p}" for i in (0, 1) for p in POLICIES)
    assert {k: outcome(r) for k, r in a.items()} == {k: outcome(r) for k, r in b.items()}
    assert {r["worker"]["index"] for r in b.values()} == {0, 1}
    ra, rb = report(in_process), report(on_ray)
    assert ra["schema"] == REPORT_SCHEMA and ra["metrics"] == rb["metrics"]
    assert ra["policies"] == list(POLICIES) and sorted(ra["metrics"]) == sorted(POLICIES)
    assert ra["episodes"]["done"] == 8 and ra["per_scene"] == rb["per_scene"]
    assert all(sorted(by_policy) == sorted(POLICIES) for by_policy in ra["per_scene"].values())
    for r in a.values():
        # a plan every tick from T0 = 1.5 s: the pose at t0, then 64 waypoints
        assert len(r["plans"]) == 5 and all(len(p["x"]) == 65 for p in r["plans"])
        assert len(r["path"]["t_s"]) == 21  # 1.5 s on the log, then 0.5 s driven, at 10 Hz
    for scene in ("scene-00000", "scene-00001"):  # one plot per scene, the policies side by side
        with Image.open(in_process / "plots" / f"{scene}.png") as png:
            assert png.size[0] > 0
    for policy in POLICIES:
        record_figure(
            f"scene_score mean over 2 demo scenes at 0.5 s, {policy}",
            ra["metrics"][policy]["scene_score_mean"],
        )


def test_a_resumed_run_skips_the_done_episodes_and_adds_policies(tmp_path, demo_checkpoint, on_ray, capsys):
    # on a copy: the Ray run is the module's, and other tests read it in any order (pytest --random-order)
    run = shutil.copytree(on_ray, tmp_path / "run")
    before = {k: r["wall_s"] for k, r in records(run).items()}
    # one more scene; the two held are done (the workers' CPUs are not part of the settings)
    with threads_restored():
        assert closed_loop(demo_checkpoint, run, "--scenes", "3", "--reproducible") == 0
    doc = report(run)
    assert doc["policies"] == ["model"]
    assert doc["episodes"] | {"failed_reasons": None} == {
        "total": 3,
        "done": 3,
        "failed": 0,
        "skipped": 2,
        "evaluated": 1,
        "pending": 0,
        "failed_reasons": None,
    }
    # the baselines for the new scene: no model is loaded for them
    baselines = ",".join(BASELINES)
    with threads_restored():
        assert (
            closed_loop(demo_checkpoint, run, "--scenes", "3", "--policy", baselines, "--reproducible") == 0
        )
    doc = report(run)
    assert doc["policies"] == list(BASELINES)
    assert (doc["episodes"]["skipped"], doc["episodes"]["evaluated"]) == (6, 3)
    assert doc["throughput"]["workers"][0]["load_s"] < 5  # loaded no model
    after = records(run)
    assert {k: after[k]["wall_s"] for k in before} == before  # the held results were not rewritten
    assert {f"scene-00002.{p}" for p in POLICIES} <= set(after)
    # other settings: refused
    assert closed_loop(demo_checkpoint, run, "--seconds", "1", "--reproducible") == 2
    assert "holds results of other settings" in capsys.readouterr().err
    assert closed_loop(demo_checkpoint, run) == 2  # the mode is one of them, named
    assert "'reproducible': (True, False)" in capsys.readouterr().err


def test_the_cameras_see_the_world_from_the_simulated_pose():
    world = make_world(Scene(0), 1.0)
    renderer = Renderer(world, 48, 80)
    xyz, yaw = world.ego_pose(np.array([1.0]))
    front = RIG[1]
    on_log = renderer.render_at(front, 1.0, xyz[0, :2], float(yaw[0]))
    assert on_log.tobytes() == renderer.render(front, 1.0).tobytes()
    normal = np.array([-np.sin(yaw[0]), np.cos(yaw[0])])
    moved = renderer.render_at(front, 1.0, xyz[0, :2] + 2.0 * normal, float(yaw[0]))
    turned = renderer.render_at(front, 1.0, xyz[0, :2], float(yaw[0]) + 0.2)
    assert np.abs(np.asarray(moved, float) - np.asarray(on_log, float)).mean() > 2.0
    assert np.abs(np.asarray(turned, float) - np.asarray(on_log, float)).mean() > 2.0


def test_the_baselines_have_their_known_outcomes_on_the_scripted_scenes(tmp_path):
    """Without a model: route (privileged) passes every scripted scene, constant velocity runs into the braking
    lead car and the stopped car and leaves the road in the curve, stop brakes to a standstill and makes no
    progress from then on."""
    out = tmp_path / "run"
    args = ["closed-loop", "--out", str(out), "--policy", ",".join(BASELINES), "--scripted", "--scenes", "0"]
    assert main([*args, "--no-progress"]) == 0
    per_scene = report(out)["per_scene"]
    assert sorted(per_scene) == ["curve-00000", "lead-brakes-00000", "stopped-car-00000"]
    for scene, m in per_scene.items():
        assert m["route"]["scene_score"] == 1.0, scene
        assert not m["route"]["collision_any"] and not m["route"]["offroad"], scene
        assert not m["stop"]["collision_any"] and not m["stop"]["offroad"], scene
        assert m["stop"]["progress"] < m["route"]["progress"], scene
        assert m["constant-velocity"]["scene_score"] == 0.0, scene
    for scene in ("lead-brakes-00000", "stopped-car-00000"):
        cv = per_scene[scene]["constant-velocity"]
        assert cv["collision_front"] and cv["failure_reason"] == "collision", scene
    cv = per_scene["curve-00000"]["constant-velocity"]
    assert cv["offroad"] and not cv["collision_any"]
    held = records(out)
    for scene in per_scene:
        path = held[f"{scene}.stop"]["path"]
        t, xy = np.array(path["t_s"]), np.stack([path["x"], path["y"]], axis=1)
        step = np.linalg.norm(np.diff(xy, axis=0), axis=1)
        after_t0 = step[t[1:] > T0_S + 1e-9].sum()
        # braking from the scripted 12 m/s at the controller's 6 m/s^2 (its speed loop lags a little)
        assert after_t0 < 1.2 * SCRIPT_SPEED_MPS**2 / (2 * -MAX_BRAKE), scene
        # then (almost) at a standstill: the controller's first-order speed loop creeps the last millimetres
        assert step[t[1:] > T0_S + 3.0].sum() < 0.1, scene
