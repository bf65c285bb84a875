/* Format, probe, and open: the superblock, the newest checkpoint, the journal replayed,
 * extents and namespaces marked, as named steps. */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- format / open ----------------------------------------------------------------- */

static int alloc_tables(sde_store *st)
{
    uint64_t keys = st->sb.index_keys;
    uint64_t nb = 1;
    while (nb < keys)
        nb <<= 1;
    st->ents = calloc(keys, sizeof(*st->ents));
    st->ent_heads = malloc(nb * sizeof(uint32_t));
    st->dd_heads = malloc(nb * sizeof(uint32_t));
    st->nbits = st->sb.d_len / st->block;
    st->bitmap = calloc((st->nbits + 63) / 64 + 1, sizeof(uint64_t));
    if (!st->ents || !st->ent_heads || !st->dd_heads || !st->bitmap)
        return -ENOMEM;
    memset(st->ent_heads, 0xff, nb * sizeof(uint32_t));
    memset(st->dd_heads, 0xff, nb * sizeof(uint32_t));
    st->ent_mask = st->dd_mask = nb - 1;
    st->ent_free = NIL;
    for (uint64_t i = keys; i-- > 0;) {
        st->ents[i].hnext = st->ent_free;
        st->ent_free = (uint32_t)i;
    }
    st->ext_free = NIL;
    st->free_blocks = st->nbits;
    st->open_group = 1;
    st->committed = 0;
    return 0;
}

/* The store's unit (its allocation unit, and its journal block) is at least 4 KiB, whatever
 * the media's logical block: a direct write that is not 4 KiB-aligned costs a real drive a
 * read-modify-write of its 4 KiB mapping unit, and on a file, ext4 serializes it behind every
 * other direct write in flight to the file (it takes the inode's lock exclusively and waits
 * for them), which fio shows on this machine's disk: 272 KiB writes to a fresh file at QD16
 * run at 1.98 GB/s 4 KiB-aligned, 1.2 GB/s at 512-byte offsets; 3.5 KiB ones 5x slower. */

static sde_store *store_new(int fd, uint32_t lba, uint32_t unit, int durable)
{
    sde_store *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->fd = fd;
    st->lba = lba;
    st->block = unit;
    st->durable = durable;
    return st;
}

void sde_store_free(sde_store *st)
{
    if (!st)
        return;
    free(st->ents);
    free(st->early);
    free(st->unsure);
    free(st->ent_heads);
    free(st->dd_heads);
    for (uint32_t x = 0; st->exts && x < st->next_cap; x++)
        if (st->exts[x].live)
            free(st->exts[x].pieces);
    free(st->exts);
    free(st->ld_pieces);
    free(st->zombies);
    free(st->bitmap);
    free(st->pending);
    for (int k = 0; k < J_SLOTS; k++)
        free(st->js[k].buf);
    free(st->scratch);
    free(st);
}

int sde_store_probe(int fd, uint32_t *version)
{
    uint8_t *b = store_aligned(SB_BYTES);
    if (!b)
        return -ENOMEM;
    int r = store_pio(fd, 0, b, SB_BYTES, 0);
    int out;
    if (r < 0) {
        out = r;
    } else if (!memcmp(b, SB_MAGIC, 8)) {
        uint32_t v;
        memcpy(&v, b + 8, 4);
        if (version)
            *version = v;
        out = v == SDE_STORE_VERSION ? SDE_PROBE_CURRENT
              : v < SDE_STORE_VERSION ? SDE_PROBE_OLD_VERSION : SDE_PROBE_NEWER_VERSION;
    } else {
        out = SDE_PROBE_BLANK;
        for (uint32_t i = 0; i < SB_BYTES; i++)
            if (b[i]) {
                out = SDE_PROBE_FOREIGN;
                break;
            }
    }
    free(b);
    return out;
}

static uint64_t default_journal_blocks(uint64_t media, uint32_t block)
{
    /* under 1% of the media; at least 256 blocks, since a group commit takes one or more
     * (a small device would checkpoint every few hundred serial changes otherwise) */
    uint64_t j = media / 128 / block;
    uint64_t lo = 256, hi = (64ull << 20) / block;
    return j < lo ? lo : j > hi ? hi : j;
}

int sde_store_format(int fd, uint64_t media_size, uint32_t lba, const sde_store_params *p,
                     sde_store **out)
{
    sde_store *st = store_new(fd, lba, lba > STORE_MIN_UNIT ? lba : STORE_MIN_UNIT,
                                p->durable);
    if (!st)
        return -ENOMEM;
    struct sb *sb = &st->sb;
    memcpy(sb->magic, SB_MAGIC, 8);
    sb->version = SDE_STORE_VERSION;
    sb->block = st->block;
    sb->media_bytes = media_size;
    sb->max_value = p->max_value ? p->max_value : 64ull << 20;
    sb->j_blocks = p->journal_blocks ? p->journal_blocks
                                      : default_journal_blocks(media_size, st->block);
    /* as many keys as the profile's index holds, and no more than blocks could hold values */
    uint64_t keys = p->index_keys ? p->index_keys : 1ull << 20;
    uint64_t cap = media_size / 4096; /* one key per 4 KiB of media at most */
    if (keys > cap)
        keys = cap;
    if (keys < 16)
        keys = 16;
    if (keys > UINT32_MAX - 1)
        keys = UINT32_MAX - 1;
    sb->index_keys = keys;
    sb->ckpt_off = SB_BYTES;
    sb->slot_bytes = store_roundup(keys * ENTRY_BYTES, 4096);
    sb->j_off = sb->ckpt_off + 2 * CKPT_HDR_BYTES + 2 * sb->slot_bytes;
    sb->d_off = store_roundup(sb->j_off + sb->j_blocks * st->block, 4096);
    if (media_size <= sb->d_off || (media_size - sb->d_off) / st->block < 1) {
        sde_store_free(st);
        return store_fail(-ENOSPC, "media of %llu bytes is too small for a store of %llu keys",
                    (unsigned long long)media_size, (unsigned long long)keys);
    }
    sb->d_len = (media_size - sb->d_off) / st->block * st->block;
    int r = alloc_tables(st);
    uint8_t *buf = r ? NULL : store_aligned(SB_BYTES + 2 * CKPT_HDR_BYTES);
    if (!buf) {
        sde_store_free(st);
        return -ENOMEM;
    }
    /* both checkpoint headers invalid, a first journal block that is not one */
    memset(buf, 0, SB_BYTES + 2 * CKPT_HDR_BYTES);
    r = store_pio(fd, 1, buf + SB_BYTES, 2 * CKPT_HDR_BYTES, sb->ckpt_off);
    if (!r)
        r = store_pio(fd, 1, buf, st->block, sb->j_off);
    st->ckpt_gen = 0;
    st->j_start = st->j_next = 1;
    if (!r)
        r = store_checkpoint_now(st); /* generation 1: empty */
    if (!r) {
        sb->hash = XXH3_64bits(sb, offsetof(struct sb, hash));
        memset(buf, 0, SB_BYTES);
        memcpy(buf, sb, sizeof(*sb));
        r = store_pio(fd, 1, buf, SB_BYTES, 0);
        if (!r && fdatasync(fd) < 0)
            r = -errno;
    }
    free(buf);
    if (r) {
        sde_store_free(st);
        return store_fail(r, "cannot format the media: %s", strerror(-r));
    }
    *out = st;
    return 0;
}

static int read_header(sde_store *st, uint64_t which, struct ckpt_hdr *h)
{
    uint8_t *b = store_scratch(st, CKPT_HDR_BYTES);
    if (!b || store_pio(st->fd, 0, b, CKPT_HDR_BYTES, st->sb.ckpt_off + which * CKPT_HDR_BYTES))
        return 0;
    memcpy(h, b, sizeof(*h));
    return h->magic == CKPT_MAGIC && h->hash == XXH3_64bits(h, offsetof(struct ckpt_hdr, hash));
}

/* Read the journal's block i into blk: whether it is the valid next one. */
static int journal_block(sde_store *st, uint8_t *blk, uint64_t i)
{
    if (store_pio(st->fd, 0, blk, st->block, st->sb.j_off + i * st->block))
        return 0;
    struct jhdr *jh = (struct jhdr *)blk;
    uint64_t want = jh->hash;
    jh->hash = 0;
    if ((jh->magic != JBLK_MAGIC && jh->magic != JBLK_MAGIC3) || jh->seq != st->j_start + i ||
        jh->nrec > store_recs_per_block(st) || XXH3_64bits(blk, st->block) != want)
        return 0;
    /* a chained block must follow the one before it (i 0: the first of the lap) */
    if (jh->magic == JBLK_MAGIC3 && jh->prev != (i ? st->j_prev_hash : 0))
        return 0;
    st->j_prev_hash = want;
    return 1;
}

/* Open, step 1: what the probe found, as the one-line error a user sees (0: a current
 * store). */
static int check_probe(int fd)
{
    uint32_t version = 0;
    int pr = sde_store_probe(fd, &version);
    if (pr < 0)
        return store_fail(pr, "cannot read the media: %s", strerror(-pr));
    if (pr == SDE_PROBE_BLANK)
        return store_fail(-ENODATA, "the media is blank: format it (ssdemu format)");
    if (pr == SDE_PROBE_FOREIGN)
        return store_fail(-EINVAL, "the media holds something that is not an ssdemu device");
    if (pr == SDE_PROBE_OLD_VERSION)
        return store_fail(-EPROTO, "the media holds store format v%u, which this ssdemu no longer "
                    "reads: reformat it with 'ssdemu format' (its contents are lost)", version);
    if (pr == SDE_PROBE_NEWER_VERSION)
        return store_fail(-EPROTO, "the media has store format v%u; this ssdemu reads v%u",
                    version, SDE_STORE_VERSION);
    return 0;
}

/* Step 2: the superblock, checked against the media it is on. */
static int read_superblock(sde_store *st, int fd, uint32_t lba, uint64_t media_size)
{
    int r = 0;
    uint8_t *b = store_aligned(SB_BYTES);
    if (!b || store_pio(fd, 0, b, SB_BYTES, 0))
        r = store_fail(-EIO, "cannot read the superblock");
    if (!r) {
        memcpy(&st->sb, b, sizeof(st->sb));
        struct sb *sb = &st->sb;
        if (sb->hash != XXH3_64bits(sb, offsetof(struct sb, hash)))
            r = store_fail(-EINVAL, "the superblock's checksum does not match");
        else if (sb->block < lba || sb->block % lba || (sb->block & (sb->block - 1)) ||
                 sb->media_bytes != media_size)
            /* shrunk, it lost data; grown (a file enlarged after format), it is not the
             * device that was formatted, or it was changed behind the store's back */
            r = store_fail(-EINVAL, "the device was formatted for other media (%u-byte units, %llu "
                     "bytes; the media has %u-byte blocks, %llu bytes): restore its size, or "
                     "run ssdemu format to start over", sb->block,
                     (unsigned long long)sb->media_bytes, lba,
                     (unsigned long long)media_size);
        else if (sb->d_off + sb->d_len > media_size || sb->index_keys == 0 ||
                 sb->j_blocks == 0)
            r = store_fail(-EINVAL, "the superblock's regions do not fit the media");
        else
            st->block = sb->block;
    }
    free(b);
    return r;
}

/* Step 3: an empty map of media offsets to extents, sized for the index (replay's dedup of
 * values by place). */
static int offmap_init(struct offmap *m, uint64_t index_keys)
{
    uint64_t n = 1;
    while (n < 2 * index_keys + 2)
        n <<= 1;
    m->slot = malloc(n * sizeof(uint32_t));
    m->mask = n - 1;
    if (!m->slot)
        return -ENOMEM;
    memset(m->slot, 0xff, n * sizeof(uint32_t));
    return 0;
}

/* Step 4: the namespaces and the index as the newest valid checkpoint holds them. */
static int load_newest_checkpoint(sde_store *st, struct offmap *m)
{
    struct ckpt_hdr ha, hb, *h;
    int va = read_header(st, 0, &ha), vb = read_header(st, 1, &hb);
    h = va && (!vb || ha.gen > hb.gen) ? &ha : vb ? &hb : NULL;
    if (!h)
        return store_fail(-EINVAL, "no valid checkpoint on the media");
    /* owners written with the header, or none (a header from before they were kept: a
     * namespace with bytes is shared) */
    int owned = h->owners_hash == XXH3_64bits(h->owners, sizeof(h->owners));
    for (uint32_t n = 1; n <= SDE_STORE_MAX_NS; n++) {
        const struct ns_owner *o = &h->owners[n];
        uint32_t flags = owned ? o->flags : h->ns[n].bytes ? SDE_NS_USED | SDE_NS_SHARED : 0;
        if (!(flags & SDE_NS_USED))
            continue;
        st->ns[n] = (sde_ns_info){.offset = h->ns[n].off, .bytes = h->ns[n].bytes,
                                  .token = owned ? o->token : 0,
                                  .uid = owned ? o->uid : 0, .flags = flags};
        st->ns_gen[n]++;
    }
    if (store_load_checkpoint(st, h, m) < 0)
        /* its slot was written and synced before its header: this is corruption */
        return store_fail(-EINVAL, "the checkpoint's slot does not match its header");
    st->ckpt_gen = h->gen;
    st->j_start = st->j_next = h->j_start;
    return 0;
}

/* Step 5: the journal after the checkpoint, up to the first block that is not the next one:
 * first how far it goes and what its last block calls unsure, then its records. */
static int replay_journal(sde_store *st, struct offmap *m)
{
    int r = 0;
    uint8_t *blk = store_aligned(st->block);
    uint64_t nvalid = 0, unsure = NO_UNSURE;
    for (uint64_t i = 0; blk && i < st->sb.j_blocks; i++) {
        if (!journal_block(st, blk, i))
            break;
        unsure = ((struct jhdr *)blk)->unsure;
        nvalid = i + 1;
    }
    for (uint64_t i = 0; blk && i < nvalid; i++) {
        if (!journal_block(st, blk, i))
            break;
        struct jhdr *jh = (struct jhdr *)blk;
        int verify = jh->seq >= unsure;
        const struct rec *rr = (const struct rec *)(blk + JHDR_BYTES);
        int bad = 0;
        for (uint32_t k = 0; k < jh->nrec && !bad; k++) {
            bad = store_load_record(st, m, &rr[k], verify);
            st->stats.replayed_records++;
        }
        if (bad == -ENOMEM || bad == -ENOSPC) {
            r = store_fail(bad, "the index cannot hold the journal's keys");
            break;
        }
        if (bad == -EIO) {
            r = store_fail(bad, "cannot read a value the journal names");
            break;
        }
        st->j_next = st->j_start + i + 1;
    }
    free(blk);
    st->ld_n = 0; /* pieces after the last OP_PUT: a put the crash cut short */
    return r;
}

/* Step 6: mark what live extents occupy; the rest (orphans too) is free.  An extent no key
 * names (only records a later one replaced did) is freed. */
static int mark_extents(sde_store *st)
{
    for (uint32_t x = 0; x < st->next_cap; x++) {
        struct ext *e = &st->exts[x];
        if (!e->live)
            continue;
        if (!e->krefs) {
            store_drop_pieces(e);
            e->live = 0;
            e->hnext = st->ext_free;
            st->ext_free = x;
            continue;
        }
        for (uint32_t i = 0; i < store_ext_npieces(e); i++) {
            struct piece pc = store_ext_piece(e, i);
            uint64_t b0 = (pc.off - st->sb.d_off) / st->block, nb = pc.nbytes / st->block;
            for (uint64_t k = b0; k < b0 + nb; k++)
                if (store_bit(st, k))
                    return store_fail(-EINVAL, "two live extents overlap at %llu",
                                      (unsigned long long)pc.off);
            store_set_bits(st, b0, nb, 1);
        }
        st->physical += e->nbytes;
    }
    st->nzombies = 0;
    return 0;
}

/* Step 7: mark what namespaces occupy, each checked to lie in the data region. */
static int mark_namespaces(sde_store *st)
{
    for (uint32_t n = 1; n <= SDE_STORE_MAX_NS; n++) {
        const sde_ns_info *ns = &st->ns[n];
        if (!ns->bytes)
            continue;
        if (ns->offset < st->sb.d_off || ns->offset % st->block || ns->bytes % st->lba ||
            ns->offset + store_roundup(ns->bytes, st->block) > st->sb.d_off + st->sb.d_len)
            return store_fail(-EINVAL, "namespace %u does not fit the data region", n);
        store_set_bits(st, (ns->offset - st->sb.d_off) / st->block,
                       store_roundup(ns->bytes, st->block) / st->block, 1);
    }
    return 0;
}

int sde_store_open(int fd, uint64_t media_size, uint32_t lba, const sde_store_params *p,
                   sde_store **out)
{
    int r = check_probe(fd);
    if (r)
        return r;
    sde_store *st = store_new(fd, lba, 0, p->durable); /* its unit: the superblock's */
    if (!st)
        return -ENOMEM;
    struct offmap m = {0};
    r = read_superblock(st, fd, lba, media_size);
    if (!r)
        r = alloc_tables(st);
    if (!r)
        r = offmap_init(&m, st->sb.index_keys);
    if (!r)
        r = load_newest_checkpoint(st, &m);
    if (!r)
        r = replay_journal(st, &m);
    free(m.slot);
    if (!r)
        r = mark_extents(st);
    if (!r)
        r = mark_namespaces(st);
    /* a record skipped as never written must not be replayed again unchecked (later blocks
     * call nothing unsure): a checkpoint ends the journal it is in */
    if (!r && st->stats.unwritten_records_skipped)
        r = store_checkpoint_now(st);
    if (r) {
        sde_store_free(st);
        return r;
    }
    *out = st;
    return 0;
}

void sde_store_get_info(const sde_store *st, sde_store_info *o)
{
    *o = st->stats;
    o->version = st->sb.version;
    o->block = st->block;
    o->media_bytes = st->sb.media_bytes;
    o->ckpt_off = st->sb.ckpt_off;
    o->ckpt_slot_bytes = st->sb.slot_bytes;
    o->journal_off = st->sb.j_off;
    o->journal_blocks = st->sb.j_blocks;
    o->data_off = st->sb.d_off;
    o->data_bytes = st->sb.d_len;
    o->index_keys = st->sb.index_keys;
    o->max_value = st->sb.max_value;
    o->keys = st->nkeys;
    o->logical_bytes = st->logical;
    o->physical_bytes = st->physical;
    o->free_bytes = st->free_blocks * st->block;
    o->journal_used_blocks = st->j_next - st->j_start;
    o->checkpoint_gen = st->ckpt_gen;
    uint64_t n = 0, pieced = 0;
    for (uint32_t x = 0; x < st->next_cap; x++) {
        n += st->exts[x].live && st->exts[x].krefs;
        pieced += st->exts[x].live && st->exts[x].krefs && st->exts[x].npieces > 1;
    }
    o->extents = n;
    o->pieced_values = pieced;
    o->index_entries = st->entries;
    o->failed = (uint64_t)st->failed;
}
