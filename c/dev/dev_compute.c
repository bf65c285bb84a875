/* Compute commands: their kernels on the firmware's threads, charged to the TOPS budget, and
 * the virtual clock's FIFO that books them in fetch order. */
#define _GNU_SOURCE
#include "dev_internal.h"

/* ---- compute commands: the firmware's kernels on its threads (c/fw/sde_fw.h) -------------- */

/* The completion status of a firmware entry point's failure. */
static uint16_t fw_status(int64_t ret)
{
    switch (ret) {
    case SDE_FW_E_OUT_SMALL:
    case SDE_FW_E_VALUE_SIZE:
        return SDE_SC_KV_INVALID_VALUE_SIZE;
    case SDE_FW_E_NONFINITE: /* inf or NaN in the block */
    case SDE_FW_E_REQUEST:
    case SDE_FW_E_SCHEME:
    case SDE_FW_E_NOT_LOWER:
        return SDE_SC_INVALID_FIELD;
    default:
        /* -1..-9: the stored value is not a compressed block, or a corrupt one */
        return ret < 0 && ret >= -9 ? SDE_SC_INVALID_FIELD : SDE_SC_INTERNAL;
    }
}

/* A kernel whose input is ready at `ready` (the command's clock): its end on the budget. */
static double charge(sde_dev *dev, int kernel, sde_kernel_cost cost, double ready,
                     uint64_t host_ns)
{
    return sde_budget_charge(&dev->budget, kernel, cost, ready, (double)host_ns, NULL);
}

/* Hand a job to the firmware's threads: every field is set before it is queued (a thread may
 * run it at once). */
static void fw_submit(sde_dev *dev, struct dev_ctx *x, int kind, const uint8_t *in,
                      int64_t in_len, uint8_t *out, int64_t out_cap, const uint8_t *req,
                      int64_t block_tokens)
{
    sde_fw_job *j = &x->job;
    memset(j, 0, sizeof(*j));
    j->kind = kind;
    j->block_tokens = block_tokens;
    j->in = in;
    j->in_len = in_len;
    j->out = out;
    j->out_cap = out_cap;
    j->req = req;
    j->owner = dev_ctx_index(dev, x);
    sde_fw_submit(dev->fw, j);
}

/* Virtual time: x takes its turn after every command in the FIFO. */
void dev_fifo_append(sde_dev *dev, struct dev_ctx *x)
{
    uint32_t i = dev_ctx_index(dev, x);
    x->next_fw = NO_CTX;
    if (dev->fw_tail == NO_CTX)
        dev->fw_head = i;
    else
        dev->ctx[dev->fw_tail].next_fw = i;
    dev->fw_tail = i;
}

/* A compute command's context, or NULL (its completion posted) when there is no firmware. */
static struct dev_ctx *compute_ctx(sde_dev *dev, int qp, const sde_sqe *c, int cls, int kind,
                                   uint64_t t0)
{
    if (!dev->fw || !dev->store) {
        dev_finish(dev, qp, cls, c->cid, SDE_SC_INTERNAL, 0, 0, t0);
        return NULL;
    }
    struct dev_ctx *x = dev_ctx_take(dev, qp, c, cls, kind, t0);
    x->msubmit = dev_model_submit(dev, c, t0);
    x->ready = x->msubmit;
    if (dev->virtual_time)
        /* its stages are booked in fetch order (its input's too, at its turn: see
         * fw_job_done), as the model would book commands one after another; in host order
         * (whichever firmware thread finishes first) the modelled times would depend on
         * this host's scheduling */
        dev_fifo_append(dev, x);
    return x;
}

/* A compute command ends before or without its kernel: at once, or (virtual time) when the
 * commands fetched before it have gone on. */
static void compute_fail(sde_dev *dev, struct dev_ctx *x, uint16_t status)
{
    if (!dev->virtual_time) {
        dev_ctx_finish(dev, x, status, 0);
        return;
    }
    x->fw_state = FW_FAILED;
    x->fw_status = status;
}

/* The modelled arrival of a compute command's input, from its submission: a quantized store's
 * block over the link, a dequantized retrieve's value from NAND.  The kernel starts on the
 * first piece (the stages stream). */
static void book_input(sde_dev *dev, struct dev_ctx *x)
{
    const struct dev_kind *k = dev_kind(x);
    if (k->book_input)
        k->book_input(dev, x);
}

void dev_qstore_book_input(sde_dev *dev, struct dev_ctx *x)
{
    x->ready = sde_recipe_q_receive(dev->model, x->msubmit, x->in_len, &x->sensed, &x->pieces);
}

void dev_dq_book_input(sde_dev *dev, struct dev_ctx *x)
{
    x->ready = sde_recipe_dq_sense(dev->model, x->msubmit, x->in_off, x->in_len, &x->sensed,
                                   &x->pieces);
}

/* KV_STORE_QUANTIZED: the request (an sde_quant_req) leads the block in the command's range,
 * or (param0 != 0) lies in a buffer of the client's own: handle << 40 | offset, so that a block
 * in a registered buffer needs no room before it.  The block crosses the link as it is, is
 * quantized into a staging buffer of the drive's, and that is stored as a put stores. */
void dev_qstore_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = dev_kv_value_args(dev, qp, c, cls, t0, key, &klen, NULL);
    if (!b)
        return;
    const uint8_t *req, *src;
    uint64_t src_len;
    uint8_t *base = b->addr + c->buf_offset;
    if (!c->param0) {
        if (c->length < sizeof(sde_quant_req)) {
            dev_finish(dev, qp, cls, c->cid, SDE_SC_INVALID_FIELD, 0, 0, t0);
            return;
        }
        req = base;
        src = base + sizeof(sde_quant_req);
        src_len = c->length - sizeof(sde_quant_req);
    } else {
        sde_sqe r = {.buf = (uint32_t)(c->param0 >> 40),
                     .buf_offset = c->param0 & ((1ull << 40) - 1),
                     .length = sizeof(sde_quant_req)};
        struct dev_buf *rb = dev_client_range(dev, &dev->qps[qp], &r);
        if (!rb) {
            dev_finish(dev, qp, cls, c->cid, SDE_SC_INVALID_BUFFER, 0, 0, t0);
            return;
        }
        req = rb->addr + r.buf_offset;
        src = base;
        src_len = c->length;
    }
    struct dev_ctx *x = compute_ctx(dev, qp, c, cls, CTX_QSTORE, t0);
    if (!x)
        return;
    memcpy(x->key, key, sizeof(key));
    x->klen = klen;
    x->nsid = c->nsid;
    memcpy(x->req, req, sizeof(x->req));
    /* check the request and learn the compressed size (no kernel runs) */
    int64_t info[8] = {0};
    int64_t r = sde_fw_ensure(&dev->fw_entry) < 0
                    ? SDE_FW_E_UNAVAILABLE /* the first one loads them: once, ~0.5 s */
                    : dev->fw_entry.quantize(x->req, src, (int64_t)src_len, NULL, 0, info);
    uint16_t st = r != SDE_FW_E_OUT_SMALL ? fw_status(r < 0 ? r : SDE_FW_E_REQUEST)
                  : (uint64_t)info[SDE_FW_INFO_RAW] != src_len ? SDE_SC_KV_INVALID_VALUE_SIZE
                  : (uint64_t)info[SDE_FW_INFO_COMPRESSED] > st_max_value(dev->store)
                      ? SDE_SC_KV_INVALID_VALUE_SIZE : SDE_SC_SUCCESS;
    uint64_t size = (uint64_t)info[SDE_FW_INFO_COMPRESSED];
    uint32_t blk = st_block(dev->store);
    uint64_t nbytes = (size + blk - 1) / blk * blk;
    if (!st && !dev_bounce_take(dev, x, nbytes))
        st = SDE_SC_INTERNAL;
    if (st) {
        compute_fail(dev, x, st);
        return;
    }
    memset(x->bounce + size, 0, nbytes - size); /* nothing past the value reaches the media */
    x->in_len = src_len;
    if (dev->model && !dev->virtual_time) /* virtual time: at its turn (fw_job_done) */
        book_input(dev, x);
    fw_submit(dev, x, SDE_FW_QUANTIZE, src, (int64_t)src_len, x->bounce, (int64_t)size,
              x->req, 0);
}

/* A compute command's stored value (nsid, key) opened and a staging buffer of the drive's
 * taken for it, `copies` times its whole blocks: 0, or -1 with the command failed. */
static int stored_value_begin(sde_dev *dev, struct dev_ctx *x, uint32_t copies)
{
    uint16_t st = st_get_begin(dev->store, x->nsid, x->key, x->klen, &x->ext, &x->in_off,
                               &x->vlen, &x->vhash);
    if (st) {
        compute_fail(dev, x, st);
        return -1;
    }
    uint32_t blk = st_block(dev->store);
    if (!dev_bounce_take(dev, x, copies * ((x->vlen + blk - 1) / blk * blk))) {
        st_get_end(dev->store, x->ext);
        compute_fail(dev, x, SDE_SC_INTERNAL);
        return -1;
    }
    x->in_len = x->vlen;
    return 0;
}

/* ... then read into the staging buffer (its input booked on the model at once, or on the
 * virtual clock at its turn: fw_job_done). */
static void stored_value_read(sde_dev *dev, struct dev_ctx *x)
{
    uint32_t blk = st_block(dev->store);
    if (dev->model && !dev->virtual_time)
        book_input(dev, x);
    dev_value_start(dev, x, x->ext, x->bounce, -1, 1, 0, (x->vlen + blk - 1) / blk * blk);
}

/* KV_RETRIEVE_DEQUANTIZED: the compressed block is read into a staging buffer, checked, and
 * dequantized straight into the client's buffer (no copy). */
void dev_dq_get_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = dev_kv_value_args(dev, qp, c, cls, t0, key, &klen, NULL);
    if (!b)
        return;
    struct dev_ctx *x = compute_ctx(dev, qp, c, cls, CTX_DQ_GET, t0);
    if (!x)
        return;
    memcpy(x->key, key, sizeof(key));
    x->klen = klen;
    x->nsid = c->nsid;
    if (stored_value_begin(dev, x, 1))
        return;
    x->copy_to = b->addr + c->buf_offset;
    x->copy_len = c->length;
    stored_value_read(dev, x);
}

void dev_dq_read_done(sde_dev *dev, struct dev_ctx *x)
{
    uint16_t st = x->io_failed ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
    /* the checksum: a value that does not match what was stored is an error, never data */
    if (!st && st_value_hash(x->bounce, x->vlen) != x->vhash)
        st = SDE_SC_MEDIA_ERROR;
    st_get_end(dev->store, x->ext);
    if (st) {
        compute_fail(dev, x, st);
        return;
    }
    fw_submit(dev, x, SDE_FW_DEQUANTIZE, x->bounce, (int64_t)x->vlen, x->copy_to,
              (int64_t)x->copy_len, NULL, 0);
}

/* KV_REQUANTIZE's own field: the new scheme's name is 1..32 bytes of the command's range. */
static uint16_t requant_fields(sde_dev *dev, const sde_sqe *c)
{
    (void)dev;
    return c->length >= 1 && c->length <= 32 ? SDE_SC_SUCCESS : SDE_SC_INVALID_FIELD;
}

/* The bytes of a value padded to whole blocks of the store. */
static uint64_t whole_blocks(const sde_dev *dev, uint64_t n)
{
    uint32_t blk = st_block(dev->store);
    return (n + blk - 1) / blk * blk;
}

/* KV_REQUANTIZE: the stored block is read into a staging buffer of the drive's (as a
 * dequantized retrieve reads it), requantized by the firmware into the same buffer's second
 * half, and stored under the key as a put stores, if the key still holds what was read. */
void dev_requant_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = dev_kv_value_args(dev, qp, c, cls, t0, key, &klen, requant_fields);
    if (!b)
        return;
    struct dev_ctx *x = compute_ctx(dev, qp, c, cls, CTX_RQ_READ, t0);
    if (!x)
        return;
    memcpy(x->key, key, sizeof(key));
    x->klen = klen;
    x->nsid = c->nsid;
    memset(x->req, 0, sizeof(x->req)); /* the name, copied: the client cannot change it */
    memcpy(x->req, b->addr + c->buf_offset, c->length);
    /* the stored block, then room for the new one: smaller, since a requantize only lowers */
    if (stored_value_begin(dev, x, 2))
        return;
    x->expect.ext = x->ext;
    x->expect.hash = x->vhash;
    x->expecting = 1;
    stored_value_read(dev, x);
}

void dev_requant_read_done(sde_dev *dev, struct dev_ctx *x)
{
    uint16_t st = x->io_failed ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
    if (!st && st_value_hash(x->bounce, x->vlen) != x->vhash)
        st = SDE_SC_MEDIA_ERROR; /* never requantize what is not what was stored */
    st_get_end(dev->store, x->ext);
    if (st) {
        compute_fail(dev, x, st);
        return;
    }
    uint64_t nbytes = whole_blocks(dev, x->vlen);
    fw_submit(dev, x, SDE_FW_REQUANTIZE, x->bounce, (int64_t)x->vlen, x->bounce + nbytes,
              (int64_t)nbytes, x->req, 0);
}

/* KV_REQUANTIZE's kernel is back: charge the dequantize and the quantize as one kernel that
 * streams over the sensed pieces, then store its output as a quantized store does. */
void dev_requant_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j)
{
    const int64_t *info = j->info;
    uint64_t size = (uint64_t)j->ret;
    sde_kernel_cost cost = sde_cost_requantize(
        (uint64_t)info[SDE_FW_INFO_ELEMENTS], (uint32_t)info[SDE_FW_INFO_ELEMENT_BYTES],
        (int)info[SDE_FW_INFO_FROM_KIND], (uint32_t)info[SDE_FW_INFO_FROM_GROUP], x->vlen,
        (int)info[SDE_FW_INFO_KIND], (uint32_t)info[SDE_FW_INFO_GROUP], size,
        (uint64_t)info[SDE_FW_INFO_SUMMARY_BYTES]);
    if (dev->model) /* the kernel starts on the first piece sensed: the stages stream */
        x->ready = sde_recipe_streamed_kernel(&dev->budget, SDE_KERNEL_REQUANTIZE, x->ready,
                                              x->sensed, x->pieces, cost, (double)j->host_ns,
                                              &x->first_out);
    else
        x->ready = x->first_out =
            charge(dev, SDE_KERNEL_REQUANTIZE, cost, x->ready, j->host_ns);
    memset(j->out + size, 0, whole_blocks(dev, size) - size); /* nothing past it to media */
    x->result = size;
    x->kind = CTX_RQ_PUT;
    dev_kv_put_value(dev, x, NULL, j->out, size, SDE_KV_STORE_ANY, -1, 1);
}

/* The prefix block sizes the drive hashes (hostlib/prefix_hash.py BLOCK_SIZES). */
static int prefix_block_size_ok(uint64_t t) { return t == 16 || t == 256 || t == 512; }

/* PREFIX_MATCH: the keys are probed here, against the store's index. */
void dev_prefix_match_now(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_buf *b = dev_client_range(dev, &dev->qps[qp], c);
    uint16_t st = c->flags ? SDE_SC_INVALID_FIELD
                  : c->nsid && !dev_ns_visible(dev, &dev->qps[qp], c->nsid)
                      ? SDE_SC_INVALID_NAMESPACE
                  : !b ? SDE_SC_INVALID_BUFFER
                  : !c->length || c->length % 16 ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
    if (!st && (!dev->fw || !dev->store))
        st = SDE_SC_INTERNAL;
    if (st) {
        dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    if (sde_store_failed(dev->store)) {
        dev_finish(dev, qp, cls, c->cid, SDE_SC_MEDIA_ERROR, 0, 0, t0);
        return;
    }
    uint64_t n = c->length / 16;
    uint64_t h0 = now_ns();
    uint64_t hits = sde_store_prefix_match(dev->store, c->nsid, b->addr + c->buf_offset, n);
    uint64_t host = now_ns() - h0;
    double submit = dev_model_submit(dev, c, t0);
    double done = charge(dev, SDE_KERNEL_PREFIX_MATCH,
                         sde_cost_prefix_match(hits + 1 < n ? hits + 1 : n), submit, host);
    uint64_t due, dtime;
    dev_model_verdict(dev, submit, done, &due, &dtime);
    dev_finish_at(dev, qp, cls, c->cid, SDE_SC_SUCCESS, hits, 0, t0, due, dtime);
}

/* PREFIX_MATCH_TOKENS: a 16-byte root key, then token ids (uint32); the chain of keys is
 * hashed on a firmware thread, then matched here. */
void dev_prefix_tokens_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_buf *b = dev_client_range(dev, &dev->qps[qp], c);
    uint16_t st = c->flags ? SDE_SC_INVALID_FIELD
                  : c->nsid && !dev_ns_visible(dev, &dev->qps[qp], c->nsid)
                      ? SDE_SC_INVALID_NAMESPACE
                  : !b ? SDE_SC_INVALID_BUFFER
                  : !prefix_block_size_ok(c->param0) || c->length < 16 || (c->length - 16) % 4
                      ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
    uint64_t ntokens = st ? 0 : (c->length - 16) / 4;
    uint64_t nblocks = st ? 0 : ntokens / c->param0;
    if (st || !nblocks) {
        dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    struct dev_ctx *x = compute_ctx(dev, qp, c, cls, CTX_PM_TOKENS, t0);
    if (!x)
        return;
    x->nsid = c->nsid;
    if (!dev_bounce_take(dev, x, nblocks * 16)) {
        compute_fail(dev, x, SDE_SC_INTERNAL);
        return;
    }
    uint8_t *base = b->addr + c->buf_offset;
    fw_submit(dev, x, SDE_FW_HASH, base + 16, (int64_t)ntokens, x->bounce,
              (int64_t)nblocks * 16, base, (int64_t)c->param0);
}

/* A firmware job is done: the command goes on. */
/* The kernels' costs from what a call reports (c/fw/sde_fw.h). */
static sde_kernel_cost quantize_cost(const sde_fw_job *j)
{
    const int64_t *info = j->info;
    uint64_t n = (uint64_t)info[SDE_FW_INFO_ELEMENTS];
    uint32_t eb = (uint32_t)info[SDE_FW_INFO_ELEMENT_BYTES];
    int kind = (int)info[SDE_FW_INFO_KIND];
    uint32_t group = (uint32_t)info[SDE_FW_INFO_GROUP];
    uint64_t sums = (uint64_t)info[SDE_FW_INFO_SUMMARY_BYTES];
    sde_kernel_cost q = sde_cost_quantize(n, eb, kind, group, (uint64_t)j->ret - sums);
    sde_kernel_cost s = sde_cost_store_summaries(n, eb, kind, group, (uint64_t)j->ret, sums);
    return sde_cost_add(q, s);
}

/* KV_STORE_QUANTIZED's kernel is back: charge it, then store its output as a put does. */
void dev_qstore_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j)
{
    sde_kernel_cost cost = quantize_cost(j);
    if (dev->model)
        x->ready = sde_recipe_q_kernel(&dev->budget, x->ready, x->sensed, x->pieces, cost,
                                       (double)j->host_ns, &x->first_out);
    else
        x->ready = x->first_out = charge(dev, SDE_KERNEL_QUANTIZE, cost, x->ready, j->host_ns);
    x->result = (uint64_t)j->ret; /* the compressed size */
    dev_kv_put_value(dev, x, NULL, x->bounce, (uint64_t)j->ret, SDE_KV_STORE_ANY, -1, 1);
}

/* KV_RETRIEVE_DEQUANTIZED's kernel is back: the result is in the client's buffer. */
void dev_dq_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j)
{
    const int64_t *info = j->info;
    double done = sde_recipe_dq_finish(
        dev->model, &dev->budget, x->ready, x->sensed, x->pieces,
        sde_cost_dequantize((uint64_t)info[SDE_FW_INFO_ELEMENTS],
                            (uint32_t)info[SDE_FW_INFO_ELEMENT_BYTES],
                            (int)info[SDE_FW_INFO_KIND], (uint32_t)info[SDE_FW_INFO_GROUP],
                            x->vlen),
        (double)j->host_ns, (uint64_t)j->ret);
    dev_model_verdict(dev, x->msubmit, done, &x->due, &x->dtime);
    x->result = (uint64_t)j->ret;
    dev_ctx_finish(dev, x, SDE_SC_SUCCESS, (uint64_t)j->ret);
}

/* PREFIX_MATCH_TOKENS's chain is hashed: match it against the index, here. */
void dev_pm_tokens_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j)
{
    uint64_t n = (uint64_t)j->ret;
    double hashed = charge(dev, SDE_KERNEL_PREFIX_HASH,
                           sde_cost_prefix_hash(n, (uint32_t)j->block_tokens), x->msubmit,
                           j->host_ns);
    if (sde_store_failed(dev->store)) {
        dev_ctx_finish(dev, x, SDE_SC_MEDIA_ERROR, 0);
        return;
    }
    uint64_t h0 = now_ns();
    uint64_t hits = sde_store_prefix_match(dev->store, x->nsid, x->bounce, n);
    double done = charge(dev, SDE_KERNEL_PREFIX_MATCH,
                         sde_cost_prefix_match(hits + 1 < n ? hits + 1 : n), hashed,
                         now_ns() - h0);
    dev_model_verdict(dev, x->msubmit, done, &x->due, &x->dtime);
    x->result = hits;
    dev_ctx_finish(dev, x, SDE_SC_SUCCESS, 0);
}

/* A firmware job is back (at its turn, on the virtual clock): a failure completes the
 * command; otherwise its opcode's row says what follows. */
static void fw_job_done(sde_dev *dev, sde_fw_job *j)
{
    struct dev_ctx *x = &dev->ctx[j->owner];
    if (dev->model && dev->virtual_time) /* its turn: fetch order */
        book_input(dev, x);
    if (j->ret < 0) {
        if (j->ret == SDE_FW_E_OUT_SMALL && dev_kind(x)->reports_raw_size)
            x->result = (uint64_t)j->info[SDE_FW_INFO_RAW]; /* how large a buffer it needs */
        dev_ctx_finish(dev, x, fw_status(j->ret), 0);
        return;
    }
    const struct dev_op *r = dev_op(x->op);
    if (r && r->kernel_done)
        r->kernel_done(dev, x, j);
    else
        dev_ctx_finish(dev, x, SDE_SC_INTERNAL, 0);
}

/* Virtual time: a command fetched behind compute commands starts now, its turn, timed from
 * the submission it had when fetched. */
static void start_deferred(sde_dev *dev, struct dev_ctx *x)
{
    sde_sqe c = x->sqe;
    int qp = x->qp;
    uint64_t t0 = x->t0;
    dev->resume_submit = x->msubmit;
    dev_ctx_put(dev, x);
    dev->resuming = 1;
    dev_start_now(dev, qp, &c, dev_op(c.opcode), t0);
    dev->resuming = 0;
}

int dev_reap_firmware(sde_dev *dev)
{
    if (!dev->fw)
        return 0;
    int n = 0;
    for (sde_fw_job *j = sde_fw_take_done(dev->fw), *next; j; j = next, n++) {
        next = j->next;
        if (dev->virtual_time)
            dev->ctx[j->owner].fw_state = FW_DONE;
        else
            fw_job_done(dev, j);
    }
    /* virtual time: go on in fetch order, as far as the commands are back */
    while (dev->fw_head != NO_CTX && dev->ctx[dev->fw_head].fw_state != FW_WAITING) {
        struct dev_ctx *x = &dev->ctx[dev->fw_head];
        dev->fw_head = x->next_fw;
        if (dev->fw_head == NO_CTX)
            dev->fw_tail = NO_CTX;
        if (x->fw_state == FW_DONE)
            fw_job_done(dev, &x->job);
        else if (x->fw_state == FW_DEFERRED)
            start_deferred(dev, x);
        else
            dev_ctx_finish(dev, x, x->fw_status, 0);
        n++;
    }
    return n;
}
