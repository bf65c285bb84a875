"""Starting and stopping a real `ssdemu serve` process (tests, benchmarks, the demo)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


class DaemonProcess:
    def __init__(self, socket_path: str, media: str = "mem:64M", extra=()):
        self.socket_path = socket_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ssdemu", "serve", "--media", media, "--socket",
             socket_path, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(socket_path):
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("daemon did not start")
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def mappings(self, name: str) -> int:
        with open(f"/proc/{self.pid}/maps") as f:
            return sum(name in line for line in f)

    def terminate(self, timeout: float = 20) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
