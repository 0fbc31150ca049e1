"""The aggregate of a closed-loop run per policy, printed and in report.json, and one PNG per scene.

report.json (`REPORT_SCHEMA`):
  run         the settings (policies included), hardware, software and commit;
  episodes    total, done, failed, skipped (done by an earlier run), evaluated (by this run), pending,
              failed_reasons {episode_id: reason}; an episode is one scene driven by one policy;
  policies    the policies in the order they are reported;
  metrics     {policy: the aggregate over its done episodes}: scene_score mean and standard error (AlpaSim
              quotes mean +- its standard error), collision_rate (collision_any), offroad_rate, progress
              mean, plan_deviation mean (m), km_driven and km_between_incidents (km driven over episodes that
              collided or left the road; null with no incident);
  per_scene   {scene_id: {policy: the episode's metrics (`alpamayo.closed_loop.metrics.SceneMetrics`)}};
  throughput  wall_s, episodes_per_hour, workers [{index, host, episodes, load_s}].
plots/<scene_id>.png: every policy side by side in three panels (`scene_plot`): the driven paths on the road, arc
length along the road over time, and the offset across it.
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

REPORT_SCHEMA = "alpamayo.closed-loop-report/2"
POLICY_COLORS = {
    "model": "tab:blue",
    "constant-velocity": "tab:orange",
    "stop": "tab:red",
    "route": "tab:green",
}


class ClosedLoopRun(RunOutcome):
    """A closed-loop run's outcome (`RunOutcome`, over episodes)."""


def aggregate(done: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of one policy over its done episodes' records."""
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
    policies = list(run.info["policies"])
    per_scene: dict[str, dict[str, Any]] = {}
    for r in run.done:
        per_scene.setdefault(r["clip"]["scene_id"], {})[r["clip"]["policy"]] = r["metrics"]
    return {
        "schema": REPORT_SCHEMA,
        "run": run.info,
        "episodes": {
            "total": len(run.records),
            "done": len(run.done),
            "failed": len(run.failed),
            "skipped": run.skipped,
            "evaluated": len(run.evaluated),
            "pending": len(run.records) - len(held),
            "failed_reasons": {r["clip_id"]: r["reason"] for r in run.failed},
        },
        "policies": policies,
        "metrics": {p: aggregate([r for r in run.done if r["clip"]["policy"] == p]) for p in policies},
        "per_scene": per_scene,
        "throughput": {
            "wall_s": run.wall_s,
            "episodes_per_hour": len(mine) * per_hour,
            "workers": [
                {
                    "index": w["index"],
                    "host": w["host"],
                    "episodes": sum(r.get("worker", {}).get("index") == w["index"] for r in mine),
                    "load_s": w["load_s"],
                }
                for w in run.workers
            ],
        },
    }


def report_table(doc: dict[str, Any]) -> str:
    """The printed report: counts, one row per scene and policy, then one aggregate row per policy."""
    ep = doc["episodes"]
    rows = [
        f"Episodes (scene x policy): {ep['done']} done, {ep['failed']} failed, {ep['skipped']} skipped (done "
        f"earlier), {ep['pending']} pending, of {ep['total']}"
    ]
    rows += [f"  failed {eid}: {why}" for eid, why in ep["failed_reasons"].items()]
    width = max(len(p) for p in doc["policies"]) + 2
    rows.append(
        f"{'scene':<18}{'policy':<{width}}{'score':>7}{'progress':>10}{'collision':>11}{'offroad':>9}"
        f"{'plan dev m':>12}{'driven m':>10}"
    )
    for sid, by_policy in doc["per_scene"].items():
        for i, (policy, m) in enumerate(by_policy.items()):
            collision = f"{m['first_collision_s']:.1f}s" if m["collision_any"] else "-"
            offroad = f"{m['first_offroad_s']:.1f}s" if m["offroad"] else "-"
            dev = "-" if m["plan_deviation"] is None else f"{m['plan_deviation']:.3f}"
            rows.append(
                f"{sid if i == 0 else '':<18}{policy:<{width}}{m['scene_score']:>7.3f}{m['progress']:>10.3f}"
                f"{collision:>11}{offroad:>9}{dev:>12}{m['dist_traveled_m']:>10.1f}"
            )
    rows.append(
        f"{'policy':<{width}}{'scenes':>7}{'scene_score':>18}{'collision':>11}{'offroad':>9}{'progress':>10}"
        f"{'km':>8}{'km/incident':>13}"
    )
    for policy in doc["policies"]:
        agg = doc["metrics"][policy]
        if not agg["scenes"]:
            rows.append(f"{policy:<{width}}{0:>7}")
            continue
        sem = "" if agg["scene_score_sem"] is None else f" +- {agg['scene_score_sem']:.3f}"
        between = agg["km_between_incidents"]
        rows.append(
            f"{policy:<{width}}{agg['scenes']:>7}{agg['scene_score_mean']:>8.3f}{sem:<10}"
            f"{agg['collision_rate']:>11.3f}{agg['offroad_rate']:>9.3f}{agg['progress_mean']:>10.3f}"
            f"{agg['km_driven']:>8.3f}{'-' if between is None else f'{between:.3f}':>13}"
        )
    speed = doc["throughput"]
    rows.append(
        f"Throughput: {speed['episodes_per_hour']:.1f} episodes/h over {speed['wall_s']:.1f} s with "
        f"{len(speed['workers'])} worker(s)"
    )
    return "\n".join(rows)


def scene_plot(records: list[dict[str, Any]], path: Path) -> Path:
    """One scene, every policy side by side (records: the scene's done episodes), three panels: the driven paths
    in world metres against the road edges and lane lines, the recorded path and the other cars' paths, with
    where each policy first collided or left the road; arc length along the road over time, with the cars in
    the ego lane; the lateral offset from the centreline over time, with the lane lines and road edges."""
    clip = records[0]["clip"]
    t = np.array(records[0]["path"]["t_s"])
    world = make_world(Scene(clip["seed"], clip["script"]), t[-1] - T0_S)
    road = {  # policy -> (arc length, lateral offset) of its path
        r["clip"]["policy"]: np.array(
            [world.project(np.array(xy)) for xy in zip(r["path"]["x"], r["path"]["y"], strict=True)]
        )
        for r in records
    }
    arcs = np.concatenate([sd[:, 0] for sd in road.values()])
    s = np.arange(arcs.min() - 10.0, arcs.max() + 20.0, 0.5)
    fig = _figure()
    top, along, across = (fig.add_subplot(1, 3, k) for k in (1, 2, 3))
    for d, style in (
        (ROAD_HALF_WIDTH_M, "k-"),
        (-ROAD_HALF_WIDTH_M, "k-"),
        (LANE_WIDTH_M / 2, "y-"),
        (-LANE_WIDTH_M / 2, "k:"),
    ):
        edge, _ = world.at(s, d)
        top.plot(edge[:, 0], edge[:, 1], style, lw=0.8)
        across.axhline(d, color=style[0], ls=style[1:], lw=0.8)
    recorded, _ = world.ego_pose(t)
    top.plot(recorded[:, 0], recorded[:, 1], "--", color="grey", lw=1, label="recorded path")
    along.plot(t, world.arc_length(t), "--", color="grey", lw=1, label="recorded")
    for car in world.cars:
        cs = car.s_at(t)
        if np.any((cs > s[0]) & (cs < s[-1])):
            xy, _ = world.at(cs, car.d)
            top.plot(xy[:, 0], xy[:, 1], color="tab:brown", lw=0.6, alpha=0.6)
            if abs(car.d) < LANE_WIDTH_M / 2:
                along.plot(t, cs, color="tab:brown", lw=1, label="car in the ego lane (centre)")
    for r in records:
        m, p, policy = r["metrics"], r["path"], r["clip"]["policy"]
        x, y = np.array(p["x"]), np.array(p["y"])
        color = POLICY_COLORS.get(policy, "tab:purple")
        top.plot(x, y, color=color, lw=1.5, label=f"{policy}: scene_score {m['scene_score']:.3f}")
        along.plot(t, road[policy][:, 0], color=color, lw=1.5, label=policy)
        across.plot(t, road[policy][:, 1], color=color, lw=1.5, label=policy)
        for key, marker, label in (
            ("first_collision_s", "x", "collision"),
            ("first_offroad_s", "^", "off-road"),
        ):
            if m[key] is not None:
                i = int(np.argmin(np.abs(t - m[key])))
                top.plot(x[i], y[i], marker, color=color, ms=9, label=f"{policy}: {label} at {m[key]:.1f} s")
                along.plot(t[i], road[policy][i, 0], marker, color=color, ms=9)
                across.plot(t[i], road[policy][i, 1], marker, color=color, ms=9)
    top.set_aspect("equal", adjustable="datalim")
    _label_panel(top, clip["scene_id"], "x (m, world)", "y (m, world)", legend=True)
    _label_panel(along, "along the road", "t (s)", "arc length (m)", legend=True)
    _label_panel(across, "across the road", "t (s)", "offset left of the centreline (m)", legend=False)
    fig.savefig(path)
    return path


def write_report(run: ClosedLoopRun, directory: Path) -> dict[str, Any]:
    """report.json and plots/<scene_id>.png in `directory`."""
    doc = report_document(run)
    (directory / "report.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    plot_dir = directory / "plots"
    plot_dir.mkdir(exist_ok=True)
    scenes: dict[str, list[dict[str, Any]]] = {}
    for record in run.done:
        scenes.setdefault(record["clip"]["scene_id"], []).append(record)
    for scene_id, records in scenes.items():
        scene_plot(records, plot_dir / f"{scene_id}.png")
    return doc
