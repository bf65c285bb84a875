"""The suite's daemons, forked from a server that imported the daemon once
(ssdemu.tools.daemon_process.launcher; tests/conftest.py installs it in each worker).

`python -m ssdemu serve` spends most of its start importing (numpy, the C extensions, the
daemon's modules: ~0.15 s of CPU, more than the whole life of most tests' daemons, and the
suite starts ~300).  multiprocessing's fork server imports them once per worker; each daemon
is a fork of it running `ssdemu serve ARGV` with stderr on its log file: a process of its
own like any other (its pid, signals, exit code; a power cut re-executes it as `python -m
ssdemu serve`).  The CLI's own runs (`ssdemu replay --mode data`, torture, the benches)
start theirs as a user's do: a new interpreter each, and so does a test that passes
DaemonProcess its `python` (one that needs the interpreter's own start, a sitecustomize).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile

from ssdemu.tools import daemon_process

# what `ssdemu serve` imports, loaded once in the fork server
PRELOAD = ["ssdemu.cli", "ssdemu.device.daemon", "ssdemu.device.media", "ssdemu.device.quotas",
           "daemon_fork"]


def install() -> None:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    daemon_process.launcher = lambda argv, log_path: ForkedDaemon(ctx, argv, log_path)


def _serve(argv: list[str], log_path: str, inherit: dict) -> None:
    """The daemon: `ssdemu ARGV`, stderr to log_path, as `python -m ssdemu` would run it,
    with what a child inherits from the test that starts it: its environment, working
    directory, CPUs and umask (a fork inherits the server's)."""
    os.environ.clear()
    os.environ.update(inherit["env"])
    tempfile.tempdir = None  # TMPDIR read again
    os.chdir(inherit["cwd"])
    os.sched_setaffinity(0, inherit["cpus"])
    os.umask(inherit["umask"])
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.dup2(null, 1)
    os.close(fd)
    os.close(null)
    sys.argv = ["ssdemu", *argv]  # a power-on after a cut re-executes sys.argv[1:]
    from ssdemu.cli import main

    code = main(argv)
    sys.stderr.flush()
    sys.exit(code)


class ForkedDaemon:
    """The subprocess.Popen calls made on a daemon, for one forked from the server."""

    def __init__(self, ctx, argv: list[str], log_path: str):
        self._log_path = log_path
        umask = os.umask(0)
        os.umask(umask)
        inherit = {"env": dict(os.environ), "cwd": os.getcwd(),
                   "cpus": os.sched_getaffinity(0), "umask": umask}
        self._proc = ctx.Process(target=_serve, args=(argv, log_path, inherit))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired("ssdemu serve", timeout)
        return self._proc.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[None, str]:
        """Waits for the exit; stdout went to /dev/null, stderr is the log file's contents."""
        self.wait(timeout)
        with open(self._log_path) as f:
            return None, f.read()

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:  # not one reaped, whose pid may be reused
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
