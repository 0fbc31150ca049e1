"""The product's import graph, read from its own source (module-level and function-level imports alike), goes
only down the layers of docs/architecture.md and has no circle."""

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
        "alpamayo.config",
        "alpamayo.configs",
        "alpamayo.expert.config",
        "alpamayo.moe.config",
        "alpamayo.families",
        "alpamayo.checkpoint",
        "alpamayo.cache_files",
        "alpamayo.prediction",
        "alpamayo.generation",
        "alpamayo.tokenizer",
        "alpamayo.rotations",
        "alpamayo.input_window",  # the window at t0: frame slots and the ego history, for every reader
        "alpamayo.devices",
        "alpamayo.profiling",
        "bridges",  # the package itself: its __init__ only
        "bridges.protocol",
        "bridges.jpeg",
        "bridges.sockets",
        "bridges.client",
        "bridges.mcap_messages",
        "bridges.mcap_writer",
        "bridges.ros2_messages",
        "bridges.recording",  # what the drive readers share; the readers are bridges.drives
        "bridges.drives",
    ),
    "planner": (
        "planner",
        "planner.navigation",
        "alpamayo.decoding",  # plans, the reasoning and trajectory-token loop, speculative decoding, the Draft
    ),
    "torch models": (
        "alpamayo.contract",  # the backends' typed contract (Protocols) both the torch and the ttnn models meet
        "alpamayo.text",
        "vision",
        "alpamayo.moe",
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
        "alpamayo.replay.routes",
        "alpamayo.eval",
        "alpamayo.closed_loop",
        "alpamayo.precision",  # ranks precision recipes by running the whole runtime on prompts and drives
        "alpamayo.demo_drive",
        "alpamayo.demo_checkpoint",
        "alpamayo.demo_release",
        "bridges.config",
        "bridges.window",
        "bridges.disconnects",
        "bridges.node",
        "bridges.camera_sim",
        "bridges.alpasim",
    ),
    "commands": ("alpamayo.commands", "alpamayo.cli"),
}
# Imports that the layers allow but the design does not: planner reads a checkpoint's config through the settings
# type it owns (`planner.settings.PlannerConfig`, which the caller builds from its ModelConfig:
# `alpamayo.runtime.planner_config`), never through the model configs or the loader that makes them.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "planner": (
        "alpamayo.config",
        "alpamayo.configs",
        "alpamayo.expert.config",
        "alpamayo.moe.config",
        "alpamayo.families.loader",
    ),
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


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def forbidden(edges: dict[str, set[str]]) -> list[str]:
    """`name imports target` for each import FORBIDDEN names (by prefix on both sides)."""

    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return [
        f"{name} imports {target} (forbidden to {importer})"
        for importer, targets in FORBIDDEN.items()
        for name, found in sorted(edges.items())
        if under(name, importer)
        for target in sorted(found)
        if any(under(target, t) for t in targets)
    ]


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


def test_planner_reads_no_model_config():
    found = forbidden(graph())
    assert not found, "imports the design forbids:\n" + "\n".join(found)


def test_no_import_circle():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_check_finds_an_upward_import_and_a_circle():
    """The checks themselves: a planner module importing a runtime one or a model config, and two modules
    importing each other."""
    assert layer("planner.prompt") < layer("alpamayo.runtime")
    assert forbidden({"planner.prompt": {"alpamayo.config", "alpamayo.errors"}, "planner": set()}) == [
        "planner.prompt imports alpamayo.config (forbidden to planner)"
    ]
    assert forbidden({"plannerx": {"alpamayo.config"}, "alpamayo.runtime": {"alpamayo.configs"}}) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
