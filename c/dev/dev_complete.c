/* Completions: counters, staging and posting, the held heap (real clock: completions wait for
 * their modelled time), and the glue to the timing model. */
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

/* The modelled submission of a command fetched at t0: the virtual clock (which never goes
 * back) or the real one since the model's origin. */
double dev_model_submit(sde_dev *dev, const sde_sqe *c, uint64_t t0)
{
    if (dev->virtual_time) {
        if (dev->resuming) /* a deferred command: as it was when fetched */
            return dev->resume_submit;
        double s = (double)c->submit_time_ns;
        if (s > dev->vclock)
            dev->vclock = s;
        return dev->vclock;
    }
    return (double)(t0 - dev->origin);
}

/* (due on the monotonic clock, CQE device time) of a command submitted at `submit` that the
 * model completes at `done`.  Real time: due = origin + done, device time = the modelled
 * latency.  Virtual time: due 0 (nothing is held), device time = the completion. */
void dev_model_verdict(sde_dev *dev, double submit, double done, uint64_t *due,
                          uint64_t *dtime)
{
    *due = 0;
    *dtime = 0;
    if (done < 0)
        return;
    if (dev->virtual_time) {
        *dtime = (uint64_t)done;
    } else {
        if (dev->model)
            *due = dev->origin + (uint64_t)done;
        *dtime = (uint64_t)(done - submit);
        if (!*dtime)
            *dtime = 1;
    }
}

/* The model's verdict for a command starting now (see dev_model_verdict); nothing without a
 * model. */
void dev_model_times(sde_dev *dev, const sde_sqe *c, uint64_t t0, uint32_t op,
                        uint64_t off, uint64_t nbytes, uint64_t *due, uint64_t *dtime)
{
    *due = 0;
    *dtime = 0;
    if (!dev->model)
        return;
    double submit = dev_model_submit(dev, c, t0);
    double done;
    switch (op) {
    case SDE_CMD_READ: done = sde_model_read(dev->model, submit, off, nbytes); break;
    case SDE_CMD_WRITE: done = sde_model_write(dev->model, submit, off, nbytes); break;
    case SDE_CMD_FLUSH: done = sde_model_flush(dev->model, submit); break;
    default: done = sde_model_nop(dev->model, submit); break;
    }
    dev_model_verdict(dev, submit, done, due, dtime); /* done < 0 cannot happen: in time order */
}

/* Kernels and DMA share the controller's DRAM (sde_model_params.dram_bytes_per_s, which the
 * daemon leaves 0 on the virtual clock: ssdemu/device/daemon.py). */
void dev_share_dram(sde_dev *dev) { sde_budget_share_dram(&dev->budget, dev->model); }

int sde_dev_set_model(sde_dev *dev, const sde_model_params *p, int virtual_time)
{
    sde_model *m = NULL;
    if (p) {
        int r = sde_model_new(p, &m);
        if (r < 0)
            return r;
    }
    pthread_mutex_lock(&dev->lock);
    sde_model_free(dev->model);
    dev->model = m;
    dev->write_cache = p ? p->write_cache : 0;
    dev->virtual_time = virtual_time;
    dev_share_dram(dev);
    dev->origin = now_ns();
    dev->vclock = 0;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

void sde_dev_model_stats(sde_dev *dev, sde_model_stats *out)
{
    pthread_mutex_lock(&dev->lock);
    if (dev->model)
        sde_model_get_stats(dev->model, out);
    else
        memset(out, 0, sizeof(*out));
    pthread_mutex_unlock(&dev->lock);
}

/* COUNTERS (the data plane's lock held): the model's and the budget's books now, at the
 * command's turn.  Untimed: a read of the books must not book anything (a client sampling
 * them would otherwise change what it measures). */
void dev_counters_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    struct dev_buf *b = dev_client_range(dev, q, c);
    uint16_t st = c->flags ? SDE_SC_INVALID_FIELD
                  : c->nsid ? SDE_SC_INVALID_NAMESPACE
                  : !q->admin ? SDE_SC_ACCESS_DENIED
                  : !b ? SDE_SC_INVALID_BUFFER
                  : c->length < sizeof(sde_counters) ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
    if (st) {
        dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    sde_model_stats ms;
    if (dev->model)
        sde_model_get_stats(dev->model, &ms);
    else
        memset(&ms, 0, sizeof(ms));
    sde_counters out = {
        .horizon_ns = ms.horizon_ns, .busy_until_ns = ms.busy_until_ns,
        .link_busy_ns = ms.link_busy_ns, .link_in_busy_ns = ms.link_in_busy_ns,
        .channel_busy_ns = ms.channel_busy_ns, .die_busy_ns = ms.die_busy_ns,
        .link_bytes = ms.link_bytes, .nand_bytes_read = ms.nand_bytes_read,
        .nand_bytes_written = ms.nand_bytes_written};
    const sde_budget *bu = &dev->budget;
    for (int k = 0; k < SDE_NKERNELS; k++) {
        out.compute_busy_ns += bu->kernels[k].device_ns;
        out.kernel_calls += bu->kernels[k].calls;
    }
    uint32_t units = bu->units ? bu->units : 1;
    for (uint32_t u = 0; u < units && u < SDE_MAX_UNITS; u++)
        if (bu->busy_until_ns[u] > out.busy_until_ns)
            out.busy_until_ns = bu->busy_until_ns[u];
    memcpy(b->addr + c->buf_offset, &out, sizeof(out));
    dev_copied(dev, qp, cls, sizeof(out)); /* made here, copied out */
    dev_finish(dev, qp, cls, c->cid, SDE_SC_SUCCESS, sizeof(out), sizeof(out), t0);
}
