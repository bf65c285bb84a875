"""The daemon's data plane on a device with 4 KiB logical sectors (a loop device made with
--sector-size 4096, as many NVMe drives are formatted): block I/O in 4 KiB units, KV values
of awkward sizes (through the bounce for their partial last sector), the in-drive quantizer
and dequantizer, pins, prefix matches, and all of it again after a restart.  Issue 33,
item 9: until now only the synchronous store API had run on such a device."""

from __future__ import annotations

import numpy as np
import pytest

import hostlib
from firmware.quant import dequantize
from ssdemu.tools.daemon_process import DaemonProcess

SIZES = (1, 511, 4095, 4096, 4097, 70_001, 3 << 20)


def _value(i: int, n: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8).tobytes()


def _block(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((160, 2, 2, 4, 64)).astype(np.float16)
    return x.view(np.uint16)


def test_the_data_plane_on_4k_sectors(tmp_path, loop4k_device):
    sock = str(tmp_path / "s.sock")
    d = DaemonProcess(sock, media=f"block:{loop4k_device}", extra=["--timing", "off"])
    try:
        with hostlib.connect(sock) as dev:
            assert dev.identify()["logical_block_bytes"] == 4096
            ns = dev.ns_create(8 << 20)
            buf = dev.alloc(64 << 10)
            buf[:] = np.arange(buf.size, dtype=np.uint32).view(np.uint8)[:buf.size]
            dev.write(ns, 3, buf)  # LBA 3: a 4 KiB unit
            out = dev.alloc(64 << 10)
            dev.read(ns, 3, out)
            assert (out == buf).all()
            with pytest.raises(hostlib.DeviceError):  # not a whole sector
                dev.write(ns, 0, buf[:512])
            keys = []
            for i, n in enumerate(SIZES):
                k = b"v%d" % n
                dev.kv_put(k, _value(i, n))
                keys.append(k)
                assert dev.kv_get(k) == _value(i, n)
            x = _block(1)
            size = dev.kv_put_quantized(b"q", x, "fp16", "int8_g64")
            host, _ = dequantize(dev.kv_get(b"q"))
            deq = np.empty_like(x)
            dev.kv_get_dequantized(b"q", deq)
            assert np.array_equal(deq, host) and len(dev.kv_get(b"q")) == size
            chain = [bytes([j]) * 16 for j in range(1, 6)]
            for k in chain[:3]:
                dev.kv_put(k, b"block")
            assert dev.prefix_match(chain) == 3
            dev.pin(chain[0])
            with pytest.raises(hostlib.DeviceError):  # a pinned key stays
                dev.kv_delete(chain[0])
            dev.unpin(chain[0])
            dev.kv_delete(chain[0])
            dev.flush()
        assert d.terminate()[0] == 0
        d = DaemonProcess(sock, media=f"block:{loop4k_device}", extra=["--timing", "off"])
        with hostlib.connect(sock) as dev:  # everything again, after a restart
            for i, n in enumerate(SIZES):
                assert dev.kv_get(b"v%d" % n) == _value(i, n)
            out = dev.alloc(64 << 10)
            dev.read(ns, 3, out)
            assert (out == buf).all()
            deq2 = np.empty_like(x)
            dev.kv_get_dequantized(b"q", deq2)
            assert np.array_equal(deq2, deq)
            assert dev.prefix_match(chain) == 0 and dev.prefix_match(chain[1:]) == 2
    finally:
        assert d.terminate()[0] == 0
