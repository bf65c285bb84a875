"""Compute commands through a real daemon: quantization in the drive, dequantization in the
drive, prefix matching by keys and by tokens, pins, and the TOPS budget's device time."""

from __future__ import annotations

import numpy as np
import pytest

import hostlib
from firmware.cost import ComputeProfile, TopsBudget, quantize_cost
from firmware.quant import dequantize
from hostlib.prefix_hash import chain_keys, root_key
from ssdemu.daemon_process import DaemonProcess
from ssdemu.profile import load


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    # no NAND timing here, so that a compute command's device time is the firmware's alone
    # (tests/test_daemon_timing.py covers the two together)
    d = DaemonProcess(str(tmp_path_factory.mktemp("c") / "sde.sock"), media="mem:256M",
                      extra=["--timing", "off"])
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
    out = np.empty_like(x)
    dev.kv_get_dequantized(key, out)  # or the drive does it
    assert np.array_equal(out, host)
    err = np.abs(out.view(np.float16).astype(np.float32) - x.view(np.float16).astype(np.float32))
    assert err.max() < 1.0


def test_in_drive_compute_time_is_the_cost_models(dev):
    x = block(seed=1)
    profile = load("star2000d")
    budget = TopsBudget(ComputeProfile(profile.compute.tops, profile.compute.units,
                                       profile.compute.memory_bytes_per_s))
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
    with pytest.raises(hostlib.InvalidCommandError):
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
    from ssdemu.queue_layout import OPCODES

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
