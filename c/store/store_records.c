/* Namespaces, and records: the one place state changes (live, at replay, at checkpoint load). */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- namespaces -------------------------------------------------------------------- */

/* Namespace 0 (the shared default for keys) always exists. */
int store_ns_present(const sde_store *st, uint32_t nsid)
{
    return nsid == 0 || (nsid <= SDE_STORE_MAX_NS && (st->ns[nsid].flags & SDE_NS_USED));
}

int sde_store_ns_get(const sde_store *st, uint32_t nsid, sde_ns_info *out)
{
    if (nsid < 1 || !store_ns_present(st, nsid))
        return -ENOENT;
    *out = st->ns[nsid];
    return 0;
}

/* ---- records: the one place state changes (live, at replay, at checkpoint load) ----- */

/* Point key at an extent holding (off, len, hash); during load the extent is found by
 * offset in `by_off` (open addressing over extent ids, size mask+1). */
int store_apply_put_ext(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                         uint32_t x)
{
    uint32_t i = store_ent_find(st, nsid, key, klen);
    if (i == NIL) {
        i = store_ent_insert(st, nsid, key, klen);
        if (i == NIL)
            return SDE_SC_CAPACITY_EXCEEDED;
    } else {
        struct ext *old = &st->exts[st->ents[i].ext];
        st->logical -= old->len;
        st->entries -= store_ext_entries(old);
        store_ext_unref(st, st->ents[i].ext);
    }
    st->ents[i].ext = x;
    struct ext *e = &st->exts[x];
    st->entries += store_ext_entries(e);
    if (e->krefs++ == 0) {
        e->zombie = 0;
        store_dd_add(st, x);
    }
    st->logical += e->len;
    return SDE_SC_SUCCESS;
}

int store_apply_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint32_t i = store_ent_find(st, nsid, key, klen);
    if (i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    st->logical -= st->exts[st->ents[i].ext].len;
    st->entries -= store_ext_entries(&st->exts[st->ents[i].ext]);
    store_ext_unref(st, st->ents[i].ext);
    store_ent_remove(st, i);
    return SDE_SC_SUCCESS;
}

/* A namespace goes, and every key in it (the one place, live and at replay). */
void store_ns_drop(sde_store *st, uint32_t nsid)
{
    for (uint64_t b = 0; b <= st->ent_mask; b++) {
        uint32_t i = st->ent_heads[b];
        while (i != NIL) {
            uint32_t next = st->ents[i].hnext;
            if (st->ents[i].nsid == nsid) {
                st->ents[i].pins = 0;
                store_apply_delete(st, nsid, st->ents[i].key, st->ents[i].klen);
            }
            i = next;
        }
    }
    memset(&st->ns[nsid], 0, sizeof(st->ns[nsid]));
}

/* (Re)describe an extent read at load: its value and, for a value in pieces, the pieces
 * (np > 1; copied).  -ENOMEM, or 0. */
static int set_extent(sde_store *st, struct ext *e, uint64_t len, uint64_t hash,
                      const struct rec *pcs, uint32_t np)
{
    store_drop_pieces(e);
    e->len = len;
    e->hash = hash;
    e->nbytes = store_roundup(len, st->block);
    if (np > 1) {
        if (!(e->pieces = malloc(np * sizeof(*e->pieces))))
            return -ENOMEM;
        for (uint32_t i = 0; i < np; i++)
            e->pieces[i] = (struct piece){pcs[i].off, pcs[i].len};
        e->npieces = np;
    }
    return 0;
}

/* The extent a record names, found by its (first) place among those loaded so far. */
static uint32_t load_extent(sde_store *st, struct offmap *m, uint64_t off, uint64_t len,
                            uint64_t hash, const struct rec *pcs, uint32_t np)
{
    uint64_t h = (off / st->block * 0x9E3779B97F4A7C15ull) & m->mask;
    while (m->slot[h] != NIL) {
        struct ext *e = &st->exts[m->slot[h]];
        if (e->off == off) {
            if (e->krefs && (e->hash != hash || e->len != len ||
                             store_ext_npieces(e) != (np > 1 ? np : 1)))
                return NIL - 1; /* two live values at one place: not a journal we wrote */
            if (!e->krefs && set_extent(st, e, len, hash, pcs, np))
                return NIL; /* its bytes were freed and the place reused: a new value */
            return m->slot[h];
        }
        h = (h + 1) & m->mask;
    }
    uint32_t x = store_ext_new(st);
    if (x == NIL)
        return NIL;
    struct ext *e = &st->exts[x];
    e->off = off;
    if (set_extent(st, e, len, hash, pcs, np))
        return NIL;
    m->slot[h] = x;
    return x;
}

static int valid_place(const sde_store *st, uint64_t off, uint64_t nbytes)
{
    return nbytes && off >= st->sb.d_off && off % st->block == 0 && nbytes % st->block == 0 &&
           off - st->sb.d_off <= st->sb.d_len && nbytes <= st->sb.d_off + st->sb.d_len - off;
}

static int valid_extent(const sde_store *st, uint64_t off, uint64_t len)
{
    return len && len <= st->sb.max_value && valid_place(st, off, store_roundup(len, st->block));
}

/* A value's pieces as read (np of them, in order, of this record's key), or not. */
static int valid_pieces(const sde_store *st, const struct rec *r, uint32_t np)
{
    if (np > MAX_PIECES || st->ld_n != np || !r->len || r->len > st->sb.max_value)
        return 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < np; i++) {
        const struct rec *q = &st->ld_pieces[i];
        if (q->hash != i || q->nsid != r->nsid || q->klen != r->klen ||
            memcmp(q->key, r->key, r->klen) || !valid_place(st, q->off, q->len))
            return 0;
        total += q->len;
    }
    return st->ld_pieces[0].off == r->off && total == store_roundup(r->len, st->block);
}

/* verify: the record may name a value whose write had not ended (an early put's, the block
 * at or past its header's `unsure`): applied only if the media holds the value's bytes. */
int store_load_record(sde_store *st, struct offmap *m, const struct rec *r, int verify)
{
    if (r->op == OP_PIECE) { /* held until its value's OP_PUT */
        if (!r->klen || r->klen > SDE_KEY_MAX)
            return -1;
        if (st->ld_n == st->ld_cap) {
            uint32_t cap = st->ld_cap ? 2 * st->ld_cap : 16;
            struct rec *n = realloc(st->ld_pieces, cap * sizeof(*n));
            if (!n)
                return -ENOMEM;
            st->ld_pieces = n;
            st->ld_cap = cap;
        }
        st->ld_pieces[st->ld_n++] = *r;
        return 0;
    }
    uint32_t held = st->ld_n;
    st->ld_n = 0; /* pieces not followed by their OP_PUT: a put that never completed */
    if (r->op == OP_PUT) {
        uint32_t np = (uint32_t)r->reserved2[0];
        st->ld_n = held;
        int ok = np > 1 ? valid_pieces(st, r, np) : valid_extent(st, r->off, r->len);
        st->ld_n = 0;
        if (!r->klen || r->klen > SDE_KEY_MAX || !ok)
            return -1;
        uint32_t x = load_extent(st, m, r->off, r->len, r->hash, st->ld_pieces, np);
        if (x == NIL)
            return -ENOMEM;
        if (x == NIL - 1)
            return -1;
        if (verify && !st->exts[x].krefs) {
            int on = store_value_on_media(st, x);
            if (on < 0)
                return on;
            if (!on) { /* never written: the put was not acknowledged; its extent is free */
                st->stats.unwritten_records_skipped++;
                return 0;
            }
        }
        return store_apply_put_ext(st, r->nsid, r->key, r->klen, x) ? -ENOSPC : 0;
    }
    if (r->op == OP_DELETE) {
        if (!r->klen || r->klen > SDE_KEY_MAX)
            return -1;
        store_apply_delete(st, r->nsid, r->key, r->klen);
        return 0;
    }
    if (r->op == OP_NS_CREATE || r->op == OP_NS_DELETE) {
        if (r->nsid < 1 || r->nsid > SDE_STORE_MAX_NS)
            return -1;
        if (r->op == OP_NS_DELETE) {
            store_ns_drop(st, r->nsid);
            return 0;
        }
        /* owner: reserved2[0] = uid | flags << 32, reserved2[1] = token; a record from
         * before owners were kept has none: shared */
        uint32_t flags = (uint32_t)(r->reserved2[0] >> 32);
        st->ns[r->nsid] = (sde_ns_info){
            .offset = r->off, .bytes = r->len, .token = r->reserved2[1],
            .uid = (uint32_t)r->reserved2[0],
            .flags = SDE_NS_USED | (r->reserved2[0] || r->reserved2[1] ? flags : SDE_NS_SHARED)};
        st->ns_gen[r->nsid]++;
        return 0;
    }
    return -1;
}
