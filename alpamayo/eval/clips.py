"""The clips of an evaluation: one prediction each, from a recorded drive at a chosen t0.

A clip comes from a drive on the command line (an MCAP path: its first tick; `pai:CLIP_ID@T0_US`: that
PhysicalAI-AV tick) or from one row of a clip list (`.parquet` or `.csv`):
  * `drive` [, `t0_us`] [, `clip_id`]: a recorded drive (Foxglove or rosbag2 MCAP, or a `pai:` spec) and,
    optionally, the evaluation time in microseconds after the drive's first reference-camera frame (default:
    the drive's first tick);
  * `clip_id`, `t0_us` without `drive`: the PhysicalAI-AV evaluation metadata's columns (NVIDIA's 644-clip
    list), each row the clip `pai:CLIP_ID@T0_US` read from `--pai-dir` (`bridges.drives.open_drive`).
The clip id names the clip's result file and derives its sampling seed (`clip_seed`), so a clip's samples do
not depend on which worker evaluates it, or in what order.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bridges.drives import PAI_PREFIX, parse_pai_spec

CLIP_LIST_SUFFIXES = (".parquet", ".csv")
SEED_BITS = 63  # TokenSampler seeds are non-negative integers


@dataclass(frozen=True)
class Clip:
    """One evaluation unit: `drive` (a recording path or a `pai:CLIP_ID@T0_US` spec), `t0_us` (µs after its
    first reference frame, or the PhysicalAI-AV clip's t0; None: its first tick) and the id its result and seed
    are keyed by."""

    clip_id: str
    drive: str
    t0_us: int | None = None

    @property
    def result_name(self) -> str:
        """The result file's name: the id made filesystem-safe, plus a hash of the id so that ids differing
        only in unsafe characters do not share a file."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", self.clip_id)[:80]
        return f"{safe}-{hashlib.sha256(self.clip_id.encode()).hexdigest()[:10]}.json"

    @property
    def is_pai(self) -> bool:
        """A PhysicalAI-AV clip: its spec carries t0 and the source yields that one tick."""
        return self.drive.startswith(PAI_PREFIX)

    def as_dict(self) -> dict:
        return {"clip_id": self.clip_id, "drive": self.drive, "t0_us": self.t0_us}


def clip_seed(clip_id: str, seed: int) -> int:
    """The sampling seed of one clip: a hash of (run seed, clip id), the same on every worker and machine."""
    digest = hashlib.sha256(f"{seed}/{clip_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def drive_clip(drive: str | Path, t0_us: int | None = None, clip_id: str | None = None) -> Clip:
    """The clip of `drive` at t0_us; its id defaults to the file's stem (with `@t0_us` when one is given), or
    CLIP_ID@T0_US for a `pai:` spec (which must name its t0: NVIDIA's protocol evaluates one tick per clip)."""
    text = str(drive)
    if text.startswith(PAI_PREFIX):
        name, spec_t0 = parse_pai_spec(text)
        if spec_t0 is None or t0_us is not None:
            raise ValueError(
                f"{text}: a PhysicalAI-AV clip is evaluated at one tick: give it as pai:CLIP_ID@T0_US"
            )
        return Clip(clip_id or f"{name}@{spec_t0}", text, spec_t0)
    if clip_id is None:
        clip_id = Path(text).stem + ("" if t0_us is None else f"@{t0_us}")
    return Clip(clip_id, text, t0_us)


def _t0(value: object, where: str) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{where}: t0_us must be a whole number of microseconds >= 0, got {value!r}")
    try:
        t0 = int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{where}: t0_us must be a whole number of microseconds >= 0, got {value!r}"
        ) from None
    if t0 < 0:
        raise ValueError(f"{where}: t0_us must be a whole number of microseconds >= 0, got {t0}")
    return t0


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix.lower() not in CLIP_LIST_SUFFIXES:
        raise ValueError(f"clip list {path}: expected a {' or '.join(CLIP_LIST_SUFFIXES)} file")
    if not path.is_file():
        raise ValueError(f"clip list {path} does not exist")
    try:
        if path.suffix.lower() == ".csv":
            return pd.read_csv(path, dtype={"clip_id": str, "drive": str})
        return pd.read_parquet(path)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ValueError(f"clip list {path} does not load: {e}") from None


def load_clip_list(path: str | Path) -> list[Clip]:
    """The clips of a clip list, in row order; relative drive paths are relative to the list's directory."""
    path = Path(path)
    table = _read_table(path)
    columns = set(table.columns)
    if "drive" not in columns and {"clip_id", "t0_us"} <= columns:
        clips = []
        for row, record in enumerate(table.to_dict("records")):
            where = f"clip list {path} row {row}"
            clip_id, t0 = record["clip_id"], _t0(record["t0_us"], where)
            if not (isinstance(clip_id, str) and clip_id) or t0 is None:
                raise ValueError(
                    f"{where}: a PhysicalAI-AV row needs a clip_id and a t0_us, got {clip_id!r}, {t0}"
                )
            clips.append(drive_clip(f"{PAI_PREFIX}{clip_id}@{t0}"))
        return clips
    if "drive" not in columns:
        raise ValueError(
            f"clip list {path} has columns {sorted(columns)}; expected `drive` [, `t0_us`, `clip_id`] or "
            "`clip_id`, `t0_us` (PhysicalAI-AV)"
        )
    clips = []
    for row, record in enumerate(table.to_dict("records")):
        where = f"clip list {path} row {row}"
        drive = record.get("drive")
        if not isinstance(drive, str) or not drive:
            raise ValueError(f"{where}: `drive` must be a path, got {drive!r}")
        if not drive.startswith(PAI_PREFIX) and not Path(drive).is_absolute():
            drive = str(path.parent / drive)
        clip_id = record.get("clip_id")
        if clip_id is not None and not (isinstance(clip_id, str) and clip_id):
            if isinstance(clip_id, float) and math.isnan(clip_id):
                clip_id = None
            else:
                raise ValueError(f"{where}: `clip_id` must be a non-empty string, got {clip_id!r}")
        clips.append(drive_clip(drive, _t0(record.get("t0_us"), where), clip_id))
    return clips


def collect_clips(
    sources: Sequence[str | Path], clip_list: str | Path | None, limit: int | None
) -> list[Clip]:
    """The clips of the command line (drive paths, then the clip list's rows), the first `limit` of them;
    ValueError for none at all or for two clips with one id."""
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    # Absolute paths: a Ray worker's working directory is not the command's.
    clips = [drive_clip(s if str(s).startswith(PAI_PREFIX) else Path(s).resolve()) for s in sources]
    if clip_list is not None:
        clips += load_clip_list(clip_list)
    if not clips:
        raise ValueError("nothing to evaluate: give drive paths or --clips LIST")
    seen: dict[str, Clip] = {}
    for clip in clips:
        if clip.clip_id in seen:
            raise ValueError(
                f"clip id {clip.clip_id!r} names two clips ({seen[clip.clip_id].drive} and {clip.drive}); "
                "give the clip list a `clip_id` column with unique ids"
            )
        seen[clip.clip_id] = clip
    return clips[:limit]
