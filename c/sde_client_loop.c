/* The client side of `ssdemu bench queue`: a closed loop over a queue pair, all in C, so the
 * benchmark measures the queue and the daemon rather than the Python client. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sde_engine.h"
#include "sde_queue.h"
#include "sde_client_loop.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static int is_kv(uint8_t op)
{
    return op == SDE_CMD_KV_STORE || op == SDE_CMD_KV_RETRIEVE ||
           op == SDE_CMD_KV_STORE_QUANTIZED || op == SDE_CMD_KV_RETRIEVE_DEQUANTIZED;
}

/* Make the value at p differ from every other the loop stores: its first 8 bytes carry the
 * serial.  A quantized store's block is fp16 or bf16, where raw serial bits could be inf or
 * NaN (refused) or too close to the last to change a code: so the serial is mixed (a
 * bijection) and spread over four 14-bit fields, each a finite, small, positive value. */
static void stamp_value(uint8_t *p, uint64_t serial, uint8_t opcode)
{
    if (opcode != SDE_CMD_KV_STORE_QUANTIZED) {
        memcpy(p, &serial, 8);
        return;
    }
    uint64_t m = serial * 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 4; k++) {
        uint16_t v = (uint16_t)((m >> (14 * k + 8)) & 0x3FFF);
        memcpy(p + 2 * k, &v, 2);
    }
}

/* One command of the loop: a block command at a random bs-aligned lba, or a KV command on
 * a random one of `span` 16-byte keys (key index in bytes 0-7). */
static sde_sqe next_sqe(uint8_t opcode, uint16_t cid, uint32_t nsid, uint32_t buf, uint32_t bs,
                        uint64_t span, uint64_t *rng)
{
    uint64_t r = next_rand(rng) % span;
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

int sde_client_loop(void *mem, int doorbell_fd, int completion_fd, uint8_t opcode,
                    uint32_t nsid, uint32_t buf, uint32_t bs, uint32_t qd, uint64_t nblocks,
                    uint64_t duration_ns, uint64_t seed, void *stamp, uint64_t *hist,
                    uint64_t *out)
{
    const sde_ring_hdr *h = mem;
    uint64_t serial = seed << 32;
    int kv = is_kv(opcode);
    if (qd == 0 || qd > h->sq_entries || qd > h->cq_entries || qd > 65536 || !bs ||
        (!kv && (bs % 512 || nblocks < bs / 512)) || (kv && !nblocks))
        return -EINVAL;
    /* bs-sized slots in the range, or keys */
    uint64_t span = kv ? nblocks : nblocks / (bs / 512);
    uint64_t *t0 = calloc(qd, sizeof(uint64_t));
    sde_sqe *sqe = calloc(qd, sizeof(sde_sqe));
    sde_cqe *cqe = calloc(qd, sizeof(sde_cqe));
    if (!t0 || !sqe || !cqe) {
        free(t0);
        free(sqe);
        free(cqe);
        return -ENOMEM;
    }
    uint64_t rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    int kicked;
    memset(out, 0, 3 * sizeof(uint64_t));
    uint64_t start = now_ns();
    for (uint32_t i = 0; i < qd; i++) {
        if (stamp) /* every value differs: the store's dedup must not turn puts into reads */
            stamp_value((uint8_t *)stamp + (uint64_t)i * bs, ++serial, opcode);
        sqe[i] = next_sqe(opcode, (uint16_t)i, nsid, buf, bs, span, &rng);
        t0[i] = start;
    }
    int rc = sde_sq_submit(mem, sqe, qd, doorbell_fd, &kicked);
    uint32_t inflight = rc > 0 ? (uint32_t)rc : 0;
    uint64_t deadline = start + duration_ns;
    uint64_t t = start;
    rc = 0;
    while (inflight) {
        int n = sde_cq_reap(mem, cqe, qd);
        if (n == 0) {
            int w = sde_cq_wait(mem, completion_fd, -1, 0, 1000000000);
            if (w < 0) {
                rc = w;
                break;
            }
            if (w == 0) {
                rc = -ETIMEDOUT;
                break;
            }
            continue;
        }
        t = now_ns();
        uint32_t again = 0;
        for (int i = 0; i < n; i++) {
            uint16_t c = cqe[i].cid;
            if (c >= qd) {
                rc = -EPROTO;
                continue;
            }
            out[0]++;
            if (cqe[i].status)
                out[1]++;
            hist[sde_hist_bucket(t - t0[c])]++;
            if (t < deadline) {
                if (stamp)
                    stamp_value((uint8_t *)stamp + (uint64_t)c * bs, ++serial, opcode);
                sqe[again++] = next_sqe(opcode, c, nsid, buf, bs, span, &rng);
                t0[c] = t;
            } else {
                inflight--;
            }
        }
        if (again) {
            int k = sde_sq_submit(mem, sqe, again, doorbell_fd, &kicked);
            if (k < (int)again) { /* cannot happen: qd <= ring size */
                rc = k < 0 ? k : -EOVERFLOW;
                inflight -= again - (k < 0 ? 0 : (uint32_t)k);
            }
        }
    }
    out[2] = t - start;
    free(t0);
    free(sqe);
    free(cqe);
    return rc;
}
