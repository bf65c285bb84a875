/* Completions: counters, staging and posting, the held heap (real clock: completions wait for
 * their modelled time).  The model's glue is dev_timing.c. */
#define _GNU_SOURCE
#include "dev_internal.h"
#include "sde_heap.h"

static void count(sde_class_stats *c, uint16_t status, uint64_t bytes, uint64_t lat)
{
    c->commands++;
    if (status != SDE_SC_SUCCESS)
        c->errors++;
    else
        c->bytes += bytes;
    c->lat_ns_total += lat;
    int b = lat ? 63 - __builtin_clzll(lat) : 0;
    c->lat_hist[b]++;
}

/* The device's counters and the command's owner's. */
static void account(sde_dev *dev, int qp, int cls, uint16_t status, uint64_t bytes,
                    uint64_t lat)
{
    count(&dev->stats.cls[cls], status, bytes, lat);
    count(&dev->owners[dev->qps[qp].owner].cls[cls], status, bytes, lat);
}

void dev_copied(sde_dev *dev, int qp, int cls, uint64_t bytes)
{
    dev->stats.cls[cls].bytes_copied += bytes;
    dev->owners[dev->qps[qp].owner].cls[cls].bytes_copied += bytes;
}

/* Post what a queue pair has staged; one kick if its client sleeps. */
void dev_flush_stage(struct dev_qp *q)
{
    if (!q->nstage)
        return;
    if (sde_cq_post(&q->v, q->stage, q->nstage)) {
        kick(q->cfd);
        (*q->client_kicks)++;
    }
    qp_done(q, q->nstage);
    q->nstage = 0;
}

static void stage(struct dev_qp *q, const sde_cqe *c)
{
    q->stage[q->nstage++] = *c;
    if (q->nstage == STAGE)
        dev_flush_stage(q);
}

static void drop(struct dev_qp *q)
{
    qp_done(q, 1);
    if (!q->inflight)
        q->in_use = 0;
}

#define HELD_DUE(x) ((x).due)
SDE_HEAP(held, struct held, HELD_DUE)

/* Hold a completion until its due time (real clock). */
static void heap_push(sde_dev *dev, const struct held *h)
{
    if (dev->nheld == dev->cap_held) {
        uint32_t cap = dev->cap_held ? 2 * dev->cap_held : 256;
        struct held *n = realloc(dev->held, cap * sizeof(*n));
        if (!n) { /* no memory to hold it: post it now rather than lose it */
            if (dev->qps[h->qp].active)
                stage(&dev->qps[h->qp], &h->cqe);
            else
                drop(&dev->qps[h->qp]);
            return;
        }
        dev->held = n;
        dev->cap_held = cap;
    }
    held_push(dev->held, &dev->nheld, *h);
}

/* Stage every held completion whose modelled time has come. */
int dev_release_due(sde_dev *dev, uint64_t now)
{
    int n = 0;
    while (dev->nheld && dev->held[0].due <= now) {
        struct held h = held_pop(dev->held, &dev->nheld);
        struct dev_qp *q = &dev->qps[h.qp];
        if (q->active)
            stage(q, &h.cqe);
        else
            drop(q);
        n++;
    }
    return n;
}

/* Complete one command of queue pair qp: stage its completion (posted at the end of the
 * dev_pass), hold it until `due` (real-time model), or drop it if the queue no longer serves.
 * dtime: the CQE's device time, 0 for the measured latency. */
void dev_finish_at(sde_dev *dev, int qp, int cls, uint16_t cid, uint16_t status,
                      uint64_t result, uint64_t bytes, uint64_t t0, uint64_t due,
                      uint64_t dtime)
{
    struct dev_qp *q = &dev->qps[qp];
    uint64_t now = now_ns();
    uint64_t lat = now - t0;
    if (dev->ndelays) { /* a latency fault: the completion comes that much later */
        for (uint32_t i = 0; i < dev->ndelays; i++) {
            struct delay *d = &dev->delays[i];
            if (d->qp != qp || d->cid != cid)
                continue;
            if (dev->virtual_time && dtime) {
                dtime += d->ns;
            } else {
                due = (due > now ? due : now) + d->ns;
                if (dtime)
                    dtime += d->ns;
            }
            *d = dev->delays[--dev->ndelays];
            break;
        }
    }
    account(dev, qp, cls, status, bytes, lat);
    if (!q->active) {
        drop(q);
        return;
    }
    sde_cqe c = {.cid = cid, .status = status, .result = result,
                 .device_time_ns = dtime ? dtime : lat};
    if (due > now) {
        dev->stats.held++;
        heap_push(dev, &(struct held){due, qp, c});
        return;
    }
    if (due && now > due)
        dev->stats.host_lag++; /* the media took longer than the modelled device */
    stage(q, &c);
}

void dev_finish(sde_dev *dev, int qp, int cls, uint16_t cid, uint16_t status,
                   uint64_t result, uint64_t bytes, uint64_t t0)
{
    dev_finish_at(dev, qp, cls, cid, status, result, bytes, t0, 0, 0);
}
