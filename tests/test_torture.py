"""The torture kit: a short run finds nothing wrong with the daemon, and its checks can fail
(a mixed-up value, a change a flush covered that is missing)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from ssdemu.tools.torture import (
    DEMOTE,
    DEMOTED,
    QUANT_EVERY,
    QUANT_SCHEMES,
    Tally,
    _check_keys,
    _Churn,
    compressed_of,
    crash_run,
    quantized,
    scheme_of,
    value_of,
    version_in,
)


@pytest.mark.slow
def test_a_short_torture_run_is_clean():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "torture", "--seconds", "8",
                        "--seed", "3", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout)
    assert r["lost"] == r["corrupt"] == r["crashes"] == 0, r["problems"]
    assert r["leaked_fds"] == r["leaked_mappings"] == r["leaked_pins"] == 0
    assert r["kills"] + r["power_cuts"] >= 1 and r["runs"] >= 1 and r["client_kills"] >= 2
    assert r["fuzzed_sqes"] > 1000 and r["acknowledged"] > 100
    assert r["problems"] == []


def test_the_value_check_catches_mix_ups():
    v = value_of(b"k1", 5)
    assert version_in(b"k1", v) == 5
    assert version_in(b"k2", v) is None  # another key's value
    assert version_in(b"k1", v[:-1]) is None  # torn
    flipped = bytearray(v)
    flipped[-3] ^= 1
    assert version_in(b"k1", bytes(flipped)) is None
    assert version_in(b"k1", value_of(b"k1", 6)) == 6


def test_the_value_check_knows_the_quantized_versions():
    """A compressed block is the version whose block it is, byte for byte, among the
    candidates; another version's, a torn or flipped one is none; every scheme is used."""
    assert {scheme_of(v) for v in range(0, 60, QUANT_EVERY)} == set(QUANT_SCHEMES)
    v = next(x for x in range(30, 60) if quantized(x) and scheme_of(x) == "int8_g64")
    blob = compressed_of(b"k1", v).tobytes()
    assert version_in(b"k1", blob, {None, v}) == v
    assert version_in(b"k1", blob, {None}) is None  # not a candidate
    assert version_in(b"k2", blob, {v}) is None  # another key's block
    other = v + QUANT_EVERY
    assert version_in(b"k1", compressed_of(b"k1", other).tobytes(), {v}) is None
    assert version_in(b"k1", blob[:-1], {v}) is None  # torn
    flipped = bytearray(blob)
    flipped[200] ^= 1
    assert version_in(b"k1", bytes(flipped), {v}) is None


def test_the_value_check_knows_the_demoted_blocks():
    """A block demoted in place (KV_REQUANTIZE) is its state, not the version it came from,
    and the other way round; every scheme the crash loop stores has a rule."""
    assert set(DEMOTE) == set(QUANT_SCHEMES)
    assert {"int2_g32", "kivi2_g32_r16"} <= set(DEMOTE.values())  # the chain down to 2-bit
    for old in QUANT_SCHEMES:  # every rule is a demotion the drive takes
        w = next(x for x in range(30, 90) if quantized(x) and scheme_of(x) == old)
        assert len(compressed_of(b"k1", (w, DEMOTED))) < len(compressed_of(b"k1", w)), old
    v = next(x for x in range(30, 60) if quantized(x) and scheme_of(x) == "int8_g64")
    demoted = compressed_of(b"k1", (v, DEMOTED)).tobytes()
    assert len(demoted) < len(compressed_of(b"k1", v).tobytes())
    assert version_in(b"k1", demoted, {None, v, (v, DEMOTED)}) == (v, DEMOTED)
    assert version_in(b"k1", demoted, {None, v}) is None  # the old block's state is not it
    assert version_in(b"k1", compressed_of(b"k1", v).tobytes(), {(v, DEMOTED)}) is None


def test_a_change_a_flush_covered_that_is_missing_counts_as_lost(tmp_path):
    """Tell the checker a key was durable at a version no client ever stored: the run must
    report it lost (and only that)."""
    t = Tally()
    known = {b"crash-never": 123456789}
    crash_run(t, random.Random(1), f"file:{tmp_path / 'c.img'}:64M", str(tmp_path / "c.sock"),
              float("inf"), known)
    assert t.lost == 1 and t.corrupt == 0 and t.crashes == 0, t.problems
    assert "crash-never" in t.problems[0]


def test_quantized_blocks_stored_and_flushed_are_checked_after_a_restart(tmp_path):
    """The crash loop's quantized path end to end without a strike's timing: every scheme
    stored through the drive, flushed, the daemon stopped and started again, and each key
    found at its version, byte for byte and dequantized by the drive (a kill may land before
    a short run's first quantized store, so the soak alone cannot be relied on for this)."""
    import hostlib
    from ssdemu.tools.daemon_process import DaemonProcess

    media, sock = f"file:{tmp_path / 'q.img'}:64M", str(tmp_path / "q.sock")
    t = Tally()
    churn = _Churn(t, {})
    versions = {b"crash-%02d" % i: v for i, v in enumerate(range(0, 3 * 2 * len(QUANT_SCHEMES),
                                                                 QUANT_EVERY))}
    d = DaemonProcess(sock, media=media, extra=["--timing", "off"])
    try:
        with hostlib.connect(sock) as dev:
            churn.dev = dev
            for key, v in versions.items():
                churn.change(key, v)
            churn.flush()
    finally:
        assert d.terminate()[0] == 0
    assert t.quantized == len(versions)
    d = DaemonProcess(sock, media=media, extra=["--timing", "off"])
    known: dict = {}
    try:
        with hostlib.connect(sock) as dev:
            _check_keys(t, dev, churn.durable, churn.written, known)
    finally:
        assert d.terminate()[0] == 0
    assert t.lost == t.corrupt == 0, t.problems
    assert t.quantized_checked == len(versions) and known == versions
    assert {scheme_of(v) for v in versions.values()} == set(QUANT_SCHEMES)
