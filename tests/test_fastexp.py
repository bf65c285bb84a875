"""firmware/fastexp.py's exp against numpy's, over the softmax's range (x <= 0) and its
edges: within 1 ulp, 0 where numpy's underflows, exact at 0."""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from firmware.fastexp import exp_array


def _exp(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    exp_array(x, out)
    return out


def _ulps(got, want) -> np.ndarray:
    return np.abs(got - want) / np.spacing(np.maximum(want, np.finfo(np.float64).tiny))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-800.0, 0.0, allow_nan=False), min_size=1, max_size=64))
@example([0.0, -0.0, -1e-300, -5e-324, -0.5 * np.log(2), -708.39, -708.4, -744.4, -745.0,
          -745.1, -1e300])
def test_within_one_ulp_of_numpy(xs):
    got, want = _exp(xs), np.exp(np.asarray(xs, np.float64))
    normal = want >= np.finfo(np.float64).tiny
    assert _ulps(got[normal], want[normal]).max(initial=0) <= 1
    # subnormal results: within one subnormal step (numpy's own rounding there varies)
    assert np.abs(got[~normal] - want[~normal]).max(initial=0) <= 5e-324
    assert got[np.asarray(xs) == 0].tolist() == [1.0] * int((np.asarray(xs) == 0).sum())


def test_minus_infinity_and_beyond_the_subnormals_give_zero():
    assert _exp([-np.inf, -746.0, -1e308]).tolist() == [0.0, 0.0, 0.0]


def test_dense_grid_stays_within_one_ulp():
    x = -np.linspace(0, 740, 200_001)
    assert _ulps(_exp(x), np.exp(x)).max() <= 1
