/* COUNTERS: the model's and the budget's books, written into the client's buffer at the
 * command's turn (an admin's command). */
#define _GNU_SOURCE
#include "dev_internal.h"

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
