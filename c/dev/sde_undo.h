/*
 * Power-cut emulation: an undo log of the media writes a volatile write cache has not made
 * durable.  Before each write the data plane saves the bytes it will overwrite; a FLUSH (or
 * anything else that syncs the media) makes the writes that had completed before it durable
 * and drops their records; a power cut then puts back what a real cut could have lost:
 * - writes to block namespaces: each one survives or not on its own (NVMe orders nothing in
 *   a volatile cache), whole (never torn);
 * - the store's own writes (values, journal): a prefix of them in issue order survives, the
 *   rest is undone, as a drive's firmware keeps its metadata consistent (a journal record is
 *   issued only after the value it names, so no surviving record names a lost value).
 * Seeded: the same writes and seed give the same outcome.  Opt-in (`serve --power-cut`): it
 * reads before every write and keeps copies, so the zero-copy figures are measured without.
 */
#ifndef SDE_UNDO_H
#define SDE_UNDO_H
#include <stdint.h>

/* CDEF-BEGIN */
#define SDE_UNDO_BLOCK 0
#define SDE_UNDO_STORE 1

typedef struct sde_cut_result {
    uint64_t block_writes_kept;
    uint64_t block_writes_lost;
    uint64_t store_writes_kept;
    uint64_t store_writes_lost;
    uint64_t bytes_restored;
} sde_cut_result;
/* CDEF-END */

typedef struct sde_undo sde_undo;

sde_undo *sde_undo_new(int fd, uint32_t lba);
void sde_undo_free(sde_undo *u);
/* Before a write of [off, off + len) (whole logical blocks): keep what it overwrites.  tag
 * names the write for sde_undo_done; done: it has completed already (a synchronous write). */
int sde_undo_save(sde_undo *u, const void *tag, uint64_t off, uint64_t len, int kind, int done);
void sde_undo_done(sde_undo *u, const void *tag);
/* A flush is fetched: the writes completed by now are what it covers.  Returns its id. */
uint64_t sde_undo_flush_start(sde_undo *u);
/* That flush completed (the media synced): those writes are durable. */
void sde_undo_flush_done(sde_undo *u, uint64_t id);
/* Everything completed so far is durable (a synchronous sync of the media). */
void sde_undo_synced(sde_undo *u);
uint64_t sde_undo_bytes(const sde_undo *u);
/* The cut: undo what is lost (see above), sync the media. 0 or -errno. */
int sde_undo_cut(sde_undo *u, uint64_t seed, sde_cut_result *out);
#endif
