/* Pins: a client's pins on a key, released when it leaves.  The table is a hash on
 * (namespace, key), chained, so that a pin, an unpin and a forced delete cost the same
 * however many keys other clients pin (a linear table made every pin O(pins held)); each
 * uid may hold at most max_per_uid pinned keys. */
#define _GNU_SOURCE
#include "dev_internal.h"

#define PIN_NIL UINT32_MAX

static uint32_t pin_hash(const struct pin_table *t, uint32_t nsid, const uint8_t *key,
                         uint32_t klen)
{
    uint64_t h = 0xcbf29ce484222325ull ^ nsid; /* FNV-1a: keys are already hashes, mostly */
    for (uint32_t i = 0; i < klen; i++)
        h = (h ^ key[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32)) & (t->nheads - 1);
}

static int pin_is(const struct pin_rec *p, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    return p->nsid == nsid && p->klen == klen && !memcmp(p->key, key, klen);
}

/* client == PIN_NIL: any client's record of the key */
static uint32_t pin_find(const struct pin_table *t, uint32_t client, uint32_t nsid,
                         const uint8_t *key, uint32_t klen)
{
    if (!t->nheads)
        return PIN_NIL;
    for (uint32_t i = t->heads[pin_hash(t, nsid, key, klen)]; i != PIN_NIL; i = t->recs[i].next)
        if ((client == PIN_NIL || t->recs[i].client == client) && pin_is(&t->recs[i], nsid, key, klen))
            return i;
    return PIN_NIL;
}

static uint32_t *uid_pins(struct pin_table *t, uint32_t uid)
{
    for (uint32_t i = 0; i < t->nuids; i++)
        if (t->uids[i].uid == uid)
            return &t->uids[i].n;
    for (uint32_t i = 0; i < t->nuids; i++)
        if (!t->uids[i].n) { /* a slot no pin of its uid holds any more */
            t->uids[i].uid = uid;
            return &t->uids[i].n;
        }
    if (t->nuids == SDE_MAX_QPS) /* cannot happen: pins need a queue pair, one uid each */
        return NULL;
    t->uids[t->nuids].uid = uid;
    t->uids[t->nuids].n = 0;
    return &t->uids[t->nuids++].n;
}

/* Room for one more record, the chains rehashed at a load of 1. */
static int pin_room(struct pin_table *t)
{
    if (t->free == PIN_NIL && t->nrecs == t->cap) {
        uint32_t cap = t->cap ? 2 * t->cap : 64;
        struct pin_rec *n = realloc(t->recs, (uint64_t)cap * sizeof(*n));
        if (!n)
            return -1;
        t->recs = n;
        t->cap = cap;
    }
    if (t->live + 1 > t->nheads) {
        uint32_t nh = t->nheads ? 2 * t->nheads : 64;
        uint32_t *h = malloc((uint64_t)nh * sizeof(*h));
        if (!h)
            return -1;
        free(t->heads);
        t->heads = h;
        t->nheads = nh;
        for (uint32_t i = 0; i < nh; i++)
            h[i] = PIN_NIL;
        for (uint32_t i = 0; i < t->nrecs; i++) {
            struct pin_rec *p = &t->recs[i];
            if (!p->count)
                continue;
            uint32_t b = pin_hash(t, p->nsid, p->key, p->klen);
            p->next = h[b];
            h[b] = i;
        }
    }
    return 0;
}

static void pin_unlink(struct pin_table *t, uint32_t i)
{
    struct pin_rec *p = &t->recs[i];
    uint32_t *at = &t->heads[pin_hash(t, p->nsid, p->key, p->klen)];
    while (*at != i)
        at = &t->recs[*at].next;
    *at = p->next;
    uint32_t *n = uid_pins(t, p->uid);
    if (n)
        (*n)--;
    t->live--;
    t->total -= p->count;
    p->count = 0;
    p->next = t->free;
    t->free = i;
}

/* PIN: the store's count goes up, and the client's own record of it. */
uint16_t dev_pin_add(sde_dev *dev, const struct dev_qp *q, uint32_t nsid, const uint8_t *key,
                     uint32_t klen, uint32_t *count)
{
    struct pin_table *t = &dev->pins;
    uint32_t i = pin_find(t, q->client, nsid, key, klen);
    uint32_t *held = NULL;
    if (i == PIN_NIL) {
        held = uid_pins(t, q->uid);
        if (!held || (t->max_per_uid && *held >= t->max_per_uid))
            return SDE_SC_CAPACITY_EXCEEDED; /* the uid's pinned keys (serve --max-pins-per-uid) */
        if (pin_room(t) < 0)
            return SDE_SC_INTERNAL;
    }
    uint16_t st = (uint16_t)sde_store_pin(dev->store, nsid, key, klen, 1, count);
    if (st)
        return st;
    if (i == PIN_NIL) {
        if (t->free != PIN_NIL) {
            i = t->free;
            t->free = t->recs[i].next;
        } else {
            i = t->nrecs++;
        }
        struct pin_rec *p = &t->recs[i];
        memset(p, 0, sizeof(*p));
        p->client = q->client;
        p->uid = q->uid;
        p->nsid = nsid;
        p->klen = klen;
        memcpy(p->key, key, klen);
        uint32_t b = pin_hash(t, nsid, key, klen);
        p->next = t->heads[b];
        t->heads[b] = i;
        t->live++;
        (*held)++;
    }
    t->recs[i].count++;
    t->total++;
    return SDE_SC_SUCCESS;
}

/* UNPIN: only a pin of this client's own (another's is as if there were none). */
uint16_t dev_pin_drop(sde_dev *dev, const struct dev_qp *q, uint32_t nsid, const uint8_t *key,
                      uint32_t klen, uint32_t *count)
{
    struct pin_table *t = &dev->pins;
    uint32_t i = pin_find(t, q->client, nsid, key, klen);
    if (i == PIN_NIL)
        return sde_store_exists(dev->store, nsid, key, klen) ? SDE_SC_KV_KEY_NOT_EXIST
                                                             : SDE_SC_INVALID_FIELD;
    uint16_t st = (uint16_t)sde_store_pin(dev->store, nsid, key, klen, -1, count);
    if (!st) {
        t->total--;
        if (--t->recs[i].count == 0)
            pin_unlink(t, i);
    }
    return st;
}

/* Every client's pins on one key go (a forced delete); the store's count with them. */
void dev_pins_drop_key(sde_dev *dev, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    struct pin_table *t = &dev->pins;
    for (uint32_t i; (i = pin_find(t, PIN_NIL, nsid, key, klen)) != PIN_NIL;) {
        uint32_t count;
        if (dev->store)
            sde_store_pin(dev->store, nsid, key, klen, -(int)t->recs[i].count, &count);
        pin_unlink(t, i);
    }
}

/* Every pin on a namespace's keys goes (the namespace was deleted: its keys went too). */
void dev_pins_drop_ns(sde_dev *dev, uint32_t nsid)
{
    struct pin_table *t = &dev->pins;
    for (uint32_t i = 0; i < t->nrecs; i++)
        if (t->recs[i].count && t->recs[i].nsid == nsid)
            pin_unlink(t, i);
}

void dev_pins_free(sde_dev *dev)
{
    free(dev->pins.recs);
    free(dev->pins.heads);
    memset(&dev->pins, 0, sizeof(dev->pins));
}

void dev_pins_init(sde_dev *dev)
{
    memset(&dev->pins, 0, sizeof(dev->pins));
    dev->pins.free = PIN_NIL;
}

int sde_dev_set_pin_quota(sde_dev *dev, uint32_t max_per_uid)
{
    pthread_mutex_lock(&dev->lock);
    dev->pins.max_per_uid = max_per_uid;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

int sde_dev_release_pins(sde_dev *dev, uint32_t client)
{
    pthread_mutex_lock(&dev->lock);
    struct pin_table *t = &dev->pins;
    int n = 0;
    for (uint32_t i = 0; i < t->nrecs; i++) {
        struct pin_rec *p = &t->recs[i];
        if (!p->count || p->client != client)
            continue;
        uint32_t count;
        if (dev->store)
            sde_store_pin(dev->store, p->nsid, p->key, p->klen, -(int)p->count, &count);
        n += (int)p->count;
        pin_unlink(t, i);
    }
    pthread_mutex_unlock(&dev->lock);
    return n;
}

/* PIN and UNPIN: a 16-byte block key of a namespace the client may use; the result is the
 * key's pin count after the command. */
void dev_pin_start(sde_dev *dev, int qp, const sde_sqe *c, int cls, uint64_t t0)
{
    struct dev_qp *q = &dev->qps[qp];
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen, count = 0;
    uint16_t st = dev_kv_common(dev, q, c, key, &klen);
    if (!st && klen != 16)
        st = SDE_SC_KV_INVALID_KEY_SIZE; /* pins are for 16-byte block keys */
    if (!st)
        st = c->opcode == SDE_CMD_PIN ? dev_pin_add(dev, q, c->nsid, key, klen, &count)
                                      : dev_pin_drop(dev, q, c->nsid, key, klen, &count);
    dev_finish(dev, qp, cls, c->cid, st, st ? 0 : count, 0, t0);
}
