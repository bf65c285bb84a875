"""`ssdemu fs crash`: a filesystem on the drive through the drive's own power cuts (the
CrashMonkey workflow, with the drive cutting the power rather than a recorded block trace).

Each cycle: ext4 on the namespace (`fs up`: its mount replays the journal), every file whose
fsync returned in an earlier cycle read back and compared; writers make new files (write,
fsync the file, fsync its directory: only then is it durable, and recorded); the drive's power
is cut under them (`ctl fault power-cut`, seeded); the filesystem is taken down (`fs down`:
its I/O now fails, as a machine's whose disk lost power); when the drive is back, the
journal is replayed by a mount, and `e2fsck -fn` must find the filesystem clean.  The daemon
must run with `serve --power-cut` on media that outlive it (file: or block:), as admin.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import threading
import time

import hostlib
from ssdemu.tools import mount

BACK_WAIT_S = 60


def _back(socket_path: str) -> None:
    """Wait for the drive to serve again after a cut."""
    deadline = time.monotonic() + BACK_WAIT_S
    while True:
        try:
            hostlib.connect(socket_path).close()
            return
        except hostlib.ConnectError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the drive did not come back within {BACK_WAIT_S} s") from None
            time.sleep(0.01)


def _writer(directory: str, prefix: str, seed: int, durable: dict, stop: threading.Event,
            lock: threading.Lock, written: list) -> None:
    rng = random.Random(seed)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(1 << 30):
            if stop.is_set():
                return
            name = f"{prefix}{i}"
            data = rng.randbytes(rng.randrange(1, 256 << 10))
            try:
                with open(os.path.join(directory, name), "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.fsync(dfd)  # the directory entry too
            except OSError:
                return  # the drive lost power under it
            with lock:
                durable[name] = hashlib.blake2b(data).hexdigest()
                written[0] += 1
    finally:
        os.close(dfd)


def _forget(directory: str, durable: dict, prefix: str) -> None:
    """Delete the files of an older cycle (checked in every cycle since), durably, so that the
    filesystem never fills: a full one would end the writers before the cut."""
    gone = [name for name in durable if name.startswith(prefix)]
    for name in gone:
        os.unlink(os.path.join(directory, name))
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    for name in gone:
        del durable[name]


def _check(directory: str, durable: dict) -> tuple[list, list]:
    lost, corrupt = [], []
    for name, digest in durable.items():
        try:
            with open(os.path.join(directory, name), "rb") as f:
                if hashlib.blake2b(f.read()).hexdigest() != digest:
                    corrupt.append(name)
        except FileNotFoundError:
            lost.append(name)
    return lost, corrupt


def _fsck(socket_path: str, nsid: int, work: str) -> tuple[int, str]:
    """e2fsck -fn on the namespace's file (no loop device, no filesystem mounted)."""
    point = os.path.join(work, "fsck")
    os.makedirs(point, exist_ok=True)
    with mount.Mount(socket_path, point) as m:
        p = subprocess.run(["e2fsck", "-fn", m.files()[nsid]], capture_output=True, text=True)
    return p.returncode, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr


def crash_cycles(socket_path: str, nsid: int, cycles: int, work: str, *, seconds: float = 1.0,
                 writers: int = 2, seed: int = 0, progress=None) -> dict:
    """cycles power cuts under ext4 on nsid (made afresh first); what was lost, corrupt, and
    what e2fsck said after each."""
    fs = os.path.join(work, "fs")
    os.makedirs(fs, exist_ok=True)
    durable: dict[str, str] = {}
    out = {"cycles": 0, "durable_files": 0, "files_written": 0, "lost": [], "corrupt": [],
           "fsck_unclean": [], "seed": seed}
    rng = random.Random(seed)
    written = [0]  # files made durable, over all cycles
    with hostlib.connect(socket_path) as dev:
        if not dev.identify()["power_cut_emulation"]:
            raise RuntimeError("the drive does not emulate power cuts: start it with serve "
                               "--power-cut, on file: or block: media")
    for cycle in range(cycles):
        mount.fs_up(socket_path, nsid, fs, mkfs=cycle == 0)
        try:
            lost, corrupt = _check(fs, durable)
            out["lost"] = sorted(set(out["lost"]) | set(lost))
            out["corrupt"] = sorted(set(out["corrupt"]) | set(corrupt))
            _forget(fs, durable, f"c{cycle - 3}w")  # room for this cycle's files
            stop, lock = threading.Event(), threading.Lock()
            threads = [threading.Thread(target=_writer, args=(
                fs, f"c{cycle}w{w}-", rng.randrange(1 << 30), durable, stop, lock, written))
                for w in range(writers)]
            for t in threads:
                t.start()
            try:
                time.sleep(seconds * (0.5 + rng.random()))  # the cut lands anywhere
                with hostlib.connect(socket_path) as dev:
                    dev.power_cut(rng.randrange(1 << 30))
            finally:
                stop.set()
                for t in threads:
                    t.join()
        finally:
            mount.fs_down(fs)
        _back(socket_path)
        mount.fs_up(socket_path, nsid, fs)  # the journal replayed by the mount
        mount.fs_down(fs)
        code, said = _fsck(socket_path, nsid, work)
        if code != 0:
            out["fsck_unclean"].append({"cycle": cycle, "exit": code, "said": said})
        out["cycles"] = cycle + 1
        out["durable_files"] = len(durable)
        out["files_written"] = written[0]
        if progress:
            progress(out)
    mount.fs_up(socket_path, nsid, fs)  # the last cycle's files, checked too
    try:
        lost, corrupt = _check(fs, durable)
    finally:
        mount.fs_down(fs)
    out["lost"] = sorted(set(out["lost"]) | set(lost))
    out["corrupt"] = sorted(set(out["corrupt"]) | set(corrupt))
    return out
