"""The op-cost formulas and the TOPS budget."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firmware.cost import (
    KERNELS,
    ComputeProfile,
    KernelCost,
    TopsBudget,
    dequantize_cost,
    index_insert_cost,
    prefix_hash_cost,
    prefix_match_cost,
    quantize_cost,
)
from firmware.layout import KVShape
from firmware.quant import compressed_nbytes

SCHEMES = ["int8_g64", "int4_g32", "int4_g128_sym", "kivi4_g32_r128", "fp8_tensor", "fp8_head"]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_kernel_is_charged(kernel):
    cost = KERNELS[kernel]()
    assert cost.ops > 0 and cost.bytes > 0


def test_zero_cost_is_refused():
    with pytest.raises(ValueError, match="positive"):
        KernelCost(0, 100)
    with pytest.raises(ValueError, match="positive"):
        prefix_match_cost(0)


@given(tokens=st.integers(1, 600), layers=st.integers(1, 4), heads=st.integers(1, 4),
       dim=st.sampled_from([64, 128]), scheme=st.sampled_from(SCHEMES))
def test_quantization_costs_follow_the_shape(tokens, layers, heads, dim, scheme):
    shape = KVShape(tokens, layers, heads, dim)
    comp = compressed_nbytes(shape, scheme, "fp16")
    q = quantize_cost(shape.elements, 2, scheme, comp)
    d = dequantize_cost(shape.elements, 2, scheme, comp)
    assert q.bytes == d.bytes == shape.nbytes(0) + comp
    assert q.ops >= 7 * shape.elements and d.ops >= 3 * shape.elements
    assert quantize_cost(2 * shape.elements, 2, scheme, comp).ops > q.ops


@given(blocks=st.integers(1, 100), block=st.sampled_from([16, 256, 512]))
def test_hash_cost_counts_blake2b_compressions(blocks, block):
    c = prefix_hash_cost(blocks, block)
    compressions = {16: 1, 256: 9, 512: 17}[block]  # (16 + 4 * block) bytes in 128-byte blocks
    assert c.ops == blocks * compressions * 1400
    assert prefix_match_cost(blocks).ops == 20 * blocks
    assert index_insert_cost(blocks).bytes == 112 * blocks


PROFILE = ComputeProfile(tops=8.0, compute_units=4, device_memory_bytes_per_s=64e9)


def test_device_time_is_the_slower_of_compute_and_memory():
    b = TopsBudget(PROFILE)
    # per unit: 2 TOPS = 2000 ops/ns; memory 64 bytes/ns
    assert b.device_ns(KernelCost(2_000_000, 64)) == pytest.approx(1000.0)  # compute bound
    assert b.device_ns(KernelCost(2000, 64_000)) == pytest.approx(1000.0)  # memory bound


def test_units_run_in_parallel_then_queue():
    b = TopsBudget(PROFILE)
    cost = KernelCost(2_000_000, 64)  # 1 us on one unit
    spans = [b.charge("quantize", cost, submit_ns=0) for _ in range(5)]
    assert [s for s, _ in spans[:4]] == [0, 0, 0, 0]
    assert spans[4] == (pytest.approx(1000.0), pytest.approx(2000.0))
    assert b.utilization(2000.0) == pytest.approx(5000.0 / (4 * 2000.0))
    assert b.kernels["quantize"].calls == 5 and b.kernels["quantize"].ops == 5 * cost.ops


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 10**7)), max_size=40))
def test_busy_until_never_decreases_and_nothing_starts_before_submission(calls):
    b = TopsBudget(PROFILE)
    before = list(b.busy_until_ns)
    for submit, ops in calls:
        start, done = b.charge("prefix_match", KernelCost(ops, 48), submit)
        assert start >= submit and done > start
        assert all(x >= y for x, y in zip(b.busy_until_ns, before, strict=True))
        before = list(b.busy_until_ns)


def test_host_lag_is_recorded():
    b = TopsBudget(PROFILE)
    b.charge("dequantize", KernelCost(2000, 64), 0, host_ns=5.0)  # device 1 ns: host slower
    b.charge("dequantize", KernelCost(2_000_000, 64), 0, host_ns=5.0)  # device 1 us
    assert b.kernels["dequantize"].host_lag_calls == 1 and b.host_lag_calls == 1
    assert b.kernels["dequantize"].host_ns == 10.0


def test_profile_validated():
    with pytest.raises(ValueError, match="positive"):
        ComputeProfile(tops=0, compute_units=4, device_memory_bytes_per_s=1e9)


def test_run_times_a_real_kernel():
    import numpy as np

    from firmware.quant import quantize

    block = np.zeros((64, 2, 2, 2, 128), np.uint16)
    b = TopsBudget(PROFILE)
    comp = compressed_nbytes(KVShape(64, 2, 2, 128), "int8_g64", "fp16")
    cost = quantize_cost(block.size, 2, "int8_g64", comp)
    blob, done = b.run("quantize", cost, 100.0, quantize, block, "fp16", "int8_g64")
    assert blob.nbytes == comp
    assert done == pytest.approx(100.0 + b.device_ns(cost))
    assert b.kernels["quantize"].host_ns > 0
