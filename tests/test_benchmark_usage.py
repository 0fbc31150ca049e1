"""Every benchmark runs as its docstring documents it, from the checkout root, without PYTHONPATH."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
USAGE = re.compile(
    r"^\s+(?P<env>\S+=\S+ )?python (?P<args>(?:-m benchmarks\.\w+|benchmarks/\w+\.py)[^\[(]*)", re.M
)


def usage(path: Path) -> re.Match:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = USAGE.search(docstring)
    assert found is not None, f"{path.name}'s docstring shows no `python benchmarks/...` command"
    return found


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_the_documented_command_runs_from_the_checkout_root(path):
    found = usage(path)
    assert found["env"] is None, f"{path.name} documents {found['env'].strip()}: it must run without it"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [*found["args"].split(), "--help"]
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
