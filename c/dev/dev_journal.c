/* The journal's group writes from the data plane: up to ST_JOURNAL_SLOTS in flight, commands
 * completing when their group is committed. */
#define _GNU_SOURCE
#include "dev_internal.h"

void dev_wait_commit(sde_dev *dev, struct dev_ctx *x, uint64_t group)
{
    x->group = group;
    x->next_wait = NO_CTX;
    uint32_t i = dev_ctx_index(dev, x);
    if (dev->wait_tail == NO_CTX)
        dev->wait_head = i;
    else
        dev->ctx[dev->wait_tail].next_wait = i;
    dev->wait_tail = i;
}

/* Complete the commands whose journal group is committed (or all, failed, when the
 * journal cannot be written). */
int dev_complete_committed(sde_dev *dev, int failed)
{
    if (!dev->store)
        return 0;
    uint64_t done = st_committed_group(dev->store);
    int n = 0;
    while (dev->wait_head != NO_CTX && (failed || dev->ctx[dev->wait_head].group <= done)) {
        struct dev_ctx *x = &dev->ctx[dev->wait_head];
        dev->wait_head = x->next_wait;
        if (dev->wait_head == NO_CTX)
            dev->wait_tail = NO_CTX;
        dev_ctx_finish(dev, x, failed ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS,
                       dev_kind(x)->stores_value ? x->vlen : 0);
        n++;
    }
    return n;
}

/* Hand the open journal group to the engine (group commit: one write per dev_pass). */
int dev_journal_kick(sde_dev *dev)
{
    if (!dev->store)
        return 0;
    void *buf;
    uint64_t off, group;
    uint32_t len;
    int r = st_journal_take(dev->store, &buf, &off, &len, &group);
    if (r == 1) {
        int k = 0;
        while (dev->jbusy[k]) /* the store hands out no more groups than there are slots */
            k++;
        sde_io *io = &dev->jio[k];
        memset(io, 0, sizeof(*io));
        io->op = SDE_OP_WRITE;
        io->addr = (uint64_t)(uintptr_t)buf;
        io->len = len;
        io->offset = off;
        io->user_data = UD_JOURNAL - (uint64_t)k;
        io->buf_index = -1;
        dev->jgroup[k] = group;
        dev->jbusy[k] = 1;
        dev_queue_media(dev, io, SDE_UNDO_STORE);
        return 1; /* the next pass may send the next group beside it */
    }
    if (r == 2)
        return dev_complete_committed(dev, 0) + 1; /* a checkpoint committed it */
    if (r < 0)
        return dev_complete_committed(dev, 1);
    return 0;
}

void dev_journal_io_done(sde_dev *dev, sde_io *io)
{
    int k = (int)(UD_JOURNAL - io->user_data);
    int ok = io->res >= 0 && (io->op == SDE_OP_FSYNC || (uint32_t)io->res == io->len);
    if (ok && io->op == SDE_OP_WRITE && st_durable(dev->store)) {
        /* write cache off: durable before it completes (then its sync ends here) */
        memset(io, 0, sizeof(*io));
        io->op = SDE_OP_FSYNC;
        io->user_data = UD_JOURNAL - (uint64_t)k;
        io->buf_index = -1;
        sde_queue_io(dev->eng, io);
        return;
    }
    dev->jbusy[k] = 0;
    st_journal_written(dev->store, dev->jgroup[k], ok);
    dev_complete_committed(dev, !ok);
}

/* The value writes held back while the pass started commands, after the pass's journal
 * group (see dev_pass). */
void dev_release_writes(sde_dev *dev)
{
    dev->hold_writes = 0;
    for (uint32_t i = 0; i < dev->nvwrites; i++)
        dev_queue_media(dev, dev->vwrites[i], SDE_UNDO_STORE);
    dev->nvwrites = 0;
}
