/*
 * A map from indexes [0, n) to 32-bit values in runs, for the FTL's two mappings (logical unit
 * -> physical unit and back).  The indexes are cut into segments of 64: a segment whose mapped
 * indexes i hold base + i is one base and a 64-bit mask (16 bytes for 64 units); only a
 * segment whose values are not one run holds its 64 values (in a pool).  A drive written in
 * large runs (a replay's blocks of thousands of units) then keeps and touches a sixteenth of
 * the memory of one value per unit: the per-unit tables were 78 MiB for a 75 GB drive at 8 KiB
 * units, and appending and trimming them ran at memory bandwidth.  Small random writes fall
 * back to the per-unit values, segment by segment.  No allocation after sde_segmap_new: the
 * pool has room for every segment (untouched memory costs nothing).
 */
#ifndef SDE_SEGMAP_H
#define SDE_SEGMAP_H
#include <stdint.h>

/* CDEF-BEGIN */
#define SDE_SEGMAP_NONE 4294967295 /* an unmapped index's value (UINT32_MAX) */
typedef struct sde_segmap sde_segmap;
/* -ENOMEM, -EINVAL (n of 0, or past 2^38) */
int sde_segmap_new(uint64_t n, sde_segmap **out);
void sde_segmap_free(sde_segmap *s);
/* The value of index i (< n), SDE_SEGMAP_NONE when unmapped. */
uint32_t sde_segmap_get(const sde_segmap *s, uint64_t i);
/* The run at i (i < limit <= n): *v is i's value; returns how many indexes from i on (at
 * least 1, at most limit - i) hold v, v + 1, ... (or are all unmapped, when v is NONE). */
uint64_t sde_segmap_run(const sde_segmap *s, uint64_t i, uint64_t limit, uint32_t *v);
/* Map [i, i + k) to v, v + 1, ... (every index of it unmapped before; v + k - 1 < NONE). */
void sde_segmap_set(sde_segmap *s, uint64_t i, uint64_t k, uint32_t v);
/* Unmap [i, i + k); each run of values it removes, in index order, goes to gone(ctx, first
 * value, count) when gone is not NULL.  Returns the count of indexes that were mapped. */
typedef void (*sde_segmap_gone)(void *ctx, uint32_t v, uint32_t n);
uint64_t sde_segmap_clear(sde_segmap *s, uint64_t i, uint64_t k, sde_segmap_gone gone,
                          void *ctx);
/* Segments holding per-index values now (how far a workload is from runs). */
uint64_t sde_segmap_spilled(const sde_segmap *s);
/* CDEF-END */
#endif
