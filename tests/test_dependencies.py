"""Every third-party module the product imports comes from a distribution that pyproject.toml declares with a
lower bound (or pins), not from one that only arrives as another package's dependency."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

import tomllib

from tests.test_layers import PACKAGES, ROOT, modules


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, str]:
    """Canonical distribution name -> its requirement string, from the dependencies and every extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {_canonical(re.match(r"[A-Za-z0-9_.-]+", r).group()): r for r in requirements}


def imported() -> set[str]:
    """Top-level names of the non-standard-library modules the product imports anywhere."""
    names = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.partition(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.partition(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in PACKAGES}


def test_every_import_is_declared_with_a_lower_bound():
    distributions = packages_distributions()
    requirements = declared()
    problems = []
    for name in sorted(imported()):
        # A module not installed here (ttnn off x86_64 Linux) is looked up under its own name.
        owners = [_canonical(d) for d in distributions.get(name, [name])]
        if not any(o in requirements for o in owners):
            problems.append(f"{name} (from {', '.join(owners)}) is not declared in pyproject.toml")
        elif not any(re.search(r">=|==", requirements.get(o, "")) for o in owners):
            problems.append(
                f"{name}: {[requirements[o] for o in owners if o in requirements]} has no lower bound"
            )
    assert not problems, "\n".join(problems)
