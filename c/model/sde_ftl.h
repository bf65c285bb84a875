/*
 * The flash translation layer's bookkeeping (no timing: c/model books the NAND work
 * it asks for).  Page-level mapping in 4 KiB units (larger at a declared scale), as FEMU's and NVMeVirt's conventional
 * FTLs do: a logical unit lives in one physical slot; a write appends to an open line (a
 * superblock: one block on every die) and invalidates the unit's old slot; a trim only
 * invalidates.  Two write points, host and GC, so that relocated (cold) data does not mix
 * with new writes.  When free lines fall to the threshold, greedy GC picks the full line
 * with the fewest valid units; the model relocates them and erases the line.
 *
 * Slots of a line are in program order: slot s of line l is physical unit
 * l * units_per_line + s, and the model lays physical units out on the dies as it lays
 * logical ones out without an FTL (die-rows striped channel-first), so an append stream is
 * a sequential physical stream and a large write still takes the bulk path.
 */
#ifndef SDE_FTL_H
#define SDE_FTL_H
#include <stdint.h>

#define SDE_FTL_UNMAPPED UINT32_MAX

typedef struct sde_ftl sde_ftl;

/* logical_units: the user capacity in 4 KiB units; lines and units_per_line: the physical
 * space (lines * units_per_line > logical_units + gc_free_lines * units_per_line, the
 * difference is the over-provisioning); gc_free_lines: GC runs while free lines are at most
 * this.  -EINVAL when the physical space cannot hold the logical one with room for GC. */
int sde_ftl_new(uint64_t logical_units, uint32_t lines, uint32_t units_per_line,
                uint32_t gc_free_lines, sde_ftl **out);
void sde_ftl_free(sde_ftl *f);

/* The run at u (< logical units): *phys is u's place (SDE_FTL_UNMAPPED or a physical unit);
 * returns how many units from u on live at *phys, *phys + 1, ... (or are all unmapped). */
uint64_t sde_ftl_lookup_run(const sde_ftl *f, uint64_t u, uint32_t *phys);
/* Write units u0 .. u0 + k - 1 at consecutive slots of write point wp (0 host, 1 GC),
 * k = min(n, the slots left in its line; a full or missing line is replaced first), each
 * unit's old slot invalidated.  Returns k, 0 when no free line is left (the caller runs GC
 * first: sde_ftl_gc_needed); *phys0: the first unit's slot.  A replay's block is thousands of
 * units: one call per line, not one per unit. */
uint32_t sde_ftl_append_run(sde_ftl *f, int wp, uint64_t u0, uint32_t n, uint32_t *phys0);
/* Forget units [u0, u0 + n) (u0 + n <= logical units): a trim or deallocate. */
void sde_ftl_trim_run(sde_ftl *f, uint64_t u0, uint64_t n);
/* Whether a write point is at a line boundary and free lines are at most the threshold. */
int sde_ftl_gc_needed(const sde_ftl *f);
/* The full line with the fewest valid units (greedy), or -1 when none would free space. */
int64_t sde_ftl_victim(const sde_ftl *f);
/* The next run of valid slots of `line` from its slot *pos (counted in the line) on: returns
 * its length (0 when none is left), its first physical unit in *start and its logical units
 * in *owners (valid until the next call), and moves *pos past it. */
uint32_t sde_ftl_valid_run(sde_ftl *f, uint32_t line, uint32_t *pos, uint32_t *start,
                           const uint32_t **owners);
/* A victim whose valid units have all been relocated becomes free (erased). */
void sde_ftl_erase(sde_ftl *f, uint32_t line);
/* Leave the next n slots of wp empty (padding of a row programmed partly full). */
void sde_ftl_skip(sde_ftl *f, int wp, uint32_t n);
/* The slot the next append of wp goes to (units_per_line * line + position). */
uint32_t sde_ftl_next_slot(const sde_ftl *f, int wp);

typedef struct sde_ftl_stats {
    uint64_t logical_units, lines, units_per_line;
    uint64_t free_lines;
    uint64_t host_units;   /* units appended by host writes */
    uint64_t gc_units;     /* units relocated by GC */
    uint64_t erases;       /* lines erased */
    uint64_t trimmed_units;
    uint64_t valid_units;
} sde_ftl_stats;
void sde_ftl_get_stats(const sde_ftl *f, sde_ftl_stats *out);
#endif
