"""Software prefetch inside Numba kernels (LLVM's `llvm.prefetch`): a hint that brings the
cache lines of a range of an array in while the kernel works on the range before it.

The retrieval kernels read a sequence's KV a page at a time at pages the scores chose, all
over a layer of megabytes that the decode step's previous command left out of the caches:
every page started with misses the hardware prefetcher cannot guess (measured: the re-rank
281 us on a layer in cache, 424 us on one that is not; attention 133 and 253).  A hint never
faults, so a range past an array's end is harmless (nothing is read from it)."""

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

LINE = 64  # bytes of a cache line on x86-64 and most AArch64 cores


@intrinsic
def prefetch(typingctx, arr, offset):
    """Hint that element `offset` of C-contiguous `arr` (counted flat) will be read soon:
    into every cache level (locality 3), for a read."""
    if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        at = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [at]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep, data cache
        return context.get_dummy_value()

    return types.void(arr, offset), codegen


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def prefetch_range(arr, start, count):
    """Hint elements [start, start + count) of C-contiguous arr (flat), a line at a time."""
    step = max(1, LINE // arr.itemsize)
    for at in range(start, start + count, step):
        prefetch(arr, at)
    prefetch(arr, start + count - 1)  # the last line, when the range does not start on one
