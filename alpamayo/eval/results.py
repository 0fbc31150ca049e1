"""A run directory: one JSON result per clip, written atomically, and the settings the results depend on.

    RUN_DIR/run.json              the settings every result shares (`EvalSettings.result_settings`)
    RUN_DIR/clips/<clip>.json     one record per clip (CLIP_SCHEMA)
    RUN_DIR/clips.parquet         one row per clip (id, status, reason, errors), written with the report
    RUN_DIR/report.json, plots/   the aggregate (`alpamayo.eval.report`)

A clip record holds: clip (clip_id, drive, t0_us), status ("done" | "failed"), reason (why it failed), seed,
t0_ns (the tick on the recording clock), prediction (every sample: reasoning, trajectory token ids, x/y/z
metres and heading rad in the t0 ego frame, accel, curvature, and the route text the prompt carried;
`alpamayo.replay.outputs.prediction_record`),
recorded_future (x, y, z, heading) or null, history_xyz [16][3], errors_m ({"min_ade@6.4s": m, ...}),
stages_ms, spans, wall_s, worker (index, pid, host) and warnings. Each file is written to a temporary name
and renamed, so a reader (or a resumed run) sees a whole record or none.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from alpamayo.eval.clips import Clip
from alpamayo.eval.settings import EvalSettings

RUN_SCHEMA = "alpamayo.eval-run/1"
CLIP_SCHEMA = "alpamayo.eval-clip/1"


@dataclass
class RunOutcome:
    """What one run over its units (eval clips, closed-loop scenes) did: the record of every unit of the list
    (None: not run), how many were skipped as done by an earlier run, the ids this run evaluated, the workers
    that ran (their ready() answers), the run's wall time, its run info, and report.json once written."""

    records: list[dict[str, Any] | None]
    skipped: int
    evaluated: set[str]
    workers: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    document: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r is not None and r["status"] == "done"]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r is not None and r["status"] == "failed"]


def failed_record(clip: Clip, reason: str, trace: str | None = None) -> dict[str, Any]:
    """The record of a clip that produced no prediction, with the reason (and traceback, for a bug)."""
    return {
        "schema": CLIP_SCHEMA,
        "clip": clip.as_dict(),
        "clip_id": clip.clip_id,
        "status": "failed",
        "reason": reason,
        "traceback": trace,
    }


def write_json_atomic(path: Path, document: Any) -> None:
    """Write `document` to `path` via a temporary file in the same directory and an atomic rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(document, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunDir:
    """RUN_DIR of one evaluation; `open` creates it or checks that its results match `settings`."""

    def __init__(self, path: Path):
        self.path = path
        self.clips = path / "clips"

    @classmethod
    def open(cls, path: Path, settings: EvalSettings) -> RunDir:
        run = cls(Path(path))
        run.clips.mkdir(parents=True, exist_ok=True)
        manifest = run.path / "run.json"
        wanted = {"schema": RUN_SCHEMA, "settings": settings.result_settings()}
        if manifest.exists():
            try:
                held = json.loads(manifest.read_text())
            except (OSError, ValueError) as e:
                raise ValueError(
                    f"{manifest} does not load ({e}); remove it to start the run afresh"
                ) from None
            if held != wanted:
                differ = {
                    k: (held.get("settings", {}).get(k), v)
                    for k, v in wanted["settings"].items()
                    if held.get("settings", {}).get(k) != v
                }
                raise ValueError(
                    f"--out {run.path} holds results of other settings (held, asked): {differ}; "
                    "use another run directory"
                )
        else:
            write_json_atomic(manifest, wanted)
        return run

    def result_path(self, clip: Clip) -> Path:
        return self.clips / clip.result_name

    def load(self, clip: Clip) -> dict[str, Any] | None:
        """The clip's record, or None when it has none (or one of another clip, an id-hash collision)."""
        path = self.result_path(clip)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ValueError(
                f"result {path} does not load ({e}); remove it to re-evaluate the clip"
            ) from None
        return record if record.get("clip_id") == clip.clip_id else None

    def write(self, clip: Clip, record: dict[str, Any]) -> None:
        write_json_atomic(self.result_path(clip), record)

    def write_table(self, records: Sequence[dict[str, Any]]) -> Path:
        """clips.parquet: one row per record (clip_id, drive, t0_us, status, reason, worker, wall_s, route and one
        column per error metric, null where a clip has none)."""
        keys = sorted({k for r in records for k in (r.get("errors_m") or {})})
        columns: dict[str, list] = {
            "clip_id": [r["clip_id"] for r in records],
            "drive": [r["clip"]["drive"] for r in records],
            "t0_us": [r["clip"]["t0_us"] for r in records],
            "status": [r["status"] for r in records],
            "reason": [r.get("reason") for r in records],
            "worker": [r.get("worker", {}).get("index") for r in records],
            "wall_s": [r.get("wall_s") for r in records],
            "route": [(r.get("prediction") or {}).get("route") for r in records],
        }
        for k in keys:
            columns[k] = [(r.get("errors_m") or {}).get(k) for r in records]
        path = self.path / "clips.parquet"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        pq.write_table(pa.table(columns), tmp)
        os.replace(tmp, path)
        return path
