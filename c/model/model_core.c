/* The timing model's core: resources and their gaps, the controller, and where a byte of the
 * media lands (channel, die, row).  The model's life is model_life.c. */
#define _GNU_SOURCE
#include "model_private.h"

static inline void res_ends(struct sde_resource *r)
{
    if (r->gaps.n) {
        r->first_end = sde_gaps_first_end(&r->gaps);
        r->last_end = sde_gaps_last_end(&r->gaps);
    }
}

void model_res_init(struct sde_resource *r) { memset(r, 0, sizeof(*r)); }

void model_res_fini(struct sde_resource *r) { sde_gaps_free(&r->gaps); }

/* The slow halves of a hold (model_private.h), out of line: inlined, their registers made
 * every hold save and restore six of them, 8% of a replay's instructions. */
__attribute__((noinline)) void model_res_gap(struct sde_resource *r, double start)
{
    if (sde_gaps_append(&r->gaps, r->next_free, start) == 0) {
        /* the new gap is the last; the first only if it is alone (a program books one
         * such gap on each of its dies: not reading the chunks back saved two cache lines
         * a die) */
        r->last_end = start;
        if (r->gaps.n == 1)
            r->first_end = start;
    }
}

__attribute__((noinline)) double model_res_fit(struct sde_resource *r, double ready,
                                               double duration)
{
    double done;
    if (sde_gaps_fit(&r->gaps, ready, duration, &done)) {
        res_ends(r);
        return done;
    }
    return model_res_end(r, ready, duration);
}

double model_res_hold(struct sde_resource *r, double ready, double duration)
{
    return model_res_hold_inline(r, ready, duration);
}

void model_res_forget_before(struct sde_resource *r, double t)
{
    sde_gaps_forget_before(&r->gaps, t);
    res_ends(r);
}

/* ---- the model -------------------------------------------------------------------------- */

/* Commands come in time order and every stage is ready at or after its command's submission,
 * so gaps that end before the latest submission can no longer be used.  A resource drops them
 * when it is next booked (lazily: a sweep over every plane per command cost more than the
 * bookings themselves). */
int model_advance(sde_model *m, double submit)
{
    if (submit < m->horizon)
        return -1;
    m->horizon = submit;
    return 0;
}

double model_controller(sde_model *m, double submit)
{
    struct sde_resource *best = &m->cores[0];
    for (uint32_t i = 1; i < m->p.cores; i++)
        if (m->cores[i].next_free < best->next_free)
            best = &m->cores[i];
    return model_hold(m, best, submit, m->p.command_overhead_ns);
}

/* The bytes of [offset, end) that fall in page p. */
uint64_t model_page_part(uint64_t p, uint64_t page, uint64_t offset, uint64_t end)
{
    uint64_t lo = p * page > offset ? p * page : offset;
    uint64_t hi = (p + 1) * page < end ? (p + 1) * page : end;
    return hi - lo;
}

/* Page p sits on channel p mod C, die (p div C) mod D, plane (p div C*D) mod P. */
void model_locate(const sde_model *m, uint64_t page, uint32_t *plane, uint32_t *ch)
{
    uint32_t C = m->p.channels, D = m->p.dies_per_channel, P = m->p.planes_per_die;
    *ch = (uint32_t)(page % C);
    uint32_t die = (uint32_t)((page / C) % D);
    uint32_t pl = (uint32_t)((page / ((uint64_t)C * D)) % P);
    *plane = (*ch * D + die) * P + pl;
}
