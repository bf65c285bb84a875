/*
 * The drive's persistent KV store, in C: the one index of stored keys, value extents with
 * deduplication, and the on-media format v2 (superblock, two checkpoint slots, a journal
 * reclaimed at every checkpoint).  docs/architecture.md ("The on-media store") gives the
 * layout; c/store says why it is built this way.
 *
 * Two ways in:
 * - synchronous calls (sde_store_put, _get, ...) do their media I/O with pread/pwrite and
 *   commit their journal record before they return: `ssdemu format`, the tests, and the
 *   daemon's Python side (admin commands, compute commands) between sde_dev_store_enter and
 *   sde_dev_store_leave;
 * - the data plane (c/dev) runs KV commands asynchronously through the io_uring
 *   engine with the st_* calls of sde_store_internal.h: values move straight between the
 *   client's registered buffer and the media, records are group-committed.
 * Statuses are SDE_SC_* (c/wire/sde_queue.h); other failures are -errno.
 */
#ifndef SDE_STORE_H
#define SDE_STORE_H
#include <stdint.h>
#include "sde_queue.h"

/* CDEF-BEGIN */
#define SDE_STORE_VERSION 2
#define SDE_KEY_MAX 16
#define SDE_KV_STORE_ANY 0
#define SDE_KV_STORE_IF_EXISTS 1
#define SDE_KV_STORE_IF_NOT_EXISTS 2
#define SDE_STORE_MAX_NS 64
#define SDE_LIST_ENTRY 17       /* KV list: a length byte and 16 key bytes per key */

/* sde_store_probe */
#define SDE_PROBE_BLANK 0
#define SDE_PROBE_CURRENT 1
#define SDE_PROBE_OLD_VERSION 2
#define SDE_PROBE_NEWER_VERSION 3
#define SDE_PROBE_FOREIGN 4

typedef struct sde_store_params {
    uint64_t index_keys;     /* most keys the index holds (the device DRAM for its index) */
    uint64_t max_value;      /* largest value, bytes */
    uint64_t journal_blocks; /* journal length in logical blocks; 0: from the media size */
    int32_t durable;         /* every change durable before it completes (write cache off) */
    int32_t reserved;
} sde_store_params;

typedef struct sde_store_info {
    uint32_t version;
    uint32_t block;
    uint64_t media_bytes;
    uint64_t ckpt_off;
    uint64_t ckpt_slot_bytes;
    uint64_t journal_off;
    uint64_t journal_blocks;
    uint64_t data_off;
    uint64_t data_bytes;
    uint64_t index_keys;
    uint64_t max_value;
    uint64_t keys;
    uint64_t extents;
    uint64_t logical_bytes;       /* what clients stored */
    uint64_t physical_bytes;      /* the extents that hold it (identical values once) */
    uint64_t free_bytes;
    uint64_t journal_used_blocks; /* since the last checkpoint */
    uint64_t checkpoints;
    uint64_t checkpoint_gen;
    uint64_t journal_writes;      /* group commits */
    uint64_t journal_records;
    uint64_t loaded_entries;      /* at open: entries read from the checkpoint */
    uint64_t replayed_records;    /* at open: journal records applied after it */
    uint64_t dedup_hits;          /* puts that shared an extent with identical bytes */
    uint64_t unwritten_records_skipped; /* at open: early puts' records whose value was not
                                         * on the media (never acknowledged) */
    uint64_t hash_collisions;     /* content hash equal, bytes not */
    uint64_t pieced_values;       /* values in several pieces (no free run held them) */
    uint64_t index_entries;       /* checkpoint entries in use (a key, and its pieces) */
    uint64_t failed;              /* a journal write failed: sde_store_failed */
} sde_store_info;

typedef struct sde_kv_put_result {
    int32_t existed;  /* the key had a value (replaced, or identical and left) */
    int32_t wrote;    /* value bytes were written (not shared with a stored value) */
    uint64_t offset;  /* the value's extent on the media */
    uint64_t length;
} sde_kv_put_result;

/* A namespace: a byte range of the data region for block I/O (bytes 0: keys only), and
 * its owner.  Keys live in a namespace too (namespace 0: the shared default). */
/* flags: SDE_NS_USED, SDE_NS_SHARED (c/wire/sde_queue.h: NS_CREATE's param1 is wire format) */
typedef struct sde_ns_info {
    uint64_t offset;
    uint64_t bytes;
    uint64_t token;   /* the owner's token (a hash of the name a client gave; 0: none) */
    uint32_t uid;     /* the owner's uid */
    uint32_t flags;   /* SDE_NS_* */
} sde_ns_info;

typedef struct sde_store sde_store;

/* What the media holds: SDE_PROBE_*, or -errno.  *version gets the format found. */
int sde_store_probe(int fd, uint32_t *version);
int sde_store_format(int fd, uint64_t media_size, uint32_t lba, const sde_store_params *p,
                     sde_store **out);
/* 0, or -errno with sde_store_last_error() saying why in one line. */
int sde_store_open(int fd, uint64_t media_size, uint32_t lba, const sde_store_params *p,
                   sde_store **out);
const char *sde_store_last_error(void);
void sde_store_free(sde_store *st);
/* For tests: an early put (its record written with the value's write still in flight, as
 * the data plane does with the write cache on) that a crash cut short: the record is
 * committed, the value written only if write_value; the store is then freed unclosed. */
int sde_store_test_early_put(sde_store *st, const uint8_t *key, uint32_t klen,
                             const void *value, uint64_t len, int write_value);
/* Tests: an early put of key=value whose value landed and was applied while its record is
 * still in the open group (or, commit_first, written), then a put of the same bytes under
 * the same key (nothing to write).  Returns the journal group that second put is
 * acknowledged after (0: at once), or -errno. */
int64_t sde_store_test_reput_group(sde_store *st, const uint8_t *key, uint32_t klen,
                                   const void *value, uint64_t len, int commit_first);
void sde_store_get_info(const sde_store *st, sde_store_info *out);

/* Synchronous KV calls (keys are klen bytes, 1..16; nsid 0 is the shared default). */
int sde_store_put(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                  const void *value, uint64_t len, int mode, sde_kv_put_result *res);
/* *len gets the value's length also when it does not fit (KV_INVALID_VALUE_SIZE). */
int sde_store_get(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen, void *out,
                  uint64_t cap, uint64_t *len);
int sde_store_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen);
int sde_store_exists(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen);
/* Keys of nsid from `start` (klen 0: the first) in byte order, SDE_LIST_ENTRY bytes each;
 * returns how many. */
int sde_store_list(sde_store *st, uint32_t nsid, const uint8_t *start, uint32_t klen,
                   uint8_t *out, uint32_t max);
/* Where a value lies, and its content hash (what tells a value stored again on the same
 * place from the one before): 0, or a status (SDE_SC_KV_KEY_NOT_EXIST, ...). */
int sde_store_lookup(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                     uint64_t *offset, uint64_t *len, uint64_t *hash);
/* sde_store_lookup of n keys, laid end to end in keys (klens[i] bytes each): status[i] and,
 * where it is 0, offset[i], len[i] and hash[i].  One call for a retrieval command's blocks. */
void sde_store_lookup_many(sde_store *st, uint32_t nsid, const uint8_t *keys,
                           const uint32_t *klens, uint32_t n, uint64_t *offset, uint64_t *len,
                           uint64_t *hash, int32_t *status);
/* delta +1 / -1; *count gets the pins left.  A pinned key cannot be deleted. */
int sde_store_pin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen, int delta,
                  uint32_t *count);
/* The leading run of n 16-byte keys (of namespace nsid) that the store holds. */
uint64_t sde_store_prefix_match(sde_store *st, uint32_t nsid, const uint8_t *keys, uint64_t n);
/* A journal write failed: the index in memory holds changes the media does not, so the
 * store refuses reads as well as changes (MEDIA_ERROR) until it is opened again, when
 * recovery gives back exactly what was acknowledged (a drive in its failed state until a
 * power cycle). */
int sde_store_failed(const sde_store *st);
int sde_store_flush(sde_store *st);
int sde_store_checkpoint(sde_store *st);

/* Namespaces 1..SDE_STORE_MAX_NS, kept in the journal and checkpoints with their owners.
 * bytes 0: a namespace for keys only.  Deleting one deletes its keys. */
int sde_store_ns_create(sde_store *st, uint64_t bytes, uint32_t uid, uint32_t flags,
                        uint64_t token, uint32_t *nsid, uint64_t *offset);
int sde_store_ns_delete(sde_store *st, uint32_t nsid);
/* 0 and the namespace, or -ENOENT. */
int sde_store_ns_get(const sde_store *st, uint32_t nsid, sde_ns_info *out);
/* CDEF-END */
/* fn(ctx, media offset, bytes) for every range the store frees (a delete, an overwrite's old
 * value): the device trims it from its timing model's FTL.  C only. */
void sde_store_on_free(sde_store *st, void (*fn)(void *ctx, uint64_t off, uint64_t nbytes),
                       void *ctx);

#endif
