"""The FTL's timing pinned to the last digit under heavy GC: unaligned writes of every size
(4 KiB to a few lines' worth), trims, reads and flushes at random over a small drive filled
several times over, every completion time and the final stats against
tests/data/ftl_golden.json.  The bundled replay's golden test (test_replay_eviction_golden)
relocates little (whole blocks are trimmed); this one makes GC move most lines' units, so
that a change of the FTL's representation must keep its victims, relocation order and rows
exactly.  SSDEMU_REGEN_GOLDEN=1 regenerates the file for a change meant to alter the model
(its commit says why)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random

from ssdemu.sim.profile import load
from ssdemu.sim.timing import DeviceModel

GOLDEN = pathlib.Path(__file__).resolve().parent / "data" / "ftl_golden.json"
MIB = 1 << 20


def _run(profile: str, cache: int, seed: int) -> dict:
    p = load(profile)
    p = dataclasses.replace(p, write_cache=dataclasses.replace(p.write_cache, bytes=cache))
    logical = 64 * MIB
    m = DeviceModel(p, ftl_bytes=logical)
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(6000):
        t += rng.choice((200.0, 2000.0, 20000.0))
        op = rng.random()
        size = rng.choice((4096, 8192, 65536, 1 * MIB, 5 * MIB + 4096))
        off = rng.randrange(0, logical - size) // 512 * 512  # unaligned to units
        if op < 0.70:
            times.append(m.write(t, off, size))
        elif op < 0.82:
            m.trim(off, size)
        elif op < 0.97:
            times.append(m.read(t, off, size))
        else:
            times.append(m.flush(t))
    s = m.stats()
    return {"times": times, "stats": {k: s[k] for k in sorted(s)}}


def test_ftl_timing_gives_the_pinned_figures():
    got = {f"{prof}/{cache}": _run(prof, cache, seed)
           for prof, cache, seed in (("pcie4-tlc", 4 * MIB, 1), ("pcie4-tlc", 0, 2),
                                     ("star2000d", 4 * MIB, 3))}
    if os.environ.get("SSDEMU_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    for case, res in got.items():
        assert res["stats"]["erases"] > 50, case  # GC really ran
        assert res["stats"]["gc_bytes_programmed"] > 0, case  # and relocated
    assert sorted(got) == sorted(want)
    for case in want:
        assert got[case]["stats"] == want[case]["stats"], case
        assert len(got[case]["times"]) == len(want[case]["times"]), case
        bad = [i for i, (a, b) in enumerate(zip(got[case]["times"], want[case]["times"],
                                                strict=True)) if a != b]
        assert bad == [], (case, bad[:5])
