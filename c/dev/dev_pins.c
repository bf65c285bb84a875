/* Pins: a client's pins on a key, released when it leaves. */
#define _GNU_SOURCE
#include "dev_internal.h"

static struct pin_rec *pin_find(sde_dev *dev, uint32_t client, uint32_t nsid,
                                const uint8_t *key, uint32_t klen)
{
    for (uint32_t i = 0; i < dev->npins; i++) {
        struct pin_rec *p = &dev->pins[i];
        if (p->client == client && p->nsid == nsid && p->klen == klen &&
            !memcmp(p->key, key, klen))
            return p;
    }
    return NULL;
}

static void pin_forget(sde_dev *dev, struct pin_rec *p)
{
    *p = dev->pins[--dev->npins];
}

/* PIN: the store's count goes up, and the client's own record of it. */
uint16_t dev_pin_add(sde_dev *dev, uint32_t client, uint32_t nsid, const uint8_t *key,
                        uint32_t klen, uint32_t *count)
{
    struct pin_rec *p = pin_find(dev, client, nsid, key, klen);
    if (!p && dev->npins == dev->cap_pins) {
        uint32_t cap = dev->cap_pins ? 2 * dev->cap_pins : 64;
        struct pin_rec *n = realloc(dev->pins, (uint64_t)cap * sizeof(*n));
        if (!n)
            return SDE_SC_INTERNAL;
        dev->pins = n;
        dev->cap_pins = cap;
    }
    uint16_t st = (uint16_t)sde_store_pin(dev->store, nsid, key, klen, 1, count);
    if (st)
        return st;
    if (!p) {
        p = &dev->pins[dev->npins++];
        memset(p, 0, sizeof(*p));
        p->client = client;
        p->nsid = nsid;
        p->klen = klen;
        memcpy(p->key, key, klen);
    }
    p->count++;
    return SDE_SC_SUCCESS;
}

/* UNPIN: only a pin of this client's own (another's is as if there were none). */
uint16_t dev_pin_drop(sde_dev *dev, uint32_t client, uint32_t nsid, const uint8_t *key,
                         uint32_t klen, uint32_t *count)
{
    struct pin_rec *p = pin_find(dev, client, nsid, key, klen);
    if (!p)
        return sde_store_exists(dev->store, nsid, key, klen) ? SDE_SC_KV_KEY_NOT_EXIST
                                                             : SDE_SC_INVALID_FIELD;
    uint16_t st = (uint16_t)sde_store_pin(dev->store, nsid, key, klen, -1, count);
    if (!st && --p->count == 0)
        pin_forget(dev, p);
    return st;
}

int sde_dev_release_pins(sde_dev *dev, uint32_t client)
{
    pthread_mutex_lock(&dev->lock);
    int n = 0;
    for (uint32_t i = 0; i < dev->npins;) {
        struct pin_rec *p = &dev->pins[i];
        if (p->client != client) {
            i++;
            continue;
        }
        for (uint32_t k = 0; k < p->count; k++) {
            uint32_t count;
            if (dev->store)
                sde_store_pin(dev->store, p->nsid, p->key, p->klen, -1, &count);
            n++;
        }
        pin_forget(dev, p); /* the last record moved here: look at slot i again */
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
        st = c->opcode == SDE_CMD_PIN ? dev_pin_add(dev, q->client, c->nsid, key, klen, &count)
                                      : dev_pin_drop(dev, q->client, c->nsid, key, klen, &count);
    dev_finish(dev, qp, cls, c->cid, st, st ? 0 : count, 0, t0);
}
