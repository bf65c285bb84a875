"""Page-aligned host buffers for O_DIRECT I/O, as numpy arrays."""

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


def alloc_aligned(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes whose start is page-aligned (anonymous mmap)."""
    if nbytes <= 0:
        raise ValueError(f"buffer size must be positive, got {nbytes}")
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # the array keeps the mmap alive through its base
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes)


def address_of(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]
