/*
 * Fault injection for the people testing their own software against the drive (what SPDK's
 * error bdev, dm-flakey and null_blk give block-device developers): rules that make chosen
 * commands fail with MEDIA_ERROR or complete late.  Pure logic, no I/O: the data plane
 * (c/dev) asks sde_fault_check about each command it fetches.  Seeded: the same rules,
 * seed and commands give the same faults.
 */
#ifndef SDE_FAULT_H
#define SDE_FAULT_H
#include <stdint.h>

/* CDEF-BEGIN */
#define SDE_FAULT_MAX 32
#define SDE_FAULT_READ_ERROR 1   /* reads (block READ, KV retrieves) fail: MEDIA_ERROR */
#define SDE_FAULT_WRITE_ERROR 2  /* writes (block WRITE, KV stores) fail: MEDIA_ERROR */
#define SDE_FAULT_LATENCY 3      /* matching commands complete latency_ns later */
#define SDE_FAULT_DIR_READ 1
#define SDE_FAULT_DIR_WRITE 2

typedef struct sde_fault_rule {
    uint32_t kind;          /* SDE_FAULT_* */
    uint32_t nsid;          /* the namespace (block or KV); any when all_ns */
    uint32_t all_ns;
    uint32_t klen;          /* > 0: only KV commands on this key */
    uint8_t key[16];
    uint64_t lba_first;     /* block commands: those touching [first, first + count) */
    uint64_t lba_count;     /* 0: the whole namespace */
    uint64_t count;         /* commands it still hits; 0: until cleared */
    double probability;     /* each matching command is hit with this probability (0..1] */
    uint64_t latency_ns;    /* SDE_FAULT_LATENCY */
    uint32_t directions;    /* SDE_FAULT_LATENCY: SDE_FAULT_DIR_* it applies to (0: both) */
    uint32_t id;            /* given by sde_fault_add */
    uint64_t hits;          /* commands it hit so far */
    uint64_t rng;           /* its random state, from the seed */
} sde_fault_rule;

typedef struct sde_faults {
    sde_fault_rule rules[32];
    uint32_t n;
    uint32_t next_id;
} sde_faults;

/* A rule (checked: kind, probability, a latency for latency rules); its id, or -EINVAL /
 * -ENOSPC.  seed: the rule's random sequence. */
int sde_fault_add(sde_faults *f, const sde_fault_rule *r, uint64_t seed);
/* Remove one rule (id), or all (id 0); how many went. */
int sde_fault_clear(sde_faults *f, uint32_t id);
/* The fault a command meets: a status to fail it with (0: none) and, in *extra_ns, a delay to
 * add to its completion.  dir: SDE_FAULT_DIR_*; a block command gives its lba range
 * (nblocks > 0), a KV command its key (klen > 0). */
uint16_t sde_fault_check(sde_faults *f, uint32_t dir, uint32_t nsid, uint64_t lba,
                         uint64_t nblocks, const uint8_t *key, uint32_t klen,
                         uint64_t *extra_ns);
/* CDEF-END */
#endif
