"""Errors of the host layer.  Negative errno values from the C engine become these exceptions in
one place (`raise_for_errno`), so callers catch by kind, not by number."""

import errno
import os


class SsdemuError(Exception):
    """Base class of every error ssdemu raises on purpose."""


class MediaError(SsdemuError):
    """The backing media cannot be opened or used as asked."""


class EngineError(SsdemuError):
    """An io_uring engine call failed; `errno` holds the positive errno."""

    def __init__(self, err: int, what: str):
        self.errno = err
        super().__init__(f"{what}: {describe_errno(-err)}")


# The engine's own meaning for the errnos it returns before an I/O reaches the kernel.
_ENGINE_MEANINGS = {
    errno.EINVAL: "misaligned or malformed I/O (offset, length and buffer must be multiples of "
    "the media's logical block size)",
    errno.ENXIO: "offset past the end of the media",
    errno.ENOSPC: "write at the end of the media",
    errno.EFAULT: "buffer outside its registered region, or a null address",
}


def describe_errno(res: int) -> str:
    """Text for an I/O result `res` (negative errno), as the engine means it."""
    err = -res
    name = errno.errorcode.get(err, f"errno {err}")
    meaning = _ENGINE_MEANINGS.get(err, os.strerror(err))
    return f"{name} ({meaning})"


def raise_for_errno(res: int, what: str) -> int:
    """Return res when it is not an error; raise EngineError for a negative errno."""
    if res < 0:
        raise EngineError(-res, what)
    return res
