/* When to spin.  A thread waiting for the other side of a queue (the daemon's data plane for
 * a doorbell, a client for its completions) first polls for a while: on an idle core that
 * catches work microseconds sooner than a sleep and a wake-up.  On a host with more runnable
 * threads than cores the same poll takes the core from the very thread it waits for (or from
 * a neighbour that then delays that thread): NOPs went from 5 us to 80-130 us round trips, and
 * 3-4 ms at the 99th percentile, beside CPU-bound processes.
 *
 * The signal costs nothing: a spin reads the clock every few hundred nanoseconds, so two reads
 * far apart mean the scheduler took this thread off its core mid-spin, i.e. something else
 * wanted it.  Then the thread sleeps at once (eventfd/poll wake-ups, ~15-25 us round trips
 * under load) for a while, and tries spinning again after it: a quiet host gets its spin
 * back within SDE_SPIN_BACKOFF_NS.  One gate per waiting thread (its own core's story). */
#ifndef SDE_SPIN_H
#define SDE_SPIN_H
#include <stdint.h>

/* a gap this long between two clock reads of one spin: descheduled for another task.  A
 * spin's reads are < 2 us apart; on a quiet 2-vCPU VM 3 s of spinning showed ~1,000 gaps over
 * 20 us and none over 250 us (interrupts, the hypervisor); beside one CPU-bound process per
 * core, ~90 a second over 1 ms (its slice): the line between is drawn at 500 us */
#define SDE_SPIN_GAP_NS 500000ull
/* how long a thread that was descheduled mid-spin sleeps at once before spinning again */
#define SDE_SPIN_BACKOFF_NS 50000000ull

/* how long an idle data plane spins while a client has completions it has not reaped: long
 * enough for a client that slept through its own spin to be woken (~60 us on a 2-vCPU VM,
 * after a pause of its own) and reap them; see sde_spin_window */
#define SDE_SPIN_FOR_REAP_NS 250000ull

/* CDEF-BEGIN */
typedef struct sde_spin_gate {
    uint64_t spin_after; /* no spinning before this time (0: spin) */
    uint64_t last;       /* the spin's previous clock read (0: not spinning) */
} sde_spin_gate;
/* the inline functions below, callable from Python for their test (c/dev/dev_loop.c) */
int sde_spin_gate_allowed(const sde_spin_gate *g, uint64_t now);
int sde_spin_gate_tick(sde_spin_gate *g, uint64_t now);
void sde_spin_gate_end(sde_spin_gate *g);
uint64_t sde_spin_window_ns(uint64_t spin_ns, int owed);
/* sde_spin_reap's answer: the client took completions since the last look (it is about to
 * submit again); it has completions it has not taken (it is being woken to take them) */
#define SDE_REAPED 1
#define SDE_OWED 2
int sde_spin_reaping(uint32_t *seen_head, uint32_t head, uint32_t tail);
/* CDEF-END */

/* May this thread start a spin now? */
static inline int sde_spin_allowed(const sde_spin_gate *g, uint64_t now)
{
    return now >= g->spin_after;
}

/* One clock read inside a spin; returns 0 when the spin must stop (descheduled mid-spin). */
static inline int sde_spin_tick(sde_spin_gate *g, uint64_t now)
{
    uint64_t last = g->last;
    g->last = now;
    if (last && now - last > SDE_SPIN_GAP_NS) {
        g->spin_after = now + SDE_SPIN_BACKOFF_NS;
        g->last = 0;
        return 0;
    }
    return 1;
}

/* How long an idle thread spins (counted from its last work, or from its client's last
 * reap): spin_ns, and at least SDE_SPIN_FOR_REAP_NS while a client owes a reap.  A client
 * kicked awake reaps, then submits its next command: a spin that ended before that (a
 * wake-up slower than the spin) left both sides asleep for every later command, two
 * wake-ups a round trip for as long as the client kept going (c/dev/dev_loop.c). */
static inline uint64_t sde_spin_window(uint64_t spin_ns, int owed)
{
    return owed && spin_ns < SDE_SPIN_FOR_REAP_NS ? SDE_SPIN_FOR_REAP_NS : spin_ns;
}

/* What a client did with its completions since the last look: head, its cq_head now;
 * tail, what the daemon has posted; *seen_head, the head at the last look (updated).  The
 * head is the client's word: only a move forward within what was posted counts as a reap,
 * so that a client writing it at will cannot keep the idle spin going (each reap restarts
 * it) on no completions at all. */
static inline int sde_spin_reap(uint32_t *seen_head, uint32_t head, uint32_t tail)
{
    uint32_t took = head - *seen_head; /* free-running indexes: mod 2^32 */
    int out = head != tail ? SDE_OWED : 0;
    if (took && took <= tail - *seen_head) {
        *seen_head = head;
        out |= SDE_REAPED;
    }
    return out;
}

/* The spin ended (work came, or its time ran out): the next one starts afresh. */
static inline void sde_spin_end(sde_spin_gate *g)
{
    g->last = 0;
}
#endif
