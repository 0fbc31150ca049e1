"""The mutation check (tests/mutants.py) in CI: each planted bug is caught by the test that owes it.

Each case copies the checkout, plants one mutant and runs its tests in a child pytest; the mutant must make at
least one of them fail. The unmutated tests run in this same suite, so a failure here while they pass means a
test lost its teeth. `make mutants` runs the same set standalone, with an unmutated baseline first.
"""

from __future__ import annotations

import pytest

from tests.mutants import MUTANTS, copy_checkout, outcome


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_planted_bug_is_caught(mutant, tmp_path, record_figure):
    copy = tmp_path / "checkout"
    copy_checkout(copy)
    verdict, failed, passed, errors, seconds = outcome(copy, mutant, tmp_path / "report.xml")
    record_figure(f"{mutant.name}: {verdict} in s", seconds)
    assert verdict == "killed", (
        f"mutant {mutant.name} ({mutant.why}) {verdict}: {failed} failed, {passed} passed, {errors} errors "
        f"in {', '.join(mutant.tests)}"
    )
