/* A resource's idle gaps in chunks (sde_gaps.h). */
#include "sde_gaps.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A stage fits a gap when the gap's length from the stage's start, gap end - start, is at
 * least its duration (its end is then start + duration, clamped to the gap's end against
 * rounding).  The rule compares lengths as a chunk's longest gap does, so a chunk whose
 * longest gap is shorter than the stage is skipped exactly.  (With `start + duration <= end`
 * instead, a gap exactly as long as the stage, left by a transfer of the same size, could not
 * hold it by half an ulp, and every such gap cost a scan of its chunk.) */

static struct sde_gap_chunk *chunk_new(sde_gaps *g)
{
    return g->nspare ? g->spare[--g->nspare] : malloc(sizeof(struct sde_gap_chunk));
}

static void chunk_free(sde_gaps *g, struct sde_gap_chunk *k)
{
    if (g->nspare < SDE_GAP_SPARES)
        g->spare[g->nspare++] = k;
    else
        free(k);
}

static void tree_set(sde_gaps *g, uint32_t c)
{
    if (!g->tree)
        return;
    uint32_t i = g->tsize + c;
    g->tree[i] = g->ref[c].maxlen;
    for (i /= 2; i; i /= 2)
        g->tree[i] = g->tree[2 * i] > g->tree[2 * i + 1] ? g->tree[2 * i] : g->tree[2 * i + 1];
}

/* After chunks were inserted or removed: the tree again (O(chunks), once per 64 gaps). */
static void tree_rebuild(sde_gaps *g)
{
    uint32_t size = 1;
    while (size < g->nchunks)
        size *= 2;
    /* the tree's memory only grows: a resource's chunks come and go between one and two as
     * its gaps are appended and forgotten, and a realloc at each was a tenth of a replay
     * (and, freed on the other thread, a wait on glibc's arena lock) */
    if (size > g->tcap) {
        double *t = realloc(g->tree, 2 * size * sizeof(double));
        if (!t) {
            free(g->tree);
            g->tree = NULL; /* without it, fit scans the chunks */
            g->tsize = g->tcap = 0;
            return;
        }
        g->tree = t;
        g->tcap = size;
    }
    g->tsize = size;
    for (uint32_t i = 0; i < size; i++)
        g->tree[size + i] = i < g->nchunks ? g->ref[i].maxlen : -1.0;
    for (uint32_t i = size - 1; i; i--)
        g->tree[i] = g->tree[2 * i] > g->tree[2 * i + 1] ? g->tree[2 * i] : g->tree[2 * i + 1];
}

/* The first chunk at or after `from` whose longest gap is at least `len`, or nchunks. */
static uint32_t tree_first(const sde_gaps *g, uint32_t from, double len)
{
    if (from >= g->nchunks)
        return g->nchunks;
    if (!g->tree) {
        while (from < g->nchunks && g->ref[from].maxlen < len)
            from++;
        return from;
    }
    uint32_t i = g->tsize + from;
    if (g->tree[i] >= len)
        return from;
    /* climb until a right sibling holds one, then descend to its leftmost */
    for (;;) {
        if (i == 1)
            return g->nchunks;
        if (!(i & 1) && g->tree[i + 1] >= len) {
            i++;
            break;
        }
        i /= 2;
    }
    while (i < g->tsize)
        i = g->tree[2 * i] >= len ? 2 * i : 2 * i + 1;
    uint32_t c = i - g->tsize;
    return c < g->nchunks ? c : g->nchunks;
}

static int insert_chunk(sde_gaps *g, uint32_t at, struct sde_gap_chunk *k)
{
    if (g->nchunks == g->cap) {
        uint32_t cap = g->cap ? 2 * g->cap : 4;
        struct sde_chunk_ref *ref = realloc(g->ref, cap * sizeof(*ref));
        if (!ref)
            return -ENOMEM;
        g->ref = ref;
        g->cap = cap;
    }
    memmove(&g->ref[at + 1], &g->ref[at], (g->nchunks - at) * sizeof(*g->ref));
    g->ref[at] = (struct sde_chunk_ref){.k = k};
    g->nchunks++;
    tree_rebuild(g);
    return 0;
}

static void remove_chunks(sde_gaps *g, uint32_t at, uint32_t count)
{
    for (uint32_t c = at; c < at + count; c++)
        chunk_free(g, g->ref[c].k);
    memmove(&g->ref[at], &g->ref[at + count], (g->nchunks - at - count) * sizeof(*g->ref));
    g->nchunks -= count;
    tree_rebuild(g);
}

void sde_gaps_free(sde_gaps *g)
{
    for (uint32_t c = 0; c < g->nchunks; c++)
        free(g->ref[c].k);
    for (uint32_t i = 0; i < g->nspare; i++)
        free(g->spare[i]);
    free(g->ref);
    free(g->tree);
    memset(g, 0, sizeof(*g));
}

int sde_gaps_append(sde_gaps *g, double start, double end)
{
    struct sde_gap_chunk *k = g->nchunks ? g->ref[g->nchunks - 1].k : NULL;
    if (!k || k->n == SDE_GAP_CHUNK) {
        k = chunk_new(g);
        if (!k)
            return -ENOMEM;
        k->n = 0;
        if (insert_chunk(g, g->nchunks, k) < 0) {
            chunk_free(g, k);
            return -ENOMEM;
        }
    }
    uint32_t c = g->nchunks - 1;
    k->g[k->n++] = (struct sde_gap){start, end};
    if (k->n == 1 || end - start > g->ref[c].maxlen) {
        g->ref[c].maxlen = end - start;
        tree_set(g, c);
    }
    g->ref[c].last = end;
    g->n++;
    return 0;
}

/* Gap i of chunk c gives way to the stage [start, done): the parts before and after it stay
 * gaps, in its place. */
static void take(sde_gaps *g, uint32_t c, uint32_t i, double start, double done)
{
    struct sde_gap_chunk *k = g->ref[c].k;
    struct sde_gap was = k->g[i], parts[2];
    uint32_t m = 0;
    if (start > was.start)
        parts[m++] = (struct sde_gap){was.start, start};
    if (done < was.end)
        parts[m++] = (struct sde_gap){done, was.end};
    if (k->n - 1 + m > SDE_GAP_CHUNK) { /* a full chunk gains one: split it in halves */
        struct sde_gap_chunk *upper = chunk_new(g);
        if (upper && insert_chunk(g, c + 1, upper) == 0) {
            uint32_t half = SDE_GAP_CHUNK / 2;
            upper->n = k->n - half;
            memcpy(upper->g, &k->g[half], upper->n * sizeof(*k->g));
            k->n = half;
            /* each half's longest gap is at most the whole's: kept as its bound (see fit) */
            g->ref[c + 1].maxlen = g->ref[c].maxlen;
            g->ref[c + 1].last = g->ref[c].last;
            g->ref[c].last = k->g[half - 1].end;
            tree_set(g, c + 1);
            if (i >= half) {
                c++;
                i -= half;
                k = upper;
            }
        } else {
            if (upper)
                chunk_free(g, upper);
            m--; /* the part after the stage is lost: pessimistic, still valid */
        }
    }
    if (m != 1) /* one part takes the gap's place: nothing moves */
        memmove(&k->g[i + m], &k->g[i + 1], (k->n - i - 1) * sizeof(*k->g));
    memcpy(&k->g[i], parts, m * sizeof(*parts));
    k->n += m - 1;
    g->n += m - 1;
    if (!k->n)
        remove_chunks(g, c, 1);
    else /* its parts are shorter than the gap: the chunk's bound stays one (see fit) */
        g->ref[c].last = k->g[k->n - 1].end;
}

int sde_gaps_fit(sde_gaps *g, double ready, double duration, double *done)
{
    /* ends are in order too: the first chunk with a gap ending after `ready`... */
    uint32_t lo = 0, hi = g->nchunks;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (g->ref[mid].last <= ready)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (uint32_t c = lo; c < g->nchunks; c++) {
        if (g->ref[c].maxlen < duration) {
            c = tree_first(g, c + 1, duration);
            if (c == g->nchunks)
                break;
        }
        const struct sde_gap_chunk *k = g->ref[c].k;
        uint32_t i = 0;
        if (c == lo) { /* ...and its first gap ending after it: galloping from the front,
                        * where a replay's reads find it (index 1 in 98% of them, as they
                        * are ready just past the horizon); a plain halving touched six cache
                        * lines of the chunk one after another for it, most of a fit's time */
            uint32_t l = 0, h = k->n ? 1 : 0;
            while (h < k->n && k->g[h - 1].end <= ready) {
                l = h;
                h = 2 * h + 1 < k->n ? 2 * h + 1 : k->n;
            }
            while (l < h) {
                uint32_t mid = (l + h) / 2;
                if (k->g[mid].end <= ready)
                    l = mid + 1;
                else
                    h = mid;
            }
            i = l;
        }
        uint32_t whole = i == 0; /* the scan sees every gap of the chunk */
        double longest = 0.0;
        for (; i < k->n; i++) {
            double start = k->g[i].start > ready ? k->g[i].start : ready;
            if (k->g[i].end - start >= duration) {
                double end = start + duration;
                if (end > k->g[i].end)
                    end = k->g[i].end;
                take(g, c, i, start, end);
                *done = end;
                return 1;
            }
            if (k->g[i].end - k->g[i].start > longest)
                longest = k->g[i].end - k->g[i].start;
        }
        if (whole) { /* no gap held it: the chunk's bound is its longest gap again */
            g->ref[c].maxlen = longest;
            tree_set(g, c);
        }
    }
    return 0;
}

void sde_gaps_forget_before(sde_gaps *g, double t)
{
    uint32_t c = 0;
    uint32_t dropped = 0;
    while (c < g->nchunks && g->ref[c].last <= t)
        dropped += g->ref[c++].k->n;
    if (c)
        remove_chunks(g, 0, c);
    if (g->nchunks) {
        struct sde_gap_chunk *k = g->ref[0].k;
        uint32_t i = 0;
        while (k->g[i].end <= t) /* stops: the chunk's last end is after t */
            i++;
        if (i) {
            memmove(k->g, &k->g[i], (k->n - i) * sizeof(*k->g));
            k->n -= i;
            dropped += i;
            /* its last end is the same; its bound still one (see fit) */
        }
    }
    g->n -= dropped;
}
