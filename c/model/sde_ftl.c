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

uint32_t sde_ftl_append(sde_ftl *f, int wp, uint64_t u)
{
    struct wpoint *w = &f->wp[wp];
    if (w->line < 0 || w->pos == f->upl) {
        if (w->line >= 0)
            f->state[w->line] = LINE_FULL;
        if (!f->nfree)
            return SDE_FTL_UNMAPPED;
        w->line = f->free_stack[--f->nfree];
        f->state[w->line] = LINE_OPEN;
        w->pos = 0;
    }
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
