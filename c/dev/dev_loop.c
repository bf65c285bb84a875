/* The data plane's loop: a pass over the queues (fetch, start by the opcode table, reap the
 * engine and the firmware, post completions), and the sleep between passes. */
#define _GNU_SOURCE
#include "dev_internal.h"
#include "sde_sched.h"
#include "sde_spin.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Start one command fetched from queue pair qp.  t0: when it was fetched (one clock read for
 * the commands fetched together). */
void dev_start_command(sde_dev *dev, int qp, const sde_sqe *c, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    const struct dev_op *r = dev_op(c->opcode);
    int cls = r ? r->cls : SDE_CLASS_INVALID;
    q->inflight++;
    if (++*q->uid_inflight > dev->stats.uid_inflight_peak)
        dev->stats.uid_inflight_peak = *q->uid_inflight;
    if (!r) {
        dev_finish(dev, qp, cls, c->cid, SDE_SC_INVALID_OPCODE, 0, 0, t0);
        return;
    }
    if (dev->faults.n && r->fault_dir && dev_inject_fault(dev, qp, c, r, t0))
        return;
    if (dev->virtual_time && dev->fw_head != NO_CTX && r->in_turn) {
        /* compute commands fetched before it are booked at their turns (their kernels
         * end in host order): so is it, so that the model books every command in fetch
         * order whatever this host's scheduling */
        struct dev_ctx *x = dev_ctx_take(dev, qp, c, cls, CTX_DEFERRED, t0);
        x->sqe = *c;
        x->msubmit = dev_model_submit(dev, c, t0);
        x->fw_state = FW_DEFERRED;
        dev_fifo_append(dev, x);
        dev->stats.deferred++;
        return;
    }
    dev_start_now(dev, qp, c, r, t0);
}

static int reap_engine(sde_dev *dev)
{
    sde_io *done[64];
    int n = sde_reap(dev->eng, done, 64, 0);
    for (int i = 0; i < n; i++) {
        uint64_t ud = done[i]->user_data;
        if (dev->undo && done[i]->op == SDE_OP_WRITE)
            sde_undo_done(dev->undo, done[i]);
        if (ud >= UD_JOURNAL_LAST && ud <= UD_JOURNAL) {
            dev_journal_io_done(dev, done[i]);
            continue;
        }
        struct dev_ctx *x = &dev->ctx[ud & 0xffffffffu];
        dev_kind(x)->media_done(dev, x, done[i]);
    }
    return n < 0 ? 0 : n;
}

/* One pass over every queue pair.  Returns the work done. */
int dev_pass(sde_dev *dev)
{
    int work = 0;
    sde_sqe batch[FETCH_BATCH];
    dev->hold_writes = 1;
    for (int qp = 0; qp < dev->qp_hi; qp++) {
        struct dev_qp *q = &dev->qps[qp];
        if (!q->active)
            continue;
        int space = sde_cq_space(&q->v);
        if (space < 0 || !sde_sq_pending(&q->v) || dev->nfree == 0)
            goto check_broken;
        /* fetch no more than can complete: CQ room not yet promised, free contexts, and
         * the uid's quota of commands in flight (so that one user cannot hold every context
         * and starve the others: its commands wait in its SQs, not fetched) */
        int room = space - (int)q->inflight;
        if (dev->max_uid_inflight) {
            int quota = (int)dev->max_uid_inflight - (int)*q->uid_inflight;
            if (quota <= 0) {
                dev->stats.quota_waits++;
                continue;
            }
            if (room > quota)
                room = quota;
        }
        if (room > FETCH_BATCH)
            room = FETCH_BATCH;
        if (room > (int)dev->nfree)
            room = (int)dev->nfree;
        if (room <= 0)
            continue;
        int k = sde_sq_fetch(&q->v, batch, (uint32_t)room);
        if (k < 0)
            goto broken;
        uint64_t t0 = now_ns();
        dev_kv_prefetch(dev, qp, batch, k);
        for (int i = 0; i < k; i++)
            dev_start_command(dev, qp, &batch[i], t0);
        dev_kv_prefetch_done(dev);
        work += k;
        continue;
    check_broken:
        if (space >= 0)
            continue;
    broken:
        /* the client broke the ring protocol: stop its queue, keep serving the rest */
        dev->stats.broken_queues++;
        sde_sq_set_dead(&q->v);
        q->active = 0;
        qp_done(q, q->nstage);
        q->nstage = 0;
        kick(q->cfd);
    }
    work += dev_reap_firmware(dev); /* puts of quantized blocks queue their writes */
    /* the records of the puts started here (early puts) go out ahead of their values: on
     * media that serve writes in order (mem:, one io-wq worker) a put then completes with
     * its own value, not with the last value of its group */
    if (dev_journal_kick(dev))
        work++;
    dev_release_writes(dev);
    sde_submit_queued(dev->eng);
    work += reap_engine(dev);
    if (dev_journal_kick(dev)) {
        work++;
        sde_submit_queued(dev->eng);
    }
    if (dev->undo)
        dev_undo_housekeeping(dev);
    work += dev_complete_committed(dev, 0);
    if (dev->park_head != NO_CTX)
        work += dev_unpark(dev);
    if (dev->nheld)
        work += dev_release_due(dev, now_ns());
    for (int qp = 0; qp < dev->qp_hi; qp++)
        if (dev->qps[qp].nstage)
            dev_flush_stage(&dev->qps[qp]);
    return work;
}

/* Read every doorbell that was kicked (the set is level-triggered: one left unread would wake
 * the next sleep at once). */
static void drain_doorbells(sde_dev *dev)
{
    struct epoll_event ev[64];
    int n;
    do {
        n = epoll_wait(dev->epfd, ev, 64, 0);
        for (int i = 0; i < n; i++) {
            uint32_t who = ev[i].data.u32;
            int fd = who == DEV_OWN_DOORBELL ? dev->doorbell : dev->qps[who].dbfd;
            uint64_t v;
            if (fd >= 0 && read(fd, &v, sizeof(v)) > 0)
                dev->stats.wakeups++;
        }
    } while (n == 64);
}

/* The most a held completion's sleep ends early by (the rest is polled): a host whose
 * wake-ups are later than this is busy, and polling longer would take the CPU its clients
 * need. */
#define WAKE_LATE_MAX_NS 200000

/* A timed sleep's end past its timeout, folded into the recent mean (1/8 of each): the
 * host's wake-up latency, which a held completion's sleep takes off its timeout. */
static void note_wake_late(sde_dev *dev, uint64_t slept_at, uint64_t timeout_ns)
{
    int64_t over = (int64_t)(now_ns() - slept_at) - (int64_t)timeout_ns;
    if (over < 0)
        over = 0;
    if (over > WAKE_LATE_MAX_NS)
        over = WAKE_LATE_MAX_NS;
    int64_t late = (int64_t)dev->stats.wake_late_ns;
    dev->stats.wake_late_ns = (uint64_t)(late + (over - late) / 8);
}

/* Sleep until an I/O completion, a doorbell kick, or (timeout_ns > 0) that much time.  First
 * tell every client to kick the doorbell, then look once more (the other half of the
 * handshake is theirs); then serve what woke us. */
static int sleep_and_serve(sde_dev *dev, volatile int *stop, uint64_t timeout_ns)
{
    pthread_mutex_lock(&dev->lock);
    int pending = 0;
    for (int qp = 0; qp < dev->qp_hi; qp++)
        if (dev->qps[qp].active)
            pending |= sde_sq_prepare_sleep(&dev->qps[qp].v);
    int armed = pending ? 0 : sde_engine_arm_poll(dev->eng, dev->epfd);
    pthread_mutex_unlock(&dev->lock);
    if (armed < 0)
        return armed;
    if (!pending && !*stop) {
        dev->stats.sleeps++;
        /* I/O completions and doorbell kicks both end this wait; only this thread waits on
         * the engine, so the lock is not held while blocked */
        uint64_t slept_at = timeout_ns ? now_ns() : 0;
        int r = timeout_ns ? sde_engine_wait_timeout(dev->eng, timeout_ns)
                           : sde_engine_wait(dev->eng);
        if (r < 0 && r != -ETIME)
            return r;
        if (r == -ETIME)
            note_wake_late(dev, slept_at, timeout_ns);
    }
    pthread_mutex_lock(&dev->lock);
    dev_pass(dev); /* consumes the poll's completion too */
    if (sde_engine_take_poll(dev->eng))
        drain_doorbells(dev);
    for (int qp = 0; qp < dev->qp_hi; qp++)
        if (dev->qps[qp].active)
            sde_sq_clear_wakeup(&dev->qps[qp].v);
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

int sde_spin_gate_allowed(const sde_spin_gate *g, uint64_t now) { return sde_spin_allowed(g, now); }
int sde_spin_gate_tick(sde_spin_gate *g, uint64_t now) { return sde_spin_tick(g, now); }
void sde_spin_gate_end(sde_spin_gate *g) { sde_spin_end(g); }
uint64_t sde_spin_window_ns(uint64_t spin_ns, int owed) { return sde_spin_window(spin_ns, owed); }
int sde_spin_reaping(uint32_t *seen_head, uint32_t head, uint32_t tail)
{
    return sde_spin_reap(seen_head, head, tail);
}

/* Does a client wait on the CPU this thread runs on?  Then an idle spin would keep it from
 * running until the spin ended (both sides wait out each other's spin: 120 us round trips
 * instead of 5, the scheduler placing a woken client beside its waker).  Also tells every
 * client where the data plane runs, for the same check on its side.  Under dev->lock. */
static int client_on_my_cpu(sde_dev *dev, int busy)
{
    /* 0 (unknown) to the clients while the host has a CPU to spare: they spin as usual */
    uint32_t cpu = busy ? (uint32_t)sched_getcpu() + 1 : 0;
    int shared = 0;
    for (int qp = 0; qp < dev->qp_hi; qp++)
        if (dev->qps[qp].active)
            shared |= sde_sq_shares_cpu(&dev->qps[qp].v, cpu);
    return shared;
}

/* Does every CPU this thread may run on have another runnable task?  (/proc/loadavg's
 * count of runnable tasks, this thread among them, against the affinity mask.)  Only then
 * does sharing a CPU with a client matter: on a host with a CPU to spare the scheduler moves
 * one of two spinning threads there, and spinning beside each other costs nothing. */
static int host_busy(int loadavg_fd, int ncpu)
{
    char b[128];
    ssize_t n = loadavg_fd >= 0 ? pread(loadavg_fd, b, sizeof(b) - 1, 0) : -1;
    if (n <= 0)
        return 1; /* unknown: the careful answer */
    b[n] = 0;
    char *p = b; /* "0.52 0.58 0.59 3/120 4567": the fourth field's first number */
    for (int f = 0; f < 3 && p; f++)
        if ((p = strchr(p, ' ')))
            p++;
    return !p || atoi(p) > ncpu;
}

/* What the idle data plane knows of the host: whether a CPU is spare, and whether a client
 * waits on its own CPU (then it sleeps at once rather than spin). */
typedef struct {
    int loadavg_fd;
    int ncpu;    /* CPUs of its affinity mask */
    int busy;    /* no CPU to spare (looked at every millisecond at most) */
    int crowded; /* a client waits on its CPU and busy (looked at every 8 idle passes) */
    int realtime; /* this thread runs SCHED_RR or SCHED_FIFO (serve --realtime) */
    int64_t slice_ns; /* the scheduler slice asked for while busy (0: the default; -1: none
                       * can be, serve --realtime's SCHED_RR or a kernel that refuses) */
    uint32_t idle_passes;
    uint64_t busy_at;
} host_view;

static void host_view_open(host_view *v)
{
    cpu_set_t set;
    memset(v, 0, sizeof(*v));
    v->ncpu = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    v->loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    /* serve --realtime sets the policy before the thread enters sde_dev_run: once is enough */
    int policy = sched_getscheduler(0);
    v->realtime = policy == SCHED_RR || policy == SCHED_FIFO;
}

static void host_view_close(host_view *v)
{
    if (v->loadavg_fd >= 0)
        close(v->loadavg_fd);
}

/* After a pass (under dev->lock): look around now and then while idle. */
static void host_view_update(host_view *v, sde_dev *dev, int work)
{
    if (work) {
        v->idle_passes = 0;
        return;
    }
    if ((v->idle_passes++ & 7) != 0)
        return;
    uint64_t t = now_ns();
    if (t - v->busy_at > 1000000) {
        v->busy = host_busy(v->loadavg_fd, v->ncpu);
        v->busy_at = t;
        if (v->slice_ns >= 0 && (v->slice_ns > 0) != v->busy) { /* sde_sched.h */
            v->slice_ns = sde_sched_slice(v->busy);
            dev->stats.slice_ns = v->slice_ns > 0 ? (uint64_t)v->slice_ns : 0;
        }
    }
    /* A realtime data plane is never beside a client (it preempts any), so it cannot see
     * one waiting on its CPU; but while it spins, its CPU is lost to every normal task, and
     * with none to spare a client then shares the other CPUs with the neighbours: beside
     * one CPU-bound process on 2 vCPUs, NOP p99 285-295 us against 25 us without
     * --realtime.  So with no CPU to spare it sleeps when idle: its wake-up preempts
     * whatever runs, as a drive's interrupt would. */
    v->crowded = v->realtime ? v->busy : client_on_my_cpu(dev, v->busy);
}

/* What the clients did with their completions since the last look (sde_spin_reap, for the
 * idle spin's sde_spin_window), under dev->lock. */
static int clients_reaping(sde_dev *dev)
{
    int seen = 0;
    for (int qp = 0; qp < dev->qp_hi; qp++) {
        struct dev_qp *q = &dev->qps[qp];
        if (q->active)
            seen |= sde_spin_reap(&q->seen_cq_head, sde_cq_seen(&q->v), q->v.cq_tail);
    }
    return seen;
}

int sde_dev_run(sde_dev *dev, volatile int *stop, uint64_t spin_ns)
{
    uint64_t idle_since = 0; /* 0: the last pass did work (the clock is read only when idle) */
    /* the idle spin stops for a while when this thread is descheduled mid-spin (a busy
     * host: the spin would take the core its clients need); --poll never sleeps */
    sde_spin_gate gate = {0};
    host_view host;
    host_view_open(&host);
    while (!*stop) {
        pthread_mutex_lock(&dev->lock);
        int work = dev_pass(dev);
        uint64_t next_due = dev->nheld ? dev->held[0].due : 0;
        int reaping = 0;
        if (spin_ns != SDE_DEV_POLL) {
            host_view_update(&host, dev, work);
            if (!work)
                reaping = clients_reaping(dev);
        }
        pthread_mutex_unlock(&dev->lock);
        if (work) {
            idle_since = 0;
            sde_spin_end(&gate);
            continue;
        }
        uint64_t t = now_ns();
        /* The idle spin is counted from the last work or from a client's last reap, and
         * lasts longer while a client owes a reap (sde_spin_window): counted from the work
         * alone, it had ended before a client kicked awake could submit again whenever a
         * wake-up took longer than it (~60 us on a 2-vCPU VM), and every later command found
         * both sides asleep: NOPs at 130 us a round trip after any pause of the client (8 us
         * before it).  Bounded: it starts over only on completions the client took. */
        if (!idle_since || (reaping & SDE_REAPED))
            idle_since = t;
        uint64_t spin_for = sde_spin_window(spin_ns, reaping & SDE_OWED);
        uint64_t timeout = 0;
        if (next_due) {
            /* completions wait for their modelled time: poll up to it when it is near, else
             * sleep until the host's wake-up latency before it (note_wake_late), then poll */
            sde_spin_end(&gate);
            uint64_t early = 10000 + dev->stats.wake_late_ns; /* unlocked: this thread's */
            if (next_due <= t + early + 10000 || spin_ns == SDE_DEV_POLL) {
                __builtin_ia32_pause();
                continue;
            }
            timeout = next_due - t - early;
        } else if (spin_ns == SDE_DEV_POLL) {
            __builtin_ia32_pause();
            continue;
        } else if (t - idle_since < spin_for && !host.crowded && sde_spin_allowed(&gate, t)) {
            if (sde_spin_tick(&gate, t)) {
                __builtin_ia32_pause();
                continue;
            }
            dev->stats.spin_backoffs++; /* unlocked: this thread alone writes it */
        } else if (host.crowded)
            dev->stats.spin_shared_cpu++;
        sde_spin_end(&gate);
        int r = sleep_and_serve(dev, stop, timeout);
        if (r < 0) {
            host_view_close(&host);
            return r;
        }
        idle_since = 0;
    }
    host_view_close(&host);
    /* stopping: let the media I/O in flight end (the journal group among it), so that the
     * store can be flushed and closed */
    for (;;) {
        pthread_mutex_lock(&dev->lock);
        uint32_t left = sde_inflight(dev->eng) + (dev->fw ? sde_fw_pending(dev->fw) : 0);
        if (left)
            dev_pass(dev);
        pthread_mutex_unlock(&dev->lock);
        if (!left)
            break;
        __builtin_ia32_pause();
    }
    return 0;
}
