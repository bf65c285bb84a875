/* The engine's closed-loop benchmark (c/tools/sde_engine_bench.h): qd I/Os kept in flight on
 * the engine's ring, each sent again as it completes, until the duration passes. */
#define _GNU_SOURCE
#include "sde_engine_bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine_private.h"
#include "sde_hist.h"
#include "sde_rand.h"
#include "sde_time.h"

/* sde_bench's checks of its job against the engine; 0 when it can run. */
static int bench_check(const sde_engine *eng, const sde_bench_cfg *cfg)
{
    if (cfg->qd == 0 || cfg->qd > eng->qd || cfg->bs == 0 || sde_misaligned(cfg->bs, eng->lba) ||
        sde_misaligned(cfg->region_offset, eng->lba) || sde_misaligned(cfg->buf_addr, eng->lba) ||
        cfg->region_len < cfg->bs || cfg->region_offset + cfg->region_len > eng->size)
        return -EINVAL;
    if (eng->inflight)
        return -EBUSY;
    if (cfg->buf_index >= 0 && (uint32_t)cfg->buf_index >= eng->nbufs)
        return -EFAULT;
    if (cfg->buf_index >= 0) {
        const struct iovec *b = &eng->bufs[cfg->buf_index];
        uint64_t base = (uint64_t)(uintptr_t)b->iov_base;
        if (cfg->buf_addr < base ||
            cfg->buf_addr + (uint64_t)cfg->qd * cfg->bs > base + b->iov_len)
            return -EFAULT;
    }
    return 0;
}

/* A job's state: what it runs on, where the next I/O goes, when each slot's I/O left. */
struct bench {
    sde_engine *eng;
    const sde_bench_cfg *cfg;
    sde_bench_result *res;
    uint64_t *hist, *t0;
    int fd, fixed;
    uint64_t nblocks, seq, rng;
};

/* The next I/O of slot `slot`, sent at tnow (inline: this is the job's inner loop). */
static inline void bench_prep(struct bench *B, uint32_t slot, uint64_t tnow)
{
    const sde_bench_cfg *cfg = B->cfg;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&B->eng->ring);
    uint64_t blk = cfg->random ? xorshift64s(&B->rng) % B->nblocks : (B->seq++ % B->nblocks);
    uint64_t off = cfg->region_offset + blk * cfg->bs;
    void *buf = (void *)(uintptr_t)(cfg->buf_addr + (uint64_t)slot * cfg->bs);
    if (cfg->write) {
        if (B->fixed)
            io_uring_prep_write_fixed(sqe, B->fd, buf, cfg->bs, off, cfg->buf_index);
        else
            io_uring_prep_write(sqe, B->fd, buf, cfg->bs, off);
    } else {
        if (B->fixed)
            io_uring_prep_read_fixed(sqe, B->fd, buf, cfg->bs, off, cfg->buf_index);
        else
            io_uring_prep_read(sqe, B->fd, buf, cfg->bs, off);
    }
    if (B->eng->fixed_file)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, slot);
    B->t0[slot] = tnow;
}

/* k completions reaped at tnow: counted, and their slots sent again (in batches of
 * submit_batch) unless the job is stopping.  Returns 0 or the submit's -errno. */
static inline int bench_reaped(struct bench *B, struct io_uring_cqe **cqes, unsigned k,
                               uint64_t tnow, int stopping, uint32_t *inflight)
{
    const sde_bench_cfg *cfg = B->cfg;
    sde_bench_result *res = B->res;
    int rc = 0, ret;
    unsigned requeue = 0;
    for (unsigned i = 0; i < k; i++) {
        uint32_t slot = (uint32_t)io_uring_cqe_get_data64(cqes[i]);
        int r = cqes[i]->res;
        if (r < 0 || (uint32_t)r != cfg->bs) {
            res->errors++;
            if (!res->first_error)
                res->first_error = r < 0 ? r : -EIO;
        } else {
            res->ios++;
            res->bytes += (uint64_t)r;
        }
        B->hist[sde_hist_bucket(tnow - B->t0[slot])]++;
        if (stopping || res->first_error) {
            (*inflight)--;
            continue;
        }
        bench_prep(B, slot, tnow);
        if (++requeue == cfg->submit_batch) {
            if ((ret = io_uring_submit(&B->eng->ring)) < 0) {
                rc = ret;
                *inflight -= requeue;
            }
            requeue = 0;
        }
    }
    io_uring_cq_advance(&B->eng->ring, k);
    if (requeue && (ret = io_uring_submit(&B->eng->ring)) < 0) {
        rc = ret;
        *inflight -= requeue;
    }
    return rc;
}

int sde_bench(sde_engine *eng, const sde_bench_cfg *cfg, sde_bench_result *res, uint64_t *hist)
{
    memset(res, 0, sizeof(*res));
    int rc = bench_check(eng, cfg);
    if (rc)
        return rc;
    struct bench B = {.eng = eng, .cfg = cfg, .res = res, .hist = hist,
                      .fd = eng->fixed_file ? 0 : eng->fd,
                      .fixed = cfg->buf_index >= 0 && eng->buf_reg[cfg->buf_index],
                      .nblocks = cfg->region_len / cfg->bs,
                      .rng = cfg->seed ? cfg->seed : 0x9E3779B97F4A7C15ull,
                      .t0 = calloc(cfg->qd, sizeof(uint64_t))};
    if (!B.t0)
        return -ENOMEM;
    uint64_t start = now_ns(), tnow = start, deadline = start + cfg->duration_ns;
    for (uint32_t i = 0; i < cfg->qd; i++)
        bench_prep(&B, i, start);
    int ret = io_uring_submit(&eng->ring);
    uint32_t inflight = ret < 0 ? 0 : cfg->qd;
    rc = ret < 0 ? ret : 0;
    int stopping = 0;
    while (inflight) {
        struct io_uring_cqe *cqes[256];
        unsigned k = io_uring_peek_batch_cqe(&eng->ring, cqes, 256);
        if (k == 0) {
            if ((ret = sde_engine_wait(eng)) < 0) {
                rc = ret;
                break;
            }
            continue;
        }
        tnow = now_ns();
        if (tnow >= deadline)
            stopping = 1;
        if ((ret = bench_reaped(&B, cqes, k, tnow, stopping, &inflight)) < 0)
            rc = ret;
    }
    res->elapsed_ns = tnow - start;
    eng->stats.submitted += res->ios + res->errors;
    eng->stats.completed += res->ios + res->errors;
    eng->stats.errors += res->errors;
    if (cfg->write)
        eng->stats.bytes_written += res->bytes;
    else
        eng->stats.bytes_read += res->bytes;
    free(B.t0);
    return rc;
}
