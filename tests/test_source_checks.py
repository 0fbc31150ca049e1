"""Drive sources are checked before anything loads: `eval` refuses a missing drive before its model, and
`drive-info` tells a directory from a missing file."""

from __future__ import annotations

from alpamayo.cli import main
from alpamayo.demo_drive import make_demo_drive


def test_eval_refuses_a_missing_drive_before_the_model_loads(tmp_path, capsys):
    drive = make_demo_drive(tmp_path / "real.mcap", seconds=1.6, cameras=1, size=(72, 128)).path
    # The checkpoint does not exist either: the drive's error must come first, and no run directory is made.
    args = ["eval", str(drive), str(tmp_path / "nope.mcap"), "--checkpoint", str(tmp_path / "no-checkpoint")]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"recording {tmp_path / 'nope.mcap'} does not exist" in err and "no-checkpoint" not in err
    assert not (tmp_path / "run").exists()
    pai = [
        "eval",
        "pai:0a1b@1000000",
        "--checkpoint",
        str(tmp_path / "no-checkpoint"),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main([*pai, "--pai-dir", str(tmp_path / "no-dataset")]) == 2
    assert f"--pai-dir {tmp_path / 'no-dataset'} is not a directory" in capsys.readouterr().err


def test_drive_info_on_a_directory_says_so_and_names_its_mcap_files(tmp_path, capsys):
    bag = tmp_path / "bag"
    bag.mkdir()
    assert main(["drive-info", str(bag)]) == 2
    assert (
        f"recording {bag} is a directory, not an MCAP file; it holds no .mcap file" in capsys.readouterr().err
    )
    make_demo_drive(bag / "bag_0.mcap", seconds=0.5, cameras=1, size=(72, 128))
    assert main(["drive-info", str(bag)]) == 2
    assert (
        "is a directory, not an MCAP file; give one of its .mcap files: bag_0.mcap" in capsys.readouterr().err
    )
    assert main(["drive-info", str(tmp_path / "missing.mcap")]) == 2
    assert f"recording {tmp_path / 'missing.mcap'} does not exist" in capsys.readouterr().err
