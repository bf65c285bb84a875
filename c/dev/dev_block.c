/* Block commands: checks against the namespace and the client's buffer, zeroing, and the
 * starts of NOP, READ, WRITE, FLUSH, WRITE_ZEROES and DEALLOCATE. */
#define _GNU_SOURCE
#include "dev_internal.h"

/* Check a block command against the namespace and the client's buffer.  Returns a status;
 * on success *media_off, *buf are set (buf may be NULL when need_buf is 0). */
uint16_t dev_check_block(sde_dev *dev, struct dev_qp *q, const sde_sqe *c, int need_buf,
                            uint64_t *media_off, struct dev_buf **buf)
{
    if (c->flags)
        return SDE_SC_INVALID_FIELD;
    if (!dev_ns_visible(dev, q, c->nsid))
        return SDE_SC_INVALID_NAMESPACE;
    if (!c->length || c->length % dev->lba || (need_buf && c->length > SDE_MAX_IO_BYTES))
        return SDE_SC_INVALID_FIELD;
    const sde_ns_info *ns = &dev->ns[c->nsid];
    uint64_t nblocks = ns->bytes / dev->lba; /* 0 for a namespace of keys only */
    if (c->lba >= nblocks || c->length / dev->lba > nblocks - c->lba)
        return SDE_SC_LBA_OUT_OF_RANGE;
    *media_off = ns->offset + c->lba * dev->lba;
    *buf = NULL;
    if (!need_buf)
        return c->buf ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
    if (c->buf < 1 || c->buf > SDE_MAX_BUFS)
        return SDE_SC_INVALID_BUFFER;
    struct dev_buf *b = &dev->bufs[c->buf];
    /* another client's buffer is treated exactly like no buffer */
    if (!b->active || b->client != q->client)
        return SDE_SC_INVALID_BUFFER;
    if (c->buf_offset % dev->lba || c->buf_offset > b->len || c->length > b->len - c->buf_offset)
        return SDE_SC_INVALID_BUFFER;
    *buf = b;
    return SDE_SC_SUCCESS;
}

uint16_t dev_zero_range(sde_dev *dev, uint8_t op, uint64_t off, uint64_t len)
{
    int r;
    if (dev->is_block) {
        uint64_t range[2] = {off, len};
        r = ioctl(dev->media_fd, op == SDE_CMD_DEALLOCATE ? BLKDISCARD : BLKZEROOUT, range);
        if (r < 0 && op == SDE_CMD_DEALLOCATE)
            r = ioctl(dev->media_fd, BLKZEROOUT, range); /* no discard: zeroes will do */
    } else {
        int mode = op == SDE_CMD_DEALLOCATE ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                                            : FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE;
        r = fallocate(dev->media_fd, mode, (off_t)off, (off_t)len);
        if (r < 0 && mode != (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE))
            r = fallocate(dev->media_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          (off_t)off, (off_t)len);
    }
    return r < 0 ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
}

int sde_dev_zero(sde_dev *dev, uint64_t offset, uint64_t bytes)
{
    if (offset > dev->media_size || bytes > dev->media_size - offset)
        return -EINVAL;
    return dev_zero_range(dev, SDE_CMD_WRITE_ZEROES, offset, bytes) ? -EIO : 0;
}

/* ---- block commands' starts (rows of the opcode table, dev_ops.c) -------------------------- */

void dev_nop_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint64_t due, dtime;
    dev_model_times(dev, c, t0, SDE_CMD_NOP, 0, 0, &due, &dtime);
    dev_finish_at(dev, qp, cls, c->cid, SDE_SC_SUCCESS, 0, 0, t0, due, dtime);
}

/* WRITE_ZEROES and DEALLOCATE: done here, at once (fallocate or a block ioctl). */
void dev_zero_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint64_t off = 0;
    struct dev_buf *b = NULL;
    uint16_t st = dev_check_block(dev, &dev->qps[qp], c, 0, &off, &b);
    if (st == SDE_SC_SUCCESS && dev->undo &&
        sde_undo_save(dev->undo, NULL, off, c->length, SDE_UNDO_BLOCK, 1) < 0)
        dev->stats.undo_failures++;
    if (st == SDE_SC_SUCCESS)
        st = dev_zero_range(dev, c->opcode, off, c->length);
    if (st == SDE_SC_SUCCESS && c->opcode == SDE_CMD_DEALLOCATE && dev->model)
        sde_model_trim(dev->model, off, c->length); /* the FTL forgets the range */
    dev_finish(dev, qp, cls, c->cid, st, st ? 0 : c->length, c->length, t0);
}

/* READ, WRITE and FLUSH: one media I/O (a read or write into the client's registered
 * buffer, or through a bounce for a buffer registered without zero copy; an fsync). */
void dev_block_io_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    uint64_t off = 0;
    struct dev_buf *b = NULL;
    uint16_t st;
    if (c->opcode == SDE_CMD_FLUSH)
        st = c->nsid && !dev_ns_visible(dev, q, c->nsid) ? SDE_SC_INVALID_NAMESPACE
                                                         : SDE_SC_SUCCESS;
    else
        st = dev_check_block(dev, q, c, 1, &off, &b);
    if (st != SDE_SC_SUCCESS) {
        dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    struct dev_ctx *x = &dev->ctx[dev->free_ctx[--dev->nfree]];
    memset(&x->io, 0, sizeof(x->io));
    x->kind = CTX_BLOCK;
    x->op = c->opcode;
    x->used = 1;
    x->qp = qp;
    x->cid = c->cid;
    x->cls = (uint8_t)cls;
    x->t0 = t0;
    x->serial = ++dev->ctx_serial;
    x->bounce = NULL; /* a free context holds none (its spare stays) */
    x->io.user_data = (uint64_t)(x - dev->ctx);
    x->io.buf_index = -1;
    x->flush_id = 0;
    dev_model_times(dev, c, t0, c->opcode, off, c->length, &x->due, &x->dtime);
    if (c->opcode == SDE_CMD_FLUSH) {
        x->io.op = SDE_OP_FSYNC;
        if (dev->undo) /* it covers the writes completed by now */
            x->flush_id = sde_undo_flush_start(dev->undo);
    } else {
        x->client_addr = b->addr + c->buf_offset;
        x->io.op = c->opcode == SDE_CMD_READ ? SDE_OP_READ : SDE_OP_WRITE;
        x->io.len = c->length;
        x->io.offset = off;
        if (b->flags & SDE_BUF_BOUNCE) {
            /* compat path: the media I/O goes through the daemon's memory, then a copy */
            if (!dev_bounce_take(dev, x, c->length)) {
                x->used = 0;
                dev->free_ctx[dev->nfree++] = (uint32_t)(x - dev->ctx);
                dev_finish(dev, qp, cls, c->cid, SDE_SC_INTERNAL, 0, 0, t0);
                return;
            }
            if (c->opcode == SDE_CMD_WRITE) {
                memcpy(x->bounce, x->client_addr, c->length);
                dev_copied(dev, qp, cls, c->length);
            }
            x->io.addr = (uint64_t)(uintptr_t)x->bounce;
        } else {
            x->io.addr = (uint64_t)(uintptr_t)x->client_addr;
            x->io.buf_index = (int16_t)(c->buf - 1);
        }
    }
    dev_queue_media(dev, &x->io, SDE_UNDO_BLOCK); /* room is guaranteed: contexts == depth */
}

/* A block command's I/O is back (its one I/O: dev_kinds.c's row for CTX_BLOCK): a read
 * through a bounce copied out, a flush's durability recorded, the completion posted. */
void dev_block_media_done(sde_dev *dev, struct dev_ctx *x, sde_io *io)
{
    (void)io; /* x->io itself */
    uint16_t st = SDE_SC_SUCCESS;
    if (x->io.res < 0 || (x->io.op != SDE_OP_FSYNC && (uint32_t)x->io.res != x->io.len))
        st = SDE_SC_MEDIA_ERROR;
    if (x->bounce) {
        if (st == SDE_SC_SUCCESS && x->io.op == SDE_OP_READ && dev->qps[x->qp].active) {
            memcpy(x->client_addr, x->bounce, x->io.len);
            dev_copied(dev, x->qp, x->cls, x->io.len);
        }
        dev_bounce_drop(dev, x);
    }
    uint64_t bytes = x->io.op == SDE_OP_FSYNC ? 0 : x->io.len;
    if (x->flush_id && st == SDE_SC_SUCCESS)
        sde_undo_flush_done(dev->undo, x->flush_id);
    dev_finish_at(dev, x->qp, x->cls, x->cid, st, st ? 0 : bytes, bytes, x->t0, x->due,
                  x->dtime);
    x->used = 0;
    dev->free_ctx[dev->nfree++] = (uint32_t)(x - dev->ctx);
}
