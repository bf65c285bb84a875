/*
 * The engine's state (c/engine/sde_engine.c), for the one other file that runs on the
 * engine's own ring: its closed-loop benchmark (c/tools/sde_engine_bench.c), a tool built
 * into the benchmarks' module, not the device's.
 */
#ifndef SDE_ENGINE_PRIVATE_H
#define SDE_ENGINE_PRIVATE_H
#include <liburing.h>
#include <stdint.h>

#include "sde_engine.h"

struct sde_slot {
    sde_io *io;
    uint64_t t0;
    struct iovec *trunc; /* engine-owned iovec copy for a vectored I/O cut at the end */
};

struct sde_engine {
    struct io_uring ring;
    int fd;
    int fixed_file;
    uint64_t size;
    uint32_t lba;
    uint32_t qd;
    uint32_t inflight;        /* slots in use: in the kernel or waiting in early[] */
    struct sde_slot *slots;
    uint32_t *free_slots;     /* stack of free slot indices */
    uint32_t nfree;
    sde_io **early;           /* I/Os completed without the kernel's ring (failed validation,
                               * run inline): a ring of qd, reaped in the order queued */
    uint32_t early_head;
    uint32_t nearly;
    struct iovec *bufs;       /* the buffer table, kept even when registration failed */
    uint32_t nbufs;
    int bufs_registered;      /* the table is registered with the kernel (whole or sparse) */
    uint8_t *buf_reg;         /* per slot: registered as a fixed buffer */
    uint32_t queued;          /* SQEs prepared but not yet handed to the kernel */
    int poll_armed;           /* a POLL_ADD on an outside fd (the daemon's doorbell) is set */
    int poll_fired;
    int inline_io;            /* shared-memory media: I/O in the caller's thread */
    uint32_t ring_writes;     /* writes handed to the ring (io-wq) and not yet reaped */
    sde_stats stats;
};

static inline int sde_misaligned(uint64_t v, uint32_t lba) { return (v & (lba - 1)) != 0; }
#endif
