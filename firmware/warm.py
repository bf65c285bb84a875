"""Compile every firmware kernel the daemon calls, once, into Numba's on-disk cache
(`cache=True`): `make` runs this after the build (and whenever firmware/ changes), so that a
daemon on a fresh clone starts in seconds and its first compute command does not stall on
compilation.

Numba keys a cached function on its own file only: a cached entry point (firmware/entry.py)
would keep the old code of a kernel edited in another module.  So a module's cached code is
dropped whenever its source or that of a firmware module it imports (directly or not)
differs from the one it was built from; the others are kept (an edit of the retrieval
kernels recompiles those alone, one of firmware/bits.py nearly everything).

On a fresh cache the work is split first between processes, one per core (two at most:
the split below has two halves), each compiling its half into a cache directory of its own
(NUMBA_CACHE_DIR), so that no two processes ever write one cache index (Numba's index is a
read-modify-write file: two writers could leave an index naming the other's code).  Their
cache files are then moved into firmware/__pycache__, whole functions at a time, and this
process compiles what is left (the entry points, the callers of both halves) from them.

    python -m firmware.warm [--jobs N]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from firmware.cachefiles import merge_functions
from firmware.prefix_hash import hash_chain
from firmware.quant import dequantize, quantize, requantize

# every scheme kind, element type and code path the daemon's compute commands reach
SCHEMES = ("int8_g64", "int4_g64", "int2_g64", "int8_g32_sym", "int4_g128_sym", "kivi4_g32_r128",
           "kivi8_g64_r128", "kivi2_g32_r128", "fp8_tensor", "fp8_head")
CARRIERS = {"fp16": np.uint16, "bf16": np.uint16, "fp32": np.float32}


HERE = pathlib.Path(__file__).resolve().parent
CACHE = HERE / "__pycache__"
SOURCES_STAMP = CACHE / "warm-sources.json"


def firmware_imports(source: str) -> set[str]:
    """The firmware modules a module's source imports (anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "firmware":
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("firmware."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names
                    if a.name.startswith("firmware.")}
    return out


def module_digests(sources: dict[str, bytes]) -> dict[str, str]:
    """Per firmware module, a digest of its source and of every firmware module it imports,
    directly or not: the code Numba cached for its functions has theirs compiled in, while
    Numba's own cache index looks at the function's file only."""
    deps = {name: firmware_imports(src.decode()) & sources.keys()
            for name, src in sources.items()}
    out = {}
    for name in sources:
        seen, todo = {name}, [name]
        while todo:
            for d in deps[todo.pop()] - seen:
                seen.add(d)
                todo.append(d)
        h = hashlib.sha256()
        for m in sorted(seen):
            h.update(m.encode() + b"\0" + sources[m] + b"\0")
        out[name] = h.hexdigest()
    return out


def drop_stale_cache() -> bool:
    """Remove the cached code of every firmware module whose source, or the source of a
    module it imports, changed since it was cached (and of modules that are gone), so that
    an edit recompiles only what it reaches.  True if nothing is cached afterwards."""
    CACHE.mkdir(exist_ok=True)
    digests = module_digests({f.stem: f.read_bytes() for f in HERE.glob("*.py")})
    try:
        before = json.loads(SOURCES_STAMP.read_text())
    except (OSError, ValueError):
        before = {}
    stale = {m for m, d in digests.items() if before.get(m) != d}
    for f in list(CACHE.glob("*.nbi")) + list(CACHE.glob("*.nbc")):
        module = f.name.split(".")[0]
        if module in stale or module not in digests:
            f.unlink()
    SOURCES_STAMP.write_text(json.dumps(digests, indent=1, sort_keys=True))
    return not any(CACHE.glob("*.nbi"))


def warm(jobs: int | None = None, phases: dict[str, float] | None = None) -> float:
    """Seconds taken; `phases` (if given) gets the time of each step that took any."""
    phases = {} if phases is None else phases
    t0 = time.perf_counter()
    fresh = drop_stale_cache()
    jobs = min(len(HALVES), os.cpu_count() or 1) if jobs is None else jobs
    if fresh and jobs > 1 and not os.environ.get("NUMBA_CACHE_DIR"):  # (a cache elsewhere)
        compile_in_parallel(jobs)
        phases["halves in parallel"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    import firmware.entry  # noqa: F401  (the C entry points compile at import)
    t2 = time.perf_counter()
    phases["entry points"] = t2 - t1

    rng = np.random.default_rng(0)
    for dtype, carrier in CARRIERS.items():
        x = rng.standard_normal((160, 2, 2, 2, 64)).astype(np.float32)
        if carrier is np.uint16:
            x = (x.astype(np.float16).view(np.uint16) if dtype == "fp16"
                 else (x.view(np.uint32) >> 16).astype(np.uint16))
        for scheme in SCHEMES:
            dequantize(quantize(x, dtype, scheme))
        # the host's requantize (the torture kit's and the tests' reference of KV_REQUANTIZE)
        requantize(quantize(x, dtype, "int8_g64", summary_page=16), "int4_g64")
    _warm_hash()
    _warm_retrieval(rng)
    phases["the rest"] = time.perf_counter() - t2
    return time.perf_counter() - t0


# ---- the parallel first compile --------------------------------------------------------------
#
# Two halves that share no generic function (one compiled for other argument types in each
# would have its cache index from one process only, and its other types compiled again here):
# the whole quantize path; the dequantize path, the retrieval kernels and the prefix hash.
# Measured per function with Numba's compile events, the first is about twice the second.
# Each is compiled by signature, nothing run.


def _half_quantize() -> None:
    from numba import types

    from firmware import blockops as B
    u8, i64 = (types.Array(t, 1, "C") for t in (types.uint8, types.int64))
    B.quantize_block.compile((i64, u8, u8))


def _half_dequantize_and_retrieval() -> None:
    from numba import types

    from firmware import blockops as B
    u8, i64 = (types.Array(t, 1, "C") for t in (types.uint8, types.int64))
    B.dequantize_block.compile((u8, u8, i64))
    B.add_summaries.compile((u8, i64))  # the dequantize path's: the stored block's keys
    B.parse_request.compile((u8, i64))
    name = np.frombuffer(b"int8_g64", np.uint8)  # read-only, as firmware.quant passes names
    B.parse_scheme_name(name, np.zeros(B.NPARAM, np.int64))
    _warm_retrieval(np.random.default_rng(0))
    _warm_hash()


HALVES = (_half_quantize, _half_dequantize_and_retrieval)


def compile_in_parallel(jobs: int) -> None:
    """Compile HALVES in `jobs` processes into cache directories of their own, then move their
    cache files into CACHE: each function's files (its index and the code it names) from one
    process only.  A failed process costs only time: what it did not leave is compiled here."""
    with tempfile.TemporaryDirectory(prefix="ssdemu-warm-") as tmp:
        dirs = [pathlib.Path(tmp) / str(i) for i in range(len(HALVES))]
        procs = []
        for i, d in enumerate(dirs[:jobs]):
            env = dict(os.environ, NUMBA_CACHE_DIR=str(d))
            procs.append(subprocess.Popen(
                [sys.executable, "-c", f"import firmware.warm as w; w.HALVES[{i}]()"],
                env=env, cwd=HERE.parent))
        for proc in procs:
            proc.wait()
        merge_functions(dirs[:jobs], CACHE)


def _warm_hash() -> None:
    keys = np.zeros((2, 16), np.uint8)
    hash_chain(np.arange(32, dtype=np.uint32), 16, np.zeros(16, np.uint8), keys)


def _warm_retrieval(rng) -> None:
    """TOPK_PAGES and ATTEND's kernels (ssdemu/device/retrieval.py calls these), and the
    element conversions they read blocks with."""
    from firmware import retrieval as R
    from firmware.convert import bf16_to_f32, fp16_to_f32

    src = np.zeros(8, np.uint16)
    fp16_to_f32(src, np.empty(8, np.float32))
    bf16_to_f32(src, np.empty(8, np.float32))
    H, T, D, page, k = 2, 40, 16, 16, 2
    keys = rng.standard_normal((H, T, D)).astype(np.float32)
    q = rng.standard_normal((2 * H, D)).astype(np.float32)
    P = R.pages_of(T, page)
    lo, hi = np.empty((H, P, D), np.float32), np.empty((H, P, D), np.float32)
    R.page_bounds(keys, page, lo, hi)
    cmin, cmax = np.empty(lo.shape, np.int8), np.empty(lo.shape, np.int8)
    scales = np.empty((H, P), np.float32)
    R.bounds_to_int8(lo, hi, cmin, cmax, scales)
    R.int8_to_bounds(cmin, cmax, scales, lo, hi)
    scores = np.empty((H, P), np.float32)
    lo_cm, hi_cm = (np.ascontiguousarray(x.transpose(0, 2, 1)) for x in (lo, hi))
    R.quest_scores(q, lo_cm, hi_cm, scores)
    ids, sc = np.empty((H, k), np.int32), np.empty((H, k), np.float32)
    R.topk_pages(scores, k, 0, 0, ids, sc)
    spread = np.empty((H, D), np.float32)
    R.channel_spread(lo_cm, hi_cm, spread)
    sel = np.empty((H, P), np.float32)
    R.selective_scores(q, lo_cm, hi_cm, spread, R.select_channels(D), sel, scores)
    R.rerank_candidates(scores, sel, k, 0, 0, ids)
    # the daemon's carriers: gathered float32 pages, a sequence's fp16 or bf16 bits in place
    for kv, bf16 in ((keys, False), (keys.astype(np.float16).view(np.uint16), False),
                     (keys.view(np.uint32).astype(np.uint16), True)):
        R.rerank_pages(q, kv, page, ids, 1, ids[:, :1].copy(), sc[:, :1].copy(), bf16)
        R.attend_pages(q, kv, kv, page, ids, np.empty((2 * H, D), np.float32),
                       np.empty(2 * H, np.float32), bf16)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m firmware.warm")
    ap.add_argument("--jobs", type=int, help="processes for a fresh cache (default: one per "
                    f"core, at most {len(HALVES)}; 1: compile here only)")
    args = ap.parse_args()
    phases: dict[str, float] = {}
    took = warm(args.jobs, phases)
    print(f"firmware kernels compiled and cached in {took:.1f} s ("
          + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) + ")")
