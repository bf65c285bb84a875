/* Checkpoints: the live index to the other slot, then its header; loading one at open. */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- checkpoints ------------------------------------------------------------------- */

static uint64_t hdr_off(const sde_store *st, uint64_t gen) { return st->sb.ckpt_off + (gen & 1) * CKPT_HDR_BYTES; }

static uint64_t slot_off(const sde_store *st, uint64_t gen)
{
    return st->sb.ckpt_off + 2 * CKPT_HDR_BYTES + (gen & 1) * st->sb.slot_bytes;
}

/* The live index as records into out (room for st->entries): a value in pieces is its
 * pieces' records, then its put's.  Returns how many. */
static uint64_t slot_records(const sde_store *st, struct rec *out)
{
    uint64_t n = 0;
    for (uint64_t b = 0; b <= st->ent_mask; b++) {
        for (uint32_t i = st->ent_heads[b]; i != NIL; i = st->ents[i].hnext) {
            const struct ent *e = &st->ents[i];
            const struct ext *x = &st->exts[e->ext];
            for (uint32_t k = 0; x->npieces > 1 && k < x->npieces; k++) {
                struct rec *q = &out[n++];
                q->op = OP_PIECE;
                q->klen = e->klen;
                q->nsid = e->nsid;
                memcpy(q->key, e->key, e->klen);
                q->off = x->pieces[k].off;
                q->len = x->pieces[k].nbytes;
                q->hash = k;
            }
            struct rec *r = &out[n++];
            r->op = OP_PUT;
            r->klen = e->klen;
            r->nsid = e->nsid;
            memcpy(r->key, e->key, e->klen);
            r->off = x->off;
            r->len = x->len;
            r->hash = x->hash;
            r->reserved2[0] = x->npieces > 1 ? x->npieces : 0;
        }
    }
    return n;
}

/* Write the live index and namespaces to the other slot, then its header; the journal
 * restarts after it.  Everything appended so far (the open group too) is then durable. */
int store_write_checkpoint(sde_store *st)
{
    uint64_t gen = st->ckpt_gen + 1;
    uint64_t bytes = store_roundup(st->entries * ENTRY_BYTES, st->block);
    uint8_t *buf = store_aligned(bytes);
    if (!buf)
        return -ENOMEM;
    memset(buf, 0, bytes);
    uint64_t n = slot_records(st, (struct rec *)buf);
    int ret = 0;
    if (bytes)
        ret = store_pio(st->fd, 1, buf, bytes, slot_off(st, gen));
    uint64_t slot_hash = XXH3_64bits(buf, n * ENTRY_BYTES);
    free(buf);
    if (!ret && fdatasync(st->fd) < 0)
        ret = -errno;
    if (ret)
        return ret;
    uint8_t *hb = store_scratch(st, CKPT_HDR_BYTES);
    if (!hb)
        return -ENOMEM;
    memset(hb, 0, CKPT_HDR_BYTES);
    struct ckpt_hdr *h = (struct ckpt_hdr *)hb;
    h->magic = CKPT_MAGIC;
    h->version = SDE_STORE_VERSION;
    h->gen = gen;
    h->j_start = st->j_next; /* the journal restarts at its first block */
    h->nentries = n;
    h->slot_hash = slot_hash;
    for (uint32_t n = 1; n <= SDE_STORE_MAX_NS; n++) {
        const sde_ns_info *ns = &st->ns[n];
        if (!(ns->flags & SDE_NS_USED))
            continue;
        h->ns[n] = (struct ns_rec){ns->offset, ns->bytes};
        h->owners[n] = (struct ns_owner){ns->uid, ns->flags, ns->token};
    }
    h->hash = XXH3_64bits(h, offsetof(struct ckpt_hdr, hash));
    h->owners_hash = XXH3_64bits(h->owners, sizeof(h->owners));
    ret = store_pio(st->fd, 1, hb, CKPT_HDR_BYTES, hdr_off(st, gen));
    if (!ret && fdatasync(st->fd) < 0)
        ret = -errno;
    if (ret)
        return ret;
    st->ckpt_gen = gen;
    st->j_start = st->j_next;
    st->j_prev_hash = 0; /* the first block of the new lap */
    st->npending = 0;
    st->committed = st->open_group++;
    st->stats.checkpoints++;
    return 0;
}

/* Load a checkpoint's entries; 0, or <0 when its slot does not hold what its header says. */
int store_load_checkpoint(sde_store *st, const struct ckpt_hdr *h, struct offmap *m)
{
    uint64_t bytes = store_roundup(h->nentries * ENTRY_BYTES, st->block);
    if (h->nentries > st->sb.index_keys)
        return -EINVAL;
    uint8_t *buf = store_aligned(bytes);
    if (!buf)
        return -ENOMEM;
    int r = bytes ? store_pio(st->fd, 0, buf, bytes, slot_off(st, h->gen)) : 0;
    if (!r && XXH3_64bits(buf, h->nentries * ENTRY_BYTES) != h->slot_hash)
        r = -EINVAL;
    const struct rec *e = (const struct rec *)buf;
    for (uint64_t i = 0; !r && i < h->nentries; i++)
        r = store_load_record(st, m, &e[i], 0) < 0 ? -EINVAL : 0;
    free(buf);
    st->stats.loaded_entries = h->nentries;
    return r;
}
