/* The FTL's NAND work: rows programmed as units arrive, greedy GC, reads of mapped runs. */
#define _GNU_SOURCE
#include "model_private.h"

static void rows_flush(sde_model *m, struct rows *r, double ready)
{
    if (!r->n)
        return;
    uint64_t row = m->p.page_bytes;
    if (!model_use_bulk(m, r->first * row, r->n * row))
        model_defer_flush(m); /* the page path books its dies now: deferred ones first */
    double done = model_program_stages(m, ready, r->first * row, r->n * row);
    if (done > r->programmed)
        r->programmed = done;
    r->bytes += r->n * row;
    r->n = 0;
}

/* Rows [first, first + n) were completed (in order): they join the run, or start a new one. */
static void rows_add_range(sde_model *m, struct rows *r, uint64_t first, uint64_t n,
                           double ready)
{
    if (!n)
        return;
    if (r->n && first != r->first + r->n)
        rows_flush(m, r, ready);
    if (!r->n)
        r->first = first;
    r->n += n;
}

/* Units [f0, f0 + k) were just appended: the rows they complete join the run (unit f
 * completes row f / upr when it is the row's last). */
static void rows_add_units(sde_model *m, struct rows *r, uint64_t f0, uint64_t k,
                           double ready)
{
    uint64_t lo = (f0 + m->upr) / m->upr - 1, hi = (f0 + k) / m->upr;
    if (hi > lo)
        rows_add_range(m, r, lo, hi - lo, ready);
}

static double dies_busy(const sde_model *m)
{
    double b = 0;
    for (uint32_t i = 0; i < m->ndies; i++)
        b += m->dies[i].busy;
    return b;
}

/* Senses a run of physical units [f0, f0 + n) for GC, from t; returns when they are in the
 * controller. */
static double gc_sense(sde_model *m, double t, uint32_t f0, uint32_t n)
{
    return model_read_stages(m, t, (uint64_t)f0 * m->unit, (uint64_t)n * m->unit, 0);
}

static void gc(sde_model *m, double t)
{
    /* the programs deferred before it go on the dies before it, and its own are booked as it
     * goes (each victim's erase after its relocations) */
    model_defer_flush(m);
    uint32_t deferring = m->deferring;
    m->deferring = 0;
    double before = dies_busy(m);
    while (sde_ftl_gc_needed(m->ftl)) {
        int64_t victim = sde_ftl_victim(m->ftl);
        if (victim < 0)
            break;
        struct rows r = {0};
        double sensed_all = t;
        uint32_t pos = 0, f0, len;
        const uint32_t *owners;
        /* each run of valid slots is sensed, then its units appended to the GC write point
         * (consecutive logical units in one call) and the rows they complete programmed */
        while ((len = sde_ftl_valid_run(m->ftl, (uint32_t)victim, &pos, &f0, &owners))) {
            double sensed = gc_sense(m, t, f0, len);
            if (sensed > sensed_all)
                sensed_all = sensed;
            for (uint32_t k = 0; k < len;) {
                uint32_t same = 1, at;
                while (k + same < len && owners[k + same] == owners[k] + same)
                    same++;
                uint32_t put = sde_ftl_append_run(m->ftl, 1, owners[k], same, &at);
                if (!put)
                    break; /* no free line at all: cannot happen with the FTL's sizing */
                rows_add_units(m, &r, at, put, sensed);
                k += put;
            }
            rows_flush(m, &r, sensed);
        }
        m->gc_programmed_rows += r.bytes / m->p.page_bytes;
        model_hold_all_dies(m, sensed_all, m->p.t_erase_ns * m->p.ftl_erase_share);
        sde_ftl_erase(m->ftl, (uint32_t)victim);
    }
    m->gc_ns += dies_busy(m) - before;
    m->deferring = deferring;
}

/* Append the units of [offset, offset + nbytes) at the host write point (logical units wrap
 * at the FTL's logical size) and program the rows they complete from `arrived`; returns the
 * last row's program time (`arrived` when none completed) and the bytes of the rows in
 * *rows_bytes. */
double model_ftl_write(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes,
                        uint64_t *rows_bytes)
{
    struct rows r = {.programmed = arrived};
    uint64_t u0 = offset / m->unit, u1 = (offset + nbytes + m->unit - 1) / m->unit;
    uint64_t lu = u0 % m->ftl_units; /* logical units wrap at the FTL's size */
    for (uint64_t u = u0; u < u1;) {
        /* GC runs only where a line opens: a run stops at its line's end */
        if (sde_ftl_next_slot(m->ftl, 0) % m->upl == 0 && sde_ftl_gc_needed(m->ftl)) {
            rows_flush(m, &r, arrived);
            gc(m, arrived);
        }
        uint64_t want = u1 - u;
        if (want > m->ftl_units - lu)
            want = m->ftl_units - lu;
        if (want > UINT32_MAX)
            want = UINT32_MAX;
        uint32_t f0, k = sde_ftl_append_run(m->ftl, 0, lu, (uint32_t)want, &f0);
        if (!k)
            break;
        rows_add_units(m, &r, f0, k, arrived);
        u += k;
        lu += k;
        if (lu == m->ftl_units)
            lu = 0;
    }
    rows_flush(m, &r, arrived);
    m->host_programmed_rows += r.bytes / m->p.page_bytes;
    *rows_bytes = r.bytes;
    return r.programmed;
}

/* Program the host write point's partial row now (a flush, or a write without the cache):
 * the rest of the row is padding. */
double model_ftl_pad(sde_model *m, double ready)
{
    uint32_t next = sde_ftl_next_slot(m->ftl, 0);
    if (next % m->upr == 0)
        return ready;
    uint32_t left = m->upr - next % m->upr;
    model_defer_flush(m); /* a row on the page path: the deferred programs go first */
    m->padding += (uint64_t)left * m->unit;
    uint64_t row = next / m->upr;
    sde_ftl_skip(m->ftl, 0, left);
    m->host_programmed_rows++;
    return model_program_stages(m, ready, row * m->p.page_bytes, m->p.page_bytes);
}

/* The NAND half of reading [offset, offset + nbytes) with an FTL: each run of units that are
 * contiguous where they live (a never-written unit is read where its offset says). */
static double ftl_read_stages(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                              int with_link)
{
    uint64_t end = offset + nbytes, run_at = 0, run_len = 0;
    double done = t;
    model_defer_flush(m); /* deferred programs go on their dies before these senses */
    for (uint64_t at = offset; at < end;) {
        /* the units from at's on that live one after another (or are all unmapped) */
        uint64_t u = at / m->unit;
        uint32_t f;
        uint64_t k = sde_ftl_lookup_run(m->ftl, u % m->ftl_units, &f);
        uint64_t stop = (u + k) * m->unit, take = (stop < end ? stop : end) - at;
        uint64_t where = f == SDE_FTL_UNMAPPED ? at : (uint64_t)f * m->unit + at % m->unit;
        if (run_len && where != run_at + run_len) {
            double d = model_read_stages(m, t, run_at, run_len, with_link);
            done = d > done ? d : done;
            run_len = 0;
        }
        if (!run_len)
            run_at = where;
        run_len += take;
        at += take;
    }
    if (run_len) {
        double d = model_read_stages(m, t, run_at, run_len, with_link);
        done = d > done ? d : done;
    }
    return done;
}

double model_nand_read(sde_model *m, double t, uint64_t offset, uint64_t nbytes, int with_link)
{
    return m->ftl ? ftl_read_stages(m, t, offset, nbytes, with_link)
                  : model_read_stages(m, t, offset, nbytes, with_link);
}
