"""Numba's cache files, moved or copied between cache directories a whole function at a time.

A function's cache is an index (`<module>.<function>-<line>.py311.nbi`) and the code files it
names (`...py311.1.nbc`, ...).  An index from one directory beside code files from another
could name the wrong code, so a function's files always come together, from one directory.
firmware/warm.py merges the caches its processes compiled; firmware/__init__.py seeds a
private cache from the tree's.
"""

from __future__ import annotations

import pathlib
import re
import shutil


def function_of(cache_file: pathlib.Path) -> str:
    """The function a Numba cache file belongs to: "quant_int.quantize_int-295" of
    "quant_int.quantize_int-295.py311.nbi" and of its code files "...py311.1.nbc"."""
    return re.split(r"\.py\d+\.", cache_file.name)[0]


def merge_functions(dirs, dest: pathlib.Path, move: bool = True) -> None:
    """Move (or copy) the Numba cache files found under each of dirs into dest, whole
    functions at a time: a function's index and the code files it names come from the first
    directory that has it, and none when dest has it already."""
    taken = {function_of(f) for f in dest.glob("*.nbi")}
    for d in dirs:
        files = list(pathlib.Path(d).rglob("*.nb[ic]"))
        mine = {function_of(f) for f in files if f.suffix == ".nbi"} - taken
        for f in files:
            if function_of(f) in mine:
                (shutil.move if move else shutil.copy2)(str(f), dest / f.name)
        taken |= mine
