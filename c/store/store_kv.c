/* The data plane's KV steps: put (begin, record, commit or apply), early puts, get, delete. */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- KV operations ----------------------------------------------------------------- */

int store_key_ok(uint32_t klen) { return klen >= 1 && klen <= SDE_KEY_MAX; }

/* Every keyed entry point opens through here, in one order: the key's size, its namespace,
 * a failed store (whose index holds changes the media may not: sde_store_failed), then the
 * key's entry (*idx, NIL when absent).  One check, so no entry point can skip a step. */
int store_entry_open(const sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                     uint32_t *idx)
{
    if (!store_key_ok(klen))
        return SDE_SC_KV_INVALID_KEY_SIZE;
    if (!store_ns_present(st, nsid))
        return SDE_SC_INVALID_NAMESPACE;
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    *idx = store_ent_find(st, nsid, key, klen);
    return SDE_SC_SUCCESS;
}

/* store_entry_open for a key that must exist. */
int store_entry_existing(const sde_store *st, uint32_t nsid, const uint8_t *key,
                         uint32_t klen, uint32_t *idx)
{
    int s = store_entry_open(st, nsid, key, klen, idx);
    return s ? s : *idx == NIL ? SDE_SC_KV_KEY_NOT_EXIST : SDE_SC_SUCCESS;
}

/* Whether the index (its checkpoint slot: index_keys entries) can take key i (NIL: a new
 * key) naming extent x: a value in pieces takes an entry per piece too. */
static int entries_fit(const sde_store *st, uint32_t i, uint32_t x)
{
    /* early puts not yet applied hold their room */
    uint64_t need = st->entries + st->early_entries + store_ext_entries(&st->exts[x]);
    if (i != NIL)
        need -= store_ext_entries(&st->exts[st->ents[i].ext]);
    return need <= st->sb.index_keys;
}

/* Compare len bytes of the extent with value (a hash matched). */
static int same_bytes(sde_store *st, const struct ext *e, const void *value, uint64_t len)
{
    const uint64_t chunk = 1 << 20;
    uint8_t *buf = store_scratch(st, chunk);
    if (!buf)
        return 0;
    uint64_t at = 0; /* the value's offset of this piece */
    for (uint32_t k = 0; k < store_ext_npieces(e) && at < len; k++) {
        struct piece pc = store_ext_piece(e, k);
        uint64_t in_piece = len - at < pc.nbytes ? len - at : pc.nbytes;
        for (uint64_t done = 0; done < in_piece; done += chunk) {
            uint64_t n = in_piece - done < chunk ? in_piece - done : chunk;
            if (store_pio(st->fd, 0, buf, store_roundup(n, st->block), pc.off + done))
                return 0;
            if (memcmp(buf, (const uint8_t *)value + at + done, n))
                return 0;
        }
        at += pc.nbytes;
    }
    return 1;
}

int st_put_begin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                 const void *value, uint64_t len, int mode, st_put_plan *p)
{
    return st_put_begin_hashed(st, nsid, key, klen, value, len, mode, NULL, NULL, p);
}

/* A conditional put's key no longer holds the value it read (i: its entry, or NIL). */
static int changed(const sde_store *st, const st_put_plan *p, uint32_t i)
{
    if (!p->expect)
        return 0;
    if (i == NIL)
        return 1;
    uint32_t e = st->ents[i].ext;
    return e != p->expect_ext || st->exts[e].hash != p->expect_hash;
}

int st_put_begin_hashed(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                        const void *value, uint64_t len, int mode, const uint64_t *hash,
                        const st_expect *expect, st_put_plan *p)
{
    if (!store_key_ok(klen)) /* before the value's checks, as the other openings */
        return SDE_SC_KV_INVALID_KEY_SIZE;
    if (!len || len > st->sb.max_value)
        return SDE_SC_KV_INVALID_VALUE_SIZE;
    if (mode != SDE_KV_STORE_ANY && mode != SDE_KV_STORE_IF_EXISTS &&
        mode != SDE_KV_STORE_IF_NOT_EXISTS)
        return SDE_SC_INVALID_FIELD;
    uint32_t i;
    int s = store_entry_open(st, nsid, key, klen, &i);
    if (s)
        return s;
    memset(p, 0, sizeof(*p));
    p->nsid = nsid;
    p->ns_gen = nsid ? st->ns_gen[nsid] : 0;
    p->klen = klen;
    memcpy(p->key, key, klen);
    p->mode = mode;
    p->len = len;
    p->existed = i != NIL;
    if (expect) {
        p->expect = 1;
        p->expect_ext = expect->ext;
        p->expect_hash = expect->hash;
    }
    if (changed(st, p, i))
        return SDE_SC_ABORTED;
    if (mode == SDE_KV_STORE_IF_EXISTS && i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    if (mode == SDE_KV_STORE_IF_NOT_EXISTS && i != NIL)
        return SDE_SC_KV_KEY_EXISTS;
    if (i == NIL && st->nkeys + st->early_new_keys >= st->sb.index_keys)
        return SDE_SC_CAPACITY_EXCEEDED;
    p->hash = hash ? *hash : st_value_hash(value, len);
    if (i != NIL) {
        struct ext *e = &st->exts[st->ents[i].ext];
        if (e->hash == p->hash && e->len == len && same_bytes(st, e, value, len)) {
            p->noop = 1; /* these bytes are stored under this key: nothing to do */
            return SDE_SC_SUCCESS;
        }
    }
    for (uint32_t x = st->dd_heads[p->hash & st->dd_mask]; x != NIL; x = st->exts[x].hnext) {
        struct ext *e = &st->exts[x];
        if (e->hash != p->hash || e->len != len)
            continue;
        if (same_bytes(st, e, value, len)) {
            if (!entries_fit(st, i, x))
                return SDE_SC_CAPACITY_EXCEEDED;
            p->ext = x;
            st->stats.dedup_hits++;
            return SDE_SC_SUCCESS;
        }
        st->stats.hash_collisions++;
    }
    p->ext = store_ext_alloc(st, len, p->hash);
    if (p->ext == NIL)
        return SDE_SC_CAPACITY_EXCEEDED;
    if (!entries_fit(st, i, p->ext)) {
        store_ext_free_now(st, p->ext);
        return SDE_SC_CAPACITY_EXCEEDED;
    }
    p->wrote = 1;
    return SDE_SC_SUCCESS;
}

int st_media_fd(const sde_store *st) { return st->fd; }

int st_read_pinned(int fd, const uint64_t *pc, uint32_t n, uint8_t *buf, uint64_t len,
                   uint64_t hash)
{
    uint64_t at = 0;
    for (uint32_t i = 0; i < n; at += pc[2 * i + 1], i++)
        if (store_pio(fd, 0, buf + at, pc[2 * i + 1], pc[2 * i]))
            return SDE_SC_MEDIA_ERROR;
    return st_value_hash(buf, len) == hash ? SDE_SC_SUCCESS : SDE_SC_MEDIA_ERROR;
}

uint32_t st_ext_pieces(const sde_store *st, uint32_t ext)
{
    return store_ext_npieces(&st->exts[ext]);
}

void st_ext_piece(const sde_store *st, uint32_t ext, uint32_t i, uint64_t *offset,
                  uint64_t *bytes)
{
    struct piece pc = store_ext_piece(&st->exts[ext], i);
    *offset = pc.off;
    *bytes = pc.nbytes;
}

void st_put_abort(sde_store *st, st_put_plan *p)
{
    if (p->wrote && !p->noop && st->exts[p->ext].live && !st->exts[p->ext].krefs)
        store_ext_free_now(st, p->ext);
    p->wrote = 0;
}

/* What a put must still satisfy when its record is appended (another command may have
 * changed the key while the value was written); *ip: the key's entry or NIL. */
static int put_checks(sde_store *st, const st_put_plan *p, uint32_t *ip)
{
    uint32_t i = store_ent_find(st, p->nsid, p->key, p->klen);
    *ip = i;
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    if (!store_ns_present(st, p->nsid) || (p->nsid && st->ns_gen[p->nsid] != p->ns_gen))
        return SDE_SC_INVALID_NAMESPACE; /* deleted while the value was written */
    if (p->mode == SDE_KV_STORE_IF_EXISTS && i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    if (p->mode == SDE_KV_STORE_IF_NOT_EXISTS && i != NIL)
        return SDE_SC_KV_KEY_EXISTS;
    if (changed(st, p, i))
        return SDE_SC_ABORTED; /* a conditional put's key changed while its value was made */
    if (i == NIL && st->nkeys + st->early_new_keys >= st->sb.index_keys)
        return SDE_SC_CAPACITY_EXCEEDED;
    if (!p->wrote && (!st->exts[p->ext].live || !st->exts[p->ext].krefs))
        return SDE_SC_ABORTED; /* the shared extent went away meanwhile: rare; retry */
    if (!entries_fit(st, i, p->ext))
        return SDE_SC_CAPACITY_EXCEEDED;
    return SDE_SC_SUCCESS;
}

int st_put_commit(sde_store *st, st_put_plan *p, uint64_t *group)
{
    *group = 0;
    if (p->noop) {
        /* these bytes are under this key already, maybe by a change whose record is not
         * written yet (an early put is applied when its value lands, before its group is
         * committed): acknowledged once every record before it is, so that a FLUSH after
         * the acknowledgement covers that record too */
        uint64_t before = st->npending ? st->open_group : st->last_taken;
        *group = before > st->committed ? before : 0;
        return SDE_SC_SUCCESS;
    }
    uint32_t i;
    int st_code = put_checks(st, p, &i);
    if (!st_code && store_append_put(st, p) < 0)
        st_code = SDE_SC_INTERNAL;
    if (st_code) {
        st_put_abort(st, p);
        return st_code;
    }
    p->existed = i != NIL;
    store_apply_put_ext(st, p->nsid, p->key, p->klen, p->ext);
    *group = st->open_group;
    return SDE_SC_SUCCESS;
}

/* ---- early puts: the record goes out with the value -------------------------------- */

int st_early_ok(const sde_store *st)
{
    /* write cache off: a group's sync must cover the value, so the value goes first */
    return !st->durable;
}

static int early_add(sde_store *st, st_put_plan *p)
{
    if (st->nearly == st->cap_early) {
        uint32_t cap = st->cap_early ? 2 * st->cap_early : 64;
        st_put_plan **n = realloc(st->early, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        st->early = n;
        st->cap_early = cap;
    }
    st->early[st->nearly++] = p;
    return 0;
}

void store_early_remove(sde_store *st, st_put_plan *p)
{
    for (uint32_t k = 0; k < st->nearly; k++)
        if (st->early[k] == p) {
            st->early[k] = st->early[--st->nearly];
            break;
        }
    st->early_new_keys -= (uint64_t)p->new_key;
    st->early_entries -= p->res_entries;
    p->early = 0;
}

int st_put_record(sde_store *st, st_put_plan *p)
{
    uint32_t i;
    int code = put_checks(st, p, &i);
    if (!code && early_add(st, p) < 0)
        code = SDE_SC_INTERNAL;
    if (!code && store_append_put(st, p) < 0) {
        st->nearly--;
        code = SDE_SC_INTERNAL;
    }
    if (code) {
        st_put_abort(st, p);
        return code;
    }
    p->existed = i != NIL;
    p->early = 1;
    p->rec_seq = 0;
    p->group = st->open_group;
    p->new_key = i == NIL;
    p->res_entries = store_ext_entries(&st->exts[p->ext]);
    st->early_new_keys += (uint64_t)p->new_key;
    st->early_entries += p->res_entries;
    return SDE_SC_SUCCESS;
}

int st_put_apply(sde_store *st, st_put_plan *p, uint64_t *group)
{
    store_early_remove(st, p);
    *group = p->group;
    int code = st->failed ? SDE_SC_MEDIA_ERROR
               : !store_ns_present(st, p->nsid) || (p->nsid && st->ns_gen[p->nsid] != p->ns_gen)
                   ? SDE_SC_INVALID_NAMESPACE : SDE_SC_SUCCESS;
    if (code) {
        /* its record is in the journal (before the namespace's delete): the extent is
         * reused only once a later group is committed, as a deleted value's is */
        struct ext *e = &st->exts[p->ext];
        e->krefs = 1;
        store_ext_unref(st, p->ext);
        return code;
    }
    if (store_apply_put_ext(st, p->nsid, p->key, p->klen, p->ext))
        return SDE_SC_CAPACITY_EXCEEDED; /* its room was held: cannot happen */
    return SDE_SC_SUCCESS;
}

void st_put_abort_early(sde_store *st, st_put_plan *p)
{
    store_early_remove(st, p);
    p->wrote = 0;
    if (st->nunsure == st->cap_unsure) {
        uint32_t cap = st->cap_unsure ? 2 * st->cap_unsure : 16;
        struct unsure *n = realloc(st->unsure, cap * sizeof(*n));
        if (!n) {
            st->failed = 1; /* cannot track it: refuse changes rather than risk */
            return;
        }
        st->unsure = n;
        st->cap_unsure = cap;
    }
    st->unsure[st->nunsure++] = (struct unsure){p->put_idx, p->rec_seq, p->ext};
}

int st_key_busy(const sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    for (uint32_t k = 0; k < st->nearly; k++) {
        const st_put_plan *p = st->early[k];
        if (p->nsid == nsid && p->klen == klen && !memcmp(p->key, key, klen))
            return 1;
    }
    return 0;
}

int st_get_begin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                 uint32_t *ext, uint64_t *offset, uint64_t *len, uint64_t *hash)
{
    uint32_t i;
    int s = store_entry_existing(st, nsid, key, klen, &i);
    if (s)
        return s;
    struct ext *e = &st->exts[st->ents[i].ext];
    *ext = st->ents[i].ext;
    *offset = e->off;
    *len = e->len;
    *hash = e->hash;
    e->rrefs++;
    return SDE_SC_SUCCESS;
}

void st_get_end(sde_store *st, uint32_t ext)
{
    struct ext *e = &st->exts[ext];
    if (--e->rrefs == 0 && e->zombie)
        store_reap_zombies(st);
}

int st_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
              uint64_t *group)
{
    *group = 0;
    uint32_t i;
    int s = store_entry_existing(st, nsid, key, klen, &i);
    if (s)
        return s;
    if (st->ents[i].pins)
        return SDE_SC_KV_KEY_PINNED; /* in use by in-flight work: unpin it first */
    struct rec r = {.op = OP_DELETE, .klen = (uint8_t)klen, .nsid = nsid};
    memcpy(r.key, key, klen);
    if (store_append(st, &r) < 0)
        return SDE_SC_INTERNAL;
    store_apply_delete(st, nsid, key, klen);
    *group = st->open_group;
    return SDE_SC_SUCCESS;
}
