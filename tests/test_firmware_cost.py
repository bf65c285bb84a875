"""The op-cost formulas and the TOPS budget."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from firmware.layout import KVShape
from firmware.quant import compressed_nbytes
from ssdemu.sim.cost import (
    KERNELS,
    ComputeProfile,
    KernelCost,
    TopsBudget,
    dequantize_cost,
    index_insert_cost,
    prefix_hash_cost,
    prefix_match_cost,
    quantize_cost,
    store_summaries_cost,
)

SCHEMES = ["int8_g64", "int4_g32", "int4_g128_sym", "kivi4_g32_r128", "fp8_tensor", "fp8_head"]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_kernel_is_charged(kernel):
    cost = KERNELS[kernel]()
    assert cost.total_ops + cost.probes > 0 and cost.bytes > 0


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
    # element-wise work: on the cores' SIMD lanes, not the MAC array
    assert q.vector_ops >= 7 * shape.elements and d.vector_ops >= 3 * shape.elements
    assert q.mac_ops == d.mac_ops == 0
    assert quantize_cost(2 * shape.elements, 2, scheme, comp).vector_ops > q.vector_ops


@given(tokens=st.integers(1, 600), layers=st.integers(1, 4), heads=st.integers(1, 4),
       page=st.sampled_from([1, 16, 64]), scheme=st.sampled_from(SCHEMES + ["plain"]))
def test_summaries_made_at_store_time_are_charged(tokens, layers, heads, page, scheme):
    """A store with page summaries pays for the keys' min and max, and a quantized block's
    keys dequantized again first; a plain block's are its body."""
    shape = KVShape(tokens, layers, heads, 64)
    comp = compressed_nbytes(shape, scheme, "fp16", page)
    sums = comp - compressed_nbytes(shape, scheme, "fp16")
    assert sums >= 2 * layers * heads * -(-tokens // page) * 64 * 2
    c = store_summaries_cost(shape.elements, 2, scheme, comp, sums)
    keys = shape.elements // 2
    assert c.vector_ops >= 3 * keys and c.bytes >= keys * 2 + sums and c.mac_ops == 0
    if scheme == "plain":
        assert c.vector_ops < 4 * keys + sums
    else:
        assert c.vector_ops > dequantize_cost(keys, 2, scheme, comp // 2).vector_ops
    assert store_summaries_cost(shape.elements, 2, scheme, comp, 0) is None


def _compressions_the_firmware_runs(blocks: int, block: int) -> int:
    """Counted, not computed: the firmware's own hash_chain run as Python with its BLAKE2b
    compression function wrapped in a counter."""
    import firmware.prefix_hash as ph

    count = [0]
    compress = ph._compress

    def counting(*args):
        count[0] += 1
        return compress(*args)

    saved = ph._compress, ph._blake2b_128
    ph._compress, ph._blake2b_128 = counting, ph._blake2b_128.py_func
    try:
        tokens = np.arange(blocks * block, dtype=np.uint32)
        keys = np.zeros((blocks, 16), np.uint8)
        assert ph.hash_chain.py_func(tokens, block, np.zeros(16, np.uint8), keys) == blocks
    finally:
        ph._compress, ph._blake2b_128 = saved
    return count[0]


@pytest.mark.parametrize("block", [16, 32, 256, 512])
def test_hash_cost_counts_the_compressions_the_firmware_runs(block):
    """The cost is the same charge per BLAKE2b compression the firmware actually runs
    (counted by running it), at every block size; that charge is 12 rounds x 8 G functions
    x 14 ops (RFC 7693) plus setup and finalisation: 1,344 to 1,500 ops."""
    per = set()
    for blocks in (1, 3):
        ran = _compressions_the_firmware_runs(blocks, block)
        assert ran >= blocks
        ops = prefix_hash_cost(blocks, block).ops
        assert ops % ran == 0
        per.add(ops // ran)
    (charge,) = per
    assert 12 * 8 * 14 <= charge <= 1500


@given(blocks=st.integers(1, 100))
def test_match_and_insert_costs_are_per_key(blocks):
    assert prefix_match_cost(blocks).ops == blocks * prefix_match_cost(1).ops
    assert prefix_match_cost(blocks).probes == blocks  # a dependent DRAM probe per key
    assert index_insert_cost(blocks).bytes == blocks * index_insert_cost(1).bytes


PROFILE = ComputeProfile(tops=8.0, compute_units=4, device_memory_bytes_per_s=64e9,
                         core_ops_per_s=8e9, simd_lanes=8, dram_probe_ns=100.0)


def _mac(n):
    return KernelCost(0, 64, mac_ops=n)


def test_each_class_of_work_runs_at_its_own_rate():
    """Per unit: the MAC array's 2 TOPS (2,000 ops/ns), a core's 8 scalar ops/ns, 64 vector
    ops/ns on 8 lanes, 100 ns a probe; memory 64 bytes/ns; the slower of compute and memory."""
    b = TopsBudget(PROFILE)
    assert b.device_ns(_mac(1_000_000)) == pytest.approx(1000.0)  # 2 ops a MAC
    assert b.device_ns(KernelCost(8000, 64)) == pytest.approx(1000.0)
    assert b.device_ns(KernelCost(0, 64, vector_ops=64_000)) == pytest.approx(1000.0)
    assert b.device_ns(KernelCost(0, 64, probes=10)) == pytest.approx(1000.0)
    assert b.device_ns(KernelCost(8000, 64, probes=10)) == pytest.approx(2000.0)  # in series
    assert b.device_ns(KernelCost(0, 64_000, mac_ops=1000)) == \
        pytest.approx(1000.0)  # memory bound
    # hashing at an embedded core's rate, far from the TOPS rating: 1,400 ops per 128 bytes
    hashed = prefix_hash_cost(1000, 512)
    assert 0.1e9 < 1000 * (16 + 4 * 512) / (b.device_ns(hashed) * 1e-9) < 2e9


def test_units_run_in_parallel_then_queue():
    b = TopsBudget(PROFILE)
    cost = _mac(1_000_000)  # 1 us on one unit
    spans = [b.charge("quantize", cost, submit_ns=0) for _ in range(5)]
    assert [s for s, _ in spans[:4]] == [0, 0, 0, 0]
    assert spans[4] == (pytest.approx(1000.0), pytest.approx(2000.0))
    assert b.utilization(2000.0) == pytest.approx(5000.0 / (4 * 2000.0))
    assert b.kernels["quantize"].calls == 5 and b.kernels["quantize"].ops == 5 * cost.total_ops


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
    b.charge("dequantize", _mac(1000), 0, host_ns=5.0)  # device 1 ns: host slower
    b.charge("dequantize", _mac(1_000_000), 0, host_ns=5.0)  # device 1 us
    assert b.kernels["dequantize"].host_lag_calls == 1 and b.host_lag_calls == 1
    assert b.kernels["dequantize"].host_ns == 10.0


def test_profile_validated():
    with pytest.raises(ValueError, match="positive"):
        ComputeProfile(tops=0, compute_units=4, device_memory_bytes_per_s=1e9,
                       core_ops_per_s=8e9, simd_lanes=8, dram_probe_ns=100.0)


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


def test_kernels_share_the_dram_with_the_nand_and_pcie_dma():
    """A memory-bound kernel tied to a timing model's DRAM takes longer while writes stream
    through the DRAM write cache to the NAND than on an idle drive."""
    from ssdemu.sim.profile import load
    from ssdemu.sim.timing import DeviceModel, budget_of

    p = load("pcie4-tlc")
    cost = dequantize_cost(16 << 20, 2, "int8_g64", (16 << 20) + (1 << 19))
    times = []
    for busy in (False, True):
        model, budget = DeviceModel(p), budget_of(p)
        budget.share_dram(model)
        if busy:  # 1 GiB of writes arriving from t = 0: host DMA in, NAND DMA out
            for i in range(256):
                model.write(0.0, i << 22, 4 << 20)
        start, done = budget.charge("dequantize", cost, 0.0)
        times.append(done - start)
    idle = TopsBudget(ComputeProfile(p.compute.tops, p.compute.units,
                                     p.compute.memory_bytes_per_s, p.compute.core_ops_per_s,
                                     p.compute.simd_lanes, p.compute.dram_probe_ns))
    assert times[0] == pytest.approx(idle.device_ns(cost))  # an idle DRAM: as unshared
    assert times[1] > 1.5 * times[0]


def test_transformed_commands_stream_through_the_controller():
    """The recipes (c/model/sde_recipe.c): a dequantized retrieve's kernel starts on the first piece
    sensed and its result leaves from the first piece out, a quantized store's kernel starts on
    the first piece received and its program from the first piece out; each stage ends no
    earlier than the one before plus a piece, and the whole is sooner than the stages one
    after another."""
    from ssdemu.sim import _model
    from ssdemu.sim.profile import load
    from ssdemu.sim.timing import DeviceModel, budget_of

    ffi, lib = _model.ffi, _model.lib
    p = load("star2000d")
    raw, stored = 64 << 20, 34 << 20
    cost = quantize_cost(raw // 2, 2, "int8_g64", stored).c()
    dcost = dequantize_cost(raw // 2, 2, "int8_g64", stored).c()
    m, b = DeviceModel(p), budget_of(p)
    got, pieces = ffi.new("double *"), ffi.new("uint32_t *")
    first_in = lib.sde_recipe_q_receive(m.handle, 0.0, raw, got, pieces)
    assert pieces[0] > 1 and 0 < first_in < got[0]
    first_out = ffi.new("double *")
    ended = lib.sde_recipe_q_kernel(b.struct, first_in, got[0], pieces[0], cost, 0.0, first_out)
    assert ended > got[0] and first_in < first_out[0] < ended
    programmed = lib.sde_recipe_q_program(m.handle, first_out[0], ended, pieces[0], 0, stored,
                                          ffi.NULL)
    assert programmed >= ended + p.nand.t_prog_ns
    # the same stages one after another, on a fresh drive
    m2, b2 = DeviceModel(p), budget_of(p)
    arrived = m2.receive(0.0, raw)
    _, k_end = b2.charge("quantize", quantize_cost(raw // 2, 2, "int8_g64", stored), arrived)
    assert programmed < m2.program(k_end, 0, stored)
    t = programmed + 1e6
    sensed = ffi.new("double *")
    first = lib.sde_recipe_dq_sense(m.handle, t, 0, stored, sensed, pieces)
    assert t < first < sensed[0]
    done = lib.sde_recipe_dq_finish(m.handle, b.struct, first, sensed[0], pieces[0], dcost,
                                    0.0, raw)
    assert done > sensed[0] + raw / p.host_link.bandwidth_bytes_per_s * 1e9 / pieces[0]


@given(pages=st.integers(1, 5000), heads=st.integers(1, 8), group=st.sampled_from([1, 4, 8]),
       dim=st.sampled_from([64, 128]), int8=st.booleans())
def test_retrieval_costs_use_the_mac_array_and_follow_the_shape(pages, heads, group, dim, int8):
    from ssdemu.sim.cost import (
        attend_cost,
        rerank_cost,
        score_cost,
        selective_score_cost,
        summarize_cost,
        summary_bytes,
    )
    sb = summary_bytes(pages, heads, dim, 2, int8)
    assert sb == pages * heads * (2 * dim + 4 if int8 else 4 * dim)
    s = score_cost(pages, heads, group, dim, sb)
    assert s.mac_ops == 2 * pages * heads * group * dim and s.bytes >= sb
    sel = selective_score_cost(pages, heads, group, dim, dim // 4)  # in the bound's pass:
    assert sel.mac_ops == s.mac_ops // 4  # no summary byte read again: queries and scores
    assert sel.bytes == heads * group * dim * 4 + pages * heads * 4
    a = attend_cost(16 * pages, heads, group, dim, 16 * pages * heads * dim * 4)
    assert a.mac_ops == 2 * 16 * pages * heads * group * dim
    r = rerank_cost(16 * pages, pages, heads, group, dim, 1)
    assert r.mac_ops == a.mac_ops // 2 and r.vector_ops == 12 * 17 * pages * heads * group
    z = summarize_cost(16 * pages, heads, dim, 2, sb, int8)
    assert z.mac_ops == 0 and z.vector_ops >= 3 * 16 * pages * heads * dim


def test_topk_cost_grows_with_candidates_and_k():
    from ssdemu.sim.cost import topk_cost
    assert topk_cost(10_000, 64).ops > topk_cost(1000, 64).ops > topk_cost(1000, 8).ops
    assert topk_cost(1000, 8).ops >= 3 * 1000
    assert topk_cost(5, 100).ops == topk_cost(5, 5).ops  # k past n: n


def test_scoring_binds_on_dram_alone_unless_queries_share_the_summaries():
    """The roofline of cost.py's doc: 8 TOPS, 64 GB/s; a batch of 32 x 4 query heads over one
    context's summaries puts the MAC array ahead of the DRAM."""
    from ssdemu.sim.cost import score_cost, summary_bytes
    b = TopsBudget(PROFILE)
    sb = summary_bytes(4096, 1, 128)
    one = score_cost(4096, 1, 4, 128, sb)
    assert b.mac_ns(one) < 0.2 * b.device_ns(one)  # DRAM bound
    batch = score_cost(4096, 1, 4 * 64, 128, sb)
    assert b.mac_ns(batch) > 0.9 * b.device_ns(batch)  # the TOPS budget binds


@given(st.lists(st.tuples(st.sampled_from(["score", "topk", "rerank", "attend"]),
                          st.integers(1, 10**7), st.integers(0, 5), st.floats(0, 1e6)),
                min_size=1, max_size=12))
def test_charging_n_calls_at_once_is_charging_them_in_turn(calls):
    """charge_each (a kernel per KV head, in one C call) ends where n charge() calls at the
    same submission end, and leaves the budget as they do: what comes after sees the same
    units."""
    one, each = TopsBudget(PROFILE), TopsBudget(PROFILE)
    t = 0.0
    for kernel, ops, n, dt in calls:
        t += dt
        cost = KernelCost(ops, ops)
        want = max([t] + [one.charge(kernel, cost, t)[1] for _ in range(n)])
        assert each.charge_each(kernel, cost, t, n) == want
    assert one.busy_until_ns == each.busy_until_ns
    assert {k: (s.calls, s.device_ns) for k, s in one.kernels.items()} == {
        k: (s.calls, s.device_ns) for k, s in each.kernels.items()}
