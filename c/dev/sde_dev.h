/*
 * The device core: the daemon's data plane, in C.  It polls every queue pair's SQ, copies
 * each command out once, validates it against the sending client's own buffers and the
 * namespaces, runs block I/O through the io_uring engine straight into the client's
 * registered buffer, runs KV commands against the store and compute commands on the
 * firmware's threads (c/fw/sde_fw.h), and posts completions.  Admin commands are handed to the
 * daemon's Python side (sde_dev_admin_pop / sde_dev_complete).  Python owns the control plane and
 * changes these tables only through the calls below, which take the core's lock.
 */
#ifndef SDE_DEV_H
#define SDE_DEV_H
#include <stdint.h>
#include "sde_queue.h"
#include "sde_model.h"
#include "sde_store.h"
#include "sde_budget.h"
#include "sde_fault.h"
#include "sde_undo.h"

/* CDEF-BEGIN */
#define SDE_MAX_QPS 256
#define SDE_MAX_BUFS 1024
#define SDE_MAX_NS 64
#define SDE_MAX_IO_BYTES 1048576
#define SDE_BUF_BOUNCE 1     /* sde_dev_add_buffer: not a fixed buffer, copy through a bounce */

#define SDE_CLASS_NOP 0
#define SDE_CLASS_READ 1
#define SDE_CLASS_WRITE 2
#define SDE_CLASS_FLUSH 3
#define SDE_CLASS_ZERO 4
#define SDE_CLASS_ADMIN 5
#define SDE_CLASS_INVALID 6
#define SDE_CLASS_KV 7
#define SDE_CLASS_COMPUTE 8
#define SDE_NCLASSES 9
#define SDE_LAT_BUCKETS 64   /* latency histogram: power-of-two ns buckets */

typedef struct sde_class_stats {
    uint64_t commands;
    uint64_t errors;
    uint64_t bytes;
    uint64_t bytes_copied;   /* bytes the daemon copied (bounce path) */
    uint64_t lat_ns_total;
    uint64_t lat_hist[64];   /* bucket b: latency in [2^b, 2^(b+1)) ns */
} sde_class_stats;

typedef struct sde_dev_stats {
    sde_class_stats cls[9];
    uint64_t broken_queues;  /* queues stopped because the client broke the ring protocol */
    uint64_t sleeps;
    uint64_t wakeups;
    uint64_t held;           /* completions held until their modelled time (real time) */
    uint64_t host_lag;       /* commands whose media I/O ended after their modelled time */
    uint64_t quota_waits;    /* passes that left a uid's commands unfetched: its quota */
    uint64_t key_waits;      /* KV changes held back behind an early put of their key */
    uint64_t deferred;       /* virtual time: commands started at their turn behind compute
                              * commands (sde_dev_run: the model books in fetch order) */
    uint64_t uid_inflight_peak; /* the most commands one uid had in flight */
    uint64_t faults_injected; /* commands failed or delayed by a fault rule */
    uint64_t pins;           /* pins held now, over every client */
    uint64_t cache_destages; /* power-cut emulation: the write cache filled and was synced */
    uint64_t undo_failures;  /* power-cut emulation: a write whose old bytes could not be kept */
    uint64_t spin_backoffs;  /* idle spins given up: descheduled mid-spin (sde_spin.h) */
    uint64_t spin_shared_cpu; /* sleeps without a spin: a client waited on the same CPU */
    uint64_t client_kicks;    /* completion eventfd writes: a client asleep had to be woken */
    uint64_t slice_ns;       /* the data plane thread's scheduler slice asked for (while
                              * the host is busy), 0: the kernel's default (sde_sched.h) */
    uint64_t wake_late_ns;   /* how late this host wakes the data plane past a timed sleep's
                              * end, recent mean: held completions' sleeps end that early */
} sde_dev_stats;

typedef struct sde_admin_cmd {
    int32_t qp;
    uint32_t client;
    uint64_t t0_ns;  /* when the data plane fetched it: pass back to sde_dev_complete */
    sde_sqe sqe;
} sde_admin_cmd;

typedef struct sde_dev sde_dev;

/* engine_flags: sde_engine_new's (SDE_ENG_NO_INLINE: serve --media-io io_uring) */
int sde_dev_new(int media_fd, uint64_t media_size, uint32_t lba_size, uint32_t io_depth,
                uint32_t engine_flags, sde_dev **out);
/* 1 when the media's reads and writes run in the data plane's thread (shared memory) */
int sde_dev_media_inline(sde_dev *dev);
void sde_dev_free(sde_dev *dev);
int sde_dev_doorbell_fd(sde_dev *dev);   /* the device's own: Python kicks it to wake the loop */
int sde_dev_admin_fd(sde_dev *dev);      /* readable when admin commands wait for Python */

/* Queue pairs: mem is the mapped queue-pair memory (initialised by sde_qp_init);
 * doorbell_fd: an eventfd of this queue pair alone, which its client kicks (the caller keeps
 * it open until the queue pair has drained); uid and token: the client's owner identity,
 * which namespaces it may use (sde_ns_info). */
int sde_dev_add_qp(sde_dev *dev, void *mem, uint64_t bytes, uint32_t client, int completion_fd,
                   int doorbell_fd, uint32_t uid, uint64_t token);
/* The queue pair's client is an admin: it may force a delete of a key others pinned in any
 * namespace (an owner may in its own namespaces, c/wire/sde_queue.h SDE_KV_DELETE_FORCE). */
int sde_dev_set_qp_admin(sde_dev *dev, int qp, int admin);
/* Stop serving a queue pair (its client left).  Completions of its in-flight commands are
 * dropped.  Returns the commands still in flight: unmap only when it reaches 0. */
int sde_dev_remove_qp(sde_dev *dev, int qp);
int sde_dev_qp_inflight(sde_dev *dev, int qp);
/* Draining: a mark of the commands started so far, and how many of those are still in
 * flight (their media I/O may still read or write).  A namespace's space is given back only
 * once none started before its delete is (after sde_dev_set_ns(dev, nsid, NULL), which
 * stops new ones). */
uint64_t sde_dev_ctx_mark(sde_dev *dev);
int sde_dev_inflight_before(sde_dev *dev, uint64_t mark);
/* Mark every queue pair dead (shutdown): clients waiting are woken with an error. */
void sde_dev_shutdown_qps(sde_dev *dev);

/* Most commands one uid may have in flight over all its queue pairs, whatever its
 * connections (0: no quota).  Past it, the data plane leaves its commands in its SQs
 * until some complete. */
int sde_dev_set_uid_quota(sde_dev *dev, uint32_t max_inflight);

/* Buffers of a client: handle >= 1, or -errno. */
int sde_dev_add_buffer(sde_dev *dev, uint32_t client, void *addr, uint64_t len, uint32_t flags);
int sde_dev_remove_buffer(sde_dev *dev, int handle);
int sde_dev_client_inflight(sde_dev *dev, uint32_t client);
/* A client left: its pins go (returns how many). */
int sde_dev_release_pins(sde_dev *dev, uint32_t client);
/* Most keys one uid may have pinned at once, over all its clients (0: no quota); past it
 * PIN completes with CAPACITY_EXCEEDED. */
int sde_dev_set_pin_quota(sde_dev *dev, uint32_t max_per_uid);

/* Fault injection (c/dev/sde_fault.h): a rule's id, or -errno; clear one (id) or all (0),
 * returning how many went; a copy of the rules now in force. */
int sde_dev_fault_add(sde_dev *dev, const sde_fault_rule *r, uint64_t seed);
int sde_dev_fault_clear(sde_dev *dev, uint32_t id);
void sde_dev_faults(sde_dev *dev, sde_faults *out);

/* Power-cut emulation (c/dev/sde_undo.h): from now on every media write keeps what it
 * overwrites until a flush (or a checkpoint, or a cache of cache_bytes filling) makes it
 * durable.  sde_dev_power_cut, once the data plane has stopped, undoes what a cut loses. */
int sde_dev_set_power_cut(sde_dev *dev, uint64_t cache_bytes);
int sde_dev_power_cut(sde_dev *dev, uint64_t seed, sde_cut_result *out);

/* Zero a byte range of the media (a new namespace's: no client sees another's old bytes).
 * 0, or -EINVAL / -EIO. */
int sde_dev_zero(sde_dev *dev, uint64_t offset, uint64_t bytes);
/* Namespaces 1..SDE_MAX_NS as the store keeps them (ns NULL: deleted, and the pins on its
 * keys with it).  A client sees a namespace that is shared or its owner's own. */
int sde_dev_set_ns(sde_dev *dev, uint32_t nsid, const sde_ns_info *ns);

/* The data plane: serve until *stop becomes nonzero.  Polls for spin_ns after the last work,
 * then sleeps on the doorbell; SDE_DEV_POLL: never sleeps (a core of its own, as SPDK's
 * reactors: no doorbell to ring, no wake-up to wait for).  Returns 0 or -errno. */
#define SDE_DEV_POLL 0xffffffffffffffffULL
int sde_dev_run(sde_dev *dev, volatile int *stop, uint64_t spin_ns);

/* Admin commands for Python, and their completions. */
int sde_dev_admin_pop(sde_dev *dev, sde_admin_cmd *out, uint32_t max);
/* Retrieval commands (TOPK_PAGES, ATTEND) go to their own queue, for the retrieval workers:
 * the fd (a blocking semaphore eventfd) counts one per command queued, and a worker that
 * read one pops one here (1; 0 when another worker took it).  A write to the fd wakes a
 * worker without a command (to stop it). */
int sde_dev_retrieval_fd(sde_dev *dev);
int sde_dev_retrieval_pop(sde_dev *dev, sde_admin_cmd *out);
/* Retrieval commands queued that no worker has popped yet. */
uint32_t sde_dev_retrieval_queued(sde_dev *dev);
/* opcode: the command's (for its class); bytes it moved and bytes the daemon copied.  A
 * non-zero cqe->device_time_ns is the modelled time: in real time the completion is held
 * until t0_ns + that time. */
int sde_dev_complete(sde_dev *dev, int qp, const sde_cqe *cqe, uint64_t t0_ns, uint32_t opcode,
                     uint64_t bytes, uint64_t bytes_copied);

void sde_dev_get_stats(sde_dev *dev, sde_dev_stats *out);
/* One owner's share of the per-class counters (uid and owner-key token, as its queue pairs
 * were made with): what the log page shows a client that is not an admin.  The first
 * SDE_MAX_OWNERS owners seen each have their own; later ones share the last slot.  0, or
 * -ENOENT for an owner with no command yet. */
#define SDE_MAX_OWNERS 128
int sde_dev_owner_stats(sde_dev *dev, uint32_t uid, uint64_t token, sde_class_stats *out);

/* Time block commands, NOP and FLUSH with the timing model (c/model/sde_model.h).  Real time: a
 * completion is held until its modelled time and its CQE carries the modelled latency; a
 * media I/O that ends later than that counts as host lag.  Virtual time: the SQE's
 * submit_time_ns is the submission on a clock that never goes back, the CQE carries the
 * modelled completion time, nothing is held.  p NULL: no model (measured times). */
int sde_dev_set_model(sde_dev *dev, const sde_model_params *p, int virtual_time);
void sde_dev_model_stats(sde_dev *dev, sde_model_stats *out);
/* The KV store: once attached, KV commands (store, retrieve, delete, exist, list) and pins
 * run in the data plane against it.  Python's synchronous store calls (sde_store_*) go
 * between enter (the core's lock, no journal write in flight) and leave. */
int sde_dev_attach_store(sde_dev *dev, sde_store *st);
void sde_dev_store_enter(sde_dev *dev);
void sde_dev_store_leave(sde_dev *dev);
/* sde_store_lookup_many on the attached store, between enter and a leave that wakes no one
 * (a lookup changes nothing the data plane waits on). */
void sde_dev_store_lookup_many(sde_dev *dev, uint32_t nsid, const uint8_t *keys,
                               const uint32_t *klens, uint32_t n, uint64_t *offset,
                               uint64_t *len, uint64_t *hash, int32_t *status);

/* sde_store_get on the attached store with the core's lock held only to pin the value's
 * extent and to unpin it: its media reads and checksum go on outside, so that the data plane
 * serves other commands meanwhile (a retrieval worker's read of a 4 MiB block held it
 * ~0.6 ms).  A delete meanwhile leaves the extent a zombie until it is unpinned. */
int sde_dev_store_get(sde_dev *dev, uint32_t nsid, const uint8_t *key, uint32_t klen,
                      void *out, uint64_t cap, uint64_t *len);

/* The firmware: the addresses of its entry points (firmware/entry.py), the threads that run
 * them, and the TOPS budget (c/model/sde_budget.h) its kernels are charged to.  Compute commands
 * answer INTERNAL until it is set; -EBUSY while the previous one has jobs. */
int sde_dev_set_firmware(sde_dev *dev, uint64_t quantize, uint64_t dequantize,
                         uint64_t hash_chain, uint64_t requantize, uint32_t threads,
                         const sde_budget *budget);
void sde_dev_budget(sde_dev *dev, sde_budget *out);   /* a copy of the budget's state */
/* The device clock: the virtual clock's latest submission, or real time since the model's
 * origin. */
double sde_dev_clock_ns(sde_dev *dev);

/* The command class an opcode dispatches to (SDE_CLASS_INVALID for none), and where it
 * runs (SDE_RUN_*, -1 for none). */
#define SDE_RUN_DATA_PLANE 0
#define SDE_RUN_HOST 1
int sde_dev_opcode_class(uint32_t op);
int sde_dev_opcode_where(uint32_t op);
/* An opcode's row of the table (c/dev/dev_ops.c), for tests and docs: -ENOENT for none. */
typedef struct sde_opcode_info {
    uint8_t op, cls, where, fault_dir, in_turn, needs_store, keyed, has_start, has_kernel_done;
    char name[32];
} sde_opcode_info;
int sde_dev_opcode_info(uint32_t op, sde_opcode_info *out);
/* CDEF-END */
#endif
