"""Prefix matching in the drive's index against a Python dict walk over the same chains.

The index holds `chains` chains of 1,024 random 16-byte keys.  b1, b32 and b1024 match runs
of 1, 32 and 1,024 keys of those chains (every key a hit), one kernel call per run, the
keys already binary as they arrive in a command; ns_per_key = time / keys matched.  The
Python reference walks a dict of the same keys (bytes, as a host would hold them) over the
same chains, stopping at the first miss.  Each figure is the best of several passes.
"""

from __future__ import annotations

import time

import numpy as np

from ssdemu.bench.prefix_index import PrefixIndex, match_prefix

CHAIN = 1024
PASSES = 3


def _best(fn, passes: int = PASSES) -> float:
    fn()
    return min(_timed(fn) for _ in range(passes))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_prefix_match(chains: int = 1024, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**63, (chains * CHAIN, 2), dtype=np.uint64)
    index = PrefixIndex(chains * CHAIN)
    index.insert_chain(keys, np.arange(chains * CHAIN, dtype=np.uint64))
    args = (index.slots, index.ent, index.pin, index.prev, index.nxt, index.state)
    locs = np.zeros(CHAIN, np.uint64)
    order = rng.permutation(chains)

    def runs_of(width: int) -> list[np.ndarray]:
        # every run starts a chain or continues one: all hits, spread over the whole index
        out = []
        for c in order:
            base = int(c) * CHAIN
            for start in range(0, CHAIN, max(width, CHAIN // 32 if width == 1 else width)):
                out.append(keys[base + start:base + start + width])
        return out

    ns = {}
    for width in (1, 32, 1024):
        runs = runs_of(width)

        def ours(runs=runs):
            hits = 0
            for r in runs:
                hits += match_prefix(*args, r, locs, False)
            assert hits == len(runs) * len(runs[0])

        ns[f"b{width}"] = _best(ours) / (len(runs) * width) * 1e9

    table = {keys[i].tobytes(): i for i in range(len(keys))}
    chains_bytes = [[keys[int(c) * CHAIN + j].tobytes() for j in range(CHAIN)] for c in order]

    def python_walk():
        hits = 0
        for chain in chains_bytes:
            for k in chain:
                if k in table:
                    hits += 1
                else:
                    break
        assert hits == chains * CHAIN

    python_ns = _best(python_walk) / (chains * CHAIN) * 1e9
    return {
        "index_keys": chains * CHAIN,
        "ns_per_key": ns,
        "python_ns_per_key_b1024": python_ns,
        "ratio_python_b1024": python_ns / ns["b1024"],
    }
