/*
 * A client of the drive in C (c/client/sde_client.c): the control plane's handshake, a queue
 * pair, registered buffers, and one command at a time, with no Python in the path.  What hostlib's
 * connect, queue_pair and alloc do (hostlib/client.py, hostlib/staging.py), for the programs
 * that run unmodified on the drive: the fio engine (c/fio) and the mount (c/mount).  The
 * protocol is the daemon's (ssdemu_wire/control.py): one JSON object per SOCK_SEQPACKET
 * message, memfds and eventfds riding along as SCM_RIGHTS; the commands are sde_queue.h's.
 */
#ifndef SDE_CLIENT_H
#define SDE_CLIENT_H
#include <stddef.h>
#include <stdint.h>

#include "../wire/sde_queue.h"

/* CDEF-BEGIN */
#define SDE_CLIENT_ERR 256
#define SDE_CLIENT_MAX_NS 64 /* namespaces a drive holds (identify's max_namespaces) */
typedef struct sde_client {
    int sock;                     /* the control connection: hung up when the daemon goes */
    uint32_t block_bytes;         /* the drive's logical block */
    uint64_t max_io_bytes;        /* one read's or write's most */
    char err[SDE_CLIENT_ERR];     /* why the last call failed, one line */
} sde_client;

typedef struct sde_client_qp {
    void *mem;
    uint64_t bytes;
    int doorbell_fd, completion_fd;
    uint32_t qid, entries;
} sde_client_qp;

/* Connect and say hello.  owner_key_file: an owner key file (mode 0600; NULL: the one
 * $SSDEMU_OWNER_KEY_FILE names, or none).  0, or -1 with c->err saying why. */
int sde_client_connect(sde_client *c, const char *socket_path, const char *owner_key_file);
void sde_client_close(sde_client *c);
/* A queue pair of `entries` slots (a power of two): 0 or -1 (c->err). */
int sde_client_qp_create(sde_client *c, sde_client_qp *qp, uint32_t entries);
void sde_client_qp_close(sde_client_qp *qp);
/* The queue pair given back to the daemon (nothing of it in flight), then closed. */
void sde_client_qp_destroy(sde_client *c, sde_client_qp *qp);
/* Shared memory the daemon reads and writes directly (a memfd sealed against shrinking,
 * registered): its mapping, `bytes` rounded up to whole pages, or NULL (c->err). */
void *sde_client_buffer(sde_client *c, size_t bytes, uint32_t *handle);
void sde_client_buffer_free(sde_client *c, void *mem, size_t bytes, uint32_t handle);
/* Publish sqes, waiting for room; 0, or -errno (the daemon is gone). */
int sde_client_submit(sde_client *c, sde_client_qp *qp, const sde_sqe *sqes, uint32_t n);
/* Reap up to max completions, waiting up to timeout_ns for the first (0: forever; with
 * min 0, not at all): the count, or -errno (-ENOTCONN: the daemon is gone). */
int sde_client_reap(sde_client *c, sde_client_qp *qp, sde_cqe *out, uint32_t max,
                    uint32_t min, uint64_t timeout_ns);
/* One command, waited for (nothing else in flight on qp): its status; -errno. */
int sde_client_run(sde_client *c, sde_client_qp *qp, sde_sqe *sqe, sde_cqe *cqe);
/* The namespaces this client may use, from one NS_LIST through qp (into buf at offset 0,
 * `len` bytes, registered as handle): up to max (nsid, bytes; 0 for a key space); their
 * count, or -1 (c->err). */
int sde_client_namespaces(sde_client *c, sde_client_qp *qp, void *buf, uint32_t handle,
                          uint32_t len, uint32_t *nsids, uint64_t *bytes, int max);
/* The bytes of namespace nsid among those listed: -1 with c->err saying why if it is not
 * one of them or holds keys only. */
int64_t sde_client_ns_bytes(sde_client *c, const uint32_t *nsids, const uint64_t *bytes, int n,
                            uint32_t nsid);
/* The text of a completion status ("LBA_OUT_OF_RANGE", ...). */
const char *sde_client_status(int status);
/* CDEF-END */
#endif
