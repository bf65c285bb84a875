/* The data plane's glue to the timing model (c/model): a command's modelled submission, its
 * verdict (when its completion is due, its device time), the model attached and read. */
#define _GNU_SOURCE
#include "dev_internal.h"

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
