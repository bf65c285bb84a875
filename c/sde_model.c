/*
 * The timing model (sde_model.h).  A stage on a resource starts at max(ready, free) and holds
 * it for its duration.  Stages reach a resource out of time order (a read whose plane was busy
 * is ready after the next one), so each resource keeps its idle gaps before next_free and a
 * stage takes the first gap at or after its ready time that is long enough; without this a
 * late stage blocks every later one (a profile reached 58% of its random-read bound).  Gaps
 * that end before the latest submission can no longer be used and are forgotten.
 */
#include "sde_model.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct gap {
    double start, end;
};

struct sde_resource {
    struct gap *gaps;
    uint32_t ngaps, cap;
    double next_free;
    double busy;
};

struct sde_model {
    sde_model_params p;
    uint32_t nplanes;
    struct sde_resource *cores, *planes, *channels, link;
    double ns_per_link_byte, ns_per_channel_byte;
    double horizon;
    uint64_t nand_read, nand_written, link_bytes;
};

static void res_init(struct sde_resource *r) { memset(r, 0, sizeof(*r)); }

static void res_fini(struct sde_resource *r) { free(r->gaps); }

static int res_add_gap(struct sde_resource *r, uint32_t at, double s, double e)
{
    if (r->ngaps == r->cap) {
        uint32_t cap = r->cap ? 2 * r->cap : 8;
        struct gap *g = realloc(r->gaps, cap * sizeof(*g));
        if (!g)
            return -ENOMEM; /* the gap is lost: the model stays valid, only pessimistic */
        r->gaps = g;
        r->cap = cap;
    }
    memmove(&r->gaps[at + 1], &r->gaps[at], (r->ngaps - at) * sizeof(*r->gaps));
    r->gaps[at] = (struct gap){s, e};
    r->ngaps++;
    return 0;
}

static double res_hold(struct sde_resource *r, double ready, double duration)
{
    r->busy += duration;
    for (uint32_t i = 0; i < r->ngaps; i++) {
        struct gap g = r->gaps[i];
        if (g.end <= ready)
            continue;
        double start = g.start > ready ? g.start : ready;
        double done = start + duration;
        if (done <= g.end) {
            /* split the gap around the stage */
            memmove(&r->gaps[i], &r->gaps[i + 1], (r->ngaps - i - 1) * sizeof(*r->gaps));
            r->ngaps--;
            uint32_t at = i;
            if (start > g.start)
                res_add_gap(r, at++, g.start, start);
            if (done < g.end)
                res_add_gap(r, at, done, g.end);
            return done;
        }
    }
    double start = ready > r->next_free ? ready : r->next_free;
    if (start > r->next_free)
        res_add_gap(r, r->ngaps, r->next_free, start);
    r->next_free = start + duration;
    return r->next_free;
}

static void res_forget_before(struct sde_resource *r, double t)
{
    uint32_t i = 0;
    while (i < r->ngaps && r->gaps[i].end <= t)
        i++;
    if (i) {
        memmove(r->gaps, &r->gaps[i], (r->ngaps - i) * sizeof(*r->gaps));
        r->ngaps -= i;
    }
}

/* ---- the model -------------------------------------------------------------------------- */

int sde_model_new(const sde_model_params *p, sde_model **out)
{
    if (!p->channels || !p->dies_per_channel || !p->planes_per_die || !p->page_bytes ||
        !p->cores || p->link_bytes_per_s <= 0 || p->channel_bytes_per_s <= 0)
        return -EINVAL;
    sde_model *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->p = *p;
    m->nplanes = p->channels * p->dies_per_channel * p->planes_per_die;
    m->cores = calloc(p->cores, sizeof(*m->cores));
    m->planes = calloc(m->nplanes, sizeof(*m->planes));
    m->channels = calloc(p->channels, sizeof(*m->channels));
    if (!m->cores || !m->planes || !m->channels) {
        sde_model_free(m);
        return -ENOMEM;
    }
    res_init(&m->link);
    m->ns_per_link_byte = 1e9 / p->link_bytes_per_s;
    m->ns_per_channel_byte = 1e9 / p->channel_bytes_per_s;
    *out = m;
    return 0;
}

void sde_model_free(sde_model *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; m->cores && i < m->p.cores; i++)
        res_fini(&m->cores[i]);
    for (uint32_t i = 0; m->planes && i < m->nplanes; i++)
        res_fini(&m->planes[i]);
    for (uint32_t i = 0; m->channels && i < m->p.channels; i++)
        res_fini(&m->channels[i]);
    res_fini(&m->link);
    free(m->cores);
    free(m->planes);
    free(m->channels);
    free(m);
}

/* Commands come in time order: bookings no stage can use any more are dropped now and then. */
static int advance(sde_model *m, double submit)
{
    if (submit < m->horizon)
        return -1;
    if (submit - m->horizon > 50000.0) {
        for (uint32_t i = 0; i < m->p.cores; i++)
            res_forget_before(&m->cores[i], submit);
        for (uint32_t i = 0; i < m->nplanes; i++)
            res_forget_before(&m->planes[i], submit);
        for (uint32_t i = 0; i < m->p.channels; i++)
            res_forget_before(&m->channels[i], submit);
        res_forget_before(&m->link, submit);
        m->horizon = submit;
    }
    return 0;
}

static double controller(sde_model *m, double submit)
{
    struct sde_resource *best = &m->cores[0];
    for (uint32_t i = 1; i < m->p.cores; i++)
        if (m->cores[i].next_free < best->next_free)
            best = &m->cores[i];
    return res_hold(best, submit, m->p.command_overhead_ns);
}

/* Page p sits on channel p mod C, die (p div C) mod D, plane (p div C*D) mod P. */
static void locate(const sde_model *m, uint64_t page, uint32_t *plane, uint32_t *ch)
{
    uint32_t C = m->p.channels, D = m->p.dies_per_channel, P = m->p.planes_per_die;
    *ch = (uint32_t)(page % C);
    uint32_t die = (uint32_t)((page / C) % D);
    uint32_t pl = (uint32_t)((page / ((uint64_t)C * D)) % P);
    *plane = (*ch * D + die) * P + pl;
}

double sde_model_read(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    if (advance(m, submit) < 0)
        return -1.0;
    if (m->p.fixed) {
        m->nand_read += nbytes;
        m->link_bytes += nbytes;
        return submit + m->p.fixed_read_ns;
    }
    double t = controller(m, submit);
    double done = t;
    uint64_t page = m->p.page_bytes;
    uint64_t end = offset + nbytes;
    for (uint64_t p = offset / page; p * page < end; p++) {
        uint64_t lo = p * page > offset ? p * page : offset;
        uint64_t hi = (p + 1) * page < end ? (p + 1) * page : end;
        uint32_t plane, ch;
        locate(m, p, &plane, &ch);
        double sensed = res_hold(&m->planes[plane], t, m->p.t_read_ns);
        double moved = res_hold(&m->channels[ch], sensed, (double)(hi - lo) * m->ns_per_channel_byte);
        double over = res_hold(&m->link, moved, (double)(hi - lo) * m->ns_per_link_byte);
        if (over > done)
            done = over;
    }
    m->nand_read += nbytes;
    m->link_bytes += nbytes;
    return done + m->p.link_latency_ns;
}

double sde_model_write(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    if (advance(m, submit) < 0)
        return -1.0;
    if (m->p.fixed) {
        m->nand_written += nbytes;
        m->link_bytes += nbytes;
        return submit + m->p.fixed_write_ns;
    }
    double t = controller(m, submit);
    double arrived = res_hold(&m->link, t, (double)nbytes * m->ns_per_link_byte);
    double programmed = arrived;
    uint64_t page = m->p.page_bytes;
    uint64_t end = offset + nbytes;
    for (uint64_t p = offset / page; p * page < end; p++) {
        uint64_t lo = p * page > offset ? p * page : offset;
        uint64_t hi = (p + 1) * page < end ? (p + 1) * page : end;
        uint32_t plane, ch;
        locate(m, p, &plane, &ch);
        double moved = res_hold(&m->channels[ch], arrived, (double)(hi - lo) * m->ns_per_channel_byte);
        double prog = res_hold(&m->planes[plane], moved, m->p.t_prog_ns);
        if (prog > programmed)
            programmed = prog;
    }
    m->nand_written += nbytes;
    m->link_bytes += nbytes;
    return (m->p.write_cache ? arrived : programmed) + m->p.link_latency_ns;
}

double sde_model_flush(sde_model *m, double submit)
{
    if (advance(m, submit) < 0)
        return -1.0;
    if (m->p.fixed)
        return submit + m->p.fixed_other_ns;
    double t = controller(m, submit);
    for (uint32_t i = 0; i < m->nplanes; i++)
        if (m->planes[i].next_free > t)
            t = m->planes[i].next_free;
    return t + m->p.link_latency_ns;
}

double sde_model_nop(sde_model *m, double submit)
{
    if (advance(m, submit) < 0)
        return -1.0;
    if (m->p.fixed)
        return submit + m->p.fixed_other_ns;
    return controller(m, submit) + m->p.link_latency_ns;
}

void sde_model_get_stats(const sde_model *m, sde_model_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->horizon_ns = m->horizon;
    out->link_busy_ns = m->link.busy;
    for (uint32_t i = 0; i < m->p.channels; i++)
        out->channel_busy_ns += m->channels[i].busy;
    for (uint32_t i = 0; i < m->nplanes; i++)
        out->plane_busy_ns += m->planes[i].busy;
    for (uint32_t i = 0; i < m->p.cores; i++)
        out->controller_busy_ns += m->cores[i].busy;
    out->nand_bytes_read = m->nand_read;
    out->nand_bytes_written = m->nand_written;
    out->link_bytes = m->link_bytes;
}

uint32_t sde_model_next_free(const sde_model *m, double *out, uint32_t max)
{
    uint32_t n = 0, total = m->p.cores + m->nplanes + m->p.channels + 1;
    for (uint32_t i = 0; i < m->p.cores && n < max; i++)
        out[n++] = m->cores[i].next_free;
    for (uint32_t i = 0; i < m->nplanes && n < max; i++)
        out[n++] = m->planes[i].next_free;
    for (uint32_t i = 0; i < m->p.channels && n < max; i++)
        out[n++] = m->channels[i].next_free;
    if (n < max)
        out[n++] = m->link.next_free;
    return total;
}

/* ---- one resource, for tests --------------------------------------------------------------- */

sde_resource *sde_resource_new(void) { return calloc(1, sizeof(sde_resource)); }
void sde_resource_free(sde_resource *r)
{
    if (r)
        res_fini(r);
    free(r);
}
double sde_resource_hold(sde_resource *r, double ready, double duration)
{
    return res_hold(r, ready, duration);
}
void sde_resource_forget_before(sde_resource *r, double t) { res_forget_before(r, t); }
uint32_t sde_resource_gaps(const sde_resource *r) { return r->ngaps; }
double sde_resource_next_free(const sde_resource *r) { return r->next_free; }
