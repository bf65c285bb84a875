/*
 * The timing model's private header: the model's state and the functions one file of
 * c/model calls in another (sde_model.h is the public interface).  The files: model_core
 * (resources, the model's life, the controller, where a byte lands), model_bulk (whole
 * stripes at once), model_batch (a request's blocks booked die by die), model_helper (the
 * thread that takes half the dies), model_ftl (mapping, GC), model_commands (reads,
 * programs, transfers), model_cache (the write cache), model_loop (a closed loop, and one
 * resource for tests).
 *
 */
#ifndef MODEL_PRIVATE_H
#define MODEL_PRIVATE_H

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

/* How each command is timed: by the detailed model (model_commands.c, model_cache.c) or by
 * the fixed one beside it (model_fixed.c), behind one interface as NVMeVirt's simple FTL sits
 * beside its conventional one; chosen once, when the model is made.  The public calls
 * (sde_model_*) do what both share (the submission's horizon, the byte counters) and call
 * through it. */
struct model_ops {
    double (*read)(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
    double (*sense)(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
    double (*transfer)(sde_model *m, double ready, uint64_t nbytes);
    double (*receive)(sde_model *m, double submit, uint64_t nbytes);
    double (*program)(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                      uint64_t *leaving);
    double (*write)(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
    double (*flush)(sde_model *m, double submit);
    double (*nop)(sde_model *m, double submit);
    int streams; /* streamed stages end no earlier than their last piece (the fixed: no) */
};
extern const struct model_ops model_detailed_ops, model_fixed_ops;
double model_detailed_read(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
double model_detailed_sense(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
double model_detailed_transfer(sde_model *m, double ready, uint64_t nbytes);
double model_detailed_receive(sde_model *m, double submit, uint64_t nbytes);
double model_detailed_write(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
double model_detailed_flush(sde_model *m, double submit);
double model_detailed_nop(sde_model *m, double submit);

struct sde_model {
    sde_model_params p;
    const struct model_ops *ops;
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
    /* deferred programs with an FTL: a block's rows may be several bulk programs, or none,
     * so each slot names its block (batch_owner), the slots' times go to batch_prog, and a
     * block's largest to defer_raise until run_deferred; defer_next: the next block */
    uint32_t *batch_owner, defer_next, cap_raise;
    double *batch_prog, *defer_raise;
    uint64_t batch_bytes;
    double *batch_first, *batch_last;
    uint32_t threads;      /* 2: a helper thread books half of a batch's dies */
    double erase_ready, erase_ns; /* model_hold_all_dies's stage, for both threads */
    /* a batch's channels not yet booked, [lo, hi) packed as lo | hi << 16: this thread
     * takes them from the bottom, the helper from the top (model_claim_channel) */
    _Atomic uint32_t channels_left;
    struct helper *helper;
    int helper_failed;
};

struct helper;
/* a batch's dies booked (from_top: the helper's half, from the last die down); programs:
 * 0 the senses of reads, 1 deferred programs, BATCH_ERASE every die held from erase_ready */
typedef void (*model_dies_fn)(sde_model *m, int programs, double *programmed, int from_top);
#define BATCH_ERASE 2
/* The deferred programs so far booked on their dies (before anything else books a die, so
 * that every die sees its work in the order an unbatched run gives it). */
void model_defer_flush(sde_model *m);

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
#define HELPER_MISSES 8

struct helper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* posted: the latest batch handed out; finished: the latest the helper completed;
     * taken: the latest claimed, by the helper when it starts on it, or by the posting
     * thread when it has booked every die before the helper started (it then does not wait
     * for a helper that is not running: a busy host's scheduler may not run it for ms) */
    _Atomic uint64_t posted, finished, taken;
    uint32_t missed; /* batches in a row the poster took alone: past HELPER_MISSES, the
                      * helper sleeps between batches instead of spinning on a core that
                      * someone else needs */
    int stop, programs;
    double *programmed;
    uint32_t cap;
    sde_model *m;
    model_dies_fn work; /* the dies it books: model_batch_dies (from the top) */
};

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
#define NEXT_OFFSET()                                                                      \
    (seed ? (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (x % slots) * nbytes)                \
          : (next++ % slots) * nbytes)

/* ---- functions shared between the files ------------------------------------------- */

/* model_core.c */
void model_res_init(struct sde_resource *r);
void model_res_fini(struct sde_resource *r);
double model_res_hold(struct sde_resource *r, double ready, double duration);
void model_res_forget_before(struct sde_resource *r, double t);
int model_advance(sde_model *m, double submit);
void model_res_gap(struct sde_resource *r, double start);
double model_res_fit(struct sde_resource *r, double ready, double duration);

/* A stage held from `ready` for `duration`: in the first gap that holds it, else at the end
 * of the resource's time, the idle time before it a new gap.  Inline, its slow halves
 * (model_res_fit, model_res_gap) out of line: a replay books ~150M stages. */
static inline double model_res_end(struct sde_resource *r, double ready, double duration)
{
    double start = ready > r->next_free ? ready : r->next_free;
    if (start > r->next_free)
        model_res_gap(r, start);
    r->next_free = start + duration;
    return r->next_free;
}

static inline double model_res_hold_inline(struct sde_resource *r, double ready,
                                           double duration)
{
    r->busy += duration;
    if (r->gaps.n && r->last_end > ready)
        return model_res_fit(r, ready, duration);
    return model_res_end(r, ready, duration);
}

/* ...on a resource of the model, which first drops the gaps that end before the latest
 * submission (model_advance says why). */
static inline double model_hold(sde_model *m, struct sde_resource *r, double ready,
                                double duration)
{
    if (r->gaps.n && r->first_end <= m->horizon)
        model_res_forget_before(r, m->horizon);
    return model_res_hold_inline(r, ready, duration);
}

double model_controller(sde_model *m, double submit);
uint64_t model_page_part(uint64_t p, uint64_t page, uint64_t offset, uint64_t end);
void model_locate(const sde_model *m, uint64_t page, uint32_t *plane, uint32_t *ch);

/* model_bulk.c */
struct bulk model_bulk_layout(sde_model *m, uint64_t offset, uint64_t nbytes);
int model_use_bulk(const sde_model *m, uint64_t offset, uint64_t nbytes);
double model_read_bulk_channels(sde_model *m, double t, uint64_t nbytes, const double *first,
                                 const double *last_sense, int with_link);
double model_read_bulk(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                        int with_link);
double model_write_bulk(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes);

/* model_batch.c */
struct batched *model_batch_slot(sde_model *m, uint32_t i, struct bulk b, double t);
int model_batch_reserve(sde_model *m, uint32_t n);
uint32_t model_claim_channel(sde_model *m, int from_top);
void model_batch_dies(sde_model *m, int programs, double *programmed, int from_top);
void model_hold_all_dies(sde_model *m, double ready, double duration);

/* model_helper.c */
void model_spin_while(_Atomic uint64_t *word, uint64_t value);
struct helper *model_helper_start(sde_model *m, model_dies_fn work);
void model_helper_stop(struct helper *h);

/* model_commands.c */
double model_dram(sde_model *m, double ready, uint64_t nbytes);
double model_program_stages(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes);
double model_read_stages(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                          int with_link);
double model_nand_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                           uint64_t *leaving);

/* model_ftl.c */
double model_ftl_write(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes,
                        uint64_t *rows_bytes);
double model_ftl_pad(sde_model *m, double ready);
double model_nand_read(sde_model *m, double t, uint64_t offset, uint64_t nbytes, int with_link);

#endif
