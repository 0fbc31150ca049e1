"""`scripts/card-check`: first contact with a Blackhole p150, in one run whose files feed back into the plan.

  1. the `blackhole` tests (`pytest -m blackhole tests/`), their summary in the report;
  2. one Alpamayo-1.5-shaped prediction, stage by stage, with the text decoder and the vision tower cut to
     `--layers` / `--vision-layers` and their weights allocated uninitialised (the time of a device program
     does not depend on the values it reads; `alpamayo.tt.dryrun.models`): one frame through the vision
     tower, the prefill of `--prompt` tokens, `--decode-steps` traced decode steps after it; each timed on
     the host around a synchronized device (median of `--iters` after a warm-up), and, where tt-metal's
     device profiler is on (`TT_METAL_DEVICE_PROFILER=1`, set by the script), the device time of every
     program, summed per stage and per op class (`alpamayo.plan.calibration.model.CLASSES`, by the op
     names of a `ttnn.graph` capture of the same call);
  3. `report.md`: every stage measured against the expected model and the roofline of `alpamayo plan`
     for exactly that cut workload, and `anchors.json`: the measurements as anchor rows
     (`alpamayo plan --calibration --anchors OUT/anchors.json` refits with them).

Without a card (and without the dry run) it says what is missing and exits 2. Under the dry run
(`scripts/ttnn-dryrun scripts/card-check ...`) every step runs on the mock p150, which runs no kernels: the
timings are host-side only and meaningless, the report says so, and its anchor rows are marked not to fit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from alpamayo.plan.calibration.anchors import Anchor, parse_anchor, write_anchors
from alpamayo.plan.calibration.model import fitted
from alpamayo.plan.calibration.workloads import model_of, stages
from alpamayo.plan.device_spec import P150

RELEASE = "alpamayo-1.5-10b"
PROFILER_ENV = {
    "TT_METAL_DEVICE_PROFILER": "1",
    "TT_METAL_PROFILER_MID_RUN_DUMP": "1",
    "TT_METAL_PROFILER_CPP_POST_PROCESS": "1",
}
# ttnn op names (graph capture) -> the op class the expected model prices them in
SDPA_OPS = ("scaled_dot_product_attention",)
MATMUL_OPS = ("matmul", "linear", "minimal_matmul", "sparse_matmul")
ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/card-check", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None, help="report directory (default card-check-DATE)")
    p.add_argument("--recipe", default="performance")
    p.add_argument("--layers", type=int, default=2, help="text decoder layers of the cut model (1.5: 36)")
    p.add_argument("--vision-layers", type=int, default=2, help="vision blocks of the cut tower (1.5: 27)")
    p.add_argument("--prompt", type=int, default=3072, help="prefill tokens (1.5 with 16 images: 3072)")
    p.add_argument("--decode-steps", type=int, default=8, help="decode steps timed after the prefill")
    p.add_argument("--image-size", default="320x576")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions per stage, after one warm-up")
    p.add_argument("--skip-tests", action="store_true", help="do not run the blackhole tests")
    return p.parse_args(argv)


def cut_release(layers: int, vision_layers: int) -> Any:
    """Alpamayo 1.5's config with `layers` text layers (its action expert too) and `vision_layers` vision
    blocks, as the workloads of the report's rows cut it (`alpamayo.plan.calibration.workloads.model_of`)."""
    return model_of({"model": RELEASE, "layers": layers, "vision_layers": vision_layers})[0]


class Stopwatch:
    """Times a device call: host wall clock around a synchronized device, and, with the device profiler on,
    the device time of its programs per op class (matched to a graph capture's op names, in order)."""

    def __init__(self, ttnn: Any, device: Any, profiler: bool):
        self.ttnn, self.device, self.profiler = ttnn, device, profiler

    def _device_programs(self) -> list[float]:
        """ms of every program read since the last call (the device profiler's latest data)."""
        self.ttnn.ReadDeviceProfiler(self.device)
        data = self.ttnn.profiler.get_latest_programs_perf_data()
        out = []
        for programs in data.values():
            for p in sorted(programs, key=lambda p: p.program_execution_uid.runtime_id):
                result = p.program_analyses_results.get("DEVICE KERNEL DURATION [ns]")
                if result is not None:
                    out.append(result.duration / 1e6)
        return out

    def time(self, call: Callable[[], Any], iters: int) -> tuple[float, dict[str, float] | None]:
        """(median host ms, device ms per op class of one call or None without the profiler)."""
        from alpamayo.tt.dryrun.graph import Capture

        call()  # warm-up: compiles the programs
        self.ttnn.synchronize_device(self.device)
        if self.profiler:
            self._device_programs()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            call()
            self.ttnn.synchronize_device(self.device)
            times.append(1e3 * (time.perf_counter() - start))
        classes = None
        if self.profiler:
            self._device_programs()  # drop the timed calls' programs
            with Capture(self.ttnn) as graph:
                call()
            self.ttnn.synchronize_device(self.device)
            device_ms = self._device_programs()
            classes = attribute(graph, device_ms)
        return statistics.median(times), classes


def attribute(graph: Any, device_ms: list[float]) -> dict[str, float]:
    """Device ms per op class: the captured device operations in order against the profiled programs in
    order; all under `unattributed` when their counts differ (an op of several programs)."""
    ops = [n["params"]["name"] for n in graph.nodes if n["node_type"] == "function_start"]
    ops = [o for o in ops if o.startswith("ttnn.") and not o.startswith("ttnn.to") and "from" not in o]
    if len(ops) != len(device_ms):
        return {"unattributed": sum(device_ms)}
    out: dict[str, float] = {}
    for name, ms in zip(ops, device_ms, strict=True):
        if any(s in name for s in SDPA_OPS):
            cls = "sdpa"
        elif any(name.endswith(m) for m in MATMUL_OPS):
            cls = "matmul"
        else:
            cls = "layer ops"
        out[cls] = out.get(cls, 0.0) + ms
    return out


def run_tests(out: Path) -> str:
    """The blackhole tests; their last summary line (their whole output in OUT/blackhole-tests.txt)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "blackhole", "tests/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    (out / "blackhole-tests.txt").write_text(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return f"exit {proc.returncode}: {lines[-1] if lines else 'no output'}"


def profile(args: argparse.Namespace, dry: bool) -> list[dict[str, Any]]:
    """Every stage of the cut prediction: its workload, host median ms, and device ms per op class."""
    from alpamayo.plan.precision import load_precision
    from alpamayo.plan.programs.text import plan_text
    from alpamayo.tt.device import close_device, import_ttnn, open_device
    from alpamayo.tt.dryrun.models import text_model, vision_encoder

    ttnn = import_ttnn()
    cfg = cut_release(args.layers, args.vision_layers)
    plan = plan_text(cfg, load_precision(args.recipe))
    device = open_device(plan.trace_region_bytes)
    watch = Stopwatch(ttnn, device, profiler=not dry and os.environ.get("TT_METAL_DEVICE_PROFILER") == "1")
    base = {"model": RELEASE, "recipe": args.recipe, "layers": args.layers}
    rows = []
    try:
        h, w = (int(x) for x in args.image_size.split("x"))
        v = cfg.vision
        grid = torch.tensor([[1, h // v.patch_size, w // v.patch_size]])
        vision = vision_encoder(cfg, args.recipe, device)
        patches = torch.randn(int(grid.prod()), v.patch_dim)
        ms, classes = watch.time(lambda: vision.encode(patches, grid), args.iters)
        vision.close()
        work = base | {
            "stage": "vision_frame",
            "image_size": args.image_size,
            "vision_layers": args.vision_layers,
        }
        rows.append({"workload": work, "ms": ms, "classes": classes})

        text = text_model(cfg, args.recipe, device)
        text.setup_cache(args.prompt + args.decode_steps * (args.iters + 2) + 64)
        ids = torch.arange(args.prompt) % 1000

        ms, classes = watch.time(lambda: text.prefill(ids), args.iters)
        rows.append(
            {"workload": base | {"stage": "prefill", "prompt": args.prompt}, "ms": ms, "classes": classes}
        )

        def steps() -> None:
            for _ in range(args.decode_steps):
                text.decode(1)

        ms, classes = watch.time(steps, args.iters)
        context = args.prompt + args.decode_steps * (args.iters + 1)
        per = {k: v / args.decode_steps for k, v in classes.items()} if classes else None
        work = base | {"stage": "decode_step", "context": context, "batch": 1}
        rows.append({"workload": work, "ms": ms / args.decode_steps, "classes": per})
        text.close()
    finally:
        close_device(device)
    return rows


def report(args: argparse.Namespace, out: Path, rows: list[dict[str, Any]], tests: str, dry: bool) -> None:
    """report.md (measured against expected and roofline per stage) and anchors.json (the rows)."""
    model = fitted()
    today = datetime.date.today().isoformat()
    where = "dry run on a mock p150" if dry else "Blackhole p150"
    anchors: list[Anchor] = []
    table = [
        "| stage | measured ms | expected ms | roofline ms | measured / expected | device ms by op class |",
        "|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(rows):
        work = row["workload"]
        passes = stages(work)
        expected = sum(sign * model.pass_ms(s) for sign, s in passes)
        roof = sum(sign * s.ms(P150) for sign, s in passes)
        classes = row["classes"]
        by_class = "-" if not classes else ", ".join(f"{k} {v:.3f}" for k, v in sorted(classes.items()))
        table.append(
            f"| {work['stage']} | {row['ms']:.3f} | {expected:.3f} | {roof:.3f} | {row['ms'] / expected:.2f} | {by_class} |"
        )
        data = {
            "id": f"card-check.{today}.{work['stage']}",
            "workload": work,
            "measured": round(row["ms"], 6),
            "unit": "ms",
            "fit": not dry,
            "source": {
                "file": str(out / "report.md"),
                "date": today,
                "where": f"scripts/card-check on a {where}, stage {i + 1} of the report's table",
            },
        }
        if dry:
            data["note"] = (
                "dry run: the mock p150 runs no kernels, so this time is host-side only and meaningless"
            )
        anchors.append(parse_anchor(f"card-check row {i}", data))
    write_anchors(out / "anchors.json", anchors)
    lines = [
        f"# card-check {today}: {where}",
        "",
        "**TIMINGS ARE MEANINGLESS: the dry run's mock p150 runs no kernels; every figure below is host-side "
        "work only. This run checks that the script, the models and the report work end to end.**"
        if dry
        else "Timings: host wall clock around a synchronized device, median of the timed repetitions.",
        "",
        f"Workload: Alpamayo 1.5 ({RELEASE}) cut to {args.layers} text layers and {args.vision_layers} vision "
        f"blocks, recipe `{args.recipe}`, uninitialised weights; prefill {args.prompt} tokens, decode "
        f"{args.decode_steps} steps per repetition, {args.iters} repetitions after a warm-up.",
        "",
        f"blackhole tests: {tests}",
        "",
        *table,
        "",
        "Expected and roofline: `alpamayo plan`'s model for exactly these workloads "
        f"(`alpamayo.plan.calibration`, fitted to {len(model.anchor_ids)} anchors). Device ms by op class: the "
        "device profiler's programs matched in order to a graph capture's ttnn ops (matmul, sdpa, the "
        "layer's other ops), `unattributed` where the counts differ; `-` without the profiler.",
        f"Anchor rows: `{out / 'anchors.json'}`; refit with `alpamayo plan --calibration --anchors "
        f"{out / 'anchors.json'}`.",
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from alpamayo.tt.device import device_unavailable_reason, dry_run_active

    reason = device_unavailable_reason()
    if reason is not None:
        print(f"card-check: no p150 to check: {reason}", file=sys.stderr)
        return 2
    dry = dry_run_active()
    out = args.out or Path(f"card-check-{datetime.date.today().isoformat()}")
    out.mkdir(parents=True, exist_ok=True)
    tests = "skipped (--skip-tests)" if args.skip_tests else run_tests(out)
    if dry and not args.skip_tests:
        tests += " (under the dry run the blackhole tests skip: they need a card)"
    rows = profile(args, dry)
    report(args, out, rows, tests, dry)
    print(f"card-check: {out / 'report.md'}, {out / 'anchors.json'}")
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    from alpamayo.tt.device import dry_run_active

    if not dry_run_active():  # tt-metal reads these when it starts: before the first ttnn call
        for key, value in PROFILER_ENV.items():
            os.environ.setdefault(key, value)
    sys.exit(main())
