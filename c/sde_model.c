/*
 * The timing model (sde_model.h).  A stage on a resource starts at max(ready, free) and holds
 * it for its duration.  Stages reach a resource out of time order (a read whose plane was busy
 * is ready after the next one), so each resource keeps its idle gaps before next_free and a
 * stage takes the first gap at or after its ready time that is long enough; without this a
 * late stage blocks every later one (a profile reached 58% of its random-read bound).  Gaps
 * that end before the latest submission can no longer be used and are forgotten.
 */
#include "sde_model.h"
#include "sde_gaps.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct sde_resource {
    sde_gaps gaps;
    double next_free;
    double busy;
    /* the first and last gaps' ends, kept here so that the common bookings (no gap to
     * forget, none after `ready`) do not touch the gap chunks: a replay books ~2,000 planes
     * per KV block, and their cache misses were a fifth of its time */
    double first_end, last_end;
};

static inline void res_ends(struct sde_resource *r)
{
    if (r->gaps.n) {
        r->first_end = sde_gaps_first_end(&r->gaps);
        r->last_end = sde_gaps_last_end(&r->gaps);
    }
}

struct sde_model {
    sde_model_params p;
    uint32_t nplanes;
    /* PCIe is full duplex: device-to-host (reads, transfers) and host-to-device (writes,
     * receives) are separate links of the same bandwidth */
    struct sde_resource *cores, *planes, *channels, link, link_in;
    double ns_per_link_byte, ns_per_channel_byte;
    double horizon;
    uint64_t nand_read, nand_written, link_bytes;
    /* scratch of the bulk path: pages, bytes and stage times per channel */
    uint32_t *ch_pages;
    uint64_t *ch_bytes;
    double *ch_ready, *ch_last;
    /* the write cache: what it holds, a min-heap on the time each write leaves it (its
     * program), and the bytes in it */
    struct cached { double leaves; uint64_t bytes; } *cache;
    uint32_t ncache, cap_cache;
    uint64_t cache_bytes;
};

static void res_init(struct sde_resource *r) { memset(r, 0, sizeof(*r)); }

static void res_fini(struct sde_resource *r) { sde_gaps_free(&r->gaps); }

static double res_hold(struct sde_resource *r, double ready, double duration)
{
    r->busy += duration;
    double done;
    if (r->gaps.n && r->last_end > ready && sde_gaps_fit(&r->gaps, ready, duration, &done)) {
        res_ends(r);
        return done;
    }
    double start = ready > r->next_free ? ready : r->next_free;
    if (start > r->next_free && sde_gaps_append(&r->gaps, r->next_free, start) == 0)
        res_ends(r);
    r->next_free = start + duration;
    return r->next_free;
}

static void res_forget_before(struct sde_resource *r, double t)
{
    sde_gaps_forget_before(&r->gaps, t);
    res_ends(r);
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
    m->ch_pages = calloc(p->channels, sizeof(uint32_t));
    m->ch_bytes = calloc(p->channels, sizeof(uint64_t));
    m->ch_ready = calloc(p->channels, sizeof(double));
    m->ch_last = calloc(p->channels, sizeof(double));
    if (!m->cores || !m->planes || !m->channels || !m->ch_pages || !m->ch_bytes || !m->ch_ready || !m->ch_last) {
        sde_model_free(m);
        return -ENOMEM;
    }
    res_init(&m->link);
    res_init(&m->link_in);
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
    res_fini(&m->link_in);
    free(m->cores);
    free(m->planes);
    free(m->channels);
    free(m->cache);
    free(m->ch_pages);
    free(m->ch_bytes);
    free(m->ch_ready);
    free(m->ch_last);
    free(m);
}

/* Commands come in time order and every stage is ready at or after its command's submission,
 * so gaps that end before the latest submission can no longer be used.  A resource drops them
 * when it is next booked (lazily: a sweep over every plane per command cost more than the
 * bookings themselves). */
static int advance(sde_model *m, double submit)
{
    if (submit < m->horizon)
        return -1;
    m->horizon = submit;
    return 0;
}

static double hold(sde_model *m, struct sde_resource *r, double ready, double duration)
{
    if (r->gaps.n && r->first_end <= m->horizon)
        res_forget_before(r, m->horizon);
    return res_hold(r, ready, duration);
}

static double controller(sde_model *m, double submit)
{
    struct sde_resource *best = &m->cores[0];
    for (uint32_t i = 1; i < m->p.cores; i++)
        if (m->cores[i].next_free < best->next_free)
            best = &m->cores[i];
    return hold(m, best, submit, m->p.command_overhead_ns);
}

/* The bytes of [offset, end) that fall in page p. */
static inline uint64_t page_part(uint64_t p, uint64_t page, uint64_t offset, uint64_t end)
{
    uint64_t lo = p * page > offset ? p * page : offset;
    uint64_t hi = (p + 1) * page < end ? (p + 1) * page : end;
    return hi - lo;
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

/* ---- the bulk path -----------------------------------------------------------------------
 * A transfer of thousands of pages (a 512-token KV block of an 8B model is ~2,000 pages of
 * 16 KiB) costs three bookings per page on the page path.  The bulk path books each plane
 * once for all its pages (k senses or programs back to back), each channel once for all its
 * bytes and the link once, and takes the pipeline's tail into account: a channel finishes no
 * earlier than its last plane's data plus one page, the link no earlier than the last channel
 * plus one page.  It differs from the page path only in how finely it interleaves stages
 * (tests/test_timing.py holds the two to 2% on whole transfers and on a replay). */

/* The pages [p0, p0 + N) in closed form: the first min(N, S) pages (S = C * D * P, a stripe)
 * fall on distinct planes, the i-th of them on the plane that gets N / S pages plus one when
 * i < N mod S, and it is that plane's first page, at position i / C in its channel's order.
 * Channel c gets N / C pages plus one when (c - p0) mod C < N mod C; its bytes are its pages
 * less the partial first and last pages.  (A per-page count cost a loop of N steps per
 * transfer: a replay books ~2,000 pages per KV block.) */
struct bulk {
    uint64_t p0, n, stripe;
    uint32_t planes; /* planes touched: min(N, S) */
};

static struct bulk bulk_layout(sde_model *m, uint64_t offset, uint64_t nbytes)
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
#define FOR_BULK_PLANES(m, b, body)                                                        \
    do {                                                                                   \
        uint32_t C_ = (m)->p.channels, D_ = (m)->p.dies_per_channel,                       \
                 P_ = (m)->p.planes_per_die;                                               \
        uint32_t ch_ = (uint32_t)((b).p0 % C_), die_ = (uint32_t)(((b).p0 / C_) % D_);     \
        uint32_t pl_ = (uint32_t)(((b).p0 / ((uint64_t)C_ * D_)) % P_);                    \
        uint32_t extra_ = (uint32_t)((b).n % (b).stripe), base_ = (uint32_t)((b).n / (b).stripe); \
        for (uint32_t i_ = 0; i_ < (b).planes; i_++) {                                     \
            uint32_t plane = (ch_ * D_ + die_) * P_ + pl_, c = ch_, i = i_;               \
            uint32_t k = base_ + (i_ < extra_);                                            \
            body;                                                                          \
            if (++ch_ == C_) {                                                             \
                ch_ = 0;                                                                   \
                if (++die_ == D_) {                                                        \
                    die_ = 0;                                                              \
                    if (++pl_ == P_)                                                       \
                        pl_ = 0;                                                           \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    } while (0)

static double read_bulk(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                        int with_link)
{
    struct bulk b = bulk_layout(m, offset, nbytes);
    double page = (double)(nbytes < m->p.page_bytes ? nbytes : m->p.page_bytes);
    for (uint32_t c = 0; c < m->p.channels; c++) {
        m->ch_ready[c] = 1e300;
        m->ch_last[c] = 0.0;
    }
    FOR_BULK_PLANES(m, b, {
        (void)i;
        double done = hold(m, &m->planes[plane], t, k * m->p.t_read_ns);
        double first = done - (k - 1) * m->p.t_read_ns;
        if (first < m->ch_ready[c])
            m->ch_ready[c] = first;
        if (done > m->ch_last[c])
            m->ch_last[c] = done;
    });
    double link_ready = 1e300, last = t;
    for (uint32_t c = 0; c < m->p.channels; c++) {
        if (!m->ch_pages[c])
            continue;
        double dur = (double)m->ch_bytes[c] * m->ns_per_channel_byte;
        double done = hold(m, &m->channels[c], m->ch_ready[c], dur);
        double first_out = done - dur + page * m->ns_per_channel_byte;
        double tail = m->ch_last[c] + page * m->ns_per_channel_byte;
        if (tail > done)
            done = tail;
        if (first_out < link_ready)
            link_ready = first_out;
        if (done > last)
            last = done;
    }
    if (!with_link)
        return last;
    double over = hold(m, &m->link, link_ready, (double)nbytes * m->ns_per_link_byte);
    double tail = last + page * m->ns_per_link_byte;
    return over > tail ? over : tail;
}

static double write_bulk(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes)
{
    struct bulk b = bulk_layout(m, offset, nbytes);
    double xfer = (double)(nbytes < m->p.page_bytes ? nbytes : m->p.page_bytes) *
                  m->ns_per_channel_byte;
    double programmed = arrived;
    for (uint32_t c = 0; c < m->p.channels; c++) {
        if (!m->ch_pages[c])
            continue;
        double dur = (double)m->ch_bytes[c] * m->ns_per_channel_byte;
        double done = hold(m, &m->channels[c], arrived, dur);
        m->ch_ready[c] = done - dur;  /* the channel's start */
        if (done + m->p.t_prog_ns > programmed)
            programmed = done + m->p.t_prog_ns;
    }
    uint32_t C = m->p.channels;
    FOR_BULK_PLANES(m, b, {
        double ready = m->ch_ready[c] + (i / C + 1) * xfer;
        double prog = hold(m, &m->planes[plane], ready, k * m->p.t_prog_ns);
        if (prog > programmed)
            programmed = prog;
    });
    return programmed;
}

static int use_bulk(const sde_model *m, uint64_t offset, uint64_t nbytes)
{
    uint64_t page = m->p.page_bytes;
    uint64_t pages = (offset + nbytes + page - 1) / page - offset / page;
    return m->p.bulk_pages && pages >= m->p.bulk_pages;
}

/* The NAND half of a write of data in the controller at `arrived`: channel transfers and
 * programs; returns when the last page is programmed. */
static double program_stages(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes)
{
    if (use_bulk(m, offset, nbytes))
        return write_bulk(m, arrived, offset, nbytes);
    double programmed = arrived;
    uint64_t page = m->p.page_bytes;
    uint64_t end = offset + nbytes;
    for (uint64_t p = offset / page; p * page < end; p++) {
        uint64_t n = page_part(p, page, offset, end);
        uint32_t plane, ch;
        locate(m, p, &plane, &ch);
        double moved = hold(m, &m->channels[ch], arrived, (double)n * m->ns_per_channel_byte);
        double prog = hold(m, &m->planes[plane], moved, m->p.t_prog_ns);
        if (prog > programmed)
            programmed = prog;
    }
    return programmed;
}

/* The NAND half of a read from t (after the controller): senses and channel transfers, and
 * the link per page when with_link; returns when the last byte is over (no link latency). */
static double read_stages(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                          int with_link)
{
    if (use_bulk(m, offset, nbytes))
        return read_bulk(m, t, offset, nbytes, with_link);
    double done = t;
    uint64_t page = m->p.page_bytes;
    uint64_t end = offset + nbytes;
    for (uint64_t p = offset / page; p * page < end; p++) {
        uint64_t n = page_part(p, page, offset, end);
        uint32_t plane, ch;
        locate(m, p, &plane, &ch);
        double sensed = hold(m, &m->planes[plane], t, m->p.t_read_ns);
        double moved = hold(m, &m->channels[ch], sensed, (double)n * m->ns_per_channel_byte);
        double over = with_link ? hold(m, &m->link, moved, (double)n * m->ns_per_link_byte)
                                : moved;
        if (over > done)
            done = over;
    }
    return done;
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
    double done = read_stages(m, controller(m, submit), offset, nbytes, 1);
    m->nand_read += nbytes;
    m->link_bytes += nbytes;
    return done + m->p.link_latency_ns;
}

double sde_model_sense(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    if (advance(m, submit) < 0)
        return -1.0;
    m->nand_read += nbytes;
    if (m->p.fixed)
        return submit + m->p.fixed_read_ns;
    return read_stages(m, controller(m, submit), offset, nbytes, 0);
}

/* Continuations start at `ready`, which a caller derives from its command's submission: never
 * before the latest submission (the gaps before it are gone). */
static double not_before_horizon(const sde_model *m, double ready)
{
    return ready > m->horizon ? ready : m->horizon;
}

double sde_model_transfer(sde_model *m, double ready, uint64_t nbytes)
{
    ready = not_before_horizon(m, ready);
    m->link_bytes += nbytes;
    if (m->p.fixed)
        return ready;
    return hold(m, &m->link, ready, (double)nbytes * m->ns_per_link_byte) +
           m->p.link_latency_ns;
}

double sde_model_receive(sde_model *m, double submit, uint64_t nbytes)
{
    if (advance(m, submit) < 0)
        return -1.0;
    m->link_bytes += nbytes;
    if (m->p.fixed)
        return submit;
    return hold(m, &m->link_in, controller(m, submit), (double)nbytes * m->ns_per_link_byte);
}

double sde_model_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes)
{
    ready = not_before_horizon(m, ready);
    m->nand_written += nbytes;
    if (m->p.fixed)
        return ready + m->p.fixed_write_ns;
    return program_stages(m, ready, offset, nbytes);
}

static void cache_pop(sde_model *m)
{
    struct cached *h = m->cache;
    m->cache_bytes -= h[0].bytes;
    h[0] = h[--m->ncache];
    for (uint32_t i = 0;;) {
        uint32_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < m->ncache && h[l].leaves < h[s].leaves)
            s = l;
        if (r < m->ncache && h[r].leaves < h[s].leaves)
            s = r;
        if (s == i)
            break;
        struct cached t = h[i];
        h[i] = h[s];
        h[s] = t;
        i = s;
    }
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
    uint32_t i = m->ncache++;
    m->cache[i] = (struct cached){leaves, bytes};
    m->cache_bytes += bytes;
    while (i) {
        uint32_t up = (i - 1) / 2;
        if (m->cache[up].leaves <= m->cache[i].leaves)
            break;
        struct cached t = m->cache[up];
        m->cache[up] = m->cache[i];
        m->cache[i] = t;
        i = up;
    }
    return 0;
}

/* The write cache's back-pressure: what was programmed by `arrived` has left the cache; if
 * the rest and this write do not fit, the acknowledgement waits for the earliest programs
 * to make room (a write larger than the whole cache waits for its own program). */
double sde_model_cache_ack(sde_model *m, double arrived, double programmed, uint64_t nbytes)
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
    if (cache_push(m, programmed, nbytes) < 0)
        return programmed > ack ? programmed : ack; /* untracked: write-through, pessimistic */
    return ack;
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
    double arrived = hold(m, &m->link_in, t, (double)nbytes * m->ns_per_link_byte);
    double programmed = program_stages(m, arrived, offset, nbytes);
    m->nand_written += nbytes;
    m->link_bytes += nbytes;
    double ack = m->p.write_cache ? sde_model_cache_ack(m, arrived, programmed, nbytes)
                                  : programmed;
    return ack + m->p.link_latency_ns;
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

double sde_model_horizon(const sde_model *m) { return m->horizon; }

void sde_model_get_stats(const sde_model *m, sde_model_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->horizon_ns = m->horizon;
    out->link_busy_ns = m->link.busy;
    out->link_in_busy_ns = m->link_in.busy;
    for (uint32_t i = 0; i < m->p.channels; i++)
        out->channel_busy_ns += m->channels[i].busy;
    for (uint32_t i = 0; i < m->nplanes; i++) {
        out->plane_busy_ns += m->planes[i].busy;
        out->gaps += m->planes[i].gaps.n;
    }
    for (uint32_t i = 0; i < m->p.channels; i++)
        out->gaps += m->channels[i].gaps.n;
    out->gaps += m->link.gaps.n + m->link_in.gaps.n;
    for (uint32_t i = 0; i < m->p.cores; i++)
        out->controller_busy_ns += m->cores[i].busy;
    out->nand_bytes_read = m->nand_read;
    out->nand_bytes_written = m->nand_written;
    out->link_bytes = m->link_bytes;
    double until = m->link.next_free > m->link_in.next_free ? m->link.next_free
                                                            : m->link_in.next_free;
    for (uint32_t i = 0; i < m->p.channels; i++)
        until = m->channels[i].next_free > until ? m->channels[i].next_free : until;
    for (uint32_t i = 0; i < m->nplanes; i++)
        until = m->planes[i].next_free > until ? m->planes[i].next_free : until;
    for (uint32_t i = 0; i < m->p.cores; i++)
        until = m->cores[i].next_free > until ? m->cores[i].next_free : until;
    out->busy_until_ns = until;
}

uint32_t sde_model_next_free(const sde_model *m, double *out, uint32_t max)
{
    uint32_t n = 0, total = m->p.cores + m->nplanes + m->p.channels + 2;
    for (uint32_t i = 0; i < m->p.cores && n < max; i++)
        out[n++] = m->cores[i].next_free;
    for (uint32_t i = 0; i < m->nplanes && n < max; i++)
        out[n++] = m->planes[i].next_free;
    for (uint32_t i = 0; i < m->p.channels && n < max; i++)
        out[n++] = m->channels[i].next_free;
    if (n < max)
        out[n++] = m->link.next_free;
    if (n < max)
        out[n++] = m->link_in.next_free;
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
uint32_t sde_resource_gaps(const sde_resource *r) { return r->gaps.n; }
double sde_resource_next_free(const sde_resource *r) { return r->next_free; }
