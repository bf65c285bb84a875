"""Integer sections (scales, zero points, codes) that the group-wise integer kind and KIVI
lay out alike (firmware/kind_int.py, firmware/kind_kivi.py)."""

import numpy as np
from numba import njit

from firmware import sizes
from firmware.blockparams import HEADER_BYTES, _pad8

# the sizes are plain Python (firmware/sizes.py), compiled inline where the kernels call them
int_section_used, int_section_bytes = sizes.int_section_used, sizes.int_section_bytes


@njit(cache=True, nogil=True, error_model="numpy")
def _int_views(body, n, group, bits, symmetric):
    """Scales, zero points (empty when symmetric) and codes of an int section."""
    used = int_section_used(n, group, bits, symmetric)
    ng = (n + group - 1) // group
    nz = 0 if symmetric else ng
    scales = body[:4 * ng].view(np.float32)
    zeros = body[4 * ng:4 * (ng + nz)].view(np.float32)
    codes = body[4 * (ng + nz):used]
    return scales, zeros, codes


@njit(cache=True, nogil=True, error_model="numpy")
def _int_views_zeroed(body, n, group, bits, symmetric):
    """_int_views of a section being written, its padding zeroed: a block's bytes depend on
    its contents only."""
    used = int_section_used(n, group, bits, symmetric)
    body[used:_pad8(used)] = 0
    return _int_views(body, n, group, bits, symmetric)


PIECE = 1 << 15  # elements per kernel call when the codes are summed: they stay in L2


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _codes_at(n, group, symmetric):
    """The offset of an int block's codes in the block (after its scales and zeros)."""
    return HEADER_BYTES + 4 * ((n + group - 1) // group) * (1 if symmetric else 2)
