"""One prediction's inputs as files: read by `alpamayo predict` and `ask`, written by `alpamayo extract`.

Frames directory: one sub-directory per camera, named by its camera index (`0/`, `1/`, `2/`, `6/`), each with
the camera's 4 frames as PNG or JPEG files whose names sort oldest first. If every file name is an integer
(`1700000000000000000.jpg`) it is taken as the frame's start-of-frame time in ns, which lets the vision cache
key frames across calls; such names sort numerically (`9700000000.png` before `10000000000.png`), others as
text.

Ego CSV: a header `t_ns,x,y,z,qx,qy,qz,qw`, then 16 rows oldest first (metres; unit quaternion ego->world).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from alpamayo.prediction import FRAMES_PER_CAMERA, HISTORY_STEPS, EgoHistory
from vision.preprocess import rgb_array

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
EGO_COLUMNS = ("t_ns", "x", "y", "z", "qx", "qy", "qz", "qw")


def read_frames(directory: str | Path) -> tuple[dict[int, list[np.ndarray]], dict[int, list[int]] | None]:
    """camera index -> 4 RGB uint8 frames (oldest first), and their times when the file names carry them."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"{root}: frames directory does not exist")
    cams = sorted((p for p in root.iterdir() if p.is_dir()), key=_name_order)
    if not cams:
        raise ValueError(
            f"{root}: no camera sub-directories (expected one per camera index, e.g. 0/ 1/ 2/ 6/)"
        )
    frames: dict[int, list[np.ndarray]] = {}
    times: dict[int, list[int]] = {}
    for cam_dir in cams:
        if not cam_dir.name.isdigit():
            raise ValueError(
                f"{cam_dir}: camera sub-directories must be named by camera index (0, 1, 2, 6, ...)"
            )
        files = sorted((p for p in cam_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES), key=_name_order)
        if len(files) != FRAMES_PER_CAMERA:
            raise ValueError(f"{cam_dir}: expected {FRAMES_PER_CAMERA} PNG/JPEG frames, found {len(files)}")
        cam = int(cam_dir.name)
        frames[cam] = [_read_image(f) for f in files]
        if all(f.stem.isdigit() for f in files):
            times[cam] = [int(f.stem) for f in files]
    return frames, (times if len(times) == len(frames) else None)


def _name_order(path: Path) -> tuple[int, int, str]:
    """Integer stems (times, camera indices) by value, before any other name, which sorts as text."""
    return (0, int(path.stem), "") if path.stem.isdigit() else (1, 0, path.name)


def write_frames(directory: str | Path, frames: dict[int, list[tuple[int, np.ndarray]]]) -> None:
    """Write camera index -> 4 (start-of-frame ns, RGB uint8 [H, W, 3]) oldest first as `DIR/<camera>/<ns>.png`
    (lossless: `read_frames` gives back the same pixels and times)."""
    root = Path(directory)
    for camera, shots in frames.items():
        cam_dir = root / str(camera)
        cam_dir.mkdir(parents=True, exist_ok=True)
        for t_ns, rgb in shots:
            Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8), "RGB").save(
                cam_dir / f"{int(t_ns)}.png"
            )


def write_ego_csv(path: str | Path, history: EgoHistory) -> None:
    """Write 16 ego poses as the CSV `read_ego_csv` reads; floats in shortest round-trip form (exact)."""
    with Path(path).open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(EGO_COLUMNS)
        for t, xyz, quat in zip(history.t_ns, history.xyz, history.quat_xyzw, strict=True):
            out.writerow([int(t), *(repr(float(v)) for v in (*xyz, *quat))])


def _read_image(path: Path) -> np.ndarray:
    """uint8 [H, W, 3] RGB, converted as the image preprocessing converts a PIL image (`rgb_array`)."""
    try:
        with Image.open(path) as img:
            return rgb_array(img)
    except (OSError, UnidentifiedImageError) as e:
        raise ValueError(f"{path}: cannot decode image ({e})") from e


def read_ego_csv(path: str | Path) -> EgoHistory:
    """16 ego poses from a CSV with the columns `EGO_COLUMNS` (see module docstring)."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise ValueError(f"{path}: cannot read ego CSV ({e})") from e
    if not rows or set(EGO_COLUMNS) - set(rows[0]):
        found = [] if not rows else sorted(rows[0])
        raise ValueError(f"{path}: ego CSV needs the columns {list(EGO_COLUMNS)}, found {found}")
    if len(rows) != HISTORY_STEPS:
        raise ValueError(
            f"{path}: expected {HISTORY_STEPS} ego poses (10 Hz, oldest first), found {len(rows)}"
        )
    try:
        t_ns = np.array([int(r["t_ns"]) for r in rows], dtype=np.int64)
        values = np.array([[float(r[c]) for c in EGO_COLUMNS[1:]] for r in rows], dtype=np.float64)
    except ValueError as e:
        raise ValueError(f"{path}: non-numeric ego CSV value ({e})") from e
    return EgoHistory(xyz=values[:, :3], quat_xyzw=values[:, 3:], t_ns=t_ns)
