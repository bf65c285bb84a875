/* The FTL's bookkeeping (sde_ftl.h). */
#include "sde_ftl.h"

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
    uint32_t *l2p;   /* logical unit -> physical unit */
    uint32_t *p2l;   /* physical unit -> logical unit */
    uint32_t *valid; /* valid units per line */
    uint8_t *state;
    uint32_t *free_stack, nfree;
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
    f->l2p = malloc(logical_units * sizeof(uint32_t));
    f->p2l = malloc(phys * sizeof(uint32_t));
    f->valid = calloc(lines, sizeof(uint32_t));
    f->state = calloc(lines, 1);
    f->free_stack = malloc(lines * sizeof(uint32_t));
    if (!f->l2p || !f->p2l || !f->valid || !f->state || !f->free_stack) {
        sde_ftl_free(f);
        return -ENOMEM;
    }
    memset(f->l2p, 0xff, logical_units * sizeof(uint32_t));
    memset(f->p2l, 0xff, phys * sizeof(uint32_t));
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
    free(f->l2p);
    free(f->p2l);
    free(f->valid);
    free(f->state);
    free(f->free_stack);
    free(f);
}

uint32_t sde_ftl_lookup(const sde_ftl *f, uint64_t u)
{
    return u < f->logical_units ? f->l2p[u] : SDE_FTL_UNMAPPED;
}

static void invalidate(sde_ftl *f, uint64_t u)
{
    uint32_t old = f->l2p[u];
    if (old == SDE_FTL_UNMAPPED)
        return;
    f->p2l[old] = SDE_FTL_UNMAPPED;
    f->valid[old / f->upl]--;
    f->l2p[u] = SDE_FTL_UNMAPPED;
    f->nvalid--;
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

/* The valid count of old slots' lines, units after units: a block's units were appended
 * together, so consecutive ones mostly share a line and the division is done once per line. */
struct line_cursor {
    uint32_t lo, hi; /* slots [lo, hi) are line `line`'s */
    uint32_t line;
};

static inline void invalidate_run_unit(sde_ftl *f, uint64_t u, struct line_cursor *c)
{
    uint32_t old = f->l2p[u];
    if (old == SDE_FTL_UNMAPPED)
        return;
    if (old < c->lo || old >= c->hi) {
        c->line = old / f->upl;
        c->lo = c->line * f->upl;
        c->hi = c->lo + f->upl;
    }
    f->p2l[old] = SDE_FTL_UNMAPPED;
    f->valid[c->line]--;
    f->l2p[u] = SDE_FTL_UNMAPPED;
    f->nvalid--;
}

uint32_t sde_ftl_append_run(sde_ftl *f, int wp, uint64_t u0, uint32_t n, uint32_t *phys0)
{
    struct wpoint *w = &f->wp[wp];
    if (!n || !wp_ready(f, w))
        return 0;
    uint32_t k = f->upl - w->pos < n ? f->upl - w->pos : n;
    struct line_cursor c = {0, 0, 0};
    uint32_t phys = (uint32_t)w->line * f->upl + w->pos;
    for (uint32_t i = 0; i < k; i++) {
        invalidate_run_unit(f, u0 + i, &c);
        f->l2p[u0 + i] = phys + i;
        f->p2l[phys + i] = (uint32_t)(u0 + i);
    }
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
    struct line_cursor c = {0, 0, 0};
    uint64_t before = f->nvalid;
    for (uint64_t u = u0; u < u0 + n; u++)
        invalidate_run_unit(f, u, &c);
    f->trimmed += before - f->nvalid;
}

uint32_t sde_ftl_append(sde_ftl *f, int wp, uint64_t u)
{
    struct wpoint *w = &f->wp[wp];
    if (!wp_ready(f, w))
        return SDE_FTL_UNMAPPED;
    invalidate(f, u);
    uint32_t phys = (uint32_t)w->line * f->upl + w->pos++;
    f->l2p[u] = phys;
    f->p2l[phys] = (uint32_t)u;
    f->valid[w->line]++;
    f->nvalid++;
    if (wp)
        f->gc_units++;
    else
        f->host_units++;
    return phys;
}

void sde_ftl_trim(sde_ftl *f, uint64_t u)
{
    if (u < f->logical_units && f->l2p[u] != SDE_FTL_UNMAPPED) {
        invalidate(f, u);
        f->trimmed++;
    }
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

uint32_t sde_ftl_owner(const sde_ftl *f, uint32_t phys) { return f->p2l[phys]; }

void sde_ftl_prefetch_owner(const sde_ftl *f, uint32_t phys)
{
    uint32_t u = f->p2l[phys];
    if (u != SDE_FTL_UNMAPPED)
        __builtin_prefetch(&f->l2p[u], 1);
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
