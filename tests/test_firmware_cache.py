"""A process that cannot write firmware/__pycache__ (another user's tree, a read-only mount)
runs the firmware from a cache of its own, seeded with the tree's compiled code: no compile,
no "cannot cache function" (which it failed with when the user had no writable home)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

import firmware

TREE_CACHE = pathlib.Path(firmware.__file__).resolve().parent / "__pycache__"

PROBE = """
from numba.core import config, event
compiled = []
class L(event.Listener):
    def on_start(self, e): compiled.append(str(e.data.get("dispatcher")))
    def on_end(self, e): pass
event.register("numba:compile", L())
import numpy as np
import firmware.entry
from firmware.quant import dequantize, quantize
x = np.arange(16 * 2 * 64, dtype=np.uint16).reshape(16, 2, 1, 1, 64) & 0x3bff
assert np.array_equal(dequantize(quantize(x, "fp16", "int8_g64"))[0].shape, x.shape)
print(config.CACHE_DIR)
print(len(compiled))
"""


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private mount)")
def test_a_read_only_tree_cache_is_copied_to_a_cache_of_ones_own(tmp_path):
    p = str(TREE_CACHE)
    script = (f"mount --bind {p} {p} && mount -o remount,bind,ro {p} && "
              f"exec {sys.executable} -c '{PROBE}'")
    env = dict(os.environ, XDG_CACHE_HOME="/dev/null/cache", TMPDIR=str(tmp_path))
    env.pop("NUMBA_CACHE_DIR", None)
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True,
                       text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    cache_dir, compiled = r.stdout.split()
    private = tmp_path / f"ssdemu-numba-{os.getuid()}"
    assert cache_dir == str(private)  # no writable home: a directory of its own in TMPDIR
    assert compiled == "0"  # everything came from the tree's cache, copied
    assert len(list(private.rglob("*.nbi"))) >= len(list(TREE_CACHE.glob("*.nbi")))


def test_a_temp_cache_directory_open_to_others_is_refused(tmp_path, monkeypatch):
    """Anyone can make /tmp/ssdemu-numba-<uid> first, with code in it for us to run."""
    monkeypatch.setenv("XDG_CACHE_HOME", "/dev/null/cache")  # no home cache can be made
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = firmware.private_cache_dir()
    assert path == tmp_path / f"ssdemu-numba-{os.getuid()}"
    assert path.stat().st_mode & 0o777 == 0o700
    path.chmod(0o777)
    with pytest.raises(RuntimeError, match="not a directory of this user's alone"):
        firmware.private_cache_dir()
