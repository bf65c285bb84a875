/*
 * ssdemu I/O engine over liburing.  See sde_engine.h for the contract.
 *
 * Why a slot table: each in-flight I/O owns a slot holding its submit time and, for a vectored
 * I/O cut short at the end of the media, the engine's truncated copy of the caller's iovecs.
 * The SQE's user_data is the slot index, so completions may arrive in any order.
 */
#define _GNU_SOURCE
#include "engine_private.h"
#include "sde_time.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <linux/fs.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define SDE_IOV_MAX 1024
#define SDE_MIN_ALIGN 512u
#define SDE_POLL_TAG UINT64_MAX /* user_data of the doorbell poll, never a slot */
/* the largest shared-memory I/O run inline: past it the copy outweighs a hand-off, and on
 * the ring it runs on another core beside the caller's own work (2 MiB KV values at QD32:
 * 2.9-3.5 GB/s inline, 4.1-4.7 through io-wq, quiet) */
#define SDE_INLINE_MAX_BYTES (128u << 10)

/* Wait until the CQ ring holds an entry.  Under COOP_TASKRUN, completions from io-wq workers
 * are posted only when we enter the kernel, so polling the ring from user space would only
 * burn a core (measured: it halves tmpfs IOPS on these 2-core machines); sleep in the kernel. */
static int wait_cq(sde_engine *eng)
{
    if (eng->nearly || io_uring_cq_ready(&eng->ring))
        return 0;
    struct io_uring_cqe *cqe;
    int ret;
    do
        ret = io_uring_wait_cqe(&eng->ring, &cqe);
    while (ret == -EINTR);
    return ret;
}

/* ---- media ------------------------------------------------------------------------------ */

/* glibc 2.36 has statx() but not the DIO alignment fields; use the kernel's struct. */
struct sde_kstatx_head {
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, pad0;
    uint64_t ino, size, blocks, attributes_mask;
    uint8_t times[64];
    uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
    uint64_t mnt_id;
    uint32_t dio_mem_align, dio_offset_align;
    uint8_t rest[256];
};
#define SDE_STATX_DIOALIGN 0x00002000u

int sde_media_probe(int fd, uint64_t *size_out, uint32_t *lba_out, uint32_t *is_block_out)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    uint32_t lba = SDE_MIN_ALIGN;
    uint64_t size;
    if (S_ISBLK(st.st_mode)) {
        int ssz = 0;
        if (ioctl(fd, BLKGETSIZE64, &size) < 0 || ioctl(fd, BLKSSZGET, &ssz) < 0)
            return -errno;
        if ((uint32_t)ssz > lba)
            lba = (uint32_t)ssz;
        *is_block_out = 1;
    } else if (S_ISREG(st.st_mode)) {
        size = (uint64_t)st.st_size;
        struct sde_kstatx_head sx;
        memset(&sx, 0, sizeof(sx));
        if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, SDE_STATX_DIOALIGN, &sx) == 0 &&
            (sx.mask & SDE_STATX_DIOALIGN)) {
            if (sx.dio_offset_align > lba)
                lba = sx.dio_offset_align;
            if (sx.dio_mem_align > lba)
                lba = sx.dio_mem_align;
        }
        *is_block_out = 0;
    } else {
        return -ENODEV;
    }
    *size_out = size - size % lba;
    *lba_out = lba;
    return 0;
}

/* ---- engine lifecycle ------------------------------------------------------------------- */

/* Is fd a regular file in shared memory (a memfd, a tmpfs file)?  Not a device node: /dev is
 * devtmpfs, whose f_type is tmpfs's too. */
static int shmem_file(int fd)
{
    struct stat st;
    struct statfs sf;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && fstatfs(fd, &sf) == 0 &&
           sf.f_type == TMPFS_MAGIC;
}

int sde_engine_new(int fd, uint64_t media_size, uint32_t lba_size, uint32_t queue_depth,
                   uint32_t flags, sde_engine **out)
{
    if (queue_depth == 0 || queue_depth > 4096 || lba_size < SDE_MIN_ALIGN ||
        (lba_size & (lba_size - 1)))
        return -EINVAL;
    sde_engine *eng = calloc(1, sizeof(*eng));
    if (!eng)
        return -ENOMEM;
    eng->fd = fd;
    eng->size = media_size - media_size % lba_size;
    eng->lba = lba_size;
    eng->qd = queue_depth;
    eng->slots = calloc(queue_depth, sizeof(*eng->slots));
    eng->free_slots = calloc(queue_depth, sizeof(*eng->free_slots));
    eng->early = calloc(queue_depth, sizeof(*eng->early));
    if (!eng->slots || !eng->free_slots || !eng->early) {
        sde_engine_free(eng);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < queue_depth; i++)
        eng->free_slots[i] = queue_depth - 1 - i;
    eng->nfree = queue_depth;

    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    if (flags & SDE_ENG_SQPOLL) {
        p.flags |= IORING_SETUP_SQPOLL;
        p.sq_thread_idle = 50; /* ms before the poller sleeps: an idle drive costs no CPU */
    }
    /* Cooperative task work: completions from io-wq workers (tmpfs reads are punted there)
     * are posted when we next enter the kernel instead of interrupting us with an IPI; this
     * doubles 4 KiB IOPS on tmpfs here. */
    struct io_uring_params p0 = p;
    p.flags |= IORING_SETUP_COOP_TASKRUN;
    int ret = io_uring_queue_init_params(queue_depth, &eng->ring, &p);
    if (ret == -EINVAL) { /* older kernel, or a combination it refuses */
        p = p0;
        ret = io_uring_queue_init_params(queue_depth, &eng->ring, &p);
    }
    if (ret < 0) {
        free(eng->slots);
        free(eng->free_slots);
        free(eng->early);
        free(eng);
        return ret;
    }
    eng->stats.sqpoll = (flags & SDE_ENG_SQPOLL) ? 1 : 0;
    eng->inline_io = eng->stats.inline_io = !(flags & SDE_ENG_NO_INLINE) && shmem_file(fd);
    if (!(flags & SDE_ENG_NO_FIXED_FILE) && io_uring_register_files(&eng->ring, &fd, 1) == 0)
        eng->fixed_file = 1;
    eng->stats.fixed_file = eng->fixed_file;
    *out = eng;
    return 0;
}

void sde_engine_free(sde_engine *eng)
{
    if (!eng)
        return;
    if (eng->slots) {
        /* drain what is still in the kernel so no completion lands in freed memory */
        while (eng->inflight > eng->nearly) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&eng->ring, &cqe) < 0)
                break;
            uint64_t tag = io_uring_cqe_get_data64(cqe);
            if (tag != SDE_POLL_TAG) {
                free(eng->slots[(uint32_t)tag].trunc);
                eng->inflight--;
            }
            io_uring_cqe_seen(&eng->ring, cqe);
        }
        io_uring_queue_exit(&eng->ring);
    }
    free(eng->slots);
    free(eng->free_slots);
    free(eng->early);
    free(eng->bufs);
    free(eng->buf_reg);
    free(eng);
}

static void drop_buffer_table(sde_engine *eng)
{
    if (eng->bufs_registered)
        io_uring_unregister_buffers(&eng->ring);
    eng->bufs_registered = 0;
    free(eng->bufs);
    free(eng->buf_reg);
    eng->bufs = NULL;
    eng->buf_reg = NULL;
    eng->nbufs = 0;
    eng->stats.buffers_registered = 0;
}

static int alloc_buffer_table(sde_engine *eng, uint32_t n)
{
    eng->bufs = calloc(n, sizeof(*eng->bufs));
    eng->buf_reg = calloc(n, 1);
    if (!eng->bufs || !eng->buf_reg) {
        drop_buffer_table(eng);
        return -ENOMEM;
    }
    eng->nbufs = n;
    return 0;
}

int sde_register_buffers(sde_engine *eng, const struct iovec *iovs, uint32_t n)
{
    if (eng->inflight)
        return -EBUSY;
    drop_buffer_table(eng);
    if (n == 0)
        return 0;
    int ret = alloc_buffer_table(eng, n);
    if (ret < 0)
        return ret;
    memcpy(eng->bufs, iovs, n * sizeof(*iovs));
    ret = io_uring_register_buffers(&eng->ring, iovs, n);
    if (ret < 0) {
        eng->stats.register_error = ret;
        return ret;
    }
    eng->bufs_registered = 1;
    memset(eng->buf_reg, 1, n);
    eng->stats.register_error = 0;
    eng->stats.buffers_registered = (int32_t)n;
    return 0;
}

int sde_register_buffer_slots(sde_engine *eng, uint32_t n)
{
    if (eng->inflight)
        return -EBUSY;
    drop_buffer_table(eng);
    int ret = alloc_buffer_table(eng, n);
    if (ret < 0)
        return ret;
    ret = io_uring_register_buffers_sparse(&eng->ring, n);
    if (ret < 0) {
        eng->stats.register_error = ret;
        return ret; /* slots still validate; their I/O runs unregistered */
    }
    eng->bufs_registered = 1;
    return 0;
}

int sde_buffer_set(sde_engine *eng, uint32_t index, void *base, uint64_t len)
{
    if (index >= eng->nbufs)
        return -EINVAL;
    struct iovec iov = {.iov_base = len ? base : NULL, .iov_len = len};
    if (eng->buf_reg[index])
        eng->stats.buffers_registered--;
    eng->bufs[index] = iov;
    eng->buf_reg[index] = 0;
    if (!eng->bufs_registered)
        return len ? eng->stats.register_error : 0;
    __u64 tag = 0;
    int ret = io_uring_register_buffers_update_tag(&eng->ring, index, &iov, &tag, 1);
    if (ret < 0) {
        if (len)
            eng->stats.register_error = ret;
        return len ? ret : 0;
    }
    if (len) {
        eng->buf_reg[index] = 1;
        eng->stats.buffers_registered++;
    }
    return 0;
}

/* ---- submission ------------------------------------------------------------------------- */


/* Validate io and compute how many bytes it may move (cut at the end of the media).  Returns
 * 0, or -errno for an I/O that must not reach the kernel.  *eof is set for a read that starts
 * exactly at the end: it completes with 0 bytes, as pread does. */
static int validate(sde_engine *eng, sde_io *io, uint64_t *bytes, int *eof)
{
    *eof = 0;
    *bytes = 0;
    if (io->op >= SDE_OP_LAST)
        return -EINVAL;
    if (io->op == SDE_OP_FSYNC)
        return 0;
    if (sde_misaligned(io->offset, eng->lba))
        return -EINVAL;
    uint64_t total = 0;
    if (io->op == SDE_OP_READ || io->op == SDE_OP_WRITE) {
        if (io->addr == 0)
            return -EFAULT;
        if (io->len == 0 || sde_misaligned(io->len, eng->lba) || sde_misaligned(io->addr, eng->lba))
            return -EINVAL;
        if (io->buf_index >= 0) {
            if ((uint32_t)io->buf_index >= eng->nbufs)
                return -EFAULT;
            const struct iovec *b = &eng->bufs[io->buf_index];
            uint64_t base = (uint64_t)(uintptr_t)b->iov_base;
            if (io->addr < base || io->addr + io->len > base + b->iov_len)
                return -EFAULT;
        }
        total = io->len;
    } else {
        const struct iovec *iov = (const struct iovec *)(uintptr_t)io->addr;
        if (!iov)
            return -EFAULT;
        if (io->len == 0 || io->len > SDE_IOV_MAX || io->buf_index >= 0)
            return -EINVAL;
        for (uint32_t i = 0; i < io->len; i++) {
            if (!iov[i].iov_base)
                return -EFAULT;
            if (iov[i].iov_len == 0 || sde_misaligned(iov[i].iov_len, eng->lba) ||
                sde_misaligned((uint64_t)(uintptr_t)iov[i].iov_base, eng->lba))
                return -EINVAL;
            total += iov[i].iov_len;
        }
    }
    if (io->offset > eng->size)
        return -ENXIO;
    if (io->offset == eng->size) {
        if (io->op == SDE_OP_WRITE || io->op == SDE_OP_WRITEV)
            return -ENOSPC;
        *eof = 1;
        return 0;
    }
    uint64_t room = eng->size - io->offset;
    *bytes = total < room ? total : room;
    return 0;
}

static void complete_early(sde_engine *eng, sde_io *io, int32_t res)
{
    io->res = res;
    io->lat_ns = 0;
    eng->early[(eng->early_head + eng->nearly++) % eng->qd] = io;
    eng->inflight++;
    eng->stats.submitted++;
}

/* A vectored I/O cut short at the end of the media: a copy of its iovecs covering bytes
 * (*cnt updated), which the caller frees; NULL when out of memory. */
static struct iovec *trimmed_iov(const struct iovec *iov, unsigned *cnt, uint64_t bytes)
{
    struct iovec *t = malloc(*cnt * sizeof(*t));
    if (!t)
        return NULL;
    uint64_t left = bytes;
    unsigned k = 0;
    for (; k < *cnt && left; k++) {
        t[k] = iov[k];
        if (t[k].iov_len > left)
            t[k].iov_len = left;
        left -= t[k].iov_len;
    }
    *cnt = k;
    return t;
}

/* Shared-memory media: the read or write now, in the caller's thread, completed as an early
 * I/O.  tmpfs offers io_uring no non-blocking path, so there every I/O was handed to an io-wq
 * worker thread and its completion handed back: two more threads to wake per batch, each
 * waiting for a CPU on a busy host (bench queue's 4 KiB reads at QD32 on mem: beside two
 * CPU-bound processes: 55-151K IOPS through the worker, 223-318K inline, fio 139-256K).  The
 * copy is the one the worker made (the same VFS call) and never waits on a device. */
static int is_write(int op) { return op == SDE_OP_WRITE || op == SDE_OP_WRITEV; }

static void run_inline(sde_engine *eng, sde_io *io, uint64_t bytes, uint64_t total)
{
    uint64_t t0 = now_ns();
    ssize_t r;
    if (io->op == SDE_OP_READ || io->op == SDE_OP_WRITE) {
        void *buf = (void *)(uintptr_t)io->addr;
        r = io->op == SDE_OP_READ ? pread(eng->fd, buf, bytes, (off_t)io->offset)
                                  : pwrite(eng->fd, buf, bytes, (off_t)io->offset);
    } else {
        const struct iovec *iov = (const struct iovec *)(uintptr_t)io->addr;
        unsigned cnt = io->len;
        struct iovec *t = bytes < total ? trimmed_iov(iov, &cnt, bytes) : NULL;
        if (bytes < total && !t) {
            r = -1;
            errno = ENOMEM;
        } else {
            r = io->op == SDE_OP_READV ? preadv(eng->fd, t ? t : iov, (int)cnt, (off_t)io->offset)
                                       : pwritev(eng->fd, t ? t : iov, (int)cnt, (off_t)io->offset);
        }
        free(t);
    }
    complete_early(eng, io, r < 0 ? -errno : (int32_t)r);
    io->lat_ns = now_ns() - t0;
    eng->stats.inline_ios++;
}

static void prep_sqe(sde_engine *eng, struct io_uring_sqe *sqe, sde_io *io, struct sde_slot *slot,
                     uint64_t bytes)
{
    int fd = eng->fixed_file ? 0 : eng->fd;
    uint32_t len = (uint32_t)bytes;
    switch (io->op) {
    case SDE_OP_READ:
    case SDE_OP_WRITE: {
        void *buf = (void *)(uintptr_t)io->addr;
        int fixed = io->buf_index >= 0 && eng->buf_reg[io->buf_index];
        if (io->buf_index >= 0 && !fixed) {
            io->flags |= SDE_IOF_UNREGISTERED;
            eng->stats.unregistered_fallback_ios++;
        }
        if (io->op == SDE_OP_READ) {
            if (fixed)
                io_uring_prep_read_fixed(sqe, fd, buf, len, io->offset, io->buf_index);
            else
                io_uring_prep_read(sqe, fd, buf, len, io->offset);
        } else {
            if (fixed)
                io_uring_prep_write_fixed(sqe, fd, buf, len, io->offset, io->buf_index);
            else
                io_uring_prep_write(sqe, fd, buf, len, io->offset);
        }
        break;
    }
    case SDE_OP_READV:
    case SDE_OP_WRITEV: {
        const struct iovec *iov = (const struct iovec *)(uintptr_t)io->addr;
        unsigned cnt = io->len;
        uint64_t total = 0;
        for (unsigned i = 0; i < cnt; i++)
            total += iov[i].iov_len;
        if (bytes < total) {
            struct iovec *t = trimmed_iov(iov, &cnt, bytes);
            if (t) {
                slot->trunc = t;
                iov = t;
            }
        }
        if (io->op == SDE_OP_READV)
            io_uring_prep_readv(sqe, fd, iov, cnt, io->offset);
        else
            io_uring_prep_writev(sqe, fd, iov, cnt, io->offset);
        break;
    }
    default: /* SDE_OP_FSYNC */
        io_uring_prep_fsync(sqe, fd, 0);
        break;
    }
    if (eng->fixed_file)
        sqe->flags |= IOSQE_FIXED_FILE;
}

int sde_queue_io(sde_engine *eng, sde_io *io)
{
    if (eng->inflight >= eng->qd)
        return 0;
    io->flags = 0;
    io->res = 0;
    uint64_t bytes;
    int eof;
    int err = validate(eng, io, &bytes, &eof);
    if (err < 0 || eof) {
        if (eof)
            io->flags |= SDE_IOF_SHORT;
        complete_early(eng, io, err);
        return 1;
    }
    uint64_t total = 0;
    if (io->op != SDE_OP_FSYNC) {
        total = io->op <= SDE_OP_WRITE ? io->len : 0;
        if (io->op > SDE_OP_WRITE) {
            const struct iovec *iov = (const struct iovec *)(uintptr_t)io->addr;
            for (uint32_t i = 0; i < io->len; i++)
                total += iov[i].iov_len;
        }
        if (bytes < total)
            io->flags |= SDE_IOF_SHORT;
        /* a write waits for the ring's writes: tmpfs writes hold the file's lock while they
         * copy, so one run here would stall the caller behind every large write queued to
         * io-wq (a journal block behind 2 MiB values: puts at 186-254/s, 0.39-0.53 GB/s,
         * instead of 1.7K/s and up) */
        if (eng->inline_io && bytes <= SDE_INLINE_MAX_BYTES &&
            !(is_write(io->op) && eng->ring_writes)) {
            run_inline(eng, io, bytes, total);
            return 1;
        }
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&eng->ring);
    if (!sqe) {
        /* SQ ring full (only possible with SQPOLL lagging): hand it to the kernel now */
        io_uring_submit(&eng->ring);
        eng->queued = 0;
        sqe = io_uring_get_sqe(&eng->ring);
        if (!sqe)
            return 0;
    }
    uint32_t s = eng->free_slots[--eng->nfree];
    struct sde_slot *slot = &eng->slots[s];
    slot->io = io;
    slot->t0 = now_ns();
    eng->ring_writes += (uint32_t)is_write(io->op);
    slot->trunc = NULL;
    prep_sqe(eng, sqe, io, slot, bytes);
    io_uring_sqe_set_data64(sqe, s);
    eng->inflight++;
    eng->stats.submitted++;
    eng->queued++;
    return 1;
}

int sde_submit_queued(sde_engine *eng)
{
    if (!eng->queued)
        return 0;
    eng->queued = 0;
    int ret = io_uring_submit(&eng->ring);
    return ret < 0 ? ret : 0;
}

int sde_submit(sde_engine *eng, sde_io *ios, uint32_t n)
{
    uint32_t taken = 0;
    while (taken < n && sde_queue_io(eng, &ios[taken]))
        taken++;
    int ret = sde_submit_queued(eng);
    return ret < 0 ? ret : (int)taken;
}

/* ---- completion ------------------------------------------------------------------------- */

static void finish(sde_engine *eng, sde_io *io, int32_t res)
{
    io->res = res;
    eng->stats.completed++;
    if (res < 0) {
        eng->stats.errors++;
    } else if (io->op == SDE_OP_READ || io->op == SDE_OP_READV) {
        eng->stats.bytes_read += (uint64_t)res;
    } else if (io->op == SDE_OP_WRITE || io->op == SDE_OP_WRITEV) {
        eng->stats.bytes_written += (uint64_t)res;
    }
    if (io->flags & SDE_IOF_SHORT)
        eng->stats.short_ios++;
}

int sde_reap(sde_engine *eng, sde_io **out, uint32_t max, uint32_t min_complete)
{
    uint32_t got = 0;
    while (got < max && eng->nearly) { /* in the order they were queued */
        sde_io *io = eng->early[eng->early_head];
        eng->early_head = (eng->early_head + 1) % eng->qd;
        eng->nearly--;
        eng->inflight--;
        finish(eng, io, io->res);
        out[got++] = io;
    }
    uint32_t in_kernel = eng->inflight - eng->nearly;
    if (min_complete > got + in_kernel)
        min_complete = got + in_kernel;
    while (got < max) {
        struct io_uring_cqe *cqes[64];
        unsigned want = max - got < 64 ? max - got : 64;
        unsigned k = io_uring_peek_batch_cqe(&eng->ring, cqes, want);
        if (k == 0) {
            if (got >= min_complete)
                break;
            int ret = wait_cq(eng);
            if (ret < 0)
                return got ? (int)got : ret;
            continue;
        }
        uint64_t t1 = now_ns();
        for (unsigned i = 0; i < k; i++) {
            if (io_uring_cqe_get_data64(cqes[i]) == SDE_POLL_TAG) {
                eng->poll_armed = 0;
                eng->poll_fired = 1;
                continue;
            }
            uint32_t s = (uint32_t)io_uring_cqe_get_data64(cqes[i]);
            struct sde_slot *slot = &eng->slots[s];
            sde_io *io = slot->io;
            io->lat_ns = t1 - slot->t0;
            free(slot->trunc);
            slot->trunc = NULL;
            eng->ring_writes -= (uint32_t)is_write(io->op);
            finish(eng, io, cqes[i]->res);
            eng->free_slots[eng->nfree++] = s;
            eng->inflight--;
            out[got++] = io;
        }
        /* the kernel may reuse these CQ entries only after we are done reading them */
        io_uring_cq_advance(&eng->ring, k);
    }
    return (int)got;
}

int sde_run(sde_engine *eng, sde_io *ios, uint32_t n)
{
    sde_io *done[64];
    uint32_t next = 0, finished = 0;
    while (finished < n) {
        if (next < n) {
            int ret = sde_submit(eng, ios + next, n - next);
            if (ret < 0)
                return ret;
            next += (uint32_t)ret;
        }
        int got = sde_reap(eng, done, 64, 1);
        if (got < 0)
            return got;
        finished += (uint32_t)got;
    }
    return (int)n;
}

int sde_engine_arm_poll(sde_engine *eng, int fd)
{
    if (eng->poll_armed)
        return 0;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&eng->ring);
    if (!sqe) {
        io_uring_submit(&eng->ring);
        sqe = io_uring_get_sqe(&eng->ring);
        if (!sqe)
            return -EBUSY;
    }
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data64(sqe, SDE_POLL_TAG);
    int ret = io_uring_submit(&eng->ring);
    eng->queued = 0;
    if (ret < 0)
        return ret;
    eng->poll_armed = 1;
    return 0;
}

int sde_engine_wait(sde_engine *eng) { return wait_cq(eng); }

int sde_engine_wait_timeout(sde_engine *eng, uint64_t timeout_ns)
{
    if (eng->nearly || io_uring_cq_ready(&eng->ring))
        return 0;
    struct __kernel_timespec ts = {.tv_sec = (long long)(timeout_ns / 1000000000ull),
                                   .tv_nsec = (long long)(timeout_ns % 1000000000ull)};
    struct io_uring_cqe *cqe;
    int ret = io_uring_wait_cqe_timeout(&eng->ring, &cqe, &ts);
    return ret == -EINTR ? 0 : ret;
}

int sde_engine_take_poll(sde_engine *eng)
{
    int fired = eng->poll_fired;
    eng->poll_fired = 0;
    return fired;
}

uint32_t sde_inflight(const sde_engine *eng) { return eng->inflight; }

void sde_get_stats(const sde_engine *eng, sde_stats *out) { *out = eng->stats; }
