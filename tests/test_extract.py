"""`alpamayo extract`: one tick of a drive as predict's files, from each source; predict on them gives the
lock-step replay's prediction for that tick. Also the frame files' numeric order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from PIL import Image

from alpamayo.cli import main
from alpamayo.inputs import read_ego_csv, read_frames
from alpamayo.replay.extract import find_tick
from bridges.drives import open_drive
from tests.drive_layouts import CLIP, KnownDrive, write_foxglove, write_pai, write_rosbag2

FAST = ["--max-reasoning-tokens", "2"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str | Path]:
    """The known drive on camera 1 only (4 frames a tick keep the demo model quick), in each layout."""
    root = tmp_path_factory.mktemp("one-camera")
    known = KnownDrive(cameras=(1,))
    return {
        "foxglove": write_foxglove(root / "foxglove.mcap", known, "jpeg"),
        "rosbag2": write_rosbag2(root / "rosbag2.mcap", known),
        "pai": f"pai:{CLIP}",
        "pai_dir": write_pai(root / "pai", known),
    }


def source_args(sources, name: str) -> list[str]:
    return ["--pai-dir", str(sources["pai_dir"]), "--cameras", "1"] if name == "pai" else []


@pytest.mark.parametrize("name", ["foxglove", "rosbag2", "pai"])
def test_predict_on_an_extracted_tick_equals_the_replays_prediction(
    name, sources, demo_checkpoint, tmp_path, capsys
):
    spec, extra = str(sources[name]), source_args(sources, name)
    out = tmp_path / "replay.mcap"
    args = ["replay", spec, "--checkpoint", str(demo_checkpoint), "--out", str(out), "--no-progress"]
    assert main([*args, *FAST, "--max-ticks", "2", *extra]) == 0
    with open(out, "rb") as f:
        replayed = [
            json.loads(m.data) for _, _, m in make_reader(f).iter_messages(topics=["/alpamayo/prediction"])
        ]
    capsys.readouterr()
    assert main(["extract", spec, "--tick", "1", "--out", str(tmp_path / "tick"), *extra]) == 0
    assert f"tick 1 at t0 = {replayed[1]['t0_ns']} ns" in capsys.readouterr().out
    frames = tmp_path / "tick" / "frames"
    names = sorted(int(p.stem) for p in (frames / "1").iterdir())
    assert names == replayed[1]["frame_times_ns"]["1"]  # integer start-of-frame names
    predict = ["predict", "--checkpoint", str(demo_checkpoint), "--frames", str(frames)]
    assert main([*predict, "--ego", str(tmp_path / "tick" / "ego.csv"), *FAST, "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    (want,) = replayed[1]["samples"]
    (got,) = predicted["samples"]
    assert got["reasoning_token_ids"] == want["reasoning_token_ids"]
    assert [p[0] for p in got["xyz"]] == want["x"] and [p[1] for p in got["xyz"]] == want["y"]
    assert got["heading"] == want["heading"]


def test_extract_by_t0_and_its_errors(sources, tmp_path, capsys):
    drive = open_drive(sources["rosbag2"])
    try:
        second = find_tick(drive, index=1)
    finally:
        drive.close()
    spec = str(sources["rosbag2"])
    assert main(["extract", spec, "--t0", str(second.t0_ns), "--out", str(tmp_path / "a")]) == 0
    ego = read_ego_csv(tmp_path / "a" / "ego.csv")
    assert np.array_equal(ego.xyz, second.ego_history.xyz) and np.array_equal(
        ego.t_ns, second.ego_history.t_ns
    )
    assert np.array_equal(ego.quat_xyzw, second.ego_history.quat_xyzw)
    capsys.readouterr()
    assert main(["extract", spec, "--t0", str(second.t0_ns + 1), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"no tick at t0 = {second.t0_ns + 1} ns; the nearest: {second.t0_ns} (tick 1)" in err
    assert main(["extract", spec, "--tick", "100000", "--out", str(tmp_path / "b")]) == 2
    assert "--tick 100000 is not one" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_integer_frame_names_sort_numerically(tmp_path):
    # 9.7 s and 10 s as ns: as text "10000000000" sorts before "9700000000".
    times = [9_700_000_000, 9_800_000_000, 9_900_000_000, 10_000_000_000]
    camera = tmp_path / "0"
    camera.mkdir()
    for k, t in enumerate(times):
        Image.fromarray(np.full((8, 8, 3), 60 * k, dtype=np.uint8)).save(camera / f"{t}.png")
    frames, frame_times = read_frames(tmp_path)
    assert frame_times == {0: times}
    assert [int(f[0, 0, 0]) for f in frames[0]] == [0, 60, 120, 180]
