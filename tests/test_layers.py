"""The product's import graph, read from its own source (module-level and function-level imports alike), goes
only down the layers of docs/architecture.md and has no circle, neither between modules nor between packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("alpamayo", "vision", "planner", "bridges")

# Bottom-up, as docs/architecture.md draws them. A module belongs to the layer of its longest listed prefix.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": (
        "alpamayo",  # the package itself: its __init__ only
        "alpamayo.errors",
        "alpamayo.reproducibility",
        "alpamayo.json_fields",
        "alpamayo.numerics",
        "alpamayo.families",  # registry, base model, vocabulary: no config (the loader is alpamayo.config's)
        "alpamayo.cache_files",
        "alpamayo.prediction",
        "alpamayo.generation",
        "alpamayo.tokenizer",
        "alpamayo.rotations",
        "alpamayo.input_window",  # the window at t0: frame slots and the ego history, for every reader
        "alpamayo.devices",
        "alpamayo.profiling",
        "bridges",  # the package itself: its __init__ only
        "bridges.wire",  # the node's ZeroMQ protocol, JPEG checks, sockets and clients
        "bridges.drives",  # recorded drives: readers, writers, MCAP and ROS 2 messages
    ),
    "planner": ("planner",),  # below the config: the planner reads no model config (PlannerConfig is its own)
    "config": (
        "alpamayo.config",  # model, expert, MoE and flow settings, the loader, the bundled configs
        "alpamayo.checkpoint",
    ),
    "torch models": (
        "alpamayo.contract",  # the backends' typed contract (Protocols) both the torch and the ttnn models meet
        "alpamayo.decoding",  # the reasoning and trajectory-token loop, speculative decoding, the Draft
        "alpamayo.text",  # with alpamayo.text.moe
        "vision",
        "alpamayo.expert",
        "alpamayo.drafts",
        "alpamayo.quant",
        "alpamayo.positions",
        "alpamayo.inputs",
    ),
    "plan": ("alpamayo.plan",),  # recipes, device layouts, program configs, DRAM and GPU plans
    "tt": ("alpamayo.tt",),
    "runtime": ("alpamayo.backends", "alpamayo.model_spec", "alpamayo.vlm", "alpamayo.runtime"),
    "applications": (
        "alpamayo.replay",
        "alpamayo.eval",
        "alpamayo.closed_loop",
        "alpamayo.precision",  # ranks precision recipes by running the whole runtime on prompts and drives
        "alpamayo.demo_drive",
        "alpamayo.demo_checkpoint",
        "alpamayo.demo_release",
        "bridges.node",  # the inference node, its config, input window and disconnect causes
        "bridges.camera_sim",
        "bridges.alpasim",
    ),
    "commands": ("alpamayo.commands", "alpamayo.cli"),
}
RANK = {prefix: rank for rank, prefixes in enumerate(LAYERS.values()) for prefix in prefixes}
NAMES = list(LAYERS)


def modules() -> dict[str, Path]:
    """Dotted name -> source file of every product module (a package by its `__init__.py`)."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The product modules that `name` imports anywhere in its source (a name imported from a package counts
    as its submodule where one exists)."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            candidates = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for target in candidates:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                targets.add(target)
    return targets


def layer(name: str) -> int:
    """Rank of `name`'s layer: its longest prefix in `LAYERS`."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:n])) in RANK:
            return RANK[prefix]
    raise AssertionError(f"{name} is in no layer of tests/test_layers.py's LAYERS (docs/architecture.md)")


def unit(name: str) -> str:
    """The package `name` belongs to for the cycle check between packages: a top-level module or subpackage of
    `alpamayo` (`alpamayo.text.moe.block` -> `alpamayo.text`), a subpackage of `bridges` (else `bridges` itself),
    `vision` or `planner`."""
    parts = name.split(".")
    if parts[0] == "alpamayo" and len(parts) > 1:
        return ".".join(parts[:2])
    if parts[0] == "bridges" and len(parts) > 1 and (ROOT / "bridges" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0]


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph `edges` as a graph between their packages (`unit`), without self-loops."""
    found: dict[str, set[str]] = {}
    for name, targets in edges.items():
        found.setdefault(unit(name), set()).update(unit(t) for t in targets if unit(t) != unit(name))
    for targets in list(found.values()):
        for target in targets:
            found.setdefault(target, set())
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_every_module_has_a_layer():
    missing = []
    for name in modules():
        try:
            layer(name)
        except AssertionError as e:
            missing.append(str(e))
    assert not missing, "\n".join(missing)


def test_imports_only_go_down():
    upward = [
        f"{name} ({NAMES[layer(name)]}) imports {target} ({NAMES[layer(target)]})"
        for name, targets in sorted(graph().items())
        for target in sorted(targets)
        if layer(target) > layer(name)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_bridges_modules_live_in_subpackages():
    """Each subpackage of bridges sits wholly in one layer; a flat module beside bridges/__init__.py would fall
    into the base layer by the `bridges` prefix whatever it imports, so there is none."""
    flat = sorted(p.name for p in (ROOT / "bridges").glob("*.py") if p.name != "__init__.py")
    assert not flat, f"flat modules in bridges/ (give each a subpackage, one layer): {flat}"


def test_no_import_circle():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_circle_between_packages():
    found = circles(packages(graph()))
    assert not found, "packages importing each other:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_check_finds_an_upward_import_and_a_circle():
    """The checks themselves: a planner module importing a runtime one or a model config, two modules importing
    each other, and two packages importing each other through different modules."""
    assert layer("planner.prompt") < layer("alpamayo.runtime")
    assert layer("planner.prompt") < layer("alpamayo.config.model") == layer("alpamayo.checkpoint")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert unit("alpamayo.text.moe.block") == "alpamayo.text"
    assert unit("alpamayo.runtime") == "alpamayo.runtime"
    assert unit("bridges.drives.pai") == "bridges.drives"
    assert unit("bridges.node.server") == "bridges.node" and unit("bridges") == "bridges"
    assert unit("planner.plans") == "planner"
    no_module_circle = {
        "alpamayo.text.weights": {"alpamayo.text.moe.block", "alpamayo.config.model"},
        "alpamayo.text.moe.block": {"alpamayo.text.mlp", "alpamayo.checkpoint"},
        "alpamayo.text.mlp": set(),
        "alpamayo.config.model": set(),
        "alpamayo.checkpoint": {"alpamayo.config.model"},
        "alpamayo.config.loader": {"alpamayo.text.mlp"},
        "bridges.node.server": {"bridges.wire.protocol"},
        "bridges.wire.client": {"bridges.node.config"},
        "bridges.wire.protocol": set(),
        "bridges.node.config": set(),
    }
    assert circles(no_module_circle) == []
    assert circles(packages(no_module_circle)) == [
        ["alpamayo.checkpoint", "alpamayo.config", "alpamayo.text"],
        ["bridges.node", "bridges.wire"],
    ]
    assert (
        circles(packages({"alpamayo.text.weights": {"alpamayo.text.mlp"}, "alpamayo.text.mlp": set()})) == []
    )
