/*
 * The store's steps for the asynchronous data plane (c/sde_dev.c).  A KV store there is:
 *   st_put_begin (checks, content hash, dedup, an extent) -> the value's write through
 *   io_uring -> st_put_commit (the record joins the open journal group, the index changes)
 *   -> the group's write (st_journal_take / st_journal_written) -> the completion.
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
} st_put_plan;

/* value: the bytes (read for the content hash and, on a hash match, compared). */
int st_put_begin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                 const void *value, uint64_t len, int mode, st_put_plan *p);
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
/* A retrieve: the value's extent is held (not freed) until st_get_end. */
int st_get_begin(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
                 uint32_t *ext, uint64_t *offset, uint64_t *len, uint64_t *hash);
void st_get_end(sde_store *st, uint32_t ext);
int st_delete(sde_store *st, uint32_t nsid, const uint8_t *key, uint32_t klen,
              uint64_t *group);
uint64_t st_value_hash(const void *data, uint64_t len);

/* Group commit.  st_journal_take: 0 nothing to write (or a write is in flight); 1 write
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
