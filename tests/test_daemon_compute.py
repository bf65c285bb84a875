"""Compute commands through a real daemon: quantization in the drive, dequantization in the
drive, prefix matching by keys and by tokens, pins, and the TOPS budget's device time."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from conftest import RING_KINDS, check_media_io, daemon_with_sitecustomize, ring_media

import hostlib
from firmware.quant import dequantize
from hostlib.prefix_hash import chain_keys, root_key
from ssdemu.sim.cost import quantize_cost
from ssdemu.sim.profile import load
from ssdemu.sim.timing import budget_of
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire.layout import STATUS


@pytest.fixture(scope="module", params=list(RING_KINDS))
def dev(tmp_path_factory, request):
    # no NAND timing here, so that a compute command's device time is the firmware's alone
    # (tests/test_daemon_timing.py covers the two together).  On memory media, a file on
    # ext4 and a block device (the last two through io_uring)
    with ring_media(request.param, 256 << 20) as (spec, media_io):
        d = DaemonProcess(str(tmp_path_factory.mktemp("c") / "sde.sock"), media=spec,
                          extra=["--timing", "off"])
        check_media_io(d.socket_path, media_io)
        with hostlib.connect(d.socket_path) as device:
            yield device
        code, err = d.terminate()
        assert code == 0, err


def block(shape=(160, 2, 2, 4, 64), seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float16)
    return x.view(np.uint16)


@pytest.mark.parametrize("scheme", ["int8_g64", "int4_g32", "int8_g128_sym",
                                    "kivi4_g32_r128", "fp8_head"])
def test_quantize_in_drive_round_trip(dev, scheme):
    x = block()
    key = f"q/{scheme}".encode()[:16]
    size = dev.kv_put_quantized(key, x, "fp16", scheme)
    compressed = dev.kv_get(key)
    assert len(compressed) == size < x.nbytes
    host, dtype = dequantize(compressed)  # the host can dequantize what the drive stored
    assert dtype == "fp16"
    # the scheme asked for is the one stored (not some default that also round-trips)
    from firmware.blockfmt import open_block
    from firmware.quant import compressed_nbytes, parse_scheme

    header, _ = open_block(compressed)
    want = parse_scheme(scheme)
    assert (header.bits, header.group if want.kind != "fp8" else 0, header.symmetric,
            header.per_head) == (want.bits, want.group, want.symmetric, want.per_head)
    assert {1: "int", 2: "kivi", 3: "fp8"}[header.scheme] == want.kind
    assert size == compressed_nbytes(header.shape, want, "fp16")
    out = np.empty_like(x)
    dev.kv_get_dequantized(key, out)  # or the drive does it
    assert np.array_equal(out, host)
    err = np.abs(out.view(np.float16).astype(np.float32) - x.view(np.float16).astype(np.float32))
    assert err.max() < 1.0


def test_in_drive_compute_time_is_the_cost_models(dev):
    x = block(seed=1)
    profile = load("star2000d")
    budget = budget_of(profile)
    size = dev.kv_put_quantized(b"timed", x, "fp16", "int8_g64")
    cost = quantize_cost(x.size, 2, "int8_g64", size)
    assert dev.qp.last_device_ns == int(budget.device_ns(cost))  # the units were idle
    page = dev.log()["compute"]["quantize"]
    assert page["calls"] >= 1 and page["host_ns"] > 0


def test_prefix_match_by_keys_and_by_tokens(dev):
    root = root_key("llama-3-8b", tenant="t1")
    tokens = list(range(1000, 1000 + 16 * 10))
    keys = chain_keys(tokens, 16, root)
    for k in keys[:6]:
        dev.kv_put(k, b"kv")
    assert dev.prefix_match(keys) == 6
    assert dev.prefix_match(keys[1:]) == 5
    assert dev.prefix_match([keys[7]] + keys) == 0
    # the drive hashes the tokens itself, bit-identically to hostlib
    assert dev.prefix_match_tokens(tokens, 16, root) == 6
    assert dev.prefix_match_tokens(tokens[:16 * 3 + 5], 16, root) == 3  # partial block: no key
    assert dev.prefix_match_tokens(tokens, 16, root_key("other")) == 0
    dev.kv_delete(keys[2])
    assert dev.prefix_match(keys) == 2


def test_pins(dev):
    k = chain_keys(list(range(16)), 16, root_key("pin"))[0]
    dev.kv_put(k, b"x")
    assert dev.pin(k) == 1 and dev.pin(k) == 2
    with pytest.raises(hostlib.KeyPinnedError):
        dev.kv_delete(k)  # a pinned block cannot be deleted
    assert dev.unpin(k) == 1 and dev.unpin(k) == 0
    with pytest.raises(hostlib.InvalidCommandError):
        dev.unpin(k)
    with pytest.raises(hostlib.KeyNotFoundError):
        dev.pin(b"\x01" * 16)
    with pytest.raises(hostlib.InvalidKeySizeError):
        dev.pin(b"short")
    dev.kv_delete(k)
    with pytest.raises(hostlib.KeyNotFoundError):
        dev.pin(k)


def test_bad_compute_commands(dev):
    from ssdemu_wire.layout import OPCODES

    x = block()
    with pytest.raises(hostlib.InvalidCommandError):
        dev.kv_put_quantized(b"bad", x, "fp16", "int3_g64")
    nan = x.copy()
    nan.reshape(-1)[5] = 0x7E00  # fp16 NaN
    with pytest.raises(hostlib.InvalidCommandError):
        dev.kv_put_quantized(b"bad", nan, "fp16", "int8_g64")
    dev.kv_put(b"plain", b"not a compressed block")
    with pytest.raises(hostlib.InvalidCommandError):
        dev.kv_get_dequantized(b"plain", np.empty(16, np.uint8))
    with pytest.raises(hostlib.InvalidCommandError):
        dev.prefix_match_tokens(list(range(32)), 17, root_key("m"))
    with pytest.raises(hostlib.InvalidCommandError):  # no request header
        buf = dev.alloc(4096)
        h, off = dev._locate(buf)
        dev.submit(OPCODES["KV_STORE_QUANTIZED"], "raw", buf=h, buf_offset=off, length=4096,
                   lba=1, param1=1).result()
    assert not dev.kv_exists(b"bad")


# ---- the compute commands in the data plane (firmware threads, zero copy) ----------------


def _raw(dev, opcode, key=b"", **fields):
    """A raw command (fields as in sde_sqe); returns (status, result)."""
    from hostlib.client import _key_fields

    f = dev.submit(opcode, "raw", **(_key_fields(key) if key else {}), **fields)
    while not f.done():
        f.qp.wait(None)
    return f.status, f.value


def test_compute_from_and_into_registered_buffers_copies_nothing(dev):
    """A block in a Device.alloc buffer is quantized where it lies (the request travels
    apart), and a dequantized block lands straight in the client's buffer."""
    x = block((512, 2, 2, 2, 64), seed=9)  # 512 KiB
    src = dev.alloc(x.nbytes).view(np.uint16).reshape(x.shape)
    src[:] = x
    before = dev.log()["classes"]["compute"]
    size = dev.kv_put_quantized(b"zc", src, "fp16", "int8_g64")
    out = dev.alloc(x.nbytes).view(np.uint16).reshape(x.shape)
    dev.kv_get_dequantized(b"zc", out)
    after = dev.log()["classes"]["compute"]
    assert after["commands"] - before["commands"] == 2
    assert after["bytes_copied"] == before["bytes_copied"]  # nothing copied by the daemon
    host, _ = dequantize(dev.kv_get(b"zc"))
    assert len(dev.kv_get(b"zc")) == size and np.array_equal(out, host)


def test_a_block_larger_than_the_bounce_from_a_registered_buffer(dev):
    """8 MiB of fp16 (past the old 4 MiB - 64 B limit), quantized in place."""
    x = block((1024, 2, 4, 8, 64), seed=3)
    assert x.nbytes == 8 << 20
    src = dev.alloc(x.nbytes).view(np.uint16).reshape(x.shape)
    src[:] = x
    size = dev.kv_put_quantized(b"big", src, "fp16", "int4_g64")
    out = np.empty_like(x)
    dev.kv_get_dequantized(b"big", out)
    host, _ = dequantize(dev.kv_get(b"big"))
    assert size < x.nbytes // 3 and np.array_equal(out, host)
    # and from plain memory (through a temporary registered buffer)
    assert dev.kv_put_quantized(b"big2", x, "fp16", "int4_g64") == size


def test_raw_compute_commands_are_validated(dev):
    from ssdemu_wire.layout import OPCODES, STATUS, pack_quant_request

    x = block((32, 2, 2, 2, 64), seed=4)
    req = np.frombuffer(pack_quant_request(0, "int8_g64", 32, 2, 2, 64), np.uint8)
    buf = dev.alloc(64 + x.nbytes)
    h, off = dev._locate(buf)
    buf[:64] = req
    buf[64:] = x.reshape(-1).view(np.uint8)
    store = OPCODES["KV_STORE_QUANTIZED"]
    status, size = _raw(dev, store, b"ok", buf=h, buf_offset=off, length=buf.size)
    assert status == STATUS["SUCCESS"] and size == len(dev.kv_get(b"ok")) < x.nbytes
    # one element short, or one block too many: the shape and the bytes disagree
    assert _raw(dev, store, b"s", buf=h, buf_offset=off, length=buf.size - 2)[0] == \
        STATUS["KV_INVALID_VALUE_SIZE"]
    bad = buf.copy()
    for field, value in ((slice(0, 4), b"XXXX"), (slice(8, 16), b"int9_g64"),
                         (slice(40, 44), b"\0\0\0\0"),  # magic, scheme, zero tokens
                         (slice(56, 58), (4097).to_bytes(2, "little")),  # summary page
                         (slice(60, 61), b"\1")):  # a reserved byte
        buf[field] = np.frombuffer(value, np.uint8)
        assert _raw(dev, store, b"f", buf=h, buf_offset=off, length=buf.size)[0] == \
            STATUS["INVALID_FIELD"], value
        buf[:] = bad
    # the request apart, in another buffer of the client's: handle << 40 | offset
    other = dev.alloc(4096)
    oh, ooff = dev._locate(other)
    other[:64] = req
    assert _raw(dev, store, b"apart", buf=h, buf_offset=off + 64, length=x.nbytes,
                param0=(oh << 40) | ooff)[0] == STATUS["SUCCESS"]
    for param0 in ((999 << 40), (oh << 40) | (4096 - 32)):  # no such buffer; past its end
        assert _raw(dev, store, b"nb", buf=h, buf_offset=off + 64, length=x.nbytes,
                    param0=param0)[0] == STATUS["INVALID_BUFFER"]
    assert not dev.kv_exists(b"f") and not dev.kv_exists(b"nb") and not dev.kv_exists(b"s")
    # a dequantized retrieve into too small a buffer says how large a one it needs
    small = dev.alloc(4096)
    sh, soff = dev._locate(small)
    assert _raw(dev, OPCODES["KV_RETRIEVE_DEQUANTIZED"], b"ok", buf=sh, buf_offset=soff,
                length=4096) == (STATUS["KV_INVALID_VALUE_SIZE"], x.nbytes)
    with pytest.raises(hostlib.InvalidCommandError):  # the prefix match wants whole keys
        dev.submit(OPCODES["PREFIX_MATCH"], "raw", buf=sh, buf_offset=soff, length=15).result()


def test_compute_commands_in_flight_on_several_queue_pairs(dev):
    """Many quantized stores and dequantized retrieves at once, on four queue pairs: each
    block comes back as the host's own dequantization of what the drive stored."""
    qps = [dev.queue_pair() for _ in range(4)]
    blocks = [block((64, 2, 2, 2, 64), seed=100 + i) for i in range(32)]
    futs = [dev.kv_put_quantized_async(b"m%d" % i, b, "fp16", "kivi4_g32_r16" if i % 2
                                       else "fp8_head", qp=qps[i % 4])
            for i, b in enumerate(blocks)]
    for f in futs:
        f.result()
    outs = [np.empty_like(b) for b in blocks]
    futs = [dev.kv_get_dequantized_async(b"m%d" % i, outs[i], qp=qps[i % 4])
            for i in range(len(blocks))]
    for f in futs:
        f.result()
    for i, out in enumerate(outs):
        host, _ = dequantize(dev.kv_get(b"m%d" % i))
        assert np.array_equal(out, host), i


@pytest.mark.parametrize("scheme", ["int8_g64", "int4_g32", "int8_g128_sym", "fp8_head",
                                    "kivi4_g32_r128"])
def test_layout_2lt_is_honoured(dev, scheme):
    """A block in LMCache's (2, layers, tokens, heads, head_dim) order, quantized with layout
    2lt and dequantized, is exactly the drive-order round trip of the same values, given
    back in LMCache's order (integer schemes keep the order they are given; fp8 and KIVI
    take the rows in token order inside the drive)."""
    from firmware.blockfmt import FLAG_LAYOUT_2LT, open_block

    t2l = block((160, 2, 3, 2, 64), seed=7)
    lt = np.ascontiguousarray(t2l.transpose(1, 2, 0, 3, 4))  # (2, layers, tokens, heads, dim)
    k1, k2 = f"lay/t2l/{scheme}".encode()[:16], f"lay/2lt/{scheme}".encode()[:16]
    dev.kv_put_quantized(k1, t2l, "fp16", scheme)
    dev.kv_put_quantized(k2, lt, "fp16", scheme, layout="2lt")
    header, _ = open_block(dev.kv_get(k2))
    assert header.flags & FLAG_LAYOUT_2LT and (header.shape.tokens, header.shape.layers) == (160, 3)
    assert not open_block(dev.kv_get(k1))[0].flags & FLAG_LAYOUT_2LT
    out_t2l, out_lt = np.empty_like(t2l), np.empty_like(lt)
    dev.kv_get_dequantized(k1, out_t2l)
    dev.kv_get_dequantized(k2, out_lt)
    assert np.array_equal(out_lt, out_t2l.transpose(1, 2, 0, 3, 4))
    assert not np.array_equal(out_lt.reshape(-1), out_t2l.reshape(-1))  # the order differs


def test_an_unknown_layout_is_refused(dev):
    lt = block((16, 2, 2, 4, 64))
    with pytest.raises(ValueError, match="layout"):
        dev.kv_put_quantized(b"lay/bad", lt, "fp16", "int8_g64", layout="ltd")


# ---- KV_REQUANTIZE: a stored block demoted in place ------------------------------------


@pytest.mark.parametrize(("old", "new", "layout"), [("int8_g64", "int4_g64", "t2l"),
                                                    ("plain", "int8_g32_sym", "2lt"),
                                                    ("fp8_head", "kivi4_g32_r0", "t2l"),
                                                    ("int8_g64", "int4_g128_sym", "2lt"),
                                                    ("int4_g64", "int2_g64", "2lt"),
                                                    ("kivi4_g32_r16", "kivi2_g32_r16", "t2l")])
def test_requantize_in_drive_is_the_firmwares(dev, old, new, layout):
    """The drive's demotion is, byte for byte, the firmware's requantize of the block it
    held (in either of the host's layouts), its result the new size, and a dequantized
    retrieve gives the lower scheme's values back in the host's order."""
    from firmware.blockfmt import FLAG_LAYOUT_2LT, open_block
    from firmware.quant import requantize

    x = block((96, 2, 2, 2, 64), seed=21)
    if layout == "2lt":
        x = np.ascontiguousarray(x.transpose(1, 2, 0, 3, 4))
    key = f"rq/{old}/{layout}".encode()[:16]
    dev.kv_put_quantized(key, x, "fp16", old, layout=layout, summary_page=16)
    stored = dev.kv_get(key)
    size = dev.kv_requantize(key, new)
    now = dev.kv_get(key)
    assert size == len(now) < len(stored)
    assert np.array_equal(np.frombuffer(now, np.uint8), requantize(stored, new))
    out = np.empty_like(x)
    dev.kv_get_dequantized(key, out)
    assert np.array_equal(out.reshape(-1), dequantize(now)[0].reshape(-1))  # the host's order
    assert open_block(now)[0].flags & FLAG_LAYOUT_2LT == (FLAG_LAYOUT_2LT if layout == "2lt"
                                                          else 0)
    page = dev.log()["compute"]["requantize"]
    assert page["calls"] >= 1 and page["host_ns"] > 0


def test_requantize_refuses_what_is_not_a_demotion(dev):
    from ssdemu_wire.layout import OPCODES, STATUS

    x = block((64, 2, 2, 2, 64), seed=22)
    dev.kv_put_quantized(b"rq/bad", x, "fp16", "int4_g64")
    stored = dev.kv_get(b"rq/bad")
    dev.kv_put(b"rq/bytes", b"not a compressed block" * 40)
    for key, scheme, status in ((b"rq/bad", "int8_g64", "INVALID_FIELD"),  # higher
                                (b"rq/bad", "int4_g64", "INVALID_FIELD"),  # the same
                                (b"rq/bad", "int9_g64", "INVALID_FIELD"),  # unknown
                                (b"rq/bytes", "int4_g64", "INVALID_FIELD"),  # not a block
                                (b"rq/none", "int4_g64", "KV_KEY_NOT_EXIST")):
        with pytest.raises(hostlib.DeviceError) as e:
            dev.kv_requantize(key, scheme)
        assert e.value.status_name == status, (key, scheme)
    assert dev.kv_get(b"rq/bad") == stored  # nothing refused changed anything
    with pytest.raises(ValueError, match="1 to 32 ASCII"):
        dev.kv_requantize(b"rq/bad", "x" * 33)
    buf = dev.alloc(4096)
    h, off = dev._locate(buf)
    for length in (0, 33):  # the name's length, checked by the drive too
        assert _raw(dev, OPCODES["KV_REQUANTIZE"], b"rq/bad", buf=h, buf_offset=off,
                    length=length)[0] == STATUS["INVALID_FIELD"]
    assert _raw(dev, OPCODES["KV_REQUANTIZE"], b"rq/bad", buf=999, buf_offset=0,
                length=8)[0] == STATUS["INVALID_BUFFER"]


def test_requantize_never_overwrites_a_newer_value(dev):
    """A requantize racing a put of the same key from another client: whatever the order,
    the key ends holding the put's block or that block demoted, never the old one demoted
    (the drive stores its result only if the key still holds what it read: ABORTED)."""
    from firmware.quant import quantize, requantize

    other = dev.queue_pair()
    outcomes = set()
    for i in range(24):
        key = b"rq/race"
        dev.kv_put_quantized(key, block((64, 2, 2, 2, 64), seed=300 + i), "fp16", "int8_g64")
        newer = block((64, 2, 2, 2, 64), seed=400 + i)
        rq = dev.kv_requantize_async(key, "int4_g64")
        put = dev.kv_put_quantized_async(key, newer, "fp16", "int8_g64", qp=other)
        put.result()
        try:
            rq.result()
            outcomes.add("requantized")
        except hostlib.AbortedError:
            outcomes.add("aborted")
        final = np.frombuffer(dev.kv_get(key), np.uint8)
        newer_blob = quantize(newer, "fp16", "int8_g64")
        assert (np.array_equal(final, newer_blob)
                or np.array_equal(final, requantize(newer_blob, "int4_g64"))), (i, outcomes)
    assert outcomes


def test_a_requantize_overtaken_by_a_put_or_a_delete_is_aborted(dev):
    """A put or a delete from another client lands while the drive requantizes a large
    block (its kernel takes milliseconds): the requantize ends ABORTED, the put's value
    stays and the deleted key stays deleted (a demotion never brings a key back)."""
    x = block((2048, 2, 2, 4, 64), seed=23)  # 4 MiB
    other = dev.queue_pair()
    outcomes = []
    for i in range(6):
        dev.kv_put_quantized(b"rq/overtaken", x, "fp16", "int8_g64")
        rq = dev.kv_requantize_async(b"rq/overtaken", "int4_g64")
        newer = b"newer %d " % i * 100 if i % 2 else None
        if newer is None:
            dev.kv_delete_async(b"rq/overtaken", qp=other).result()
        else:
            dev.kv_put_async(b"rq/overtaken", newer, qp=other).result()
        try:
            rq.result()
            outcomes.append("requantized")
        except hostlib.AbortedError:
            outcomes.append("aborted")
        except (hostlib.InvalidCommandError, hostlib.KeyNotFoundError):
            outcomes.append("came second")  # the change landed first: nothing to demote
        if newer is None:
            assert not dev.kv_exists(b"rq/overtaken"), outcomes
        else:
            assert dev.kv_get(b"rq/overtaken") == newer, outcomes
    # one that finished before the change landed is fine too: the change then overwrote it
    assert "aborted" in outcomes, outcomes


def _maps_llvm(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "llvmlite" in f.read()


def test_the_firmware_is_loaded_by_the_first_compute_command(tmp_path):
    """A daemon loads the firmware's compiled code (Numba, LLVM) when a command first needs
    it, not at start: one that serves only block and KV commands never maps it."""
    d = DaemonProcess(str(tmp_path / "f.sock"), media="mem:64M")
    try:
        with hostlib.connect(d.socket_path) as dev:
            dev.kv_put(b"k", b"v" * 4096)
            assert dev.kv_get(b"k") == b"v" * 4096
            assert not _maps_llvm(d.pid)
            x = block((16, 2, 1, 1, 64), seed=9)
            size = dev.kv_put_quantized(b"q", x, "fp16", "int8_g64")
            assert _maps_llvm(d.pid) and len(dev.kv_get(b"q")) == size
            out = np.empty_like(x)
            dev.kv_get_dequantized(b"q", out)
            assert np.array_equal(out, dequantize(dev.kv_get(b"q"))[0])
    finally:
        code, err = d.terminate()
    assert code == 0, err


# imported by the daemon's interpreter at start (sitecustomize): the firmware's compiled
# entry points cannot be imported, as when its build or its kernel cache is broken
WITHHOLD_FIRMWARE = '''
import sys


class _Withhold:
    def find_spec(self, name, path=None, target=None):
        if name == "firmware.entry":
            raise ImportError("withheld by the test")
        return None


sys.meta_path.insert(0, _Withhold())
'''


def test_a_firmware_that_cannot_load_fails_its_commands_and_nothing_else(tmp_path,
                                                                          monkeypatch):
    """The loader fails (its import raises): each compute command ends INTERNAL, the log
    says why, and the daemon serves everything else on."""
    d, log = daemon_with_sitecustomize(tmp_path, monkeypatch, WITHHOLD_FIRMWARE)
    try:
        with hostlib.connect(d.socket_path) as dev:
            x = block((16, 2, 1, 1, 64), seed=9)
            for _ in range(2):  # the first command's load failed; so does the next one's
                with pytest.raises(hostlib.DeviceError) as e:
                    dev.kv_put_quantized(b"q", x, "fp16", "int8_g64")
                assert e.value.status == STATUS["INTERNAL"]
            assert not dev.kv_exists(b"q")
            dev.kv_put(b"k", b"v" * 4096)  # block and KV commands are served
            assert dev.kv_get(b"k") == b"v" * 4096
            dev.nop()
            assert d.proc.poll() is None
    finally:
        code, err = d.terminate()
    assert code == 0, err
    text = log.read_text()
    assert "could not be loaded" in text and "withheld by the test" in text


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])  # minflt, field 10


def test_the_daemons_own_buffers_are_kept_not_faulted_in_again(tmp_path):
    """A dequantized retrieve's compressed input (as a quantized store's output) goes through
    a buffer of the daemon's own: each context keeps its last one (c/dev/dev_bounce.c), so
    that 160 retrieves of a 1 MiB block, 16 in flight at a time, fault in next to none of
    the daemon's pages after a warm-up (a fresh buffer per command, handed back to the
    kernel by glibc's trimming of the heap, faulted in ~135 pages every time: 21,580)."""
    d = DaemonProcess(str(tmp_path / "s.sock"), media="mem:256M", extra=["--timing", "off"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            x = block((512, 2, 2, 4, 64), seed=3)
            src = dev.alloc(x.nbytes).view(np.uint16).reshape(x.shape)
            src[...] = x
            qd, rounds_ = 16, 10
            outs = [dev.alloc(x.nbytes).view(np.uint16).reshape(x.shape) for _ in range(qd)]

            for i in range(qd):  # the blocks, each its own
                src[0, 0, 0, 0, 0] = i
                dev.kv_put_quantized(b"r%d" % i, src, "fp16", "int8_g64")

            def rounds(n):  # QD retrieves in flight at once, as an engine's loads are
                for _ in range(n):
                    fs = [dev.kv_get_dequantized_async(b"r%d" % i, outs[i]) for i in range(qd)]
                    for f in fs:
                        f.result()

            rounds(6)
            before = _minor_faults(d.pid)
            rounds(rounds_)
            faults = _minor_faults(d.pid) - before
            for i in (0, qd - 1):
                host, _ = dequantize(dev.kv_get(b"r%d" % i))
                assert np.array_equal(outs[i], host)
            pages = len(dev.kv_get(b"r0")) // mmap.PAGESIZE  # one compressed block's buffer
    finally:
        code, err = d.terminate()
    assert code == 0, err
    # a tenth of a buffer per retrieve: a context first used after the warm-up (on a busy
    # host more commands pile up at once, and go deeper into the context stack) faults its
    # buffer in once, and a CI run beside LMCache's tests saw 1,022 such faults in 160
    # retrieves; a fresh buffer per command is a whole one each time (~21,600)
    assert faults < rounds_ * qd * pages // 10, \
        f"{faults} page faults in {rounds_ * qd} retrieves of {pages}-page blocks"
