"""Route sources for recorded drives: the navigation text each tick's prompt carries (Alpamayo 1.5).

Three sources, chosen by `--route` / `--route-file` on `replay`, `profile` and `eval`:
  --route TEXT      the same text at every tick ("Turn left in 20m");
  --route auto      per tick, the drive's own recorded path over the next ROUTE_HORIZON_S, in the t0 ego (rig)
                    frame, through `planner.navigation.route_to_nav_text` (AlpaSim's rule for route waypoints);
  --route-file CSV  columns `t0_ns,route`: each tick takes the text of the last row with t0_ns <= its t0 (a row
                    holds until the next one; an empty route means none), no text before the first row.
`check_route_options` runs with the settings' validation, before any drive or model is opened.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from alpamayo.config.flow import describe_guidance
from alpamayo.input_window import PoseTrack
from alpamayo.prediction import DT_S, PERIOD_NS
from alpamayo.replay.ticks import poses_in_t0_frame
from planner.navigation import route_to_nav_text

AUTO = "auto"
# How far ahead `--route auto` reads the recorded path: 20 s reaches the rule's 40 m lookahead at any speed
# over 2 m/s; the path is sampled every tick period (0.1 s), as the recorded future is.
ROUTE_HORIZON_S = 20.0
ROUTE_FILE_COLUMNS = ("t0_ns", "route")


class RouteSource(Protocol):
    """The navigation text of the tick at `t0_ns` (recording clock), or None for none."""

    def text_at(self, t0_ns: int) -> str | None: ...


@dataclass(frozen=True)
class FixedRoute:
    """`--route TEXT`: the same text at every tick."""

    text: str

    def text_at(self, t0_ns: int) -> str | None:
        return self.text


@dataclass(frozen=True)
class RecordedRoute:
    """`--route auto`: the text AlpaSim's rule gives the path the ego drove over the next `horizon_s` (up to
    the end of the recording); None when the recording holds no pose after t0 or has a gap in that path."""

    poses: PoseTrack
    horizon_s: float = ROUTE_HORIZON_S

    def text_at(self, t0_ns: int) -> str | None:
        times = t0_ns + PERIOD_NS * np.arange(1, round(self.horizon_s / DT_S) + 1, dtype=np.int64)
        times = times[times <= self.poses.t_ns[-1]]
        if len(times) == 0:
            return None
        path = poses_in_t0_frame(self.poses, t0_ns, times)
        return None if path is None else route_to_nav_text(path[0])


@dataclass(frozen=True)
class RouteTable:
    """`--route-file`: t0_ns [N] strictly increasing with the route text of each row ("" for none)."""

    t0_ns: np.ndarray
    texts: tuple[str, ...]

    @classmethod
    def load(cls, path: Path) -> RouteTable:
        """Read a `t0_ns,route` CSV; ValueError naming the file, the row and the offending value."""
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
                header = tuple(rows[0].keys()) if rows else ()
        except OSError as e:
            raise ValueError(f"--route-file {path} cannot be read: {e.strerror}") from None
        if not rows or set(ROUTE_FILE_COLUMNS) - set(header):
            raise ValueError(
                f"--route-file {path} needs a header with columns {','.join(ROUTE_FILE_COLUMNS)} and at least "
                f"one row; got columns {list(header)} and {len(rows)} row(s)"
            )
        times: list[int] = []
        for line, row in enumerate(rows, start=2):
            try:
                t0 = int(row["t0_ns"])
            except (TypeError, ValueError):
                raise ValueError(
                    f"--route-file {path} line {line}: t0_ns {row['t0_ns']!r} is not an integer nanosecond time"
                ) from None
            if times and t0 <= times[-1]:
                raise ValueError(
                    f"--route-file {path} line {line}: t0_ns {t0} is not after the previous row's {times[-1]}; "
                    "rows must be in strictly increasing t0_ns"
                )
            times.append(t0)
        return cls(np.array(times, dtype=np.int64), tuple((row["route"] or "").strip() for row in rows))

    def text_at(self, t0_ns: int) -> str | None:
        row = int(np.searchsorted(self.t0_ns, t0_ns, side="right")) - 1
        return (self.texts[row] or None) if row >= 0 else None


def check_route_options(
    route: str | None, route_file: Path | None, guidance: float | str | None, mode: str = "lockstep"
) -> None:
    """ValueError for a combination the replay cannot run: both sources, an empty `--route`, a route file that
    does not load, navigation guidance without a source, or a per-tick source in real-time mode (the node
    takes one fixed route, `model.route`)."""
    if route is not None and route_file is not None:
        raise ValueError(f"--route {route!r} and --route-file {route_file} are two route sources; give one")
    if route is not None and not route.strip():
        raise ValueError("--route is empty; give navigation text, e.g. 'Turn left in 20m', or auto")
    if route_file is not None:
        RouteTable.load(route_file)
    if guidance is not None and route is None and route_file is None:
        raise ValueError(
            f"--nav-guidance {describe_guidance(guidance)} needs a route source: --route TEXT, --route auto (from the drive's "
            "recorded path) or --route-file CSV (the unguided branch is the prompt without the route)"
        )
    if mode == "realtime" and (route == AUTO or route_file is not None):
        source = "--route auto" if route == AUTO else f"--route-file {route_file}"
        raise ValueError(
            f"{source} sets the route per tick, which lock-step replay does; real-time replay drives the node, "
            "which takes one fixed route: use --route TEXT or --lockstep"
        )


def route_source(route: str | None, route_file: Path | None, poses: PoseTrack) -> RouteSource | None:
    """The source the options name (see the module docstring), or None without one; `poses`: the drive's."""
    if route_file is not None:
        return RouteTable.load(route_file)
    if route == AUTO:
        return RecordedRoute(poses)
    return None if route is None else FixedRoute(route)
