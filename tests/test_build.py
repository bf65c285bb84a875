"""The cffi build stops with one line when liburing cannot be compiled against."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_missing_liburing_is_one_line(tmp_path):
    fake_cc = tmp_path / "cc"
    fake_cc.write_text("#!/bin/sh\necho 'liburing.h: No such file' >&2\nexit 1\n")
    fake_cc.chmod(0o755)
    env = dict(os.environ, CC=str(fake_cc))
    p = subprocess.run([sys.executable, str(ROOT / "c" / "cffi_build.py")], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    assert p.returncode != 0
    assert p.stderr.strip() == (
        "ssdemu: liburing headers not found: install them with 'apt-get install liburing-dev'"
    )
