/*
 * The device core's private header: what the files of c/dev share (the device's state,
 * its command contexts, and the functions one file calls in another).  The public
 * interface is sde_dev.h.
 *
 * The device core (see sde_dev.h).  One lock guards the tables; the data plane holds it
 * while it works through one pass over the queues, the control plane (Python) takes it for
 * each change.  Commands that need the media go through the io_uring engine; each in-flight
 * command owns a context (its sde_io, its queue pair and command id, a bounce buffer).
 */
#ifndef DEV_INTERNAL_H
#define DEV_INTERNAL_H

#include "sde_dev.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
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
#include "sde_time.h"

#define ADMIN_CAP 4096
#define FETCH_BATCH 64

#define STAGE 64

/* the epoll data of the device's own doorbell (a queue pair's is its index) */
#define DEV_OWN_DOORBELL ((uint32_t)SDE_MAX_QPS)

struct dev_qp {
    int in_use;     /* slot taken (until inactive and drained) */
    int active;     /* serving */
    uint32_t client;
    uint32_t uid;   /* the client's owner identity: uid and token (0: none) */
    uint64_t token;
    int admin;      /* its client is an admin (may force a delete anywhere) */
    int cfd;        /* the client's completion eventfd */
    int dbfd;       /* its doorbell: an eventfd of this queue pair alone (-1: removed) */
    uint32_t inflight; /* fetched, not yet posted (staged completions count) */
    uint32_t *uid_inflight; /* the same, summed over every queue pair of its uid */
    uint32_t owner;         /* its owner's counters: dev->owners[owner] */
    uint32_t nstage;
    uint32_t seen_cq_head; /* its client's cq_head at the idle data plane's last look */
    uint64_t *client_kicks; /* the device's count of completion kicks (dev->stats) */
    sde_qp_view v;
    sde_cqe stage[STAGE]; /* completions of this dev_pass, posted together: one fence, one kick */
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
    /* compute commands: their kernels run on the firmware's threads (c/fw/sde_fw.h) */
    CTX_QSTORE = 4,    /* KV_STORE_QUANTIZED: quantize, then store as a put does */
    CTX_DQ_GET = 5,    /* KV_RETRIEVE_DEQUANTIZED: read, then dequantize into the client */
    CTX_PM_TOKENS = 6, /* PREFIX_MATCH_TOKENS: hash the chain, then match */
    CTX_DEL_PARKED = 7, /* a KV_DELETE held back: an early put of its key is in flight */
    CTX_DEFERRED = 8,   /* virtual time: a command fetched behind compute commands, started
                         * at its turn (sqe, msubmit) */
    CTX_RQ_READ = 9,    /* KV_REQUANTIZE: the stored block read, then requantized */
    CTX_RQ_PUT = 10,    /* ... its output stored as a put, if the key is unchanged */
    CTX_NKINDS
};

struct dev_ctx {
    sde_io io;
    sde_io io2;      /* a KV value's last partial block, through a bounce */
    int qp;
    uint16_t cid;
    uint8_t cls;
    uint8_t used;
    uint8_t kind;
    uint8_t op;      /* its opcode: its row of the opcode table (dev_ops.c) */
    uint8_t nio;     /* I/Os of this command in flight */
    uint8_t io_failed;  /* a media I/O of it failed: MEDIA_ERROR */
    uint8_t no_memory;  /* no bounce for it: INTERNAL */
    uint64_t t0;
    uint64_t serial; /* when it was taken (sde_dev_ctx_mark): deletes wait for older ones */
    uint8_t *bounce;     /* this command's own buffer (dev_bounce.c), and its size */
    uint64_t bounce_cap;
    uint8_t *spare;      /* the context's last one, kept for the next command, and its size */
    uint64_t spare_cap;
    uint8_t *client_addr;
    uint64_t due;    /* real time: post no earlier than this (monotonic ns); 0: at once */
    uint64_t dtime;  /* the CQE's device time (modelled); 0: the measured latency */
    /* KV commands */
    st_put_plan plan;
    uint32_t ext;
    uint64_t vlen, vhash;
    uint8_t vhash_known; /* a put: vhash is its value's, made as its batch was fetched */
    uint8_t expecting;   /* a put only if the key still holds `expect` (a requantize's) */
    st_expect expect;
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
 * them) and go when it does (sde_dev_release_pins), or when a forced delete takes the key. */
struct pin_rec {
    uint32_t client;
    uint32_t uid;
    uint32_t nsid;
    uint32_t klen;
    uint8_t key[SDE_KEY_MAX];
    uint32_t count;   /* 0: a free slot */
    uint32_t next;    /* its hash chain (or the free list) */
};

/* Every client's pins, hashed on (namespace, key) (dev_pins.c). */
struct pin_table {
    struct pin_rec *recs;
    uint32_t nrecs, cap;    /* slots used so far, and allocated */
    uint32_t *heads;        /* chains, nheads a power of two (0: none yet) */
    uint32_t nheads;
    uint32_t free;          /* free slots, chained by next */
    uint32_t live;          /* records (client, key) */
    uint64_t total;         /* pins, over every record */
    struct { uint32_t uid, n; } uids[SDE_MAX_QPS]; /* pinned keys per uid */
    uint32_t nuids;
    uint32_t max_per_uid;   /* 0: no quota */
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
    int doorbell; /* the device's own doorbell: the firmware's threads and Python kick it */
    /* every doorbell (the device's and each queue pair's), level-triggered: the data plane
     * sleeps on this set, never on a descriptor a client holds, so that a client reading
     * its doorbell can take only its own kicks */
    int epfd;
    int admin_fd;
    struct dev_qp qps[SDE_MAX_QPS];
    /* in-flight commands per uid: the quota is a uid's, so that more connections (or owner
     * keys) of one user do not take more of the device */
    struct { uint32_t uid, inflight; } uids[SDE_MAX_QPS];
    uint32_t max_uid_inflight; /* 0: no quota */
    uint64_t ctx_serial; /* contexts taken so far */
    /* per-owner class counters, for as long as the device runs (owners come back) */
    struct { uint32_t uid; uint64_t token; sde_class_stats cls[9]; } *owners;
    uint32_t nowners;
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
    uint64_t bounce_kept; /* bytes of the contexts' spare buffers (dev_bounce.c) */
    uint32_t *free_ctx;
    uint32_t nfree;
    sde_admin_cmd *admin;
    uint32_t admin_head, admin_tail;
    /* retrieval commands (TOPK_PAGES, ATTEND), for the daemon's retrieval workers: they
     * wait on retr_fd (a semaphore eventfd: one wakes per command) and pop them here, so
     * that no other thread hands them over (the control plane's hand-over cost a second
     * thread wake-up: 135 us a command from receipt to a worker on a 2-vCPU VM) */
    sde_admin_cmd *retr;
    uint32_t retr_head, retr_tail;
    int retr_fd;
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
    struct pin_table pins;
    sde_fw *fw;
    sde_fw_entry fw_entry;
    /* value writes queued while a pass starts commands, held until the pass's journal group
     * is queued ahead of them (hold_writes set): see pass */
    sde_io **vwrites;
    uint32_t nvwrites;
    int hold_writes;
    /* the batch being started (dev_kv_prefetch): the content hashes of its small puts'
     * values, by position (pf_mask: which), valid only while its commands start */
    uintptr_t pf_batch;
    int pf_n;
    uint64_t pf_mask;
    uint64_t pf_hash[FETCH_BATCH];
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
static inline void qp_done(struct dev_qp *q, uint32_t n)
{
    q->inflight -= n;
    *q->uid_inflight -= n;
}

static inline void kick(int fd)
{
    uint64_t one = 1;
    ssize_t r = write(fd, &one, sizeof(one));
    (void)r; /* EAGAIN only when the counter is saturated: the reader is awake anyway */
}
/* ---- the opcode table (dev_ops.c) ---------------------------------------------------------
 * One row per opcode, as the kernel's io_issue_defs[]: what the data plane does with a
 * command is its row.  Adding an opcode is its row, its start (and, for a firmware kernel,
 * its kernel_done) in the file of its kind, its hostlib call and its docs line. */

/* Starts a command: validates it against the client's own namespaces and buffers, then
 * completes it (dev_finish) or hands it on (the engine, the store, the firmware). */
typedef void (*dev_start_fn)(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
/* A compute command's kernel is back from the firmware, successful (failures complete the
 * command before). */
typedef void (*dev_kernel_done_fn)(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j);

struct dev_op {
    uint8_t op;
    uint8_t cls;         /* SDE_CLASS_*: its counters in the log page */
    uint8_t where;       /* SDE_RUN_DATA_PLANE, or SDE_RUN_HOST (the control plane, Python) */
    uint8_t fault_dir;   /* the fault rules that can fail it: SDE_FAULT_DIR_*, 0 for none */
    uint8_t in_turn;     /* virtual time: waits behind compute commands fetched before it */
    uint8_t needs_store; /* refused with INTERNAL while no store is attached */
    uint8_t keyed;       /* names a key in the SQE (lba, key_hi) that the index looks up */
    dev_start_fn start;
    dev_kernel_done_fn kernel_done; /* NULL: no firmware kernel */
    const char *name;
};

/* The row of an opcode, or NULL when there is none. */
const struct dev_op *dev_op(uint32_t op);

/* The rows' handlers, by file. */
void dev_nop_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_counters_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_block_io_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_zero_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_admin_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_retrieval_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_kv_exist_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_kv_list_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_pin_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_qstore_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j);
void dev_dq_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j);
void dev_pm_tokens_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j);

/* ---- the context kinds (dev_kinds.c) --------------------------------------------------
 * What carries a command on, by its context's kind: the one place the data plane branches
 * on it. */
struct dev_kind {
    const char *name;
    /* one of its media I/Os is back (the engine's completion) */
    void (*media_done)(sde_dev *dev, struct dev_ctx *x, sde_io *io);
    /* every I/O of its value has ended */
    void (*value_done)(sde_dev *dev, struct dev_ctx *x);
    /* held back behind an early put of its key, its turn now */
    void (*resume)(sde_dev *dev, struct dev_ctx *x);
    /* virtual time, a compute command: its input's arrival booked at its turn */
    void (*book_input)(sde_dev *dev, struct dev_ctx *x);
    /* a put's device time once its placement is known (wrote: its bytes go to NAND at off) */
    void (*put_timing)(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, int wrote,
                       uint64_t off, uint64_t len);
    uint8_t stores_value;     /* a put: its completion counts the value's bytes */
    uint8_t result_existed;   /* its result says whether the key existed (KV_STORE) */
    uint8_t copies_out;       /* a value's bounced tail copied to the client piece by piece */
    uint8_t reports_raw_size; /* a kernel's OUT_SMALL: the result is the buffer it needs */
};
const struct dev_kind *dev_kind(const struct dev_ctx *x);

/* ---- functions shared between the files of c/dev, bottom up ---------------------------
 * Shared machinery first (contexts, arguments, finishing, the model's glue, media), then the
 * command families, then the loop and the device's lifecycle: a file calls only files above
 * it in this list (tests/test_c_shape.py checks the call graph). */

/* dev_finish.c */
void dev_flush_stage(struct dev_qp *q);
int dev_release_due(sde_dev *dev, uint64_t now);
/* Bytes the daemon copied for a command (the bounce path): the device's and its owner's. */
void dev_copied(sde_dev *dev, int qp, int cls, uint64_t bytes);
void dev_finish_at(sde_dev *dev, int qp, int cls, uint16_t cid, uint16_t status,
                   uint64_t result, uint64_t bytes, uint64_t t0, uint64_t due, uint64_t dtime);
void dev_finish(sde_dev *dev, int qp, int cls, uint16_t cid, uint16_t status,
                uint64_t result, uint64_t bytes, uint64_t t0);

/* dev_bounce.c: a command's own buffer of at least n bytes, page-aligned, as x->bounce (NULL:
 * no memory); drop gives it back to the context (the last one kept for its next command). */
uint8_t *dev_bounce_take(sde_dev *dev, struct dev_ctx *x, uint64_t n);
void dev_bounce_drop(sde_dev *dev, struct dev_ctx *x);
void dev_bounce_free_all(sde_dev *dev, struct dev_ctx *x);

/* dev_ctx.c */
uint32_t dev_ctx_index(sde_dev *dev, struct dev_ctx *x);
struct dev_ctx *dev_ctx_take(sde_dev *dev, int qp, const sde_sqe *c, int cls, int kind,
                             uint64_t t0);
void dev_ctx_put(sde_dev *dev, struct dev_ctx *x);
void dev_ctx_finish(sde_dev *dev, struct dev_ctx *x, uint16_t status, uint64_t bytes);

/* dev_args.c */
int dev_ns_visible(const sde_dev *dev, const struct dev_qp *q, uint32_t nsid);
/* a KV command's key length (param1), or 0 when it is not 1..SDE_KEY_MAX */
uint32_t dev_key_len(const sde_sqe *c);
uint32_t dev_kv_key(const sde_sqe *c, uint8_t key[SDE_KEY_MAX]);
struct dev_buf *dev_client_range(sde_dev *dev, struct dev_qp *q, const sde_sqe *c);
uint16_t dev_kv_common(const sde_dev *dev, const struct dev_qp *q, const sde_sqe *c,
                       uint8_t key[SDE_KEY_MAX], uint32_t *klen);
struct dev_buf *dev_kv_value_args(sde_dev *dev, int qp, const sde_sqe *c, int cls,
                                  uint64_t t0, uint8_t key[SDE_KEY_MAX], uint32_t *klen,
                                  uint16_t (*more)(sde_dev *, const sde_sqe *));

/* dev_timing.c */
double dev_model_submit(sde_dev *dev, const sde_sqe *c, uint64_t t0);
void dev_model_verdict(sde_dev *dev, double submit, double done, uint64_t *due,
                       uint64_t *dtime);
void dev_model_times(sde_dev *dev, const sde_sqe *c, uint64_t t0, uint32_t op,
                     uint64_t off, uint64_t nbytes, uint64_t *due, uint64_t *dtime);
void dev_share_dram(sde_dev *dev);

/* dev_media.c */
void dev_queue_media(sde_dev *dev, sde_io *io, int kind);
void dev_kv_queue(sde_dev *dev, sde_io *io, int op, void *addr, uint64_t len, uint64_t off,
                  int buf_index);

/* dev_ops.c: start a command by its row */
void dev_start_now(sde_dev *dev, int qp, const sde_sqe *c, const struct dev_op *r,
                   uint64_t t0);

/* dev_journal.c */
void dev_wait_commit(sde_dev *dev, struct dev_ctx *x, uint64_t group);
int dev_complete_committed(sde_dev *dev, int failed);
int dev_journal_kick(sde_dev *dev);
void dev_journal_io_done(sde_dev *dev, sde_io *io);
void dev_release_writes(sde_dev *dev);

/* dev_pins.c */
void dev_pins_init(sde_dev *dev);
void dev_pins_free(sde_dev *dev);
uint16_t dev_pin_add(sde_dev *dev, const struct dev_qp *q, uint32_t nsid, const uint8_t *key,
                     uint32_t klen, uint32_t *count);
uint16_t dev_pin_drop(sde_dev *dev, const struct dev_qp *q, uint32_t nsid, const uint8_t *key,
                      uint32_t klen, uint32_t *count);
void dev_pins_drop_key(sde_dev *dev, uint32_t nsid, const uint8_t *key, uint32_t klen);
void dev_pins_drop_ns(sde_dev *dev, uint32_t nsid);

/* dev_block.c */
uint16_t dev_check_block(sde_dev *dev, struct dev_qp *q, const sde_sqe *c, int need_buf,
                         uint64_t *media_off, struct dev_buf **buf);
uint16_t dev_zero_range(sde_dev *dev, uint8_t op, uint64_t off, uint64_t len);
void dev_block_media_done(sde_dev *dev, struct dev_ctx *x, sde_io *io);

/* dev_kv.c */
void dev_value_start(sde_dev *dev, struct dev_ctx *x, uint32_t ext, uint8_t *mem,
                     int buf_index, int staged, int write, uint64_t cover);
void dev_kv_put_value(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, uint8_t *src,
                      uint64_t len, int mode, int buf_index, int staged);
void dev_kv_put_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
/* The index lookups of a fetched batch's keyed commands (and its small puts' value hashes),
 * prefetched before they start; dev_kv_prefetch_done once they have. */
void dev_kv_prefetch(sde_dev *dev, int qp, const sde_sqe *batch, int n);
void dev_kv_prefetch_done(sde_dev *dev);
void dev_kv_get_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_kv_io_done(sde_dev *dev, struct dev_ctx *x);
void dev_kv_delete_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
int dev_unpark(sde_dev *dev);
/* the kinds' rows (dev_kinds.c) */
void dev_value_media_done(sde_dev *dev, struct dev_ctx *x, sde_io *io);
void dev_put_value_done(sde_dev *dev, struct dev_ctx *x);
void dev_get_value_done(sde_dev *dev, struct dev_ctx *x);
void dev_put_resume(sde_dev *dev, struct dev_ctx *x);
void dev_delete_resume(sde_dev *dev, struct dev_ctx *x);
void dev_kv_put_timing(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, int wrote,
                       uint64_t off, uint64_t len);
void dev_qstore_put_timing(sde_dev *dev, struct dev_ctx *x, const sde_sqe *c, int wrote,
                           uint64_t off, uint64_t len);

/* dev_compute.c */
void dev_fifo_append(sde_dev *dev, struct dev_ctx *x);
void dev_qstore_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_dq_get_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_dq_read_done(sde_dev *dev, struct dev_ctx *x);
void dev_qstore_book_input(sde_dev *dev, struct dev_ctx *x);
void dev_dq_book_input(sde_dev *dev, struct dev_ctx *x);
void dev_requant_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_requant_read_done(sde_dev *dev, struct dev_ctx *x);
void dev_requant_kernel_done(sde_dev *dev, struct dev_ctx *x, sde_fw_job *j);
void dev_prefix_match_now(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
void dev_prefix_tokens_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0);
int dev_reap_firmware(sde_dev *dev);

/* dev_faults.c */
int dev_inject_fault(sde_dev *dev, int qp, const sde_sqe *c, const struct dev_op *r,
                     uint64_t t0);
void dev_undo_housekeeping(sde_dev *dev);

/* dev_loop.c */
void dev_start_command(sde_dev *dev, int qp, const sde_sqe *c, uint64_t t0);
int dev_pass(sde_dev *dev);

#endif
