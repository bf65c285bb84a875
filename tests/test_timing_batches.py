"""A request's blocks booked as one batch (c/model, "batches": the dies die by die, on
one thread or two, everything else block by block) give exactly what booking the blocks one
after the other gives: every completion, every resource's next free time, every counter."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ssdemu.sim import _model
from ssdemu.sim.cost import dequantize_cost, quantize_cost
from ssdemu.sim.profile import available, load
from ssdemu.sim.timing import DeviceModel, budget_of

ffi, lib = _model.ffi, _model.lib
SCHEME = "int8_g64"


def _drive(profile, threads: int | None, bulk_pages: int):
    """A timing model and its budget sharing its DRAM (as model-mode replay's drive)."""
    m = DeviceModel(profile, bulk_pages=bulk_pages, threads=threads or 1)
    b = budget_of(profile)
    b.share_dram(m)
    return m, b


def _load_one_by_one(m, b, t, offs, stored, raw, in_drive, cost) -> float:
    last = t
    sensed, pieces = ffi.new("double *"), ffi.new("uint32_t *")
    for off in offs:
        if in_drive:
            ready = lib.sde_recipe_dq_sense(m.handle, t, off, stored, sensed, pieces)
            done = lib.sde_recipe_dq_finish(m.handle, b.struct, ready, sensed[0], pieces[0],
                                            cost, 0.0, raw)
        else:
            done = lib.sde_model_read(m.handle, t, off, stored)
        last = max(last, done)
    return last


def _store_one_by_one(m, b, t, offs, stored, raw, quantized, cost) -> list[float]:
    out = []
    received, first, pieces = ffi.new("double *"), ffi.new("double *"), ffi.new("uint32_t *")
    for off in offs:
        if quantized:
            ready = lib.sde_recipe_q_receive(m.handle, t, raw, received, pieces)
            ended = lib.sde_recipe_q_kernel(b.struct, ready, received[0], pieces[0], cost, 0.0,
                                            first)
            out.append(lib.sde_recipe_q_program(m.handle, first[0], ended, pieces[0], off,
                                                stored, ffi.NULL))
        else:
            out.append(lib.sde_model_write(m.handle, t, off, stored))
    return out


def _state(m, b) -> tuple:
    return (m.next_free_times(), m.stats(), b.busy_until_ns, b.busy_ns)


request = st.tuples(
    st.integers(0, 3_000_000),                       # ns since the last request
    st.booleans(),                                   # load, or store
    st.lists(st.integers(0, 2_000), min_size=1, max_size=9),  # blocks' slots
)


@settings(max_examples=30, deadline=None)
@given(profile=st.sampled_from(available()),
       rows=st.sampled_from([5, 300, 511, 512, 700, 1100]),  # around a stripe of 512 dies
       tail=st.integers(0, 15),                      # 4 KiB units past the last whole row
       quantized=st.booleans(), in_drive=st.booleans(),
       requests=st.lists(request, min_size=1, max_size=12))
def test_a_batch_books_what_its_blocks_book_one_by_one(profile, rows, tail, quantized,
                                                       in_drive, requests):
    """Random requests of loads and stores (blocks at 4 KiB-aligned slots, so that they start
    anywhere in a row and a stripe; sizes below, at and above a stripe) on a model with one
    thread, on one with two, and one block after another on a third: every completion and the
    whole state after each request are equal.  Fails if a die is booked with another block's
    place or page count, out of its blocks' order, or if a channel's senses go to another."""
    p = load(profile)
    row = p.nand.page_bytes * p.nand.planes_per_die
    stored = rows * row + tail * 4096
    raw = 2 * stored
    elements = raw // 2
    dq = dequantize_cost(elements, 2, SCHEME, stored).c()
    q = quantize_cost(elements, 2, SCHEME, stored).c()
    slot = -(-stored // 4096) * 4096 + 4096  # a 4 KiB gap between slots: rows start anywhere
    ref = _drive(p, None, bulk_pages=4)
    batched = {threads: _drive(p, threads, bulk_pages=4) for threads in (1, 2)}
    t = 1000.0
    for gap, is_load, slots in requests:
        t += gap
        offs = [s * slot for s in slots]
        c_offs = ffi.new("uint64_t[]", offs)
        if is_load:
            want = _load_one_by_one(*ref, t, offs, stored, raw, in_drive, dq)
            for m, b in batched.values():
                got = lib.sde_recipe_load_blocks(m.handle, b.struct, t, c_offs, len(offs),
                                                 stored, raw, int(in_drive), dq)
                assert got == want
        else:
            want = _store_one_by_one(*ref, t, offs, stored, raw, quantized, q)
            for m, b in batched.values():
                done = ffi.new("double[]", len(offs))
                lib.sde_recipe_store_blocks(m.handle, b.struct, t, c_offs, len(offs), stored,
                                            raw, int(quantized), q, done)
                assert list(done) == want
        state = _state(*ref)
        for m, b in batched.values():
            assert _state(m, b) == state


def test_a_batch_too_small_for_the_bulk_path_books_one_by_one():
    """Blocks below the bulk threshold take the page path (dies and channels alternate), so
    the recipe books them one after the other: the same figures."""
    p = load("star2000d")
    stored = 3 * p.nand.page_bytes
    ref, (m, b) = _drive(p, None, bulk_pages=64), _drive(p, 2, bulk_pages=64)
    offs = [0, 5 * stored, 2 * stored]
    dq = dequantize_cost(stored, 2, SCHEME, stored).c()
    want = _load_one_by_one(*ref, 500.0, offs, stored, 2 * stored, True, dq)
    got = lib.sde_recipe_load_blocks(m.handle, b.struct, 500.0, ffi.new("uint64_t[]", offs),
                                     3, stored, 2 * stored, 1, dq)
    assert got == want
    assert _state(m, b) == _state(*ref)


def test_threads_are_one_or_two():
    import pytest

    with pytest.raises(ValueError, match="1 or 2 threads"):
        DeviceModel(load("star2000d"), threads=3)
