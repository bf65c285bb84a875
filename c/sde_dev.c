/*
 * The device core (see sde_dev.h).  One lock guards the tables; the data plane holds it
 * while it works through one pass over the queues, the control plane (Python) takes it for
 * each change.  Commands that need the media go through the io_uring engine; each in-flight
 * command owns a context (its sde_io, its queue pair and command id, a bounce buffer).
 */
#define _GNU_SOURCE
#include "sde_dev.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sde_budget.h"
#include "sde_recipe.h"
#include "sde_engine.h"
#include "sde_fw.h"
#include "sde_ring.h"
#include "sde_store_internal.h"
#include "sde_undo.h"

#define ADMIN_CAP 4096
#define FETCH_BATCH 64

#define STAGE 64

struct dev_qp {
    int in_use;     /* slot taken (until inactive and drained) */
    int active;     /* serving */
    uint32_t client;
    uint32_t uid;   /* the client's owner identity: uid and token (0: none) */
    uint64_t token;
    int cfd;        /* the client's completion eventfd */
    uint32_t inflight; /* fetched, not yet posted (staged completions count) */
    uint32_t *client_inflight; /* the same, summed over its client's queue pairs */
    uint32_t nstage;
    sde_qp_view v;
    sde_cqe stage[STAGE]; /* completions of this pass, posted together: one fence, one kick */
};

struct dev_buf {
    int active;
    uint32_t client;
    uint8_t *addr;
    uint64_t len;
    uint32_t flags;
};


enum {
    CTX_BLOCK = 0, CTX_KV_PUT = 1, CTX_KV_GET = 2, CTX_KV_DELETE = 3,
    /* compute commands: their kernels run on the firmware's threads (c/sde_fw.h) */
    CTX_QSTORE = 4,    /* KV_STORE_QUANTIZED: quantize, then store as a put does */
    CTX_DQ_GET = 5,    /* KV_RETRIEVE_DEQUANTIZED: read, then dequantize into the client */
    CTX_PM_TOKENS = 6, /* PREFIX_MATCH_TOKENS: hash the chain, then match */
    CTX_DEL_PARKED = 7, /* a KV_DELETE held back: an early put of its key is in flight */
    CTX_DEFERRED = 8    /* virtual time: a command fetched behind compute commands, started
                         * at its turn (sqe, msubmit) */
};

struct dev_ctx {
    sde_io io;
    sde_io io2;      /* a KV value's last partial block, through a bounce */
    int qp;
    uint16_t cid;
    uint8_t cls;
    uint8_t used;
    uint8_t kind;
    uint8_t nio;     /* I/Os of this command in flight */
    uint8_t io_failed;  /* a media I/O of it failed: MEDIA_ERROR */
    uint8_t no_memory;  /* no bounce for it: INTERNAL */
    uint64_t t0;
    uint8_t *bounce;
    uint8_t *client_addr;
    uint64_t due;    /* real time: post no earlier than this (monotonic ns); 0: at once */
    uint64_t dtime;  /* the CQE's device time (modelled); 0: the measured latency */
    /* KV commands */
    st_put_plan plan;
    uint32_t ext;
    uint64_t vlen, vhash;
    uint8_t *copy_to;    /* a retrieve's bytes to copy out of the bounce, and how many */
    uint64_t copy_len;
    uint64_t copied;
    uint64_t result;
    uint64_t group;      /* the journal group this command waits for */
    uint32_t next_wait;  /* FIFO of commands waiting for their group's commit */
    /* held back while an early put of the same key is in flight (st_key_busy): the FIFO,
     * and what resumes it (a put: its kv_put_value arguments; a delete: its command) */
    uint32_t next_park;
    uint8_t parked;
    uint8_t park_staged;
    uint8_t park_has_sqe;
    int park_buf;
    int park_mode;
    uint8_t *park_src;
    uint64_t park_len;
    sde_sqe sqe;
    /* compute commands */
    sde_fw_job job;
    uint8_t req[64];     /* the quantized-store request (copied: the client cannot change it
                          * between its check and the kernel) */
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    uint32_t nsid;       /* the key's namespace */
    double msubmit;      /* the modelled submission */
    double sensed;       /* a dequantized retrieve: when its last piece is sensed; a
                          * quantized store: when its last piece is received */
    uint32_t pieces;     /* ... and in how many pieces it streams */
    double first_out;    /* a quantized store: when its kernel's first piece is out */
    double ready;        /* the modelled time the kernel's input is ready, then its output */
    uint64_t in_off, in_len; /* virtual time: what the input's booking needs at its turn (a
                              * retrieve: the value's place; a store: the block's bytes) */
    uint32_t next_fw;    /* virtual time: FIFO of compute commands in fetch order */
    uint8_t fw_state;    /* FW_WAITING, FW_DONE (its job is back), FW_FAILED (fw_status) */
    uint16_t fw_status;
    uint64_t flush_id;   /* a FLUSH under power-cut emulation: what it covers */
    /* a value's I/O, piece by piece (a value no free run could hold whole is in several):
     * the memory it moves from or to, its registered buffer (-1: none), whether that
     * memory is a block-padded staging buffer (whole blocks), the direction, the extent,
     * the piece under way and where it starts in the value, and (a retrieve) how much of
     * the client's range there is (its last block may then land directly) */
    uint8_t *vaddr;
    int16_t vbuf;
    uint8_t vstaged;
    uint8_t vwrite;
    uint32_t vext;
    uint32_t piece, npieces;
    uint64_t vpos;
    uint64_t cover;
};

/* virtual time: FW_DEFERRED, a command to start at its turn (CTX_DEFERRED) */
enum { FW_WAITING = 0, FW_DONE = 1, FW_FAILED = 2, FW_DEFERRED = 3 };

#define NO_CTX UINT32_MAX
/* a journal group's write (or its sync), slot k: UD_JOURNAL - k */
#define UD_JOURNAL (UINT64_MAX - 1)
#define UD_JOURNAL_LAST (UD_JOURNAL - (ST_JOURNAL_SLOTS - 1))
#define UD_IO2 (1ull << 32)

/* A client's pins on one key: pins belong to the client that made them (only it can unpin
 * them) and go when it does (sde_dev_release_pins). */
struct pin_rec {
    uint32_t client;
    uint32_t nsid;
    uint32_t klen;
    uint8_t key[SDE_KEY_MAX];
    uint32_t count;
};

struct held {
    uint64_t due;
    int qp;
    sde_cqe cqe;
};

struct sde_dev {
    pthread_mutex_t lock;
    sde_engine *eng;
    int media_fd;
    int is_block;
    uint64_t media_size;
    uint32_t lba;
    uint32_t depth;
    int doorbell;
    int admin_fd;
    struct dev_qp qps[SDE_MAX_QPS];
    /* commands in flight per client (a queue pair points at its client's counter) */
    struct { uint32_t client, inflight; } clients[SDE_MAX_QPS];
    uint32_t max_client_inflight; /* 0: no quota */
    sde_faults faults;    /* fault injection rules */
    struct delay { int qp; uint16_t cid; uint64_t ns; } *delays; /* latency faults pending */
    uint32_t ndelays;
    /* power-cut emulation (NULL: off): the undo log of writes not yet durable */
    sde_undo *undo;
    uint64_t undo_cap;    /* the write cache's bytes: past them it destages (a sync) */
    uint64_t undo_ckpts;  /* the store's checkpoints seen: each one synced the media */
    int qp_hi;            /* one past the highest queue pair slot ever used: passes scan no
                           * further (256 slots per scan showed in perf for KV puts) */
    struct dev_buf bufs[SDE_MAX_BUFS + 1];
    sde_ns_info ns[SDE_MAX_NS + 1]; /* flags 0: no such namespace */
    struct dev_ctx *ctx;
    uint32_t *free_ctx;
    uint32_t nfree;
    sde_admin_cmd *admin;
    uint32_t admin_head, admin_tail;
    sde_model *model;     /* NULL: no timing model */
    int virtual_time;
    uint64_t origin;      /* real time: the model's zero on the monotonic clock */
    double vclock;        /* virtual time: the latest submission (never goes back) */
    struct held *held;    /* min-heap on due: completions waiting for their modelled time */
    uint32_t nheld, cap_held;
    sde_dev_stats stats;
    /* the KV store (NULL: KV commands go to Python, as before a store is attached) */
    sde_store *store;
    int write_cache;      /* the model's: a store completes before its NAND program */
    /* the firmware: its threads and the TOPS budget its kernels are charged to (NULL: compute
     * commands are refused with INTERNAL) */
    struct pin_rec *pins;
    uint32_t npins, cap_pins;
    sde_fw *fw;
    sde_fw_entry fw_entry;
    /* value writes queued while a pass starts commands, held until the pass's journal group
     * is queued ahead of them (hold_writes set): see pass */
    sde_io **vwrites;
    uint32_t nvwrites;
    int hold_writes;
    uint32_t fw_head, fw_tail; /* virtual time: compute commands in fetch order (NO_CTX),
                                * and the commands fetched behind them (CTX_DEFERRED) */
    int resuming;              /* virtual time: starting a deferred command, submitted at */
    double resume_submit;      /* ...this modelled time (its fetch's) */
    sde_budget budget;
    sde_io jio[ST_JOURNAL_SLOTS]; /* journal groups being written (then, cache off, synced) */
    uint64_t jgroup[ST_JOURNAL_SLOTS];
    uint8_t jbusy[ST_JOURNAL_SLOTS];
    uint32_t wait_head, wait_tail;
    uint32_t park_head, park_tail; /* commands held back behind an early put of their key */
};

/* n commands of queue pair q are posted or dropped. */
static void qp_done(struct dev_qp *q, uint32_t n)
{
    q->inflight -= n;
    *q->client_inflight -= n;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void kick(int fd)
{
    uint64_t one = 1;
    ssize_t r = write(fd, &one, sizeof(one));
    (void)r; /* EAGAIN only when the counter is saturated: the reader is awake anyway */
}

/* ---- lifecycle ------------------------------------------------------------------------- */

int sde_dev_new(int media_fd, uint64_t media_size, uint32_t lba_size, uint32_t io_depth,
                sde_dev **out)
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
    struct stat st;
    dev->is_block = fstat(media_fd, &st) == 0 && S_ISBLK(st.st_mode);
    dev->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    dev->origin = now_ns(); /* the device clock without a model too (compute times) */
    dev->admin_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    dev->ctx = calloc(io_depth, sizeof(*dev->ctx));
    dev->free_ctx = calloc(io_depth, sizeof(*dev->free_ctx));
    dev->admin = calloc(ADMIN_CAP, sizeof(*dev->admin));
    dev->vwrites = calloc(2 * (size_t)io_depth, sizeof(*dev->vwrites));
    int ret = -ENOMEM;
    if (dev->doorbell < 0 || dev->admin_fd < 0 || !dev->ctx || !dev->free_ctx || !dev->admin ||
        !dev->vwrites)
        goto fail;
    /* a command has at most two I/Os (a KV value's tail), plus the journal's groups */
    ret = sde_engine_new(media_fd, media_size, lba_size, 2 * io_depth + 1 + ST_JOURNAL_SLOTS,
                         0, &dev->eng);
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
        free(dev->pins);
        free(dev->delays);
        sde_undo_free(dev->undo);
    }
    if (!dev)
        return;
    if (dev->eng)
        sde_engine_free(dev->eng); /* drains what is in flight */
    for (uint32_t i = 0; dev->ctx && i < dev->depth; i++)
        free(dev->ctx[i].bounce);
    if (dev->doorbell >= 0)
        close(dev->doorbell);
    if (dev->admin_fd >= 0)
        close(dev->admin_fd);
    free(dev->ctx);
    free(dev->free_ctx);
    free(dev->admin);
    free(dev->vwrites);
    free(dev->held);
    sde_model_free(dev->model);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
}

int sde_dev_doorbell_fd(sde_dev *dev) { return dev->doorbell; }
int sde_dev_admin_fd(sde_dev *dev) { return dev->admin_fd; }

/* ---- tables (control plane) ---------------------------------------------------------- */

/* The in-flight counter of a client: its own, or a slot no queue pair uses any more.  There
 * is always one: a slot per queue pair. */
static uint32_t *client_counter(sde_dev *dev, uint32_t client)
{
    int free_slot = -1;
    for (int s = 0; s < SDE_MAX_QPS; s++) {
        int used = 0;
        for (int i = 0; i < dev->qp_hi && !used; i++)
            used = dev->qps[i].in_use && dev->qps[i].client_inflight == &dev->clients[s].inflight;
        if (used && dev->clients[s].client == client)
            return &dev->clients[s].inflight;
        if (!used && free_slot < 0)
            free_slot = s;
    }
    dev->clients[free_slot].client = client;
    dev->clients[free_slot].inflight = 0;
    return &dev->clients[free_slot].inflight;
}

int sde_dev_set_client_quota(sde_dev *dev, uint32_t max_inflight)
{
    pthread_mutex_lock(&dev->lock);
    dev->max_client_inflight = max_inflight;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

int sde_dev_add_qp(sde_dev *dev, void *mem, uint64_t bytes, uint32_t client, int completion_fd,
                   uint32_t uid, uint64_t token)
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
    if (qp >= 0) {
        struct dev_qp *q = &dev->qps[qp];
        if (qp >= dev->qp_hi)
            dev->qp_hi = qp + 1;
        memset(q, 0, sizeof(*q));
        q->in_use = 1;
        q->active = 1;
        q->client = client;
        q->client_inflight = client_counter(dev, client);
        q->uid = uid;
        q->token = token;
        q->cfd = completion_fd;
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

int sde_dev_remove_qp(sde_dev *dev, int qp)
{
    pthread_mutex_lock(&dev->lock);
    int ret = -EINVAL;
    if (qp_ok(dev, qp)) {
        struct dev_qp *q = &dev->qps[qp];
        if (q->active)
            sde_sq_set_dead(&q->v);
        q->active = 0;
        qp_done(q, q->nstage); /* staged completions go nowhere now */
        q->nstage = 0;
        ret = (int)q->inflight;
        if (!ret)
            q->in_use = 0;
    }
    pthread_mutex_unlock(&dev->lock);
    return ret;
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
        if (!(flags & SDE_BUF_BOUNCE))
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
        if (!(dev->bufs[handle].flags & SDE_BUF_BOUNCE))
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
        /* its keys went with it: so do the pins on them */
        for (uint32_t i = 0; i < dev->npins;)
            if (dev->pins[i].nsid == nsid)
                dev->pins[i] = dev->pins[--dev->npins];
            else
                i++;
    }
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

/* Whether the client of queue pair q may use namespace nsid: it exists and is shared or its
 * own (same uid and token).  Another owner's namespace looks exactly like a missing one. */
static int ns_visible(const sde_dev *dev, const struct dev_qp *q, uint32_t nsid)
{
    if (nsid < 1 || nsid > SDE_MAX_NS)
        return 0;
    const sde_ns_info *ns = &dev->ns[nsid];
    return (ns->flags & SDE_NS_USED) &&
           ((ns->flags & SDE_NS_SHARED) || (ns->uid == q->uid && ns->token == q->token));
}

void sde_dev_get_stats(sde_dev *dev, sde_dev_stats *out)
{
    pthread_mutex_lock(&dev->lock);
    *out = dev->stats;
    out->pins = 0;
    for (uint32_t i = 0; i < dev->npins; i++)
        out->pins += dev->pins[i].count;
    pthread_mutex_unlock(&dev->lock);
}

/* ---- the data plane ------------------------------------------------------------------- */

/* The opcode table: every opcode, its command class, and where it runs: here in the data
 * plane (block I/O, KV, and compute on the firmware's threads), or handed to the host side
 * (Python: the admin commands).  The count check fails when an opcode is defined without a row; a test
 * checks each host opcode has a Python handler and no data-plane opcode has one. */
struct op_row {
    uint8_t op, cls, where;
};
static const struct op_row op_table[] = {
    {SDE_CMD_NOP, SDE_CLASS_NOP, SDE_RUN_DATA_PLANE},
    {SDE_CMD_READ, SDE_CLASS_READ, SDE_RUN_DATA_PLANE},
    {SDE_CMD_WRITE, SDE_CLASS_WRITE, SDE_RUN_DATA_PLANE},
    {SDE_CMD_FLUSH, SDE_CLASS_FLUSH, SDE_RUN_DATA_PLANE},
    {SDE_CMD_WRITE_ZEROES, SDE_CLASS_ZERO, SDE_RUN_DATA_PLANE},
    {SDE_CMD_DEALLOCATE, SDE_CLASS_ZERO, SDE_RUN_DATA_PLANE},
    {SDE_CMD_IDENTIFY, SDE_CLASS_ADMIN, SDE_RUN_HOST},
    {SDE_CMD_NS_CREATE, SDE_CLASS_ADMIN, SDE_RUN_HOST},
    {SDE_CMD_NS_DELETE, SDE_CLASS_ADMIN, SDE_RUN_HOST},
    {SDE_CMD_NS_LIST, SDE_CLASS_ADMIN, SDE_RUN_HOST},
    {SDE_CMD_GET_LOG, SDE_CLASS_ADMIN, SDE_RUN_HOST},
    {SDE_CMD_KV_STORE, SDE_CLASS_KV, SDE_RUN_DATA_PLANE},
    {SDE_CMD_KV_RETRIEVE, SDE_CLASS_KV, SDE_RUN_DATA_PLANE},
    {SDE_CMD_KV_DELETE, SDE_CLASS_KV, SDE_RUN_DATA_PLANE},
    {SDE_CMD_KV_EXIST, SDE_CLASS_KV, SDE_RUN_DATA_PLANE},
    {SDE_CMD_KV_LIST, SDE_CLASS_KV, SDE_RUN_DATA_PLANE},
    {SDE_CMD_KV_STORE_QUANTIZED, SDE_CLASS_COMPUTE, SDE_RUN_DATA_PLANE},
    {SDE_CMD_KV_RETRIEVE_DEQUANTIZED, SDE_CLASS_COMPUTE, SDE_RUN_DATA_PLANE},
    {SDE_CMD_PREFIX_MATCH, SDE_CLASS_COMPUTE, SDE_RUN_DATA_PLANE},
    {SDE_CMD_PREFIX_MATCH_TOKENS, SDE_CLASS_COMPUTE, SDE_RUN_DATA_PLANE},
    {SDE_CMD_PIN, SDE_CLASS_COMPUTE, SDE_RUN_DATA_PLANE},
    {SDE_CMD_UNPIN, SDE_CLASS_COMPUTE, SDE_RUN_DATA_PLANE},
};
_Static_assert(sizeof(op_table) / sizeof(op_table[0]) == SDE_CMD_COUNT,
               "one row per opcode in sde_queue.h");

static const struct op_row *op_row(uint32_t op)
{
    for (uint32_t i = 0; i < SDE_CMD_COUNT; i++)
        if (op_table[i].op == op)
            return &op_table[i];
    return NULL;
}

int sde_dev_opcode_class(uint32_t op)
{
    const struct op_row *r = op_row(op);
    return r ? r->cls : SDE_CLASS_INVALID;
}

int sde_dev_opcode_where(uint32_t op)
{
    const struct op_row *r = op_row(op);
    return r ? r->where : -1;
}

static int class_of(uint8_t op) { return sde_dev_opcode_class(op); }

static void account(sde_dev *dev, int cls, uint16_t status, uint64_t bytes, uint64_t lat)
{
    sde_class_stats *c = &dev->stats.cls[cls];
    c->commands++;
    if (status != SDE_SC_SUCCESS)
        c->errors++;
    else
        c->bytes += bytes;
    c->lat_ns_total += lat;
    int b = lat ? 63 - __builtin_clzll(lat) : 0;
    c->lat_hist[b]++;
}

/* Post what a queue pair has staged; one kick if its client sleeps. */
static void flush_stage(struct dev_qp *q)
{
    if (!q->nstage)
        return;
    if (sde_cq_post(&q->v, q->stage, q->nstage))
        kick(q->cfd);
    qp_done(q, q->nstage);
    q->nstage = 0;
}

static void stage(struct dev_qp *q, const sde_cqe *c)
{
    q->stage[q->nstage++] = *c;
    if (q->nstage == STAGE)
        flush_stage(q);
}

static void drop(struct dev_qp *q)
{
    qp_done(q, 1);
    if (!q->inflight)
        q->in_use = 0;
}

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
    uint32_t i = dev->nheld++;
    while (i && dev->held[(i - 1) / 2].due > h->due) {
        dev->held[i] = dev->held[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    dev->held[i] = *h;
}

static struct held heap_pop(sde_dev *dev)
{
    struct held top = dev->held[0], last = dev->held[--dev->nheld];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= dev->nheld)
            break;
        if (c + 1 < dev->nheld && dev->held[c + 1].due < dev->held[c].due)
            c++;
        if (dev->held[c].due >= last.due)
            break;
        dev->held[i] = dev->held[c];
        i = c;
    }
    if (dev->nheld)
        dev->held[i] = last;
    return top;
}

/* Stage every held completion whose modelled time has come. */
static int release_due(sde_dev *dev, uint64_t now)
{
    int n = 0;
    while (dev->nheld && dev->held[0].due <= now) {
        struct held h = heap_pop(dev);
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
 * pass), hold it until `due` (real-time model), or drop it if the queue no longer serves.
 * dtime: the CQE's device time, 0 for the measured latency. */
static void finish_at(sde_dev *dev, int qp, int cls, uint16_t cid, uint16_t status,
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
    account(dev, cls, status, bytes, lat);
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

static void finish(sde_dev *dev, int qp, int cls, uint16_t cid, uint16_t status,
                   uint64_t result, uint64_t bytes, uint64_t t0)
{
    finish_at(dev, qp, cls, cid, status, result, bytes, t0, 0, 0);
}

/* The modelled submission of a command fetched at t0: the virtual clock (which never goes
 * back) or the real one since the model's origin. */
static double model_submit(sde_dev *dev, const sde_sqe *c, uint64_t t0)
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
static void model_verdict(sde_dev *dev, double submit, double done, uint64_t *due,
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

/* The model's verdict for a command starting now (see model_verdict); nothing without a
 * model. */
static void model_times(sde_dev *dev, const sde_sqe *c, uint64_t t0, uint32_t op,
                        uint64_t off, uint64_t nbytes, uint64_t *due, uint64_t *dtime)
{
    *due = 0;
    *dtime = 0;
    if (!dev->model)
        return;
    double submit = model_submit(dev, c, t0);
    double done;
    switch (op) {
    case SDE_CMD_READ: done = sde_model_read(dev->model, submit, off, nbytes); break;
    case SDE_CMD_WRITE: done = sde_model_write(dev->model, submit, off, nbytes); break;
    case SDE_CMD_FLUSH: done = sde_model_flush(dev->model, submit); break;
    default: done = sde_model_nop(dev->model, submit); break;
    }
    model_verdict(dev, submit, done, due, dtime); /* done < 0 cannot happen: in time order */
}

/* Kernels and DMA share the controller's DRAM (sde_model_params.dram_bytes_per_s, which the
 * daemon leaves 0 on the virtual clock: ssdemu/daemon.py). */
static void share_dram(sde_dev *dev) { sde_budget_share_dram(&dev->budget, dev->model); }

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
    share_dram(dev);
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

/* Check a block command against the namespace and the client's buffer.  Returns a status;
 * on success *media_off, *buf are set (buf may be NULL when need_buf is 0). */
static uint16_t check_block(sde_dev *dev, struct dev_qp *q, const sde_sqe *c, int need_buf,
                            uint64_t *media_off, struct dev_buf **buf)
{
    if (c->flags)
        return SDE_SC_INVALID_FIELD;
    if (!ns_visible(dev, q, c->nsid))
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

static uint16_t zero_range(sde_dev *dev, uint8_t op, uint64_t off, uint64_t len)
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
    return zero_range(dev, SDE_CMD_WRITE_ZEROES, offset, bytes) ? -EIO : 0;
}

/* ---- KV commands, run here against the store (c/sde_store.c) ------------------------- */

static uint32_t ctx_index(sde_dev *dev, struct dev_ctx *x) { return (uint32_t)(x - dev->ctx); }

static struct dev_ctx *ctx_take(sde_dev *dev, int qp, const sde_sqe *c, int cls, int kind,
                                uint64_t t0)
{
    struct dev_ctx *x = &dev->ctx[dev->free_ctx[--dev->nfree]];
    memset(x, 0, sizeof(*x));
    x->used = 1;
    x->qp = qp;
    x->cid = c->cid;
    x->cls = (uint8_t)cls;
    x->kind = (uint8_t)kind;
    x->t0 = t0;
    x->io.user_data = ctx_index(dev, x);
    x->io.buf_index = -1;
    x->io2.user_data = ctx_index(dev, x) | UD_IO2;
    x->io2.buf_index = -1;
    x->next_wait = NO_CTX;
    x->next_park = NO_CTX;
    return x;
}

static void ctx_put(sde_dev *dev, struct dev_ctx *x)
{
    free(x->bounce);
    x->bounce = NULL;
    x->used = 0;
    dev->free_ctx[dev->nfree++] = ctx_index(dev, x);
}

/* The key of a KV command: its length (1..16; 0 for any other, never truncated). */
static uint32_t kv_key(const sde_sqe *c, uint8_t key[SDE_KEY_MAX])
{
    memcpy(key, &c->lba, 8);
    memcpy(key + 8, &c->key_hi, 8);
    return c->param1 >= 1 && c->param1 <= SDE_KEY_MAX ? (uint32_t)c->param1 : 0;
}

/* Fields every KV command shares: flags, namespace (0, the shared default, or one the
 * client may use), key.  Returns a status. */
static uint16_t kv_common(const sde_dev *dev, const struct dev_qp *q, const sde_sqe *c,
                          uint8_t key[SDE_KEY_MAX], uint32_t *klen)
{
    *klen = kv_key(c, key);
    if (c->flags)
        return SDE_SC_INVALID_FIELD;
    if (c->nsid && !ns_visible(dev, q, c->nsid))
        return SDE_SC_INVALID_NAMESPACE;
    return *klen ? SDE_SC_SUCCESS : SDE_SC_KV_INVALID_KEY_SIZE;
}

/* The client's buffer named by a command, covering [buf_offset, +length), or NULL. */
static struct dev_buf *client_range(sde_dev *dev, struct dev_qp *q, const sde_sqe *c)
{
    if (c->buf < 1 || c->buf > SDE_MAX_BUFS)
        return NULL;
    struct dev_buf *b = &dev->bufs[c->buf];
    if (!b->active || b->client != q->client || c->buf_offset > b->len ||
        c->length > b->len - c->buf_offset)
        return NULL;
    return b;
}

static void kv_finish(sde_dev *dev, struct dev_ctx *x, uint16_t status, uint64_t bytes)
{
    dev->stats.cls[x->cls].bytes_copied += x->copied;
    /* an error keeps its result (a retrieve's value length) and is not held */
    finish_at(dev, x->qp, x->cls, x->cid, status, x->result, bytes, x->t0,
              status ? 0 : x->due, status ? 0 : x->dtime);
    ctx_put(dev, x);
}

static void wait_commit(sde_dev *dev, struct dev_ctx *x, uint64_t group)
{
    x->group = group;
    x->next_wait = NO_CTX;
    uint32_t i = ctx_index(dev, x);
    if (dev->wait_tail == NO_CTX)
        dev->wait_head = i;
    else
        dev->ctx[dev->wait_tail].next_wait = i;
    dev->wait_tail = i;
}

/* Complete the commands whose journal group is committed (or all, failed, when the
 * journal cannot be written). */
static int complete_committed(sde_dev *dev, int failed)
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
        kv_finish(dev, x, failed ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS,
                  x->kind == CTX_KV_PUT || x->kind == CTX_QSTORE ? x->vlen : 0);
        n++;
    }
    return n;
}

/* Hand an I/O to the engine; under power-cut emulation a write first saves what it will
 * overwrite (kind: SDE_UNDO_BLOCK for a namespace's blocks, SDE_UNDO_STORE for the store's). */
static void queue_media(sde_dev *dev, sde_io *io, int kind)
{
    if (dev->undo && io->op == SDE_OP_WRITE &&
        sde_undo_save(dev->undo, io, io->offset, io->len, kind, 0) < 0)
        dev->stats.undo_failures++;
    sde_queue_io(dev->eng, io);
}

/* Hand the open journal group to the engine (group commit: one write per pass). */
static int journal_kick(sde_dev *dev)
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
        queue_media(dev, io, SDE_UNDO_STORE);
        return 1; /* the next pass may send the next group beside it */
    }
    if (r == 2)
        return complete_committed(dev, 0) + 1; /* a checkpoint committed it */
    if (r < 0)
        return complete_committed(dev, 1);
    return 0;
}

static void journal_io_done(sde_dev *dev, sde_io *io)
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
    complete_committed(dev, !ok);
}

/* Queue a value I/O of a KV command: from/into the client's registered buffer when it
 * is, and aligned as O_DIRECT wants; else the bytes go through a bounce. */
static void kv_queue(sde_dev *dev, sde_io *io, int op, void *addr, uint64_t len, uint64_t off,
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
    queue_media(dev, io, SDE_UNDO_STORE);
}

/* The value writes held back while the pass started commands, after the pass's journal
 * group (see pass). */
static void release_writes(sde_dev *dev)
{
    dev->hold_writes = 0;
    for (uint32_t i = 0; i < dev->nvwrites; i++)
        queue_media(dev, dev->vwrites[i], SDE_UNDO_STORE);
    dev->nvwrites = 0;
}

static void *bounce_alloc(uint64_t n)
{
    void *p = NULL;
    return posix_memalign(&p, 4096, n) ? NULL : p;
}

/* The arguments every value-moving KV command shares (flags, namespace, key, the client's
 * buffer range); on a failure its completion is posted and NULL returned. */
static struct dev_buf *kv_value_args(sde_dev *dev, int qp, const sde_sqe *c, int cls,
                                     uint64_t t0, uint8_t key[SDE_KEY_MAX], uint32_t *klen,
                                     uint16_t (*more)(sde_dev *, const sde_sqe *))
{
    uint16_t st = kv_common(dev, &dev->qps[qp], c, key, klen);
    if (!st && more)
        st = more(dev, c);
    struct dev_buf *b = st ? NULL : client_range(dev, &dev->qps[qp], c);
    if (!st && !b)
        st = SDE_SC_INVALID_BUFFER;
    if (st)
        finish(dev, qp, cls, c->cid, st, 0, 0, t0);
    return b;
}

static uint16_t put_fields(sde_dev *dev, const sde_sqe *c)
{
    if (!c->length || c->length > st_max_value(dev->store))
        return SDE_SC_KV_INVALID_VALUE_SIZE;
    return c->param0 > SDE_KV_STORE_IF_NOT_EXISTS ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
}

/* A put's device time once its placement is known (wrote: its bytes go to NAND at off).
 * A plain put is timed as a write (or, stored already, a NOP) from its fetch; a quantized
 * store continues from its kernel's end (x->ready): programmed, unless the write cache
 * acknowledges it first. */
static void put_timing(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, int wrote,
                       uint64_t off, uint64_t len)
{
    if (x->kind == CTX_KV_PUT) {
        model_times(dev, c, x->t0, wrote ? SDE_CMD_WRITE : SDE_CMD_NOP, off, len, &x->due,
                    &x->dtime);
        return;
    }
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
    model_verdict(dev, x->msubmit, done, &x->due, &x->dtime);
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
        kv_queue(dev, &x->io, op, mem, nb, off, -1);
        x->nio++;
        return;
    }
    int direct = x->vbuf >= 0 && (uintptr_t)mem % blk == 0;
    uint64_t full = !direct ? 0
                    : x->vwrite || x->cover < at + nb ? vbytes / blk * blk : nb;
    if (full) {
        kv_queue(dev, &x->io, op, mem, full, off, x->vbuf);
        x->nio++;
    }
    if (full < nb) {
        uint64_t n = nb - full;
        free(x->bounce);
        x->bounce = bounce_alloc(n);
        if (!x->bounce) {
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
        kv_queue(dev, &x->io2, op, x->bounce, n, off + full, -1);
        x->nio++;
    }
}

/* Start moving a value: its first piece's I/O (the rest follow as each completes). */
static void value_start(sde_dev *dev, struct dev_ctx *x, uint32_t ext, uint8_t *mem,
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
    uint32_t i = ctx_index(dev, x);
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
static void kv_put_value(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, uint8_t *src,
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
    uint16_t st = st_put_begin(dev->store, x->nsid, x->key, x->klen, src, len, mode,
                               &x->plan);
    if (st) {
        kv_finish(dev, x, st, 0);
        return;
    }
    x->vlen = len;
    if (x->kind == CTX_KV_PUT)
        x->result = (uint64_t)x->plan.existed;
    if (!x->plan.wrote) {
        /* the bytes are stored already (under this key, or another: shared) */
        put_timing(dev, x, c, 0, 0, 0);
        uint64_t group;
        st = st_put_commit(dev->store, &x->plan, &group);
        if (st || !group) {
            kv_finish(dev, x, st, st ? 0 : x->vlen);
            return;
        }
        wait_commit(dev, x, group);
        return;
    }
    if (st_early_ok(dev->store)) {
        /* the record joins the open group now: its write goes out with the value's */
        st = st_put_record(dev->store, &x->plan);
        if (st) {
            kv_finish(dev, x, st, 0);
            return;
        }
        if (x->kind == CTX_KV_PUT)
            x->result = (uint64_t)x->plan.existed;
    }
    uint64_t off, nb0;
    st_ext_piece(dev->store, x->plan.ext, 0, &off, &nb0);
    put_timing(dev, x, c, 1, off, len);
    value_start(dev, x, x->plan.ext, src, buf_index, staged, 1, 0);
    if (x->no_memory && !x->nio) {
        if (x->plan.early)
            st_put_abort_early(dev->store, &x->plan);
        else
            st_put_abort(dev->store, &x->plan);
        kv_finish(dev, x, SDE_SC_INTERNAL, 0);
    }
}

static void kv_put_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = kv_value_args(dev, qp, c, cls, t0, key, &klen, put_fields);
    if (!b)
        return;
    struct dev_ctx *x = ctx_take(dev, qp, c, cls, CTX_KV_PUT, t0);
    memcpy(x->key, key, sizeof(key));
    x->klen = klen;
    x->nsid = c->nsid;
    kv_put_value(dev, x, c, b->addr + c->buf_offset, c->length, (int)c->param0,
                 (b->flags & SDE_BUF_BOUNCE) ? -1 : (int)c->buf - 1, 0);
}

static void kv_get_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = kv_value_args(dev, qp, c, cls, t0, key, &klen, NULL);
    if (!b)
        return;
    uint16_t st;
    struct dev_ctx *x = ctx_take(dev, qp, c, cls, CTX_KV_GET, t0);
    uint64_t off;
    st = st_get_begin(dev->store, c->nsid, key, klen, &x->ext, &off, &x->vlen, &x->vhash);
    if (st) {
        ctx_put(dev, x);
        finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    if (x->vlen > c->length) { /* the result tells how large a buffer it needs */
        st_get_end(dev->store, x->ext);
        x->result = x->vlen;
        kv_finish(dev, x, SDE_SC_KV_INVALID_VALUE_SIZE, 0);
        return;
    }
    x->result = x->vlen;
    model_times(dev, c, t0, SDE_CMD_READ, off, x->vlen, &x->due, &x->dtime);
    uint8_t *dst = b->addr + c->buf_offset;
    x->client_addr = dst;
    /* the whole last block lands in the client's buffer when its range covers it (the
     * bytes past the value are the zeros the put wrote); else that block is bounced */
    value_start(dev, x, x->ext, dst, (b->flags & SDE_BUF_BOUNCE) ? -1 : (int)c->buf - 1, 0,
                0, c->length);
    if (x->no_memory && !x->nio) {
        st_get_end(dev->store, x->ext);
        kv_finish(dev, x, SDE_SC_INTERNAL, 0);
    }
}

/* ---- compute commands: the firmware's kernels on its threads (c/sde_fw.h) -------------- */

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
    j->owner = ctx_index(dev, x);
    sde_fw_submit(dev->fw, j);
}

/* Virtual time: x takes its turn after every command in the FIFO. */
static void fifo_append(sde_dev *dev, struct dev_ctx *x)
{
    uint32_t i = ctx_index(dev, x);
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
        finish(dev, qp, cls, c->cid, SDE_SC_INTERNAL, 0, 0, t0);
        return NULL;
    }
    struct dev_ctx *x = ctx_take(dev, qp, c, cls, kind, t0);
    x->msubmit = model_submit(dev, c, t0);
    x->ready = x->msubmit;
    if (dev->virtual_time)
        /* its stages are booked in fetch order (its input's too, at its turn: see
         * fw_job_done), as the model would book commands one after another; in host order
         * (whichever firmware thread finishes first) the modelled times would depend on
         * this host's scheduling */
        fifo_append(dev, x);
    return x;
}

/* A compute command ends before or without its kernel: at once, or (virtual time) when the
 * commands fetched before it have gone on. */
static void compute_fail(sde_dev *dev, struct dev_ctx *x, uint16_t status)
{
    if (!dev->virtual_time) {
        kv_finish(dev, x, status, 0);
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
    if (x->kind == CTX_QSTORE)
        x->ready = sde_recipe_q_receive(dev->model, x->msubmit, x->in_len, &x->sensed,
                                        &x->pieces);
    else if (x->kind == CTX_DQ_GET)
        x->ready = sde_recipe_dq_sense(dev->model, x->msubmit, x->in_off, x->in_len,
                                       &x->sensed, &x->pieces);
}

/* KV_STORE_QUANTIZED: the request (64 bytes) leads the block in the command's range, or
 * (param0 != 0) lies in a buffer of the client's own: handle << 40 | offset, so that a block
 * in a registered buffer needs no room before it.  The block crosses the link as it is, is
 * quantized into a staging buffer of the drive's, and that is stored as a put stores. */
static void qstore_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = kv_value_args(dev, qp, c, cls, t0, key, &klen, NULL);
    if (!b)
        return;
    const uint8_t *req, *src;
    uint64_t src_len;
    uint8_t *base = b->addr + c->buf_offset;
    if (!c->param0) {
        if (c->length < 64) {
            finish(dev, qp, cls, c->cid, SDE_SC_INVALID_FIELD, 0, 0, t0);
            return;
        }
        req = base;
        src = base + 64;
        src_len = c->length - 64;
    } else {
        sde_sqe r = {.buf = (uint32_t)(c->param0 >> 40),
                     .buf_offset = c->param0 & ((1ull << 40) - 1), .length = 64};
        struct dev_buf *rb = client_range(dev, &dev->qps[qp], &r);
        if (!rb) {
            finish(dev, qp, cls, c->cid, SDE_SC_INVALID_BUFFER, 0, 0, t0);
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
    int64_t r = dev->fw_entry.quantize(x->req, src, (int64_t)src_len, NULL,
                                                          0, info);
    uint16_t st = r != SDE_FW_E_OUT_SMALL ? fw_status(r < 0 ? r : SDE_FW_E_REQUEST)
                  : (uint64_t)info[SDE_FW_INFO_RAW] != src_len ? SDE_SC_KV_INVALID_VALUE_SIZE
                  : (uint64_t)info[SDE_FW_INFO_COMPRESSED] > st_max_value(dev->store)
                      ? SDE_SC_KV_INVALID_VALUE_SIZE : SDE_SC_SUCCESS;
    uint64_t size = (uint64_t)info[SDE_FW_INFO_COMPRESSED];
    uint32_t blk = st_block(dev->store);
    uint64_t nbytes = (size + blk - 1) / blk * blk;
    if (!st && !(x->bounce = bounce_alloc(nbytes)))
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

/* KV_RETRIEVE_DEQUANTIZED: the compressed block is read into a staging buffer, checked, and
 * dequantized straight into the client's buffer (no copy). */
static void dq_get_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    struct dev_buf *b = kv_value_args(dev, qp, c, cls, t0, key, &klen, NULL);
    if (!b)
        return;
    struct dev_ctx *x = compute_ctx(dev, qp, c, cls, CTX_DQ_GET, t0);
    if (!x)
        return;
    uint64_t off;
    uint16_t st = st_get_begin(dev->store, c->nsid, key, klen, &x->ext, &off, &x->vlen,
                               &x->vhash);
    if (st) {
        compute_fail(dev, x, st);
        return;
    }
    uint32_t blk = st_block(dev->store);
    uint64_t nbytes = (x->vlen + blk - 1) / blk * blk;
    x->bounce = bounce_alloc(nbytes);
    if (!x->bounce) {
        st_get_end(dev->store, x->ext);
        compute_fail(dev, x, SDE_SC_INTERNAL);
        return;
    }
    x->copy_to = b->addr + c->buf_offset;
    x->copy_len = c->length;
    x->in_off = off;
    x->in_len = x->vlen;
    if (dev->model && !dev->virtual_time) /* virtual time: at its turn (fw_job_done) */
        book_input(dev, x);
    value_start(dev, x, x->ext, x->bounce, -1, 1, 0, nbytes);
}

static void dq_read_done(sde_dev *dev, struct dev_ctx *x)
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

/* The prefix block sizes the drive hashes (hostlib/prefix_hash.py BLOCK_SIZES). */
static int prefix_block_size_ok(uint64_t t) { return t == 16 || t == 256 || t == 512; }

/* PREFIX_MATCH: the keys are probed here, against the store's index. */
static void prefix_match_now(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_buf *b = client_range(dev, &dev->qps[qp], c);
    uint16_t st = c->flags ? SDE_SC_INVALID_FIELD
                  : c->nsid && !ns_visible(dev, &dev->qps[qp], c->nsid)
                      ? SDE_SC_INVALID_NAMESPACE
                  : !b ? SDE_SC_INVALID_BUFFER
                  : !c->length || c->length % 16 ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
    if (!st && (!dev->fw || !dev->store))
        st = SDE_SC_INTERNAL;
    if (st) {
        finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    uint64_t n = c->length / 16;
    uint64_t h0 = now_ns();
    uint64_t hits = sde_store_prefix_match(dev->store, c->nsid, b->addr + c->buf_offset, n);
    uint64_t host = now_ns() - h0;
    double submit = model_submit(dev, c, t0);
    double done = charge(dev, SDE_KERNEL_PREFIX_MATCH,
                         sde_cost_prefix_match(hits + 1 < n ? hits + 1 : n), submit, host);
    uint64_t due, dtime;
    model_verdict(dev, submit, done, &due, &dtime);
    finish_at(dev, qp, cls, c->cid, SDE_SC_SUCCESS, hits, 0, t0, due, dtime);
}

/* PREFIX_MATCH_TOKENS: a 16-byte root key, then token ids (uint32); the chain of keys is
 * hashed on a firmware thread, then matched here. */
static void prefix_tokens_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_buf *b = client_range(dev, &dev->qps[qp], c);
    uint16_t st = c->flags ? SDE_SC_INVALID_FIELD
                  : c->nsid && !ns_visible(dev, &dev->qps[qp], c->nsid)
                      ? SDE_SC_INVALID_NAMESPACE
                  : !b ? SDE_SC_INVALID_BUFFER
                  : !prefix_block_size_ok(c->param0) || c->length < 16 || (c->length - 16) % 4
                      ? SDE_SC_INVALID_FIELD : SDE_SC_SUCCESS;
    uint64_t ntokens = st ? 0 : (c->length - 16) / 4;
    uint64_t nblocks = st ? 0 : ntokens / c->param0;
    if (st || !nblocks) {
        finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    struct dev_ctx *x = compute_ctx(dev, qp, c, cls, CTX_PM_TOKENS, t0);
    if (!x)
        return;
    x->nsid = c->nsid;
    x->bounce = bounce_alloc(nblocks * 16);
    if (!x->bounce) {
        compute_fail(dev, x, SDE_SC_INTERNAL);
        return;
    }
    uint8_t *base = b->addr + c->buf_offset;
    fw_submit(dev, x, SDE_FW_HASH, base + 16, (int64_t)ntokens, x->bounce,
              (int64_t)nblocks * 16, base, (int64_t)c->param0);
}

/* A firmware job is done: the command goes on. */
static void fw_job_done(sde_dev *dev, sde_fw_job *j)
{
    struct dev_ctx *x = &dev->ctx[j->owner];
    const int64_t *info = j->info;
    if (dev->model && dev->virtual_time) /* its turn: fetch order */
        book_input(dev, x);
    if (j->ret < 0) {
        if (j->ret == SDE_FW_E_OUT_SMALL && x->kind == CTX_DQ_GET)
            x->result = (uint64_t)info[SDE_FW_INFO_RAW]; /* how large a buffer it needs */
        kv_finish(dev, x, fw_status(j->ret), 0);
        return;
    }
    switch (x->kind) {
    case CTX_QSTORE: {
        sde_kernel_cost cost = sde_cost_quantize(
            (uint64_t)info[SDE_FW_INFO_ELEMENTS], (uint32_t)info[SDE_FW_INFO_ELEMENT_BYTES],
            (int)info[SDE_FW_INFO_KIND], (uint32_t)info[SDE_FW_INFO_GROUP], (uint64_t)j->ret);
        if (dev->model)
            x->ready = sde_recipe_q_kernel(&dev->budget, x->ready, x->sensed, x->pieces, cost,
                                           (double)j->host_ns, &x->first_out);
        else
            x->ready = x->first_out = charge(dev, SDE_KERNEL_QUANTIZE, cost, x->ready,
                                             j->host_ns);
        x->result = (uint64_t)j->ret; /* the compressed size */
        kv_put_value(dev, x, NULL, x->bounce, (uint64_t)j->ret, SDE_KV_STORE_ANY, -1, 1);
        return;
    }
    case CTX_DQ_GET: {
        double done = sde_recipe_dq_finish(
            dev->model, &dev->budget, x->ready, x->sensed, x->pieces,
            sde_cost_dequantize((uint64_t)info[SDE_FW_INFO_ELEMENTS],
                                (uint32_t)info[SDE_FW_INFO_ELEMENT_BYTES],
                                (int)info[SDE_FW_INFO_KIND], (uint32_t)info[SDE_FW_INFO_GROUP],
                                x->vlen),
            (double)j->host_ns, (uint64_t)j->ret);
        model_verdict(dev, x->msubmit, done, &x->due, &x->dtime);
        x->result = (uint64_t)j->ret;
        kv_finish(dev, x, SDE_SC_SUCCESS, (uint64_t)j->ret);
        return;
    }
    case CTX_PM_TOKENS: {
        uint64_t n = (uint64_t)j->ret;
        double hashed = charge(dev, SDE_KERNEL_PREFIX_HASH,
                               sde_cost_prefix_hash(n, (uint32_t)j->block_tokens),
                               x->msubmit, j->host_ns);
        uint64_t h0 = now_ns();
        uint64_t hits = sde_store_prefix_match(dev->store, x->nsid, x->bounce, n);
        double done = charge(dev, SDE_KERNEL_PREFIX_MATCH,
                             sde_cost_prefix_match(hits + 1 < n ? hits + 1 : n), hashed,
                             now_ns() - h0);
        model_verdict(dev, x->msubmit, done, &x->due, &x->dtime);
        x->result = hits;
        kv_finish(dev, x, SDE_SC_SUCCESS, 0);
        return;
    }
    default:
        kv_finish(dev, x, SDE_SC_INTERNAL, 0);
    }
}

static int start_now(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);

/* Virtual time: a command fetched behind compute commands starts now, its turn, timed from
 * the submission it had when fetched. */
static void start_deferred(sde_dev *dev, struct dev_ctx *x)
{
    sde_sqe c = x->sqe;
    int qp = x->qp, cls = x->cls;
    uint64_t t0 = x->t0;
    dev->resume_submit = x->msubmit;
    ctx_put(dev, x);
    dev->resuming = 1;
    start_now(dev, qp, &c, cls, t0);
    dev->resuming = 0;
}

static int reap_firmware(sde_dev *dev)
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
            kv_finish(dev, x, x->fw_status, 0);
        n++;
    }
    return n;
}

/* Every I/O of a KV command has ended. */
static void kv_io_done(sde_dev *dev, struct dev_ctx *x)
{
    int active = dev->qps[x->qp].active;
    if (x->piece + 1 < x->npieces && !x->io_failed && !x->no_memory) {
        /* a value in pieces: the next one (a retrieve's bounced tail of this one first) */
        if (x->kind == CTX_KV_GET && x->copy_len) {
            memcpy(x->copy_to, x->bounce, x->copy_len);
            x->copied += x->copy_len;
            x->copy_len = 0;
        }
        x->piece++;
        value_io(dev, x);
        if (x->nio)
            return;
    }
    if (x->kind == CTX_DQ_GET) {
        dq_read_done(dev, x);
        return;
    }
    if (x->kind == CTX_KV_PUT || x->kind == CTX_QSTORE) {
        if (x->io_failed || x->no_memory) {
            if (x->plan.early)
                st_put_abort_early(dev->store, &x->plan);
            else
                st_put_abort(dev->store, &x->plan);
            kv_finish(dev, x, x->no_memory ? SDE_SC_INTERNAL : SDE_SC_MEDIA_ERROR, 0);
            return;
        }
        free(x->bounce);
        x->bounce = NULL;
        uint64_t group;
        uint16_t st = x->plan.early ? st_put_apply(dev->store, &x->plan, &group)
                                    : st_put_commit(dev->store, &x->plan, &group);
        if (st) {
            kv_finish(dev, x, st, 0);
            return;
        }
        wait_commit(dev, x, group);
        return;
    }
    /* a retrieve */
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
    kv_finish(dev, x, st, st ? 0 : x->vlen);
}

/* resumed: it was held back, and is next for its key */
static void kv_delete_run(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0,
                          int resumed)
{
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    uint64_t group = 0;
    uint16_t st = kv_common(dev, &dev->qps[qp], c, key, &klen);
    if (!st && !resumed && key_busy(dev, c->nsid, key, klen)) {
        /* after the early put of its key (run again from the command when it may) */
        struct dev_ctx *x = ctx_take(dev, qp, c, cls, CTX_DEL_PARKED, t0);
        memcpy(x->key, key, sizeof(key));
        x->klen = klen;
        x->nsid = c->nsid;
        x->sqe = *c;
        park(dev, x);
        return;
    }
    if (!st)
        st = st_delete(dev->store, c->nsid, key, klen, &group);
    if (st) {
        finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return;
    }
    struct dev_ctx *x = ctx_take(dev, qp, c, cls, CTX_KV_DELETE, t0);
    /* an index change: the controller's command time (the extent's trim reaches the FTL
     * when the store frees it) */
    model_times(dev, c, t0, SDE_CMD_NOP, 0, 0, &x->due, &x->dtime);
    wait_commit(dev, x, group);
}

static void kv_delete_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    kv_delete_run(dev, qp, c, cls, t0, 0);
}

/* Resume the held-back commands whose key is free, in the order they came (one held back
 * for a key keeps the later ones for it waiting). */
static int unpark(sde_dev *dev)
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
        if (x->kind == CTX_DEL_PARKED) {
            sde_sqe c = x->sqe;
            int qp = x->qp, cls = x->cls;
            uint64_t t0 = x->t0;
            ctx_put(dev, x);
            kv_delete_run(dev, qp, &c, cls, t0, 1);
        } else {
            kv_put_value(dev, x, x->park_has_sqe ? &x->sqe : NULL, x->park_src, x->park_len,
                         x->park_mode, x->park_buf, x->park_staged);
        }
        n++;
        i = next;
    }
    return n;
}

static struct pin_rec *pin_find(sde_dev *dev, uint32_t client, uint32_t nsid,
                                const uint8_t *key, uint32_t klen)
{
    for (uint32_t i = 0; i < dev->npins; i++) {
        struct pin_rec *p = &dev->pins[i];
        if (p->client == client && p->nsid == nsid && p->klen == klen &&
            !memcmp(p->key, key, klen))
            return p;
    }
    return NULL;
}

static void pin_forget(sde_dev *dev, struct pin_rec *p)
{
    *p = dev->pins[--dev->npins];
}

/* PIN: the store's count goes up, and the client's own record of it. */
static uint16_t pin_add(sde_dev *dev, uint32_t client, uint32_t nsid, const uint8_t *key,
                        uint32_t klen, uint32_t *count)
{
    struct pin_rec *p = pin_find(dev, client, nsid, key, klen);
    if (!p && dev->npins == dev->cap_pins) {
        uint32_t cap = dev->cap_pins ? 2 * dev->cap_pins : 64;
        struct pin_rec *n = realloc(dev->pins, (uint64_t)cap * sizeof(*n));
        if (!n)
            return SDE_SC_INTERNAL;
        dev->pins = n;
        dev->cap_pins = cap;
    }
    uint16_t st = (uint16_t)sde_store_pin(dev->store, nsid, key, klen, 1, count);
    if (st)
        return st;
    if (!p) {
        p = &dev->pins[dev->npins++];
        memset(p, 0, sizeof(*p));
        p->client = client;
        p->nsid = nsid;
        p->klen = klen;
        memcpy(p->key, key, klen);
    }
    p->count++;
    return SDE_SC_SUCCESS;
}

/* UNPIN: only a pin of this client's own (another's is as if there were none). */
static uint16_t pin_drop(sde_dev *dev, uint32_t client, uint32_t nsid, const uint8_t *key,
                         uint32_t klen, uint32_t *count)
{
    struct pin_rec *p = pin_find(dev, client, nsid, key, klen);
    if (!p)
        return sde_store_exists(dev->store, nsid, key, klen) ? SDE_SC_KV_KEY_NOT_EXIST
                                                             : SDE_SC_INVALID_FIELD;
    uint16_t st = (uint16_t)sde_store_pin(dev->store, nsid, key, klen, -1, count);
    if (!st && --p->count == 0)
        pin_forget(dev, p);
    return st;
}

int sde_dev_release_pins(sde_dev *dev, uint32_t client)
{
    pthread_mutex_lock(&dev->lock);
    int n = 0;
    for (uint32_t i = 0; i < dev->npins;) {
        struct pin_rec *p = &dev->pins[i];
        if (p->client != client) {
            i++;
            continue;
        }
        for (uint32_t k = 0; k < p->count; k++) {
            uint32_t count;
            if (dev->store)
                sde_store_pin(dev->store, p->nsid, p->key, p->klen, -1, &count);
            n++;
        }
        pin_forget(dev, p); /* the last record moved here: look at slot i again */
    }
    pthread_mutex_unlock(&dev->lock);
    return n;
}

/* KV commands that need no media I/O: answered at once. */
static void kv_now(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen;
    uint16_t st = kv_common(dev, q, c, key, &klen);
    uint64_t result = 0, bytes = 0;
    switch (c->opcode) {
    case SDE_CMD_KV_EXIST:
        if (!st)
            st = (uint16_t)sde_store_exists(dev->store, c->nsid, key, klen);
        break;
    case SDE_CMD_PIN:
    case SDE_CMD_UNPIN: {
        uint32_t count = 0;
        if (!st && klen != 16)
            st = SDE_SC_KV_INVALID_KEY_SIZE; /* pins are for 16-byte block keys */
        if (!st)
            st = c->opcode == SDE_CMD_PIN
                     ? pin_add(dev, q->client, c->nsid, key, klen, &count)
                     : pin_drop(dev, q->client, c->nsid, key, klen, &count);
        result = count;
        break;
    }
    case SDE_CMD_KV_LIST: {
        /* key length 0: from the first key */
        if (st == SDE_SC_KV_INVALID_KEY_SIZE && c->param1 == 0 && !c->flags)
            st = SDE_SC_SUCCESS;
        struct dev_buf *b = st ? NULL : client_range(dev, q, c);
        if (!st && !b)
            st = SDE_SC_INVALID_BUFFER;
        if (!st) {
            int n = sde_store_list(dev->store, c->nsid, key, klen,
                                   b->addr + c->buf_offset, c->length / SDE_LIST_ENTRY);
            if (n < 0) {
                st = SDE_SC_INTERNAL;
            } else {
                result = (uint64_t)n;
                bytes = (uint64_t)n * SDE_LIST_ENTRY;
                dev->stats.cls[cls].bytes_copied += bytes; /* made here, copied out */
            }
        }
        break;
    }
    default:
        st = SDE_SC_INVALID_OPCODE;
    }
    finish(dev, qp, cls, c->cid, st, st ? 0 : result, bytes, t0);
}

/* Fault injection: whether a rule failed the command (its completion posted); a latency
 * rule leaves a delay for finish_at.  Only commands on namespaces the client may use are
 * looked at: a fault must not tell a client that another's namespace exists. */
static int inject_fault(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    uint32_t dir;
    switch (c->opcode) {
    case SDE_CMD_READ:
    case SDE_CMD_KV_RETRIEVE:
    case SDE_CMD_KV_RETRIEVE_DEQUANTIZED:
        dir = SDE_FAULT_DIR_READ;
        break;
    case SDE_CMD_WRITE:
    case SDE_CMD_KV_STORE:
    case SDE_CMD_KV_STORE_QUANTIZED:
        dir = SDE_FAULT_DIR_WRITE;
        break;
    default:
        return 0;
    }
    if (c->nsid && !ns_visible(dev, &dev->qps[qp], c->nsid))
        return 0;
    int block = c->opcode == SDE_CMD_READ || c->opcode == SDE_CMD_WRITE;
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen = block ? 0 : kv_key(c, key);
    uint64_t extra = 0;
    uint16_t st = sde_fault_check(&dev->faults, dir, c->nsid, block ? c->lba : 0,
                                  block ? (c->length + dev->lba - 1) / dev->lba : 0, key, klen,
                                  &extra);
    if (st || extra)
        dev->stats.faults_injected++;
    if (extra) {
        if (dev->ndelays < 4096) {
            if (!dev->delays)
                dev->delays = malloc(4096 * sizeof(*dev->delays));
            if (dev->delays)
                dev->delays[dev->ndelays++] = (struct delay){qp, c->cid, extra};
        }
    }
    if (!st)
        return 0;
    finish(dev, qp, cls, c->cid, st, 0, 0, t0);
    return 1;
}

int sde_dev_fault_add(sde_dev *dev, const sde_fault_rule *r, uint64_t seed)
{
    pthread_mutex_lock(&dev->lock);
    int id = sde_fault_add(&dev->faults, r, seed);
    pthread_mutex_unlock(&dev->lock);
    return id;
}

int sde_dev_fault_clear(sde_dev *dev, uint32_t id)
{
    pthread_mutex_lock(&dev->lock);
    int n = sde_fault_clear(&dev->faults, id);
    pthread_mutex_unlock(&dev->lock);
    return n;
}

void sde_dev_faults(sde_dev *dev, sde_faults *out)
{
    pthread_mutex_lock(&dev->lock);
    *out = dev->faults;
    pthread_mutex_unlock(&dev->lock);
}

/* Virtual time: whether a command joins the FIFO of compute commands when it is not empty
 * (every command the model times that is not one: those join it at once; admin commands
 * are not timed). */
static int booked_in_turn(uint8_t opcode)
{
    switch (opcode) {
    case SDE_CMD_KV_STORE_QUANTIZED:
    case SDE_CMD_KV_RETRIEVE_DEQUANTIZED:
    case SDE_CMD_PREFIX_MATCH_TOKENS:
        return 0;
    default:
        return sde_dev_opcode_where(opcode) != SDE_RUN_HOST;
    }
}

/* Start one command fetched from queue pair qp.  Returns 1 if it went to the engine. */
/* t0: when it was fetched (one clock read for the commands fetched together) */
static int start_command(sde_dev *dev, int qp, const sde_sqe *c, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    int cls = class_of(c->opcode);
    q->inflight++;
    if (++*q->client_inflight > dev->stats.client_inflight_peak)
        dev->stats.client_inflight_peak = *q->client_inflight;
    if (dev->faults.n && inject_fault(dev, qp, c, cls, t0))
        return 0;
    if (dev->virtual_time && dev->fw_head != NO_CTX && booked_in_turn(c->opcode)) {
        /* compute commands fetched before it are booked at their turns (their kernels
         * end in host order): so is it, so that the model books every command in fetch
         * order whatever this host's scheduling */
        struct dev_ctx *x = ctx_take(dev, qp, c, cls, CTX_DEFERRED, t0);
        x->sqe = *c;
        x->msubmit = model_submit(dev, c, t0);
        x->fw_state = FW_DEFERRED;
        fifo_append(dev, x);
        dev->stats.deferred++;
        return 0;
    }
    return start_now(dev, qp, c, cls, t0);
}

/* start_command's second half: the command, now. */
static int start_now(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    uint64_t off = 0;
    struct dev_buf *b = NULL;
    uint16_t st;
    switch (c->opcode) {
    case SDE_CMD_NOP: {
        uint64_t due, dtime;
        model_times(dev, c, t0, SDE_CMD_NOP, 0, 0, &due, &dtime);
        finish_at(dev, qp, cls, c->cid, SDE_SC_SUCCESS, 0, 0, t0, due, dtime);
        return 0;
    }
    case SDE_CMD_READ:
    case SDE_CMD_WRITE:
        st = check_block(dev, q, c, 1, &off, &b);
        break;
    case SDE_CMD_FLUSH:
        st = c->nsid && !ns_visible(dev, q, c->nsid) ? SDE_SC_INVALID_NAMESPACE
                                                     : SDE_SC_SUCCESS;
        break;
    case SDE_CMD_WRITE_ZEROES:
    case SDE_CMD_DEALLOCATE:
        st = check_block(dev, q, c, 0, &off, &b);
        if (st == SDE_SC_SUCCESS && dev->undo &&
            sde_undo_save(dev->undo, NULL, off, c->length, SDE_UNDO_BLOCK, 1) < 0)
            dev->stats.undo_failures++;
        if (st == SDE_SC_SUCCESS)
            st = zero_range(dev, c->opcode, off, c->length);
        if (st == SDE_SC_SUCCESS && c->opcode == SDE_CMD_DEALLOCATE && dev->model)
            sde_model_trim(dev->model, off, c->length); /* the FTL forgets the range */
        finish(dev, qp, cls, c->cid, st, st ? 0 : c->length, c->length, t0);
        return 0;
    case SDE_CMD_KV_STORE:
    case SDE_CMD_KV_RETRIEVE:
    case SDE_CMD_KV_DELETE:
    case SDE_CMD_KV_EXIST:
    case SDE_CMD_KV_LIST:
    case SDE_CMD_PIN:
    case SDE_CMD_UNPIN:
        if (!dev->store) {
            finish(dev, qp, cls, c->cid, SDE_SC_INTERNAL, 0, 0, t0);
            return 0;
        }
        if (c->opcode == SDE_CMD_KV_STORE)
            kv_put_start(dev, qp, c, cls, t0);
        else if (c->opcode == SDE_CMD_KV_RETRIEVE)
            kv_get_start(dev, qp, c, cls, t0);
        else if (c->opcode == SDE_CMD_KV_DELETE)
            kv_delete_start(dev, qp, c, cls, t0);
        else
            kv_now(dev, qp, c, cls, t0);
        return 0;
    case SDE_CMD_KV_STORE_QUANTIZED:
        qstore_start(dev, qp, c, cls, t0);
        return 0;
    case SDE_CMD_KV_RETRIEVE_DEQUANTIZED:
        dq_get_start(dev, qp, c, cls, t0);
        return 0;
    case SDE_CMD_PREFIX_MATCH:
        prefix_match_now(dev, qp, c, cls, t0);
        return 0;
    case SDE_CMD_PREFIX_MATCH_TOKENS:
        prefix_tokens_start(dev, qp, c, cls, t0);
        return 0;
    default:
        /* admin commands run on the host side (Python: the control plane) */
        if (sde_dev_opcode_where(c->opcode) == SDE_RUN_HOST &&
            dev->admin_tail - dev->admin_head < ADMIN_CAP) {
            sde_admin_cmd *a = &dev->admin[dev->admin_tail++ % ADMIN_CAP];
            a->qp = qp;
            a->client = q->client;
            a->t0_ns = t0;
            a->sqe = *c;
            kick(dev->admin_fd);
            return 0;
        }
        finish(dev, qp, cls, c->cid,
               cls == SDE_CLASS_INVALID ? SDE_SC_INVALID_OPCODE : SDE_SC_INTERNAL, 0, 0, t0);
        return 0;
    }
    if (st != SDE_SC_SUCCESS) {
        finish(dev, qp, cls, c->cid, st, 0, 0, t0);
        return 0;
    }
    struct dev_ctx *x = &dev->ctx[dev->free_ctx[--dev->nfree]];
    memset(&x->io, 0, sizeof(x->io));
    x->kind = CTX_BLOCK;
    x->used = 1;
    x->qp = qp;
    x->cid = c->cid;
    x->cls = (uint8_t)cls;
    x->t0 = t0;
    x->bounce = NULL;
    x->io.user_data = (uint64_t)(x - dev->ctx);
    x->io.buf_index = -1;
    x->flush_id = 0;
    model_times(dev, c, t0, c->opcode, off, c->length, &x->due, &x->dtime);
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
            if (posix_memalign((void **)&x->bounce, 4096, c->length)) {
                x->used = 0;
                dev->free_ctx[dev->nfree++] = (uint32_t)(x - dev->ctx);
                finish(dev, qp, cls, c->cid, SDE_SC_INTERNAL, 0, 0, t0);
                return 0;
            }
            if (c->opcode == SDE_CMD_WRITE) {
                memcpy(x->bounce, x->client_addr, c->length);
                dev->stats.cls[cls].bytes_copied += c->length;
            }
            x->io.addr = (uint64_t)(uintptr_t)x->bounce;
        } else {
            x->io.addr = (uint64_t)(uintptr_t)x->client_addr;
            x->io.buf_index = (int16_t)(c->buf - 1);
        }
    }
    queue_media(dev, &x->io, SDE_UNDO_BLOCK); /* room is guaranteed: contexts == depth */
    return 1;
}

static int reap_engine(sde_dev *dev)
{
    sde_io *done[64];
    int n = sde_reap(dev->eng, done, 64, 0);
    for (int i = 0; i < n; i++) {
        uint64_t ud = done[i]->user_data;
        if (dev->undo && done[i]->op == SDE_OP_WRITE)
            sde_undo_done(dev->undo, done[i]);
        if (ud >= UD_JOURNAL_LAST && ud <= UD_JOURNAL) {
            journal_io_done(dev, done[i]);
            continue;
        }
        struct dev_ctx *x = &dev->ctx[ud & 0xffffffffu];
        if (x->kind != CTX_BLOCK) {
            sde_io *io = done[i];
            if (io->res < 0 || (uint32_t)io->res != io->len)
                x->io_failed = 1;
            if (--x->nio == 0)
                kv_io_done(dev, x);
            continue;
        }
        uint16_t st = SDE_SC_SUCCESS;
        if (x->io.res < 0 || (x->io.op != SDE_OP_FSYNC && (uint32_t)x->io.res != x->io.len))
            st = SDE_SC_MEDIA_ERROR;
        if (x->bounce) {
            if (st == SDE_SC_SUCCESS && x->io.op == SDE_OP_READ && dev->qps[x->qp].active) {
                memcpy(x->client_addr, x->bounce, x->io.len);
                dev->stats.cls[x->cls].bytes_copied += x->io.len;
            }
            free(x->bounce);
            x->bounce = NULL;
        }
        uint64_t bytes = x->io.op == SDE_OP_FSYNC ? 0 : x->io.len;
        if (x->flush_id && st == SDE_SC_SUCCESS)
            sde_undo_flush_done(dev->undo, x->flush_id);
        finish_at(dev, x->qp, x->cls, x->cid, st, st ? 0 : bytes, bytes, x->t0, x->due,
                  x->dtime);
        x->used = 0;
        dev->free_ctx[dev->nfree++] = (uint32_t)(x - dev->ctx);
    }
    return n < 0 ? 0 : n;
}

/* Power-cut emulation: a checkpoint synced the media (what had completed is durable), and a
 * write cache past its size destages (a sync), as a real one drains on its own. */
static void undo_housekeeping(sde_dev *dev)
{
    uint64_t ck = dev->store ? st_checkpoints(dev->store) : 0;
    if (ck != dev->undo_ckpts) {
        dev->undo_ckpts = ck;
        sde_undo_synced(dev->undo);
    }
    if (sde_undo_bytes(dev->undo) > dev->undo_cap && fdatasync(dev->media_fd) == 0) {
        sde_undo_synced(dev->undo);
        dev->stats.cache_destages++;
    }
}

int sde_dev_set_power_cut(sde_dev *dev, uint64_t cache_bytes)
{
    pthread_mutex_lock(&dev->lock);
    int r = 0;
    if (!dev->undo && !(dev->undo = sde_undo_new(dev->media_fd, dev->lba)))
        r = -ENOMEM;
    dev->undo_cap = cache_bytes;
    dev->undo_ckpts = dev->store ? st_checkpoints(dev->store) : 0;
    pthread_mutex_unlock(&dev->lock);
    return r;
}

int sde_dev_power_cut(sde_dev *dev, uint64_t seed, sde_cut_result *out)
{
    pthread_mutex_lock(&dev->lock);
    int r = dev->undo ? sde_undo_cut(dev->undo, seed, out) : -EINVAL;
    pthread_mutex_unlock(&dev->lock);
    return r;
}

/* One pass over every queue pair.  Returns the work done. */
static int pass(sde_dev *dev)
{
    int work = 0;
    sde_sqe batch[FETCH_BATCH];
    dev->hold_writes = 1;
    for (int qp = 0; qp < dev->qp_hi; qp++) {
        struct dev_qp *q = &dev->qps[qp];
        if (!q->active)
            continue;
        int space = sde_cq_space(&q->v);
        if (space < 0 || !sde_sq_pending(&q->v) || dev->nfree == 0)
            goto check_broken;
        /* fetch no more than can complete: CQ room not yet promised, free contexts, and
         * the client's quota of commands in flight (so that one client cannot hold every
         * context and starve the others: its commands wait in its SQ, not fetched) */
        int room = space - (int)q->inflight;
        if (dev->max_client_inflight) {
            int quota = (int)dev->max_client_inflight - (int)*q->client_inflight;
            if (quota <= 0) {
                dev->stats.quota_waits++;
                continue;
            }
            if (room > quota)
                room = quota;
        }
        if (room > FETCH_BATCH)
            room = FETCH_BATCH;
        if (room > (int)dev->nfree)
            room = (int)dev->nfree;
        if (room <= 0)
            continue;
        int k = sde_sq_fetch(&q->v, batch, (uint32_t)room);
        if (k < 0)
            goto broken;
        uint64_t t0 = now_ns();
        for (int i = 0; i < k; i++)
            start_command(dev, qp, &batch[i], t0);
        work += k;
        continue;
    check_broken:
        if (space >= 0)
            continue;
    broken:
        /* the client broke the ring protocol: stop its queue, keep serving the rest */
        dev->stats.broken_queues++;
        sde_sq_set_dead(&q->v);
        q->active = 0;
        qp_done(q, q->nstage);
        q->nstage = 0;
        kick(q->cfd);
    }
    work += reap_firmware(dev); /* puts of quantized blocks queue their writes */
    /* the records of the puts started here (early puts) go out ahead of their values: on
     * media that serve writes in order (mem:, one io-wq worker) a put then completes with
     * its own value, not with the last value of its group */
    if (journal_kick(dev))
        work++;
    release_writes(dev);
    sde_submit_queued(dev->eng);
    work += reap_engine(dev);
    if (journal_kick(dev)) {
        work++;
        sde_submit_queued(dev->eng);
    }
    if (dev->undo)
        undo_housekeeping(dev);
    work += complete_committed(dev, 0);
    if (dev->park_head != NO_CTX)
        work += unpark(dev);
    if (dev->nheld)
        work += release_due(dev, now_ns());
    for (int qp = 0; qp < dev->qp_hi; qp++)
        if (dev->qps[qp].nstage)
            flush_stage(&dev->qps[qp]);
    return work;
}

/* Sleep until an I/O completion, a doorbell kick, or (timeout_ns > 0) that much time.  First
 * tell every client to kick the doorbell, then look once more (the other half of the
 * handshake is theirs); then serve what woke us. */
static int sleep_and_serve(sde_dev *dev, volatile int *stop, uint64_t timeout_ns)
{
    pthread_mutex_lock(&dev->lock);
    int pending = 0;
    for (int qp = 0; qp < dev->qp_hi; qp++)
        if (dev->qps[qp].active)
            pending |= sde_sq_prepare_sleep(&dev->qps[qp].v);
    int armed = pending ? 0 : sde_engine_arm_poll(dev->eng, dev->doorbell);
    pthread_mutex_unlock(&dev->lock);
    if (armed < 0)
        return armed;
    if (!pending && !*stop) {
        dev->stats.sleeps++;
        /* I/O completions and doorbell kicks both end this wait; only this thread waits on
         * the engine, so the lock is not held while blocked */
        int r = timeout_ns ? sde_engine_wait_timeout(dev->eng, timeout_ns)
                           : sde_engine_wait(dev->eng);
        if (r < 0 && r != -ETIME)
            return r;
    }
    pthread_mutex_lock(&dev->lock);
    pass(dev); /* consumes the poll's completion too */
    if (sde_engine_take_poll(dev->eng)) {
        uint64_t v;
        if (read(dev->doorbell, &v, sizeof(v)) > 0)
            dev->stats.wakeups++;
    }
    for (int qp = 0; qp < dev->qp_hi; qp++)
        if (dev->qps[qp].active)
            sde_sq_clear_wakeup(&dev->qps[qp].v);
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

int sde_dev_run(sde_dev *dev, volatile int *stop, uint64_t spin_ns)
{
    uint64_t idle_since = 0; /* 0: the last pass did work (the clock is read only when idle) */
    while (!*stop) {
        pthread_mutex_lock(&dev->lock);
        int work = pass(dev);
        uint64_t next_due = dev->nheld ? dev->held[0].due : 0;
        pthread_mutex_unlock(&dev->lock);
        if (work) {
            idle_since = 0;
            continue;
        }
        uint64_t t = now_ns();
        if (!idle_since)
            idle_since = t;
        uint64_t timeout = 0;
        if (next_due) {
            /* completions wait for their modelled time: poll up to it when it is near,
             * else sleep no longer than that */
            if (next_due <= t + 20000) {
                __builtin_ia32_pause();
                continue;
            }
            timeout = next_due - t - 10000;
        } else if (t - idle_since < spin_ns) {
            __builtin_ia32_pause();
            continue;
        }
        int r = sleep_and_serve(dev, stop, timeout);
        if (r < 0)
            return r;
        idle_since = 0;
    }
    /* stopping: let the media I/O in flight end (the journal group among it), so that the
     * store can be flushed and closed */
    for (;;) {
        pthread_mutex_lock(&dev->lock);
        uint32_t left = sde_inflight(dev->eng) + (dev->fw ? sde_fw_pending(dev->fw) : 0);
        if (left)
            pass(dev);
        pthread_mutex_unlock(&dev->lock);
        if (!left)
            break;
        __builtin_ia32_pause();
    }
    return 0;
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

/* ---- admin commands, handled by Python --------------------------------------------------- */

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
        int cls = class_of((uint8_t)opcode);
        dev->stats.cls[cls].bytes_copied += bytes_copied;
        uint64_t dtime = cqe->device_time_ns;
        uint64_t due = dtime && dev->model && !dev->virtual_time ? t0_ns + dtime : 0;
        finish_at(dev, qp, cls, cqe->cid, cqe->status, cqe->result, bytes, t0_ns, due, dtime);
        flush_stage(&dev->qps[qp]);
        ret = 0;
    }
    pthread_mutex_unlock(&dev->lock);
    if (ret == 0 && dev->nheld)
        kick(dev->doorbell); /* the data plane may sleep with no timeout: it must see this */
    return ret;
}

/* ---- the firmware and its budget ------------------------------------------------------ */

int sde_dev_set_firmware(sde_dev *dev, uint64_t quantize, uint64_t dequantize,
                         uint64_t hash_chain, uint32_t threads, const sde_budget *budget)
{
    /* the budget as the profile built it (ssdemu.timing.budget_of), idle */
    if (!budget || !budget->units || budget->units > SDE_MAX_UNITS)
        return -EINVAL;
    sde_budget b = *budget;
    int r;
    sde_fw_entry e = {(sde_fw_quantize_fn)(uintptr_t)quantize,
                      (sde_fw_dequantize_fn)(uintptr_t)dequantize,
                      (sde_fw_hash_fn)(uintptr_t)hash_chain};
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
        share_dram(dev);
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
