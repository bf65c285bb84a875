"""Backing media of the emulated drive: `file:PATH[:SIZE]`, `block:/dev/NAME`, `mem:SIZE`.

All three open as an O_DIRECT file descriptor with a size and a logical block size, so the
engine sees one interface.  Parsing a spec is pure (`parse_media_spec`); opening does the I/O.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from ssdemu.device import _device
from ssdemu.errors import MediaError
from ssdemu.units import parse_size

KINDS = ("file", "block", "mem")


@dataclass(frozen=True)
class MediaSpec:
    kind: str
    path: str | None = None
    size: int | None = None

    def __str__(self) -> str:
        if self.kind == "mem":
            return f"mem:{self.size}"
        if self.size is not None:
            return f"{self.kind}:{self.path}:{self.size}"
        return f"{self.kind}:{self.path}"


def parse_media_spec(text: str) -> MediaSpec:
    """Parse a media spec; raises MediaError naming what is wrong."""
    kind, sep, rest = str(text).partition(":")
    if not sep or kind not in KINDS:
        raise MediaError(
            f"bad media spec {text!r}: expected file:PATH[:SIZE], block:/dev/NAME or mem:SIZE"
        )
    if kind == "mem":
        try:
            size = parse_size(rest)
        except ValueError as e:
            raise MediaError(f"bad media spec {text!r}: {e}") from None
        if size <= 0:
            raise MediaError(f"bad media spec {text!r}: size must be positive")
        return MediaSpec("mem", None, size)
    if not rest:
        raise MediaError(f"bad media spec {text!r}: no path")
    if kind == "block":
        return MediaSpec("block", rest, None)
    path, colon, tail = rest.rpartition(":")
    if colon and path:
        try:
            return MediaSpec("file", path, parse_size(tail))
        except ValueError:
            pass  # the colon belongs to the path
    return MediaSpec("file", rest, None)


class Media:
    """An open O_DIRECT media.  `size` is rounded down to whole logical blocks."""

    def __init__(self, spec: MediaSpec, fd: int, keepalive_fd: int | None = None, note: str = ""):
        self.spec = spec
        self.fd = fd
        self._keepalive_fd = keepalive_fd
        self.note = note
        size = _device.ffi.new("uint64_t *")
        lba = _device.ffi.new("uint32_t *")
        is_block = _device.ffi.new("uint32_t *")
        ret = _device.lib.sde_media_probe(fd, size, lba, is_block)
        if ret < 0:
            self.close()
            raise MediaError(f"cannot probe media {spec}: {os.strerror(-ret)}")
        self.size = int(size[0])
        self.lba_size = int(lba[0])
        self.is_block = bool(is_block[0])
        if self.size == 0:
            self.close()
            raise MediaError(f"media {spec} is smaller than one {self.lba_size}-byte block")

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def fio_path(self) -> str:
        """A path another process (fio) can open to reach the same bytes."""
        if self.spec.kind == "mem":
            return f"/proc/{os.getpid()}/fd/{self.fd}"
        return self.spec.path

    def close(self) -> None:
        for fd in (self.fd, self._keepalive_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.fd = -1
        self._keepalive_fd = None

    def __enter__(self) -> Media:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Media({self.spec}, size={self.size}, lba={self.lba_size})"


def _open_direct(path: str, flags: int, spec: MediaSpec) -> int:
    try:
        return os.open(path, flags | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise MediaError(
                f"cannot open media {spec}: the filesystem does not support O_DIRECT"
            ) from None
        raise MediaError(f"cannot open media {spec}: {e.strerror}") from None


def open_media(spec: MediaSpec | str) -> Media:
    """Open (creating a file or memory media when needed) with O_DIRECT."""
    if isinstance(spec, str):
        spec = parse_media_spec(spec)
    if spec.kind == "mem":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if spec.size > ram:  # it would be killed when the pages are touched, not now
            raise MediaError(f"cannot open media {spec}: {spec.size:,} bytes is more than this "
                             f"host's memory ({ram:,} bytes)")
        mfd = os.memfd_create("ssdemu-mem", os.MFD_CLOEXEC)
        try:
            os.ftruncate(mfd, spec.size)
        except OSError as e:
            os.close(mfd)
            raise MediaError(f"cannot size media {spec}: {e.strerror}") from None
        # memfd_create gives no O_DIRECT; reopening through /proc opens the same shmem file
        # with it (tmpfs supports O_DIRECT since Linux 6.6).
        try:
            fd = _open_direct(f"/proc/self/fd/{mfd}", os.O_RDWR, spec)
        except MediaError:
            os.close(mfd)
            raise
        return Media(spec, fd, keepalive_fd=mfd)
    if spec.kind == "block":
        try:
            st = os.stat(spec.path)
        except OSError as e:
            raise MediaError(f"cannot open media {spec}: {e.strerror}") from None
        if not stat.S_ISBLK(st.st_mode):
            raise MediaError(f"cannot open media {spec}: {spec.path} is not a block device")
        return Media(spec, _open_direct(spec.path, os.O_RDWR, spec))
    # file
    note = ""
    if os.path.exists(spec.path):
        if not os.path.isfile(spec.path):
            raise MediaError(f"cannot open media {spec}: {spec.path} is not a regular file")
        have = os.path.getsize(spec.path)
        if spec.size is not None and spec.size != have:
            note = f"{spec.path} exists with {have} bytes; kept as is (never truncated)"
        fd = _open_direct(spec.path, os.O_RDWR, spec)
    else:
        if spec.size is None:
            raise MediaError(
                f"cannot open media {spec}: {spec.path} does not exist; "
                f"give a size to create it (file:{spec.path}:SIZE)"
            )
        try:
            fs = os.statvfs(os.path.dirname(os.path.abspath(spec.path)))
        except OSError:
            fs = None  # no such directory: the open below says so
        if fs and spec.size > fs.f_blocks * fs.f_frsize:  # sparse, but never fillable
            raise MediaError(f"cannot open media {spec}: {spec.size:,} bytes is more than its "
                             f"filesystem holds ({fs.f_blocks * fs.f_frsize:,} bytes)")
        fd = _open_direct(spec.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, spec)
        try:
            os.ftruncate(fd, spec.size)  # sparse
        except OSError as e:
            os.close(fd)
            raise MediaError(f"cannot size media {spec}: {e.strerror}") from None
    return Media(spec, fd, note=note)
