/* Media I/O handed to the engine: under power-cut emulation a write first saves what it will
 * overwrite; a value's writes are held while a pass starts commands, until the pass's journal
 * group is queued ahead of them. */
#define _GNU_SOURCE
#include "dev_internal.h"

/* Hand an I/O to the engine; under power-cut emulation a write first saves what it will
 * overwrite (kind: SDE_UNDO_BLOCK for a namespace's blocks, SDE_UNDO_STORE for the store's). */
void dev_queue_media(sde_dev *dev, sde_io *io, int kind)
{
    if (dev->undo && io->op == SDE_OP_WRITE &&
        sde_undo_save(dev->undo, io, io->offset, io->len, kind, 0) < 0)
        dev->stats.undo_failures++;
    sde_queue_io(dev->eng, io);
}

/* Queue a value I/O of a KV command: from/into the client's registered buffer when it
 * is, and aligned as O_DIRECT wants; else the bytes go through a bounce. */
void dev_kv_queue(sde_dev *dev, sde_io *io, int op, void *addr, uint64_t len, uint64_t off,
                     int buf_index)
{
    io->op = (uint8_t)op;
    io->addr = (uint64_t)(uintptr_t)addr;
    io->len = (uint32_t)len;
    io->offset = off;
    io->buf_index = (int16_t)buf_index;
    if (dev->hold_writes && op == SDE_OP_WRITE) {
        dev->vwrites[dev->nvwrites++] = io;
        return;
    }
    dev_queue_media(dev, io, SDE_UNDO_STORE);
}
