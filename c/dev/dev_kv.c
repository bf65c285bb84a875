/* KV commands against the store: contexts, value I/O piece by piece, puts (early, held back
 * behind a busy key), retrieves, deletes, exist and list. */
#define _GNU_SOURCE
#include "dev_internal.h"

#include <stddef.h>

/* ---- KV commands, run here against the store (c/store) ----------------------------------------- */

_Static_assert(offsetof(sde_sqe, key_hi) == offsetof(sde_sqe, lba) + 8,
               "a KV key is lba then key_hi, 16 bytes in a row");

/* a put's value hashed with its batch's lookups up to this size: past it the hash is the
 * cost and the miss it saves nothing, and the batch's first command would wait for every
 * value's hash */
#define PREFETCH_HASH_MAX (16u << 10)

void dev_kv_prefetch(sde_dev *dev, int qp, const sde_sqe *batch, int n)
{
    dev->pf_mask = 0;
    if (!dev->store || n < 2) /* one command: no misses to overlap */
        return;
    st_key_ref keys[FETCH_BATCH];
    int m = 0;
    for (int i = 0; i < n && i < FETCH_BATCH; i++) {
        const sde_sqe *c = &batch[i];
        const struct dev_op *op = dev_op(c->opcode);
        uint32_t klen = dev_key_len(c);
        if (!op || !op->keyed || !klen)
            continue; /* its start refuses it: nothing it looks up */
        /* the key's 16 bytes: lba and key_hi, side by side in the SQE (asserted above) */
        st_key_ref *k = &keys[m++];
        *k = (st_key_ref){c->nsid, klen, (const uint8_t *)&c->lba,
                          op->fault_dir == SDE_FAULT_DIR_WRITE, NULL, 0, NULL};
        const struct dev_buf *b;
        if (c->opcode == SDE_CMD_KV_STORE && c->length && c->length <= PREFETCH_HASH_MAX &&
            (b = dev_client_range(dev, &dev->qps[qp], c))) {
            k->value = b->addr + c->buf_offset;
            k->vlen = c->length;
            k->vhash = &dev->pf_hash[i];
            dev->pf_mask |= 1ull << i;
        }
    }
    if (m < 2) { /* one lookup: nothing to overlap, and no hash made */
        dev->pf_mask = 0;
        return;
    }
    st_prefetch_keys(dev->store, keys, m);
    dev->pf_batch = (uintptr_t)batch;
    dev->pf_n = n;
}

void dev_kv_prefetch_done(sde_dev *dev)
{
    dev->pf_batch = 0;
    dev->pf_mask = 0;
}

/* The hash dev_kv_prefetch made of this command's value, if it is one of the batch being
 * started and it made one. */
static int prefetched_hash(const sde_dev *dev, const sde_sqe *c, uint64_t *hash)
{
    uintptr_t at = (uintptr_t)c;
    if (!dev->pf_mask || at < dev->pf_batch ||
        at >= dev->pf_batch + (uintptr_t)dev->pf_n * sizeof(*c))
        return 0;
    uint64_t i = (at - dev->pf_batch) / sizeof(*c);
    if (!(dev->pf_mask >> i & 1))
        return 0;
    *hash = dev->pf_hash[i];
    return 1;
}

static uint16_t put_fields(sde_dev *dev, const sde_sqe *c)
{
    if (!c->length || c->length > st_max_value(dev->store))
        return SDE_SC_KV_INVALID_VALUE_SIZE;
    return c->param0 > SDE_KV_STORE_IF_NOT_EXISTS ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
}

/* A plain put's device time once its placement is known (wrote: its bytes go to NAND at
 * off): timed as a write (or, stored already, a NOP) from its fetch. */
void dev_kv_put_timing(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, int wrote,
                       uint64_t off, uint64_t len)
{
    dev_model_times(dev, c, x->t0, wrote ? SDE_CMD_WRITE : SDE_CMD_NOP, off, len, &x->due,
                    &x->dtime);
}

/* A quantized store's: it continues from its kernel's end (x->ready), programmed, unless
 * the write cache acknowledges it first. */
void dev_qstore_put_timing(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, int wrote,
                           uint64_t off, uint64_t len)
{
    (void)c;
    double done = x->ready;
    if (wrote && dev->model) {
        uint64_t leaving;
        double programmed = sde_recipe_q_program(dev->model, x->first_out, x->ready,
                                                 x->pieces, off, len, &leaving);
        if (!dev->write_cache)
            done = programmed > done ? programmed : done;
        else /* the cache's room: a full cache waits for programs */
            done = sde_model_cache_ack(dev->model, x->ready, programmed, len, leaving);
    }
    dev_model_verdict(dev, x->msubmit, done, &x->due, &x->dtime);
}

/* Queue the I/O of the value's piece x->piece: whole blocks straight between the media and
 * x->vaddr (a registered buffer, or a staging buffer), a partial last block through a bounce
 * (a put: zero-padded, so nothing past the value reaches the media; a retrieve: copied out
 * when it completes).  Sets no_memory (nothing queued for that part) when a bounce cannot be
 * had. */
static void value_io(sde_dev *dev, struct dev_ctx *x)
{
    uint32_t blk = st_block(dev->store);
    uint64_t off, nb;
    st_ext_piece(dev->store, x->vext, x->piece, &off, &nb);
    uint64_t at = x->vpos;
    uint64_t vbytes = x->vlen - at < nb ? x->vlen - at : nb; /* value bytes in this piece */
    uint8_t *mem = x->vaddr + at;
    int op = x->vwrite ? SDE_OP_WRITE : SDE_OP_READ;
    x->vpos += nb;
    if (x->vstaged) {
        dev_kv_queue(dev, &x->io, op, mem, nb, off, -1);
        x->nio++;
        return;
    }
    int direct = x->vbuf >= 0 && (uintptr_t)mem % blk == 0;
    uint64_t full = !direct ? 0
                    : x->vwrite || x->cover < at + nb ? vbytes / blk * blk : nb;
    if (full) {
        dev_kv_queue(dev, &x->io, op, mem, full, off, x->vbuf);
        x->nio++;
    }
    if (full < nb) {
        uint64_t n = nb - full;
        if (!dev_bounce_take(dev, x, n)) {
            x->no_memory = 1;
            return;
        }
        if (x->vwrite) {
            memcpy(x->bounce, mem + full, vbytes - full);
            memset(x->bounce + (vbytes - full), 0, n - (vbytes - full));
            x->copied += vbytes - full;
        } else {
            x->copy_to = mem + full;
            x->copy_len = vbytes - full;
        }
        dev_kv_queue(dev, &x->io2, op, x->bounce, n, off + full, -1);
        x->nio++;
    }
}

/* Start moving a value: its first piece's I/O (the rest follow as each completes). */
void dev_value_start(sde_dev *dev, struct dev_ctx *x, uint32_t ext, uint8_t *mem,
                        int buf_index, int staged, int write, uint64_t cover)
{
    x->vext = ext;
    x->vaddr = mem;
    x->vbuf = (int16_t)buf_index;
    x->vstaged = (uint8_t)staged;
    x->vwrite = (uint8_t)write;
    x->cover = cover;
    x->piece = 0;
    x->npieces = st_ext_pieces(dev->store, ext);
    x->vpos = 0;
    value_io(dev, x);
}

/* Whether a held-back command before stop (NO_CTX: any) changes this key. */
static int parked_for(const sde_dev *dev, uint32_t stop, uint32_t nsid, const uint8_t *key,
                      uint32_t klen)
{
    for (uint32_t i = dev->park_head; i != NO_CTX && i != stop; i = dev->ctx[i].next_park) {
        const struct dev_ctx *y = &dev->ctx[i];
        if (y->nsid == nsid && y->klen == klen && !memcmp(y->key, key, klen))
            return 1;
    }
    return 0;
}

/* Whether a change of this key must wait: an early put of it is in flight, or a command
 * held back for it came first. */
static int key_busy(const sde_dev *dev, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    return st_key_busy(dev->store, nsid, key, klen) ||
           parked_for(dev, NO_CTX, nsid, key, klen);
}

static void park(sde_dev *dev, struct dev_ctx *x)
{
    uint32_t i = dev_ctx_index(dev, x);
    x->parked = 1;
    x->next_park = NO_CTX;
    if (dev->park_tail == NO_CTX)
        dev->park_head = i;
    else
        dev->ctx[dev->park_tail].next_park = i;
    dev->park_tail = i;
    dev->stats.key_waits++;
}

/* Store len bytes at src under the context's key: plan (dedup, an extent), write, then commit
 * in the next journal group.  buf_index >= 0: src lies in that registered buffer (whole
 * blocks go direct, a partial last block through a bounce); staged: src is the context's own
 * block-padded bounce (x->bounce), written whole.  c: the SQE of a plain put (its timing). */
void dev_kv_put_value(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, uint8_t *src,
                         uint64_t len, int mode, int buf_index, int staged)
{
    if (!x->parked && key_busy(dev, x->nsid, x->key, x->klen)) {
        /* changes of a key reach the index in the journal's order: after the early put */
        x->park_src = src;
        x->park_len = len;
        x->park_mode = mode;
        x->park_buf = buf_index;
        x->park_staged = (uint8_t)staged;
        x->park_has_sqe = c != NULL;
        if (c)
            x->sqe = *c;
        park(dev, x);
        return;
    }
    x->parked = 0;
    uint16_t st = st_put_begin_hashed(dev->store, x->nsid, x->key, x->klen, src, len, mode,
                                      x->vhash_known ? &x->vhash : NULL,
                                      x->expecting ? &x->expect : NULL, &x->plan);
    if (st) {
        dev_ctx_finish(dev, x, st, 0);
        return;
    }
    x->vlen = len;
    if (dev_kind(x)->result_existed)
        x->result = (uint64_t)x->plan.existed;
    if (!x->plan.wrote) {
        /* the bytes are stored already (under this key, or another: shared) */
        dev_kind(x)->put_timing(dev, x, c, 0, 0, 0);
        uint64_t group;
        st = st_put_commit(dev->store, &x->plan, &group);
        if (st || !group) {
            dev_ctx_finish(dev, x, st, st ? 0 : x->vlen);
            return;
        }
        dev_wait_commit(dev, x, group);
        return;
    }
    if (st_early_ok(dev->store)) {
        /* the record joins the open group now: its write goes out with the value's */
        st = st_put_record(dev->store, &x->plan);
        if (st) {
            dev_ctx_finish(dev, x, st, 0);
            return;
        }
        if (dev_kind(x)->result_existed)
            x->result = (uint64_t)x->plan.existed;
    }
    uint64_t off, nb0;
    st_ext_piece(dev->store, x->plan.ext, 0, &off, &nb0);
    dev_kind(x)->put_timing(dev, x, c, 1, off, len);
    dev_value_start(dev, x, x->plan.ext, src, buf_index, staged, 1, 0);
    if (x->no_memory && !x->nio) {
        if (x->plan.early)
            st_put_abort_early(dev->store, &x->plan);
        else
            st_put_abort(dev->store, &x->plan);
        dev_ctx_finish(dev, x, SDE_SC_INTERNAL, 0);
    }
}

void dev_kv_put_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = dev_kv_value_args(dev, qp, c, cls, t0, key, &klen, put_fields);
    if (!b)
        return;
    struct dev_ctx *x = dev_ctx_take(dev, qp, c, cls, CTX_KV_PUT, t0);
    memcpy(x->key, key, sizeof(key));
    x->klen = klen;
    x->nsid = c->nsid;
    /* a bounce buffer (GDS compat mode): the client copied the value into it, counted as
     * copied; the media I/O still goes straight from it (it is registered too) */
    if (b->flags & SDE_BUF_BOUNCE)
        x->copied += c->length;
    x->vhash_known = (uint8_t)prefetched_hash(dev, c, &x->vhash);
    dev_kv_put_value(dev, x, c, b->addr + c->buf_offset, c->length, (int)c->param0,
                 (int)c->buf - 1, 0);
}

void dev_kv_get_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = dev_kv_value_args(dev, qp, c, cls, t0, key, &klen, NULL);
    if (!b)
        return;
    uint16_t st;
    struct dev_ctx *x = dev_ctx_take(dev, qp, c, cls, CTX_KV_GET, t0);
    uint64_t off;
    st = st_get_begin(dev->store, c->nsid, key, klen, &x->ext, &off, &x->vlen, &x->vhash);
    if (st) {
        dev_ctx_put(dev, x);
        dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    if (x->vlen > c->length) { /* the result tells how large a buffer it needs */
        st_get_end(dev->store, x->ext);
        x->result = x->vlen;
        dev_ctx_finish(dev, x, SDE_SC_KV_INVALID_VALUE_SIZE, 0);
        return;
    }
    x->result = x->vlen;
    if (b->flags & SDE_BUF_BOUNCE)
        x->copied += x->vlen; /* the client copies it out of the bounce */
    dev_model_times(dev, c, t0, SDE_CMD_READ, off, x->vlen, &x->due, &x->dtime);
    uint8_t *dst = b->addr + c->buf_offset;
    x->client_addr = dst;
    /* the whole last block lands in the client's buffer when its range covers it (the
     * bytes past the value are the zeros the put wrote); else that block is bounced */
    dev_value_start(dev, x, x->ext, dst, (int)c->buf - 1, 0, 0, c->length);
    if (x->no_memory && !x->nio) {
        st_get_end(dev->store, x->ext);
        dev_ctx_finish(dev, x, SDE_SC_INTERNAL, 0);
    }
}

/* One I/O of a value-moving command is back (dev_kinds.c's rows); the last one ends the
 * piece. */
void dev_value_media_done(sde_dev *dev, struct dev_ctx *x, sde_io *io)
{
    if (io->res < 0 || (uint32_t)io->res != io->len)
        x->io_failed = 1;
    if (--x->nio == 0)
        dev_kv_io_done(dev, x);
}

/* Every I/O of a KV command's piece has ended: the next piece, or the value is done (its
 * kind's value_done). */
void dev_kv_io_done(sde_dev *dev, struct dev_ctx *x)
{
    const struct dev_kind *k = dev_kind(x);
    if (x->piece + 1 < x->npieces && !x->io_failed && !x->no_memory) {
        /* a value in pieces: the next one (a retrieve's bounced tail of this one first) */
        if (k->copies_out && x->copy_len) {
            memcpy(x->copy_to, x->bounce, x->copy_len);
            x->copied += x->copy_len;
            x->copy_len = 0;
        }
        x->piece++;
        value_io(dev, x);
        if (x->nio)
            return;
    }
    k->value_done(dev, x);
}

/* A put's value is written (KV_STORE, KV_STORE_QUANTIZED): its record committed, then its
 * completion waits for its journal group. */
void dev_put_value_done(sde_dev *dev, struct dev_ctx *x)
{
    if (x->io_failed || x->no_memory) {
        if (x->plan.early)
            st_put_abort_early(dev->store, &x->plan);
        else
            st_put_abort(dev->store, &x->plan);
        dev_ctx_finish(dev, x, x->no_memory ? SDE_SC_INTERNAL : SDE_SC_MEDIA_ERROR, 0);
        return;
    }
    dev_bounce_drop(dev, x);
    uint64_t group;
    uint16_t st = x->plan.early ? st_put_apply(dev->store, &x->plan, &group)
                                : st_put_commit(dev->store, &x->plan, &group);
    if (st) {
        dev_ctx_finish(dev, x, st, 0);
        return;
    }
    dev_wait_commit(dev, x, group);
}

/* A retrieve's value is read (KV_RETRIEVE): its bounced tail copied out, its checksum
 * checked, the completion posted. */
void dev_get_value_done(sde_dev *dev, struct dev_ctx *x)
{
    int active = dev->qps[x->qp].active;
    uint16_t st = x->no_memory ? SDE_SC_INTERNAL
                  : x->io_failed ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
    if (!st && active) {
        if (x->copy_len) {
            memcpy(x->copy_to, x->bounce, x->copy_len);
            x->copied += x->copy_len;
        }
        /* the checksum: a value that does not match what was stored is an error, never
         * data */
        if (st_value_hash(x->client_addr, x->vlen) != x->vhash)
            st = SDE_SC_MEDIA_ERROR;
    }
    st_get_end(dev->store, x->ext);
    dev_ctx_finish(dev, x, st, st ? 0 : x->vlen);
}

/* Who may delete a key that others pinned: an admin anywhere, a namespace's owner in it. */
static uint16_t delete_fields(const sde_dev *dev, const struct dev_qp *q, const sde_sqe *c)
{
    if (c->param0 > SDE_KV_DELETE_FORCE)
        return SDE_SC_INVALID_FIELD;
    if (!c->param0 || q->admin)
        return SDE_SC_SUCCESS;
    const sde_ns_info *ns = &dev->ns[c->nsid];
    return c->nsid && ns->uid == q->uid && ns->token == q->token ? SDE_SC_SUCCESS
                                                                 : SDE_SC_ACCESS_DENIED;
}

/* resumed: it was held back, and is next for its key */
static void kv_delete_run(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0,
                          int resumed)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    uint64_t group = 0;
    uint16_t st = dev_kv_common(dev, &dev->qps[qp], c, key, &klen);
    if (!st)
        st = delete_fields(dev, &dev->qps[qp], c);
    if (!st && !resumed && key_busy(dev, c->nsid, key, klen)) {
        /* after the early put of its key (run again from the command when it may) */
        struct dev_ctx *x = dev_ctx_take(dev, qp, c, cls, CTX_DEL_PARKED, t0);
        memcpy(x->key, key, sizeof(key));
        x->klen = klen;
        x->nsid = c->nsid;
        x->sqe = *c;
        park(dev, x);
        return;
    }
    if (!st && c->param0 == SDE_KV_DELETE_FORCE)
        dev_pins_drop_key(dev, c->nsid, key, klen);
    if (!st)
        st = st_delete(dev->store, c->nsid, key, klen, &group);
    if (st) {
        dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    struct dev_ctx *x = dev_ctx_take(dev, qp, c, cls, CTX_KV_DELETE, t0);
    /* an index change: the controller's command time (the extent's trim reaches the FTL
     * when the store frees it) */
    dev_model_times(dev, c, t0, SDE_CMD_NOP, 0, 0, &x->due, &x->dtime);
    dev_wait_commit(dev, x, group);
}

void dev_kv_delete_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    kv_delete_run(dev, qp, c, cls, t0, 0);
}

/* A delete held back behind an early put of its key, its turn now: run again from its
 * command. */
void dev_delete_resume(sde_dev *dev, struct dev_ctx *x)
{
    sde_sqe c = x->sqe;
    int qp = x->qp, cls = x->cls;
    uint64_t t0 = x->t0;
    dev_ctx_put(dev, x);
    kv_delete_run(dev, qp, &c, cls, t0, 1);
}

/* A put held back behind an early put of its key, its turn now. */
void dev_put_resume(sde_dev *dev, struct dev_ctx *x)
{
    dev_kv_put_value(dev, x, x->park_has_sqe ? &x->sqe : NULL, x->park_src, x->park_len,
                     x->park_mode, x->park_buf, x->park_staged);
}

/* Resume the held-back commands whose key is free, in the order they came (one held back
 * for a key keeps the later ones for it waiting). */
int dev_unpark(sde_dev *dev)
{
    int n = 0;
    uint32_t prev = NO_CTX;
    for (uint32_t i = dev->park_head; i != NO_CTX;) {
        struct dev_ctx *x = &dev->ctx[i];
        uint32_t next = x->next_park;
        if (st_key_busy(dev->store, x->nsid, x->key, x->klen) ||
            parked_for(dev, i, x->nsid, x->key, x->klen)) {
            prev = i;
            i = next;
            continue;
        }
        if (prev == NO_CTX)
            dev->park_head = next;
        else
            dev->ctx[prev].next_park = next;
        if (dev->park_tail == i)
            dev->park_tail = prev;
        x->next_park = NO_CTX;
        dev_kind(x)->resume(dev, x);
        n++;
        i = next;
    }
    return n;
}

/* KV_EXIST: answered from the index, here. */
void dev_kv_exist_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    uint16_t st = dev_kv_common(dev, &dev->qps[qp], c, key, &klen);
    if (!st)
        st = (uint16_t)sde_store_exists(dev->store, c->nsid, key, klen);
    dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
}

/* KV_LIST: the keys after a given one (key length 0: from the first key), written here into
 * the client's buffer, SDE_LIST_ENTRY bytes a key. */
void dev_kv_list_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    uint64_t result = 0, bytes = 0;
    uint16_t st = dev_kv_common(dev, q, c, key, &klen);
    if (st == SDE_SC_KV_INVALID_KEY_SIZE && c->param1 == 0 && !c->flags)
        st = SDE_SC_SUCCESS;
    struct dev_buf *b = st ? NULL : dev_client_range(dev, q, c);
    if (!st && !b)
        st = SDE_SC_INVALID_BUFFER;
    if (!st) {
        int n = sde_store_list(dev->store, c->nsid, key, klen, b->addr + c->buf_offset,
                               c->length / SDE_LIST_ENTRY);
        if (n < 0) {
            st = n == -EIO ? SDE_SC_MEDIA_ERROR : SDE_SC_INTERNAL; /* -EIO: the store failed */
        } else {
            result = (uint64_t)n;
            bytes = (uint64_t)n * SDE_LIST_ENTRY;
            dev_copied(dev, qp, cls, bytes); /* made here, copied out */
        }
    }
    dev_finish(dev, qp, cls, c->cid, st, st ? 0 : result, bytes, t0);
}
