/* The key index: an open hash table of entries. */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- the index --------------------------------------------------------------------- */

static uint64_t key_hash(uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint8_t k[24] = {0};
    memcpy(k, &nsid, 4);
    k[4] = (uint8_t)klen;
    memcpy(k + 8, key, klen);
    return XXH3_64bits(k, sizeof(k));
}

uint32_t store_ent_find(const sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint32_t i = st->ent_heads[key_hash(nsid, key, klen) & st->ent_mask];
    while (i != NIL) {
        const struct ent *e = &st->ents[i];
        if (e->nsid == nsid && e->klen == klen && !memcmp(e->key, key, klen))
            return i;
        i = e->hnext;
    }
    return NIL;
}

/* Bring into the cache what finds of these keys read: every key's bucket head first, then
 * every first entry of those buckets, then those entries' extents.  A find alone waits for
 * each of its misses in turn (two or three, ~200 ns: 11-18% of the data plane's time per
 * 4 KiB put or get at QD32); across a batch of commands, the misses of one step overlap.
 * For a put, the dedup bucket its old value leaves is the fourth step, and the one its new
 * value's hash names (the hash made here, for st_put_begin_hashed) the fifth. */
void st_prefetch_keys(const sde_store *st, const st_key_ref *keys, int n)
{
    uint32_t at[ST_PREFETCH_MAX];
    if (n > ST_PREFETCH_MAX)
        n = ST_PREFETCH_MAX;
    for (int k = 0; k < n; k++) {
        at[k] = (uint32_t)(key_hash(keys[k].nsid, keys[k].key, keys[k].klen) & st->ent_mask);
        __builtin_prefetch(&st->ent_heads[at[k]]);
    }
    for (int k = 0; k < n; k++) {
        at[k] = st->ent_heads[at[k]];
        if (at[k] != NIL)
            __builtin_prefetch(&st->ents[at[k]]);
    }
    for (int k = 0; k < n; k++)
        if (at[k] != NIL)
            __builtin_prefetch(&st->exts[st->ents[at[k]].ext]);
    /* a put's old value leaves the dedup index when the new one is applied (dd_remove) */
    for (int k = 0; k < n; k++)
        if (at[k] != NIL && keys[k].replaces)
            __builtin_prefetch(&st->dd_heads[st->exts[st->ents[at[k]].ext].hash & st->dd_mask]);
    /* and its new value is looked up there first (its hash is known once it is read) */
    for (int k = 0; k < n; k++)
        if (keys[k].value) {
            *keys[k].vhash = st_value_hash(keys[k].value, keys[k].vlen);
            __builtin_prefetch(&st->dd_heads[*keys[k].vhash & st->dd_mask]);
        }
}

uint32_t store_ent_insert(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint32_t i = st->ent_free;
    if (i == NIL)
        return NIL;
    struct ent *e = &st->ents[i];
    st->ent_free = e->hnext;
    memset(e, 0, sizeof(*e));
    memcpy(e->key, key, klen);
    e->klen = (uint8_t)klen;
    e->nsid = nsid;
    e->used = 1;
    uint64_t b = key_hash(nsid, key, klen) & st->ent_mask;
    e->hnext = st->ent_heads[b];
    st->ent_heads[b] = i;
    st->nkeys++;
    return i;
}

void store_ent_remove(sde_store *st, uint32_t i)
{
    struct ent *e = &st->ents[i];
    uint32_t *p = &st->ent_heads[key_hash(e->nsid, e->key, e->klen) & st->ent_mask];
    while (*p != i)
        p = &st->ents[*p].hnext;
    *p = e->hnext;
    e->used = 0;
    e->hnext = st->ent_free;
    st->ent_free = i;
    st->nkeys--;
}
