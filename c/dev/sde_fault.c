/* Fault rules (see sde_fault.h). */
#include "sde_fault.h"
#include "sde_queue.h"
#include "sde_rand.h"

#include <errno.h>
#include <string.h>

int sde_fault_add(sde_faults *f, const sde_fault_rule *r, uint64_t seed)
{
    if (r->kind < SDE_FAULT_READ_ERROR || r->kind > SDE_FAULT_LATENCY || r->klen > 16 ||
        !(r->probability > 0.0 && r->probability <= 1.0) ||
        (r->kind == SDE_FAULT_LATENCY && !r->latency_ns) || r->directions > 3)
        return -EINVAL;
    if (f->n == SDE_FAULT_MAX)
        return -ENOSPC;
    sde_fault_rule *n = &f->rules[f->n++];
    *n = *r;
    n->id = ++f->next_id;
    n->hits = 0;
    n->rng = seed;
    return (int)n->id;
}

int sde_fault_clear(sde_faults *f, uint32_t id)
{
    int gone = 0;
    for (uint32_t i = 0; i < f->n;) {
        if (!id || f->rules[i].id == id) {
            memmove(&f->rules[i], &f->rules[i + 1], (f->n - i - 1) * sizeof(f->rules[0]));
            f->n--;
            gone++;
        } else {
            i++;
        }
    }
    return gone;
}

static int matches(const sde_fault_rule *r, uint32_t dir, uint32_t nsid, uint64_t lba,
                   uint64_t nblocks, const uint8_t *key, uint32_t klen)
{
    if (r->kind == SDE_FAULT_READ_ERROR && dir != SDE_FAULT_DIR_READ)
        return 0;
    if (r->kind == SDE_FAULT_WRITE_ERROR && dir != SDE_FAULT_DIR_WRITE)
        return 0;
    if (r->kind == SDE_FAULT_LATENCY && r->directions && !(r->directions & dir))
        return 0;
    if (!r->all_ns && r->nsid != nsid)
        return 0;
    if (r->klen)
        return klen == r->klen && !memcmp(key, r->key, klen);
    if (r->lba_count) /* a range: block commands that touch it */
        return nblocks && lba < r->lba_first + r->lba_count && r->lba_first < lba + nblocks;
    return 1;
}

uint16_t sde_fault_check(sde_faults *f, uint32_t dir, uint32_t nsid, uint64_t lba,
                         uint64_t nblocks, const uint8_t *key, uint32_t klen,
                         uint64_t *extra_ns)
{
    uint16_t status = 0;
    *extra_ns = 0;
    for (uint32_t i = 0; i < f->n;) {
        sde_fault_rule *r = &f->rules[i];
        if (!matches(r, dir, nsid, lba, nblocks, key, klen) ||
            (r->probability < 1.0 &&
             (double)(splitmix64(&r->rng) >> 11) * 0x1p-53 >= r->probability)) {
            i++;
            continue;
        }
        r->hits++;
        if (r->kind == SDE_FAULT_LATENCY)
            *extra_ns += r->latency_ns;
        else
            status = SDE_SC_MEDIA_ERROR;
        if (r->count && --r->count == 0) { /* spent: the rule goes */
            memmove(r, r + 1, (f->n - i - 1) * sizeof(*r));
            f->n--;
            continue;
        }
        i++;
    }
    return status;
}
