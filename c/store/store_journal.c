/* The journal: records appended to the open group, groups built into blocks, commits. */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- the journal ------------------------------------------------------------------- */

uint32_t store_recs_per_block(const sde_store *st) { return (st->block - JHDR_BYTES) / REC_BYTES; }

int store_append(sde_store *st, const struct rec *r)
{
    if (st->npending == st->cap_pending) {
        uint32_t cap = st->cap_pending ? 2 * st->cap_pending : 256;
        struct rec *n = realloc(st->pending, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        st->pending = n;
        st->cap_pending = cap;
    }
    st->pending[st->npending++] = *r;
    st->stats.journal_records++;
    return 0;
}

/* The lowest journal block that may hold a record of an early put whose value is not known
 * to be written, the blocks about to be built from first_seq on placing the open group's. */
static uint64_t unsure_from(sde_store *st, uint64_t first_seq)
{
    uint32_t rpb = store_recs_per_block(st);
    uint64_t u = NO_UNSURE;
    for (uint32_t k = 0; k < st->nearly; k++) {
        st_put_plan *p = st->early[k];
        if (!p->rec_seq)
            p->rec_seq = first_seq + p->put_idx / rpb;
        if (p->rec_seq < u)
            u = p->rec_seq;
    }
    for (uint32_t k = 0; k < st->nunsure; k++) {
        struct unsure *x = &st->unsure[k];
        if (!x->rec_seq)
            x->rec_seq = first_seq + x->put_idx / rpb;
        if (x->rec_seq < u)
            u = x->rec_seq;
    }
    return u;
}

/* Lay the open group's records out as journal blocks in slot j's buffer, each chained to
 * the block before it; returns the bytes. */
static uint64_t build_blocks(sde_store *st, uint64_t first_seq, struct jslot *j)
{
    uint32_t rpb = store_recs_per_block(st);
    uint64_t nblk = (st->npending + rpb - 1) / rpb;
    uint64_t unsure = unsure_from(st, first_seq);
    uint64_t bytes = nblk * st->block;
    if (bytes > j->bytes) {
        uint8_t *n = store_aligned(bytes);
        if (!n)
            return 0;
        free(j->buf);
        j->buf = n;
        j->bytes = store_roundup(bytes, 4096);
    }
    memset(j->buf, 0, bytes);
    for (uint64_t b = 0; b < nblk; b++) {
        uint8_t *blk = j->buf + b * st->block;
        uint32_t n = st->npending - (uint32_t)(b * rpb);
        if (n > rpb)
            n = rpb;
        memcpy(blk + JHDR_BYTES, &st->pending[b * rpb], (uint64_t)n * REC_BYTES);
        struct jhdr *h = (struct jhdr *)blk;
        h->magic = JBLK_MAGIC3;
        h->nrec = n;
        h->seq = first_seq + b;
        h->unsure = unsure;
        h->prev = st->j_prev_hash;
        h->hash = XXH3_64bits(blk, st->block);
        st->j_prev_hash = h->hash;
    }
    return bytes;
}

/* Blocks the open group needs. */
static uint64_t pending_blocks(const sde_store *st)
{
    uint32_t rpb = store_recs_per_block(st);
    return (st->npending + rpb - 1) / rpb;
}

int st_journal_take(sde_store *st, void **buf, uint64_t *offset, uint32_t *len,
                    uint64_t *group)
{
    int slots = st->durable ? 1 : J_SLOTS; /* cache off: each group synced in turn */
    if (st->j_busy >= slots || !st->npending)
        return 0;
    uint64_t used = st->j_next - st->j_start, need = pending_blocks(st);
    if (used + need > st->sb.j_blocks || need * st->block > UINT32_MAX) {
        if (st->j_busy)
            return 0; /* full: the checkpoint waits for the groups in flight */
        /* the journal is full: a checkpoint holds the open group's changes too */
        *group = st->open_group;
        int r = store_checkpoint_now(st);
        if (r < 0) {
            st->failed = 1;
            return r;
        }
        return 2;
    }
    struct jslot *j = NULL;
    for (int k = 0; k < J_SLOTS && !j; k++)
        if (!st->js[k].busy)
            j = &st->js[k];
    uint64_t bytes = build_blocks(st, st->j_next, j);
    if (!bytes)
        return -ENOMEM;
    *buf = j->buf;
    *offset = st->sb.j_off + used * st->block;
    *len = (uint32_t)bytes;
    *group = j->group = st->last_taken = st->open_group++;
    j->busy = 1;
    st->j_next += need;
    st->npending = 0;
    st->j_busy++;
    return 1;
}

void st_journal_written(sde_store *st, uint64_t group, int ok)
{
    uint64_t oldest = UINT64_MAX;
    for (int k = 0; k < J_SLOTS; k++) {
        struct jslot *j = &st->js[k];
        if (j->busy && j->group == group) {
            j->busy = 0;
            st->j_busy--;
        } else if (j->busy && j->group < oldest) {
            oldest = j->group;
        }
    }
    if (!ok) {
        st->failed = 1; /* the journal cannot be trusted to hold more: refuse changes */
        return;
    }
    /* groups end in any order: committed are those with no earlier one still in flight */
    uint64_t c = oldest == UINT64_MAX ? st->last_taken : oldest - 1;
    if (c > st->committed)
        st->committed = c;
    st->stats.journal_writes++;
    store_reap_zombies(st);
}

uint64_t st_committed_group(const sde_store *st) { return st->committed; }
int st_journal_busy(const sde_store *st) { return st->j_busy; }
int st_durable(const sde_store *st) { return st->durable; }

uint64_t st_checkpoints(const sde_store *st) { return st->stats.checkpoints; }
uint32_t st_block(const sde_store *st) { return st->block; }
uint64_t st_max_value(const sde_store *st) { return st->sb.max_value; }

/* Commit the open group now, with pwrite (synchronous callers; no write in flight). */
int store_commit_sync(sde_store *st)
{
    if (st->j_busy)
        return -EBUSY;
    if (!st->npending)
        return 0;
    void *buf;
    uint64_t off, group;
    uint32_t len;
    int r = st_journal_take(st, &buf, &off, &len, &group);
    if (r == 2) {
        store_reap_zombies(st);
        return 0;
    }
    if (r <= 0)
        return r;
    r = store_pio(st->fd, 1, buf, len, off);
    if (!r && st->durable && fdatasync(st->fd) < 0)
        r = -errno;
    st_journal_written(st, group, r == 0);
    return r;
}

/* The put's records (its pieces first, if in pieces) into the open group; on a failure
 * none of them. */
int store_append_put(sde_store *st, st_put_plan *p)
{
    struct ext *e = &st->exts[p->ext];
    uint32_t had = st->npending;
    for (uint32_t k = 0; e->npieces > 1 && k < e->npieces; k++) {
        struct rec q = {.op = OP_PIECE, .klen = (uint8_t)p->klen, .nsid = p->nsid,
                        .off = e->pieces[k].off, .len = e->pieces[k].nbytes, .hash = k};
        memcpy(q.key, p->key, p->klen);
        if (store_append(st, &q) < 0)
            goto undo;
    }
    struct rec r = {.op = OP_PUT, .klen = (uint8_t)p->klen, .nsid = p->nsid, .off = e->off,
                    .len = e->len, .hash = e->hash,
                    .reserved2 = {e->npieces > 1 ? e->npieces : 0, 0}};
    memcpy(r.key, p->key, p->klen);
    p->put_idx = st->npending;
    if (store_append(st, &r) < 0)
        goto undo;
    return 0;
undo:
    st->stats.journal_records -= st->npending - had;
    st->npending = had;
    return -ENOMEM;
}

/* A checkpoint restarted the journal: the early puts' records go into the new open group
 * (the checkpoint holds the index without them), and the extents of failed ones are free. */
void store_early_after_checkpoint(sde_store *st)
{
    for (uint32_t k = 0; k < st->nearly; k++) {
        st_put_plan *p = st->early[k];
        p->rec_seq = 0;
        p->group = st->open_group;
        if (store_append_put(st, p) < 0)
            st->failed = 1; /* its record would be lost: refuse changes rather than risk */
    }
    for (uint32_t k = 0; k < st->nunsure; k++)
        store_ext_free_now(st, st->unsure[k].ext);
    st->nunsure = 0;
}

/* A checkpoint, then what follows it: the early puts' records rejoin the new open group,
 * and extents no record or retrieve needs any more are freed.  (Here rather than in
 * store_checkpoint.c: the journal both checkpoints when it fills and takes the records.) */
int store_checkpoint_now(sde_store *st)
{
    int r = store_write_checkpoint(st);
    if (r)
        return r;
    store_early_after_checkpoint(st);
    store_reap_zombies(st);
    return 0;
}
