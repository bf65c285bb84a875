"""The client installs alone (pip install ./clients/python: hostlib and the wire format, with
numpy and cffi only) and does a KV round trip with a running daemon."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import venv

import pytest

from ssdemu.tools.daemon_process import DaemonProcess

pytestmark = pytest.mark.external  # pip and a venv: `make test-fast` skips it

ROOT = pathlib.Path(__file__).resolve().parent.parent

CLIENT = r"""
import sys, hostlib
with hostlib.connect(sys.argv[1]) as dev:
    dev.kv_put(b"client-venv-key", b"round trip")
    assert dev.kv_get(b"client-venv-key") == b"round trip"
    print(dev.identify()["profile"])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"numba", "firmware", "ssdemu",
                                                         "yaml", "matplotlib"})
print("device modules:", heavy)
"""


def test_the_client_alone_talks_to_a_daemon(tmp_path):
    env_dir = tmp_path / "client-venv"
    # a venv of its own, filled by this environment's pip (--python): ensurepip would take
    # 3.5 of the test's 9 s to put a pip in it
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    p = subprocess.run([*pip, "install", "-q", str(ROOT / "clients" / "python")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    p = subprocess.run([*pip, "list", "--format=freeze"], capture_output=True,
                       text=True, timeout=60)
    installed = {line.split("==")[0].lower() for line in p.stdout.split()}
    assert "ssdemu-hostlib" in installed and not installed & {"numba", "ssdemu", "pyyaml"}
    d = DaemonProcess(str(tmp_path / "s.sock"))
    try:
        p = subprocess.run([str(py), "-c", CLIENT, d.socket_path], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)  # not the checkout
        assert p.returncode == 0, p.stderr
        assert p.stdout.split("\n")[:2] == ["star2000d", "device modules: []"]
    finally:
        assert d.terminate()[0] == 0
    assert sys.executable != str(py)
