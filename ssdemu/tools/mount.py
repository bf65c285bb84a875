"""The drive for unmodified software: its namespaces as files (`ssdemu mount`, FUSE), and a real
filesystem on one of them (`ssdemu fs up` / `fs down`: the file through a loop device, ext4 on
that).

    ssdemu mount --socket S DIR                      # DIR/nsN, one file a namespace
    ssdemu fs up --socket S --nsid N --mkfs DIR      # ext4 at DIR, every I/O the drive's
    ssdemu fs down DIR                               # and all of it undone

The mount is c/mount/sde_mount.c (libfuse3 over the C client: no Python in a request's path),
built by `make mount`.  `fs up` keeps what it made in a private directory beside DIR
(.ssdemu-fs-*: the FUSE mount point and its log); `fs down` finds it again from DIR's loop
device alone, so that it needs no state file that could go stale: DIR's device, the
device's backing file, that file's mount.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
import weakref

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = ROOT / "build" / "mount" / "ssdemu-mount"
FSTYPE = "fuse.ssdemu"
MOUNT_WAIT_S = 10
PRIVATE = ".ssdemu-fs-"  # the folder `fs up` keeps its drive mount in, beside DIR


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class MountError(RuntimeError):
    """A mount, loop device or filesystem step that failed; the message says which, and why."""


def binary() -> str:
    if not BINARY.is_file():
        raise MountError(f"the mount is not built ({BINARY}): run `make mount` (it needs "
                         "libfuse3-dev)")
    return str(BINARY)


def argv(socket_path: str, directory: str, owner_key_file: str | None = None) -> list[str]:
    return [binary(), socket_path, directory, *([owner_key_file] if owner_key_file else [])]


def mounts() -> list[tuple[str, str, str]]:
    """(device, mount point, type) of each mount, as /proc/self/mounts has them."""
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, point, kind = line.split()[:3]
            out.append((dev, point.replace("\\040", " "), kind))
    return out


def mounted(directory: str, kind: str | None = None) -> str | None:
    """The device mounted at directory (of that type), or None."""
    real = os.path.realpath(directory)
    for dev, point, k in reversed(mounts()):
        if point == real and (kind is None or k == kind):
            return dev
    return None


class Mount:
    """A running `ssdemu-mount` (its own process), stopped with SIGTERM: libfuse unmounts."""

    def __init__(self, socket_path: str, directory: str, owner_key_file: str | None = None,
                 log_path: str | None = None):
        self.directory = os.path.realpath(directory)
        # its stderr to a file, never an unread pipe: a mount that filled one would block
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="ssdemu-mount-", suffix=".log")
            os.close(fd)
            weakref.finalize(self, _unlink, log_path)
        self.log_path = log_path
        with open(log_path, "a") as log:
            self.proc = subprocess.Popen(argv(socket_path, directory, owner_key_file),
                                         stdout=subprocess.DEVNULL, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not mounted(self.directory, FSTYPE):
            if self.proc.poll() is not None:
                with open(log_path) as f:
                    err = f.read().strip()
                raise MountError(err.splitlines()[-1] if err
                                 else f"ssdemu-mount exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise MountError(f"{directory}: not mounted after {MOUNT_WAIT_S} s")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def files(self) -> dict[int, str]:
        """nsid: its file."""
        return {int(n[2:]): os.path.join(self.directory, n)
                for n in sorted(os.listdir(self.directory)) if n.startswith("ns")}

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if mounted(self.directory, FSTYPE):  # killed before it could unmount
            subprocess.run(["fusermount3", "-u", "-z", self.directory], capture_output=True)
        return self.proc.returncode

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise MountError(f"{what} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout.strip()


def fs_up(socket_path: str, nsid: int, directory: str, *, mkfs: bool = False,
          owner_key_file: str | None = None, mkfs_args: tuple[str, ...] = ()) -> str:
    """ext4 (made first with mkfs) on namespace nsid, mounted at directory; returns the loop
    device.  Each step undone if a later one fails."""
    if not os.path.isdir(directory):
        raise MountError(f"{directory} is not a directory")
    if mounted(directory):
        raise MountError(f"{directory} is busy: something is mounted there already")
    # beside the mount point: what one `fs up` made lies in one folder, found again by `fs
    # down`, and removed with the folder that holds it
    private = tempfile.mkdtemp(prefix=PRIVATE, dir=os.path.dirname(os.path.realpath(directory)))
    os.mkdir(os.path.join(private, "fuse"))
    undo: list = [lambda: shutil.rmtree(private, ignore_errors=True)]
    try:
        m = Mount(socket_path, os.path.join(private, "fuse"), owner_key_file,
                  log_path=os.path.join(private, "mount.log"))
        undo.append(m.stop)
        path = m.files().get(nsid)
        if path is None:
            raise MountError(f"namespace {nsid} is not one of this client's with blocks "
                             f"(the mount has {sorted(m.files()) or 'none'})")
        loop = _run(["losetup", "-f", "--show", "--direct-io=on", path], "losetup")
        undo.append(lambda: subprocess.run(["losetup", "-d", loop], capture_output=True))
        if mkfs:
            _run(["mkfs.ext4", "-q", "-F", *mkfs_args, loop], "mkfs.ext4")
        _run(["mount", "-t", "ext4", loop, directory], f"mount {loop}")
        return loop
    except BaseException:
        for step in reversed(undo):
            step()
        raise


def fs_down(directory: str) -> None:
    """Undo fs_up: unmount directory, detach its loop device, stop the drive's mount."""
    loop = mounted(directory, "ext4")
    if loop is None or not loop.startswith("/dev/loop"):
        raise MountError(f"{directory}: no ext4 on a loop device is mounted there")
    backing_path = pathlib.Path("/sys/block", os.path.basename(loop), "loop", "backing_file")
    backing = backing_path.read_text().strip()
    fuse_dir = os.path.dirname(backing)
    private = os.path.dirname(fuse_dir)
    if mounted(fuse_dir, FSTYPE) is None or not os.path.basename(private).startswith(PRIVATE):
        raise MountError(f"{directory}'s {loop} is not on a drive that `ssdemu fs up` mounted")
    _run(["umount", directory], f"umount {directory}")
    _run(["losetup", "-d", loop], f"losetup -d {loop}")
    _run(["fusermount3", "-u", fuse_dir], f"unmounting the drive at {fuse_dir}")
    shutil.rmtree(private, ignore_errors=True)
