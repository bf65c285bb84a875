/*
 * Queue-pair rings shared between a client and the daemon (see sde_queue.h).  Memory
 * ordering is done here and only here: producers store the tail with release after writing
 * entries; consumers load it with acquire before reading them and release their head after.
 * The sleep/wake handshakes use a full fence on both sides so that either the sleeper sees
 * the new work or the waker sees the flag (never neither).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sde_ring.h"
#include "sde_spin.h"
#include "sde_time.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)

_Static_assert(sizeof(sde_sqe) == 64, "SQE is 64 bytes");
_Static_assert(sizeof(sde_cqe) == 32, "CQE is 32 bytes");
_Static_assert(sizeof(sde_retrieval_req) == 64, "a retrieval request is 64 bytes");
_Static_assert(sizeof(sde_quant_req) == 64, "a quantized-store request is 64 bytes");
_Static_assert(offsetof(sde_ring_hdr, sq_tail) % 64 == 0, "indices on their own lines");
_Static_assert(sizeof(sde_ring_hdr) % 64 == 0, "header is whole cache lines");

static int pow2_ok(uint32_t n) { return n >= 2 && n <= 65536 && (n & (n - 1)) == 0; }

uint64_t sde_qp_bytes(uint32_t sq_entries, uint32_t cq_entries)
{
    if (!pow2_ok(sq_entries) || !pow2_ok(cq_entries))
        return 0;
    return sizeof(sde_ring_hdr) + (uint64_t)sq_entries * sizeof(sde_sqe) +
           (uint64_t)cq_entries * sizeof(sde_cqe);
}

int sde_qp_init(void *mem, uint32_t sq_entries, uint32_t cq_entries, uint32_t qid)
{
    uint64_t bytes = sde_qp_bytes(sq_entries, cq_entries);
    if (!bytes)
        return -EINVAL;
    memset(mem, 0, bytes);
    sde_ring_hdr *h = mem;
    h->magic = SDE_RING_MAGIC;
    h->version = SDE_PROTOCOL_VERSION;
    h->sq_entries = sq_entries;
    h->cq_entries = cq_entries;
    h->sq_offset = sizeof(sde_ring_hdr);
    h->cq_offset = sizeof(sde_ring_hdr) + sq_entries * sizeof(sde_sqe);
    h->qid = qid;
    return 0;
}

int sde_qp_check(const void *mem, uint64_t bytes)
{
    const sde_ring_hdr *h = mem;
    if (bytes < sizeof(*h) || h->magic != SDE_RING_MAGIC)
        return -EINVAL;
    if (h->version != SDE_PROTOCOL_VERSION)
        return -EPROTO;
    uint64_t need = sde_qp_bytes(h->sq_entries, h->cq_entries);
    if (!need || need > bytes || h->sq_offset != sizeof(*h) ||
        h->cq_offset != sizeof(*h) + h->sq_entries * sizeof(sde_sqe))
        return -EINVAL;
    return 0;
}

/* ---- client side ------------------------------------------------------------------------- */

int sde_sq_submit(void *mem, const sde_sqe *sqes, uint32_t n, int doorbell_fd, int *kicked)
{
    sde_ring_hdr *h = mem;
    sde_sqe *sq = (sde_sqe *)((char *)mem + h->sq_offset);
    uint32_t mask = h->sq_entries - 1;
    uint32_t tail = h->sq_tail; /* ours */
    uint32_t head = LOAD_ACQ(&h->sq_head);
    uint32_t room = h->sq_entries - (tail - head);
    uint32_t k = n < room ? n : room;
    for (uint32_t i = 0; i < k; i++)
        sq[(tail + i) & mask] = sqes[i];
    STORE_REL(&h->sq_tail, tail + k);
    *kicked = 0;
    if (k) {
        FENCE(); /* pairs with the daemon's fence in sde_sq_prepare_sleep */
        if (LOAD_ACQ(&h->sq_flags) & SDE_SQF_NEED_WAKEUP) {
            uint64_t one = 1;
            if (write(doorbell_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
                return -errno;
            *kicked = 1;
        }
    }
    return (int)k;
}

int sde_cq_reap(void *mem, sde_cqe *out, uint32_t max)
{
    sde_ring_hdr *h = mem;
    sde_cqe *cq = (sde_cqe *)((char *)mem + h->cq_offset);
    uint32_t mask = h->cq_entries - 1;
    uint32_t head = h->cq_head;
    uint32_t tail = LOAD_ACQ(&h->cq_tail);
    uint32_t k = tail - head;
    if (k > max)
        k = max;
    for (uint32_t i = 0; i < k; i++)
        out[i] = cq[(head + i) & mask];
    STORE_REL(&h->cq_head, head + k);
    return (int)k;
}

/* Completions posted and not reaped: head first, then tail (a reap by another thread
 * between the two loads can only make the count smaller, never wrap it). */
static uint32_t cq_ready(const sde_ring_hdr *h)
{
    uint32_t head = LOAD_ACQ(&h->cq_head);
    return LOAD_ACQ(&h->cq_tail) - head;
}

static int wait_asleep(sde_ring_hdr *h, int completion_fd, int hangup_fd, int kick_fd,
                       uint64_t start, uint64_t timeout_ns)
{
    for (;;) {
        uint32_t ready = cq_ready(h);
        if (ready)
            return (int)ready;
        if (LOAD_ACQ(&h->sq_flags) & SDE_SQF_DEAD)
            return -ENOTCONN;
        int wait_ms = -1;
        if (timeout_ns) {
            uint64_t spent = now_ns() - start;
            if (spent >= timeout_ns)
                return 0;
            wait_ms = (int)((timeout_ns - spent + 999999) / 1000000);
        }
        /* fds of -1 are ignored by poll */
        struct pollfd p[3] = {{.fd = completion_fd, .events = POLLIN},
                              /* not POLLIN: a reply to another thread's control
                               * request makes the socket readable; only a hang-up (the
                               * daemon gone) ends the wait */
                              {.fd = hangup_fd, .events = POLLRDHUP},
                              {.fd = kick_fd, .events = POLLIN}};
        int r = poll(p, 3, wait_ms);
        if (r < 0 && errno != EINTR)
            return -errno;
        if (r > 0 && hangup_fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            ready = cq_ready(h);
            return ready ? (int)ready : -ENOTCONN; /* the daemon closed its end: gone */
        }
        if (r > 0 && (p[0].revents || p[2].revents)) {
            uint64_t v;
            if (p[0].revents && read(completion_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                return -errno;
            if (p[2].revents && read(kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                return -errno;
            /* kicked: what is ready, or 0 when another waiter took it (look again) */
            ready = cq_ready(h);
            return ready ? (int)ready : (LOAD_ACQ(&h->sq_flags) & SDE_SQF_DEAD) ? -ENOTCONN : 0;
        }
    }
}

/* each waiting thread's own: whether its spins get descheduled is its core's story */
static __thread sde_spin_gate spin_gate;

int sde_cq_wait(void *mem, int completion_fd, int hangup_fd, int kick_fd, uint64_t spin_ns,
                uint64_t timeout_ns)
{
    sde_ring_hdr *h = mem;
    uint64_t start = now_ns();
    uint32_t polls = 0;
    sde_spin_end(&spin_gate); /* a spin of its own: no clock read of an earlier call */
    /* where this waiter runs, for the daemon (sde_sq_shares_cpu); no spin after one was
     * descheduled lately (no core to spare) */
    uint32_t cpu = (uint32_t)sched_getcpu() + 1;
    if (__atomic_load_n(&h->client_cpu, __ATOMIC_RELAXED) != cpu)
        __atomic_store_n(&h->client_cpu, cpu, __ATOMIC_RELAXED);
    if (spin_ns && !sde_spin_allowed(&spin_gate, start))
        spin_ns = 0;
    for (;;) {
        uint32_t ready = cq_ready(h);
        if (ready)
            return (int)ready;
        if (LOAD_ACQ(&h->sq_flags) & SDE_SQF_DEAD)
            return -ENOTCONN;
        if ((++polls & 31) == 0) {
            uint64_t t = now_ns();
            if (timeout_ns && t - start >= timeout_ns)
                return 0;
            if (t - start >= spin_ns || !sde_spin_tick(&spin_gate, t))
                break;
        }
        /* a spin on the daemon's CPU gives it the CPU now and then (it was woken there and
         * would wait out the spin: 120 us round trips instead of 15) */
        if (spin_ns && (polls & 31) == 0 &&
            __atomic_load_n(&h->daemon_cpu, __ATOMIC_RELAXED) == cpu)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
    /* one waiter more while asleep, one less on every way out: another waiter's count (an
     * event loop's arming, a thread's wait) is never taken away */
    __atomic_fetch_add(&h->cq_waiters, 1, __ATOMIC_SEQ_CST);
    FENCE(); /* pairs with the daemon's fence after posting */
    int r = wait_asleep(h, completion_fd, hangup_fd, kick_fd, start, timeout_ns);
    __atomic_fetch_sub(&h->cq_waiters, 1, __ATOMIC_SEQ_CST);
    return r;
}

/* ---- daemon side ------------------------------------------------------------------------- */

int sde_sq_fetch(sde_qp_view *q, sde_sqe *out, uint32_t max)
{
    sde_ring_hdr *h = q->mem;
    const sde_sqe *sq = (const sde_sqe *)((char *)q->mem + q->sq_offset);
    uint32_t tail = LOAD_ACQ(&h->sq_tail);
    uint32_t avail = tail - q->sq_head;
    if (avail > q->sq_entries)
        return -1;
    uint32_t k = avail < max ? avail : max;
    uint32_t mask = q->sq_entries - 1;
    for (uint32_t i = 0; i < k; i++)
        out[i] = sq[(q->sq_head + i) & mask]; /* the one copy the daemon validates */
    q->sq_head += k;
    STORE_REL(&h->sq_head, q->sq_head);
    return (int)k;
}

int sde_cq_space(sde_qp_view *q)
{
    sde_ring_hdr *h = q->mem;
    uint32_t used = q->cq_tail - LOAD_ACQ(&h->cq_head);
    if (used > q->cq_entries)
        return -1;
    return (int)(q->cq_entries - used);
}

uint32_t sde_cq_seen(sde_qp_view *q)
{
    return LOAD_ACQ(&((sde_ring_hdr *)q->mem)->cq_head);
}

int sde_cq_arm(void *mem, int waiting)
{
    sde_ring_hdr *h = mem;
    if (waiting)
        __atomic_fetch_add(&h->cq_waiters, 1, __ATOMIC_SEQ_CST);
    else
        __atomic_fetch_sub(&h->cq_waiters, 1, __ATOMIC_SEQ_CST);
    FENCE(); /* pairs with the daemon's fence after posting */
    return (int)cq_ready(h);
}

int sde_cq_post(sde_qp_view *q, const sde_cqe *cqes, uint32_t n)
{
    sde_ring_hdr *h = q->mem;
    sde_cqe *cq = (sde_cqe *)((char *)q->mem + q->cq_offset);
    uint32_t mask = q->cq_entries - 1;
    for (uint32_t i = 0; i < n; i++)
        cq[(q->cq_tail + i) & mask] = cqes[i];
    q->cq_tail += n;
    STORE_REL(&h->cq_tail, q->cq_tail);
    FENCE(); /* pairs with the client's fence in sde_cq_wait */
    return LOAD_ACQ(&h->cq_waiters) ? 1 : 0;
}

int sde_sq_prepare_sleep(sde_qp_view *q)
{
    sde_ring_hdr *h = q->mem;
    __atomic_fetch_or(&h->sq_flags, SDE_SQF_NEED_WAKEUP, __ATOMIC_SEQ_CST);
    FENCE(); /* pairs with the client's fence in sde_sq_submit */
    return LOAD_ACQ(&h->sq_tail) != q->sq_head;
}

int sde_sq_shares_cpu(sde_qp_view *q, uint32_t cpu)
{
    sde_ring_hdr *h = q->mem;
    if (__atomic_load_n(&h->daemon_cpu, __ATOMIC_RELAXED) != cpu)
        __atomic_store_n(&h->daemon_cpu, cpu, __ATOMIC_RELAXED); /* the client spins on this line */
    return cpu && __atomic_load_n(&h->client_cpu, __ATOMIC_RELAXED) == cpu;
}

void sde_sq_clear_wakeup(sde_qp_view *q)
{
    sde_ring_hdr *h = q->mem;
    __atomic_fetch_and(&h->sq_flags, ~(uint32_t)SDE_SQF_NEED_WAKEUP, __ATOMIC_SEQ_CST);
}

void sde_sq_set_dead(sde_qp_view *q)
{
    sde_ring_hdr *h = q->mem;
    __atomic_fetch_or(&h->sq_flags, SDE_SQF_DEAD, __ATOMIC_SEQ_CST);
}

int sde_sq_pending(sde_qp_view *q)
{
    sde_ring_hdr *h = q->mem;
    return LOAD_ACQ(&h->sq_tail) != q->sq_head;
}
