/* The device's life and tables: creation, queue pairs and buffers of each client, namespaces,
 * stats, the store and firmware attached, admin commands handed to the control plane. */
#define _GNU_SOURCE
#include "dev_internal.h"

/* ---- lifecycle ------------------------------------------------------------------------- */

int sde_dev_new(int media_fd, uint64_t media_size, uint32_t lba_size, uint32_t io_depth,
                uint32_t engine_flags, sde_dev **out)
{
    if (io_depth == 0 || io_depth > 4096)
        return -EINVAL;
    sde_dev *dev = calloc(1, sizeof(*dev));
    if (!dev)
        return -ENOMEM;
    pthread_mutex_init(&dev->lock, NULL);
    dev->media_fd = media_fd;
    dev->media_size = media_size;
    dev->lba = lba_size;
    dev->depth = io_depth;
    dev_pins_init(dev);
    struct stat st;
    dev->is_block = fstat(media_fd, &st) == 0 && S_ISBLK(st.st_mode);
    dev->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    dev->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event own = {.events = EPOLLIN, .data.u32 = DEV_OWN_DOORBELL};
    if (dev->doorbell >= 0 && dev->epfd >= 0 &&
        epoll_ctl(dev->epfd, EPOLL_CTL_ADD, dev->doorbell, &own) < 0) {
        close(dev->epfd);
        dev->epfd = -1;
    }
    dev->origin = now_ns(); /* the device clock without a model too (compute times) */
    dev->admin_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    dev->retr_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE); /* workers block on it */
    dev->ctx = calloc(io_depth, sizeof(*dev->ctx));
    dev->free_ctx = calloc(io_depth, sizeof(*dev->free_ctx));
    dev->admin = calloc(ADMIN_CAP, sizeof(*dev->admin));
    dev->retr = calloc(ADMIN_CAP, sizeof(*dev->retr));
    dev->vwrites = calloc(2 * (size_t)io_depth, sizeof(*dev->vwrites));
    dev->owners = calloc(SDE_MAX_OWNERS, sizeof(*dev->owners));
    int ret = -ENOMEM;
    if (dev->doorbell < 0 || dev->epfd < 0 || dev->admin_fd < 0 || dev->retr_fd < 0 || !dev->owners || !dev->ctx || !dev->free_ctx || !dev->admin || !dev->retr ||
        !dev->vwrites)
        goto fail;
    /* a command has at most two I/Os (a KV value's tail), plus the journal's groups */
    ret = sde_engine_new(media_fd, media_size, lba_size, 2 * io_depth + 1 + ST_JOURNAL_SLOTS,
                         engine_flags, &dev->eng);
    if (ret < 0)
        goto fail;
    sde_register_buffer_slots(dev->eng, SDE_MAX_BUFS); /* failure: counted fallback */
    for (uint32_t i = 0; i < io_depth; i++)
        dev->free_ctx[i] = io_depth - 1 - i;
    dev->nfree = io_depth;
    dev->wait_head = dev->wait_tail = NO_CTX;
    dev->park_head = dev->park_tail = NO_CTX;
    dev->fw_head = dev->fw_tail = NO_CTX;
    *out = dev;
    return 0;
fail:
    sde_dev_free(dev);
    return ret;
}

void sde_dev_free(sde_dev *dev)
{
    if (dev) {
        sde_fw_free(dev->fw); /* its threads first: they may still be in a kernel */
        dev_pins_free(dev);
        free(dev->delays);
        free(dev->owners);
        sde_undo_free(dev->undo);
    }
    if (!dev)
        return;
    if (dev->eng)
        sde_engine_free(dev->eng); /* drains what is in flight */
    for (uint32_t i = 0; dev->ctx && i < dev->depth; i++)
        dev_bounce_free_all(dev, &dev->ctx[i]);
    if (dev->doorbell >= 0)
        close(dev->doorbell);
    if (dev->epfd >= 0)
        close(dev->epfd);
    if (dev->admin_fd >= 0)
        close(dev->admin_fd);
    if (dev->retr_fd >= 0)
        close(dev->retr_fd);
    free(dev->ctx);
    free(dev->free_ctx);
    free(dev->admin);
    free(dev->retr);
    free(dev->vwrites);
    free(dev->held);
    sde_model_free(dev->model);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
}

int sde_dev_doorbell_fd(sde_dev *dev) { return dev->doorbell; }
int sde_dev_admin_fd(sde_dev *dev) { return dev->admin_fd; }
int sde_dev_retrieval_fd(sde_dev *dev) { return dev->retr_fd; }

/* ---- tables (control plane) ---------------------------------------------------------- */

/* The in-flight counter of a uid: the one its queue pairs share, or a slot no queue pair
 * uses any more.  There is always one: a slot per queue pair. */
static uint32_t *uid_counter(sde_dev *dev, uint32_t uid)
{
    int free_slot = -1;
    for (int s = 0; s < SDE_MAX_QPS; s++) {
        int used = 0;
        for (int i = 0; i < dev->qp_hi && !used; i++)
            used = dev->qps[i].in_use && dev->qps[i].uid_inflight == &dev->uids[s].inflight;
        if (used && dev->uids[s].uid == uid)
            return &dev->uids[s].inflight;
        if (!used && free_slot < 0)
            free_slot = s;
    }
    dev->uids[free_slot].uid = uid;
    dev->uids[free_slot].inflight = 0;
    return &dev->uids[free_slot].inflight;
}

/* The owner's counters: found, or a new slot (the last one shared once they are full). */
static uint32_t owner_slot(sde_dev *dev, uint32_t uid, uint64_t token)
{
    for (uint32_t i = 0; i < dev->nowners; i++)
        if (dev->owners[i].uid == uid && dev->owners[i].token == token)
            return i;
    if (dev->nowners == SDE_MAX_OWNERS)
        return SDE_MAX_OWNERS - 1;
    uint32_t i = dev->nowners++;
    memset(&dev->owners[i], 0, sizeof(dev->owners[i]));
    dev->owners[i].uid = uid;
    dev->owners[i].token = token;
    return i;
}

int sde_dev_owner_stats(sde_dev *dev, uint32_t uid, uint64_t token, sde_class_stats *out)
{
    pthread_mutex_lock(&dev->lock);
    int ret = -ENOENT;
    for (uint32_t i = 0; i < dev->nowners; i++) {
        if (dev->owners[i].uid == uid && dev->owners[i].token == token) {
            memcpy(out, dev->owners[i].cls, sizeof(dev->owners[i].cls));
            ret = 0;
            break;
        }
    }
    pthread_mutex_unlock(&dev->lock);
    return ret;
}

int sde_dev_set_uid_quota(sde_dev *dev, uint32_t max_inflight)
{
    pthread_mutex_lock(&dev->lock);
    dev->max_uid_inflight = max_inflight;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

int sde_dev_add_qp(sde_dev *dev, void *mem, uint64_t bytes, uint32_t client, int completion_fd,
                   int doorbell_fd, uint32_t uid, uint64_t token)
{
    const sde_ring_hdr *h = mem;
    if (sde_qp_check(mem, bytes) < 0)
        return -EINVAL;
    pthread_mutex_lock(&dev->lock);
    int qp = -ENOSPC;
    for (int i = 0; i < SDE_MAX_QPS; i++) {
        if (!dev->qps[i].in_use) {
            qp = i;
            break;
        }
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)qp};
    if (qp >= 0 && epoll_ctl(dev->epfd, EPOLL_CTL_ADD, doorbell_fd, &ev) < 0)
        qp = -errno;
    if (qp >= 0) {
        struct dev_qp *q = &dev->qps[qp];
        if (qp >= dev->qp_hi)
            dev->qp_hi = qp + 1;
        memset(q, 0, sizeof(*q));
        q->dbfd = doorbell_fd;
        q->in_use = 1;
        q->active = 1;
        q->client = client;
        q->uid_inflight = uid_counter(dev, uid);
        q->owner = owner_slot(dev, uid, token);
        q->uid = uid;
        q->token = token;
        q->cfd = completion_fd;
        q->client_kicks = &dev->stats.client_kicks;
        /* trusted copies, taken now, before the client can touch the memory */
        q->v.mem = mem;
        q->v.bytes = bytes;
        q->v.sq_entries = h->sq_entries;
        q->v.cq_entries = h->cq_entries;
        q->v.sq_offset = h->sq_offset;
        q->v.cq_offset = h->cq_offset;
    }
    pthread_mutex_unlock(&dev->lock);
    kick(dev->doorbell);
    return qp;
}

static int qp_ok(sde_dev *dev, int qp) { return qp >= 0 && qp < SDE_MAX_QPS && dev->qps[qp].in_use; }

int sde_dev_set_qp_admin(sde_dev *dev, int qp, int admin)
{
    if (!qp_ok(dev, qp))
        return -EINVAL;
    pthread_mutex_lock(&dev->lock);
    dev->qps[qp].admin = !!admin;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

int sde_dev_remove_qp(sde_dev *dev, int qp)
{
    pthread_mutex_lock(&dev->lock);
    int ret = -EINVAL;
    if (qp_ok(dev, qp)) {
        struct dev_qp *q = &dev->qps[qp];
        if (q->active)
            sde_sq_set_dead(&q->v);
        q->active = 0;
        if (q->dbfd >= 0) /* its kicks no longer wake the data plane: the caller may close it */
            epoll_ctl(dev->epfd, EPOLL_CTL_DEL, q->dbfd, NULL);
        q->dbfd = -1;
        qp_done(q, q->nstage); /* staged completions go nowhere now */
        q->nstage = 0;
        ret = (int)q->inflight;
        if (!ret)
            q->in_use = 0;
    }
    pthread_mutex_unlock(&dev->lock);
    return ret;
}

uint64_t sde_dev_ctx_mark(sde_dev *dev)
{
    pthread_mutex_lock(&dev->lock);
    uint64_t mark = dev->ctx_serial;
    pthread_mutex_unlock(&dev->lock);
    return mark;
}

int sde_dev_inflight_before(sde_dev *dev, uint64_t mark)
{
    pthread_mutex_lock(&dev->lock);
    int n = 0;
    for (uint32_t i = 0; i < dev->depth; i++)
        n += dev->ctx[i].used && dev->ctx[i].serial <= mark;
    pthread_mutex_unlock(&dev->lock);
    return n;
}

int sde_dev_qp_inflight(sde_dev *dev, int qp)
{
    pthread_mutex_lock(&dev->lock);
    int ret = -EINVAL;
    if (qp_ok(dev, qp)) {
        ret = (int)dev->qps[qp].inflight;
        if (!ret && !dev->qps[qp].active)
            dev->qps[qp].in_use = 0;
    }
    pthread_mutex_unlock(&dev->lock);
    return ret;
}

void sde_dev_shutdown_qps(sde_dev *dev)
{
    pthread_mutex_lock(&dev->lock);
    for (int i = 0; i < SDE_MAX_QPS; i++) {
        struct dev_qp *q = &dev->qps[i];
        if (q->in_use && q->active) {
            sde_sq_set_dead(&q->v);
            kick(q->cfd);
        }
    }
    pthread_mutex_unlock(&dev->lock);
}

int sde_dev_add_buffer(sde_dev *dev, uint32_t client, void *addr, uint64_t len, uint32_t flags)
{
    if (!addr || !len || ((uintptr_t)addr & 4095) || (flags & ~SDE_BUF_BOUNCE))
        return -EINVAL;
    pthread_mutex_lock(&dev->lock);
    int h = -ENOSPC;
    for (int i = 1; i <= SDE_MAX_BUFS; i++) {
        if (!dev->bufs[i].active) {
            h = i;
            break;
        }
    }
    if (h > 0) {
        dev->bufs[h] = (struct dev_buf){1, client, addr, len, flags};
        /* a bounce too: KV values move straight between it and the media (the client
         * copies in or out), and an unregistered buffer costs the kernel a page walk per
         * I/O (a 2 MiB retrieve 1.6 ms instead of 0.33 on memory media) */
        sde_buffer_set(dev->eng, (uint32_t)h - 1, addr, len); /* failure: unregistered */
    }
    pthread_mutex_unlock(&dev->lock);
    return h;
}

int sde_dev_remove_buffer(sde_dev *dev, int handle)
{
    pthread_mutex_lock(&dev->lock);
    int ret = -EINVAL;
    if (handle >= 1 && handle <= SDE_MAX_BUFS && dev->bufs[handle].active) {
        sde_buffer_set(dev->eng, (uint32_t)handle - 1, NULL, 0);
        dev->bufs[handle].active = 0;
        ret = 0;
    }
    pthread_mutex_unlock(&dev->lock);
    return ret;
}

int sde_dev_client_inflight(sde_dev *dev, uint32_t client)
{
    pthread_mutex_lock(&dev->lock);
    int n = 0;
    for (int i = 0; i < SDE_MAX_QPS; i++)
        if (dev->qps[i].in_use && dev->qps[i].client == client)
            n += (int)dev->qps[i].inflight;
    pthread_mutex_unlock(&dev->lock);
    return n;
}

int sde_dev_set_ns(sde_dev *dev, uint32_t nsid, const sde_ns_info *ns)
{
    if (nsid < 1 || nsid > SDE_MAX_NS)
        return -EINVAL;
    if (ns && (ns->offset % dev->lba || ns->bytes % dev->lba ||
               ns->offset > dev->media_size || ns->bytes > dev->media_size - ns->offset ||
               !(ns->flags & SDE_NS_USED)))
        return -EINVAL;
    pthread_mutex_lock(&dev->lock);
    if (ns) {
        dev->ns[nsid] = *ns;
    } else {
        memset(&dev->ns[nsid], 0, sizeof(dev->ns[nsid]));
        dev_pins_drop_ns(dev, nsid); /* its keys went with it: so do the pins on them */
    }
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

int sde_dev_media_inline(sde_dev *dev)
{
    sde_stats st;
    sde_get_stats(dev->eng, &st);
    return st.inline_io;
}

void sde_dev_get_stats(sde_dev *dev, sde_dev_stats *out)
{
    pthread_mutex_lock(&dev->lock);
    *out = dev->stats;
    out->pins = dev->pins.total;
    pthread_mutex_unlock(&dev->lock);
}

/* A range the store freed is a trim to the FTL (a delete or an overwrite no longer keeps
 * its old value's units valid for GC). */
static void trim_freed(void *ctx, uint64_t off, uint64_t nbytes)
{
    sde_dev *dev = ctx;
    if (dev->model)
        sde_model_trim(dev->model, off, nbytes);
}

int sde_dev_attach_store(sde_dev *dev, sde_store *st)
{
    pthread_mutex_lock(&dev->lock);
    if (dev->store && dev->store != st)
        sde_store_on_free(dev->store, NULL, NULL);
    if (st)
        sde_store_on_free(st, trim_freed, dev);
    dev->store = st;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

void sde_dev_store_enter(sde_dev *dev)
{
    pthread_mutex_lock(&dev->lock);
    while (dev->store && st_journal_busy(dev->store)) {
        pthread_mutex_unlock(&dev->lock);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&dev->lock);
    }
}

void sde_dev_store_leave(sde_dev *dev)
{
    pthread_mutex_unlock(&dev->lock);
    kick(dev->doorbell); /* commands waiting for a group this call committed can complete */
}

void sde_dev_store_lookup_many(sde_dev *dev, uint32_t nsid, const uint8_t *keys,
                               const uint32_t *klens, uint32_t n, uint64_t *offset,
                               uint64_t *len, uint64_t *hash, int32_t *status)
{
    sde_dev_store_enter(dev);
    sde_store_lookup_many(dev->store, nsid, keys, klens, n, offset, len, hash, status);
    /* no kick: a lookup commits nothing, and a data plane woken for nothing takes a core
     * from the retrieval worker that looked up (every command looks its sequence up) */
    pthread_mutex_unlock(&dev->lock);
}

/* A retrieve's scratch, this thread's: aligned for O_DIRECT, kept up to GET_SCRATCH_KEEP. */
#define GET_SCRATCH_KEEP (16ull << 20)
static __thread uint8_t *get_scratch;
static __thread uint64_t get_scratch_cap;

static uint8_t *thread_scratch(uint64_t bytes)
{
    if (bytes <= get_scratch_cap)
        return get_scratch;
    free(get_scratch);
    get_scratch_cap = 0;
    if (posix_memalign((void **)&get_scratch, 4096, bytes)) {
        get_scratch = NULL;
        return NULL;
    }
    get_scratch_cap = bytes;
    return get_scratch;
}

int sde_dev_store_get(sde_dev *dev, uint32_t nsid, const uint8_t *key, uint32_t klen,
                      void *out, uint64_t cap, uint64_t *len)
{
    uint32_t x, n = 0;
    uint64_t off, hash, total = 0, *pc = NULL;
    *len = 0;
    sde_dev_store_enter(dev);
    int s = dev->store ? st_get_begin(dev->store, nsid, key, klen, &x, &off, len, &hash)
                       : SDE_SC_INTERNAL;
    if (!s) {
        n = st_ext_pieces(dev->store, x);
        pc = malloc(2 * n * sizeof(*pc));
        s = !pc ? SDE_SC_INTERNAL : *len > cap ? SDE_SC_KV_INVALID_VALUE_SIZE : SDE_SC_SUCCESS;
        for (uint32_t i = 0; !s && i < n; i++) {
            st_ext_piece(dev->store, x, i, &pc[2 * i], &pc[2 * i + 1]);
            total += pc[2 * i + 1];
        }
        if (s)
            st_get_end(dev->store, x);
    }
    int fd = s ? -1 : st_media_fd(dev->store);
    sde_store *pinned = dev->store;
    pthread_mutex_unlock(&dev->lock);
    if (s) {
        free(pc);
        return s;
    }
    uint8_t *buf = thread_scratch(total);
    s = buf ? st_read_pinned(fd, pc, n, buf, *len, hash) : SDE_SC_INTERNAL;
    if (!s)
        memcpy(out, buf, *len);
    free(pc);
    if (get_scratch_cap > GET_SCRATCH_KEEP) { /* a value past it: not kept */
        free(get_scratch);
        get_scratch = NULL;
        get_scratch_cap = 0;
    }
    pthread_mutex_lock(&dev->lock);
    if (dev->store == pinned) /* a shutdown may have detached it meanwhile */
        st_get_end(pinned, x);
    pthread_mutex_unlock(&dev->lock);
    kick(dev->doorbell); /* the extent, unpinned, may be freed (a delete meanwhile) */
    return s;
}

/* ---- admin commands, handled by Python --------------------------------------------------- */

/* A command for Python: copied onto a ring of ADMIN_CAP (full: INTERNAL) and counted on
 * its eventfd. */
static void host_queue(sde_dev *dev, sde_admin_cmd *ring, uint32_t head, uint32_t *tail,
                       int fd, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    if (*tail - head >= ADMIN_CAP) {
        dev_finish(dev, qp, cls, c->cid, SDE_SC_INTERNAL, 0, 0, t0);
        return;
    }
    sde_admin_cmd *a = &ring[(*tail)++ % ADMIN_CAP];
    a->qp = qp;
    a->client = dev->qps[qp].client;
    a->t0_ns = t0;
    a->sqe = *c;
    kick(fd);
}

/* An admin command's start: queued for the control plane, which the eventfd wakes. */
void dev_admin_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    host_queue(dev, dev->admin, dev->admin_head, &dev->admin_tail, dev->admin_fd, qp, c, cls,
               t0);
}

/* A retrieval command's start: queued for the retrieval workers, one of which its count on
 * the semaphore eventfd wakes. */
void dev_retrieval_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    host_queue(dev, dev->retr, dev->retr_head, &dev->retr_tail, dev->retr_fd, qp, c, cls, t0);
}

uint32_t sde_dev_retrieval_queued(sde_dev *dev)
{
    pthread_mutex_lock(&dev->lock);
    uint32_t n = dev->retr_tail - dev->retr_head;
    pthread_mutex_unlock(&dev->lock);
    return n;
}

int sde_dev_retrieval_pop(sde_dev *dev, sde_admin_cmd *out)
{
    pthread_mutex_lock(&dev->lock);
    int n = dev->retr_head != dev->retr_tail;
    if (n)
        *out = dev->retr[dev->retr_head++ % ADMIN_CAP];
    pthread_mutex_unlock(&dev->lock);
    return n;
}

int sde_dev_admin_pop(sde_dev *dev, sde_admin_cmd *out, uint32_t max)
{
    uint64_t v;
    ssize_t r = read(dev->admin_fd, &v, sizeof(v));
    (void)r;
    pthread_mutex_lock(&dev->lock);
    uint32_t n = 0;
    while (n < max && dev->admin_head != dev->admin_tail)
        out[n++] = dev->admin[dev->admin_head++ % ADMIN_CAP];
    pthread_mutex_unlock(&dev->lock);
    return (int)n;
}

int sde_dev_complete(sde_dev *dev, int qp, const sde_cqe *cqe, uint64_t t0_ns, uint32_t opcode,
                     uint64_t bytes, uint64_t bytes_copied)
{
    pthread_mutex_lock(&dev->lock);
    int ret = -EINVAL;
    if (qp_ok(dev, qp) && dev->qps[qp].inflight) {
        int cls = sde_dev_opcode_class(opcode);
        dev_copied(dev, qp, cls, bytes_copied);
        uint64_t dtime = cqe->device_time_ns;
        uint64_t due = dtime && dev->model && !dev->virtual_time ? t0_ns + dtime : 0;
        dev_finish_at(dev, qp, cls, cqe->cid, cqe->status, cqe->result, bytes, t0_ns, due, dtime);
        dev_flush_stage(&dev->qps[qp]);
        ret = 0;
    }
    pthread_mutex_unlock(&dev->lock);
    if (ret == 0 && dev->nheld)
        kick(dev->doorbell); /* the data plane may sleep with no timeout: it must see this */
    return ret;
}

/* ---- the firmware and its budget ------------------------------------------------------ */

int sde_dev_set_firmware(sde_dev *dev, uint64_t quantize, uint64_t dequantize,
                         uint64_t hash_chain, uint64_t requantize, uint32_t threads,
                         const sde_budget *budget)
{
    /* the budget as the profile built it (ssdemu.sim.timing.budget_of), idle */
    if (!budget || !budget->units || budget->units > SDE_MAX_UNITS)
        return -EINVAL;
    sde_budget b = *budget;
    int r;
    sde_fw_entry e = {(sde_fw_quantize_fn)(uintptr_t)quantize,
                      (sde_fw_dequantize_fn)(uintptr_t)dequantize,
                      (sde_fw_hash_fn)(uintptr_t)hash_chain,
                      (sde_fw_requantize_fn)(uintptr_t)requantize};
    sde_fw *fw;
    r = sde_fw_new(&e, threads, dev->doorbell, &fw);
    if (r < 0)
        return r;
    pthread_mutex_lock(&dev->lock);
    sde_fw *old = dev->fw;
    int busy = old && sde_fw_pending(old);
    if (!busy) {
        dev->fw = fw;
        dev->fw_entry = e;
        dev->budget = b;
        dev_share_dram(dev);
    }
    pthread_mutex_unlock(&dev->lock);
    sde_fw_free(busy ? fw : old);
    return busy ? -EBUSY : 0;
}

void sde_dev_budget(sde_dev *dev, sde_budget *out)
{
    pthread_mutex_lock(&dev->lock);
    *out = dev->budget;
    pthread_mutex_unlock(&dev->lock);
}

double sde_dev_clock_ns(sde_dev *dev)
{
    pthread_mutex_lock(&dev->lock);
    double t = dev->virtual_time ? dev->vclock : (double)(now_ns() - dev->origin);
    pthread_mutex_unlock(&dev->lock);
    return t;
}
