/*
 * ssdemu I/O engine: O_DIRECT reads and writes on the drive's backing media through io_uring.
 *
 * This header is the one definition of the engine's ABI.  The block between CDEF-BEGIN and
 * CDEF-END is read verbatim by cffi (c/cffi_build.py), so it holds only plain typedefs,
 * integer #defines and prototypes; the numpy views in ssdemu/device/engine.py are derived from the
 * compiled struct layout (ffi.offsetof), never written out a second time.
 *
 * Conventions (as liburing): every call returns 0 or a count on success and -errno on failure;
 * each I/O's result is bytes transferred or -errno in sde_io.res.  errno is never used.
 */
#ifndef SDE_ENGINE_H
#define SDE_ENGINE_H
#include <stdint.h>
#include <sys/uio.h>
#include "sde_hist.h"

/* CDEF-BEGIN */
#define SDE_OP_READ 0
#define SDE_OP_WRITE 1
#define SDE_OP_READV 2
#define SDE_OP_WRITEV 3
#define SDE_OP_FSYNC 4
#define SDE_OP_LAST 5

/* sde_io.flags, set by the engine on completion */
#define SDE_IOF_SHORT 1        /* the I/O crossed the end of the media and was cut short */
#define SDE_IOF_UNREGISTERED 2 /* asked for a fixed buffer, ran unregistered (fallback) */

/* sde_engine_new flags */
#define SDE_ENG_SQPOLL 1
#define SDE_ENG_NO_FIXED_FILE 2
#define SDE_ENG_NO_INLINE 4 /* shared-memory media through io_uring too (its worker threads) */

/*
 * One I/O.  The caller fills op, buf_index, addr, len, offset and user_data; the engine fills
 * res, flags and lat_ns.  For READ/WRITE addr is the buffer and len its length in bytes.  For
 * READV/WRITEV addr points at an array of struct iovec and len is the iovec count.  buf_index
 * names a buffer registered with sde_register_buffers (addr must lie inside it) or is -1.
 */
typedef struct sde_io {
    uint64_t addr;
    uint64_t offset;
    uint64_t user_data;
    uint64_t lat_ns;
    uint32_t len;
    int32_t res;
    uint8_t op;
    uint8_t flags;
    int16_t buf_index;
    uint32_t reserved;
} sde_io;

typedef struct sde_stats {
    uint64_t submitted;
    uint64_t completed;
    uint64_t errors;
    uint64_t short_ios;
    uint64_t unregistered_fallback_ios; /* fixed-buffer I/Os that ran unregistered */
    uint64_t bytes_read;
    uint64_t bytes_written;
    uint64_t inline_ios;                /* I/Os run in the caller's thread (inline_io) */
    int32_t buffers_registered;         /* number of registered fixed buffers */
    int32_t register_error;             /* -errno of the last failed buffer registration, or 0 */
    int32_t sqpoll;                     /* 1 if the ring runs with an SQ polling thread */
    int32_t fixed_file;                 /* 1 if the media fd is a registered file */
    int32_t inline_io;                  /* 1 if reads and writes run in the caller's thread
                                         * (shared-memory media, sde_engine.c) */
} sde_stats;


typedef struct sde_engine sde_engine;

/* Media probing: size and O_DIRECT logical block size of an open fd (file or block device). */
int sde_media_probe(int fd, uint64_t *size_out, uint32_t *lba_out, uint32_t *is_block_out);

/* Engine on an open O_DIRECT fd.  queue_depth bounds the I/Os in flight. */
int sde_engine_new(int fd, uint64_t media_size, uint32_t lba_size, uint32_t queue_depth,
                   uint32_t flags, sde_engine **out);
void sde_engine_free(sde_engine *eng);

/* Register fixed buffers.  On failure (e.g. the locked-memory limit) returns -errno, keeps
 * the buffer table so that buf_index still validates, and runs those I/Os unregistered. */
int sde_register_buffers(sde_engine *eng, const struct iovec *iovs, uint32_t n);

/* A table of n empty fixed-buffer slots (sparse registration), to be filled one at a time
 * with sde_buffer_set while no I/O uses the slot.  On failure the slots still validate and
 * their I/O runs unregistered, counted. */
int sde_register_buffer_slots(sde_engine *eng, uint32_t n);
/* Put a buffer in slot index (len 0 empties it).  Returns 0, or -errno when the kernel
 * refused it (the slot then runs unregistered). */
int sde_buffer_set(sde_engine *eng, uint32_t index, void *base, uint64_t len);

/* Queue up to n I/Os (fewer when the queue depth is reached); returns how many were taken.
 * An I/O that fails validation completes at once with its -errno, never reaching the kernel. */
int sde_submit(sde_engine *eng, sde_io *ios, uint32_t n);

/* liburing's two steps, for callers that build a batch one I/O at a time: queue an I/O
 * without entering the kernel (returns 1 taken, 0 when the queue depth is reached), then
 * hand everything queued to the kernel in one call. */
int sde_queue_io(sde_engine *eng, sde_io *io);
int sde_submit_queued(sde_engine *eng);

/* Reap completed I/Os into out[] (pointers to the caller's sde_io); waits for at least
 * min_complete.  Returns the count. */
int sde_reap(sde_engine *eng, sde_io **out, uint32_t max, uint32_t min_complete);

/* Run n I/Os to completion at the engine's queue depth.  Returns n or -errno. */
int sde_run(sde_engine *eng, sde_io *ios, uint32_t n);

/* One waiting point for I/O and an outside event: arm a one-shot poll for POLLIN on fd
 * (no-op while armed); sde_engine_wait blocks until any completion is ready; after a reap,
 * sde_engine_take_poll tells (once) whether the poll fired. */
int sde_engine_arm_poll(sde_engine *eng, int fd);
int sde_engine_wait(sde_engine *eng);
/* As sde_engine_wait, giving up after timeout_ns (returns -ETIME). */
int sde_engine_wait_timeout(sde_engine *eng, uint64_t timeout_ns);
int sde_engine_take_poll(sde_engine *eng);

uint32_t sde_inflight(const sde_engine *eng);
void sde_get_stats(const sde_engine *eng, sde_stats *out);
/* CDEF-END */

#endif
