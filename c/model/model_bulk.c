/* The bulk path: a transfer of a full stripe or more booked once per die, per channel and on
 * the link, its layout in closed form. */
#define _GNU_SOURCE
#include "model_private.h"

struct bulk model_bulk_layout(sde_model *m, uint64_t offset, uint64_t nbytes)
{
    uint64_t page = m->p.page_bytes, end = offset + nbytes;
    uint32_t C = m->p.channels;
    struct bulk b;
    b.p0 = offset / page;
    b.n = (end + page - 1) / page - b.p0;
    b.stripe = (uint64_t)C * m->p.dies_per_channel * m->p.planes_per_die;
    b.planes = (uint32_t)(b.n < b.stripe ? b.n : b.stripe);
    for (uint32_t c = 0; c < C; c++) {
        uint64_t k = b.n / C + ((c + C - b.p0 % C) % C < b.n % C);
        m->ch_pages[c] = (uint32_t)k;
        m->ch_bytes[c] = k * page;
    }
    m->ch_bytes[b.p0 % C] -= offset - b.p0 * page;
    m->ch_bytes[(b.p0 + b.n - 1) % C] -= (b.p0 + b.n) * page - end;
    return b;
}

/* Step through the first b.planes pages like an odometer (no division per page): calls
 * body(plane, channel, i, k) for each. */

int model_use_bulk(const sde_model *m, uint64_t offset, uint64_t nbytes)
{
    uint64_t page = m->p.page_bytes;
    uint64_t pages = (offset + nbytes + page - 1) / page - offset / page;
    return m->p.bulk_pages && pages >= m->p.bulk_pages;
}

/* The channels and the link of a bulk read whose senses are booked: first[c] and last[c],
 * channel c's first and last sense (b's channel pages and bytes in m->ch_pages/ch_bytes). */
double model_read_bulk_channels(sde_model *m, double t, uint64_t nbytes, const double *first,
                                 const double *last_sense, int with_link)
{
    double page = (double)(nbytes < m->p.page_bytes ? nbytes : m->p.page_bytes);
    double link_ready = 1e300, last = t;
    for (uint32_t c = 0; c < m->p.channels; c++) {
        if (!m->ch_pages[c])
            continue;
        double dur = (double)m->ch_bytes[c] * m->ns_per_channel_byte;
        double done = model_hold(m, &m->channels[c], first[c], dur);
        double first_out = done - dur + page * m->ns_per_channel_byte;
        double tail = last_sense[c] + page * m->ns_per_channel_byte;
        if (tail > done)
            done = tail;
        if (first_out < link_ready)
            link_ready = first_out;
        if (done > last)
            last = done;
    }
    if (!with_link)
        return last;
    double over = model_hold(m, &m->link, link_ready, (double)nbytes * m->ns_per_link_byte);
    double tail = last + page * m->ns_per_link_byte;
    return over > tail ? over : tail;
}

double model_read_bulk(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                        int with_link)
{
    struct bulk b = model_bulk_layout(m, offset, nbytes);
    for (uint32_t c = 0; c < m->p.channels; c++) {
        m->ch_ready[c] = 1e300;
        m->ch_last[c] = 0.0;
    }
    FOR_BULK_PLANES(m, b, {
        (void)i;
        double done = model_hold(m, &m->dies[plane], t, k * m->p.t_read_ns);
        double first = done - (k - 1) * m->p.t_read_ns;
        if (first < m->ch_ready[c])
            m->ch_ready[c] = first;
        if (done > m->ch_last[c])
            m->ch_last[c] = done;
    });
    return model_read_bulk_channels(m, t, nbytes, m->ch_ready, m->ch_last, with_link);
}

double model_write_bulk(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes)
{
    struct bulk b = model_bulk_layout(m, offset, nbytes);
    double xfer = (double)(nbytes < m->p.page_bytes ? nbytes : m->p.page_bytes) *
                  m->ns_per_channel_byte;
    double programmed = arrived;
    for (uint32_t c = 0; c < m->p.channels; c++) {
        if (!m->ch_pages[c])
            continue;
        double dur = (double)m->ch_bytes[c] * m->ns_per_channel_byte;
        double done = model_hold(m, &m->channels[c], arrived, dur);
        m->ch_ready[c] = done - dur;  /* the channel's start */
        if (done + m->p.t_prog_ns > programmed)
            programmed = done + m->p.t_prog_ns;
    }
    if (m->deferring) { /* the dies later, die by die (sde_model_run_deferred) */
        if (m->nbatch == m->cap_batch && model_batch_reserve(m, 2 * m->cap_batch) < 0)
            goto now; /* out of memory: booked now, ahead of the deferred ones on its dies */
        m->batch_owner[m->nbatch] = m->defer_next - 1;
        struct batched *x = model_batch_slot(m, m->nbatch++, b, arrived);
        x->xfer = xfer;
        memcpy(&m->batch_first[(size_t)(x - m->batch) * m->p.channels], m->ch_ready,
               m->p.channels * sizeof(double));
        return programmed;
    }
now:;
    uint32_t C = m->p.channels;
    FOR_BULK_PLANES(m, b, {
        double ready = m->ch_ready[c] + (i / C + 1) * xfer;
        double prog = model_hold(m, &m->dies[plane], ready, k * m->p.t_prog_ns);
        if (prog > programmed)
            programmed = prog;
    });
    return programmed;
}

int model_batch_reserve(sde_model *m, uint32_t n)
{
    if (n <= m->cap_batch)
        return 0;
    size_t per = (size_t)n * m->p.channels * sizeof(double);
    struct batched *b = realloc(m->batch, n * sizeof(*b));
    if (!b)
        return -ENOMEM;
    m->batch = b;
    uint32_t *o = realloc(m->batch_owner, n * sizeof(*o));
    if (!o)
        return -ENOMEM;
    m->batch_owner = o;
    double *pr = realloc(m->batch_prog, n * sizeof(*pr));
    if (!pr)
        return -ENOMEM;
    m->batch_prog = pr;
    /* a block's channels from a cache line's start: threads write them.  Kept when the
     * table grows (a deferred batch with an FTL grows as its blocks' rows come) */
    size_t kept = (size_t)m->cap_batch * m->p.channels * sizeof(double);
    double *f, *l;
    if (posix_memalign((void **)&f, 64, per))
        return -ENOMEM;
    if (m->batch_first)
        memcpy(f, m->batch_first, kept);
    free(m->batch_first);
    m->batch_first = f;
    if (posix_memalign((void **)&l, 64, per))
        return -ENOMEM;
    if (m->batch_last)
        memcpy(l, m->batch_last, kept);
    free(m->batch_last);
    m->batch_last = l;
    m->cap_batch = n;
    return 0;
}

struct batched *model_batch_slot(sde_model *m, uint32_t i, struct bulk b, double t)
{
    struct batched *x = &m->batch[i];
    uint32_t C = m->p.channels, D = m->p.dies_per_channel;
    x->t = t;
    x->base = b.n / b.stripe;
    x->extra = b.n % b.stripe;
    x->planes = b.planes;
    x->q0mod = (uint32_t)((b.p0 / C) % D);
    x->r0 = (uint32_t)(b.p0 % C);
    return x;
}
