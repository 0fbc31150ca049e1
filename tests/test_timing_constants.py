"""The model's timing constants are defined once, in alpamayo.prediction, and the window's offsets from t0 once, in
alpamayo.input_window; everything else imports them: a second definition (a copy of HISTORY_STEPS, the 0.1 s
period written out in ns or us, another array of history times) could drift from the first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from alpamayo.prediction import DT_S, PERIOD_NS, PERIOD_US

ROOT = Path(__file__).resolve().parents[1]
HOME = "alpamayo/prediction.py"
TIMING = ("DT_S", "PERIOD_NS", "PERIOD_US", "HISTORY_STEPS", "FUTURE_STEPS", "FRAMES_PER_CAMERA")
WINDOW_HOME = "alpamayo/input_window.py"
WINDOW = ("HISTORY_OFFSETS_NS", "FRAME_OFFSETS_NS", "FUTURE_OFFSETS_NS", "MAX_POSE_GAP_NS")
# the period in every unit a constant could spell it in; a constant so named and valued is a second definition
PERIOD_VALUES = (DT_S, DT_S * 1e3, PERIOD_US, PERIOD_NS)
TIME_WORDS = ("PERIOD", "DT", "TICK", "STEP", "RATE", "SPACING")


def module_constants(path: Path) -> list[tuple[str, ast.expr]]:
    """(name, value) of each module-level assignment to an upper-case name."""
    out = []
    for node in ast.parse(path.read_text(), str(path)).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = getattr(node, "value", None)
        out += [
            (t.id, value) for t in targets if isinstance(t, ast.Name) and t.id.isupper() and value is not None
        ]
    return out


def product_modules() -> list[Path]:
    return [
        p
        for package in ("alpamayo", "planner", "bridges", "vision")
        for p in sorted((ROOT / package).rglob("*.py"))
    ]


def homes_of(names: tuple[str, ...]) -> dict[str, list[str]]:
    """Per name, the product modules that assign it at module level."""
    homes: dict[str, list[str]] = {name: [] for name in names}
    for path in product_modules():
        for name, _ in module_constants(path):
            if name in homes:
                homes[name].append(str(path.relative_to(ROOT)))
    return homes


def test_each_timing_constant_is_defined_in_alpamayo_prediction_only():
    assert homes_of(TIMING) == {name: [HOME] for name in TIMING}


def test_the_window_offsets_and_pose_gap_are_defined_in_alpamayo_input_window_only():
    assert homes_of(WINDOW) == {name: [WINDOW_HOME] for name in WINDOW}


def spells_the_period(value: ast.expr) -> bool:
    """A numeric literal equal to the period in s, ms, us or ns."""
    number = value.value if isinstance(value, ast.Constant) else None
    if not isinstance(number, int | float) or isinstance(number, bool):
        return False
    return any(number == pytest.approx(v) for v in PERIOD_VALUES)


def test_no_other_constant_spells_out_the_period():
    found = [
        f"{path.relative_to(ROOT)}: {name} = {value.value!r}"
        for path in product_modules()
        if str(path.relative_to(ROOT)) != HOME
        for name, value in module_constants(path)
        if any(word in name for word in TIME_WORDS) and spells_the_period(value)
    ]
    assert found == []


def test_the_units_agree():
    assert (round(DT_S * 1e9), round(DT_S * 1e6)) == (PERIOD_NS, PERIOD_US)
