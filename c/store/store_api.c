/* The synchronous API (format tools, tests, admin commands): put, get, delete, list, pins,
 * prefix match, flush, namespaces. */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- synchronous API --------------------------------------------------------------- */

int sde_store_put(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                  const void *value, uint64_t len, int mode, sde_kv_put_result *res)
{
    st_put_plan p;
    memset(res, 0, sizeof(*res));
    int s = st_put_begin(st, nsid, key, klen, value, len, mode, &p);
    if (s)
        return s;
    if (p.wrote) {
        const struct ext *e = &st->exts[p.ext];
        uint8_t *buf = store_scratch(st, e->nbytes);
        if (!buf) {
            st_put_abort(st, &p);
            return SDE_SC_INTERNAL;
        }
        memcpy(buf, value, len);
        memset(buf + len, 0, e->nbytes - len); /* nothing of older values past the end */
        if (store_ext_pio(st, e, 1, buf)) {
            st_put_abort(st, &p);
            return SDE_SC_MEDIA_ERROR;
        }
    }
    uint64_t group;
    int wrote = p.wrote;
    s = st_put_commit(st, &p, &group);
    if (s)
        return s;
    if (store_commit_sync(st) < 0)
        return SDE_SC_MEDIA_ERROR;
    res->existed = p.existed;
    res->wrote = wrote;
    if (!p.noop || p.existed) {
        uint32_t i = store_ent_find(st, nsid, key, klen);
        if (i != NIL) {
            res->offset = st->exts[st->ents[i].ext].off;
            res->length = st->exts[st->ents[i].ext].len;
        }
    }
    return SDE_SC_SUCCESS;
}

int sde_store_test_early_put(sde_store *st, const uint8_t *key, uint32_t klen,
                             const void *value, uint64_t len, int write_value)
{
    if (!st_early_ok(st))
        return SDE_SC_INVALID_FIELD;
    st_put_plan p;
    int s = st_put_begin(st, 0, key, klen, value, len, SDE_KV_STORE_ANY, &p);
    if (s || !p.wrote)
        return s ? s : SDE_SC_INVALID_FIELD; /* nothing to write: not an early put */
    s = st_put_record(st, &p);
    if (s)
        return s;
    if (store_commit_sync(st) < 0)
        s = SDE_SC_MEDIA_ERROR;
    const struct ext *e = &st->exts[p.ext];
    uint8_t *buf = !s && write_value ? store_scratch(st, e->nbytes) : NULL;
    if (buf) {
        memcpy(buf, value, len);
        memset(buf + len, 0, e->nbytes - len);
        if (store_ext_pio(st, e, 1, buf))
            s = SDE_SC_MEDIA_ERROR;
    }
    /* the plan lives on this stack: an unwritten one stays unsure, as an in-flight one */
    if (write_value)
        store_early_remove(st, &p);
    else
        st_put_abort_early(st, &p);
    return s;
}

int sde_store_get(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen, void *out,
                  uint64_t cap, uint64_t *len)
{
    uint32_t x;
    uint64_t off, hash;
    *len = 0;
    int s = st_get_begin(st, nsid, key, klen, &x, &off, len, &hash);
    if (s)
        return s;
    if (*len > cap) {
        st_get_end(st, x);
        return SDE_SC_KV_INVALID_VALUE_SIZE;
    }
    uint8_t *buf = store_scratch(st, st->exts[x].nbytes);
    s = !buf ? SDE_SC_INTERNAL
        : store_ext_pio(st, &st->exts[x], 0, buf) ? SDE_SC_MEDIA_ERROR
        : st_value_hash(buf, *len) != hash ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
    if (!s)
        memcpy(out, buf, *len);
    st_get_end(st, x);
    return s;
}

int sde_store_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint64_t group;
    int s = st_delete(st, nsid, key, klen, &group);
    if (s)
        return s;
    return store_commit_sync(st) < 0 ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
}

int sde_store_failed(const sde_store *st) { return st->failed; }

int sde_store_exists(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint32_t i;
    return store_entry_existing(st, nsid, key, klen, &i);
}

int sde_store_lookup(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                     uint64_t *offset, uint64_t *len, uint64_t *hash)
{
    uint32_t i;
    int s = store_entry_existing(st, nsid, key, klen, &i);
    if (s)
        return s;
    const struct ext *e = &st->exts[st->ents[i].ext];
    *offset = e->off;
    *len = e->len;
    *hash = e->hash;
    return SDE_SC_SUCCESS;
}

/* ST_PREFETCH_MAX keys at a time: their index entries prefetched together, then found (one
 * at a time, a find waited for its two or three misses in turn: a retrieval command's
 * lookup of 16,384 blocks held the data plane's lock ~40 us per 256 keys). */
void sde_store_lookup_many(sde_store *st, uint32_t nsid, const uint8_t *keys,
                           const uint32_t *klens, uint32_t n, uint64_t *offset, uint64_t *len,
                           uint64_t *hash, int32_t *status)
{
    st_key_ref refs[ST_PREFETCH_MAX];
    for (uint32_t i = 0; i < n;) {
        uint32_t m = n - i < ST_PREFETCH_MAX ? n - i : ST_PREFETCH_MAX;
        const uint8_t *k = keys;
        for (uint32_t j = 0; j < m; k += klens[i + j], j++)
            refs[j] = (st_key_ref){.nsid = nsid, .klen = klens[i + j], .key = k};
        st_prefetch_keys(st, refs, (int)m);
        for (uint32_t j = 0; j < m; keys += klens[i], i++, j++)
            status[i] = sde_store_lookup(st, nsid, keys, klens[i], &offset[i], &len[i],
                                         &hash[i]);
    }
}

static int key_cmp(const uint8_t *a, uint32_t al, const uint8_t *b, uint32_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (int)al - (int)bl;
}

static int cmp_entry(const void *a, const void *b)
{
    const uint8_t *x = a, *y = b;
    return key_cmp(x + 1, x[0], y + 1, y[0]);
}

int sde_store_list(sde_store *st, uint32_t nsid, const uint8_t *start, uint32_t klen,
                   uint8_t *out, uint32_t max)
{
    if (!max)
        return 0;
    if (st->failed)
        return -EIO;
    uint64_t n = 0;
    uint8_t *all = malloc((st->nkeys + 1) * SDE_LIST_ENTRY);
    if (!all)
        return -ENOMEM;
    for (uint64_t b = 0; b <= st->ent_mask; b++) {
        for (uint32_t i = st->ent_heads[b]; i != NIL; i = st->ents[i].hnext) {
            const struct ent *e = &st->ents[i];
            if (e->nsid != nsid || (klen && key_cmp(e->key, e->klen, start, klen) < 0))
                continue;
            uint8_t *o = all + n++ * SDE_LIST_ENTRY;
            memset(o, 0, SDE_LIST_ENTRY);
            o[0] = e->klen;
            memcpy(o + 1, e->key, e->klen);
        }
    }
    qsort(all, n, SDE_LIST_ENTRY, cmp_entry);
    if (n > max)
        n = max;
    memcpy(out, all, n * SDE_LIST_ENTRY);
    free(all);
    return (int)n;
}

int sde_store_pin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen, int delta,
                  uint32_t *count)
{
    uint32_t i;
    int s = store_entry_existing(st, nsid, key, klen, &i);
    if (s)
        return s;
    struct ent *e = &st->ents[i];
    if (delta < 0 && !e->pins)
        return SDE_SC_INVALID_FIELD; /* not pinned */
    if (delta > 0 && e->pins == UINT16_MAX)
        return SDE_SC_CAPACITY_EXCEEDED;
    /* a client's whole count at once (it left, or a forced delete): never below 0 */
    e->pins = delta < 0 && (uint32_t)-delta > e->pins ? 0 : (uint16_t)(e->pins + delta);
    *count = e->pins;
    return SDE_SC_SUCCESS;
}

uint64_t sde_store_prefix_match(sde_store *st, uint32_t nsid, const uint8_t *keys, uint64_t n)
{
    uint64_t i = 0;
    while (i < n && store_ent_find(st, nsid, keys + 16 * i, 16) != NIL)
        i++;
    return i;
}

int sde_store_flush(sde_store *st)
{
    int r = store_commit_sync(st);
    if (!r && fdatasync(st->fd) < 0)
        r = -errno;
    return r;
}

int sde_store_ns_create(sde_store *st, uint64_t bytes, uint32_t uid, uint32_t flags,
                        uint64_t token, uint32_t *nsid, uint64_t *offset)
{
    if (bytes % st->lba || flags & ~(uint32_t)SDE_NS_SHARED)
        return SDE_SC_INVALID_FIELD;
    uint64_t units = store_roundup(bytes, st->block) / st->block; /* whole store units */
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    uint32_t id = 0;
    for (uint32_t n = 1; n <= SDE_STORE_MAX_NS && !id; n++)
        if (!store_ns_present(st, n))
            id = n;
    if (!id)
        return SDE_SC_CAPACITY_EXCEEDED;
    uint64_t b = 0, off = 0;
    if (bytes) { /* bytes 0: keys only, no block range */
        b = store_alloc_blocks(st, units);
        if (b == UINT64_MAX)
            return SDE_SC_CAPACITY_EXCEEDED;
        off = st->sb.d_off + b * st->block;
    }
    flags |= SDE_NS_USED;
    struct rec r = {.op = OP_NS_CREATE, .nsid = id, .off = off, .len = bytes,
                    .reserved2 = {uid | (uint64_t)flags << 32, token}};
    if (store_append(st, &r) < 0) {
        if (bytes)
            store_free_blocks_at(st, b, units);
        return SDE_SC_INTERNAL;
    }
    st->ns[id] = (sde_ns_info){.offset = off, .bytes = bytes, .token = token, .uid = uid,
                               .flags = flags};
    st->ns_gen[id]++;
    if (store_commit_sync(st) < 0)
        return SDE_SC_MEDIA_ERROR;
    *nsid = id;
    *offset = off;
    return SDE_SC_SUCCESS;
}

int sde_store_ns_delete(sde_store *st, uint32_t nsid)
{
    if (nsid < 1 || !store_ns_present(st, nsid))
        return SDE_SC_INVALID_NAMESPACE;
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    struct rec r = {.op = OP_NS_DELETE, .nsid = nsid};
    if (store_append(st, &r) < 0)
        return SDE_SC_INTERNAL;
    sde_ns_info ns = st->ns[nsid];
    store_ns_drop(st, nsid); /* its keys go with it (their extents once the record is durable) */
    int c = store_commit_sync(st);
    /* its blocks are reused only after the record is on the media */
    if (ns.bytes)
        store_free_blocks_at(st, (ns.offset - st->sb.d_off) / st->block,
                       store_roundup(ns.bytes, st->block) / st->block);
    return c < 0 ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
}

int64_t sde_store_test_reput_group(sde_store *st, const uint8_t *key, uint32_t klen,
                                   const void *value, uint64_t len, int commit_first)
{
    if (!st_early_ok(st))
        return -EINVAL;
    st_put_plan p, q;
    uint64_t group;
    int s = st_put_begin(st, 0, key, klen, value, len, SDE_KV_STORE_ANY, &p);
    if (s || !p.wrote || st_put_record(st, &p))
        return -EINVAL; /* not an early put */
    /* its value lands (written here, synchronously) and the index takes it; its record is
     * still in the open group */
    const struct ext *e = &st->exts[p.ext];
    uint8_t *buf = store_scratch(st, e->nbytes);
    if (!buf)
        return -ENOMEM;
    memcpy(buf, value, len);
    memset(buf + len, 0, e->nbytes - len);
    if (store_ext_pio(st, e, 1, buf) || st_put_apply(st, &p, &group))
        return -EIO;
    if (commit_first && store_commit_sync(st) < 0) /* its record written too */
        return -EIO;
    /* the same bytes again, under the same key */
    s = st_put_begin(st, 0, key, klen, value, len, SDE_KV_STORE_ANY, &q);
    if (s || !q.noop)
        return -EINVAL;
    s = st_put_commit(st, &q, &group);
    if (s)
        return -EIO;
    int64_t ret = (int64_t)group;
    if (store_commit_sync(st) < 0)  /* leave the store as a synchronous caller expects it */
        return -EIO;
    return ret;
}

int sde_store_checkpoint(sde_store *st)
{
    if (st->j_busy)
        return -EBUSY;
    int r = store_checkpoint_now(st);
    if (!r)
        store_reap_zombies(st);
    return r;
}
