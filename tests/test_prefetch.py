"""firmware/prefetch.py: the hint compiles to the CPU's prefetch instruction, and a hint
anywhere (past an array's end too) changes nothing and never faults."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from firmware.prefetch import prefetch, prefetch_range


@njit(cache=True)
def _sum_hinting(x, ahead):
    """The sum of x (flat), each element's line hinted `ahead` elements before it."""
    s = 0.0
    for i in range(x.size):
        prefetch(x, i + ahead)
        s += x.flat[i]
    return s


@njit(cache=True)
def _hint_range(x, start, count):
    prefetch_range(x, start, count)
    return x.sum()


def test_the_hint_is_the_cpus_prefetch_instruction():
    fresh = njit(_sum_hinting.py_func)  # compiled here (a cached one's assembly is empty)
    x = np.arange(64, dtype=np.float32)
    assert fresh(x, 16) == float(x.sum())
    asm = next(iter(fresh.inspect_asm().values()))
    assert "prefetch" in asm.lower()


@given(n=st.integers(1, 4096), ahead=st.integers(-(1 << 20), 1 << 20),
       dtype=st.sampled_from([np.uint16, np.float32, np.float64, np.int8]))
@settings(max_examples=60, deadline=None)
def test_a_hint_anywhere_changes_nothing(n, ahead, dtype):
    x = (np.arange(n) % 97).astype(dtype)
    assert _sum_hinting(x, ahead) == float(x.astype(np.float64).sum())


@given(shape=st.tuples(st.integers(1, 4), st.integers(1, 64), st.integers(1, 64)),
       start=st.integers(-4096, 1 << 16), count=st.integers(1, 1 << 16))
@settings(max_examples=60, deadline=None)
def test_a_range_past_the_end_is_harmless(shape, start, count):
    x = np.ones(shape, np.uint16)
    assert _hint_range(x, start, count) == x.size
