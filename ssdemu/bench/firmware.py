"""`ssdemu bench firmware`: in-drive kernels on one core against memcpy, in the same run.

GB/s counts fp16 bytes: input bytes for quantize, output bytes for dequantize.  Every side
writes into a buffer allocated beforehand, as memcpy does and as the drive does with its
staging buffers; the public API calls run whole (validation, header, checksum).  Each figure
is the best of several runs (the first call, which may compile, is not timed).
"""

from __future__ import annotations

import time

import numpy as np

from firmware.layout import KVShape
from firmware.quant import compressed_nbytes, dequantize, quantize
from ssdemu.bench.prefix import bench_prefix_match

SCHEMES = ("int8_g64", "int4_g64", "int8_g64_sym", "int4_g64_sym", "int8_g128", "int4_g32",
           "int2_g64", "kivi4_g32_r128", "kivi8_g32_r128", "kivi2_g32_r128", "fp8_tensor",
           "fp8_head")
REPEATS = 5


def _best_seconds(fn, repeats: int = REPEATS) -> float:
    fn()  # warm-up: compile, fault pages in
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kv_data(mib: int, seed: int = 0) -> np.ndarray:
    """Gaussian fp16 KV blocks of 128 tokens, 8 layers x 8 heads x 128 (bits as uint16)."""
    per_block = 128 * 2 * 8 * 8 * 128
    blocks = max(1, (mib << 20) // (2 * per_block))
    x = np.random.default_rng(seed).standard_normal(blocks * per_block).astype(np.float16)
    return x.view(np.uint16).reshape(blocks * 128, 2, 8, 8, 128)


def bench_firmware(mib: int = 64, prefix_chains: int = 1024) -> dict:
    data = kv_data(mib)
    nbytes = data.nbytes
    dst = np.empty_like(data)
    memcpy_gbps = nbytes / _best_seconds(lambda: np.copyto(dst, data)) / 1e9
    report: dict = {"memcpy_gbps": memcpy_gbps, "bytes_fp16": nbytes, "quantize": {},
                    "dequantize": {}}
    t, _, layers, heads, dim = data.shape
    shape = KVShape(t, layers, heads, dim)
    for name in SCHEMES:
        blob = np.empty(compressed_nbytes(shape, name, "fp16"), np.uint8)
        q = nbytes / _best_seconds(lambda n=name, b=blob: quantize(data, "fp16", n, out=b)) / 1e9
        d = nbytes / _best_seconds(lambda b=blob: dequantize(b, out=dst)) / 1e9
        report["quantize"][name] = {"gbps": q, "ratio_memcpy": q / memcpy_gbps,
                                    "compression": nbytes / blob.nbytes}
        report["dequantize"][name] = {"gbps": d, "ratio_memcpy": d / memcpy_gbps}
    report["prefix_match"] = bench_prefix_match(prefix_chains)
    return report


def format_table(report: dict) -> str:
    lines = [f"memcpy {report['memcpy_gbps']:.2f} GB/s on {report['bytes_fp16'] >> 20} MiB fp16",
             f"  {'scheme':<14}{'quant GB/s':>11}{'x memcpy':>10}{'dequant GB/s':>14}"
             f"{'x memcpy':>10}{'compress':>10}"]
    for name, q in report["quantize"].items():
        d = report["dequantize"][name]
        lines.append(f"  {name:<14}{q['gbps']:>11.2f}{q['ratio_memcpy']:>10.3f}{d['gbps']:>14.2f}"
                     f"{d['ratio_memcpy']:>10.3f}{q['compression']:>10.2f}")
    pm = report["prefix_match"]
    ns = pm["ns_per_key"]
    lines.append(f"prefix match, {pm['index_keys']:,} keys indexed: "
                 f"b1 {ns['b1']:.0f} ns/key, b32 {ns['b32']:.1f}, b1024 {ns['b1024']:.1f}; "
                 f"Python dict walk {pm['python_ns_per_key_b1024']:.0f} ns/key "
                 f"({pm['ratio_python_b1024']:.1f}x)")
    return "\n".join(lines)
