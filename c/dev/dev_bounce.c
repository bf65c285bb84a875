/* The daemon's own buffers for a command's bytes: a KV value's partial last block, a
 * quantized store's output, a dequantized retrieve's compressed input, a prefix hash's
 * chain, block I/O from a buffer registered as a bounce.
 *
 * Each context keeps the last buffer it used (its spare), so that the next command on it
 * finds its pages mapped.  One taken fresh from malloc for every command was handed back
 * to the kernel by glibc's trimming of the thread's heap and faulted in and zeroed again
 * by the next command's I/O: page faults, clear_page and unmapping were ~8% of the daemon's
 * CPU in dequantized retrieves at QD32, whose rate was 0.63 of the bare kernel's against
 * 0.81-0.87 with glibc's trimming turned off.  A buffer is a power of two of pages, so that
 * sizes repeat; what is kept is bounded, in all and per buffer.  The data plane alone takes
 * and drops them (under the device lock). */
#include "dev_internal.h"

#define BOUNCE_KEEP_MAX (8ull << 20)    /* a larger buffer is freed when dropped */
#define BOUNCE_KEEP_TOTAL (64ull << 20) /* spares over all contexts, at most */

static uint64_t bounce_size(uint64_t n)
{
    if (n > BOUNCE_KEEP_MAX)
        return (n + 4095) & ~4095ull;
    uint64_t s = 4096;
    while (s < n)
        s <<= 1;
    return s;
}

static void spare_free(sde_dev *dev, struct dev_ctx *x)
{
    if (!x->spare)
        return;
    free(x->spare);
    dev->bounce_kept -= x->spare_cap;
    x->spare = NULL;
    x->spare_cap = 0;
}

uint8_t *dev_bounce_take(sde_dev *dev, struct dev_ctx *x, uint64_t n)
{
    dev_bounce_drop(dev, x); /* one at a time: a command that takes another gives its first */
    if (x->spare && x->spare_cap >= n) {
        x->bounce = x->spare;
        x->bounce_cap = x->spare_cap;
        dev->bounce_kept -= x->spare_cap;
        x->spare = NULL;
        x->spare_cap = 0;
        return x->bounce;
    }
    spare_free(dev, x); /* too small for this one: a larger one replaces it */
    uint64_t size = bounce_size(n);
    void *p = NULL;
    if (posix_memalign(&p, 4096, size))
        return NULL;
    x->bounce = p;
    x->bounce_cap = size;
    return p;
}

void dev_bounce_drop(sde_dev *dev, struct dev_ctx *x)
{
    if (!x->bounce)
        return;
    spare_free(dev, x);
    if (x->bounce_cap <= BOUNCE_KEEP_MAX && dev->bounce_kept + x->bounce_cap <= BOUNCE_KEEP_TOTAL) {
        x->spare = x->bounce;
        x->spare_cap = x->bounce_cap;
        dev->bounce_kept += x->bounce_cap;
    } else {
        free(x->bounce);
    }
    x->bounce = NULL;
    x->bounce_cap = 0;
}

void dev_bounce_free_all(sde_dev *dev, struct dev_ctx *x)
{
    free(x->bounce);
    x->bounce = NULL;
    x->bounce_cap = 0;
    spare_free(dev, x);
}
