/*
 * The timing model (sde_model.h).  A stage on a resource starts at max(ready, free) and holds
 * it for its duration.  Stages reach a resource out of time order (a read whose plane was busy
 * is ready after the next one), so each resource keeps its idle gaps before next_free and a
 * stage takes the first gap at or after its ready time that is long enough; without this a
 * late stage blocks every later one (a profile reached 58% of its random-read bound).  Gaps
 * that end before the latest submission can no longer be used and are forgotten.
 */
#include "sde_model.h"
#include "sde_ftl.h"
#include "sde_gaps.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    uint32_t ndies;
    /* PCIe is full duplex: device-to-host (reads, transfers) and host-to-device (writes,
     * receives) are separate links of the same bandwidth */
    struct sde_resource *cores, *dies, *channels, link, link_in, prog_path, dram;
    double ns_per_link_byte, ns_per_channel_byte, ns_per_prog_byte, ns_per_dram_byte;
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
    /* the FTL, when the params ask for one: 4 KiB units, upr of them per multi-plane row */
    sde_ftl *ftl;
    uint32_t upr, unit;
    uint32_t upl;           /* the FTL's units per line */
    uint64_t ftl_units;     /* its logical units (offsets wrap past them) */
    uint64_t padding, gc_programmed_rows, host_programmed_rows;
    double gc_ns;
    /* a batch (sde_model_read_batch, sde_model_defer_dies): each block's layout and times,
     * and per block and channel the first and last sense (reads) or the channel's start
     * (writes) */
    struct batched *batch;
    uint32_t nbatch, cap_batch, deferring;
    uint64_t batch_bytes;
    double *batch_first, *batch_last;
    uint32_t threads;      /* 2: a helper thread books half of a batch's dies */
    /* a batch's channels not yet booked, [lo, hi) packed as lo | hi << 16: this thread
     * takes them from the bottom, the helper from the top (claim_channel) */
    _Atomic uint32_t channels_left;
    struct helper *helper;
    int helper_failed;
};

struct helper;
static void helper_stop(struct helper *h);

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
    if (!p->channels || p->channels > 0xFFFF /* channels_left packs two */ ||
        !p->dies_per_channel || !p->planes_per_die || !p->page_bytes ||
        !p->cores || p->link_bytes_per_s <= 0 || p->channel_bytes_per_s <= 0)
        return -EINVAL;
    sde_model *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->p = *p;
    /* Dies, with their planes, are the unit that senses and programs: a die senses or
     * programs the pages of its planes at once (a multi-plane operation), so the model's
     * page is a die-row of planes_per_die pages, and rows stripe channel-first over dies. */
    m->p.page_bytes = p->page_bytes * p->planes_per_die;
    m->p.planes_per_die = 1;
    m->ndies = p->channels * p->dies_per_channel;
    m->cores = calloc(p->cores, sizeof(*m->cores));
    m->dies = calloc(m->ndies, sizeof(*m->dies));
    m->channels = calloc(p->channels, sizeof(*m->channels));
    m->ch_pages = calloc(p->channels, sizeof(uint32_t));
    m->ch_bytes = calloc(p->channels, sizeof(uint64_t));
    m->ch_ready = calloc(p->channels, sizeof(double));
    m->ch_last = calloc(p->channels, sizeof(double));
    if (!m->cores || !m->dies || !m->channels || !m->ch_pages || !m->ch_bytes || !m->ch_ready || !m->ch_last) {
        sde_model_free(m);
        return -ENOMEM;
    }
    res_init(&m->link);
    res_init(&m->link_in);
    res_init(&m->prog_path);
    res_init(&m->dram);
    m->ns_per_dram_byte = p->dram_bytes_per_s > 0 ? 1e9 / p->dram_bytes_per_s : 0.0;
    m->ns_per_prog_byte = p->program_bytes_per_s > 0 ? 1e9 / p->program_bytes_per_s : 0.0;
    if (p->ftl_logical_bytes) {
        m->unit = p->ftl_unit_bytes ? p->ftl_unit_bytes : 4096;
        m->upr = m->p.page_bytes / m->unit;
        uint64_t upl = (uint64_t)m->upr * m->ndies * p->ftl_rows_per_die;
        int r = m->upr && m->p.page_bytes % m->unit == 0 && upl < UINT32_MAX
                    ? sde_ftl_new(p->ftl_logical_bytes / m->unit, p->ftl_lines, (uint32_t)upl,
                                  p->ftl_gc_free_lines, &m->ftl)
                    : -EINVAL;
        if (r < 0) {
            sde_model_free(m);
            return r;
        }
        m->upl = (uint32_t)upl;
        m->ftl_units = p->ftl_logical_bytes / m->unit;
    }
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
    for (uint32_t i = 0; m->dies && i < m->ndies; i++)
        res_fini(&m->dies[i]);
    for (uint32_t i = 0; m->channels && i < m->p.channels; i++)
        res_fini(&m->channels[i]);
    res_fini(&m->link);
    res_fini(&m->link_in);
    res_fini(&m->prog_path);
    res_fini(&m->dram);
    free(m->cores);
    free(m->dies);
    free(m->channels);
    free(m->cache);
    free(m->ch_pages);
    free(m->ch_bytes);
    free(m->ch_ready);
    free(m->ch_last);
    helper_stop(m->helper);
    free(m->batch);
    free(m->batch_first);
    free(m->batch_last);
    sde_ftl_free(m->ftl);
    free(m);
}

void sde_model_set_threads(sde_model *m, uint32_t threads)
{
    m->threads = threads;
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

static int use_bulk(const sde_model *m, uint64_t offset, uint64_t nbytes)
{
    uint64_t page = m->p.page_bytes;
    uint64_t pages = (offset + nbytes + page - 1) / page - offset / page;
    return m->p.bulk_pages && pages >= m->p.bulk_pages;
}

/* ---- batches -----------------------------------------------------------------------------
 * A replay hands the model a request's blocks at one submission time, and each block books
 * every die once (512 of them on star2000d): ~65M die bookings for the bundled trace, most
 * of its time.  In a batch the dies are booked die by die (a die's blocks in block order) and
 * everything else block by block, as before, so that the dies can be shared between two
 * threads (below; alone, the order gained nothing).  A die's stage
 * depends only on the die and on its ready time, which the stages before it give, and on a
 * read or a program no stage before the dies depends on a die: so each resource sees the same
 * stages in the same order, and every time is the one block-by-block booking gives
 * (tests/test_timing_batches.py compares the two on random states).  Only bulk transfers without an
 * FTL batch (a page-path transfer books dies and channels alternately). */
struct batched {
    double t;    /* reads: the senses' ready time; writes: the block's arrival */
    double xfer; /* writes: a page's time on its channel */
    uint64_t off;
    uint64_t base, extra, planes; /* the j-th die of the first stripe (j < planes) takes
                                   * base + (j < extra) pages */
    uint32_t q0mod, r0;           /* the first page's die row mod D, and its channel */
};

static int batch_reserve(sde_model *m, uint32_t n)
{
    if (n <= m->cap_batch)
        return 0;
    size_t per = (size_t)n * m->p.channels * sizeof(double);
    struct batched *b = realloc(m->batch, n * sizeof(*b));
    if (!b)
        return -ENOMEM;
    m->batch = b;
    double *f, *l; /* a block's channels from a cache line's start: threads write them */
    if (posix_memalign((void **)&f, 64, per))
        return -ENOMEM;
    free(m->batch_first);
    m->batch_first = f;
    if (posix_memalign((void **)&l, 64, per))
        return -ENOMEM;
    free(m->batch_last);
    m->batch_last = l;
    m->cap_batch = n;
    return 0;
}

static struct batched *batch_slot(sde_model *m, uint32_t i, struct bulk b, double t)
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

/* The place j in block x's first stripe of the die on channel ch, row die (pages go channel
 * first, then die rows: page p0 + j is on channel (p0 + j) mod C, row ((p0 + j) / C) mod D).
 * A channel before the first page's has its first page in the next row of channels. */
static inline uint64_t batch_place(const struct batched *x, uint32_t ch, uint32_t die,
                                   uint32_t C, uint32_t D)
{
    uint32_t next = ch < x->r0;
    uint32_t q = x->q0mod + next;
    if (q >= D)
        q -= D;
    uint32_t rows = die >= q ? die - q : die + D - q;
    return (uint64_t)(next + rows) * C + ch - x->r0;
}

/* The next channel of a batch to book, from the bottom or from the top; C when none is
 * left.  Each thread keeps to its own end, so that from batch to batch a channel's dies (their
 * resources and gap chunks, half a megabyte in all) stay in one core's cache and only the
 * channels near the meeting point move.  Taken first come, first served (and with the false
 * sharing batch_dies no longer has), each of two threads booked ~1.6x slower than one thread
 * alone, and the helper gained 8%; the two fixes together made it ~30% of a replay. */
static uint32_t claim_channel(sde_model *m, int from_top)
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
static void batch_dies(sde_model *m, int programs, double *programmed, int from_top)
{
    uint32_t C = m->p.channels, D = m->p.dies_per_channel;
    double t_read = m->p.t_read_ns, t_prog = m->p.t_prog_ns;
    /* Blocks outer, the channel's dies inner: each die still sees its blocks in block order
     * (all that its bookings depend on), and a block's first and last sense on the channel
     * stay in registers, stored once.  Die-outer order stored them once per die, and the
     * two threads' channels share a block's cache lines: that false sharing was a third of
     * this function's time. */
    for (uint32_t ch; (ch = claim_channel(m, from_top)) < C;)
    for (uint32_t i = 0; i < m->nbatch; i++) {
        const struct batched *x = &m->batch[i];
        size_t at = (size_t)i * C + ch;
        double base = m->batch_first[at], first = 1e300, last = 0.0, prog_max = 0.0;
        struct sde_resource *r = &m->dies[(size_t)ch * D];
        for (uint32_t die = 0; die < D; die++, r++) {
            uint64_t j = batch_place(x, ch, die, C, D);
            if (j >= x->planes)
                continue;
            double k = (double)(x->base + (j < x->extra));
            if (programs) {
                double ready = base + (double)(uint32_t)(j / C + 1) * x->xfer;
                double prog = hold(m, r, ready, k * t_prog);
                if (prog > prog_max)
                    prog_max = prog;
            } else {
                double done = hold(m, r, x->t, k * t_read);
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

/* ---- the helper thread ---------------------------------------------------------------------
 * Dies are independent resources, so a batch's dies split between two threads book exactly
 * what one thread would: this thread and a helper take the channels one at a time, each
 * channel's dies whole, from the two ends (claim_channel; the helper's programs' times into
 * its own array, merged by max).  A fixed half each left one thread waiting for the other by
 * a fifth of the time.  With two threads asked
 * for (sde_model_set_threads) on a host with two or more CPUs, the helper is started on the
 * first batch large enough.  Between batches it spins for up to HELPER_SPIN_NS and then
 * sleeps: a replay's batches come ~0.1 ms apart, and waking a sleeping thread cost ~30 us
 * per batch in a VM, which took all the gain. */
/* Smaller batches are not worth the handoff.  A single block on star2000d's 512 dies is: a
 * replay's requests often load or store one block (at 1,024 such batches were 40% of them,
 * all on one thread). */
#define HELPER_MIN_HOLDS 512
#define HELPER_SPIN_NS 2000000.0

struct helper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t posted, finished;
    int stop, programs;
    double *programmed;
    uint32_t cap;
    sde_model *m;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Spin until *word != value or HELPER_SPIN_NS have passed. */
static void spin_while(_Atomic uint64_t *word, uint64_t value)
{
    double until = 0.0;
    for (uint32_t spin = 1; atomic_load(word) == value; spin++) {
        cpu_relax();
        if (spin % 256 == 0) {
            double t = now_ns();
            if (until == 0.0)
                until = t + HELPER_SPIN_NS;
            else if (t > until)
                return;
        }
    }
}

static void *helper_main(void *arg)
{
    struct helper *h = arg;
    uint64_t seen = 0;
    for (;;) {
        spin_while(&h->posted, seen);
        pthread_mutex_lock(&h->mu);
        while (atomic_load(&h->posted) == seen && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        int stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (stop)
            return NULL;
        seen = atomic_load(&h->posted);
        batch_dies(h->m, h->programs, h->programmed, 1);
        pthread_mutex_lock(&h->mu);
        atomic_store(&h->finished, seen);
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
}

static struct helper *helper_start(sde_model *m)
{
    if (m->helper_failed || sysconf(_SC_NPROCESSORS_ONLN) < 2)
        return NULL;
    struct helper *h = calloc(1, sizeof(*h));
    if (!h || pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        m->helper_failed = 1;
        return NULL;
    }
    pthread_cond_init(&h->cv, NULL);
    h->m = m;
    if (pthread_create(&h->thread, NULL, helper_main, h) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        m->helper_failed = 1;
        return NULL;
    }
    return h;
}

static void helper_stop(struct helper *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h->programmed);
    free(h);
}

/* The batch's dies, on two threads when it is worth it. */
static void batch_dies_all(sde_model *m, int programs, double *programmed)
{
    struct helper *h = NULL;
    atomic_store(&m->channels_left, m->p.channels << 16);
    if (m->threads > 1 && m->p.channels > 1 && (uint64_t)m->nbatch * m->ndies >= HELPER_MIN_HOLDS) {
        if (!m->helper)
            m->helper = helper_start(m);
        h = m->helper;
    }
    if (h && programs && h->cap < m->nbatch) {
        double *p = realloc(h->programmed, m->nbatch * sizeof(double));
        if (p) {
            h->programmed = p;
            h->cap = m->nbatch;
        } else {
            h = NULL;
        }
    }
    if (!h) {
        batch_dies(m, programs, programmed, 0);
        return;
    }
    if (programs)
        memcpy(h->programmed, programmed, m->nbatch * sizeof(double));
    h->programs = programs;
    pthread_mutex_lock(&h->mu);
    uint64_t job = atomic_load(&h->posted) + 1;
    atomic_store(&h->posted, job);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    batch_dies(m, programs, programmed, 0);
    if (atomic_load(&h->finished) != job)
        spin_while(&h->finished, job - 1);
    pthread_mutex_lock(&h->mu);
    while (atomic_load(&h->finished) != job)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    for (uint32_t i = 0; programs && i < m->nbatch; i++)
        if (h->programmed[i] > programmed[i])
            programmed[i] = h->programmed[i];
}

/* Not const: batch_reserve grows the batch table when n blocks need more slots. */
static int batchable(sde_model *m, const uint64_t *offs, uint32_t n, uint64_t nbytes)
{
    if (m->p.fixed || m->ftl || m->deferring || !n || m->p.planes_per_die != 1)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        if (!use_bulk(m, offs[i], nbytes))
            return 0;
    return batch_reserve(m, n) == 0;
}

/* The channels and the link of a bulk read whose senses are booked: first[c] and last[c],
 * channel c's first and last sense (b's channel pages and bytes in m->ch_pages/ch_bytes). */
static double read_bulk_channels(sde_model *m, double t, uint64_t nbytes, const double *first,
                                 const double *last_sense, int with_link)
{
    double page = (double)(nbytes < m->p.page_bytes ? nbytes : m->p.page_bytes);
    double link_ready = 1e300, last = t;
    for (uint32_t c = 0; c < m->p.channels; c++) {
        if (!m->ch_pages[c])
            continue;
        double dur = (double)m->ch_bytes[c] * m->ns_per_channel_byte;
        double done = hold(m, &m->channels[c], first[c], dur);
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
    double over = hold(m, &m->link, link_ready, (double)nbytes * m->ns_per_link_byte);
    double tail = last + page * m->ns_per_link_byte;
    return over > tail ? over : tail;
}

static double read_bulk(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                        int with_link)
{
    struct bulk b = bulk_layout(m, offset, nbytes);
    for (uint32_t c = 0; c < m->p.channels; c++) {
        m->ch_ready[c] = 1e300;
        m->ch_last[c] = 0.0;
    }
    FOR_BULK_PLANES(m, b, {
        (void)i;
        double done = hold(m, &m->dies[plane], t, k * m->p.t_read_ns);
        double first = done - (k - 1) * m->p.t_read_ns;
        if (first < m->ch_ready[c])
            m->ch_ready[c] = first;
        if (done > m->ch_last[c])
            m->ch_last[c] = done;
    });
    return read_bulk_channels(m, t, nbytes, m->ch_ready, m->ch_last, with_link);
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
    if (m->deferring && m->nbatch < m->cap_batch) { /* the dies later, die by die (sde_model_run_deferred) */
        struct batched *x = batch_slot(m, m->nbatch++, b, arrived);
        x->xfer = xfer;
        memcpy(&m->batch_first[(size_t)(x - m->batch) * m->p.channels], m->ch_ready,
               m->p.channels * sizeof(double));
        return programmed;
    }
    uint32_t C = m->p.channels;
    FOR_BULK_PLANES(m, b, {
        double ready = m->ch_ready[c] + (i / C + 1) * xfer;
        double prog = hold(m, &m->dies[plane], ready, k * m->p.t_prog_ns);
        if (prog > programmed)
            programmed = prog;
    });
    return programmed;
}

static double page_programs(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes);

/* nbytes through the DRAM from ready (ready itself without a DRAM) */
static double dram(sde_model *m, double ready, uint64_t nbytes)
{
    if (m->ns_per_dram_byte <= 0 || !nbytes)
        return ready;
    return hold(m, &m->dram, ready, (double)nbytes * m->ns_per_dram_byte);
}

double sde_model_dram(void *model, double ready, uint64_t nbytes)
{
    sde_model *m = model; /* never before the latest submission: older gaps are gone */
    return dram(m, ready > m->horizon ? ready : m->horizon, nbytes);
}

/* The NAND half of a write of data in the controller at `arrived`: channel transfers and
 * programs; returns when the last page is programmed. */
static double program_stages(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes)
{
    double floor = arrived;
    if (m->ns_per_prog_byte > 0) {
        /* the controller's program path (its power budget and write datapath) moves the data
         * at program_bytes_per_s; each page goes on to its channel as it leaves */
        double dur = (double)nbytes * m->ns_per_prog_byte;
        double piped = hold(m, &m->prog_path, arrived, dur);
        uint64_t first = nbytes < m->p.page_bytes ? nbytes : m->p.page_bytes;
        arrived = piped - dur + (double)first * m->ns_per_prog_byte;
        floor = piped + m->p.t_prog_ns;
    }
    /* the data leaves the DRAM write cache as the program path takes it */
    double out = dram(m, arrived, nbytes) + m->p.t_prog_ns;
    if (out > floor)
        floor = out;
    double done = use_bulk(m, offset, nbytes) ? write_bulk(m, arrived, offset, nbytes)
                                              : page_programs(m, arrived, offset, nbytes);
    return done > floor ? done : floor;
}

static double page_programs(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes)
{
    double programmed = arrived;
    uint64_t page = m->p.page_bytes;
    uint64_t end = offset + nbytes;
    for (uint64_t p = offset / page; p * page < end; p++) {
        uint64_t n = page_part(p, page, offset, end);
        uint32_t plane, ch;
        locate(m, p, &plane, &ch);
        double moved = hold(m, &m->channels[ch], arrived, (double)n * m->ns_per_channel_byte);
        double prog = hold(m, &m->dies[plane], moved, m->p.t_prog_ns);
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
        double sensed = hold(m, &m->dies[plane], t, m->p.t_read_ns);
        double moved = hold(m, &m->channels[ch], sensed, (double)n * m->ns_per_channel_byte);
        double over = with_link ? hold(m, &m->link, moved, (double)n * m->ns_per_link_byte)
                                : moved;
        if (over > done)
            done = over;
    }
    return done;
}

/* ---- the FTL ------------------------------------------------------------------------------
 * With an FTL (sde_ftl.h) a logical 4 KiB unit lives where its last write was appended, and
 * the stages above run on physical addresses: physical unit f at byte f * unit of a physical
 * space laid out on the dies as logical space is without one.  Writes append units; a row
 * (the multi-plane page of one die) is programmed once all its units have arrived, so small
 * writes are packed as a drive's write buffer packs them; a flush programs the partial row
 * (padding).  GC runs when a write point opens a line and free lines are at the threshold:
 * the victim's valid units are sensed, appended to the GC write point and programmed, and the
 * line is erased on every die, all booked from the triggering write's arrival, so that GC
 * competes with host I/O for dies and channels. */


/* Runs of completed rows, programmed from `ready`: consecutive rows are one run (a stream of
 * appends is a sequential physical stream, so a large write still takes the bulk path). */
struct rows {
    uint64_t first, n;
    double programmed;
    uint64_t bytes;
};

static void rows_flush(sde_model *m, struct rows *r, double ready)
{
    if (!r->n)
        return;
    uint64_t row = m->p.page_bytes;
    double done = program_stages(m, ready, r->first * row, r->n * row);
    if (done > r->programmed)
        r->programmed = done;
    r->bytes += r->n * row;
    r->n = 0;
}

/* Unit f was just appended: when it completes its row, the row joins the run. */
static void rows_add(sde_model *m, struct rows *r, uint32_t f, double ready)
{
    if ((f + 1) % m->upr)
        return;
    uint64_t row = f / m->upr;
    if (r->n && row != r->first + r->n)
        rows_flush(m, r, ready);
    if (!r->n)
        r->first = row;
    r->n++;
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
    return read_stages(m, t, (uint64_t)f0 * m->unit, (uint64_t)n * m->unit, 0);
}

static void gc(sde_model *m, double t)
{
    double before = dies_busy(m);
    uint32_t upl = m->upl;
    while (sde_ftl_gc_needed(m->ftl)) {
        int64_t victim = sde_ftl_victim(m->ftl);
        if (victim < 0)
            break;
        struct rows r = {0};
        double sensed_all = t;
        uint32_t base = (uint32_t)victim * upl, run = 0;
        for (uint32_t s = 0; s <= upl; s++) {
            uint32_t owner = s < upl ? sde_ftl_owner(m->ftl, base + s) : SDE_FTL_UNMAPPED;
            if (owner != SDE_FTL_UNMAPPED) {
                run++;
                continue;
            }
            if (!run)
                continue;
            uint32_t f0 = base + s - run;
            double sensed = gc_sense(m, t, f0, run);
            if (sensed > sensed_all)
                sensed_all = sensed;
            for (uint32_t k = 0; k < run; k++) {
                uint32_t u = sde_ftl_owner(m->ftl, f0 + k);
                uint32_t f = sde_ftl_append(m->ftl, 1, u);
                if (f == SDE_FTL_UNMAPPED)
                    break; /* no free line at all: cannot happen with the FTL's sizing */
                rows_add(m, &r, f, sensed);
            }
            rows_flush(m, &r, sensed);
            run = 0;
        }
        m->gc_programmed_rows += r.bytes / m->p.page_bytes;
        double erase = m->p.t_erase_ns * m->p.ftl_erase_share;
        for (uint32_t d = 0; d < m->ndies; d++)
            hold(m, &m->dies[d], sensed_all, erase);
        sde_ftl_erase(m->ftl, (uint32_t)victim);
    }
    m->gc_ns += dies_busy(m) - before;
}

/* Append the units of [offset, offset + nbytes) at the host write point (logical units wrap
 * at the FTL's logical size) and program the rows they complete from `arrived`; returns the
 * last row's program time (`arrived` when none completed) and the bytes of the rows in
 * *rows_bytes. */
static double ftl_write(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes,
                        uint64_t *rows_bytes)
{
    struct rows r = {.programmed = arrived};
    uint64_t u0 = offset / m->unit, u1 = (offset + nbytes + m->unit - 1) / m->unit;
    for (uint64_t u = u0; u < u1; u++) {
        if (sde_ftl_next_slot(m->ftl, 0) % m->upl == 0 && sde_ftl_gc_needed(m->ftl)) {
            rows_flush(m, &r, arrived);
            gc(m, arrived);
        }
        uint32_t f = sde_ftl_append(m->ftl, 0, u % m->ftl_units);
        if (f == SDE_FTL_UNMAPPED)
            break;
        rows_add(m, &r, f, arrived);
    }
    rows_flush(m, &r, arrived);
    m->host_programmed_rows += r.bytes / m->p.page_bytes;
    *rows_bytes = r.bytes;
    return r.programmed;
}

/* Program the host write point's partial row now (a flush, or a write without the cache):
 * the rest of the row is padding. */
static double ftl_pad(sde_model *m, double ready)
{
    uint32_t next = sde_ftl_next_slot(m->ftl, 0);
    if (next % m->upr == 0)
        return ready;
    uint32_t left = m->upr - next % m->upr;
    m->padding += (uint64_t)left * m->unit;
    uint64_t row = next / m->upr;
    sde_ftl_skip(m->ftl, 0, left);
    m->host_programmed_rows++;
    return program_stages(m, ready, row * m->p.page_bytes, m->p.page_bytes);
}

/* The NAND half of reading [offset, offset + nbytes) with an FTL: each run of units that are
 * contiguous where they live (a never-written unit is read where its offset says). */
static double ftl_read_stages(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                              int with_link)
{
    uint64_t end = offset + nbytes, run_at = 0, run_len = 0;
    double done = t;
    for (uint64_t at = offset; at < end;) {
        uint64_t u = at / m->unit, take = (u + 1) * m->unit - at;
        if (take > end - at)
            take = end - at;
        uint32_t f = sde_ftl_lookup(m->ftl, u % m->ftl_units);
        uint64_t where = f == SDE_FTL_UNMAPPED ? at : (uint64_t)f * m->unit + at % m->unit;
        if (run_len && where != run_at + run_len) {
            double d = read_stages(m, t, run_at, run_len, with_link);
            done = d > done ? d : done;
            run_len = 0;
        }
        if (!run_len)
            run_at = where;
        run_len += take;
        at += take;
    }
    if (run_len) {
        double d = read_stages(m, t, run_at, run_len, with_link);
        done = d > done ? d : done;
    }
    return done;
}

static double nand_read(sde_model *m, double t, uint64_t offset, uint64_t nbytes, int with_link)
{
    return m->ftl ? ftl_read_stages(m, t, offset, nbytes, with_link)
                  : read_stages(m, t, offset, nbytes, with_link);
}

void sde_model_trim(sde_model *m, uint64_t offset, uint64_t nbytes)
{
    if (!m->ftl)
        return;
    uint64_t u0 = (offset + m->unit - 1) / m->unit, u1 = (offset + nbytes) / m->unit;
    if (u1 - u0 > m->ftl_units)
        u1 = u0 + m->ftl_units;
    for (uint64_t u = u0; u < u1; u++)
        sde_ftl_trim(m->ftl, u % m->ftl_units);
}

/* ---- commands ----------------------------------------------------------------------------- */

double sde_model_read(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    if (advance(m, submit) < 0)
        return -1.0;
    if (m->p.fixed) {
        m->nand_read += nbytes;
        m->link_bytes += nbytes;
        return submit + m->p.fixed_read_ns;
    }
    double t = controller(m, submit) + m->p.read_latency_ns;
    double done = nand_read(m, t, offset, nbytes, 1);
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
    double t = controller(m, submit) + m->p.read_latency_ns;
    double sensed = nand_read(m, t, offset, nbytes, 0);
    double landed = dram(m, t, nbytes); /* into the DRAM, for the firmware */
    return sensed > landed ? sensed : landed;
}

/* Batched reads (the batches above): the controller and the senses of n blocks, die by die. */
int sde_model_read_batch(sde_model *m, double submit, const uint64_t *offs, uint32_t n,
                         uint64_t nbytes)
{
    if (submit < m->horizon || !batchable(m, offs, n, nbytes))
        return -1;
    advance(m, submit);
    uint32_t C = m->p.channels;
    for (uint32_t i = 0; i < n; i++) {
        struct batched *x = batch_slot(m, i, bulk_layout(m, offs[i], nbytes),
                                       controller(m, submit) + m->p.read_latency_ns);
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
    bulk_layout(m, x->off, nbytes); /* the block's channel pages and bytes */
    m->nand_read += nbytes;
    double last = read_bulk_channels(m, x->t, nbytes, &m->batch_first[(size_t)i * C],
                                     &m->batch_last[(size_t)i * C], !sense);
    if (sense) {
        double landed = dram(m, x->t, nbytes);
        return last > landed ? last : landed;
    }
    m->link_bytes += nbytes;
    return last + m->p.link_latency_ns;
}

int sde_model_defer_dies(sde_model *m, double submit, const uint64_t *offs, uint32_t n,
                         uint64_t nbytes)
{
    if (submit < m->horizon || !batchable(m, offs, n, nbytes))
        return -1;
    m->deferring = 1;
    m->nbatch = 0;
    return 0;
}

void sde_model_run_deferred(sde_model *m, double *programmed)
{
    m->deferring = 0;
    batch_dies_all(m, 1, programmed);
    m->nbatch = 0;
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
    double over = hold(m, &m->link, ready, (double)nbytes * m->ns_per_link_byte);
    double out = dram(m, ready, nbytes); /* out of the DRAM */
    return (over > out ? over : out) + m->p.link_latency_ns;
}

uint32_t sde_model_pieces(const sde_model *m, uint64_t nbytes)
{
    uint64_t rows = (nbytes + m->p.page_bytes - 1) / m->p.page_bytes;
    uint64_t n = rows / m->p.channels;
    return n < 1 ? 1 : n > 64 ? 64 : (uint32_t)n;
}

double sde_model_transfer_streamed(sde_model *m, double first, double prev_end, uint32_t pieces,
                                   uint64_t nbytes)
{
    double done = sde_model_transfer(m, first, nbytes);
    if (m->p.fixed || !pieces)
        return done;
    double tail = prev_end + (double)nbytes * m->ns_per_link_byte / pieces + m->p.link_latency_ns;
    return done > tail ? done : tail;
}

double sde_model_program_streamed(sde_model *m, double first, double prev_end, uint32_t pieces,
                                  uint64_t offset, uint64_t nbytes, uint64_t *leaving)
{
    double done = sde_model_program_leaving(m, first, offset, nbytes, leaving);
    if (m->p.fixed || !pieces)
        return done;
    /* the last piece leaves the kernel at prev_end: its program can end no sooner */
    double tail = prev_end + m->p.t_prog_ns;
    return done > tail ? done : tail;
}

double sde_model_receive(sde_model *m, double submit, uint64_t nbytes)
{
    if (advance(m, submit) < 0)
        return -1.0;
    m->link_bytes += nbytes;
    if (m->p.fixed)
        return submit;
    double t = controller(m, submit);
    double in = hold(m, &m->link_in, t, (double)nbytes * m->ns_per_link_byte);
    double landed = dram(m, t, nbytes);
    return in > landed ? in : landed;
}

/* The NAND half of a write whose data is in the controller at `ready`: when its programs are
 * done.  With an FTL and the write cache, rows left partial wait for later writes (their
 * time is the rows completed so far); without the cache the partial row is padded.
 * *leaving: the bytes whose programs this booked, which leave the write cache when done
 * (with an FTL, the rows it completed; without one, the write itself). */
static double nand_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                           uint64_t *leaving)
{
    *leaving = nbytes;
    if (!m->ftl)
        return program_stages(m, ready, offset, nbytes);
    double done = ftl_write(m, ready, offset, nbytes, leaving);
    if (!m->p.write_cache) {
        double pad = ftl_pad(m, ready);
        done = pad > done ? pad : done;
    }
    return done;
}

double sde_model_program_leaving(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                                 uint64_t *leaving)
{
    uint64_t ignored;
    if (!leaving)
        leaving = &ignored;
    *leaving = nbytes;
    ready = not_before_horizon(m, ready);
    m->nand_written += nbytes;
    if (m->p.fixed)
        return ready + m->p.fixed_write_ns;
    return nand_program(m, ready, offset, nbytes, leaving);
}

double sde_model_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes)
{
    return sde_model_program_leaving(m, ready, offset, nbytes, NULL);
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
    if (advance(m, submit) < 0)
        return -1.0;
    double t = controller(m, submit);
    double in = hold(m, &m->link_in, t, (double)nbytes * m->ns_per_link_byte);
    double landed = dram(m, t, nbytes); /* into the DRAM write cache as it arrives */
    *arrived = in > landed ? in : landed;
    double programmed = nand_program(m, *arrived, offset, nbytes, leaving);
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
    if (advance(m, submit) < 0)
        return -1.0;
    if (m->p.fixed) {
        m->nand_written += nbytes;
        m->link_bytes += nbytes;
        return submit + m->p.fixed_write_ns;
    }
    double arrived;
    uint64_t leaving;
    double programmed = sde_model_write_programmed(m, submit, offset, nbytes, &arrived, &leaving);
    if (programmed < 0)
        return -1.0;
    return sde_model_write_ack(m, arrived, programmed, nbytes, leaving);
}

double sde_model_flush(sde_model *m, double submit)
{
    if (advance(m, submit) < 0)
        return -1.0;
    if (m->p.fixed)
        return submit + m->p.fixed_other_ns;
    double t = controller(m, submit);
    if (m->ftl)
        ftl_pad(m, t);
    for (uint32_t i = 0; i < m->ndies; i++)
        if (m->dies[i].next_free > t)
            t = m->dies[i].next_free;
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

/* ---- a closed loop ------------------------------------------------------------------------ */

static void heap_push(double *h, uint32_t *n, double v)
{
    uint32_t i = (*n)++;
    h[i] = v;
    while (i && h[(i - 1) / 2] > h[i]) {
        double t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static double heap_pop(double *h, uint32_t *n)
{
    double top = h[0];
    h[0] = h[--(*n)];
    for (uint32_t i = 0;;) {
        uint32_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < *n && h[l] < h[s])
            s = l;
        if (r < *n && h[r] < h[s])
            s = r;
        if (s == i)
            break;
        double t = h[i];
        h[i] = h[s];
        h[s] = t;
        i = s;
    }
    return top;
}

double sde_model_closed_loop(sde_model *m, int write, uint32_t qd, uint64_t n, uint64_t nbytes,
                             uint64_t span, uint64_t seed, double start, double *marks,
                             uint32_t nmarks)
{
    if (!qd || !n || !nbytes || span < nbytes || start < m->horizon)
        return -1.0;
    double *heap = malloc(qd * sizeof(double));
    if (!heap)
        return -1.0;
    uint64_t slots = span / nbytes, next = 0, x = seed ? seed : 1, submitted = 0, done = 0;
    uint32_t nh = 0, mark = 0;
    double last = start;
#define NEXT_OFFSET()                                                                      \
    (seed ? (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (x % slots) * nbytes)                \
          : (next++ % slots) * nbytes)
    for (; submitted < n && submitted < qd; submitted++) {
        uint64_t off = NEXT_OFFSET();
        heap_push(heap, &nh, write ? sde_model_write(m, start, off, nbytes)
                                   : sde_model_read(m, start, off, nbytes));
    }
    while (nh) {
        double t = heap_pop(heap, &nh);
        last = t;
        done++;
        while (mark < nmarks && done * nmarks >= (mark + 1) * n)
            marks[mark++] = t;
        if (submitted < n) {
            uint64_t off = NEXT_OFFSET();
            heap_push(heap, &nh, write ? sde_model_write(m, t, off, nbytes)
                                       : sde_model_read(m, t, off, nbytes));
            submitted++;
        }
    }
#undef NEXT_OFFSET
    free(heap);
    return last;
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
