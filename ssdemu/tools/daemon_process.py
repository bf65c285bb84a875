"""Starting and stopping a real `ssdemu serve` process (tests, benchmarks, the demo)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import weakref

from ssdemu_wire.control import MAX_SOCKET_PATH

# Starts `ssdemu ARGV` with stderr on a log file and gives the subprocess.Popen calls made
# here and by DaemonProcess's users (poll, wait, communicate, send_signal, kill, pid,
# returncode), in place of a new `python -m ssdemu` process; None: that process.  The test
# suite sets it to fork its ~300 daemons from a server that imported the daemon once
# (tests/daemon_fork.py).
launcher = None


def socket_dir(prefix: str, name: str = "s.sock") -> str:
    """A new private directory for a daemon's socket `name`: under TMPDIR, or under /tmp when
    TMPDIR's path is too long for a Unix socket's (a pytest-xdist worker's tmp_path is)."""
    d = tempfile.mkdtemp(prefix=prefix)
    if len(os.path.join(d, name).encode()) <= MAX_SOCKET_PATH:
        return d
    os.rmdir(d)
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


@contextlib.contextmanager
def private_daemon(prefix: str, media: str, extra=()):
    """A daemon on `media` (`extra`: more `serve` arguments), its socket and log in a new
    private directory: yields it; then stops it, removes the directory, and raises
    RuntimeError when it did not exit cleanly (a benchmark's figures from a daemon that
    crashed are not figures)."""
    where = socket_dir(prefix, "sde.sock")
    try:
        d = DaemonProcess(os.path.join(where, "sde.sock"), media=media, extra=extra,
                          log_path=os.path.join(where, "log"))
    except BaseException:  # it did not start: its error carries the log's tail
        shutil.rmtree(where, ignore_errors=True)
        raise
    try:
        yield d
    finally:
        code, err = d.terminate()
        shutil.rmtree(where, ignore_errors=True)
    if code != 0:
        raise RuntimeError(f"the daemon exited {code}: {err[-500:]}")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class DaemonProcess:
    def __init__(self, socket_path: str, media: str = "mem:64M", extra=(),
                 log_path: str | None = None, python: str | None = None):
        """log_path: the daemon's log goes to that file (a long run would fill a pipe no one
        reads); otherwise to a pipe that terminate() returns.  python: the interpreter to run
        it with (default: this one's, or `launcher`'s when set)."""
        self.socket_path = socket_path
        self.log_path = log_path
        try:  # a socket left by a daemon that was killed: the wait below must see the new one
            if os.path.exists(socket_path) and stat.S_ISSOCK(os.lstat(socket_path).st_mode):
                os.unlink(socket_path)
        except FileNotFoundError:
            pass
        self._own_log = None  # a forked daemon's log when the caller named none
        argv = ["serve", "--media", media, "--socket", socket_path, *extra]
        if launcher is not None and python is None:
            if not log_path:
                fd, self._own_log = tempfile.mkstemp(prefix="ssdemu-daemon-", suffix=".log")
                os.close(fd)
                weakref.finalize(self, _unlink, self._own_log)
            self.proc = launcher(argv, log_path or self._own_log)
        else:
            log = open(log_path, "a") if log_path else subprocess.PIPE  # noqa: SIM115
            self.proc = subprocess.Popen(
                [python or sys.executable, "-m", "ssdemu", *argv],
                stdout=subprocess.DEVNULL if log_path else subprocess.PIPE, stderr=log,
                text=True)
            if log_path:
                log.close()  # the child has its own
        deadline = time.monotonic() + 30
        while not os.path.exists(socket_path):
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("daemon did not start")
            time.sleep(0.005)  # a start takes ~0.2 s: a 20 ms poll added ~10 ms to each

    @property
    def pid(self) -> int:
        return self.proc.pid

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def mappings(self, name: str) -> int:
        with open(f"/proc/{self.pid}/maps") as f:
            return sum(name in line for line in f)

    def log_tail(self, n: int = 2000) -> str:
        """The end of the daemon's log (once it has exited, when it goes to a pipe)."""
        path = self.log_path or self._own_log
        if path:
            with open(path) as f:
                return f.read()[-n:]
        return self.proc.stderr.read()[-n:] if self.proc.poll() is not None else ""

    def terminate(self, timeout: float = 20) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.proc.returncode, self.log_tail(1 << 20) if self.log_path else err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
