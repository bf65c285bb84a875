/*
 * The store's private header: the on-media structures, the store's state, and the functions
 * one file of c/store calls in another (sde_store.h is the public interface,
 * sde_store_internal.h what the data plane uses).  The files: store_io (synchronous I/O,
 * errors, hashing), store_index (the key index), store_alloc (extents, the block bitmap,
 * dedup), store_records (namespaces; records, the one place state changes), store_journal
 * (group commit), store_checkpoint, store_open (format, probe, open and recovery),
 * store_kv (the data plane's KV steps, early puts), store_api (the synchronous API).
 *
 */
#ifndef STORE_PRIVATE_H
#define STORE_PRIVATE_H

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

uint64_t sde_hash_avx2(const void *data, uint64_t len); /* c/store/sde_hash_avx2.c */

struct offmap {
    uint32_t *slot;
    uint64_t mask;
};

#define MAX_PIECES 256 /* a value in more pieces than this is refused (CAPACITY_EXCEEDED) */
#define STORE_MIN_UNIT 4096u

/* ---- functions shared between the files ------------------------------------------- */

/* store_io.c */
int store_fail(int err, const char *fmt, ...);
uint64_t store_roundup(uint64_t n, uint64_t b);
int store_pio(int fd, int write, void *buf, uint64_t len, uint64_t off);
void *store_aligned(uint64_t bytes);
uint8_t *store_scratch(sde_store *st, uint64_t bytes);

/* store_index.c */
uint32_t store_ent_find(const sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen);
uint32_t store_ent_insert(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen);
void store_ent_remove(sde_store *st, uint32_t i);

/* store_alloc.c */
int store_bit(const sde_store *st, uint64_t b);
void store_set_bits(sde_store *st, uint64_t b, uint64_t n, int v);
uint64_t store_alloc_blocks(sde_store *st, uint64_t n);
void store_free_blocks_at(sde_store *st, uint64_t b, uint64_t n);
uint32_t store_ext_new(sde_store *st);
uint32_t store_ext_npieces(const struct ext *e);
struct piece store_ext_piece(const struct ext *e, uint32_t i);
uint64_t store_ext_entries(const struct ext *e);
uint32_t store_ext_alloc(sde_store *st, uint64_t len, uint64_t hash);
void store_dd_add(sde_store *st, uint32_t x);
void store_drop_pieces(struct ext *e);
void store_ext_free_now(sde_store *st, uint32_t x);
void store_ext_unref(sde_store *st, uint32_t x);
void store_reap_zombies(sde_store *st);

/* store_records.c */
int store_ns_present(const sde_store *st, uint32_t nsid);
int store_apply_put_ext(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                         uint32_t x);
int store_apply_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen);
void store_ns_drop(sde_store *st, uint32_t nsid);
int store_load_record(sde_store *st, struct offmap *m, const struct rec *r, int verify);

/* store_journal.c */
uint32_t store_recs_per_block(const sde_store *st);
int store_append(sde_store *st, const struct rec *r);
int store_commit_sync(sde_store *st);

/* store_checkpoint.c */
/* the checkpoint alone; store_checkpoint_now (store_journal.c) is what callers want */
int store_write_checkpoint(sde_store *st);
int store_checkpoint_now(sde_store *st);
int store_append_put(sde_store *st, st_put_plan *p);
int store_load_checkpoint(sde_store *st, const struct ckpt_hdr *h, struct offmap *m);

/* store_open.c */
int store_value_on_media(sde_store *st, uint32_t x);

/* store_kv.c */
int store_key_ok(uint32_t klen);
int store_entry_open(const sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                     uint32_t *idx);
int store_entry_existing(const sde_store *st, uint32_t nsid, const uint8_t *key,
                         uint32_t klen, uint32_t *idx);
int store_ext_pio(sde_store *st, const struct ext *e, int write, uint8_t *buf);
void store_early_remove(sde_store *st, st_put_plan *p);
void store_early_after_checkpoint(sde_store *st);

#endif
