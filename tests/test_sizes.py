"""firmware/sizes.py: the compressed blocks' sizes in plain Python, as model mode reads them,
against the compiled firmware (which calls the same arithmetic) and the blocks it writes;
its text parser of scheme names against the firmware's byte parser; and model mode's imports
(no Numba)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware import kinds, quant, sizes
from firmware.layout import KVShape, storage_dtype

DTYPES = {"fp16": 0, "bf16": 1, "fp32": 2}
SCHEMES = ("int8_g32", "int8_g64", "int4_g128", "int8_g64_sym", "int4_g32_sym", "int2_g64",
           "int2_g128", "kivi2_g32_r16",
           "kivi4_g32_r128", "kivi8_g64_r1", "kivi4_g128_r0", "fp8_tensor", "fp8_head",
           "plain")


def _fields(s: quant.Scheme) -> dict:
    return {"kind": s.kind, "bits": s.bits, "group": s.group, "symmetric": s.symmetric,
            "residual": s.residual, "per_head": s.per_head}


def test_every_registered_kind_is_sized_here():
    assert sorted(m.NAME for m in kinds.modules()) == sorted(sizes.KINDS)
    for m in kinds.modules():
        assert sizes.kind_code(m.NAME) == m.CODE


def test_the_unknown_scheme_error_is_the_firmwares():
    with pytest.raises(ValueError) as fw:
        quant.parse_scheme("int7_g64")
    with pytest.raises(ValueError) as here:
        sizes.compressed_nbytes(4, 1, 1, 8, "int7_g64")
    assert str(here.value) == str(fw.value)


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(
    st.sampled_from(SCHEMES),
    st.builds("".join, st.lists(st.sampled_from(
        ["int", "kivi", "fp8", "_tensor", "_head", "plain", "8", "4", "2", "_g", "32", "64", "128",
         "16", "_r", "0", "5", "_sym", "_", "x", "1"]), max_size=6)),
    st.text(max_size=12)))
def test_names_parse_alike_as_text_and_as_bytes(name):
    """Whatever the name, the text parser and the firmware's take it or refuse it alike, with
    the same fields."""
    try:
        want = _fields(quant.parse_scheme(name))
    except ValueError:
        want = None
    assert sizes.parse_scheme_name(name) == want


@settings(max_examples=200, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), dtype=st.sampled_from(sorted(DTYPES)),
       tokens=st.integers(1, 700), layers=st.integers(1, 40), heads=st.integers(1, 9),
       head_dim=st.integers(1, 160), page=st.sampled_from([0, 1, 7, 16, 64, 4096]))
def test_sizes_are_the_compiled_firmwares(scheme, dtype, tokens, layers, heads, head_dim,
                                          page):
    shape = KVShape(tokens, layers, heads, head_dim)
    assert sizes.compressed_nbytes(tokens, layers, heads, head_dim, scheme, DTYPES[dtype],
                                   page) == quant.compressed_nbytes(shape, scheme, dtype, page)


@settings(max_examples=40, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), dtype=st.sampled_from(sorted(DTYPES)),
       tokens=st.integers(1, 200), page=st.sampled_from([0, 16]))
def test_sizes_are_those_of_the_blocks_written(scheme, dtype, tokens, page):
    """The size is what a quantize writes, not only what the firmware's size function says."""
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, 2, 2, 2, 32)).astype(np.float32)
    if dtype == "fp16":
        block = x.astype(np.float16).view(np.uint16)
    elif dtype == "bf16":
        block = (x.view(np.uint32) >> 16).astype(np.uint16)
    else:
        block = x
    assert block.dtype == storage_dtype(DTYPES[dtype])
    blob = quant.quantize(block, dtype, scheme, summary_page=page)
    assert len(blob) == sizes.compressed_nbytes(tokens, 2, 2, 32, scheme, DTYPES[dtype], page)


def test_model_mode_loads_no_numba(tmp_path):
    """A model-mode replay (with a quantized drive tier, whose sizes and costs it needs, and
    placement policies' decodes, which size quantized windows) imports neither Numba nor
    the firmware's kernels."""
    code = (
        "import sys\n"
        "from ssdemu.cli import main\n"
        "rc = main(['replay', 'traces/mooncake_synthetic_trace.jsonl', '--model', 'tiny',\n"
        "           '--requests', '20', '--quant', 'int4_g64', '--no-progress',\n"
        "           '--prefill-rate', '1000', '--decode', 'qevict,h2o'])\n"
        "loaded = sorted(m for m in sys.modules if m == 'numba' or m.startswith('numba.')\n"
        "                or m in ('firmware.blockops', 'firmware.quant'))\n"
        "print('LOADED', loaded)\n"
        "sys.exit(rc)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "LOADED []" in p.stdout, p.stdout[-500:]
