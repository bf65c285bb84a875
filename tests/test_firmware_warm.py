"""firmware.warm: the parallel first compile's cache files, from processes that compiled into
directories of their own, are merged a whole function at a time, never an index from one
process beside code files from another (which could name the wrong code); an edit drops the
cached code of the modules it reaches, and only theirs."""

from __future__ import annotations

import pathlib

from firmware.cachefiles import function_of, merge_functions
from firmware.warm import HERE, firmware_imports, module_digests


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_function_of_names_the_function_of_index_and_code_files():
    assert function_of(pathlib.Path("quant_int.quantize_int-295.py311.nbi")) == \
        "quant_int.quantize_int-295"
    assert function_of(pathlib.Path("quant_int.quantize_int-295.py311.12.nbc")) == \
        "quant_int.quantize_int-295"
    assert function_of(pathlib.Path(
        "quant_int._half_quantizer.locals.quantize-320.py313.3.nbc")) == \
        "quant_int._half_quantizer.locals.quantize-320"


def test_each_function_comes_whole_from_the_first_directory_that_has_it(tmp_path):
    a, b, dest = tmp_path / "a" / "sub", tmp_path / "b" / "sub", tmp_path / "dest"
    dest.mkdir()
    # both compiled f (each its own index naming its own .1.nbc); only b compiled g
    for d in (a, b):
        _write(d / "m.f-10.py311.nbi", f"index of f from {d.parent.name}")
        _write(d / "m.f-10.py311.1.nbc", f"code of f from {d.parent.name}")
    _write(b / "m.f-10.py311.2.nbc", "a second signature of f, from b")
    _write(b / "m.g-20.py311.nbi", "index of g from b")
    _write(b / "m.g-20.py311.1.nbc", "code of g from b")
    # dest had h already: kept, never replaced
    _write(dest / "m.h-30.py311.nbi", "index of h, already here")
    _write(a / "m.h-30.py311.nbi", "index of h from a")

    merge_functions([tmp_path / "a", tmp_path / "b"], dest)

    got = {f.name: f.read_text() for f in dest.iterdir()}
    assert got == {
        "m.f-10.py311.nbi": "index of f from a",
        "m.f-10.py311.1.nbc": "code of f from a",
        "m.g-20.py311.nbi": "index of g from b",
        "m.g-20.py311.1.nbc": "code of g from b",
        "m.h-30.py311.nbi": "index of h, already here",
    }


def _sources() -> dict[str, bytes]:
    return {f.stem: f.read_bytes() for f in HERE.glob("*.py")}


def test_imports_are_read_in_every_form():
    src = ("import numpy as np\nfrom firmware import blockops as B, abi\n"
           "from firmware.bits import u32_as_f32\nimport firmware.convert\n"
           "def f():\n    from firmware.retrieval import page_bounds\n")
    assert firmware_imports(src) == {"blockops", "abi", "bits", "convert", "retrieval"}


def test_an_edit_drops_the_cached_code_of_what_it_reaches_only():
    """An edited module's digest changes, and so does every module importing it, directly or
    not; nothing else's does."""
    sources = _sources()
    before = module_digests(sources)
    edited = dict(sources, retrieval=sources["retrieval"] + b"\n# edited\n")
    changed = {m for m, d in module_digests(edited).items() if d != before[m]}
    assert changed == {"retrieval", "warm"}  # warm imports it inside a function
    edited = dict(sources, bits=sources["bits"] + b"\n# edited\n")
    changed = {m for m, d in module_digests(edited).items() if d != before[m]}
    # bits <- convert, quant_int, quant_fp8, retrieval <- blockops <- entry, blockfmt, quant
    assert {"bits", "convert", "quant_int", "quant_fp8", "retrieval", "blockops", "entry",
            "quant", "warm"} <= changed
    assert not changed & {"prefix_hash", "checksum", "layout", "abi"}
