/* The FTL's bookkeeping (sde_ftl.h). */
#include "sde_ftl.h"

#include "sde_segmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { LINE_FREE, LINE_OPEN, LINE_FULL };

struct wpoint {
    int64_t line; /* -1: none open */
    uint32_t pos; /* next slot in the line */
};

struct sde_ftl {
    uint64_t logical_units;
    uint32_t lines, upl, gc_free;
    sde_segmap *l2p; /* logical unit -> physical unit */
    sde_segmap *p2l; /* physical unit -> logical unit (its valid slots) */
    uint32_t *valid; /* valid units per line */
    uint8_t *state;
    uint32_t *free_stack, nfree;
    uint32_t *owners; /* a GC run's logical units (sde_ftl_valid_run) */
    struct wpoint wp[2];
    uint64_t host_units, gc_units, erases, trimmed, nvalid;
};

int sde_ftl_new(uint64_t logical_units, uint32_t lines, uint32_t units_per_line,
                uint32_t gc_free_lines, sde_ftl **out)
{
    uint64_t phys = (uint64_t)lines * units_per_line;
    /* the GC needs its own open line and the host's beside the threshold's free ones */
    if (!logical_units || !units_per_line || phys >= UINT32_MAX ||
        logical_units >= UINT32_MAX ||
        logical_units + (uint64_t)(gc_free_lines + 3) * units_per_line > phys)
        return -EINVAL;
    sde_ftl *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    f->logical_units = logical_units;
    f->lines = lines;
    f->upl = units_per_line;
    f->gc_free = gc_free_lines;
    int rc = sde_segmap_new(logical_units, &f->l2p);
    if (!rc)
        rc = sde_segmap_new(phys, &f->p2l);
    f->valid = calloc(lines, sizeof(uint32_t));
    f->state = calloc(lines, 1);
    f->free_stack = malloc(lines * sizeof(uint32_t));
    f->owners = malloc(units_per_line * sizeof(uint32_t));
    if (rc || !f->valid || !f->state || !f->free_stack || !f->owners) {
        sde_ftl_free(f);
        return -ENOMEM;
    }
    /* lines are taken in ascending order: a fresh drive's first writes land on line 0 */
    for (uint32_t i = 0; i < lines; i++)
        f->free_stack[i] = lines - 1 - i;
    f->nfree = lines;
    f->wp[0].line = f->wp[1].line = -1;
    *out = f;
    return 0;
}

void sde_ftl_free(sde_ftl *f)
{
    if (!f)
        return;
    sde_segmap_free(f->l2p);
    sde_segmap_free(f->p2l);
    free(f->valid);
    free(f->state);
    free(f->free_stack);
    free(f->owners);
    free(f);
}

uint64_t sde_ftl_lookup_run(const sde_ftl *f, uint64_t u, uint32_t *phys)
{
    return sde_segmap_run(f->l2p, u, f->logical_units, phys);
}

/* The write point with a slot left: its line, or a fresh one when it is full or missing;
 * 0 when no free line is left. */
static int wp_ready(sde_ftl *f, struct wpoint *w)
{
    if (w->line < 0 || w->pos == f->upl) {
        if (w->line >= 0)
            f->state[w->line] = LINE_FULL;
        if (!f->nfree)
            return 0;
        w->line = f->free_stack[--f->nfree];
        f->state[w->line] = LINE_OPEN;
        w->pos = 0;
    }
    return 1;
}

/* Old slots [p, p + n) of logical units just unmapped: no longer valid where they live. */
static void slots_gone(void *ctx, uint32_t p, uint32_t n)
{
    sde_ftl *f = ctx;
    sde_segmap_clear(f->p2l, p, n, NULL, NULL);
    f->nvalid -= n;
    while (n) { /* a run of slots may cross into the next line */
        uint32_t line = p / f->upl, take = (line + 1) * f->upl - p;
        if (take > n)
            take = n;
        f->valid[line] -= take;
        p += take;
        n -= take;
    }
}

uint32_t sde_ftl_append_run(sde_ftl *f, int wp, uint64_t u0, uint32_t n, uint32_t *phys0)
{
    struct wpoint *w = &f->wp[wp];
    if (!n || !wp_ready(f, w))
        return 0;
    uint32_t k = f->upl - w->pos < n ? f->upl - w->pos : n;
    uint32_t phys = (uint32_t)w->line * f->upl + w->pos;
    sde_segmap_clear(f->l2p, u0, k, slots_gone, f);
    sde_segmap_set(f->l2p, u0, k, phys);
    sde_segmap_set(f->p2l, phys, k, (uint32_t)u0);
    w->pos += k;
    f->valid[w->line] += k;
    f->nvalid += k;
    if (wp)
        f->gc_units += k;
    else
        f->host_units += k;
    *phys0 = phys;
    return k;
}

void sde_ftl_trim_run(sde_ftl *f, uint64_t u0, uint64_t n)
{
    uint64_t before = f->nvalid;
    sde_segmap_clear(f->l2p, u0, n, slots_gone, f);
    f->trimmed += before - f->nvalid;
}

int sde_ftl_gc_needed(const sde_ftl *f) { return f->nfree <= f->gc_free; }

int64_t sde_ftl_victim(const sde_ftl *f)
{
    int64_t best = -1;
    for (uint32_t l = 0; l < f->lines; l++)
        if (f->state[l] == LINE_FULL && (best < 0 || f->valid[l] < f->valid[best]))
            best = l;
    if (best >= 0 && f->valid[best] == f->upl)
        return -1; /* every full line is wholly valid: relocating one frees nothing */
    return best;
}

uint32_t sde_ftl_valid_run(sde_ftl *f, uint32_t line, uint32_t *pos, uint32_t *start,
                           const uint32_t **owners)
{
    uint64_t at = (uint64_t)line * f->upl + *pos, end = (uint64_t)(line + 1) * f->upl;
    uint32_t v, len = 0;
    while (at < end) { /* past the invalid slots */
        uint64_t k = sde_segmap_run(f->p2l, at, end, &v);
        if (v != SDE_FTL_UNMAPPED)
            break;
        at += k;
    }
    *start = (uint32_t)at;
    while (at < end) { /* the valid ones after them, run by run of their owners */
        uint64_t k = sde_segmap_run(f->p2l, at, end, &v);
        if (v == SDE_FTL_UNMAPPED)
            break;
        for (uint64_t i = 0; i < k; i++)
            f->owners[len++] = v + (uint32_t)i;
        at += k;
    }
    *pos = (uint32_t)(at - (uint64_t)line * f->upl);
    *owners = f->owners;
    return len;
}

void sde_ftl_erase(sde_ftl *f, uint32_t line)
{
    f->state[line] = LINE_FREE;
    f->valid[line] = 0;
    f->free_stack[f->nfree++] = line;
    f->erases++;
}

void sde_ftl_skip(sde_ftl *f, int wp, uint32_t n)
{
    struct wpoint *w = &f->wp[wp];
    if (w->line < 0)
        return;
    w->pos = w->pos + n < f->upl ? w->pos + n : f->upl;
}

uint32_t sde_ftl_next_slot(const sde_ftl *f, int wp)
{
    const struct wpoint *w = &f->wp[wp];
    return w->line < 0 ? 0 : (uint32_t)w->line * f->upl + w->pos;
}

void sde_ftl_get_stats(const sde_ftl *f, sde_ftl_stats *out)
{
    out->logical_units = f->logical_units;
    out->lines = f->lines;
    out->units_per_line = f->upl;
    out->free_lines = f->nfree;
    out->host_units = f->host_units;
    out->gc_units = f->gc_units;
    out->erases = f->erases;
    out->trimmed_units = f->trimmed;
    out->valid_units = f->nvalid;
}
