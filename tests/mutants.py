"""Mutation check: plant known bugs in a copy of the checkout and run the tests that must catch each.

Each mutant is a small, deliberate bug of the kind an audit found unnoticed (issue 47): a source edit (exact
text, found exactly once, replaced) in a copy of the tracked files, and the tests that must fail on it. A
mutant is *killed* when at least one of its tests fails (a failure, not a collection error or a skip); one
that passes all of them has *survived*, and the check fails naming it. The unmutated copy runs the same tests
first (`--no-baseline` skips that): a test that fails without the mutant proves nothing.

    make mutants                                        (= python -m tests.mutants, from the checkout root)
    python -m tests.mutants [--list] [--only NAME ...] [--no-baseline]

CI runs every mutant as tests/test_mutation_check.py (the suite itself is the baseline there).

Why a script of named mutants and not mutmut or cosmic-ray: measured here, `mutmut run` on
alpamayo/numerics.py alone against tests/test_numerics.py made 132 operator mutants and took 9 min 43 s on
the shared 2-core machine (120 killed, 12 timed out under load); the golden expert tests that guard the
expert cost 40-90 s of fixtures per run, so operator mutation of the expert, the protocol and the precision
report would take hours. And the bugs that went unnoticed are not single-operator mutations: a key renamed
in the encoder *and* the decoder, a wrapper around a module's output, a hard-coded figure. Named mutants
state the bug and the test that owes its detection, and the whole set runs in minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}


@dataclass(frozen=True)
class Mutant:
    """`old` -> `new` in `path` (each edit's `old` must occur exactly once), caught by `tests` (pytest ids)."""

    name: str
    why: str
    edits: tuple[tuple[str, str, str], ...]  # (path, old, new)
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(
        "expert-output-sign",
        "the runtime's expert loader flips the sign of the action out-projection (issue 47, finding 1)",
        (
            (
                "alpamayo/backends.py",
                "    return ExpertDecoder(model, settings)\n",
                "    _out = model.out_proj.forward\n"
                "    model.out_proj.forward = lambda x: -_out(x)\n"
                "    return ExpertDecoder(model, settings)\n",
            ),
        ),
        ("tests/test_expert_golden.py::test_the_runtimes_expert_decoder_matches_hf_composed",),
    ),
    Mutant(
        "output-key-renamed",
        "`frame_age_ms` renamed `age_ms` in the encoder and the decoder alike (finding 2)",
        (
            (
                "bridges/wire/protocol.py",
                '"frame_age_ms": self.frame_age_ms,',
                '"age_ms": self.frame_age_ms,',
            ),
            ("bridges/wire/protocol.py", 'frame_age_ms=d["frame_age_ms"],', 'frame_age_ms=d["age_ms"],'),
        ),
        ("tests/test_bridge_output_doc.py::test_encoded_messages_follow_the_doc",),
    ),
    Mutant(
        "euler-bf16-product",
        "the Euler update's dt as a 0-dim tensor: dt * v stays bf16 before the float32 sum (finding 3)",
        (
            (
                "alpamayo/expert/sampler.py",
                "x = x + (times[k + 1] - times[k]).view(1, 1, 1) * v.to(x.device)",
                "x = x + (times[k + 1] - times[k]) * v.to(x.device)",
            ),
        ),
        ("tests/test_expert_golden.py::test_bfloat16_figures",),
    ),
    Mutant(
        "drive-figures-constant",
        "the precision report's drive comparison hard-codes full agreement and no drift (finding 4)",
        (
            (
                "alpamayo/precision/drives.py",
                '"token_agreement": float(np.mean(tokens)),',
                '"token_agreement": 1.0,',
            ),
            (
                "alpamayo/precision/drives.py",
                '"ade_drift_m": float(np.mean([ade(b, a) for a, b in zip(ref.xyz, run.xyz, strict=True)])),',
                '"ade_drift_m": 0.0,',
            ),
        ),
        (
            "tests/test_precision_report.py::test_drive_figures_compare_runs_whose_tokens_and_trajectories_vary",
        ),
    ),
    Mutant(
        "pcc-constants-agree",
        "PCC of two constant tensors is 1.0 again, a constant against zeros included (finding 5)",
        (
            (
                "alpamayo/numerics.py",
                "    if denom == 0:\n        return 0.0\n",
                "    if denom == 0:\n        return 1.0 if torch.equal(a, b) else 0.0\n",
            ),
        ),
        ("tests/test_numerics.py::test_pcc_of_constant_tensors_is_1_only_when_identical",),
    ),
    Mutant(
        "pcc-gate-only",
        "the agreement gate checks PCC only: a wrong scale or offset passes (finding 5)",
        (("alpamayo/numerics.py", "    if not got.relative <= rel_bound:\n", "    if False:\n"),),
        ("tests/test_numerics.py::test_pcc_cannot_see_scale_or_offset_but_the_magnitude_figures_do",),
    ),
    Mutant(
        "clip-seed-process-salted",
        "per-clip seeds from Python's salted str hash: other on every Ray worker (finding 6)",
        (
            (
                "alpamayo/eval/clips.py",
                'digest = hashlib.sha256(f"{seed}/{clip_id}".encode()).digest()',
                'digest = hash(f"{seed}/{clip_id}").to_bytes(8, "big", signed=True)',
            ),
        ),
        ("tests/test_eval.py::test_per_clip_seeds_depend_on_the_clip_and_the_run_seed_only",),
    ),
    Mutant(
        "trace-inputs-stale",
        "the traced decode rewrites its persistent inputs only when it allocates them: replays reuse "
        "the first token and position (finding 8)",
        (
            (
                "alpamayo/tt/text/decode.py",
                "            inputs = self.persistent[key]\n"
                "            for h, d in zip(hosts.tensors(), inputs.tensors(), strict=True):\n"
                "                ttnn.copy_host_to_device_tensor(h, d)\n",
                "                for h, d in zip(hosts.tensors(), self.persistent[key].tensors(), strict=True):\n"
                "                    ttnn.copy_host_to_device_tensor(h, d)\n"
                "            inputs = self.persistent[key]\n",
            ),
        ),
        (
            "tests/test_tt_trace_dryrun.py::"
            "test_decode_captures_one_trace_per_program_and_replays_it_over_rewritten_inputs",
        ),
    ),
)


def copy_checkout(dest: Path) -> None:
    """The tracked files (plus untracked, unignored ones: work in progress) of the checkout into `dest`; outside
    a git checkout, every file but caches and the virtual environment."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dest, ignore=lambda _, names: [n for n in names if n in SKIP_DIRS])
        return
    for name in filter(None, listed):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def apply(copy: Path, mutant: Mutant) -> None:
    for path, old, new in mutant.edits:
        file = copy / path
        text = file.read_text()
        if text.count(old) != 1:
            raise SystemExit(
                f"mutant {mutant.name}: {path} holds the text to replace {text.count(old)} times, not once: "
                "update the mutant to the code"
            )
        file.write_text(text.replace(old, new))


def run_tests(copy: Path, tests: tuple[str, ...], report: Path) -> tuple[int, int, int, float]:
    """(failed, errors, passed, seconds) of `tests` run in `copy` (its packages first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--junitxml={report}"]
    start = time.perf_counter()
    subprocess.run([*cmd, *tests], cwd=copy, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if not report.exists():
        return 0, 1, 0, seconds
    cases = ET.parse(report).getroot().iter("testcase")
    failed = errors = passed = 0
    for case in cases:
        outcome = {child.tag for child in case}
        if "failure" in outcome:
            failed += 1
        elif "error" in outcome:
            errors += 1
        elif "skipped" not in outcome:
            passed += 1
    return failed, errors, passed, seconds


def outcome(copy: Path, mutant: Mutant, report: Path) -> tuple[str, int, int, int, float]:
    """Apply `mutant` to `copy` (a fresh copy of the checkout) and run its tests: ("killed" | "ERROR" |
    "SURVIVED", failed, passed, errors, seconds)."""
    apply(copy, mutant)
    failed, errors, passed, seconds = run_tests(copy, mutant.tests, report)
    verdict = "killed" if failed else ("ERROR" if errors else "SURVIVED")
    return verdict, failed, passed, errors, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    args = p.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only or []) - {m.name for m in MUTANTS}
    if unknown:
        p.error(f"unknown mutant(s) {sorted(unknown)}; known: {[m.name for m in MUTANTS]}")
    if args.list:
        for m in MUTANTS:
            print(f"{m.name}: {m.why}\n    killed by {', '.join(m.tests)}")
        return 0
    problems = []
    with tempfile.TemporaryDirectory(prefix="alpamayo-mutants-") as tmp:
        base = Path(tmp) / "base"
        copy_checkout(base)
        if not args.no_baseline:
            tests = tuple(t for m in chosen for t in m.tests)
            failed, errors, passed, seconds = run_tests(base, tests, Path(tmp) / "baseline.xml")
            print(
                f"baseline: {passed} passed, {failed} failed, {errors} errors in {seconds:.0f} s", flush=True
            )
            if failed or errors or passed < len(tests):
                print("the unmutated tests do not all pass: fix them first", file=sys.stderr)
                return 1
        for m in chosen:
            copy = Path(tmp) / m.name
            shutil.copytree(base, copy)
            verdict, failed, passed, errors, seconds = outcome(copy, m, Path(tmp) / f"{m.name}.xml")
            print(f"{m.name}: {verdict} ({failed} failed, {passed} passed, {errors} errors, {seconds:.0f} s)")
            if not failed:
                problems.append(f"{m.name} ({m.why}) {verdict.lower()}: {', '.join(m.tests)}")
            shutil.rmtree(copy)
    for line in problems:
        print(f"mutant not killed: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
