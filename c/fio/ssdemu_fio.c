/*
 * fio's external ioengine for the emulated drive, as SPDK's plugin is for its queues:
 *
 *   fio --ioengine=external:ssdemu-fio.so --filename=/run/ssdemu.sock --nsid=1 JOB...
 *
 * Each job is a client of its own (its own connection and queue pair), sized to its iodepth.
 * fio's buffers are the client's registered shared memory (iomem_alloc): a read lands where
 * fio looks, a write is read where fio wrote it, no copy on either side.  Reads, writes,
 * trims (DEALLOCATE) and fsync/fdatasync (FLUSH) go through sde_queue.h's commands;
 * completions carry the drive's status, turned into an errno fio reports.  Built against the
 * installed fio's own source (`make fio-engine`): its FIO_IOOPS_VERSION and struct layouts.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

#include "../client/sde_client.h"

struct ssdemu_options {
    void *pad; /* fio's rule: an engine's options start past a pointer */
    unsigned int nsid;
    char *owner_key_file;
};

struct ssdemu_data {
    sde_client c;
    sde_client_qp qp;
    char *buf;               /* fio's buffers: registered shared memory */
    size_t buf_bytes;
    uint32_t handle;
    struct io_u **inflight;  /* by cid (the io_u's index) */
    sde_sqe *pending;        /* queued, not yet committed */
    struct io_u **queued;    /* their io_us, for fio's issue times */
    uint32_t npending;
    struct io_u **events;    /* reaped, for event() */
    sde_cqe *cqes;
    uint32_t nsid;
};

static struct fio_option options[] = {
    {
        .name = "nsid",
        .lname = "ssdemu namespace",
        .type = FIO_OPT_INT,
        .off1 = offsetof(struct ssdemu_options, nsid),
        .def = "0",
        .help = "the namespace to run on (0: this client's first with blocks)",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "owner_key_file",
        .lname = "ssdemu owner key file",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct ssdemu_options, owner_key_file),
        .help = "the owner key the namespace was created with (default $SSDEMU_OWNER_KEY_FILE)",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {.name = NULL},
};

static int say(struct thread_data *td, const char *what)
{
    log_err("fio: ssdemu: %s: %s\n", td->o.name, what);
    return 1;
}

static uint32_t pow2_at_least(uint32_t n)
{
    uint32_t e = 2;
    while (e < n)
        e <<= 1;
    return e;
}

/* The namespace's id (the option, or this client's first with blocks) and bytes, from one
 * NS_LIST; the client is connected, qp made, buf registered. */
static int64_t namespace_size(struct ssdemu_data *d, struct ssdemu_options *o, void *buf,
                              uint32_t handle, uint32_t len)
{
    uint32_t nsids[SDE_CLIENT_MAX_NS];
    uint64_t bytes[SDE_CLIENT_MAX_NS];
    int n = sde_client_namespaces(&d->c, &d->qp, buf, handle, len, nsids, bytes,
                                  SDE_CLIENT_MAX_NS);
    if (n < 0)
        return -1;
    if (o->nsid) {
        d->nsid = o->nsid;
        return sde_client_ns_bytes(&d->c, nsids, bytes, n, o->nsid);
    }
    for (int i = 0; i < n; i++)
        if (bytes[i]) {
            d->nsid = nsids[i];
            return (int64_t)bytes[i];
        }
    snprintf(d->c.err, sizeof d->c.err, "this client has no namespace with blocks "
             "(create one: ssdemu ctl ns-create)");
    return -1;
}

/* Connect, make a queue pair of at least `depth` slots, and find the namespace. */
static int attach(struct thread_data *td, struct ssdemu_data *d, uint32_t depth,
                  int64_t *bytes)
{
    struct ssdemu_options *o = td->eo;
    const char *sock = td->files_index ? td->files[0]->file_name : td->o.filename;
    if (!sock || !*sock)
        return say(td, "no socket: give the daemon's socket as --filename");
    if (td->files_index > 1)
        return say(td, "one socket a job (its namespace is --nsid)");
    if (sde_client_connect(&d->c, sock, o->owner_key_file))
        return say(td, d->c.err);
    if (sde_client_qp_create(&d->c, &d->qp, pow2_at_least(depth)))
        return say(td, d->c.err);
    uint32_t handle, len = 64 * 1024;
    void *list = sde_client_buffer(&d->c, len, &handle);
    if (!list)
        return say(td, d->c.err);
    *bytes = namespace_size(d, o, list, handle, len);
    sde_client_buffer_free(&d->c, list, len, handle);
    return *bytes < 0 ? say(td, d->c.err) : 0;
}

static void detach(struct ssdemu_data *d)
{
    if (d->buf)
        sde_client_buffer_free(&d->c, d->buf, d->buf_bytes, d->handle);
    d->buf = NULL;
    if (d->qp.mem)
        sde_client_qp_close(&d->qp);
    if (d->c.sock > 0)
        sde_client_close(&d->c);
}

/* fio's main process, before the jobs start: the namespace's size, so that fio lays out
 * the job (size=, offsets) on it.  The block size is checked here, once, with one line. */
static int ssdemu_setup(struct thread_data *td)
{
    struct ssdemu_data d = {0};
    int64_t bytes = 0;
    d.c.sock = -1;
    int r = attach(td, &d, 2, &bytes);
    uint32_t block = d.c.block_bytes;
    detach(&d);
    if (r)
        return r;
    for (int ddir = DDIR_READ; ddir <= DDIR_TRIM; ddir++)
        if (td->o.min_bs[ddir] % block || td->o.max_bs[ddir] % block) {
            char why[128];
            snprintf(why, sizeof why, "block size %llu is not a multiple of the drive's "
                     "%u-byte sector", (unsigned long long)td->o.min_bs[ddir], block);
            return say(td, why);
        }
    for (unsigned i = 0; i < td->files_index; i++) {
        struct fio_file *f = td->files[i];
        f->real_file_size = (uint64_t)bytes;
        fio_file_set_size_known(f);
        f->filetype = FIO_TYPE_CHAR; /* no fadvise, no unlink, no extend: a device */
    }
    return 0;
}

static int ssdemu_init(struct thread_data *td)
{
    struct ssdemu_data *d = calloc(1, sizeof *d);
    uint32_t depth = td->o.iodepth ? td->o.iodepth : 1;
    if (!d)
        return say(td, "out of memory");
    d->c.sock = -1;
    td->io_ops_data = d;
    int64_t bytes;
    if (attach(td, d, depth, &bytes))
        return 1;
    d->inflight = calloc(d->qp.entries, sizeof *d->inflight);
    d->queued = calloc(d->qp.entries, sizeof *d->queued);
    d->events = calloc(d->qp.entries, sizeof *d->events);
    d->pending = calloc(d->qp.entries, sizeof *d->pending);
    d->cqes = calloc(d->qp.entries, sizeof *d->cqes);
    if (!d->inflight || !d->queued || !d->events || !d->pending || !d->cqes)
        return say(td, "out of memory");
    return 0;
}

static void ssdemu_cleanup(struct thread_data *td)
{
    struct ssdemu_data *d = td->io_ops_data;
    if (!d)
        return;
    detach(d);
    free(d->inflight);
    free(d->queued);
    free(d->events);
    free(d->pending);
    free(d->cqes);
    free(d);
    td->io_ops_data = NULL;
}

/* fio's buffers, in memory the daemon maps: the zero copy. */
static int ssdemu_iomem_alloc(struct thread_data *td, size_t total)
{
    struct ssdemu_data *d = td->io_ops_data;
    uint32_t handle;
    void *mem = sde_client_buffer(&d->c, total, &handle);
    if (!mem)
        return say(td, d->c.err);
    d->buf = mem;
    d->buf_bytes = total;
    d->handle = handle;
    td->orig_buffer = mem;
    return 0;
}

static void ssdemu_iomem_free(struct thread_data *td)
{
    struct ssdemu_data *d = td->io_ops_data;
    if (d && d->buf) {
        sde_client_buffer_free(&d->c, d->buf, d->buf_bytes, d->handle);
        d->buf = NULL;
    }
    td->orig_buffer = NULL;
}

static int ssdemu_open(struct thread_data *td, struct fio_file *f)
{
    (void)td;
    f->fd = 0; /* no descriptor: the job's queue pair is the file */
    return 0;
}

static int ssdemu_close(struct thread_data *td, struct fio_file *f)
{
    (void)td;
    f->fd = -1;
    return 0;
}

static enum fio_q_status ssdemu_queue(struct thread_data *td, struct io_u *io_u)
{
    struct ssdemu_data *d = td->io_ops_data;
    sde_sqe *s = &d->pending[d->npending];
    memset(s, 0, sizeof *s);
    s->cid = (uint16_t)io_u->index;
    s->nsid = d->nsid;
    switch (io_u->ddir) {
    case DDIR_READ:
    case DDIR_WRITE:
        s->opcode = io_u->ddir == DDIR_READ ? SDE_CMD_READ : SDE_CMD_WRITE;
        s->buf = d->handle;
        s->buf_offset = (uint64_t)((char *)io_u->xfer_buf - d->buf);
        if ((char *)io_u->xfer_buf < d->buf ||
            s->buf_offset + io_u->xfer_buflen > d->buf_bytes) {
            io_u->error = EFAULT; /* not fio's buffers: a mem= option would do this */
            return FIO_Q_COMPLETED;
        }
        /* fall through */
    case DDIR_TRIM:
        s->opcode = s->opcode ? s->opcode : SDE_CMD_DEALLOCATE;
        s->lba = io_u->offset / d->c.block_bytes;
        s->length = (uint32_t)io_u->xfer_buflen;
        break;
    case DDIR_SYNC:
    case DDIR_DATASYNC:
        s->opcode = SDE_CMD_FLUSH;
        break;
    default:
        io_u->error = EINVAL;
        return FIO_Q_COMPLETED;
    }
    if (io_u->index >= d->qp.entries || d->npending >= d->qp.entries) {
        io_u->error = EBUSY;
        return FIO_Q_COMPLETED;
    }
    d->inflight[io_u->index] = io_u;
    d->queued[d->npending++] = io_u;
    return FIO_Q_QUEUED;
}

static int ssdemu_commit(struct thread_data *td)
{
    struct ssdemu_data *d = td->io_ops_data;
    if (!d->npending)
        return 0;
    if (fio_fill_issue_time(td)) {
        struct timespec now;
        fio_gettime(&now, NULL);
        for (uint32_t i = 0; i < d->npending; i++) {
            memcpy(&d->queued[i]->issue_time, &now, sizeof now);
            io_u_queued(td, d->queued[i]);
        }
    }
    int r = sde_client_submit(&d->c, &d->qp, d->pending, d->npending);
    io_u_mark_submit(td, d->npending);
    d->npending = 0;
    if (r)
        log_err("fio: ssdemu: %s\n", d->c.err);
    return r ? -EIO : 0;
}

/* The drive's status as the errno fio reports. */
static int status_errno(int status)
{
    switch (status) {
    case SDE_SC_SUCCESS: return 0;
    case SDE_SC_LBA_OUT_OF_RANGE: return ERANGE;
    case SDE_SC_CAPACITY_EXCEEDED: return ENOSPC;
    case SDE_SC_ACCESS_DENIED: return EACCES;
    case SDE_SC_INVALID_FIELD:
    case SDE_SC_INVALID_NAMESPACE:
    case SDE_SC_INVALID_BUFFER:
    case SDE_SC_INVALID_OPCODE: return EINVAL;
    case SDE_SC_ABORTED: return ECANCELED;
    default: return EIO; /* MEDIA_ERROR, INTERNAL */
    }
}

static int ssdemu_getevents(struct thread_data *td, unsigned int min, unsigned int max,
                            const struct timespec *t)
{
    struct ssdemu_data *d = td->io_ops_data;
    uint64_t timeout = t ? (uint64_t)t->tv_sec * 1000000000ull + (uint64_t)t->tv_nsec : 0;
    if (max > d->qp.entries)
        max = d->qp.entries;
    int n = sde_client_reap(&d->c, &d->qp, d->cqes, max, min, timeout);
    if (n < 0) {
        log_err("fio: ssdemu: %s\n", d->c.err);
        return n;
    }
    for (int i = 0; i < n; i++) {
        struct io_u *io_u = d->inflight[d->cqes[i].cid % d->qp.entries];
        io_u->error = status_errno(d->cqes[i].status);
        if (!io_u->error)
            io_u->resid = 0;
        d->events[i] = io_u;
    }
    return n;
}

static struct io_u *ssdemu_event(struct thread_data *td, int event)
{
    struct ssdemu_data *d = td->io_ops_data;
    return d->events[event];
}

struct ioengine_ops ioengine = {
    .name = "ssdemu",
    .version = FIO_IOOPS_VERSION,
    /* the issue time is stamped in commit, before the command is published: fio's own stamp
     * would come after the submit (and its doorbell), and clat would miss that part */
    .flags = FIO_DISKLESSIO | FIO_NODISKUTIL | FIO_NOEXTEND | FIO_RAWIO |
             FIO_ASYNCIO_SETS_ISSUE_TIME,
    .setup = ssdemu_setup,
    .init = ssdemu_init,
    .queue = ssdemu_queue,
    .commit = ssdemu_commit,
    .getevents = ssdemu_getevents,
    .event = ssdemu_event,
    .cleanup = ssdemu_cleanup,
    .open_file = ssdemu_open,
    .close_file = ssdemu_close,
    .iomem_alloc = ssdemu_iomem_alloc,
    .iomem_free = ssdemu_iomem_free,
    .options = options,
    .option_struct_size = sizeof(struct ssdemu_options),
};
