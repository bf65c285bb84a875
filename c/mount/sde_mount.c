/*
 * ssdemu-mount: the drive's namespaces as files, for software that knows only files
 * (`ssdemu mount --socket S DIR` runs it).  Each namespace this client owns (its uid, and the
 * owner key of $SSDEMU_OWNER_KEY_FILE or --owner-key-file) is DIR/nsN, a file of the
 * namespace's size: reads and writes become the drive's READ and WRITE (each completion waits
 * for its modelled time, as for any client), fsync and fdatasync its FLUSH.  Files are
 * opened direct_io: no page cache between a program and the drive, so every I/O a program
 * issues is one the drive sees (and O_DIRECT opens work; losetup --direct-io=on on a file
 * here gives a block device whose every I/O is the drive's).
 *
 * libfuse3's multithreaded loop; each of its threads is a client queue pair of its own with a
 * registered buffer (c/client), so threads never share a ring.  A request not on sector
 * boundaries is read-modify-written around the sectors it touches (under one lock: two
 * such writes of one sector must not lose either).  SIGTERM, SIGINT and SIGHUP unmount.
 */
#define FUSE_USE_VERSION 312 /* libfuse 3.12: fuse_loop_cfg_create */
#include <errno.h>
#include <fuse.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../client/sde_client.h"

#define MAX_NS SDE_CLIENT_MAX_NS
#define CHUNK (1u << 20) /* one command's most (the drive's max_io_bytes, at most) */

static struct {
    const char *socket_path, *owner_key_file;
    sde_client ctl;            /* the control connection: queue pairs and buffers */
    pthread_mutex_t ctl_lock;  /* held for control requests */
    pthread_mutex_t rmw_lock;  /* held across a read-modify-write of partial sectors */
    uint32_t nsids[MAX_NS];
    uint64_t bytes[MAX_NS];
    int nns;
    uint32_t chunk;
    uid_t uid;
    gid_t gid;
} M;

/* A loop thread's own queue pair and buffer. */
typedef struct lane {
    sde_client_qp qp;
    char *buf;
    uint32_t handle;
    uint16_t cid;
} lane;

/* Each loop thread's lane, given back when the thread ends: libfuse ends idle threads and
 * starts new ones under load, and a lane kept past its thread would hold a queue pair and a
 * registered buffer of the uid's quota for nothing. */
static pthread_key_t lane_key;

static void lane_free(void *p)
{
    lane *l = p;
    pthread_mutex_lock(&M.ctl_lock);
    sde_client_buffer_free(&M.ctl, l->buf, M.chunk, l->handle);
    sde_client_qp_destroy(&M.ctl, &l->qp);
    pthread_mutex_unlock(&M.ctl_lock);
    free(l);
}

static lane *get_lane(void)
{
    lane *l = pthread_getspecific(lane_key);
    if (l)
        return l;
    l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    pthread_mutex_lock(&M.ctl_lock);
    int ok = sde_client_qp_create(&M.ctl, &l->qp, 8) == 0 &&
             (l->buf = sde_client_buffer(&M.ctl, M.chunk, &l->handle)) != NULL;
    if (!ok)
        fprintf(stderr, "ssdemu-mount: %s\n", M.ctl.err);
    pthread_mutex_unlock(&M.ctl_lock);
    if (!ok) {
        if (l->qp.mem)
            sde_client_qp_close(&l->qp);
        free(l);
        return NULL;
    }
    pthread_setspecific(lane_key, l);
    return l;
}

/* One command on this thread's lane, waited for: 0 or -errno. */
static int run(lane *l, uint8_t opcode, uint32_t nsid, uint64_t off, uint32_t len)
{
    sde_sqe s = {.opcode = opcode, .cid = ++l->cid, .nsid = nsid, .lba =
                 off / M.ctl.block_bytes, .length = len};
    if (opcode == SDE_CMD_READ || opcode == SDE_CMD_WRITE)
        s.buf = l->handle;
    sde_cqe c;
    int st = sde_client_run(&M.ctl, &l->qp, &s, &c);
    if (st < 0)
        return -EIO; /* the daemon is gone */
    switch (st) {
    case SDE_SC_SUCCESS: return 0;
    case SDE_SC_LBA_OUT_OF_RANGE: return -EINVAL;
    case SDE_SC_CAPACITY_EXCEEDED: return -ENOSPC;
    case SDE_SC_ACCESS_DENIED: return -EACCES;
    default: return -EIO;
    }
}

static int ns_of(const char *path)
{
    unsigned n;
    char tail;
    if (sscanf(path, "/ns%u%c", &n, &tail) != 1)
        return -1;
    for (int i = 0; i < M.nns; i++)
        if (M.nsids[i] == n)
            return i;
    return -1;
}

static int m_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    (void)fi;
    memset(st, 0, sizeof *st);
    st->st_uid = M.uid;
    st->st_gid = M.gid;
    if (!strcmp(path, "/")) {
        st->st_mode = S_IFDIR | 0700;
        st->st_nlink = 2;
        return 0;
    }
    int i = ns_of(path);
    if (i < 0)
        return -ENOENT;
    st->st_mode = S_IFREG | 0600;
    st->st_nlink = 1;
    st->st_size = (off_t)M.bytes[i];
    st->st_blksize = (blksize_t)M.ctl.block_bytes;
    st->st_blocks = (blkcnt_t)(M.bytes[i] / 512);
    return 0;
}

static int m_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                     struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)off, (void)fi, (void)flags;
    if (strcmp(path, "/"))
        return -ENOTDIR;
    fill(buf, ".", NULL, 0, 0);
    fill(buf, "..", NULL, 0, 0);
    for (int i = 0; i < M.nns; i++) {
        char name[16];
        snprintf(name, sizeof name, "ns%u", M.nsids[i]);
        fill(buf, name, NULL, 0, 0);
    }
    return 0;
}

static int m_open(const char *path, struct fuse_file_info *fi)
{
    if (ns_of(path) < 0)
        return -ENOENT;
    if (fi->flags & O_TRUNC)
        return -EPERM; /* a namespace's size is the drive's */
    fi->direct_io = 1;
    fi->keep_cache = 0;
    fi->fh = (uint64_t)ns_of(path);
    return 0;
}

/* Bytes [off, off + size) of namespace i, in pieces of at most one buffer; write: from
 * data, else into it.  Partial sectors at either end: the sectors read, patched, written. */
static int transfer(int i, char *data, size_t size, off_t off, int write)
{
    lane *l = get_lane();
    if (!l)
        return -EIO;
    uint64_t bs = M.ctl.block_bytes, end = (uint64_t)off + size;
    if ((uint64_t)off >= M.bytes[i])
        return 0;
    if (end > M.bytes[i])
        end = M.bytes[i];
    size_t done = 0;
    while ((uint64_t)off + done < end) {
        uint64_t at = (uint64_t)off + done;
        uint64_t lo = at / bs * bs;            /* the sectors this piece covers */
        uint64_t hi = lo + M.chunk;
        if (hi > (end + bs - 1) / bs * bs)
            hi = (end + bs - 1) / bs * bs;
        uint64_t upto = hi < end ? hi : end;   /* the bytes of it asked for */
        int partial = at != lo || upto != hi;
        int r = 0;
        if (write && partial)
            pthread_mutex_lock(&M.rmw_lock);
        if (!write || partial)
            r = run(l, SDE_CMD_READ, M.nsids[i], lo, (uint32_t)(hi - lo));
        if (!r && write) {
            memcpy(l->buf + (at - lo), data + done, upto - at);
            r = run(l, SDE_CMD_WRITE, M.nsids[i], lo, (uint32_t)(hi - lo));
        } else if (!r)
            memcpy(data + done, l->buf + (at - lo), upto - at);
        if (write && partial)
            pthread_mutex_unlock(&M.rmw_lock);
        if (r)
            return done ? (int)done : r;
        done += upto - at;
    }
    return (int)done;
}

static int m_read(const char *path, char *buf, size_t size, off_t off,
                  struct fuse_file_info *fi)
{
    (void)path;
    return transfer((int)fi->fh, buf, size, off, 0);
}

static int m_write(const char *path, const char *buf, size_t size, off_t off,
                   struct fuse_file_info *fi)
{
    (void)path;
    if ((uint64_t)off + size > M.bytes[fi->fh])
        return -ENOSPC; /* past the namespace: a file here never grows */
    return transfer((int)fi->fh, (char *)buf, size, off, 1);
}

static int m_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path, (void)datasync;
    lane *l = get_lane();
    return l ? run(l, SDE_CMD_FLUSH, M.nsids[fi->fh], 0, 0) : -EIO;
}

static int m_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    (void)fi;
    int i = ns_of(path);
    if (i < 0)
        return -ENOENT;
    return (uint64_t)size == M.bytes[i] ? 0 : -EPERM;
}

static int m_statfs(const char *path, struct statvfs *st)
{
    (void)path;
    memset(st, 0, sizeof *st);
    uint64_t total = 0;
    for (int i = 0; i < M.nns; i++)
        total += M.bytes[i];
    st->f_bsize = st->f_frsize = M.ctl.block_bytes;
    st->f_blocks = total / M.ctl.block_bytes;
    st->f_namemax = 16;
    return 0;
}

static void *m_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    conn->max_write = M.chunk; /* a program's large request: one drive command a buffer */
    conn->max_read = M.chunk;
    cfg->direct_io = 1;   /* no page cache: each I/O is the drive's */
    cfg->kernel_cache = 0;
    cfg->attr_timeout = 60; /* the sizes never change while mounted */
    cfg->entry_timeout = 60;
    return NULL;
}

static const struct fuse_operations ops = {
    .init = m_init,
    .getattr = m_getattr,
    .readdir = m_readdir,
    .open = m_open,
    .read = m_read,
    .write = m_write,
    .fsync = m_fsync,
    .truncate = m_truncate,
    .statfs = m_statfs,
};

/* The namespaces with blocks this client owns, through a lane of the main thread. */
static int find_namespaces(void)
{
    lane *l = get_lane();
    uint32_t nsids[SDE_CLIENT_MAX_NS];
    uint64_t bytes[SDE_CLIENT_MAX_NS];
    int n = l ? sde_client_namespaces(&M.ctl, &l->qp, l->buf, l->handle, M.chunk, nsids, bytes,
                                      SDE_CLIENT_MAX_NS) : -1;
    if (n < 0) {
        fprintf(stderr, "ssdemu-mount: %s\n", M.ctl.err);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (bytes[i]) {
            M.nsids[M.nns] = nsids[i];
            M.bytes[M.nns++] = bytes[i];
        }
    return 0;
}

/* Whether dir is a mount point already (its device is not its parent's). */
static int mounted_already(const char *dir)
{
    char parent[4096];
    struct stat a, b;
    snprintf(parent, sizeof parent, "%s/..", dir);
    return stat(dir, &a) == 0 && stat(parent, &b) == 0 &&
           (a.st_dev != b.st_dev || a.st_ino == b.st_ino);
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: ssdemu-mount SOCKET DIR [OWNER_KEY_FILE]\n");
        return 2;
    }
    M.socket_path = argv[1];
    M.owner_key_file = argc == 4 ? argv[3] : NULL;
    const char *dir = argv[2];
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ssdemu-mount: %s is not a directory\n", dir);
        return 1;
    }
    if (mounted_already(dir)) {
        fprintf(stderr, "ssdemu-mount: %s is busy: something is mounted there already\n",
                dir);
        return 1;
    }
    if (access("/dev/fuse", R_OK | W_OK)) {
        fprintf(stderr, "ssdemu-mount: FUSE is missing (/dev/fuse: %s): modprobe fuse, or "
                "apt-get install fuse3\n", strerror(errno));
        return 1;
    }
    pthread_mutex_init(&M.ctl_lock, NULL);
    pthread_key_create(&lane_key, lane_free);
    pthread_mutex_init(&M.rmw_lock, NULL);
    M.uid = getuid();
    M.gid = getgid();
    if (sde_client_connect(&M.ctl, M.socket_path, M.owner_key_file)) {
        fprintf(stderr, "ssdemu-mount: %s\n", M.ctl.err);
        return 1;
    }
    M.chunk = M.ctl.max_io_bytes < CHUNK ? (uint32_t)M.ctl.max_io_bytes : CHUNK;
    if (find_namespaces())
        return 1;
    if (!M.nns)
        fprintf(stderr, "ssdemu-mount: this client owns no namespace with blocks: the "
                "mount is empty\n");
    /* many threads, requests up to one buffer; unmounted on SIGTERM, SIGINT, SIGHUP */
    char opts[96];
    snprintf(opts, sizeof opts, "fsname=ssdemu,subtype=ssdemu,default_permissions,max_read=%u",
             M.chunk);
    char *fargv[] = {argv[0], "-o", opts, NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
    struct fuse *f = fuse_new(&args, &ops, sizeof ops, NULL);
    int r = 1;
    if (f && fuse_mount(f, dir) == 0) {
        struct fuse_loop_config *cfg = fuse_loop_cfg_create();
        if (cfg && fuse_set_signal_handlers(fuse_get_session(f)) == 0) {
            fprintf(stderr, "ssdemu-mount: %d namespace(s) at %s\n", M.nns, dir);
            /* a signal ends the loop with its number: that is the ordinary way out */
            int e = fuse_loop_mt(f, cfg);
            r = e == 0 || e == SIGTERM || e == SIGINT || e == SIGHUP ? 0 : 1;
            fuse_remove_signal_handlers(fuse_get_session(f));
        }
        if (cfg)
            fuse_loop_cfg_destroy(cfg);
        fuse_unmount(f);
    } else
        fprintf(stderr, "ssdemu-mount: cannot mount at %s (the reason above)\n", dir);
    if (f)
        fuse_destroy(f);
    fuse_opt_free_args(&args);
    sde_client_close(&M.ctl);
    return r;
}
