/* Daemon-side ring operations (not part of the cffi surface): see sde_queue.h for the
 * protocol.  The daemon passes its own trusted sizes, never the header's. */
#ifndef SDE_RING_H
#define SDE_RING_H
#include "sde_queue.h"

typedef struct sde_qp_view {
    void *mem;
    uint64_t bytes;
    uint32_t sq_entries, cq_entries; /* trusted copies */
    uint32_t sq_offset, cq_offset;
    uint32_t sq_head;                /* daemon-private */
    uint32_t cq_tail;                /* daemon-private */
} sde_qp_view;

/* Copy up to max new commands out of the SQ (each read once).  Returns the count, or -1 if
 * the client's sq_tail is impossible (more than sq_entries ahead): the queue is broken. */
int sde_sq_fetch(sde_qp_view *q, sde_sqe *out, uint32_t max);
/* Free CQ slots, from the client's cq_head; -1 if its cq_head is impossible. */
int sde_cq_space(sde_qp_view *q);
/* The client's cq_head as it stands (it moves when the client reaps): a hint only, for the
 * idle data plane's spin (c/dev/dev_loop.c), never an index the daemon uses. */
uint32_t sde_cq_seen(sde_qp_view *q);
/* Post n completions (the caller checked the space).  Returns 1 if the client sleeps and
 * must be signalled. */
int sde_cq_post(sde_qp_view *q, const sde_cqe *cqes, uint32_t n);
/* Announce sleep: set NEED_WAKEUP, fence, and report whether commands arrived meanwhile. */
int sde_sq_prepare_sleep(sde_qp_view *q);
void sde_sq_clear_wakeup(sde_qp_view *q);
/* Idle, about to spin: publish the data plane's CPU (1 + number; 0 unknown) to this queue's
 * client, and report whether its client last waited on that same CPU (then a spin would keep
 * it from running: sde_spin.h).  The client's word is a hint, never trusted beyond that. */
int sde_sq_shares_cpu(sde_qp_view *q, uint32_t cpu);
void sde_sq_set_dead(sde_qp_view *q);
int sde_sq_pending(sde_qp_view *q);
#endif
