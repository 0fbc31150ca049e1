"""Published single-p150 measurements as data: `p150_anchors.json` beside this module, and the rows
`scripts/card-check` writes in the same format (`alpamayo plan --calibration --anchors FILE` fits with them).

A file is `{"format": "alpamayo.p150-anchors/1", "anchors": [row, ...]}`; a row:

  * `id`: unique name;
  * `workload`: what was measured, in terms the model can rebuild (`alpamayo.plan.calibration.workloads`): the
    `model` (a built-in config or release name, or a name with `base` + `dims` overriding the base's text
    dimensions), the `recipe`, the `stage` (`STAGES`) and its sizes (`batch`, `context`, `prompt`,
    `minus_prompt`, `images`, `image_size`, `samples`, `layers` and `vision_layers` to cut the model, `op`, `bytes`), `logits_to_host`
    (false where the measured program picked the token on the device), `traced` (false for a decode
    dispatched op by op) and `op_class` (a measurement of one op class only);
  * `measured` with its `unit` (`ms`, `us` or `t/s/u`), and `fit`: whether the model is fitted to it (rows kept for
    reference say why not in `note`);
  * `source`: where the figure is published: `repo` + `path` + `commit`, or `url`, or a project `file`, with its
    `date` (ISO; only a project file may be undated) and `where` (the passage that states the figure).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alpamayo.errors import ConfigError

FORMAT = "alpamayo.p150-anchors/1"
ANCHORS_PATH = Path(__file__).with_name("p150_anchors.json")
STAGES = (
    "decode_step",  # one traced decode step of `batch` users at `context` cached positions
    "decode_op",  # one decode matmul of layer 0 (`op`: wqkv, wo, w_gate, w_up, w_down)
    "lm_head_op",  # the decode lm_head
    "sdpa_decode_op",  # one flash-decode of `batch` users at `context`
    "prefill",  # a prefill of `prompt` tokens (time to first token)
    "prefill_delta",  # prefill of `prompt` tokens minus prefill of `minus_prompt` tokens
    "vision_frame",  # one image through the vision tower at `image_size`
    "expert_step",  # one Euler step of the action expert at `samples`, after `prompt` + `context` positions
    "host_read",  # `bytes` read from the device
)
# unit -> (to ms, from ms); t/s/u (tokens per second per user, tt-metal's decode figure) is 1000 / ms
UNITS = {
    "ms": (lambda x: x, lambda ms: ms),
    "us": (lambda x: x * 1e-3, lambda ms: ms * 1e3),
    "t/s/u": (lambda x: 1e3 / x, lambda ms: 1e3 / ms),
}
WORKLOAD_KEYS = {
    "model",
    "base",
    "dims",
    "recipe",
    "stage",
    "batch",
    "context",
    "prompt",
    "minus_prompt",
    "images",
    "image_size",
    "samples",
    "layers",
    "vision_layers",
    "op",
    "bytes",
    "logits_to_host",
    "op_class",
    "traced",
}
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class Source:
    """Where a figure is published; `describe()` is the one-line citation the calibration table prints."""

    date: str | None
    where: str
    repo: str | None = None
    path: str | None = None
    commit: str | None = None
    url: str | None = None
    file: str | None = None

    def describe(self) -> str:
        if self.url:
            at = self.url
        elif self.repo:
            at = f"{self.repo}:{self.path}@{self.commit[:10] if self.commit else '?'}"
        else:
            at = str(self.file)
        return f"{at} ({self.date or 'undated'})"


@dataclass(frozen=True)
class Anchor:
    """One measurement: its workload, the figure in ms, whether the model is fitted to it, its source."""

    id: str
    workload: dict[str, Any]
    measured_ms: float
    unit: str
    fit: bool
    source: Source
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> float:
        """The figure in its published unit."""
        return UNITS[self.unit][1](self.measured_ms)

    def row(self) -> dict[str, Any]:
        """The anchor as a row of the file format (what `scripts/card-check` writes)."""
        src = {k: v for k, v in vars(self.source).items() if v is not None or k == "date"}
        out: dict[str, Any] = {
            "id": self.id,
            "workload": self.workload,
            "measured": round(self.measured, 6),
            "unit": self.unit,
            "fit": self.fit,
            "source": src,
        }
        if self.note:
            out["note"] = self.note
        return out | self.extra


def _source(where: str, data: Any) -> Source:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: source must be an object, got {data!r}")
    unknown = sorted(set(data) - {"date", "where", "repo", "path", "commit", "url", "file"})
    if unknown:
        raise ConfigError(f"{where}: unknown source field(s) {unknown}")
    if not isinstance(data.get("where"), str):
        raise ConfigError(f"{where}: source.where must quote or locate the passage that states the figure")
    src = Source(**{"date": None, **data})
    if src.repo:
        if not (src.path and src.commit):
            raise ConfigError(f"{where}: a repo source needs path and commit, got {data}")
    elif not (src.url or src.file):
        raise ConfigError(f"{where}: the source names no repo + path + commit, url or file: {data}")
    if src.date is None and not src.file:
        raise ConfigError(f"{where}: a published source needs its date (YYYY-MM-DD)")
    if src.date is not None and not DATE.match(src.date):
        raise ConfigError(f"{where}: date {src.date!r} is not YYYY-MM-DD")
    if not src.where.strip():
        raise ConfigError(f"{where}: source.where must quote or locate the passage that states the figure")
    return src


def parse_anchor(where: str, data: Any) -> Anchor:
    """One row of an anchors file, checked; ConfigError naming the row and the field otherwise."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object, got {data!r}")
    required = ("id", "workload", "measured", "unit", "fit", "source")
    missing = [k for k in required if k not in data]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {missing}")
    where = f"{where} ({data['id']})"
    workload = data["workload"]
    if not isinstance(workload, dict):
        raise ConfigError(f"{where}: workload must be an object")
    unknown = sorted(set(workload) - WORKLOAD_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown workload field(s) {unknown}; allowed: {sorted(WORKLOAD_KEYS)}")
    for key in ("model", "recipe", "stage"):
        if not isinstance(workload.get(key), str):
            raise ConfigError(f"{where}: workload.{key} is required (a string)")
    if workload["stage"] not in STAGES:
        raise ConfigError(f"{where}: workload.stage {workload['stage']!r}; allowed: {', '.join(STAGES)}")
    if data["unit"] not in UNITS:
        raise ConfigError(f"{where}: unit {data['unit']!r}; allowed: {', '.join(UNITS)}")
    measured = data["measured"]
    if not isinstance(measured, (int, float)) or not measured > 0:
        raise ConfigError(f"{where}: measured must be a positive number, got {measured!r}")
    if not isinstance(data["fit"], bool):
        raise ConfigError(f"{where}: fit must be true or false")
    known = {*required, "note"}
    return Anchor(
        id=data["id"],
        workload=workload,
        measured_ms=UNITS[data["unit"]][0](float(measured)),
        unit=data["unit"],
        fit=data["fit"],
        source=_source(where, data["source"]),
        note=data.get("note", ""),
        extra={k: v for k, v in data.items() if k not in known},
    )


def load_anchors(path: str | Path = ANCHORS_PATH) -> list[Anchor]:
    """Every row of an anchors file, in file order; ConfigError on a malformed file, row or duplicate id."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read an anchors file: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path}: not an anchors file (format must be {FORMAT!r})")
    rows = data.get("anchors")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{path}: 'anchors' must be a non-empty list")
    anchors = [parse_anchor(f"{path} row {i}", row) for i, row in enumerate(rows)]
    seen: set[str] = set()
    for a in anchors:
        if a.id in seen:
            raise ConfigError(f"{path}: duplicate anchor id {a.id!r}")
        seen.add(a.id)
    return anchors


def write_anchors(path: str | Path, anchors: list[Anchor]) -> None:
    """Write `anchors` as an anchors file (the format `load_anchors` reads)."""
    body = {"format": FORMAT, "anchors": [a.row() for a in anchors]}
    Path(path).write_text(json.dumps(body, indent=2) + "\n")
