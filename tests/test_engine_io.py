"""Real O_DIRECT I/O through io_uring on file (tmpfs, ext4), mem and loop block media."""

import errno

import numpy as np
import pytest
from conftest import MEDIA_KINDS, SHARED_MEMORY_KINDS, media_of_kind
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssdemu.device.buffers import address_of, alloc_aligned
from ssdemu.device.engine import (
    IO_DTYPE,
    IOF_SHORT,
    IOVEC_DTYPE,
    OP_FSYNC,
    OP_READ,
    OP_READV,
    OP_WRITE,
    OP_WRITEV,
    Engine,
    ffi,
    make_ios,
)
from ssdemu.device.media import open_media
from ssdemu.errors import EngineError

SLOT = 1 << 20  # each I/O of a batch gets its own 1 MiB slot, so in-flight I/Os never overlap

io_batches = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=SLOT // 512),  # size in 512 B sectors
        st.integers(min_value=0, max_value=SLOT // 512 - 1),  # offset in slot, sectors
    ),
    min_size=1, max_size=48,
)

# every media kind; shared memory both ways: its I/O in the caller's thread (the default)
# and through io_uring's workers (SDE_ENG_NO_INLINE); elsewhere io_uring either way
ENGINE_CASES = [(kind, True) for kind in MEDIA_KINDS] + [
    (kind, False) for kind in SHARED_MEMORY_KINDS]


@pytest.fixture(params=ENGINE_CASES,
                ids=[k + ("" if inline else "-io_uring") for k, inline in ENGINE_CASES])
def engine(request):
    kind, inline = request.param
    with media_of_kind(kind, request) as spec:
        media = open_media(spec)
        eng = Engine(media, queue_depth=128, inline=inline)
        assert eng.stats()["inline_io"] == (inline and kind in SHARED_MEMORY_KINDS)
        yield eng
        eng.close()
        media.close()


def _batch(op, bufs, offsets, buf_index=-1):
    ios = make_ios(len(bufs))
    for i, (b, off) in enumerate(zip(bufs, offsets, strict=True)):
        ios[i]["op"] = op
        ios[i]["addr"] = address_of(b)
        ios[i]["len"] = b.nbytes
        ios[i]["offset"] = off
        ios[i]["buf_index"] = buf_index
    return ios


@settings(deadline=None, max_examples=12,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=io_batches, qd=st.sampled_from([1, 2, 8, 32, 128]), seed=st.integers(0, 2**32 - 1),
       register=st.booleans())
def test_round_trip_bit_exact(engine, batch, qd, seed, register):
    lba = engine.media.lba_size
    rng = np.random.default_rng(seed)
    nslots = engine.media.size // SLOT
    slots = rng.choice(nslots, size=len(batch), replace=False)
    sizes = [max(lba, (n * 512) // lba * lba) for n, _ in batch]
    offsets = [int(s) * SLOT + min((o * 512) // lba * lba, SLOT - size)
               for s, (_, o), size in zip(slots, batch, sizes, strict=True)]
    writes = [alloc_aligned(n) for n in sizes]
    for w in writes:
        w[:] = rng.integers(0, 256, w.nbytes, dtype=np.uint8)
    reads = [alloc_aligned(n) for n in sizes]
    eng = Engine(engine.media, queue_depth=qd)
    try:
        if register:
            pool = writes + reads
            assert eng.register_buffers(pool) is True
        wi = _batch(OP_WRITE, writes, offsets)
        ri = _batch(OP_READ, reads, offsets)
        if register:
            wi["buf_index"] = np.arange(len(writes))
            ri["buf_index"] = np.arange(len(writes), 2 * len(writes))
        eng.run(wi)
        assert list(wi["res"]) == sizes
        eng.run(ri)
        assert list(ri["res"]) == sizes
        for w, r in zip(writes, reads, strict=True):
            assert np.array_equal(w, r)
        assert (ri["lat_ns"] > 0).all()
        assert eng.stats()["unregistered_fallback_ios"] == 0
    finally:
        eng.close()


def test_vectored_round_trip(engine):
    parts = [alloc_aligned(n) for n in (4096, 512, 65536)]
    for i, p in enumerate(parts):
        p[:] = i + 1
    iov = np.zeros(len(parts), dtype=IOVEC_DTYPE)
    iov["base"] = [address_of(p) for p in parts]
    iov["len"] = [p.nbytes for p in parts]
    ios = make_ios(1)
    ios["op"], ios["addr"], ios["len"], ios["offset"] = OP_WRITEV, address_of(iov), 3, 8192
    engine.run(ios)
    assert ios["res"][0] == sum(p.nbytes for p in parts)
    back = alloc_aligned(sum(p.nbytes for p in parts))
    assert engine.pread(back, 8192) == back.nbytes
    assert np.array_equal(back, np.concatenate(parts))
    out = [alloc_aligned(p.nbytes) for p in parts]
    iov["base"] = [address_of(p) for p in out]
    ios["op"] = OP_READV
    engine.run(ios)
    assert all(np.array_equal(a, b) for a, b in zip(parts, out, strict=True))


def _one(engine, op, buf_addr, length, offset, buf_index=-1):
    ios = make_ios(1)
    ios["op"], ios["addr"], ios["len"], ios["offset"] = op, buf_addr, length, offset
    ios["buf_index"] = buf_index
    engine.run(ios)
    return int(ios["res"][0]), int(ios["flags"][0])


@pytest.mark.parametrize("what", ["offset", "length", "buffer"])
def test_misaligned_is_einval(engine, what):
    buf = alloc_aligned(8192)
    addr, length, offset = address_of(buf), 4096, 4096
    if what == "offset":
        offset += 100
    elif what == "length":
        length = 1000
    else:
        addr += 8
    for op in (OP_READ, OP_WRITE):
        res, _ = _one(engine, op, addr, length, offset)
        assert res == -errno.EINVAL


def test_alignment_is_at_least_512_even_where_kernel_accepts_less(engine):
    """tmpfs and memfd would take 4-byte alignment; the drive never bounces silently."""
    buf = alloc_aligned(4096)
    assert _one(engine, OP_READ, address_of(buf), 256, 0)[0] == -errno.EINVAL


def test_zero_length_and_null_buffer(engine):
    buf = alloc_aligned(4096)
    assert _one(engine, OP_READ, address_of(buf), 0, 0)[0] == -errno.EINVAL
    assert _one(engine, OP_READ, 0, 4096, 0)[0] == -errno.EFAULT


def test_offset_past_end_is_enxio(engine):
    buf = alloc_aligned(4096)
    size = engine.media.size
    assert _one(engine, OP_READ, address_of(buf), 4096, size + 4096)[0] == -errno.ENXIO
    assert _one(engine, OP_WRITE, address_of(buf), 4096, size + 4096)[0] == -errno.ENXIO
    with pytest.raises(EngineError, match="past the end"):
        engine.pread(buf, size + 4096)


def test_read_at_end_returns_zero_bytes_short(engine):
    buf = alloc_aligned(4096)
    res, flags = _one(engine, OP_READ, address_of(buf), 4096, engine.media.size)
    assert res == 0 and flags & IOF_SHORT


def test_write_at_end_is_enospc(engine):
    buf = alloc_aligned(4096)
    assert _one(engine, OP_WRITE, address_of(buf), 4096, engine.media.size)[0] == -errno.ENOSPC


def test_io_crossing_end_is_short(engine):
    lba = engine.media.lba_size
    buf = alloc_aligned(4 * lba)
    buf[:] = 0xAB
    start = engine.media.size - lba
    res, flags = _one(engine, OP_WRITE, address_of(buf), 4 * lba, start)
    assert res == lba and flags & IOF_SHORT
    back = alloc_aligned(4 * lba)
    res, flags = _one(engine, OP_READ, address_of(back), 4 * lba, start)
    assert res == lba and flags & IOF_SHORT
    assert (back[:lba] == 0xAB).all()
    assert engine.stats()["short_ios"] == 2


def test_last_block_reads_whole(engine):
    lba = engine.media.lba_size
    buf = alloc_aligned(lba)
    res, flags = _one(engine, OP_READ, address_of(buf), lba, engine.media.size - lba)
    assert res == lba and not flags & IOF_SHORT


def test_fixed_buffer_bounds_checked(engine):
    buf = alloc_aligned(8192)
    assert engine.register_buffers([buf])
    # inside the buffer: fine; running past its end or another index: EFAULT
    assert _one(engine, OP_READ, address_of(buf), 8192, 0, buf_index=0)[0] == 8192
    assert _one(engine, OP_READ, address_of(buf) + 4096, 8192, 0, buf_index=0)[0] == -errno.EFAULT
    assert _one(engine, OP_READ, address_of(buf), 4096, 0, buf_index=1)[0] == -errno.EFAULT


def test_bad_opcode_and_fsync(engine):
    buf = alloc_aligned(4096)
    assert _one(engine, 99, address_of(buf), 4096, 0)[0] == -errno.EINVAL
    assert _one(engine, OP_FSYNC, 0, 0, 0)[0] == 0


def test_errors_never_stop_the_batch(engine):
    """A batch mixing bad and good I/Os completes all of them, each with its own result."""
    good = alloc_aligned(4096)
    ios = make_ios(3)
    ios["op"] = OP_READ
    ios["addr"] = [address_of(good), address_of(good) + 1, address_of(good)]
    ios["len"] = 4096
    ios["offset"] = [0, 0, engine.media.size + 4096]
    engine.run(ios)
    assert list(ios["res"]) == [4096, -errno.EINVAL, -errno.ENXIO]


def test_submit_reap_async_out_of_order_safe(engine):
    bufs = [alloc_aligned(4096) for _ in range(64)]
    ios = _batch(OP_READ, bufs, [i * 4096 for i in range(64)])
    ios["user_data"] = np.arange(64)
    done = 0
    taken = 0
    while done < 64:
        if taken < 64:
            taken += engine.submit(ios[taken:])
        done += engine.reap(1)
    assert (ios["res"] == 4096).all()
    assert engine.inflight == 0
    assert list(ios["user_data"]) == list(range(64))


def test_completions_come_in_the_order_queued_and_writes_land_in_it(engine):
    """Completions made without the ring (inline I/O, failed validation) are reaped first
    in first out, and on shared memory a write queued later overwrites an earlier one at
    the same offset, as io_uring's one worker for the file did."""
    bufs = [alloc_aligned(4096) for _ in range(48)]
    for i, b in enumerate(bufs):
        b[:] = i
    ios = _batch(OP_WRITE, bufs, [8192] * 48)
    ios[5]["len"] = 100  # misaligned: fails validation, completes without the kernel
    ios["user_data"] = np.arange(48)
    assert engine.submit(ios) == 48
    order = []
    while engine.inflight:
        n = engine.reap(1)
        order += [engine._reaped[i].user_data for i in range(n)]
    assert sorted(order) == list(range(48))
    if engine.stats()["inline_io"]:
        assert order == list(range(48))
        back = alloc_aligned(4096)
        assert engine.pread(back, 8192) == 4096
        assert (back == 47).all()
    assert ios["res"][5] == -errno.EINVAL and (np.delete(ios["res"], 5) == 4096).all()


@pytest.mark.parametrize("engine", [(kind, True) for kind in SHARED_MEMORY_KINDS],
                         ids=list(SHARED_MEMORY_KINDS), indirect=True)
def test_a_write_waits_for_the_rings_writes_rather_than_running_inline(engine):
    """On shared memory a write past the inline size goes to io_uring's worker, which holds
    the file's lock while it copies: a small write queued behind it goes to the ring too
    (run inline, it would stall the caller for every large write queued), and runs inline
    again once the ring's writes are reaped.  Reads never wait: they take no such lock."""
    assert engine.stats()["inline_io"]
    big, small, back = alloc_aligned(1 << 20), alloc_aligned(4096), alloc_aligned(4096)
    big[:], small[:] = 1, 2
    before = engine.stats()["inline_ios"]
    ios = _batch(OP_WRITE, [big, small], [0, 2 << 20])
    reads = _batch(OP_READ, [back], [4 << 20])
    assert engine.submit(ios) == 2 and engine.submit(reads) == 1
    assert engine.stats()["inline_ios"] == before + 1  # the read alone
    while engine.inflight:
        engine.reap(1)
    assert (ios["res"] == [1 << 20, 4096]).all() and reads["res"][0] == 4096
    assert engine.pwrite(small, 3 << 20) == 4096
    assert engine.stats()["inline_ios"] == before + 2  # no ring write in flight: inline


def test_io_dtype_matches_c_layout():
    assert IO_DTYPE.itemsize == ffi.sizeof("sde_io") == 48
    for name, field in ffi.typeof("sde_io").fields:
        assert IO_DTYPE.fields[name][1] == field.offset


def test_ios_must_have_engine_dtype(engine):
    with pytest.raises(TypeError, match="IO_DTYPE"):
        engine.run(np.zeros(4, dtype=np.uint64))


def test_queue_depth_validated(media_spec):
    with open_media(media_spec) as m:
        with pytest.raises(EngineError, match="EINVAL"):
            Engine(m, queue_depth=0)


FALLBACK_SCRIPT = """
import json, os, resource
from ssdemu.device.buffers import address_of, alloc_aligned
from ssdemu.device.engine import Engine
from ssdemu.device.media import open_media
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # drop CAP_IPC_LOCK with root
m = open_media("mem:8M")
e = Engine(m, 8, inline=False)  # io_uring's fixed buffers (inline I/O has none)
buf = alloc_aligned(4 << 20)
buf[:] = 7
ok = e.register_buffers([buf])
n = e.pwrite(buf[:4096], 0, buf_index=0)
back = alloc_aligned(4096)
e.pread(back, 0)
print(json.dumps({"registered": ok, "wrote": n, "same": bool((back == 7).all()), **e.stats()}))
"""


def test_register_failure_falls_back_and_counts():
    """Over the locked-memory limit, registration fails, is reported, and I/O still works."""
    import json
    import os
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid with a small RLIMIT_MEMLOCK")
    proc = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], capture_output=True,
                          text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["registered"] is False
    assert out["register_error"] == -errno.ENOMEM
    assert out["wrote"] == 4096 and out["same"]
    assert out["unregistered_fallback_ios"] == 1
    assert out["buffers_registered"] == 0


def test_sqpoll_round_trip(media_spec):
    """With an SQ polling thread the kernel picks submissions up without a syscall."""
    with open_media(media_spec) as m:
        eng = Engine(m, queue_depth=16, sqpoll=True, inline=False)
        try:
            assert eng.stats()["sqpoll"] == 1
            buf = alloc_aligned(65536)
            buf[:] = np.arange(65536, dtype=np.uint32).astype(np.uint8)
            assert eng.pwrite(buf, 1 << 20) == 65536
            back = alloc_aligned(65536)
            assert eng.pread(back, 1 << 20) == 65536
            assert np.array_equal(buf, back)
        finally:
            eng.close()


def test_register_refused_with_io_in_flight(engine):
    bufs = [alloc_aligned(4096) for _ in range(4)]
    ios = _batch(OP_READ, bufs, [0, 4096, 8192, 12288])
    engine.submit(ios)
    with pytest.raises(EngineError, match="in flight"):
        engine.register_buffers(bufs)
    while engine.inflight:
        engine.reap(1)
    assert (ios["res"] == 4096).all()
