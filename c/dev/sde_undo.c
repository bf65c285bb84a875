/* The undo log behind power-cut emulation (see sde_undo.h). */
#define _GNU_SOURCE
#include "sde_undo.h"
#include "sde_rand.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct undo_rec {
    uint64_t off, len;
    uint8_t *old;      /* what the write overwrote (block-aligned, for O_DIRECT) */
    const void *tag;
    uint64_t seq;
    uint64_t flush;    /* the flush that covers it (0: none yet) */
    uint8_t kind;
    uint8_t done;
};

struct sde_undo {
    int fd;
    uint32_t lba;
    struct undo_rec *recs;
    uint32_t n, cap;
    uint64_t seq, flush_ids, bytes;
};

sde_undo *sde_undo_new(int fd, uint32_t lba)
{
    sde_undo *u = calloc(1, sizeof(*u));
    if (u) {
        u->fd = fd;
        u->lba = lba;
    }
    return u;
}

static void drop(sde_undo *u, uint32_t i)
{
    u->bytes -= u->recs[i].len;
    free(u->recs[i].old);
    u->recs[i] = u->recs[--u->n]; /* order is kept by seq, not by place */
}

void sde_undo_free(sde_undo *u)
{
    if (!u)
        return;
    while (u->n)
        drop(u, u->n - 1);
    free(u->recs);
    free(u);
}

static int pio(int fd, int write, uint8_t *buf, uint64_t len, uint64_t off)
{
    while (len) {
        ssize_t r = write ? pwrite(fd, buf, len, (off_t)off) : pread(fd, buf, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : -EIO;
        buf += r;
        len -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int sde_undo_save(sde_undo *u, const void *tag, uint64_t off, uint64_t len, int kind, int done)
{
    if (!len || off % u->lba || len % u->lba)
        return -EINVAL;
    if (u->n == u->cap) {
        uint32_t cap = u->cap ? 2 * u->cap : 256;
        struct undo_rec *r = realloc(u->recs, cap * sizeof(*r));
        if (!r)
            return -ENOMEM;
        u->recs = r;
        u->cap = cap;
    }
    void *old = NULL;
    if (posix_memalign(&old, 4096, len))
        return -ENOMEM;
    int r = pio(u->fd, 0, old, len, off);
    if (r) {
        free(old);
        return r;
    }
    u->recs[u->n++] = (struct undo_rec){.off = off, .len = len, .old = old, .tag = tag,
                                         .seq = ++u->seq, .kind = (uint8_t)kind,
                                         .done = (uint8_t)done};
    u->bytes += len;
    return 0;
}

void sde_undo_done(sde_undo *u, const void *tag)
{
    /* the most recent record of that tag: an I/O struct is reused only after completing */
    struct undo_rec *best = NULL;
    for (uint32_t i = 0; i < u->n; i++)
        if (u->recs[i].tag == tag && !u->recs[i].done && (!best || u->recs[i].seq > best->seq))
            best = &u->recs[i];
    if (best)
        best->done = 1;
}

uint64_t sde_undo_flush_start(sde_undo *u)
{
    uint64_t id = ++u->flush_ids;
    for (uint32_t i = 0; i < u->n; i++)
        if (u->recs[i].done && !u->recs[i].flush)
            u->recs[i].flush = id;
    return id;
}

void sde_undo_flush_done(sde_undo *u, uint64_t id)
{
    for (uint32_t i = 0; i < u->n;)
        if (u->recs[i].flush && u->recs[i].flush <= id)
            drop(u, i);
        else
            i++;
}

void sde_undo_synced(sde_undo *u)
{
    for (uint32_t i = 0; i < u->n;)
        if (u->recs[i].done)
            drop(u, i);
        else
            i++;
}

uint64_t sde_undo_bytes(const sde_undo *u) { return u->bytes; }

static int by_seq(const void *a, const void *b)
{
    uint64_t x = ((const struct undo_rec *)a)->seq, y = ((const struct undo_rec *)b)->seq;
    return x < y ? -1 : x > y;
}

struct span {
    uint64_t lo, hi;
};

static int covered(const struct span *s, uint32_t n, uint64_t lo, uint64_t hi)
{
    for (uint32_t i = 0; i < n; i++)
        if (s[i].lo <= lo && hi <= s[i].hi)
            return 1;
    return 0;
}

int sde_undo_cut(sde_undo *u, uint64_t seed, sde_cut_result *out)
{
    memset(out, 0, sizeof(*out));
    qsort(u->recs, u->n, sizeof(*u->recs), by_seq);
    uint64_t rng = seed, nstore = 0;
    for (uint32_t i = 0; i < u->n; i++)
        nstore += u->recs[i].kind == SDE_UNDO_STORE;
    /* the store's writes: the first `keep` of them survive */
    uint64_t keep = nstore ? splitmix64(&rng) % (nstore + 1) : 0;
    uint8_t *lost = calloc(u->n ? u->n : 1, 1);
    struct span *kept = malloc((u->n ? u->n : 1) * sizeof(*kept));
    if (!lost || !kept) {
        free(lost);
        free(kept);
        return -ENOMEM;
    }
    uint64_t s = 0;
    for (uint32_t i = 0; i < u->n; i++) {
        struct undo_rec *r = &u->recs[i];
        lost[i] = r->kind == SDE_UNDO_STORE ? s++ >= keep : (splitmix64(&rng) & 1);
        if (r->kind == SDE_UNDO_STORE)
            lost[i] ? out->store_writes_lost++ : out->store_writes_kept++;
        else
            lost[i] ? out->block_writes_lost++ : out->block_writes_kept++;
    }
    /* newest first: a lost write puts back what it overwrote, block by block, except where a
     * later write that survived covers it (its bytes are what the media holds) */
    int ret = 0;
    uint32_t nkept = 0;
    for (uint32_t k = u->n; k-- > 0 && !ret;) {
        struct undo_rec *r = &u->recs[k];
        if (!lost[k]) {
            kept[nkept++] = (struct span){r->off, r->off + r->len};
            continue;
        }
        for (uint64_t b = 0; b < r->len && !ret; b += u->lba) {
            if (covered(kept, nkept, r->off + b, r->off + b + u->lba))
                continue;
            ret = pio(u->fd, 1, r->old + b, u->lba, r->off + b);
            out->bytes_restored += u->lba;
        }
    }
    free(lost);
    free(kept);
    if (!ret && fdatasync(u->fd) < 0)
        ret = -errno;
    while (u->n)
        drop(u, u->n - 1);
    return ret;
}
