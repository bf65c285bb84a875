/*
 * The store's steps for the asynchronous data plane (c/dev).  A KV store there is:
 *   st_put_begin (checks, content hash, dedup, an extent) -> the value's write through
 *   io_uring -> st_put_commit (the record joins the open journal group, the index changes)
 *   -> the group's write (st_journal_take / st_journal_written) -> the completion.
 * Or, with the write cache on, the record goes out with the value ("early"):
 *   st_put_begin -> st_put_record (the record joins the open group) -> the value's write
 *   and the group's write, both in flight -> st_put_apply (the index changes) when the value
 *   is written -> the completion once its group is written too.  Until then the key is busy
 *   (st_key_busy): the caller holds back other changes of it, so that the index changes in
 *   the journal's order.  A record whose value may not be on the media is in a journal block
 *   at or past the block header's `unsure` sequence; open checks those values' hashes.
 * The caller serialises every call (the device core's lock).
 */
#ifndef SDE_STORE_INTERNAL_H
#define SDE_STORE_INTERNAL_H
#include "sde_store.h"

typedef struct st_put_plan {
    uint32_t nsid;
    uint32_t ns_gen;   /* the namespace's generation when the put began */
    uint32_t klen;
    uint8_t key[SDE_KEY_MAX];
    int mode;
    uint64_t len;
    uint64_t hash;
    uint32_t ext;    /* the extent the record will name */
    int wrote;       /* a new extent: write its bytes before st_put_commit */
    int existed;
    int noop;        /* these bytes are stored under this key already: nothing to do */
    /* early (st_put_record): the group holding its record (a checkpoint moves it), where its
     * PUT record lies in the open group, the journal block it went to (0: not built yet),
     * and what it holds of the index's room until it is applied */
    int early;
    uint64_t group;
    uint32_t put_idx;
    uint64_t rec_seq;
    int new_key;
    uint64_t res_entries;
    /* a put only if the key still holds what was read (a requantize's: st_put_expect) */
    int expect;
    uint32_t expect_ext;
    uint64_t expect_hash;
} st_put_plan;

/* What a conditional put expects the key to hold: the extent and content hash a
 * st_get_begin gave. */
typedef struct st_expect {
    uint32_t ext;
    uint64_t hash;
} st_expect;

/* A key that a command about to start will look up (its bytes: klen of them). */
typedef struct st_key_ref {
    uint32_t nsid;
    uint32_t klen;
    const uint8_t *key;
    int replaces; /* a put: the value the key holds now is to be replaced */
    /* a put whose value is read now (NULL: none): its content hash goes to *vhash, and
     * the dedup bucket it names is prefetched too (for st_put_begin_hashed) */
    const void *value;
    uint64_t vlen;
    uint64_t *vhash;
} st_key_ref;
#define ST_PREFETCH_MAX 64
/* The cache lines the lookups of up to ST_PREFETCH_MAX keys will read, prefetched step by
 * step across them (a batch's misses overlapped; nothing changes). */
void st_prefetch_keys(const sde_store *st, const st_key_ref *keys, int n);

/* value: the bytes (read for the content hash and, on a hash match, compared). */
int st_put_begin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                 const void *value, uint64_t len, int mode, st_put_plan *p);
/* The same, with the value's content hash known already (st_prefetch_keys made it; NULL:
 * not known), and only if the key still holds what *expect names (NULL: whatever it holds):
 * otherwise ABORTED, now or when the record is appended. */
int st_put_begin_hashed(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                        const void *value, uint64_t len, int mode, const uint64_t *hash,
                        const st_expect *expect, st_put_plan *p);
/* The extent's pieces (1 for a value in one run; a value no free run could hold whole is
 * in several, in value order) and each one's place and allocated bytes (whole blocks). */
uint32_t st_ext_pieces(const sde_store *st, uint32_t ext);
void st_ext_piece(const sde_store *st, uint32_t ext, uint32_t i, uint64_t *offset,
                  uint64_t *bytes);
/* Append the record and change the index; *group: the journal group to wait for.  On a
 * status other than success the plan's new extent is released. */
int st_put_commit(sde_store *st, st_put_plan *p, uint64_t *group);
/* The value write failed: release the plan's new extent. */
void st_put_abort(sde_store *st, st_put_plan *p);
/* Early: the checks, and the record into the open group, before the value is written (only
 * for a plan that writes, with the write cache on: st_early_ok).  On a status other than
 * success the plan's new extent is released and nothing was recorded. */
int st_early_ok(const sde_store *st);
int st_put_record(sde_store *st, st_put_plan *p);
/* Early, the value written: the index changes; *group: the journal group to wait for. */
int st_put_apply(sde_store *st, st_put_plan *p, uint64_t *group);
/* Early, the value's write failed: its record may be on the media, so its extent stays
 * taken until the next checkpoint (and open checks the record's value). */
void st_put_abort_early(sde_store *st, st_put_plan *p);
/* An early put of this key is recorded and not yet applied. */
int st_key_busy(const sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen);
/* A retrieve: the value's extent is held (not freed) until st_get_end. */
int st_get_begin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                 uint32_t *ext, uint64_t *offset, uint64_t *len, uint64_t *hash);
void st_get_end(sde_store *st, uint32_t ext);
int st_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
              uint64_t *group);
uint64_t st_value_hash(const void *data, uint64_t len);
/* The media's file descriptor (taken under the caller's lock, for st_read_pinned). */
int st_media_fd(const sde_store *st);
/* A retrieve's read made outside the caller's lock: the pieces of a pinned extent (st_ext_piece's
 * offset and bytes, n pairs in pc, copied under the lock: they stay where they are until
 * st_get_end) read from fd back to back into buf (block-aligned, their bytes), and its len
 * value bytes checked against hash.  SUCCESS or MEDIA_ERROR.  Touches no store state. */
int st_read_pinned(int fd, const uint64_t *pc, uint32_t n, uint8_t *buf, uint64_t len,
                   uint64_t hash);

/* Group writes in flight at once with the write cache on (with it off, one: each is synced
 * before the next). */
#define ST_JOURNAL_SLOTS 4

/* Group commit.  st_journal_take: 0 nothing to write (or every slot is in flight); 1 write
 * *len bytes from *buf at *offset, then call st_journal_written; 2 the open group was
 * committed by a checkpoint, done now.  *group: the group committed. */
int st_journal_take(sde_store *st, void **buf, uint64_t *offset, uint32_t *len,
                    uint64_t *group);
void st_journal_written(sde_store *st, uint64_t group, int ok);
uint64_t st_committed_group(const sde_store *st);
int st_journal_busy(const sde_store *st);
int st_durable(const sde_store *st);
uint32_t st_block(const sde_store *st);
uint64_t st_max_value(const sde_store *st);
uint64_t st_checkpoints(const sde_store *st);  /* how many it wrote (each syncs the media) */
#endif
