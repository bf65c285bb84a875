/* The client side of `ssdemu bench queue`: a closed loop over a queue pair, all in C, so the
 * benchmark measures the queue and the daemon rather than the Python client. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sde_hist.h"
#include "sde_queue.h"
#include "sde_time.h"
#include "sde_rand.h"
#include "sde_client_loop.h"

static int is_kv(uint8_t op)
{
    return op == SDE_CMD_KV_STORE || op == SDE_CMD_KV_RETRIEVE ||
           op == SDE_CMD_KV_STORE_QUANTIZED || op == SDE_CMD_KV_RETRIEVE_DEQUANTIZED;
}

/* Make the value at p differ from every other the loop stores: its first 8 bytes carry the
 * serial.  A quantized store's block is fp16 or bf16: the serial is mixed (a bijection) and
 * each of its 64 bits sets the sign of one of the first 64 elements, +-2.0 (0x4000 and
 * 0xC000, the same value in both formats).  Two serials then differ in at least one element
 * by 4.0, more than a code's step in any group whose elements stay within +-127*2 (int8) or
 * +-7*2 (int4): their compressed blocks differ, and no put is a dedup hit.  (Small values
 * spread over 14-bit fields, as before, quantized alike in ~5% of puts, which were then
 * hashed and never written.) */
static void stamp_value(uint8_t *p, uint64_t serial, uint8_t opcode)
{
    if (opcode != SDE_CMD_KV_STORE_QUANTIZED) {
        memcpy(p, &serial, 8);
        return;
    }
    uint64_t m = serial * 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 64; k++) {
        uint16_t v = (uint16_t)(0x4000u | (uint16_t)(((m >> k) & 1u) << 15));
        memcpy(p + 2 * k, &v, 2);
    }
}

/* One command of the loop: a block command at a random bs-aligned lba, or a KV command on
 * a random one of `span` 16-byte keys (key index in bytes 0-7). */
static sde_sqe next_sqe(uint8_t opcode, uint16_t cid, uint32_t nsid, uint32_t buf, uint32_t bs,
                        uint64_t span, uint64_t *rng)
{
    uint64_t r = xorshift64s(rng) % span;
    sde_sqe s = {.opcode = opcode, .cid = cid, .nsid = nsid, .buf = buf, .length = bs,
                 .buf_offset = (uint64_t)cid * bs};
    if (is_kv(opcode)) {
        s.lba = r;
        s.key_hi = 0x3030303030766b73ull; /* "skv00000": the keys bench kv loads */
        s.param1 = 16;
    } else {
        s.lba = r * (bs / 512);
    }
    return s;
}

/* A loop's state: its parameters and the commands in flight. */
struct loop {
    void *mem;
    int doorbell_fd;
    uint8_t opcode;
    uint32_t nsid, buf, bs, qd;
    uint64_t span, rng, serial, deadline;
    void *stamp;
    uint64_t *hist, *out, *t0;
    sde_sqe *sqe;
    sde_cqe *cqe;
};

/* The next command for slot c, sent at t (its value stamped first). */
static void refill(struct loop *L, uint16_t c, uint32_t at, uint64_t t)
{
    if (L->stamp) /* every value differs: the store's dedup must not turn puts into reads */
        stamp_value((uint8_t *)L->stamp + (uint64_t)c * L->bs, ++L->serial, L->opcode);
    L->sqe[at] = next_sqe(L->opcode, c, L->nsid, L->buf, L->bs, L->span, &L->rng);
    L->t0[c] = t;
}

/* n completions reaped at t: counted, and replaced by new commands until the deadline.
 * Returns 0 or -errno; *inflight drops by the slots that end. */
static int completed(struct loop *L, int n, uint64_t t, uint32_t *inflight)
{
    int rc = 0, kicked;
    uint32_t again = 0;
    for (int i = 0; i < n; i++) {
        uint16_t c = L->cqe[i].cid;
        if (c >= L->qd) {
            rc = -EPROTO;
            continue;
        }
        L->out[0]++;
        if (L->cqe[i].status)
            L->out[1]++;
        L->hist[sde_hist_bucket(t - L->t0[c])]++;
        if (t < L->deadline)
            refill(L, c, again++, t);
        else
            (*inflight)--;
    }
    if (again) {
        int k = sde_sq_submit(L->mem, L->sqe, again, L->doorbell_fd, &kicked);
        if (k < (int)again) { /* cannot happen: qd <= ring size */
            rc = k < 0 ? k : -EOVERFLOW;
            *inflight -= again - (k < 0 ? 0 : (uint32_t)k);
        }
    }
    return rc;
}

uint64_t sde_client_loop_spin(const void *mem, uint64_t spin_ns)
{
    const sde_ring_hdr *h = mem;
    return __atomic_load_n(&h->daemon_cpu, __ATOMIC_RELAXED) ? 0 : spin_ns;
}

int sde_client_loop(void *mem, int doorbell_fd, int completion_fd, uint8_t opcode,
                    uint32_t nsid, uint32_t buf, uint32_t bs, uint32_t qd, uint64_t nblocks,
                    uint64_t duration_ns, uint64_t seed, uint64_t spin_ns, void *stamp,
                    uint64_t *hist, uint64_t *out)
{
    const sde_ring_hdr *h = mem;
    int kv = is_kv(opcode);
    if (qd == 0 || qd > h->sq_entries || qd > h->cq_entries || qd > 65536 || !bs ||
        (!kv && (bs % 512 || nblocks < bs / 512)) || (kv && !nblocks))
        return -EINVAL;
    struct loop L = {.mem = mem, .doorbell_fd = doorbell_fd, .opcode = opcode, .nsid = nsid,
                     .buf = buf, .bs = bs, .qd = qd, .serial = seed << 32, .stamp = stamp,
                     .hist = hist, .out = out,
                     /* bs-sized slots in the range, or keys */
                     .span = kv ? nblocks : nblocks / (bs / 512),
                     .rng = seed ? seed : 0x9E3779B97F4A7C15ull,
                     .t0 = calloc(qd, sizeof(uint64_t)), .sqe = calloc(qd, sizeof(sde_sqe)),
                     .cqe = calloc(qd, sizeof(sde_cqe))};
    int rc = -ENOMEM, kicked;
    if (!L.t0 || !L.sqe || !L.cqe)
        goto done;
    memset(out, 0, 3 * sizeof(uint64_t));
    uint64_t start = now_ns(), t = start;
    L.deadline = start + duration_ns;
    for (uint32_t i = 0; i < qd; i++)
        refill(&L, (uint16_t)i, i, start);
    rc = sde_sq_submit(mem, L.sqe, qd, doorbell_fd, &kicked);
    uint32_t inflight = rc > 0 ? (uint32_t)rc : 0;
    rc = 0;
    while (inflight) {
        int n = sde_cq_reap(mem, L.cqe, qd);
        if (n == 0) {
            /* Poll for the next completion only while the data plane tells its clients the
             * host has a CPU to spare (daemon_cpu 0, c/dev/dev_loop.c's client_on_my_cpu).
             * QD32 4 KiB reads on memory media (docs/measurements.md): always asleep at
             * once, 0.65-0.80x fio quiet, each batch of completions an eventfd write and a
             * wake-up; polling 50 us as hostlib does, 1.27-1.29x quiet but 0.44-0.46x beside
             * four CPU-bound processes (0.75-0.95x asleep: the poll took the CPU share the
             * data plane needed); by this rule, 1.19-1.32x quiet, 0.64-0.85x beside four. */
            int w = sde_cq_wait(mem, completion_fd, -1, -1, sde_client_loop_spin(mem, spin_ns),
                                1000000000);
            /* A stuck daemon ends the loop, a slow one does not: on a host with more work
             * than cores (a suite's three workers on two, 2 MiB puts into fresh shared
             * memory) a second passed with nothing completed and the bench failed. */
            if (w < 0 || (w == 0 && now_ns() - t > SDE_CLIENT_LOOP_STALL_NS)) {
                rc = w < 0 ? w : -ETIMEDOUT;
                break;
            }
            continue;
        }
        t = now_ns();
        int r = completed(&L, n, t, &inflight);
        if (r)
            rc = r;
    }
    out[2] = t - start;
done:
    free(L.t0);
    free(L.sqe);
    free(L.cqe);
    return rc;
}
