/* Batches: a request's blocks booked die by die (the recipes of model-mode replay). */
#define _GNU_SOURCE
#include "model_private.h"

/* Block x's dies on channel ch, in the order of their pages: the die of row r (r < n) is
 * (die0 + r) mod D, its place in the block's first stripe j = j0 + r * C (pages go channel
 * first, then die rows: page p0 + j is on channel (p0 + j) mod C, row ((p0 + j) / C) mod D;
 * a channel before the first page's has its first page in the next row of channels), and it
 * takes k1 pages for r < more (j < extra), k0 after.  Its dies are independent resources, so
 * the order in which they are booked changes nothing.  Counting rows rather than dies
 * leaves the loop a pointer step per die: the place's arithmetic per die was 7% of a
 * replay's instructions (cachegrind, conversation trace). */
struct batch_rows {
    uint32_t die0, n, more;
    double k0, k1;
};

static inline uint32_t rows_below(uint64_t limit, uint64_t j0, uint32_t C, uint32_t D)
{
    if (limit <= j0)
        return 0;
    uint64_t r = (limit - j0 + C - 1) / C; /* the rows whose j0 + r * C < limit */
    return r < D ? (uint32_t)r : D;
}

static inline struct batch_rows batch_rows(const struct batched *x, uint32_t ch, uint32_t C,
                                           uint32_t D)
{
    uint32_t next = ch < x->r0;
    uint32_t q = x->q0mod + next;
    if (q >= D)
        q -= D;
    uint64_t j0 = (uint64_t)next * C + ch - x->r0;
    return (struct batch_rows){.die0 = q, .n = rows_below(x->planes, j0, C, D),
                               .more = rows_below(x->extra, j0, C, D),
                               .k0 = (double)x->base, .k1 = (double)(x->base + 1)};
}

/* The next channel of a batch to book, from the bottom or from the top; C when none is
 * left.  Each thread keeps to its own end, so that from batch to batch a channel's dies (their
 * resources and gap chunks, half a megabyte in all) stay in one core's cache and only the
 * channels near the meeting point move.  Taken first come, first served (and with the false
 * sharing batch_dies no longer has), each of two threads booked ~1.6x slower than one thread
 * alone, and the helper gained 8%; the two fixes together made it ~30% of a replay. */
uint32_t model_claim_channel(sde_model *m, int from_top)
{
    uint32_t w = atomic_load(&m->channels_left), lo, hi, want;
    do {
        lo = w & 0xFFFF;
        hi = w >> 16;
        if (lo >= hi)
            return m->p.channels;
        want = from_top ? lo | (hi - 1) << 16 : (lo + 1) | hi << 16;
    } while (!atomic_compare_exchange_weak(&m->channels_left, &w, want));
    return from_top ? hi - 1 : lo;
}

/* A batch's dies, a channel's at a time, the channels claimed until none is left: reads'
 * senses (their first and last per block and channel into batch_first and batch_last), or
 * the deferred programs (raising programmed[i]). */
void model_batch_dies(sde_model *m, int programs, double *programmed, int from_top)
{
    uint32_t C = m->p.channels, D = m->p.dies_per_channel;
    double t_read = m->p.t_read_ns, t_prog = m->p.t_prog_ns;
    if (programs == BATCH_ERASE) { /* GC's erase: every die, from one time */
        for (uint32_t ch; (ch = model_claim_channel(m, from_top)) < C;) {
            struct sde_resource *r = &m->dies[(size_t)ch * D];
            for (uint32_t die = 0; die < D; die++, r++)
                model_hold(m, r, m->erase_ready, m->erase_ns);
        }
        return;
    }
    /* Blocks outer, the channel's dies inner: each die still sees its blocks in block order
     * (all that its bookings depend on), and a block's first and last sense on the channel
     * stay in registers, stored once.  Die-outer order stored them once per die, and the
     * two threads' channels share a block's cache lines: that false sharing was a third of
     * this function's time. */
    for (uint32_t ch; (ch = model_claim_channel(m, from_top)) < C;)
    for (uint32_t i = 0; i < m->nbatch; i++) {
        const struct batched *x = &m->batch[i];
        size_t at = (size_t)i * C + ch;
        double base = m->batch_first[at], first = 1e300, last = 0.0, prog_max = 0.0;
        struct batch_rows w = batch_rows(x, ch, C, D);
        struct sde_resource *dies = &m->dies[(size_t)ch * D], *r = dies + w.die0;
        for (uint32_t row = 0; row < w.n; row++, r++) {
            if (r == dies + D)
                r = dies;
            double k = row < w.more ? w.k1 : w.k0;
            if (programs) {
                double ready = base + (double)(row + 1) * x->xfer;
                double prog = model_hold(m, r, ready, k * t_prog);
                if (prog > prog_max)
                    prog_max = prog;
            } else {
                double done = model_hold(m, r, x->t, k * t_read);
                double f = done - (k - 1) * t_read;
                if (f < first)
                    first = f;
                if (done > last)
                    last = done;
            }
        }
        if (programs) {
            if (prog_max > programmed[i])
                programmed[i] = prog_max;
        } else {
            if (first < m->batch_first[at])
                m->batch_first[at] = first;
            if (last > m->batch_last[at])
                m->batch_last[at] = last;
        }
    }
}

/* The batch's dies, on two threads when it is worth it. */
static void batch_dies_all(sde_model *m, int programs, double *programmed)
{
    struct helper *h = NULL;
    uint64_t holds = (uint64_t)(programs == BATCH_ERASE ? 1 : m->nbatch) * m->ndies;
    atomic_store(&m->channels_left, m->p.channels << 16);
    if (m->threads > 1 && m->p.channels > 1 && holds >= HELPER_MIN_HOLDS) {
        if (!m->helper)
            m->helper = model_helper_start(m, model_batch_dies);
        h = m->helper;
    }
    if (h && programs == 1 && h->cap < m->nbatch) {
        double *p = realloc(h->programmed, m->nbatch * sizeof(double));
        if (p) {
            h->programmed = p;
            h->cap = m->nbatch;
        } else {
            h = NULL;
        }
    }
    if (!h) {
        model_batch_dies(m, programs, programmed, 0);
        return;
    }
    if (programs == 1)
        memcpy(h->programmed, programmed, m->nbatch * sizeof(double));
    h->programs = programs;
    pthread_mutex_lock(&h->mu);
    uint64_t job = atomic_load(&h->posted) + 1;
    atomic_store(&h->posted, job);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    model_batch_dies(m, programs, programmed, 0);
    uint64_t before = job - 1;
    if (atomic_compare_exchange_strong(&h->taken, &before, job))
        return; /* every die booked here, and the helper never started: nothing to merge */
    if (atomic_load(&h->finished) != job)
        model_spin_while(&h->finished, job - 1);
    pthread_mutex_lock(&h->mu);
    while (atomic_load(&h->finished) != job)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    for (uint32_t i = 0; programs == 1 && i < m->nbatch; i++)
        if (h->programmed[i] > programmed[i])
            programmed[i] = h->programmed[i];
}

/* Not const: model_batch_reserve grows the batch table when n blocks need more slots.
 * Programs with an FTL (programs) land where the FTL appends them, whatever offs says: their
 * rows that take the page path, and GC, book the deferred dies first (model_defer_flush). */
static int batchable(sde_model *m, const uint64_t *offs, uint32_t n, uint64_t nbytes,
                     int programs)
{
    if (m->p.fixed || (m->ftl && !programs) || m->deferring || !n ||
        m->p.planes_per_die != 1)
        return 0;
    for (uint32_t i = 0; !m->ftl && i < n; i++)
        if (!model_use_bulk(m, offs[i], nbytes))
            return 0;
    return model_batch_reserve(m, n) == 0;
}

/* Batched reads (the batches above): the controller and the senses of n blocks, die by die. */
int sde_model_read_batch(sde_model *m, double submit, const uint64_t *offs, uint32_t n,
                         uint64_t nbytes)
{
    if (submit < m->horizon || !batchable(m, offs, n, nbytes, 0))
        return -1;
    model_advance(m, submit);
    uint32_t C = m->p.channels;
    for (uint32_t i = 0; i < n; i++) {
        struct batched *x = model_batch_slot(m, i, model_bulk_layout(m, offs[i], nbytes),
                                       model_controller(m, submit) + m->p.read_latency_ns);
        x->off = offs[i];
        for (uint32_t c = 0; c < C; c++) {
            m->batch_first[(size_t)i * C + c] = 1e300;
            m->batch_last[(size_t)i * C + c] = 0.0;
        }
    }
    m->nbatch = n;
    batch_dies_all(m, 0, NULL);
    m->batch_bytes = nbytes;
    return 0;
}

double sde_model_read_batched(sde_model *m, uint32_t i, int sense)
{
    if (i >= m->nbatch)
        return -1.0;
    const struct batched *x = &m->batch[i];
    uint64_t nbytes = m->batch_bytes;
    uint32_t C = m->p.channels;
    model_bulk_layout(m, x->off, nbytes); /* the block's channel pages and bytes */
    m->nand_read += nbytes;
    double last = model_read_bulk_channels(m, x->t, nbytes, &m->batch_first[(size_t)i * C],
                                     &m->batch_last[(size_t)i * C], !sense);
    if (sense) {
        double landed = model_dram(m, x->t, nbytes);
        return last > landed ? last : landed;
    }
    m->link_bytes += nbytes;
    return last + m->p.link_latency_ns;
}

int sde_model_defer_dies(sde_model *m, double submit, const uint64_t *offs, uint32_t n,
                         uint64_t nbytes)
{
    if (submit < m->horizon || !batchable(m, offs, n, nbytes, 1))
        return -1;
    if (n > m->cap_raise) {
        double *r = realloc(m->defer_raise, n * sizeof(*r));
        if (!r)
            return -1;
        m->defer_raise = r;
        m->cap_raise = n;
    }
    for (uint32_t i = 0; i < n; i++)
        m->defer_raise[i] = 0.0;
    m->deferring = 1;
    m->defer_next = 0;
    m->nbatch = 0;
    return 0;
}

void model_defer_flush(sde_model *m)
{
    if (!m->deferring || !m->nbatch)
        return;
    for (uint32_t s = 0; s < m->nbatch; s++)
        m->batch_prog[s] = 0.0;
    batch_dies_all(m, 1, m->batch_prog);
    for (uint32_t s = 0; s < m->nbatch; s++) {
        double *r = &m->defer_raise[m->batch_owner[s]];
        if (m->batch_prog[s] > *r)
            *r = m->batch_prog[s];
    }
    m->nbatch = 0;
}

/* Every die held for `duration` from `ready` (GC's erase of a line), on two threads as a
 * batch's dies are: 512 bookings per victim, a fifth of a replay under eviction on one. */
void model_hold_all_dies(sde_model *m, double ready, double duration)
{
    m->erase_ready = ready;
    m->erase_ns = duration;
    batch_dies_all(m, BATCH_ERASE, NULL);
}

void sde_model_run_deferred(sde_model *m, double *programmed)
{
    model_defer_flush(m);
    m->deferring = 0;
    for (uint32_t i = 0; i < m->defer_next; i++)
        if (m->defer_raise[i] > programmed[i])
            programmed[i] = m->defer_raise[i];
}
