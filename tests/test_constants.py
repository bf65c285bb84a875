"""Constants that C and Python share have one definition, the C headers; every Python copy is
derived from them, and these tests fail when one disagrees."""

import importlib.util
import pathlib

from firmware import abi, blockfmt, blockops, entry
from ssdemu.device import _device
from ssdemu.device.daemon import CLASS_NAMES
from ssdemu.sim import _model

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _gen_abi():
    spec = importlib.util.spec_from_file_location("gen_abi", ROOT / "c" / "gen_abi.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_firmware_abi_module_is_what_the_headers_generate():
    """firmware/abi.py is c/gen_abi.py's output for today's headers: a header changed
    without regenerating it fails here."""
    gen = _gen_abi()
    assert (ROOT / "firmware" / "abi.py").read_text() == gen.render()
    # 11 INFO_ (FROM_KIND, FROM_GROUP, SLOTS too), 7 E_, 4 SCHEME_, 3 QUANT_, 10 QREQ_: none
    # dropped by the parser
    assert len(gen.constants()) == 35


def test_the_firmware_uses_the_compiled_headers_values():
    """What the kernels compile with is what the data plane was compiled with."""
    names = [n for n in dir(abi) if n.isupper() and not n.startswith("QREQ_")]
    assert names
    for n in names:
        c_name = {"INFO_": "SDE_FW_INFO_", "E_": "SDE_FW_E_", "SCHEME_": "SDE_SCHEME_",
                  "QUANT_": "SDE_QUANT_"}
        prefix = next(p for p in c_name if n.startswith(p))
        assert getattr(_device.lib, c_name[prefix] + n[len(prefix):]) == getattr(abi, n), n
    # the quantized-store request's offsets as the compiler laid the struct out
    ffi = _device.ffi
    fields = [f for f, _ in ffi.typeof("sde_quant_req").fields if not f.startswith("reserved")]
    assert len(fields) == 9
    for f in fields:
        assert getattr(abi, "QREQ_" + f.upper()) == ffi.offsetof("sde_quant_req", f), f
    assert abi.QREQ_BYTES == ffi.sizeof("sde_quant_req") == 64
    assert blockops.SCHEME_KIVI == _model.lib.SDE_SCHEME_KIVI
    from ssdemu.device import retrieval
    assert retrieval.BLOCK_MAGIC == blockfmt.MAGIC
    assert entry.INFO_RAW == _device.lib.SDE_FW_INFO_RAW
    assert blockops.E_SCHEME == _device.lib.SDE_FW_E_SCHEME


def test_class_names_follow_the_c_numbering():
    assert len(CLASS_NAMES) == _device.lib.SDE_NCLASSES
    for i, name in enumerate(CLASS_NAMES):
        assert getattr(_device.lib, "SDE_CLASS_" + name.upper()) == i


def test_the_device_and_the_model_agree_on_shared_structs():
    """The device's and the timing model's modules are compiled from the same headers: the
    daemon copies a budget and fills model parameters across them."""
    for ctype in ("sde_budget", "sde_model_params", "sde_kernel_cost"):
        a, b = _device.ffi.typeof(ctype), _model.ffi.typeof(ctype)
        assert _device.ffi.sizeof(ctype) == _model.ffi.sizeof(ctype), ctype
        assert [(n, f.offset) for n, f in a.fields] == [(n, f.offset) for n, f in b.fields]


def test_the_benchmarks_engine_is_the_devices_and_the_device_carries_no_benchmark():
    """bench io runs on its own compiled copy of the engine (ssdemu.bench._engine_bench):
    the same structs and constants as the device's, and the device's module has no
    benchmark in it."""
    from ssdemu.bench import _engine_bench

    assert not hasattr(_device.lib, "sde_bench") and hasattr(_engine_bench.lib, "sde_bench")
    for struct in ("sde_io", "sde_stats"):
        a, b = _device.ffi.typeof(struct), _engine_bench.ffi.typeof(struct)
        assert [(n, _device.ffi.offsetof(struct, n)) for n, _ in a.fields] == \
            [(n, _engine_bench.ffi.offsetof(struct, n)) for n, _ in b.fields]
        assert _device.ffi.sizeof(struct) == _engine_bench.ffi.sizeof(struct)
    for name in ("SDE_OP_READ", "SDE_OP_WRITE", "SDE_OP_FSYNC", "SDE_ENG_SQPOLL"):
        assert getattr(_device.lib, name) == getattr(_engine_bench.lib, name)


def test_the_kinds_generated_files_are_what_the_registry_makes():
    """firmware/kind_dispatch.py and c/model/sde_kinds.h are firmware/kinds.py's output for
    today's REGISTRY and kind modules (a kind added without regenerating them fails here),
    and the compiled codes are the kinds' own."""
    from firmware import kinds

    assert (ROOT / "firmware" / "kind_dispatch.py").read_text() == kinds.render_dispatch()
    assert (ROOT / "c" / "model" / "sde_kinds.h").read_text() == kinds.render_c()
    for m in kinds.modules():
        assert getattr(_model.lib, f"SDE_SCHEME_{m.NAME.upper()}") == m.CODE
        assert getattr(abi, f"SCHEME_{m.NAME.upper()}") == m.CODE
    assert len({m.CODE for m in kinds.modules()}) == len(kinds.REGISTRY)
    for m in kinds.modules():  # every kind module defines the whole interface
        missing = [name for name in kinds.INTERFACE if not hasattr(m, name)]
        assert not missing, (m.__name__, missing)
