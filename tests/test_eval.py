"""Fleet evaluation (`alpamayo eval`): clip lists, per-clip results, resume, failures and Ray placement, on the
demo checkpoint and generated drives; Ray runs locally with 2 CPUs, started and stopped here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from alpamayo.cli import main
from alpamayo.demo_drive import START_NS, make_demo_drive
from alpamayo.errors import ConfigError
from alpamayo.eval.clips import Clip, clip_seed, collect_clips, load_clip_list
from alpamayo.eval.ray_workers import TENSTORRENT, start_local_ray, worker_resources
from alpamayo.eval.results import RunDir
from alpamayo.eval.settings import EvalSettings
from alpamayo.model_spec import ModelSpec
from alpamayo.profiling import plots
from tests import eval_faults
from tests.compute_threads import threads_restored
from tests.drive_layouts import CLIP, KnownDrive, write_pai

# 1.6 s of one small camera: one tick at t0 = 1.5 s (it needs 1.5 s of ego history). The random demo weights
# never end their reasoning, so a 4-token cap keeps a clip (K = 6) to about a second.
DRIVE = {"seconds": 1.6, "cameras": 1, "size": (72, 128)}
FAST = ["--max-reasoning-tokens", "4", "--no-progress"]
RAY_OBJECT_STORE_BYTES = 80 * 1024**2  # Ray's minimum: results are small and the machine is shared


@pytest.fixture(scope="module")
def drives(tmp_path_factory) -> list[Path]:
    directory = tmp_path_factory.mktemp("drives")
    return [make_demo_drive(directory / f"drive{i}.mcap", seed=i, **DRIVE).path for i in range(4)]


def evaluate(checkpoint: Path, out: Path, *args: str) -> int:
    return main(["eval", *args, "--checkpoint", str(checkpoint), "--out", str(out), *FAST])


def records(out: Path) -> dict[str, dict]:
    docs = [json.loads(p.read_text()) for p in sorted((out / "clips").glob("*.json"))]
    return {d["clip_id"]: d for d in docs}


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """In-process runs on one torch thread, like each Ray worker of one CPU: two threads on two shared, busy
    cores made decode ten times slower (OpenMP threads waiting for descheduled ones)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, demo_checkpoint, drives) -> Path:
    """The drives evaluated in this process (2 torch threads, conftest) with --reproducible."""
    out = tmp_path_factory.mktemp("in_process") / "run"
    with threads_restored():
        assert evaluate(demo_checkpoint, out, *map(str, drives), "--reproducible") == 0
    return out


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray of 2 CPUs, no dashboard, the smallest object store; its workers carry this session's marker
    (they inherit the driver's environment), the value yielded."""
    ray = pytest.importorskip("ray")
    marker = tmp_path_factory.mktemp("ray").name
    os.environ[eval_faults.MARKER_ENV] = marker
    start_local_ray(ray, num_cpus=2, object_store_bytes=RAY_OBJECT_STORE_BYTES)
    yield marker
    ray.shutdown()
    del os.environ[eval_faults.MARKER_ENV]


@pytest.fixture(scope="module")
def on_ray(tmp_path_factory, demo_checkpoint, drives, ray_cluster) -> Path:
    out = tmp_path_factory.mktemp("on_ray") / "run"
    args = ["--ray", "--workers", "2", "--cpus-per-worker", "1", "--reproducible"]
    assert evaluate(demo_checkpoint, out, *map(str, drives), *args) == 0
    return out


def test_two_ray_workers_give_the_in_process_trajectories_and_aggregate(in_process, on_ray, record_figure):
    # --reproducible: this process's 2 threads and two workers of one CPU give the same bytes
    local, distributed = records(in_process), records(on_ray)
    assert sorted(local) == sorted(distributed) == ["drive0", "drive1", "drive2", "drive3"]
    tables = [
        pd.read_parquet(run / "clips.parquet").set_index("clip_id").sort_index()
        for run in (in_process, on_ray)
    ]
    accuracy = [c for c in tables[0].columns if c.startswith(("ade@", "fde@", "min_ade@", "min_fde@"))]
    assert accuracy and tables[0][accuracy].equals(tables[1][accuracy])
    for clip_id, record in local.items():
        # Byte-identical: JSON writes each float64 exactly (shortest round-trip repr).
        assert json.dumps(distributed[clip_id]["prediction"]) == json.dumps(record["prediction"]), clip_id
        assert len(record["prediction"]["samples"]) == 6
    assert {r["worker"]["index"] for r in distributed.values()} == {0, 1}  # both workers took clips
    a, b = report(in_process), report(on_ray)
    assert a["accuracy"] == b["accuracy"] and a["accuracy"]["clips"] == 4
    assert b["clips"] | {"failed_reasons": {}} == {
        "total": 4,
        "done": 4,
        "failed": 0,
        "skipped": 0,
        "evaluated": 4,
        "pending": 0,
        "without_future": 0,
        "failed_reasons": {},
    }
    speed = b["throughput"]
    assert len(speed["workers"]) == 2 and sum(w["clips"] for w in speed["workers"]) == 4
    assert speed["clips_per_hour"] > 0
    stages = {row["stage"]: row["n"] for row in b["stages"]}
    # the demo checkpoint's default decoder, the action expert (as NVIDIA evaluates its releases)
    assert stages["prefill"] == stages["expert"] == 4 and "trajectory_decode" not in stages
    record_figure(
        "mean minADE_6@6.4s over 4 demo clips (m, random weights)", b["accuracy"]["mean_m"]["min_ade@6.4s"]
    )


def test_a_rerun_resumes_and_skips_every_done_clip(tmp_path, demo_checkpoint, drives, on_ray, capsys):
    # on a copy: the Ray run is the module's, and other tests read it in any order (pytest --random-order)
    run = shutil.copytree(on_ray, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in (run / "clips").glob("*.json")}
    args = ["--ray", "--workers", "2", "--cpus-per-worker", "1", "--reproducible"]
    assert evaluate(demo_checkpoint, run, *map(str, drives), *args) == 0
    doc = report(run)
    assert doc["clips"]["skipped"] == 4 and doc["clips"]["evaluated"] == 0 and doc["clips"]["done"] == 4
    assert doc["throughput"]["workers"] == []  # nothing to do: no worker was started
    assert {p.name: p.read_bytes() for p in (run / "clips").glob("*.json")} == before
    assert "4 skipped" in capsys.readouterr().out
    # Results of other settings are never mixed into a run directory.
    assert evaluate(demo_checkpoint, run, *map(str, drives), "--samples", "2") == 2
    assert "holds results of other settings" in capsys.readouterr().err
    # and the mode is one of them, named
    assert evaluate(demo_checkpoint, run, *map(str, drives), "--ray", "--workers", "2") == 2
    assert "'reproducible': (True, False)" in capsys.readouterr().err


def test_a_corrupt_drive_is_reported_failed_while_the_others_finish(
    tmp_path, demo_checkpoint, drives, in_process, ray_cluster, capsys
):
    corrupt = tmp_path / "corrupt.mcap"
    corrupt.write_bytes(drives[0].read_bytes()[:20_000])  # cut mid-file, as a failed copy leaves it
    clip_list = tmp_path / "clips.csv"
    pd.DataFrame({"drive": [str(corrupt), *map(str, drives)]}).to_csv(clip_list, index=False)
    out = tmp_path / "run"
    # One worker: the trajectories are the same whichever number of workers draws them.
    args = ["--clips", str(clip_list), "--ray", "--workers", "1", "--cpus-per-worker", "1", "--reproducible"]
    assert evaluate(demo_checkpoint, out, *args) == 1
    doc = report(out)
    assert doc["clips"]["done"] == 4 and doc["clips"]["failed"] == 1
    reason = doc["clips"]["failed_reasons"]["corrupt"]
    assert "RecordingError" in reason and str(corrupt) in reason
    assert "failed corrupt: RecordingError" in capsys.readouterr().out
    got, want = records(out), records(in_process)
    assert got["corrupt"]["status"] == "failed" and got["corrupt"]["traceback"]
    for clip_id in want:
        assert got[clip_id]["prediction"] == want[clip_id]["prediction"], clip_id
    table = pd.read_parquet(out / "clips.parquet")
    assert list(table["status"]) == ["failed", "done", "done", "done", "done"]
    assert table["min_ade@6.4s"].isna().tolist() == [True, False, False, False, False]


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the worker through Linux /proc")
def test_a_worker_killed_inside_a_clip_is_retried_and_the_report_is_complete(
    tmp_path, demo_checkpoint, drives, in_process, ray_cluster
):
    killer = eval_faults.KillInsideAClip(ray_cluster)
    killer.start()
    out = tmp_path / "run"
    try:
        assert (
            evaluate(demo_checkpoint, out, *map(str, drives), "--ray", "--workers", "2", "--reproducible")
            == 0
        )
    finally:
        killer.stop.set()
        killer.join()
    assert killer.killed is not None, "no worker was seen inside a clip"
    got = records(out)
    assert len(list((out / "clips").glob("*.json"))) == 4 and all(r["status"] == "done" for r in got.values())
    assert killer.killed not in {r["worker"]["pid"] for r in got.values()}  # its clip went to a new process
    doc = report(out)
    assert doc["clips"]["done"] == 4 and doc["clips"]["evaluated"] == 4
    assert doc["accuracy"] == report(in_process)["accuracy"]  # nothing lost, nothing counted twice


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the worker through Linux /proc")
def test_a_clip_whose_worker_dies_past_the_retry_limit_fails_and_the_worker_goes_on(
    tmp_path, demo_checkpoint, drives, ray_cluster
):
    killer = eval_faults.KillInsideAClip(ray_cluster)
    killer.start()
    out = tmp_path / "run"
    args = [*map(str, drives[:2]), "--ray", "--workers", "1", "--cpus-per-worker", "1", "--max-retries", "0"]
    try:
        assert evaluate(demo_checkpoint, out, *args) == 1
    finally:
        killer.stop.set()
        killer.join()
    doc = report(out)
    assert doc["clips"]["done"] == 1 and doc["clips"]["failed"] == 1
    (reason,) = doc["clips"]["failed_reasons"].values()
    assert reason.startswith("the worker process died 1 time(s) evaluating it (Ray: ")
    (done,) = [r for r in records(out).values() if r["status"] == "done"]
    assert done["worker"]["pid"] != killer.killed  # Ray restarted the worker, which took the next clip


def test_the_report_plots_and_the_result_files_load(in_process):
    for name in ("min_ade_histogram.png", "error_vs_horizon.png", "worst_clips.png"):
        with Image.open(in_process / "plots" / name) as img:
            assert img.format == "PNG" and img.size == plots.FIGURE_PX
    frame = pd.json_normalize([json.loads(p.read_text()) for p in (in_process / "clips").glob("*.json")])
    assert set(frame["status"]) == {"done"} and frame["errors_m.min_ade@6.4s"].notna().all()
    doc = report(in_process)
    assert set(doc["accuracy"]["mean_m"]) == set(doc["accuracy"]["median_m"])
    assert {"ade@1s", "fde@2s", "min_ade@3s", "min_ade@6.4s"} <= set(doc["accuracy"]["mean_m"])
    assert {"hardware", "commit", "checkpoint"} <= set(doc["run"])


def test_a_clip_t0_picks_the_tick_at_that_time(tmp_path, demo_checkpoint):
    drive = make_demo_drive(tmp_path / "long.mcap", seed=7, seconds=1.8, cameras=1, size=(72, 128)).path
    clip_list = tmp_path / "clips.parquet"
    pd.DataFrame(
        {"drive": ["long.mcap"] * 2, "t0_us": [1_600_000, 200_000], "clip_id": ["late", "early"]}
    ).to_parquet(clip_list)
    assert load_clip_list(clip_list)[0] == Clip("late", str(drive), 1_600_000)
    out = tmp_path / "run"
    with one_torch_thread():
        assert evaluate(demo_checkpoint, out, "--clips", str(clip_list)) == 1
    got = records(out)
    assert got["late"]["t0_ns"] == START_NS + 1_600_000_000
    assert (
        got["early"]["status"] == "failed" and "has no tick between 0.2 s and 0.3 s" in got["early"]["reason"]
    )


def test_nvidia_clip_lists_evaluate_physicalai_av_clips_at_their_t0(tmp_path, demo_checkpoint):
    """A (clip_id, t0_us) list as NVIDIA's evaluation metadata holds it, over a PhysicalAI-AV tree written with
    the devkit's layout (`tests.drive_layouts.write_pai`: H.264 MP4s, parquets in chunk zips)."""
    write_pai(tmp_path / "pai", KnownDrive(cameras=(1,)))
    clip_list = tmp_path / "eval_metadata.parquet"
    pd.DataFrame({"clip_id": [CLIP, CLIP], "t0_us": [1_700_000, 1_800_000]}).to_parquet(clip_list)
    out = tmp_path / "run"
    args = ["--clips", str(clip_list), "--pai-dir", str(tmp_path / "pai"), "--cameras", "1"]
    with one_torch_thread():
        assert evaluate(demo_checkpoint, out, *args) == 0
    got = records(out)
    assert sorted(got) == [f"{CLIP}@1700000", f"{CLIP}@1800000"]
    for t0_us in (1_700_000, 1_800_000):
        record = got[f"{CLIP}@{t0_us}"]
        assert record["t0_ns"] == t0_us * 1000 and record["clip"]["drive"] == f"pai:{CLIP}@{t0_us}"
        assert record["errors_m"]["min_ade@6.4s"] >= 0 and len(record["prediction"]["samples"]) == 6
    assert report(out)["clips"]["done"] == 2


def test_clip_lists_are_validated_with_the_row_and_the_allowed_values(tmp_path):
    def write(frame: dict) -> Path:
        path = tmp_path / "clips.csv"
        pd.DataFrame(frame).to_csv(path, index=False)
        return path

    # NVIDIA's evaluation metadata: one PhysicalAI-AV tick per row.
    assert load_clip_list(write({"clip_id": ["030c760c"], "t0_us": [5_100_000]})) == [
        Clip("030c760c@5100000", "pai:030c760c@5100000", 5_100_000)
    ]
    with pytest.raises(ValueError, match=r"row 0: a PhysicalAI-AV row needs a clip_id and a t0_us"):
        load_clip_list(write({"clip_id": ["030c760c"], "t0_us": [None]}))
    with pytest.raises(ValueError, match=r"pai:030c760c: a PhysicalAI-AV clip is evaluated at one tick"):
        collect_clips(["pai:030c760c"], None, None)
    with pytest.raises(ValueError, match=r"row 1: t0_us must be a whole number of microseconds >= 0, got -5"):
        load_clip_list(write({"drive": ["a.mcap", "b.mcap"], "t0_us": [1, -5]}))
    with pytest.raises(ValueError, match=r"clip id 'a' names two clips"):
        collect_clips([tmp_path / "x" / "a.mcap"], write({"drive": ["a.mcap"]}), None)
    with pytest.raises(ValueError, match=r"expected a .parquet or .csv file"):
        load_clip_list(tmp_path / "clips.txt")
    with pytest.raises(ValueError, match=r"--limit must be >= 1, got 0"):
        collect_clips(["a.mcap"], None, 0)
    clips = load_clip_list(write({"drive": ["a.mcap", "/abs/b.mcap"], "t0_us": [5_100_000, None]}))
    assert clips == [Clip("a@5100000", str(tmp_path / "a.mcap"), 5_100_000), Clip("b", "/abs/b.mcap", None)]
    assert collect_clips(["a.mcap", "b.mcap", "c.mcap"], None, 2) == [
        Clip("a", str(Path("a.mcap").resolve())),
        Clip("b", str(Path("b.mcap").resolve())),
    ]


def test_physicalai_av_clips_need_the_dataset_directory(tmp_path, demo_checkpoint, capsys):
    clip_list = tmp_path / "eval_metadata.parquet"
    pd.DataFrame({"clip_id": ["030c760c-ae38-49aa-9ad8-f5650a545d26"], "t0_us": [5_100_000]}).to_parquet(
        clip_list
    )
    assert evaluate(demo_checkpoint, tmp_path / "run", "--clips", str(clip_list)) == 2
    err = capsys.readouterr().err
    assert "030c760c-ae38-49aa-9ad8-f5650a545d26@5100000" in err and "give --pai-dir DIR" in err
    # With a directory that is not the dataset, the clip fails with the reader's reason and the run goes on.
    out = tmp_path / "run2"
    assert evaluate(demo_checkpoint, out, "--clips", str(clip_list), "--pai-dir", str(tmp_path)) == 1
    (record,) = records(out).values()
    assert record["status"] == "failed" and record["clip"]["drive"].startswith("pai:030c760c")


def test_per_clip_seeds_depend_on_the_clip_and_the_run_seed_only():
    # the same in another process with another string-hash salt (as on another Ray worker or machine)
    ids = [("drive0", 0), ("drive1", 0), ("drive0", 1), ("pai:abc@5100000", 42)]
    here = [clip_seed(c, s) for c, s in ids]
    code = f"from alpamayo.eval.clips import clip_seed; print([clip_seed(c, s) for c, s in {ids!r}])"
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == str(here)
    assert len({clip_seed("drive0", 0), clip_seed("drive1", 0), clip_seed("drive0", 1)}) == 3
    assert all(0 <= clip_seed(f"clip{i}", 42) < 2**63 for i in range(100))
    # Result files of ids differing only in unsafe characters do not collide.
    assert Clip("a/b", "x").result_name != Clip("a_b", "x").result_name


def protocol(checkpoint, **kw) -> ModelSpec:
    """The model as `alpamayo eval` runs it by default: NVIDIA's protocol sampling."""
    return ModelSpec(checkpoint=checkpoint, temperature=0.6, top_p=0.98, **kw)


def test_settings_refuse_what_this_build_cannot_run(tmp_path, demo_checkpoint):
    with pytest.raises(
        ConfigError, match=r"model.decoder = 'diffusion' is invalid; allowed: expert, tokens, null"
    ):
        protocol(tmp_path, decoder="diffusion")
    with pytest.raises(ValueError, match=r"--workers 2 needs --ray"):
        EvalSettings(protocol(tmp_path), out=tmp_path / "run", workers=2).validate()
    with pytest.raises(
        ValueError, match=r"--ray 'drive0.mcap' is not a Ray address .* put --ray after the drives"
    ):
        EvalSettings(protocol(tmp_path), out=tmp_path / "run", ray="drive0.mcap").validate()
    for address in ("auto", "ray://head.example:10001", "10.0.0.5:6379"):
        EvalSettings(protocol(tmp_path), out=tmp_path / "run", ray=address).validate()
    # K = 6 on the device (a dense model: ttnn refuses K > 1 over MoE layers, read from the config)
    EvalSettings(protocol(demo_checkpoint, backend="ttnn"), out=tmp_path / "run").validate()
    with pytest.raises(ValueError, match=r"--samples 17 with --backend ttnn: .* allowed: 1\.\.16"):
        EvalSettings(
            protocol(demo_checkpoint, backend="ttnn"), out=tmp_path / "run", num_samples=17
        ).validate()
    RunDir.open(tmp_path / "run", EvalSettings(protocol(tmp_path), out=tmp_path / "run"))
    with pytest.raises(ValueError, match=r"holds results of other settings.*'seed': \(0, 1\)"):
        RunDir.open(tmp_path / "run", EvalSettings(protocol(tmp_path), out=tmp_path / "run", seed=1))


def test_workers_ask_for_the_resources_of_their_backend(tmp_path):
    def settings(num_samples: int = 6, workers: int | None = None, cpus_per_worker: int | None = None, **kw):
        return EvalSettings(
            protocol(tmp_path, **kw),
            out=tmp_path / "run",
            ray="auto",
            num_samples=num_samples,
            workers=workers,
            cpus_per_worker=cpus_per_worker,
        )

    mixed = {"CPU": 64.0, "GPU": 4.0, TENSTORRENT: 2.0}
    assert worker_resources(settings(device="cuda"), mixed) == (4, {"num_cpus": 1, "num_gpus": 1})
    assert worker_resources(settings(backend="ttnn", num_samples=1), mixed) == (
        2,
        {"num_cpus": 1, "resources": {TENSTORRENT: 1}},
    )
    assert worker_resources(settings(workers=4), mixed) == (4, {"num_cpus": 16})
    assert worker_resources(settings(workers=2, cpus_per_worker=3), mixed) == (2, {"num_cpus": 3})
    with pytest.raises(ValueError, match=r"has 0 tenstorrent \(start nodes with --resources"):
        worker_resources(settings(backend="ttnn", num_samples=1), {"CPU": 8.0})
    with pytest.raises(ValueError, match=r"--workers 3 .* has 2 GPU, room for 2 worker"):
        worker_resources(settings(device="cuda:0", workers=3), {"CPU": 8.0, "GPU": 2.0})


@pytest.mark.cuda
def test_cuda_workers_on_ray_each_get_a_gpu(tmp_path, demo_checkpoint, drives):
    import torch

    ray = pytest.importorskip("ray")
    start_local_ray(ray, num_cpus=2, object_store_bytes=RAY_OBJECT_STORE_BYTES)
    try:
        out = tmp_path / "run"
        assert evaluate(demo_checkpoint, out, *map(str, drives[:2]), "--ray", "--device", "cuda") == 0
    finally:
        ray.shutdown()
    doc = report(out)
    workers = doc["throughput"]["workers"]
    assert doc["clips"]["done"] == 2 and len(workers) == min(2, torch.cuda.device_count())
    assert all(w["accelerator"] == torch.cuda.get_device_name(0) for w in workers)
