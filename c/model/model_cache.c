/* The write cache (a min-heap of writes by program time), writes, flush, NOP, stats. */
#define _GNU_SOURCE
#include "model_private.h"
#include "sde_heap.h"

#define LEAVES(x) ((x).leaves)
SDE_HEAP(cached, struct cached, LEAVES)

/* The write that leaves the cache first goes. */
static void cache_pop(sde_model *m)
{
    m->cache_bytes -= cached_pop(m->cache, &m->ncache).bytes;
}

static int cache_push(sde_model *m, double leaves, uint64_t bytes)
{
    if (m->ncache == m->cap_cache) {
        uint32_t cap = m->cap_cache ? 2 * m->cap_cache : 256;
        struct cached *n = realloc(m->cache, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        m->cache = n;
        m->cap_cache = cap;
    }
    cached_push(m->cache, &m->ncache, (struct cached){leaves, bytes});
    m->cache_bytes += bytes;
    return 0;
}

/* The write cache's back-pressure: what was programmed by `arrived` has left the cache; if
 * the rest and this write do not fit, the acknowledgement waits for the earliest programs
 * to make room (a write larger than the whole cache waits for its own program). */
double sde_model_cache_ack(sde_model *m, double arrived, double programmed, uint64_t nbytes,
                           uint64_t leaving)
{
    uint64_t cap = m->p.write_cache_bytes;
    if (!cap)
        return arrived;
    if (nbytes >= cap)
        return programmed > arrived ? programmed : arrived;
    while (m->ncache && m->cache[0].leaves <= arrived)
        cache_pop(m);
    double ack = arrived;
    while (m->ncache && m->cache_bytes + nbytes > cap) {
        if (m->cache[0].leaves > ack)
            ack = m->cache[0].leaves;
        cache_pop(m);
    }
    if (leaving && cache_push(m, programmed, leaving) < 0)
        return programmed > ack ? programmed : ack; /* untracked: write-through, pessimistic */
    return ack;
}

double sde_model_write_programmed(sde_model *m, double submit, uint64_t offset,
                                  uint64_t nbytes, double *arrived, uint64_t *leaving)
{
    if (model_advance(m, submit) < 0)
        return -1.0;
    double t = model_controller(m, submit);
    double in = model_hold(m, &m->link_in, t, (double)nbytes * m->ns_per_link_byte);
    double landed = model_dram(m, t, nbytes); /* into the DRAM write cache as it arrives */
    *arrived = in > landed ? in : landed;
    m->defer_next += m->deferring; /* a deferred batch's next block */
    double programmed = model_nand_program(m, *arrived, offset, nbytes, leaving);
    m->nand_written += nbytes;
    m->link_bytes += nbytes;
    return programmed;
}

double sde_model_write_ack(sde_model *m, double arrived, double programmed, uint64_t nbytes,
                           uint64_t leaving)
{
    /* the firmware's write latency is that of acknowledging from the cache; without it the
     * completion waits for the program */
    double ack = m->p.write_cache
                     ? sde_model_cache_ack(m, arrived, programmed, nbytes, leaving) +
                           m->p.write_latency_ns
                     : programmed;
    return ack + m->p.link_latency_ns;
}

double sde_model_write(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    if (model_advance(m, submit) < 0)
        return -1.0;
    return m->ops->write(m, submit, offset, nbytes);
}

double model_detailed_write(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    double arrived;
    uint64_t leaving;
    double programmed = sde_model_write_programmed(m, submit, offset, nbytes, &arrived, &leaving);
    if (programmed < 0)
        return -1.0;
    return sde_model_write_ack(m, arrived, programmed, nbytes, leaving);
}

double sde_model_flush(sde_model *m, double submit)
{
    if (model_advance(m, submit) < 0)
        return -1.0;
    return m->ops->flush(m, submit);
}

double model_detailed_flush(sde_model *m, double submit)
{
    double t = model_controller(m, submit);
    model_defer_flush(m);
    if (m->ftl)
        model_ftl_pad(m, t);
    for (uint32_t i = 0; i < m->ndies; i++)
        if (m->dies[i].next_free > t)
            t = m->dies[i].next_free;
    return t + m->p.link_latency_ns;
}

double sde_model_nop(sde_model *m, double submit)
{
    if (model_advance(m, submit) < 0)
        return -1.0;
    return m->ops->nop(m, submit);
}

double model_detailed_nop(sde_model *m, double submit)
{
    return model_controller(m, submit) + m->p.link_latency_ns;
}

double sde_model_horizon(const sde_model *m) { return m->horizon; }

void sde_model_get_stats(const sde_model *m, sde_model_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->horizon_ns = m->horizon;
    out->link_busy_ns = m->link.busy;
    out->link_in_busy_ns = m->link_in.busy;
    for (uint32_t i = 0; i < m->p.channels; i++)
        out->channel_busy_ns += m->channels[i].busy;
    for (uint32_t i = 0; i < m->ndies; i++) {
        out->die_busy_ns += m->dies[i].busy;
        out->gaps += m->dies[i].gaps.n;
    }
    for (uint32_t i = 0; i < m->p.channels; i++)
        out->gaps += m->channels[i].gaps.n;
    out->gaps += m->link.gaps.n + m->link_in.gaps.n;
    for (uint32_t i = 0; i < m->p.cores; i++)
        out->controller_busy_ns += m->cores[i].busy;
    out->dram_busy_ns = m->dram.busy;
    out->nand_bytes_read = m->nand_read;
    out->nand_bytes_written = m->nand_written;
    out->link_bytes = m->link_bytes;
    double until = m->link.next_free > m->link_in.next_free ? m->link.next_free
                                                            : m->link_in.next_free;
    for (uint32_t i = 0; i < m->p.channels; i++)
        until = m->channels[i].next_free > until ? m->channels[i].next_free : until;
    for (uint32_t i = 0; i < m->ndies; i++)
        until = m->dies[i].next_free > until ? m->dies[i].next_free : until;
    for (uint32_t i = 0; i < m->p.cores; i++)
        until = m->cores[i].next_free > until ? m->cores[i].next_free : until;
    out->busy_until_ns = until;
    if (m->ftl) {
        sde_ftl_stats st;
        sde_ftl_get_stats(m->ftl, &st);
        out->ftl_logical_bytes = st.logical_units * m->unit;
        out->ftl_lines = st.lines;
        out->ftl_free_lines = st.free_lines;
        out->host_bytes_programmed = m->host_programmed_rows * m->p.page_bytes;
        out->gc_bytes_programmed = m->gc_programmed_rows * m->p.page_bytes;
        out->padding_bytes = m->padding;
        out->erases = st.erases;
        out->trimmed_bytes = st.trimmed_units * m->unit;
        out->ftl_valid_bytes = st.valid_units * m->unit;
        out->write_amplification =
            out->host_bytes_programmed
                ? (double)(out->host_bytes_programmed + out->gc_bytes_programmed) /
                      (double)out->host_bytes_programmed
                : 1.0;
        out->gc_ns = m->gc_ns;
    }
}

uint32_t sde_model_next_free(const sde_model *m, double *out, uint32_t max)
{
    uint32_t n = 0, total = m->p.cores + m->ndies + m->p.channels + 2;
    for (uint32_t i = 0; i < m->p.cores && n < max; i++)
        out[n++] = m->cores[i].next_free;
    for (uint32_t i = 0; i < m->ndies && n < max; i++)
        out[n++] = m->dies[i].next_free;
    for (uint32_t i = 0; i < m->p.channels && n < max; i++)
        out[n++] = m->channels[i].next_free;
    if (n < max)
        out[n++] = m->link.next_free;
    if (n < max)
        out[n++] = m->link_in.next_free;
    return total;
}
