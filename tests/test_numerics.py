"""alpamayo.numerics against numpy/scipy's own figures, and the cases PCC alone cannot see.

Reference: `scipy.stats.pearsonr` and `numpy.corrcoef` for PCC, numpy norms for the errors. The constant cases
are where PCC is undefined (zero variance); the scale/offset cases are where PCC is 1.0 though the values are
wrong, which `assert_agrees`' magnitude gate must catch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from alpamayo.numerics import (
    Agreement,
    agreement,
    assert_agrees,
    max_abs_error,
    noise_bound,
    pcc,
    relative_error,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pcc_matches_scipy_pearsonr(seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(7, 33, generator=g)
    b = a + (seed + 1) * 0.3 * torch.randn(7, 33, generator=g)
    expected = stats.pearsonr(a.flatten().double().numpy(), b.flatten().double().numpy()).statistic
    assert pcc(a, b) == pytest.approx(expected, abs=1e-12)
    assert pcc(a, -b) == pytest.approx(-expected, abs=1e-12)
    assert pcc(a.bfloat16(), b) == pytest.approx(
        np.corrcoef(a.bfloat16().double().flatten().numpy(), b.double().flatten().numpy())[0, 1], abs=1e-12
    )


def test_pcc_of_constant_tensors_is_1_only_when_identical():
    c = torch.full((4, 5), 3.0)
    assert pcc(c, c.clone()) == 1.0
    assert pcc(c, torch.zeros(4, 5)) == 0.0  # was 1.0: both centre to zeros
    assert pcc(torch.zeros(4, 5), c) == 0.0
    assert pcc(c, torch.full((4, 5), 3.5)) == 0.0
    assert pcc(c, torch.arange(20.0).view(4, 5)) == 0.0
    assert pcc(torch.arange(20.0).view(4, 5), c) == 0.0
    assert pcc(torch.zeros(3), torch.zeros(3)) == 1.0


def test_pcc_is_nan_for_non_finite_and_refuses_other_shapes():
    assert math.isnan(pcc(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])))
    assert math.isnan(pcc(torch.tensor([1.0, 2.0]), torch.tensor([float("inf"), 2.0])))
    with pytest.raises(ValueError, match=r"pcc: shapes differ, \[2\] vs \[1, 2\]"):
        pcc(torch.zeros(2), torch.zeros(1, 2))


def test_pcc_cannot_see_scale_or_offset_but_the_magnitude_figures_do():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert pcc(x, x + 100) == pytest.approx(1.0)
    assert pcc(x, 2 * x) == pytest.approx(1.0)
    xn = x.double().numpy()
    assert relative_error(x, x + 100) == pytest.approx(np.linalg.norm(np.full(3, 100.0)) / np.linalg.norm(xn))
    assert relative_error(x, 2 * x) == pytest.approx(1.0)
    assert max_abs_error(x, x + 100) == 100.0
    with pytest.raises(AssertionError, match=r"scaled: relative error 1 > 0.1425"):
        assert_agrees(x, 2 * x, min_pcc=0.99, what="scaled")
    with pytest.raises(AssertionError, match=r"offset: relative error"):
        assert_agrees(x, x + 100, min_pcc=0.99, what="offset")


def test_relative_and_max_abs_errors_match_numpy():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    an, bn = a.double().numpy(), b.double().numpy()
    assert relative_error(a, b) == pytest.approx(np.linalg.norm(bn - an) / np.linalg.norm(an), rel=1e-12)
    assert max_abs_error(a, b) == pytest.approx(np.abs(an - bn).max(), rel=1e-12)
    assert relative_error(a, a.clone()) == 0.0
    assert relative_error(torch.zeros(3), torch.ones(3)) == math.inf
    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    with pytest.raises(ValueError, match="relative_error: shapes differ"):
        relative_error(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="max_abs_error: shapes differ"):
        max_abs_error(torch.zeros(2), torch.zeros(3))


@pytest.mark.parametrize("min_pcc", [0.97, 0.99, 0.999])
def test_the_noise_bound_is_the_relative_error_of_noise_at_the_pcc_gate(min_pcc):
    """Zero-mean expected plus noise orthogonal to it, scaled so PCC lands on the gate: the relative error is
    the derived bound, so noise that passes the PCC gate passes the magnitude gate too."""
    g = torch.Generator().manual_seed(4)
    e = torch.randn(4096, generator=g).double()
    e -= e.mean()
    n = torch.randn(4096, generator=g).double()
    n -= n.mean()
    n -= (n @ e) / (e @ e) * e  # orthogonal to e, zero mean
    n *= noise_bound(min_pcc) * e.norm() / n.norm()
    assert pcc(e, e + n) == pytest.approx(min_pcc, abs=1e-12)
    assert relative_error(e, e + n) == pytest.approx(noise_bound(min_pcc), rel=1e-12)
    assert noise_bound(min_pcc) == pytest.approx(math.sqrt(1 / min_pcc**2 - 1))
    got = assert_agrees(e, e + 0.999 * n, min_pcc=min_pcc)
    assert isinstance(got, Agreement)
    assert got == agreement(e, e + 0.999 * n)


def test_assert_agrees_names_every_failed_gate_and_fails_on_nan():
    x = torch.arange(10.0)
    with pytest.raises(AssertionError) as err:
        assert_agrees(x, -x, min_pcc=0.99, max_abs=1.0, what="layer 3")
    text = str(err.value)
    assert text.startswith("layer 3: PCC -1.000000 < 0.99; relative error 2 > 0.1425; max abs error 18 > 1")
    with pytest.raises(AssertionError, match=r"PCC nan < 0\.99; relative error nan"):
        assert_agrees(x, x * float("nan"), min_pcc=0.99)
    with pytest.raises(AssertionError, match=r"relative error 0.01 > 0.005"):
        assert_agrees(x, 1.01 * x, min_pcc=0.99, max_relative=0.005)
    with pytest.raises(ValueError, match=r"min_pcc must be in \(0, 1\]"):
        assert_agrees(x, x, min_pcc=1.5)
    assert assert_agrees(x, x, min_pcc=1.0) == Agreement(1.0, 0.0, 0.0)
