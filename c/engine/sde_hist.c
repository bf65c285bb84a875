/* The latency histogram's bucket <-> value mapping (c/engine/sde_hist.h): pure arithmetic,
 * shared by the engine, the device's log pages and the client-side bench loop. */
#include "sde_hist.h"

uint32_t sde_hist_bucket(uint64_t ns)
{
    const uint64_t sub = 1ull << SDE_HIST_SUB_BITS;
    if (ns < sub)
        return (uint32_t)ns;
    int msb = 63 - __builtin_clzll(ns);
    int shift = msb - SDE_HIST_SUB_BITS;
    uint64_t mant = ns >> shift; /* in [sub, 2*sub) */
    return (uint32_t)((uint64_t)(shift + 1) * sub + (mant - sub));
}

uint64_t sde_hist_value(uint32_t bucket)
{
    const uint64_t sub = 1ull << SDE_HIST_SUB_BITS;
    if (bucket < sub)
        return bucket;
    uint64_t shift = bucket / sub - 1;
    uint64_t mant = bucket % sub + sub;
    /* the middle of the bucket's range, so percentiles are unbiased */
    return (mant << shift) + ((1ull << shift) >> 1);
}

