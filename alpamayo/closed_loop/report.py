"""The aggregate of a closed-loop run, printed and in report.json, and one PNG per scene.

report.json (`REPORT_SCHEMA`):
  run         the settings, hardware, software and commit;
  scenes      total, done, failed, skipped (done by an earlier run), evaluated (by this run), pending,
              failed_reasons {scene_id: reason};
  metrics     over the done scenes: scene_score mean and standard error (AlpaSim quotes mean +- its standard
              error), collision_rate (collision_any), offroad_rate, progress mean, plan_deviation mean (m),
              km_driven and km_between_incidents (km driven over scenes that collided or left the road;
              null with no incident);
  per_scene   {scene_id: the scene's metrics (`alpamayo.closed_loop.metrics.SceneMetrics`)};
  throughput  wall_s, scenes_per_hour, workers [{index, host, scenes, load_s}].
plots/<scene_id>.png: the driven path against the road edges and lane lines, the recorded path, the other
cars' paths over the scene, and where the ego first collided or left the road.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from alpamayo.closed_loop.rollout import make_world
from alpamayo.closed_loop.scene import T0_S, Scene
from alpamayo.demo_drive.world import LANE_WIDTH_M, ROAD_HALF_WIDTH_M
from alpamayo.eval.results import RunOutcome
from alpamayo.profiling.plots import _figure, _label_panel

REPORT_SCHEMA = "alpamayo.closed-loop-report/1"


class ClosedLoopRun(RunOutcome):
    """A closed-loop run's outcome (`RunOutcome`, over scenes)."""


def aggregate(done: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics section over the done scenes' records."""
    if not done:
        return {"scenes": 0}
    m = [r["metrics"] for r in done]
    scores = np.array([x["scene_score"] for x in m])
    incidents = sum(x["collision_any"] or x["offroad"] for x in m)
    km = sum(x["dist_traveled_m"] for x in m) / 1000
    deviations = [x["plan_deviation"] for x in m if x["plan_deviation"] is not None]
    return {
        "scenes": len(m),
        "scene_score_mean": float(scores.mean()),
        "scene_score_sem": float(scores.std(ddof=1) / np.sqrt(len(scores))) if len(scores) > 1 else None,
        "collision_rate": float(np.mean([x["collision_any"] for x in m])),
        "offroad_rate": float(np.mean([x["offroad"] for x in m])),
        "progress_mean": float(np.mean([x["progress"] for x in m])),
        "plan_deviation_mean_m": float(np.mean(deviations)) if deviations else None,
        "km_driven": km,
        "km_between_incidents": km / incidents if incidents else None,
    }


def report_document(run: ClosedLoopRun) -> dict[str, Any]:
    held = [r for r in run.records if r is not None]
    per_hour = 3600.0 / run.wall_s if run.wall_s > 0 else 0.0
    mine = [r for r in held if r["clip_id"] in run.evaluated]
    return {
        "schema": REPORT_SCHEMA,
        "run": run.info,
        "scenes": {
            "total": len(run.records),
            "done": len(run.done),
            "failed": len(run.failed),
            "skipped": run.skipped,
            "evaluated": len(run.evaluated),
            "pending": len(run.records) - len(held),
            "failed_reasons": {r["clip_id"]: r["reason"] for r in run.failed},
        },
        "metrics": aggregate(run.done),
        "per_scene": {r["clip_id"]: r["metrics"] for r in run.done},
        "throughput": {
            "wall_s": run.wall_s,
            "scenes_per_hour": len(mine) * per_hour,
            "workers": [
                {
                    "index": w["index"],
                    "host": w["host"],
                    "scenes": sum(r.get("worker", {}).get("index") == w["index"] for r in mine),
                    "load_s": w["load_s"],
                }
                for w in run.workers
            ],
        },
    }


def report_table(doc: dict[str, Any]) -> str:
    """The printed report: counts, one row per scene, the aggregate and throughput."""
    sc, agg = doc["scenes"], doc["metrics"]
    rows = [
        f"Scenes: {sc['done']} done, {sc['failed']} failed, {sc['skipped']} skipped (done earlier), "
        f"{sc['pending']} pending, of {sc['total']}"
    ]
    rows += [f"  failed {sid}: {why}" for sid, why in sc["failed_reasons"].items()]
    rows.append(
        f"{'scene':<14}{'score':>7}{'progress':>10}{'collision':>11}{'offroad':>9}{'plan dev m':>12}{'driven m':>10}"
    )
    for sid, m in doc["per_scene"].items():
        collision = f"{m['first_collision_s']:.1f}s" if m["collision_any"] else "-"
        offroad = f"{m['first_offroad_s']:.1f}s" if m["offroad"] else "-"
        dev = "-" if m["plan_deviation"] is None else f"{m['plan_deviation']:.3f}"
        rows.append(
            f"{sid:<14}{m['scene_score']:>7.3f}{m['progress']:>10.3f}{collision:>11}{offroad:>9}{dev:>12}"
            f"{m['dist_traveled_m']:>10.1f}"
        )
    if agg["scenes"]:
        sem = "" if agg["scene_score_sem"] is None else f" +- {agg['scene_score_sem']:.3f}"
        between = agg["km_between_incidents"]
        rows.append(
            f"scene_score {agg['scene_score_mean']:.3f}{sem} over {agg['scenes']} scene(s); collision rate "
            f"{agg['collision_rate']:.3f}, off-road rate {agg['offroad_rate']:.3f}, progress "
            f"{agg['progress_mean']:.3f}; {agg['km_driven']:.3f} km driven, "
            + ("no incident" if between is None else f"{between:.3f} km between incidents")
        )
    speed = doc["throughput"]
    rows.append(
        f"Throughput: {speed['scenes_per_hour']:.1f} scenes/h over {speed['wall_s']:.1f} s with "
        f"{len(speed['workers'])} worker(s)"
    )
    return "\n".join(rows)


def scene_plot(record: dict[str, Any], path: Path) -> Path:
    """The driven path against the road (see the module docstring), world metres."""
    m, p = record["metrics"], record["path"]
    t = np.array(p["t_s"])
    world = make_world(Scene(record["clip"]["seed"]), t[-1] - T0_S)
    x, y = np.array(p["x"]), np.array(p["y"])
    s0, _ = world.project(np.array([x[0], y[0]]))
    s1, _ = world.project(np.array([x[-1], y[-1]]))
    s = np.arange(s0 - 10.0, s1 + 20.0, 0.5)
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    for d, style in (
        (ROAD_HALF_WIDTH_M, "k-"),
        (-ROAD_HALF_WIDTH_M, "k-"),
        (LANE_WIDTH_M / 2, "y-"),
        (-LANE_WIDTH_M / 2, "k:"),
    ):
        edge, _ = world.at(s, d)
        ax.plot(edge[:, 0], edge[:, 1], style, lw=0.8)
    recorded, _ = world.ego_pose(t)
    ax.plot(recorded[:, 0], recorded[:, 1], "--", color="grey", lw=1, label="recorded path")
    for car in world.cars:
        cs = car.s0 + car.speed * t
        if np.any((cs > s[0]) & (cs < s[-1])):
            xy, _ = world.at(cs, car.d)
            ax.plot(xy[:, 0], xy[:, 1], color="tab:orange", lw=0.6, alpha=0.6)
    ax.plot(x, y, color="tab:blue", lw=1.5, label="driven path")
    for key, marker, label in (
        ("first_collision_s", "rx", "collision"),
        ("first_offroad_s", "m^", "off-road"),
    ):
        if m[key] is not None:
            i = int(np.argmin(np.abs(t - m[key])))
            ax.plot(x[i], y[i], marker, ms=9, label=f"{label} at {m[key]:.1f} s")
    ax.set_aspect("equal", adjustable="datalim")
    _label_panel(
        ax,
        f"{record['clip_id']}: scene_score {m['scene_score']:.3f}, progress {m['progress']:.3f}",
        "x (m, world)",
        "y (m, world)",
        legend=True,
    )
    fig.savefig(path)
    return path


def write_report(run: ClosedLoopRun, directory: Path) -> dict[str, Any]:
    """report.json and plots/<scene_id>.png in `directory`."""
    doc = report_document(run)
    (directory / "report.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    plot_dir = directory / "plots"
    plot_dir.mkdir(exist_ok=True)
    for record in run.done:
        scene_plot(record, plot_dir / f"{record['clip_id']}.png")
    return doc
