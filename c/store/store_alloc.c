/* Extents and the block bitmap: allocation in runs or pieces, dedup by content hash,
 * reference counts, extents freed once no record or retrieve needs them. */
#define _GNU_SOURCE
#include "store_private.h"

/* ---- extents and the block bitmap -------------------------------------------------- */

int store_bit(const sde_store *st, uint64_t b) { return (st->bitmap[b >> 6] >> (b & 63)) & 1; }

void store_set_bits(sde_store *st, uint64_t b, uint64_t n, int v)
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
uint64_t store_alloc_blocks(sde_store *st, uint64_t n)
{
    if (!n || n > st->free_blocks)
        return UINT64_MAX;
    uint64_t b = st->cursor, end = st->nbits, run = 0, start = b;
    int moved = 0; /* the first free block seen so far lies past the cursor */
    while (b < end) {
        if (!run) {
            /* a run's first block: the first clear bit from b, a word at a time (bit by bit,
             * the used blocks after the cursor were ~4% of a 4 KiB put's data-plane time) */
            uint64_t clear = ~st->bitmap[b >> 6] & (UINT64_MAX << (b & 63));
            uint64_t f = clear ? (b & ~63ull) + (uint64_t)__builtin_ctzll(clear) : (b | 63) + 1;
            b = start = f < end ? f : end;
            if (!moved)
                st->cursor = b; /* every block before it is used */
            if (!clear)
                continue;
            if (b == end)
                break;
        }
        if (!(b & 63) && b + 64 <= end && st->bitmap[b >> 6] == 0 && run + 64 < n) {
            run += 64; /* 64 free blocks, and the run needs more */
            b += 64;
            moved = 1;
            continue;
        }
        if (store_bit(st, b)) {
            run = 0;
            start = b + 1;
        } else {
            moved = 1;
            if (++run == n) {
                store_set_bits(st, start, n, 1);
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

void store_free_blocks_at(sde_store *st, uint64_t b, uint64_t n)
{
    store_set_bits(st, b, n, 0);
    if (st->on_free)
        st->on_free(st->on_free_ctx, st->sb.d_off + b * st->block, n * st->block);
    if (b < st->cursor)
        st->cursor = b;
}

uint32_t store_ext_new(sde_store *st)
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


uint32_t store_ext_npieces(const struct ext *e) { return e->npieces > 1 ? e->npieces : 1; }

struct piece store_ext_piece(const struct ext *e, uint32_t i)
{
    return e->npieces > 1 ? e->pieces[i] : (struct piece){e->off, e->nbytes};
}

/* Checkpoint entries a key naming this extent takes: its own, and one per piece. */
uint64_t store_ext_entries(const struct ext *e) { return e->npieces > 1 ? 1 + e->npieces : 1; }

static void free_pieces(sde_store *st, const struct piece *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        store_free_blocks_at(st, (p[i].off - st->sb.d_off) / st->block, p[i].nbytes / st->block);
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
        if (store_bit(st, b)) {
            b++;
            continue;
        }
        uint64_t start = b, run = 0;
        while (b < st->nbits && !store_bit(st, b) && got + run < nb) {
            b++;
            run++;
        }
        store_set_bits(st, start, run, 1);
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
uint32_t store_ext_alloc(sde_store *st, uint64_t len, uint64_t hash)
{
    uint64_t nb = store_roundup(len, st->block) / st->block;
    uint64_t b = store_alloc_blocks(st, nb);
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
    uint32_t x = store_ext_new(st);
    if (x == NIL) {
        if (pcs)
            free_pieces(st, pcs, np);
        else
            store_free_blocks_at(st, b, nb);
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

void store_dd_add(sde_store *st, uint32_t x)
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

void store_drop_pieces(struct ext *e)
{
    free(e->pieces);
    e->pieces = NULL;
    e->npieces = 0;
}

void store_ext_free_now(sde_store *st, uint32_t x)
{
    struct ext *e = &st->exts[x];
    dd_remove(st, x);
    for (uint32_t i = 0; i < store_ext_npieces(e); i++) {
        struct piece pc = store_ext_piece(e, i);
        store_free_blocks_at(st, (pc.off - st->sb.d_off) / st->block, pc.nbytes / st->block);
    }
    store_drop_pieces(e);
    st->physical -= e->nbytes;
    e->live = 0;
    e->hnext = st->ext_free;
    st->ext_free = x;
}

/* The extent lost its last entry in the open group: free it once that group is committed
 * and no retrieve reads it. */
void store_ext_unref(sde_store *st, uint32_t x)
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

void store_reap_zombies(sde_store *st)
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
            store_ext_free_now(st, x);
        } else {
            st->zombies[k++] = x;
        }
    }
    st->nzombies = k;
}

/* The synchronous value I/O: buf (e->nbytes, block-padded) to or from every piece. */
int store_ext_pio(sde_store *st, const struct ext *e, int write, uint8_t *buf)
{
    uint64_t at = 0;
    for (uint32_t k = 0; k < store_ext_npieces(e); k++) {
        struct piece pc = store_ext_piece(e, k);
        if (store_pio(st->fd, write, buf + at, pc.nbytes, pc.off))
            return -EIO;
        at += pc.nbytes;
    }
    return 0;
}

/* Whether the media holds extent x's value (its hash): 1, 0, or -EIO. */
int store_value_on_media(sde_store *st, uint32_t x)
{
    const struct ext *e = &st->exts[x];
    uint8_t *buf = store_aligned(e->nbytes);
    if (!buf)
        return -ENOMEM;
    int r = store_ext_pio(st, e, 0, buf) ? -EIO : st_value_hash(buf, e->len) == e->hash;
    free(buf);
    return r;
}
