"""firmware.warm's parallel first compile: the cache files of processes that compiled into
directories of their own are merged a whole function at a time, never an index from one
process beside code files from another (which could name the wrong code)."""

from __future__ import annotations

import pathlib

from firmware.warm import _function_of, move_cache_files


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_function_of_names_the_function_of_index_and_code_files():
    assert _function_of(pathlib.Path("quant_int.quantize_int-295.py311.nbi")) == \
        "quant_int.quantize_int-295"
    assert _function_of(pathlib.Path("quant_int.quantize_int-295.py311.12.nbc")) == \
        "quant_int.quantize_int-295"
    assert _function_of(pathlib.Path(
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

    move_cache_files([tmp_path / "a", tmp_path / "b"], dest)

    got = {f.name: f.read_text() for f in dest.iterdir()}
    assert got == {
        "m.f-10.py311.nbi": "index of f from a",
        "m.f-10.py311.1.nbc": "code of f from a",
        "m.g-20.py311.nbi": "index of g from b",
        "m.g-20.py311.1.nbc": "code of g from b",
        "m.h-30.py311.nbi": "index of h, already here",
    }
