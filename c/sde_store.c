/*
 * The drive's KV store (see sde_store.h).
 *
 * On-media format v2 (little-endian; every region starts on a 4 KiB boundary):
 *   superblock  @0, 4 KiB: magic "SSDEMU\0\1", version, block, media bytes, the regions,
 *               index_keys, max_value, a hash of the rest.
 *   checkpoint  headers A and B @4 KiB and @8 KiB; slots A and B after them, each
 *               index_keys x 64 B.  A header: generation, the journal's first block
 *               sequence, the entry count, the namespace table, hashes of the slot and of
 *               itself.  The valid header of the higher generation wins.
 *   journal     journal_blocks logical blocks.  Block i after a checkpoint holds sequence
 *               start + i; a 64-byte block header (magic, sequence, record count, hash)
 *               and 64-byte records (put, delete, namespace create / delete).
 *   data        value extents and namespaces, in whole logical blocks.
 *
 * Why so: a checkpoint writes the live index (LevelDB's manifest) and restarts the journal
 * at its first block, so churn with a bounded live set runs forever and an open reads the
 * live set plus at most one journal's worth of records (LevelDB/RocksDB recycle their log
 * the same way).  Records are written in groups: every change the data plane appended
 * during one pass goes out in one write of whole blocks (group commit), and a block is
 * never rewritten once it holds a committed record, so a torn write can only lose the
 * group being written.  Block-sized records work on 512 B and 4 KiB media alike.
 *
 * Values: written to a free extent before their record; a crash in between leaves an
 * extent no record names, free at the next open.  An extent freed by a delete or an
 * overwrite is reused only after the record that freed it is committed and no retrieve
 * still reads it.  The content hash (XXH3-64) is the value's checksum and its dedup key;
 * a hash match is confirmed by comparing bytes, so a crafted collision cannot make one key
 * read another's bytes.
 */
#define _GNU_SOURCE
#include "sde_store_internal.h"
#include "sde_queue.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define SB_BYTES 4096u
#define CKPT_HDR_BYTES 4096u
#define REC_BYTES 64u
#define JHDR_BYTES 64u
#define ENTRY_BYTES 64u
#define NIL UINT32_MAX

static const char SB_MAGIC[8] = {'S', 'S', 'D', 'E', 'M', 'U', 0, 1};
#define CKPT_MAGIC 0x324b4353u /* "SCK2" */
#define JBLK_MAGIC 0x32424a53u  /* "SJB2" */
#define JBLK_MAGIC3 0x33424a53u /* "SJB3": chained (its header names the block before) */

/* OP_PIECE: one piece of a value stored in several (off, len: the piece's blocks; hash: its
 * index), written just before the value's OP_PUT (whose reserved2[0] is the piece count, and
 * off the first piece's): a put whose OP_PUT never reached the media leaves pieces that
 * replay drops, so a value spanning extents appears whole or not at all. */
enum { OP_PUT = 1, OP_DELETE = 2, OP_NS_CREATE = 3, OP_NS_DELETE = 4, OP_PIECE = 5 };

struct sb {
    char magic[8];
    uint32_t version;
    uint32_t block;
    uint64_t media_bytes;
    uint64_t ckpt_off;
    uint64_t slot_bytes;
    uint64_t j_off;
    uint64_t j_blocks;
    uint64_t d_off;
    uint64_t d_len;
    uint64_t index_keys;
    uint64_t max_value;
    uint64_t hash; /* of the bytes before it */
};

struct ns_rec {
    uint64_t off;
    uint64_t bytes;
};

struct ns_owner { /* in the checkpoint header after its hash: room the first v2 left */
    uint32_t uid;
    uint32_t flags;
    uint64_t token;
};

struct ckpt_hdr {
    uint32_t magic;
    uint32_t version;
    uint64_t gen;
    uint64_t j_start;   /* the journal's first block sequence after this checkpoint */
    uint64_t nentries;
    uint64_t slot_hash; /* of nentries x ENTRY_BYTES of the slot */
    struct ns_rec ns[SDE_STORE_MAX_NS + 1];
    uint64_t hash;      /* of the bytes before it */
    /* namespace owners; all zero (owners_hash too) in headers written before owners were
     * kept: their namespaces load as shared */
    struct ns_owner owners[SDE_STORE_MAX_NS + 1];
    uint64_t owners_hash;
};
_Static_assert(sizeof(struct ckpt_hdr) <= CKPT_HDR_BYTES, "a checkpoint header is one 4 KiB write");

struct rec { /* 64 bytes: a journal record and (op 0) a checkpoint entry */
    uint8_t op;
    uint8_t klen;
    uint16_t reserved;
    uint32_t nsid;
    uint8_t key[16];
    uint64_t off;
    uint64_t len;
    uint64_t hash;
    uint64_t reserved2[2];
};
_Static_assert(sizeof(struct rec) == REC_BYTES, "64-byte records");

#define J_SLOTS ST_JOURNAL_SLOTS

struct jhdr {
    uint32_t magic;
    uint32_t nrec;
    uint64_t seq;
    uint64_t hash; /* of the block with this field zero */
    /* records in blocks from this sequence on may name values whose writes had not ended
     * when this block was built (early puts): open checks their hashes.  NO_UNSURE: none;
     * 0 (blocks written before early puts): every block */
    uint64_t unsure;
    /* SJB3: the hash of the block before it in the journal (0: the first after a
     * checkpoint).  Several groups are written at once, so a crash can leave a group
     * written past one that is not; once the journal goes on from that hole, the chain
     * breaks at the stale group and open stops there */
    uint64_t prev;
    uint64_t reserved[3];
};
#define NO_UNSURE UINT64_MAX
_Static_assert(sizeof(struct jhdr) == JHDR_BYTES, "64-byte block header");

struct piece {
    uint64_t off, nbytes;
};

struct ext {
    uint64_t off;      /* the first piece's place */
    uint64_t len;      /* value bytes */
    uint64_t hash;
    uint64_t nbytes;   /* allocated, over every piece */
    struct piece *pieces; /* npieces > 1: a value no free run could hold whole */
    uint32_t npieces;     /* 0 or 1: one piece, (off, nbytes) */
    uint64_t release;  /* committed group after which it may be freed */
    uint32_t krefs;    /* index entries naming it */
    uint32_t rrefs;    /* retrieves reading it */
    uint32_t hnext;    /* dedup chain; free list */
    uint8_t live;      /* allocated */
    uint8_t in_dedup;
    uint8_t zombie;    /* no entry names it: free once committed and unread */
};

struct ent {
    uint8_t key[16];
    uint32_t nsid;
    uint32_t ext;
    uint32_t hnext;
    uint16_t pins;
    uint8_t klen;
    uint8_t used;
};

struct sde_store {
    int fd;
    uint32_t block; /* the store's unit: allocation and journal block (STORE_MIN_UNIT) */
    uint32_t lba;   /* the media's logical block: a namespace's size is a multiple of it */
    int durable;
    struct sb sb;
    /* index */
    struct ent *ents;
    uint32_t *ent_heads;
    uint64_t ent_mask;
    uint32_t ent_free;
    uint64_t nkeys;
    /* extents */
    struct ext *exts;
    uint32_t next_cap;
    uint32_t ext_free;
    uint32_t *dd_heads;
    uint64_t dd_mask;
    uint32_t *zombies;
    uint32_t nzombies, cap_zombies;
    /* data region allocation: one bit per logical block */
    uint64_t *bitmap;
    uint64_t nbits;
    uint64_t cursor;
    uint64_t free_blocks;
    /* told of every freed range (the device's timing model trims it from its FTL) */
    void (*on_free)(void *ctx, uint64_t off, uint64_t nbytes);
    void *on_free_ctx;
    uint64_t logical, physical;
    uint64_t entries;     /* checkpoint entries the index needs: a key, and its pieces */
    struct rec *ld_pieces; /* at open: the pieces read before their OP_PUT */
    uint32_t ld_n, ld_cap;
    sde_ns_info ns[SDE_STORE_MAX_NS + 1];
    uint32_t ns_gen[SDE_STORE_MAX_NS + 1]; /* bumped at every create: a put that began in a
                                            * namespace never lands in its successor */
    /* journal */
    uint64_t ckpt_gen;
    uint64_t j_start;     /* sequence of the journal's first block */
    uint64_t j_next;      /* sequence of the next block to write */
    struct rec *pending;  /* the open group's records */
    uint32_t npending, cap_pending;
    uint64_t open_group;  /* the group records join now */
    uint64_t committed;   /* every group up to this one is durable (or written) */
    int j_busy;           /* group writes in flight (up to J_SLOTS; 1 with the cache off) */
    struct jslot {
        uint8_t *buf;
        uint64_t bytes;
        uint64_t group;
        int busy;
    } js[J_SLOTS];
    uint64_t last_taken;  /* the last group handed out for writing */
    uint64_t j_prev_hash; /* the hash of the last journal block built */
    uint8_t *scratch;     /* block-aligned, for synchronous I/O */
    uint64_t scratch_bytes;
    int failed;           /* a journal write failed: changes are refused */
    /* early puts (st_put_record): recorded, value not yet written; what they will take of
     * the index; and early puts whose value write failed, until the next checkpoint (their
     * extents stay taken: their records may be replayed, and open checks their values) */
    st_put_plan **early;
    uint32_t nearly, cap_early;
    uint64_t early_new_keys, early_entries;
    struct unsure {
        uint32_t put_idx;
        uint64_t rec_seq;
        uint32_t ext;
    } *unsure;
    uint32_t nunsure, cap_unsure;
    sde_store_info stats;
};

static __thread char last_error[256];

const char *sde_store_last_error(void) { return last_error; }

static int fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return err;
}

uint64_t sde_hash_avx2(const void *data, uint64_t len); /* c/sde_hash_avx2.c */

uint64_t st_value_hash(const void *data, uint64_t len)
{
    static int avx2 = -1;
    if (avx2 < 0)
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    return avx2 ? sde_hash_avx2(data, len) : XXH3_64bits(data, len);
}

static uint64_t roundup(uint64_t n, uint64_t b) { return (n + b - 1) / b * b; }

/* ---- synchronous I/O --------------------------------------------------------------- */

static int pio(int fd, int write, void *buf, uint64_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = write ? pwrite(fd, p, len, (off_t)off) : pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EIO;
        p += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

static void *aligned(uint64_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? roundup(bytes, 4096) : 4096))
        return NULL;
    return p;
}

static uint8_t *scratch(sde_store *st, uint64_t bytes)
{
    if (bytes > st->scratch_bytes) {
        uint8_t *n = aligned(bytes);
        if (!n)
            return NULL;
        free(st->scratch);
        st->scratch = n;
        st->scratch_bytes = roundup(bytes, 4096);
    }
    return st->scratch;
}

/* ---- the index --------------------------------------------------------------------- */

static uint64_t key_hash(uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint8_t k[24] = {0};
    memcpy(k, &nsid, 4);
    k[4] = (uint8_t)klen;
    memcpy(k + 8, key, klen);
    return XXH3_64bits(k, sizeof(k));
}

static uint32_t ent_find(const sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
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

static uint32_t ent_insert(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
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

static void ent_remove(sde_store *st, uint32_t i)
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

/* ---- extents and the block bitmap -------------------------------------------------- */

static int bit(const sde_store *st, uint64_t b) { return (st->bitmap[b >> 6] >> (b & 63)) & 1; }

static void set_bits(sde_store *st, uint64_t b, uint64_t n, int v)
{
    for (uint64_t i = b; i < b + n; i++) {
        if (v)
            st->bitmap[i >> 6] |= 1ull << (i & 63);
        else
            st->bitmap[i >> 6] &= ~(1ull << (i & 63));
    }
    if (v)
        st->free_blocks -= n;
    else
        st->free_blocks += n;
}

/* First fit from the lowest block that may be free (st->cursor): space a delete frees is
 * reused before untouched space, so a file or tmpfs media stays as small as the live set
 * (a next-fit cursor walked the whole region, allocating every page of a sparse file).
 * Returns the first block or UINT64_MAX. */
static uint64_t alloc_blocks(sde_store *st, uint64_t n)
{
    if (!n || n > st->free_blocks)
        return UINT64_MAX;
    uint64_t b = st->cursor, end = st->nbits, run = 0, start = b;
    int moved = 0; /* the first free block seen so far lies past the cursor */
    while (b < end) {
        if (!(b & 63) && b + 64 <= end) {
            uint64_t w = st->bitmap[b >> 6];
            if (w == UINT64_MAX) { /* 64 used blocks: skip them */
                if (!moved)
                    st->cursor = b + 64;
                run = 0;
                b += 64;
                start = b;
                continue;
            }
            if (w == 0 && run + 64 < n) {
                if (!run)
                    start = b;
                run += 64;
                b += 64;
                moved = 1;
                continue;
            }
        }
        if (bit(st, b)) {
            if (!moved)
                st->cursor = b + 1;
            run = 0;
            start = b + 1;
        } else {
            moved = 1;
            if (++run == n) {
                set_bits(st, start, n, 1);
                if (st->cursor == start)
                    st->cursor = start + n;
                return start;
            }
        }
        b++;
    }
    return UINT64_MAX;
}

void sde_store_on_free(sde_store *st, void (*fn)(void *ctx, uint64_t off, uint64_t nbytes),
                       void *ctx)
{
    st->on_free = fn;
    st->on_free_ctx = ctx;
}

static void free_blocks_at(sde_store *st, uint64_t b, uint64_t n)
{
    set_bits(st, b, n, 0);
    if (st->on_free)
        st->on_free(st->on_free_ctx, st->sb.d_off + b * st->block, n * st->block);
    if (b < st->cursor)
        st->cursor = b;
}

static uint32_t ext_new(sde_store *st)
{
    if (st->ext_free == NIL) {
        uint32_t cap = st->next_cap ? st->next_cap * 2 : 1024;
        struct ext *n = realloc(st->exts, (uint64_t)cap * sizeof(*n));
        if (!n)
            return NIL;
        st->exts = n;
        for (uint32_t i = cap; i-- > st->next_cap;) {
            n[i].live = 0;
            n[i].hnext = st->ext_free;
            st->ext_free = i;
        }
        st->next_cap = cap;
    }
    uint32_t i = st->ext_free;
    st->ext_free = st->exts[i].hnext;
    memset(&st->exts[i], 0, sizeof(struct ext));
    st->exts[i].live = 1;
    st->exts[i].hnext = NIL;
    return i;
}

#define MAX_PIECES 256 /* a value in more pieces than this is refused (CAPACITY_EXCEEDED) */

static uint32_t ext_npieces(const struct ext *e) { return e->npieces > 1 ? e->npieces : 1; }

static struct piece ext_piece(const struct ext *e, uint32_t i)
{
    return e->npieces > 1 ? e->pieces[i] : (struct piece){e->off, e->nbytes};
}

/* Checkpoint entries a key naming this extent takes: its own, and one per piece. */
static uint64_t ext_entries(const struct ext *e) { return e->npieces > 1 ? 1 + e->npieces : 1; }

static void free_pieces(sde_store *st, const struct piece *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        free_blocks_at(st, (p[i].off - st->sb.d_off) / st->block, p[i].nbytes / st->block);
}

/* nb blocks in free runs from the lowest free block, when no run holds them whole: 0 and
 * the pieces (at most MAX_PIECES), or -1 with nothing taken. */
static int alloc_pieces(sde_store *st, uint64_t nb, struct piece *out, uint32_t *n)
{
    uint64_t b = st->cursor, got = 0;
    *n = 0;
    while (got < nb && b < st->nbits && *n < MAX_PIECES) {
        if (!(b & 63) && b + 64 <= st->nbits && st->bitmap[b >> 6] == UINT64_MAX) {
            b += 64;
            continue;
        }
        if (bit(st, b)) {
            b++;
            continue;
        }
        uint64_t start = b, run = 0;
        while (b < st->nbits && !bit(st, b) && got + run < nb) {
            b++;
            run++;
        }
        set_bits(st, start, run, 1);
        out[(*n)++] = (struct piece){st->sb.d_off + start * st->block, run * st->block};
        got += run;
    }
    if (got < nb) {
        free_pieces(st, out, *n);
        *n = 0;
        return -1;
    }
    return 0;
}

/* An extent for len value bytes: one free run, or, when none holds it, several pieces (a
 * long-lived store fragments; a large value must not fail while the space is there).  NIL
 * when the data region has no room. */
static uint32_t ext_alloc(sde_store *st, uint64_t len, uint64_t hash)
{
    uint64_t nb = roundup(len, st->block) / st->block;
    uint64_t b = alloc_blocks(st, nb);
    struct piece *pcs = NULL;
    uint32_t np = 0;
    if (b == UINT64_MAX) {
        if (nb > st->free_blocks || !(pcs = malloc(MAX_PIECES * sizeof(*pcs))))
            return NIL;
        if (alloc_pieces(st, nb, pcs, &np)) {
            free(pcs);
            return NIL;
        }
        struct piece *fit = realloc(pcs, np * sizeof(*pcs));
        pcs = fit ? fit : pcs;
    }
    uint32_t x = ext_new(st);
    if (x == NIL) {
        if (pcs)
            free_pieces(st, pcs, np);
        else
            free_blocks_at(st, b, nb);
        free(pcs);
        return NIL;
    }
    struct ext *e = &st->exts[x];
    e->off = pcs ? pcs[0].off : st->sb.d_off + b * st->block;
    e->nbytes = nb * st->block;
    e->pieces = pcs;
    e->npieces = np;
    e->len = len;
    e->hash = hash;
    st->physical += e->nbytes;
    return x;
}

static void dd_add(sde_store *st, uint32_t x)
{
    struct ext *e = &st->exts[x];
    uint64_t b = e->hash & st->dd_mask;
    e->hnext = st->dd_heads[b];
    st->dd_heads[b] = x;
    e->in_dedup = 1;
}

static void dd_remove(sde_store *st, uint32_t x)
{
    struct ext *e = &st->exts[x];
    if (!e->in_dedup)
        return;
    uint32_t *p = &st->dd_heads[e->hash & st->dd_mask];
    while (*p != x)
        p = &st->exts[*p].hnext;
    *p = e->hnext;
    e->hnext = NIL;
    e->in_dedup = 0;
}

static void drop_pieces(struct ext *e)
{
    free(e->pieces);
    e->pieces = NULL;
    e->npieces = 0;
}

static void ext_free_now(sde_store *st, uint32_t x)
{
    struct ext *e = &st->exts[x];
    dd_remove(st, x);
    for (uint32_t i = 0; i < ext_npieces(e); i++) {
        struct piece pc = ext_piece(e, i);
        free_blocks_at(st, (pc.off - st->sb.d_off) / st->block, pc.nbytes / st->block);
    }
    drop_pieces(e);
    st->physical -= e->nbytes;
    e->live = 0;
    e->hnext = st->ext_free;
    st->ext_free = x;
}

/* The extent lost its last entry in the open group: free it once that group is committed
 * and no retrieve reads it. */
static void ext_unref(sde_store *st, uint32_t x)
{
    struct ext *e = &st->exts[x];
    if (--e->krefs)
        return;
    dd_remove(st, x);
    e->zombie = 1;
    e->release = st->open_group;
    if (st->nzombies == st->cap_zombies) {
        uint32_t cap = st->cap_zombies ? 2 * st->cap_zombies : 256;
        uint32_t *n = realloc(st->zombies, cap * sizeof(*n));
        if (!n) { /* cannot track it: leak its space until the next open rather than risk */
            return;
        }
        st->zombies = n;
        st->cap_zombies = cap;
    }
    st->zombies[st->nzombies++] = x;
}

static void reap_zombies(sde_store *st)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < st->nzombies; i++) {
        uint32_t x = st->zombies[i];
        struct ext *e = &st->exts[x];
        if (e->krefs) { /* named again (replay of an older state): alive */
            e->zombie = 0;
            continue;
        }
        if (e->release <= st->committed && !e->rrefs) {
            e->zombie = 0;
            ext_free_now(st, x);
        } else {
            st->zombies[k++] = x;
        }
    }
    st->nzombies = k;
}

/* ---- namespaces -------------------------------------------------------------------- */

/* Namespace 0 (the shared default for keys) always exists. */
static int ns_present(const sde_store *st, uint32_t nsid)
{
    return nsid == 0 || (nsid <= SDE_STORE_MAX_NS && (st->ns[nsid].flags & SDE_NS_USED));
}

int sde_store_ns_get(const sde_store *st, uint32_t nsid, sde_ns_info *out)
{
    if (nsid < 1 || !ns_present(st, nsid))
        return -ENOENT;
    *out = st->ns[nsid];
    return 0;
}

/* ---- records: the one place state changes (live, at replay, at checkpoint load) ----- */

/* Point key at an extent holding (off, len, hash); during load the extent is found by
 * offset in `by_off` (open addressing over extent ids, size mask+1). */
static int apply_put_ext(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                         uint32_t x)
{
    uint32_t i = ent_find(st, nsid, key, klen);
    if (i == NIL) {
        i = ent_insert(st, nsid, key, klen);
        if (i == NIL)
            return SDE_SC_CAPACITY_EXCEEDED;
    } else {
        struct ext *old = &st->exts[st->ents[i].ext];
        st->logical -= old->len;
        st->entries -= ext_entries(old);
        ext_unref(st, st->ents[i].ext);
    }
    st->ents[i].ext = x;
    struct ext *e = &st->exts[x];
    st->entries += ext_entries(e);
    if (e->krefs++ == 0) {
        e->zombie = 0;
        dd_add(st, x);
    }
    st->logical += e->len;
    return SDE_SC_SUCCESS;
}

static int apply_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    uint32_t i = ent_find(st, nsid, key, klen);
    if (i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    st->logical -= st->exts[st->ents[i].ext].len;
    st->entries -= ext_entries(&st->exts[st->ents[i].ext]);
    ext_unref(st, st->ents[i].ext);
    ent_remove(st, i);
    return SDE_SC_SUCCESS;
}

/* A namespace goes, and every key in it (the one place, live and at replay). */
static void ns_drop(sde_store *st, uint32_t nsid)
{
    for (uint64_t b = 0; b <= st->ent_mask; b++) {
        uint32_t i = st->ent_heads[b];
        while (i != NIL) {
            uint32_t next = st->ents[i].hnext;
            if (st->ents[i].nsid == nsid) {
                st->ents[i].pins = 0;
                apply_delete(st, nsid, st->ents[i].key, st->ents[i].klen);
            }
            i = next;
        }
    }
    memset(&st->ns[nsid], 0, sizeof(st->ns[nsid]));
}

struct offmap {
    uint32_t *slot;
    uint64_t mask;
};

/* (Re)describe an extent read at load: its value and, for a value in pieces, the pieces
 * (np > 1; copied).  -ENOMEM, or 0. */
static int set_extent(sde_store *st, struct ext *e, uint64_t len, uint64_t hash,
                      const struct rec *pcs, uint32_t np)
{
    drop_pieces(e);
    e->len = len;
    e->hash = hash;
    e->nbytes = roundup(len, st->block);
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
                             ext_npieces(e) != (np > 1 ? np : 1)))
                return NIL - 1; /* two live values at one place: not a journal we wrote */
            if (!e->krefs && set_extent(st, e, len, hash, pcs, np))
                return NIL; /* its bytes were freed and the place reused: a new value */
            return m->slot[h];
        }
        h = (h + 1) & m->mask;
    }
    uint32_t x = ext_new(st);
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
    return len && len <= st->sb.max_value && valid_place(st, off, roundup(len, st->block));
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
    return st->ld_pieces[0].off == r->off && total == roundup(r->len, st->block);
}

/* One record at load time.  0 applied, <0: the record is not one this format writes. */
static int value_on_media(sde_store *st, uint32_t x);
static int ext_pio(sde_store *st, const struct ext *e, int write, uint8_t *buf);

/* verify: the record may name a value whose write had not ended (an early put's, the block
 * at or past its header's `unsure`): applied only if the media holds the value's bytes. */
static int load_record(sde_store *st, struct offmap *m, const struct rec *r, int verify)
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
            int on = value_on_media(st, x);
            if (on < 0)
                return on;
            if (!on) { /* never written: the put was not acknowledged; its extent is free */
                st->stats.unwritten_records_skipped++;
                return 0;
            }
        }
        return apply_put_ext(st, r->nsid, r->key, r->klen, x) ? -ENOSPC : 0;
    }
    if (r->op == OP_DELETE) {
        if (!r->klen || r->klen > SDE_KEY_MAX)
            return -1;
        apply_delete(st, r->nsid, r->key, r->klen);
        return 0;
    }
    if (r->op == OP_NS_CREATE || r->op == OP_NS_DELETE) {
        if (r->nsid < 1 || r->nsid > SDE_STORE_MAX_NS)
            return -1;
        if (r->op == OP_NS_DELETE) {
            ns_drop(st, r->nsid);
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

/* ---- the journal ------------------------------------------------------------------- */

static uint32_t recs_per_block(const sde_store *st) { return (st->block - JHDR_BYTES) / REC_BYTES; }

static int append(sde_store *st, const struct rec *r)
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
    uint32_t rpb = recs_per_block(st);
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
    uint32_t rpb = recs_per_block(st);
    uint64_t nblk = (st->npending + rpb - 1) / rpb;
    uint64_t unsure = unsure_from(st, first_seq);
    uint64_t bytes = nblk * st->block;
    if (bytes > j->bytes) {
        uint8_t *n = aligned(bytes);
        if (!n)
            return 0;
        free(j->buf);
        j->buf = n;
        j->bytes = roundup(bytes, 4096);
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

static int write_checkpoint(sde_store *st);
static void early_after_checkpoint(sde_store *st);

/* Blocks the open group needs. */
static uint64_t pending_blocks(const sde_store *st)
{
    uint32_t rpb = recs_per_block(st);
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
        int r = write_checkpoint(st);
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
    reap_zombies(st);
}

uint64_t st_committed_group(const sde_store *st) { return st->committed; }
int st_journal_busy(const sde_store *st) { return st->j_busy; }
int st_durable(const sde_store *st) { return st->durable; }

uint64_t st_checkpoints(const sde_store *st) { return st->stats.checkpoints; }
uint32_t st_block(const sde_store *st) { return st->block; }
uint64_t st_max_value(const sde_store *st) { return st->sb.max_value; }

/* Commit the open group now, with pwrite (synchronous callers; no write in flight). */
static int commit_sync(sde_store *st)
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
        reap_zombies(st);
        return 0;
    }
    if (r <= 0)
        return r;
    r = pio(st->fd, 1, buf, len, off);
    if (!r && st->durable && fdatasync(st->fd) < 0)
        r = -errno;
    st_journal_written(st, group, r == 0);
    return r;
}

/* ---- checkpoints ------------------------------------------------------------------- */

static uint64_t hdr_off(const sde_store *st, uint64_t gen) { return st->sb.ckpt_off + (gen & 1) * CKPT_HDR_BYTES; }

static uint64_t slot_off(const sde_store *st, uint64_t gen)
{
    return st->sb.ckpt_off + 2 * CKPT_HDR_BYTES + (gen & 1) * st->sb.slot_bytes;
}

/* Write the live index and namespaces to the other slot, then its header; the journal
 * restarts after it.  Everything appended so far (the open group too) is then durable. */
static int write_checkpoint(sde_store *st)
{
    uint64_t gen = st->ckpt_gen + 1;
    uint64_t bytes = roundup(st->entries * ENTRY_BYTES, st->block);
    uint8_t *buf = aligned(bytes);
    if (!buf)
        return -ENOMEM;
    struct rec *out = (struct rec *)buf;
    uint64_t n = 0;
    memset(buf, 0, bytes);
    for (uint64_t b = 0; b <= st->ent_mask; b++) {
        for (uint32_t i = st->ent_heads[b]; i != NIL; i = st->ents[i].hnext) {
            const struct ent *e = &st->ents[i];
            const struct ext *x = &st->exts[e->ext];
            for (uint32_t k = 0; x->npieces > 1 && k < x->npieces; k++) {
                struct rec *q = &out[n++]; /* a value in pieces: the pieces first */
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
    int ret = 0;
    if (bytes)
        ret = pio(st->fd, 1, buf, bytes, slot_off(st, gen));
    uint64_t slot_hash = XXH3_64bits(buf, n * ENTRY_BYTES);
    free(buf);
    if (!ret && fdatasync(st->fd) < 0)
        ret = -errno;
    if (ret)
        return ret;
    uint8_t *hb = scratch(st, CKPT_HDR_BYTES);
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
    ret = pio(st->fd, 1, hb, CKPT_HDR_BYTES, hdr_off(st, gen));
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
    early_after_checkpoint(st);
    reap_zombies(st);
    return 0;
}

int sde_store_checkpoint(sde_store *st)
{
    if (st->j_busy)
        return -EBUSY;
    int r = write_checkpoint(st);
    if (!r)
        reap_zombies(st);
    return r;
}

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
#define STORE_MIN_UNIT 4096u

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
    uint8_t *b = aligned(SB_BYTES);
    if (!b)
        return -ENOMEM;
    int r = pio(fd, 0, b, SB_BYTES, 0);
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
    sb->slot_bytes = roundup(keys * ENTRY_BYTES, 4096);
    sb->j_off = sb->ckpt_off + 2 * CKPT_HDR_BYTES + 2 * sb->slot_bytes;
    sb->d_off = roundup(sb->j_off + sb->j_blocks * st->block, 4096);
    if (media_size <= sb->d_off || (media_size - sb->d_off) / st->block < 1) {
        sde_store_free(st);
        return fail(-ENOSPC, "media of %llu bytes is too small for a store of %llu keys",
                    (unsigned long long)media_size, (unsigned long long)keys);
    }
    sb->d_len = (media_size - sb->d_off) / st->block * st->block;
    int r = alloc_tables(st);
    uint8_t *buf = r ? NULL : aligned(SB_BYTES + 2 * CKPT_HDR_BYTES);
    if (!buf) {
        sde_store_free(st);
        return -ENOMEM;
    }
    /* both checkpoint headers invalid, a first journal block that is not one */
    memset(buf, 0, SB_BYTES + 2 * CKPT_HDR_BYTES);
    r = pio(fd, 1, buf + SB_BYTES, 2 * CKPT_HDR_BYTES, sb->ckpt_off);
    if (!r)
        r = pio(fd, 1, buf, st->block, sb->j_off);
    st->ckpt_gen = 0;
    st->j_start = st->j_next = 1;
    if (!r)
        r = write_checkpoint(st); /* generation 1: empty */
    if (!r) {
        sb->hash = XXH3_64bits(sb, offsetof(struct sb, hash));
        memset(buf, 0, SB_BYTES);
        memcpy(buf, sb, sizeof(*sb));
        r = pio(fd, 1, buf, SB_BYTES, 0);
        if (!r && fdatasync(fd) < 0)
            r = -errno;
    }
    free(buf);
    if (r) {
        sde_store_free(st);
        return fail(r, "cannot format the media: %s", strerror(-r));
    }
    *out = st;
    return 0;
}

static int read_header(sde_store *st, uint64_t which, struct ckpt_hdr *h)
{
    uint8_t *b = scratch(st, CKPT_HDR_BYTES);
    if (!b || pio(st->fd, 0, b, CKPT_HDR_BYTES, st->sb.ckpt_off + which * CKPT_HDR_BYTES))
        return 0;
    memcpy(h, b, sizeof(*h));
    return h->magic == CKPT_MAGIC && h->hash == XXH3_64bits(h, offsetof(struct ckpt_hdr, hash));
}

/* Load a checkpoint's entries; 0, or <0 when its slot does not hold what its header says. */
static int load_checkpoint(sde_store *st, const struct ckpt_hdr *h, struct offmap *m)
{
    uint64_t bytes = roundup(h->nentries * ENTRY_BYTES, st->block);
    if (h->nentries > st->sb.index_keys)
        return -EINVAL;
    uint8_t *buf = aligned(bytes);
    if (!buf)
        return -ENOMEM;
    int r = bytes ? pio(st->fd, 0, buf, bytes, slot_off(st, h->gen)) : 0;
    if (!r && XXH3_64bits(buf, h->nentries * ENTRY_BYTES) != h->slot_hash)
        r = -EINVAL;
    const struct rec *e = (const struct rec *)buf;
    for (uint64_t i = 0; !r && i < h->nentries; i++)
        r = load_record(st, m, &e[i], 0) < 0 ? -EINVAL : 0;
    free(buf);
    st->stats.loaded_entries = h->nentries;
    return r;
}

/* Read the journal's block i into blk: whether it is the valid next one. */
static int journal_block(sde_store *st, uint8_t *blk, uint64_t i)
{
    if (pio(st->fd, 0, blk, st->block, st->sb.j_off + i * st->block))
        return 0;
    struct jhdr *jh = (struct jhdr *)blk;
    uint64_t want = jh->hash;
    jh->hash = 0;
    if ((jh->magic != JBLK_MAGIC && jh->magic != JBLK_MAGIC3) || jh->seq != st->j_start + i ||
        jh->nrec > recs_per_block(st) || XXH3_64bits(blk, st->block) != want)
        return 0;
    /* a chained block must follow the one before it (i 0: the first of the lap) */
    if (jh->magic == JBLK_MAGIC3 && jh->prev != (i ? st->j_prev_hash : 0))
        return 0;
    st->j_prev_hash = want;
    return 1;
}

/* Whether the media holds extent x's value (its hash): 1, 0, or -EIO. */
static int value_on_media(sde_store *st, uint32_t x)
{
    const struct ext *e = &st->exts[x];
    uint8_t *buf = aligned(e->nbytes);
    if (!buf)
        return -ENOMEM;
    int r = ext_pio(st, e, 0, buf) ? -EIO : st_value_hash(buf, e->len) == e->hash;
    free(buf);
    return r;
}

int sde_store_open(int fd, uint64_t media_size, uint32_t lba, const sde_store_params *p,
                   sde_store **out)
{
    uint32_t version = 0;
    int pr = sde_store_probe(fd, &version);
    if (pr < 0)
        return fail(pr, "cannot read the media: %s", strerror(-pr));
    if (pr == SDE_PROBE_BLANK)
        return fail(-ENODATA, "the media is blank: format it (ssdemu format)");
    if (pr == SDE_PROBE_FOREIGN)
        return fail(-EINVAL, "the media holds something that is not an ssdemu device");
    if (pr == SDE_PROBE_OLD_VERSION)
        return fail(-EPROTO, "the media holds store format v%u, which this ssdemu no longer "
                    "reads: reformat it with 'ssdemu format' (its contents are lost)", version);
    if (pr == SDE_PROBE_NEWER_VERSION)
        return fail(-EPROTO, "the media has store format v%u; this ssdemu reads v%u",
                    version, SDE_STORE_VERSION);
    sde_store *st = store_new(fd, lba, 0, p->durable); /* its unit: the superblock's */
    if (!st)
        return -ENOMEM;
    int r = 0;
    uint8_t *b = aligned(SB_BYTES);
    if (!b || pio(fd, 0, b, SB_BYTES, 0))
        r = fail(-EIO, "cannot read the superblock");
    if (!r) {
        memcpy(&st->sb, b, sizeof(st->sb));
        struct sb *sb = &st->sb;
        if (sb->hash != XXH3_64bits(sb, offsetof(struct sb, hash)))
            r = fail(-EINVAL, "the superblock's checksum does not match");
        else if (sb->block < lba || sb->block % lba || (sb->block & (sb->block - 1)) ||
                 sb->media_bytes != media_size)
            /* shrunk, it lost data; grown (a file enlarged after format), it is not the
             * device that was formatted, or it was changed behind the store's back */
            r = fail(-EINVAL, "the device was formatted for other media (%u-byte units, %llu "
                     "bytes; the media has %u-byte blocks, %llu bytes): restore its size, or "
                     "run ssdemu format to start over", sb->block,
                     (unsigned long long)sb->media_bytes, lba,
                     (unsigned long long)media_size);
        else if (sb->d_off + sb->d_len > media_size || sb->index_keys == 0 ||
                 sb->j_blocks == 0)
            r = fail(-EINVAL, "the superblock's regions do not fit the media");
        else
            st->block = sb->block;
    }
    free(b);
    if (!r)
        r = alloc_tables(st);
    struct ckpt_hdr ha, hb, *h = NULL;
    if (!r) {
        int va = read_header(st, 0, &ha), vb = read_header(st, 1, &hb);
        h = va && (!vb || ha.gen > hb.gen) ? &ha : vb ? &hb : NULL;
        if (!h)
            r = fail(-EINVAL, "no valid checkpoint on the media");
    }
    struct offmap m = {0};
    if (!r) {
        uint64_t n = 1;
        while (n < 2 * st->sb.index_keys + 2)
            n <<= 1;
        m.slot = malloc(n * sizeof(uint32_t));
        m.mask = n - 1;
        if (!m.slot)
            r = -ENOMEM;
        else
            memset(m.slot, 0xff, n * sizeof(uint32_t));
    }
    if (!r) {
        /* owners written with the header, or none (a header from before they were kept:
         * a namespace with bytes is shared) */
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
        if (load_checkpoint(st, h, &m) < 0) {
            /* its slot was written and synced before its header: this is corruption */
            sde_store_free(st);
            free(m.slot);
            return fail(-EINVAL, "the checkpoint's slot does not match its header");
        }
        st->ckpt_gen = h->gen;
        st->j_start = st->j_next = h->j_start;
    }
    /* the journal after the checkpoint, up to the first block that is not the next one:
     * first how far it goes and what its last block calls unsure, then its records */
    uint8_t *blk = r ? NULL : aligned(st->block);
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
            bad = load_record(st, &m, &rr[k], verify);
            st->stats.replayed_records++;
        }
        if (bad == -ENOMEM || bad == -ENOSPC) {
            r = fail(bad, "the index cannot hold the journal's keys");
            break;
        }
        if (bad == -EIO) {
            r = fail(bad, "cannot read a value the journal names");
            break;
        }
        st->j_next = st->j_start + i + 1;
    }
    free(blk);
    st->ld_n = 0; /* pieces after the last OP_PUT: a put the crash cut short */
    free(m.slot);
    if (!r) {
        /* mark what live extents and namespaces occupy; the rest (orphans too) is free */
        for (uint32_t x = 0; x < st->next_cap; x++) {
            struct ext *e = &st->exts[x];
            if (!e->live)
                continue;
            if (!e->krefs) { /* named only by records that a later one replaced */
                drop_pieces(e);
                e->live = 0;
                e->hnext = st->ext_free;
                st->ext_free = x;
                continue;
            }
            for (uint32_t i = 0; !r && i < ext_npieces(e); i++) {
                struct piece pc = ext_piece(e, i);
                uint64_t b0 = (pc.off - st->sb.d_off) / st->block, nb = pc.nbytes / st->block;
                for (uint64_t k = b0; k < b0 + nb; k++)
                    if (bit(st, k)) {
                        r = fail(-EINVAL, "two live extents overlap at %llu",
                                 (unsigned long long)pc.off);
                        break;
                    }
                if (!r)
                    set_bits(st, b0, nb, 1);
            }
            if (r)
                break;
            st->physical += e->nbytes;
        }
        st->nzombies = 0;
        for (uint32_t n = 1; !r && n <= SDE_STORE_MAX_NS; n++) {
            const sde_ns_info *ns = &st->ns[n];
            if (!ns->bytes)
                continue;
            if (ns->offset < st->sb.d_off || ns->offset % st->block || ns->bytes % st->lba ||
                ns->offset + roundup(ns->bytes, st->block) > st->sb.d_off + st->sb.d_len) {
                r = fail(-EINVAL, "namespace %u does not fit the data region", n);
                break;
            }
            set_bits(st, (ns->offset - st->sb.d_off) / st->block,
                     roundup(ns->bytes, st->block) / st->block, 1);
        }
    }
    /* a record skipped as never written must not be replayed again unchecked (later blocks
     * call nothing unsure): a checkpoint ends the journal it is in */
    if (!r && st->stats.unwritten_records_skipped)
        r = write_checkpoint(st);
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
}

/* ---- KV operations ----------------------------------------------------------------- */

static int key_ok(uint32_t klen) { return klen >= 1 && klen <= SDE_KEY_MAX; }

/* Whether the index (its checkpoint slot: index_keys entries) can take key i (NIL: a new
 * key) naming extent x: a value in pieces takes an entry per piece too. */
static int entries_fit(const sde_store *st, uint32_t i, uint32_t x)
{
    /* early puts not yet applied hold their room */
    uint64_t need = st->entries + st->early_entries + ext_entries(&st->exts[x]);
    if (i != NIL)
        need -= ext_entries(&st->exts[st->ents[i].ext]);
    return need <= st->sb.index_keys;
}

/* Compare len bytes of the extent with value (a hash matched). */
static int same_bytes(sde_store *st, const struct ext *e, const void *value, uint64_t len)
{
    const uint64_t chunk = 1 << 20;
    uint8_t *buf = scratch(st, chunk);
    if (!buf)
        return 0;
    uint64_t at = 0; /* the value's offset of this piece */
    for (uint32_t k = 0; k < ext_npieces(e) && at < len; k++) {
        struct piece pc = ext_piece(e, k);
        uint64_t in_piece = len - at < pc.nbytes ? len - at : pc.nbytes;
        for (uint64_t done = 0; done < in_piece; done += chunk) {
            uint64_t n = in_piece - done < chunk ? in_piece - done : chunk;
            if (pio(st->fd, 0, buf, roundup(n, st->block), pc.off + done))
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
    if (!key_ok(klen))
        return SDE_SC_KV_INVALID_KEY_SIZE;
    if (!len || len > st->sb.max_value)
        return SDE_SC_KV_INVALID_VALUE_SIZE;
    if (mode != SDE_KV_STORE_ANY && mode != SDE_KV_STORE_IF_EXISTS &&
        mode != SDE_KV_STORE_IF_NOT_EXISTS)
        return SDE_SC_INVALID_FIELD;
    if (!ns_present(st, nsid))
        return SDE_SC_INVALID_NAMESPACE;
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    memset(p, 0, sizeof(*p));
    p->nsid = nsid;
    p->ns_gen = nsid ? st->ns_gen[nsid] : 0;
    p->klen = klen;
    memcpy(p->key, key, klen);
    p->mode = mode;
    p->len = len;
    uint32_t i = ent_find(st, nsid, key, klen);
    p->existed = i != NIL;
    if (mode == SDE_KV_STORE_IF_EXISTS && i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    if (mode == SDE_KV_STORE_IF_NOT_EXISTS && i != NIL)
        return SDE_SC_KV_KEY_EXISTS;
    if (i == NIL && st->nkeys + st->early_new_keys >= st->sb.index_keys)
        return SDE_SC_CAPACITY_EXCEEDED;
    p->hash = st_value_hash(value, len);
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
    p->ext = ext_alloc(st, len, p->hash);
    if (p->ext == NIL)
        return SDE_SC_CAPACITY_EXCEEDED;
    if (!entries_fit(st, i, p->ext)) {
        ext_free_now(st, p->ext);
        return SDE_SC_CAPACITY_EXCEEDED;
    }
    p->wrote = 1;
    return SDE_SC_SUCCESS;
}

uint32_t st_ext_pieces(const sde_store *st, uint32_t ext)
{
    return ext_npieces(&st->exts[ext]);
}

void st_ext_piece(const sde_store *st, uint32_t ext, uint32_t i, uint64_t *offset,
                  uint64_t *bytes)
{
    struct piece pc = ext_piece(&st->exts[ext], i);
    *offset = pc.off;
    *bytes = pc.nbytes;
}

/* The synchronous value I/O: buf (e->nbytes, block-padded) to or from every piece. */
static int ext_pio(sde_store *st, const struct ext *e, int write, uint8_t *buf)
{
    uint64_t at = 0;
    for (uint32_t k = 0; k < ext_npieces(e); k++) {
        struct piece pc = ext_piece(e, k);
        if (pio(st->fd, write, buf + at, pc.nbytes, pc.off))
            return -EIO;
        at += pc.nbytes;
    }
    return 0;
}

void st_put_abort(sde_store *st, st_put_plan *p)
{
    if (p->wrote && !p->noop && st->exts[p->ext].live && !st->exts[p->ext].krefs)
        ext_free_now(st, p->ext);
    p->wrote = 0;
}

/* What a put must still satisfy when its record is appended (another command may have
 * changed the key while the value was written); *ip: the key's entry or NIL. */
static int put_checks(sde_store *st, const st_put_plan *p, uint32_t *ip)
{
    uint32_t i = ent_find(st, p->nsid, p->key, p->klen);
    *ip = i;
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    if (!ns_present(st, p->nsid) || (p->nsid && st->ns_gen[p->nsid] != p->ns_gen))
        return SDE_SC_INVALID_NAMESPACE; /* deleted while the value was written */
    if (p->mode == SDE_KV_STORE_IF_EXISTS && i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    if (p->mode == SDE_KV_STORE_IF_NOT_EXISTS && i != NIL)
        return SDE_SC_KV_KEY_EXISTS;
    if (i == NIL && st->nkeys + st->early_new_keys >= st->sb.index_keys)
        return SDE_SC_CAPACITY_EXCEEDED;
    if (!p->wrote && (!st->exts[p->ext].live || !st->exts[p->ext].krefs))
        return SDE_SC_ABORTED; /* the shared extent went away meanwhile: rare; retry */
    if (!entries_fit(st, i, p->ext))
        return SDE_SC_CAPACITY_EXCEEDED;
    return SDE_SC_SUCCESS;
}

/* The put's records (its pieces first, if in pieces) into the open group; on a failure
 * none of them. */
static int append_put(sde_store *st, st_put_plan *p)
{
    struct ext *e = &st->exts[p->ext];
    uint32_t had = st->npending;
    for (uint32_t k = 0; e->npieces > 1 && k < e->npieces; k++) {
        struct rec q = {.op = OP_PIECE, .klen = (uint8_t)p->klen, .nsid = p->nsid,
                        .off = e->pieces[k].off, .len = e->pieces[k].nbytes, .hash = k};
        memcpy(q.key, p->key, p->klen);
        if (append(st, &q) < 0)
            goto undo;
    }
    struct rec r = {.op = OP_PUT, .klen = (uint8_t)p->klen, .nsid = p->nsid, .off = e->off,
                    .len = e->len, .hash = e->hash,
                    .reserved2 = {e->npieces > 1 ? e->npieces : 0, 0}};
    memcpy(r.key, p->key, p->klen);
    p->put_idx = st->npending;
    if (append(st, &r) < 0)
        goto undo;
    return 0;
undo:
    st->stats.journal_records -= st->npending - had;
    st->npending = had;
    return -ENOMEM;
}

int st_put_commit(sde_store *st, st_put_plan *p, uint64_t *group)
{
    *group = 0;
    if (p->noop)
        return SDE_SC_SUCCESS;
    uint32_t i;
    int st_code = put_checks(st, p, &i);
    if (!st_code && append_put(st, p) < 0)
        st_code = SDE_SC_INTERNAL;
    if (st_code) {
        st_put_abort(st, p);
        return st_code;
    }
    p->existed = i != NIL;
    apply_put_ext(st, p->nsid, p->key, p->klen, p->ext);
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

static void early_remove(sde_store *st, st_put_plan *p)
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
    if (!code && append_put(st, p) < 0) {
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
    p->res_entries = ext_entries(&st->exts[p->ext]);
    st->early_new_keys += (uint64_t)p->new_key;
    st->early_entries += p->res_entries;
    return SDE_SC_SUCCESS;
}

int st_put_apply(sde_store *st, st_put_plan *p, uint64_t *group)
{
    early_remove(st, p);
    *group = p->group;
    int code = st->failed ? SDE_SC_MEDIA_ERROR
               : !ns_present(st, p->nsid) || (p->nsid && st->ns_gen[p->nsid] != p->ns_gen)
                   ? SDE_SC_INVALID_NAMESPACE : SDE_SC_SUCCESS;
    if (code) {
        /* its record is in the journal (before the namespace's delete): the extent is
         * reused only once a later group is committed, as a deleted value's is */
        struct ext *e = &st->exts[p->ext];
        e->krefs = 1;
        ext_unref(st, p->ext);
        return code;
    }
    if (apply_put_ext(st, p->nsid, p->key, p->klen, p->ext))
        return SDE_SC_CAPACITY_EXCEEDED; /* its room was held: cannot happen */
    return SDE_SC_SUCCESS;
}

void st_put_abort_early(sde_store *st, st_put_plan *p)
{
    early_remove(st, p);
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

/* A checkpoint restarted the journal: the early puts' records go into the new open group
 * (the checkpoint holds the index without them), and the extents of failed ones are free. */
static void early_after_checkpoint(sde_store *st)
{
    for (uint32_t k = 0; k < st->nearly; k++) {
        st_put_plan *p = st->early[k];
        p->rec_seq = 0;
        p->group = st->open_group;
        if (append_put(st, p) < 0)
            st->failed = 1; /* its record would be lost: refuse changes rather than risk */
    }
    for (uint32_t k = 0; k < st->nunsure; k++)
        ext_free_now(st, st->unsure[k].ext);
    st->nunsure = 0;
}

int st_get_begin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                 uint32_t *ext, uint64_t *offset, uint64_t *len, uint64_t *hash)
{
    if (!key_ok(klen))
        return SDE_SC_KV_INVALID_KEY_SIZE;
    if (!ns_present(st, nsid))
        return SDE_SC_INVALID_NAMESPACE;
    uint32_t i = ent_find(st, nsid, key, klen);
    if (i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
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
        reap_zombies(st);
}

int st_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
              uint64_t *group)
{
    *group = 0;
    if (!key_ok(klen))
        return SDE_SC_KV_INVALID_KEY_SIZE;
    if (!ns_present(st, nsid))
        return SDE_SC_INVALID_NAMESPACE;
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    uint32_t i = ent_find(st, nsid, key, klen);
    if (i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    if (st->ents[i].pins)
        return SDE_SC_INVALID_FIELD; /* in use by in-flight work: unpin it first */
    struct rec r = {.op = OP_DELETE, .klen = (uint8_t)klen, .nsid = nsid};
    memcpy(r.key, key, klen);
    if (append(st, &r) < 0)
        return SDE_SC_INTERNAL;
    apply_delete(st, nsid, key, klen);
    *group = st->open_group;
    return SDE_SC_SUCCESS;
}

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
        uint8_t *buf = scratch(st, e->nbytes);
        if (!buf) {
            st_put_abort(st, &p);
            return SDE_SC_INTERNAL;
        }
        memcpy(buf, value, len);
        memset(buf + len, 0, e->nbytes - len); /* nothing of older values past the end */
        if (ext_pio(st, e, 1, buf)) {
            st_put_abort(st, &p);
            return SDE_SC_MEDIA_ERROR;
        }
    }
    uint64_t group;
    int wrote = p.wrote;
    s = st_put_commit(st, &p, &group);
    if (s)
        return s;
    if (commit_sync(st) < 0)
        return SDE_SC_MEDIA_ERROR;
    res->existed = p.existed;
    res->wrote = wrote;
    if (!p.noop || p.existed) {
        uint32_t i = ent_find(st, nsid, key, klen);
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
    if (commit_sync(st) < 0)
        s = SDE_SC_MEDIA_ERROR;
    const struct ext *e = &st->exts[p.ext];
    uint8_t *buf = !s && write_value ? scratch(st, e->nbytes) : NULL;
    if (buf) {
        memcpy(buf, value, len);
        memset(buf + len, 0, e->nbytes - len);
        if (ext_pio(st, e, 1, buf))
            s = SDE_SC_MEDIA_ERROR;
    }
    /* the plan lives on this stack: an unwritten one stays unsure, as an in-flight one */
    if (write_value)
        early_remove(st, &p);
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
    uint8_t *buf = scratch(st, st->exts[x].nbytes);
    s = !buf ? SDE_SC_INTERNAL
        : ext_pio(st, &st->exts[x], 0, buf) ? SDE_SC_MEDIA_ERROR
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
    return commit_sync(st) < 0 ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
}

int sde_store_exists(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen)
{
    if (!key_ok(klen))
        return SDE_SC_KV_INVALID_KEY_SIZE;
    if (!ns_present(st, nsid))
        return SDE_SC_INVALID_NAMESPACE;
    return ent_find(st, nsid, key, klen) == NIL ? SDE_SC_KV_KEY_NOT_EXIST : SDE_SC_SUCCESS;
}

int sde_store_lookup(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                     uint64_t *offset, uint64_t *len)
{
    if (!key_ok(klen))
        return SDE_SC_KV_INVALID_KEY_SIZE;
    uint32_t i = ent_find(st, nsid, key, klen);
    if (i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    *offset = st->exts[st->ents[i].ext].off;
    *len = st->exts[st->ents[i].ext].len;
    return SDE_SC_SUCCESS;
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
    if (!key_ok(klen))
        return SDE_SC_KV_INVALID_KEY_SIZE;
    uint32_t i = ent_find(st, nsid, key, klen);
    if (i == NIL)
        return SDE_SC_KV_KEY_NOT_EXIST;
    struct ent *e = &st->ents[i];
    if (delta < 0 && !e->pins)
        return SDE_SC_INVALID_FIELD; /* not pinned */
    if (delta > 0 && e->pins == UINT16_MAX)
        return SDE_SC_CAPACITY_EXCEEDED;
    e->pins = (uint16_t)(e->pins + delta);
    *count = e->pins;
    return SDE_SC_SUCCESS;
}

uint64_t sde_store_prefix_match(sde_store *st, uint32_t nsid, const uint8_t *keys, uint64_t n)
{
    uint64_t i = 0;
    while (i < n && ent_find(st, nsid, keys + 16 * i, 16) != NIL)
        i++;
    return i;
}

int sde_store_flush(sde_store *st)
{
    int r = commit_sync(st);
    if (!r && fdatasync(st->fd) < 0)
        r = -errno;
    return r;
}

int sde_store_ns_create(sde_store *st, uint64_t bytes, uint32_t uid, uint32_t flags,
                        uint64_t token, uint32_t *nsid, uint64_t *offset)
{
    if (bytes % st->lba || flags & ~(uint32_t)SDE_NS_SHARED)
        return SDE_SC_INVALID_FIELD;
    uint64_t units = roundup(bytes, st->block) / st->block; /* whole store units */
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    uint32_t id = 0;
    for (uint32_t n = 1; n <= SDE_STORE_MAX_NS && !id; n++)
        if (!ns_present(st, n))
            id = n;
    if (!id)
        return SDE_SC_CAPACITY_EXCEEDED;
    uint64_t b = 0, off = 0;
    if (bytes) { /* bytes 0: keys only, no block range */
        b = alloc_blocks(st, units);
        if (b == UINT64_MAX)
            return SDE_SC_CAPACITY_EXCEEDED;
        off = st->sb.d_off + b * st->block;
    }
    flags |= SDE_NS_USED;
    struct rec r = {.op = OP_NS_CREATE, .nsid = id, .off = off, .len = bytes,
                    .reserved2 = {uid | (uint64_t)flags << 32, token}};
    if (append(st, &r) < 0) {
        if (bytes)
            free_blocks_at(st, b, units);
        return SDE_SC_INTERNAL;
    }
    st->ns[id] = (sde_ns_info){.offset = off, .bytes = bytes, .token = token, .uid = uid,
                               .flags = flags};
    st->ns_gen[id]++;
    if (commit_sync(st) < 0)
        return SDE_SC_MEDIA_ERROR;
    *nsid = id;
    *offset = off;
    return SDE_SC_SUCCESS;
}

int sde_store_ns_delete(sde_store *st, uint32_t nsid)
{
    if (nsid < 1 || !ns_present(st, nsid))
        return SDE_SC_INVALID_NAMESPACE;
    if (st->failed)
        return SDE_SC_MEDIA_ERROR;
    struct rec r = {.op = OP_NS_DELETE, .nsid = nsid};
    if (append(st, &r) < 0)
        return SDE_SC_INTERNAL;
    sde_ns_info ns = st->ns[nsid];
    ns_drop(st, nsid); /* its keys go with it (their extents once the record is durable) */
    int c = commit_sync(st);
    /* its blocks are reused only after the record is on the media */
    if (ns.bytes)
        free_blocks_at(st, (ns.offset - st->sb.d_off) / st->block,
                       roundup(ns.bytes, st->block) / st->block);
    return c < 0 ? SDE_SC_MEDIA_ERROR : SDE_SC_SUCCESS;
}
