"""The two modes a card test runs in: on a Blackhole card (`blackhole`) and in the ttnn golden mode (`golden`:
`alpamayo.tt.golden`, ttnn's golden functions on the host, no card). A card test module's case fixture takes
`device_cases(CASES)` as its params and opens its device with `case_device(request)`; the `device` (card)
and `golden_device` fixtures are tests/conftest.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def device_cases(cases: list[str], golden: Callable[[str], bool] = lambda case: "accuracy" in case) -> list:
    """The params of a card test module's case fixture: (mode, case) for every case on a Blackhole card
    (marked `blackhole`) and, marked `golden`, for the cases `golden` selects (default: the `accuracy`
    recipe's, the card test's bar) in the ttnn golden mode (`alpamayo.tt.golden`: ttnn's golden functions
    on the host, no card). `case_device` opens the mode's device."""
    card = [pytest.param(("card", c), marks=pytest.mark.blackhole, id=f"card-{c}") for c in cases]
    gold = [
        pytest.param(("golden", c), marks=pytest.mark.golden, id=f"golden-{c}") for c in cases if golden(c)
    ]
    return card + gold


def case_device(request) -> tuple[str, Any]:
    """A `device_cases` param's case name and device: the module's card `device`, or `golden_device`."""
    mode, name = request.param
    return name, request.getfixturevalue("device" if mode == "card" else "golden_device")


def card_only(model: Any, what: str) -> None:
    """Skip a test of what only a card has (trace capture and replay) when `model` runs in the golden mode."""
    from alpamayo.tt.device import is_golden

    if is_golden(model.device):
        pytest.skip(f"{what}: traces are card-only (the golden mode runs a traced step as its untraced ops)")
