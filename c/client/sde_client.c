/* A client of the drive in C: see sde_client.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sde_client.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_MESSAGE (64 * 1024) /* ssdemu_wire/control.py */
#define MAX_FDS 4
/* hostlib's SPIN_NS: a waiter polls this long before it sleeps (sde_cq_wait gives the CPU
 * back when it shares the data plane's, and stops spinning on a crowded host) */
#define SPIN_NS 50000
#define SHALLOW 2               /* commands in flight up to which a waiter always polls */
#define KEY_TEXT 160            /* an owner key's hex, 64 bytes at most, and its newline */
#define CONTROL_TIMEOUT_S 10    /* a daemon that answers nothing this long is stuck */

static void hang_up(sde_client *c);

static int fail(sde_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- the control plane: one JSON object a message ---------------------------------------- */

static int send_msg(sde_client *c, const char *text, const int *fds, int nfds)
{
    struct iovec iov = {(void *)text, strlen(text)};
    char ctl[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        memset(ctl, 0, sizeof ctl);
        m.msg_control = ctl;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    if (sendmsg(c->sock, &m, MSG_NOSIGNAL) < 0)
        return fail(c, "lost the daemon: %s", strerror(errno));
    return 0;
}

/* One reply into buf (NUL-terminated), its descriptors into fds; the count of descriptors,
 * or -1.  A reply that says ok false is an error with the daemon's words. */
static int recv_msg(sde_client *c, char *buf, size_t cap, int *fds)
{
    struct iovec iov = {buf, cap - 1};
    char ctl[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(c->sock, &m, MSG_CMSG_CLOEXEC);
    if (n <= 0)
        return fail(c, "the daemon closed the connection%s%s", n < 0 ? ": " : "",
                    n < 0 ? strerror(errno) : "");
    buf[n] = 0;
    int nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(fds + nfds, CMSG_DATA(cm), sizeof(int) * (size_t)k);
            nfds += k;
        }
    if (!strstr(buf, "\"ok\": true")) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        const char *e = strstr(buf, "\"error\": \"");
        if (!e)
            return fail(c, "the daemon refused the request");
        e += 10;
        const char *end = strchr(e, '"');
        return fail(c, "%.*s", (int)(end ? end - e : (long)strlen(e)), e);
    }
    return nfds;
}

/* The integer after "name": in a JSON text (from `from` on); -1 if absent. */
static int64_t json_int(const char *text, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", name);
    const char *p = strstr(text, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

static int request(sde_client *c, const char *msg, const int *fds, int nfds, char *reply,
                   int *rfds)
{
    if (send_msg(c, msg, fds, nfds))
        return -1;
    return recv_msg(c, reply, MAX_MESSAGE, rfds);
}

/* ---- connect ----------------------------------------------------------------------------- */

/* The owner key in path as hexadecimal text, refused as hostlib refuses it
 * (ssdemu_wire/owner_key.py): not a regular file, not this user's, open to others. */
static int load_key(sde_client *c, const char *path, char *hex)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return fail(c, "cannot read owner key %s: %s", path, strerror(errno));
    struct stat st;
    ssize_t n = fstat(fd, &st) ? -1 : read(fd, hex, KEY_TEXT - 1);
    close(fd);
    if (n < 0 || !S_ISREG(st.st_mode))
        return fail(c, "owner key %s is not a regular file", path);
    if (st.st_uid != getuid())
        return fail(c, "owner key %s belongs to uid %u, not to this user", path, st.st_uid);
    if (st.st_mode & 077)
        return fail(c, "owner key %s is open to others (mode %04o): chmod 600 it", path,
                    st.st_mode & 07777);
    while (n > 0 && (hex[n - 1] == '\n' || hex[n - 1] == ' '))
        n--;
    hex[n] = 0;
    if (n < 32 || n > 128 || n % 2 || strspn(hex, "0123456789abcdefABCDEF") != (size_t)n)
        return fail(c, "owner key %s: an owner key is 16 to 64 bytes of hex text", path);
    return 0;
}

int sde_client_connect(sde_client *c, const char *socket_path, const char *owner_key_file)
{
    memset(c, 0, sizeof *c);
    c->sock = -1;
    char hello[256];
    snprintf(hello, sizeof hello, "{\"op\": \"hello\", \"version\": %d}", SDE_PROTOCOL_VERSION);
    if (!owner_key_file || !*owner_key_file)
        owner_key_file = getenv("SSDEMU_OWNER_KEY_FILE");
    if (owner_key_file && *owner_key_file) {
        char hex[KEY_TEXT];
        if (load_key(c, owner_key_file, hex))
            return -1;
        snprintf(hello, sizeof hello, "{\"op\": \"hello\", \"version\": %d, \"owner_key\": "
                 "\"%s\"}", SDE_PROTOCOL_VERSION, hex);
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof a.sun_path)
        return fail(c, "socket path too long: %s", socket_path);
    strcpy(a.sun_path, socket_path);
    c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct timeval tv = {CONTROL_TIMEOUT_S, 0};
    setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(c->sock, (struct sockaddr *)&a, sizeof a)) {
        fail(c, "cannot reach ssdemu at %s: %s", socket_path, strerror(errno));
        hang_up(c);
        return -1;
    }
    char *reply = malloc(MAX_MESSAGE);
    int fds[MAX_FDS];
    int r = reply ? request(c, hello, NULL, 0, reply, fds) : fail(c, "out of memory");
    if (r >= 0) {
        c->block_bytes = (uint32_t)json_int(reply, "logical_block_bytes");
        c->max_io_bytes = (uint64_t)json_int(reply, "max_io_bytes");
        if (!c->block_bytes || !c->max_io_bytes)
            r = fail(c, "the daemon's hello names no block size");
    }
    free(reply);
    if (r < 0) {
        hang_up(c);
        return -1;
    }
    return 0;
}

/* The connection closed; after a failure, without the goodbye (whose own failure would
 * take the place of the reason in c->err). */
static void hang_up(sde_client *c)
{
    if (c->sock >= 0)
        close(c->sock);
    c->sock = -1;
}

void sde_client_close(sde_client *c)
{
    if (c->sock >= 0)
        send_msg(c, "{\"op\": \"bye\"}", NULL, 0);
    hang_up(c);
}

/* ---- queue pairs and buffers ------------------------------------------------------------- */

int sde_client_qp_create(sde_client *c, sde_client_qp *qp, uint32_t entries)
{
    char msg[96], *reply = malloc(MAX_MESSAGE);
    int fds[MAX_FDS];
    memset(qp, 0, sizeof *qp);
    if (!reply)
        return fail(c, "out of memory");
    snprintf(msg, sizeof msg, "{\"op\": \"create_qp\", \"entries\": %u}", entries);
    int n = request(c, msg, NULL, 0, reply, fds);
    int64_t bytes = n >= 0 ? json_int(reply, "bytes") : -1;
    qp->qid = n >= 0 ? (uint32_t)json_int(reply, "qid") : 0;
    free(reply);
    if (n < 0)
        return -1;
    if (n != 3 || bytes <= 0) {
        for (int i = 0; i < n; i++)
            close(fds[i]);
        return fail(c, "create_qp: the daemon sent %d descriptors", n);
    }
    /* the daemon sends the ring's memfd, then the doorbell, then the completion eventfd */
    qp->mem = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    close(fds[0]);
    qp->doorbell_fd = fds[1];
    qp->completion_fd = fds[2];
    qp->bytes = (uint64_t)bytes;
    if (qp->mem == MAP_FAILED || sde_qp_check(qp->mem, qp->bytes)) {
        qp->mem = qp->mem == MAP_FAILED ? NULL : qp->mem;
        sde_client_qp_close(qp);
        return fail(c, "create_qp: the queue pair's memory is unusable");
    }
    qp->entries = ((sde_ring_hdr *)qp->mem)->sq_entries;
    return 0;
}

void sde_client_qp_close(sde_client_qp *qp)
{
    if (qp->mem)
        munmap(qp->mem, qp->bytes);
    if (qp->doorbell_fd > 0)
        close(qp->doorbell_fd);
    if (qp->completion_fd > 0)
        close(qp->completion_fd);
    memset(qp, 0, sizeof *qp);
}

void sde_client_qp_destroy(sde_client *c, sde_client_qp *qp)
{
    char msg[96], *reply = malloc(MAX_MESSAGE);
    int fds[MAX_FDS];
    snprintf(msg, sizeof msg, "{\"op\": \"destroy_qp\", \"qid\": %u}", qp->qid);
    if (reply && c->sock >= 0)
        request(c, msg, NULL, 0, reply, fds); /* a gone daemon has let go of it already */
    free(reply);
    sde_client_qp_close(qp);
}

void *sde_client_buffer(sde_client *c, size_t bytes, uint32_t *handle)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    bytes = (bytes + page - 1) / page * page;
    int fd = memfd_create("ssdemu-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        fail(c, "memfd_create: %s", strerror(errno));
        return NULL;
    }
    void *mem = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW))
        fail(c, "buffer of %zu bytes: %s", bytes, strerror(errno));
    else if ((mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        fail(c, "buffer of %zu bytes: mmap: %s", bytes, strerror(errno));
    char msg[96], *reply = malloc(MAX_MESSAGE);
    int rfds[MAX_FDS], r = -1;
    if (mem != MAP_FAILED && reply) {
        snprintf(msg, sizeof msg, "{\"op\": \"register_buffer\", \"bytes\": %zu}", bytes);
        r = request(c, msg, &fd, 1, reply, rfds);
        if (r >= 0)
            *handle = (uint32_t)json_int(reply, "handle");
    }
    free(reply);
    close(fd);
    if (r < 0 && mem != MAP_FAILED)
        munmap(mem, bytes);
    return r < 0 ? NULL : mem;
}

void sde_client_buffer_free(sde_client *c, void *mem, size_t bytes, uint32_t handle)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char msg[96], *reply = malloc(MAX_MESSAGE);
    int fds[MAX_FDS];
    snprintf(msg, sizeof msg, "{\"op\": \"unregister_buffer\", \"handle\": %u}", handle);
    if (reply && c->sock >= 0)
        request(c, msg, NULL, 0, reply, fds); /* a gone daemon has let go of it already */
    free(reply);
    munmap(mem, (bytes + page - 1) / page * page);
}

/* ---- commands ---------------------------------------------------------------------------- */

/* How long a waiter polls before it sleeps.  With few commands in flight, SPIN_NS as hostlib:
 * the next completion is the one it waits for, and a sleep costs a wake-up (fio QD1 4 KiB
 * reads on star2000d, modelled 57 us: p50 84 us spinning, 126 us asleep at once).  With a
 * deep queue the data plane is busy making completions, and a waiter polling beside it on a
 * small host takes the CPU it needs: only while the data plane says the host has a CPU to
 * spare, as bench queue's loop (fio QD32 on mem media beside a core-spinning neighbour: 720K
 * IOPS so, 480K polling; on a quiet host the two are one: the data plane then says spare). */
static uint64_t spin_for(const sde_client_qp *qp)
{
    const sde_ring_hdr *h = qp->mem;
    uint32_t inflight = __atomic_load_n(&h->sq_tail, __ATOMIC_RELAXED) -
                        __atomic_load_n(&h->cq_head, __ATOMIC_RELAXED);
    if (inflight <= SHALLOW)
        return SPIN_NS;
    return __atomic_load_n(&h->daemon_cpu, __ATOMIC_RELAXED) ? 0 : SPIN_NS;
}

int sde_client_submit(sde_client *c, sde_client_qp *qp, const sde_sqe *sqes, uint32_t n)
{
    while (n) {
        int kicked, k = sde_sq_submit(qp->mem, sqes, n, qp->doorbell_fd, &kicked);
        if (k < 0)
            return fail(c, "submit: %s", strerror(-k)), k;
        sqes += k;
        n -= (uint32_t)k;
        if (n) { /* the ring is full: the caller reaps first, or the daemon drains it */
            const sde_ring_hdr *h = qp->mem;
            if (__atomic_load_n(&h->sq_flags, __ATOMIC_ACQUIRE) & SDE_SQF_DEAD)
                return fail(c, "the drive shut down"), -ENOTCONN;
            sched_yield();
        }
    }
    return 0;
}

int sde_client_reap(sde_client *c, sde_client_qp *qp, sde_cqe *out, uint32_t max,
                    uint32_t min, uint64_t timeout_ns)
{
    int got = sde_cq_reap(qp->mem, out, max);
    while ((uint32_t)got < min) {
int w = sde_cq_wait(qp->mem, qp->completion_fd, c->sock, -1, spin_for(qp), timeout_ns);
        if (w < 0)
            return fail(c, "the daemon is gone: %s", strerror(-w)), w;
        if (w == 0 && timeout_ns)
            break;
        got += sde_cq_reap(qp->mem, out + got, max - (uint32_t)got);
    }
    return got;
}

int sde_client_run(sde_client *c, sde_client_qp *qp, sde_sqe *sqe, sde_cqe *cqe)
{
    int r = sde_client_submit(c, qp, sqe, 1);
    if (r)
        return r;
    r = sde_client_reap(c, qp, cqe, 1, 1, 0);
    return r < 0 ? r : cqe->status;
}

int sde_client_namespaces(sde_client *c, sde_client_qp *qp, void *buf, uint32_t handle,
                          uint32_t len, uint32_t *nsids, uint64_t *bytes, int max)
{
    sde_sqe sqe = {.opcode = SDE_CMD_NS_LIST, .cid = 1, .buf = handle, .length = len};
    sde_cqe cqe;
    int st = sde_client_run(c, qp, &sqe, &cqe);
    if (st)
        return fail(c, "namespace list: %s", st < 0 ? c->err : sde_client_status(st));
    char *text = buf;
    text[cqe.result < len ? cqe.result : len - 1] = 0;
    /* [{"nsid": 1, "bytes": 67108864, ...}, ...]: each object names its nsid, then its bytes */
    int n = 0;
    for (char *p = strstr(text, "\"nsid\": "); p && n < max; p = strstr(p + 1, "\"nsid\": ")) {
        nsids[n] = (uint32_t)strtoul(p + 8, NULL, 10);
        int64_t b = json_int(p, "bytes");
        bytes[n++] = b > 0 ? (uint64_t)b : 0;
    }
    return n;
}

int64_t sde_client_ns_bytes(sde_client *c, const uint32_t *nsids, const uint64_t *bytes, int n,
                            uint32_t nsid)
{
    for (int i = 0; i < n; i++)
        if (nsids[i] == nsid)
            return bytes[i] ? (int64_t)bytes[i]
                   : fail(c, "namespace %u holds keys only (no blocks to read or write)", nsid);
    return fail(c, "namespace %u is not one of this client's (ssdemu ctl ns-list shows them)",
                nsid);
}

const char *sde_client_status(int status)
{
    switch (status) {
    case SDE_SC_SUCCESS: return "SUCCESS";
    case SDE_SC_INVALID_OPCODE: return "INVALID_OPCODE";
    case SDE_SC_INVALID_FIELD: return "INVALID_FIELD";
    case SDE_SC_INVALID_NAMESPACE: return "INVALID_NAMESPACE";
    case SDE_SC_INVALID_BUFFER: return "INVALID_BUFFER";
    case SDE_SC_LBA_OUT_OF_RANGE: return "LBA_OUT_OF_RANGE";
    case SDE_SC_MEDIA_ERROR: return "MEDIA_ERROR";
    case SDE_SC_ABORTED: return "ABORTED";
    case SDE_SC_CAPACITY_EXCEEDED: return "CAPACITY_EXCEEDED";
    case SDE_SC_INTERNAL: return "INTERNAL";
    case SDE_SC_ACCESS_DENIED: return "ACCESS_DENIED";
    default: return "an unknown status";
    }
}
