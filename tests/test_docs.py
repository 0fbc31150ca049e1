"""The docs execute: every ```sh / ```bash / ```python block of README.md and docs/*.md runs, so a doc cannot
drift from the code it describes.

A file's runnable blocks run in order, each as its own process (`bash -e -o pipefail -c` / `python -c`), in
one fresh temporary directory that holds `demo/` exactly as `alpamayo demo --out demo` leaves it (built once
per session), `.venv` linked to this interpreter's prefix, so `.venv/bin/alpamayo` and `.venv/bin/python`
work there (and `alpamayo` is on PATH), and `scripts` linked to the checkout's (`scripts/ttnn-dryrun`), with
this checkout first on PYTHONPATH. A block that cannot run here
has `<!-- doc-test: skip (REASON) -->` on the line right before its opening fence; a usage synopsis with
placeholders is fenced ```text, and other languages (```text, ```yaml, ...) are not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"sh": "bash", "bash": "bash", "python": "python"}
FENCE = re.compile(r"^(`{3,})(\S*)\s*$")
MARKER = "<!-- doc-test"  # a line starting so is a marker (prose may name the convention)
SKIP = re.compile(r"^<!-- doc-test: skip \((?P<reason>[^()]*\S[^()]*)\) -->$")
BLOCK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip_reason: str | None

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of `path` with its language and skip marker. ValueError naming the line for a marker
    that is malformed, lacks its reason, or does not stand right before an opening fence, and for an
    unclosed fence."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith(MARKER):
            if not SKIP.match(line):
                raise ValueError(
                    f"{path.name}:{i + 1}: {line!r} is not `<!-- doc-test: skip (REASON) -->` (the reason is required)"
                )
            if i + 1 >= len(lines) or not FENCE.match(lines[i + 1]):
                raise ValueError(
                    f"{path.name}:{i + 1}: a doc-test marker must stand right before an opening fence"
                )
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == fence.group(1)), None)
        if end is None:
            raise ValueError(f"{path.name}:{i + 1}: fence never closed")
        marker = SKIP.match(lines[i - 1].strip()) if i else None
        code = "\n".join(lines[i + 1 : end]) + "\n"
        out.append(Block(path, i + 1, fence.group(2), code, marker.group("reason") if marker else None))
        i = end + 1
    return out


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """`alpamayo demo --out demo`, run once per session; returns the directory holding `demo/`."""
    where = tmp_path_factory.mktemp("docs-demo")
    result = subprocess.run(
        [sys.executable, "-m", "alpamayo.cli", "demo", "--out", "demo"],
        cwd=where,
        env=doc_env(where),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return where


def doc_env(cwd: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PATH"] = os.pathsep.join((str(cwd / ".venv" / "bin"), env.get("PATH", "")))
    return env


def run_block(block: Block, cwd: Path) -> None:
    cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    if RUNNABLE[block.lang] == "python":
        cmd = [str(cwd / ".venv" / "bin" / "python"), "-c", block.code]
    result = subprocess.run(
        cmd, cwd=cwd, env=doc_env(cwd), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    assert result.returncode == 0, (
        f"{block.where()} ({block.lang}) exited {result.returncode}:\n{block.code}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )


def test_every_doc_marker_is_well_formed_and_every_fence_closes():
    for path in DOCS:
        blocks(path)


@pytest.mark.parametrize(
    "text,error",
    [
        ("<!-- doc-test: skip -->\n```sh\ntrue\n```\n", "the reason is required"),
        ("<!-- doc-test: skip () -->\n```sh\ntrue\n```\n", "the reason is required"),
        ("<!-- doc-test: skip (a card) -->\n\n```sh\ntrue\n```\n", "right before an opening fence"),
        ("```sh\ntrue\n", "fence never closed"),
    ],
)
def test_a_skip_marker_without_its_reason_or_away_from_a_fence_fails(tmp_path, text, error):
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    with pytest.raises(ValueError, match=re.escape(error)):
        blocks(doc)


def test_skipped_runnable_and_other_blocks_are_told_apart(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doc-test: skip (needs a Blackhole card) -->\n```sh\nfalse\n```\n"
        "```text\nalpamayo replay DIR [--flag]\n```\n```python\nprint(1)\n```\n"
    )
    found = [(b.lang, b.skip_reason, b.code) for b in blocks(doc)]
    assert found == [
        ("sh", "needs a Blackhole card", "false\n"),
        ("text", None, "alpamayo replay DIR [--flag]\n"),
        ("python", None, "print(1)\n"),
    ]


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_doc_blocks_run(path, demo_dir, tmp_path):
    runnable = [b for b in blocks(path) if b.lang in RUNNABLE and b.skip_reason is None]
    if not runnable:
        pytest.skip(f"{path.name} has no runnable block")
    shutil.copytree(demo_dir / "demo", tmp_path / "demo")
    (tmp_path / ".venv").symlink_to(sys.prefix)
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    for block in runnable:
        run_block(block, tmp_path)
