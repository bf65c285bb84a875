"""The FTL's run map (c/model/sde_segmap.c) against a plain dict: sets, clears, gets and
runs at any alignment, including segments whose values are not one run (spilled) and back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from ssdemu.sim._model import ffi, lib

NONE = lib.SDE_SEGMAP_NONE
N = 700  # indexes: 11 segments of 64, the last one partial


def _new(n=N):
    out = ffi.new("sde_segmap **")
    assert lib.sde_segmap_new(n, out) == 0
    return ffi.gc(out[0], lib.sde_segmap_free)


def _ref_run(ref, i, limit):
    v = ref.get(i, NONE)
    k = 1
    while i + k < limit and ref.get(i + k, NONE) == (NONE if v == NONE else v + k):
        k += 1
    return v, k


ops = st.lists(st.tuples(st.sampled_from(["set", "clear"]), st.integers(0, N - 1),
                         st.integers(1, 200), st.integers(0, 5000)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_map_matches_a_dict(script):
    s, ref = _new(), {}
    gone_runs = []

    @ffi.callback("void(void *, uint32_t, uint32_t)")
    def gone(ctx, v, n):
        gone_runs.append((v, n))

    for op, i, k, v in script:
        k = min(k, N - i)
        if op == "set":
            for j in range(i, i + k):  # the map's contract: set only what is unmapped
                if j in ref:
                    del ref[j]
            lib.sde_segmap_clear(s, i, k, ffi.NULL, ffi.NULL)
            lib.sde_segmap_set(s, i, k, v)
            ref.update({i + j: v + j for j in range(k)})
        else:
            gone_runs.clear()
            removed = [ref.pop(j) for j in range(i, i + k) if j in ref]
            assert lib.sde_segmap_clear(s, i, k, gone, ffi.NULL) == len(removed)
            # the runs handed on are the removed values, in index order, each a run
            assert [v0 + t for v0, n in gone_runs for t in range(n)] == removed
            assert all(n > 0 for _, n in gone_runs)
        assert [lib.sde_segmap_get(s, j) for j in range(N)] == [ref.get(j, NONE)
                                                                for j in range(N)]
    for i in range(0, N, 7):
        v = ffi.new("uint32_t *")
        k = lib.sde_segmap_run(s, i, N, v)
        assert (v[0], k) == _ref_run(ref, i, N)
    # a segment spills only while its values are not one run, and is given back when empty
    lib.sde_segmap_clear(s, 0, N, ffi.NULL, ffi.NULL)
    assert lib.sde_segmap_spilled(s) == 0


def test_runs_cross_segments_and_stop_where_values_jump():
    s = _new()
    lib.sde_segmap_set(s, 10, 300, 1000)  # one run over five segments
    lib.sde_segmap_set(s, 310, 20, 5000)  # continues the indexes, not the values
    v = ffi.new("uint32_t *")
    assert lib.sde_segmap_run(s, 10, N, v) == 300 and v[0] == 1000
    assert lib.sde_segmap_run(s, 200, 250, v) == 50 and v[0] == 1190  # stops at the limit
    assert lib.sde_segmap_run(s, 310, N, v) == 20 and v[0] == 5000
    assert lib.sde_segmap_run(s, 0, N, v) == 10 and v[0] == NONE
    assert lib.sde_segmap_spilled(s) == 1  # the segment holding both runs' ends
    lib.sde_segmap_clear(s, 310, 20, ffi.NULL, ffi.NULL)
    assert lib.sde_segmap_spilled(s) == 1  # still not empty: per-index values kept
    lib.sde_segmap_clear(s, 0, N, ffi.NULL, ffi.NULL)
    assert lib.sde_segmap_spilled(s) == 0


def test_bad_sizes_are_refused():
    out = ffi.new("sde_segmap **")
    assert lib.sde_segmap_new(0, out) < 0
    assert lib.sde_segmap_new(1 << 40, out) < 0
