/* A map of runs in segments of 64 indexes (sde_segmap.h). */
#include "sde_segmap.h"

#include <errno.h>
#include <stdlib.h>

#define SEG 64
#define NONE UINT32_MAX

struct seg {
    uint64_t mask; /* which of the segment's indexes are mapped */
    uint32_t base; /* direct: index j holds base + j (mod 2^32) */
    uint32_t own;  /* NONE: direct; else its 64 values are pool[own * SEG ...] */
};

struct sde_segmap {
    uint64_t n, nseg;
    struct seg *seg;
    uint32_t *pool;          /* SEG values per spilled segment */
    uint32_t *free_ids, nfree; /* pool places given back */
    uint32_t high;           /* pool places never used start here */
};

int sde_segmap_new(uint64_t n, sde_segmap **out)
{
    if (!n || n > ((uint64_t)NONE) * SEG)
        return -EINVAL;
    sde_segmap *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->n = n;
    s->nseg = (n + SEG - 1) / SEG;
    s->seg = malloc(s->nseg * sizeof(*s->seg));
    s->pool = malloc(s->nseg * SEG * sizeof(uint32_t)); /* pages touched only as used */
    s->free_ids = malloc(s->nseg * sizeof(uint32_t));
    if (!s->seg || !s->pool || !s->free_ids) {
        sde_segmap_free(s);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < s->nseg; i++)
        s->seg[i] = (struct seg){0, 0, NONE};
    *out = s;
    return 0;
}

void sde_segmap_free(sde_segmap *s)
{
    if (!s)
        return;
    free(s->seg);
    free(s->pool);
    free(s->free_ids);
    free(s);
}

/* indexes [a, b) of a segment, 0 <= a < b <= 64 */
static inline uint64_t span(uint32_t a, uint32_t b)
{
    uint64_t hi = b == SEG ? ~0ull : (1ull << b) - 1;
    return hi & ~((1ull << a) - 1);
}

/* the count of consecutive set bits of x from bit 0 */
static inline uint32_t ones(uint64_t x) { return ~x ? (uint32_t)__builtin_ctzll(~x) : SEG; }

static void spill(sde_segmap *s, struct seg *g)
{
    uint32_t id = s->nfree ? s->free_ids[--s->nfree] : s->high++;
    uint32_t *v = s->pool + (uint64_t)id * SEG;
    for (uint32_t j = 0; j < SEG; j++)
        v[j] = g->mask >> j & 1 ? g->base + j : NONE;
    g->own = id;
}

static void unspill(sde_segmap *s, struct seg *g)
{
    s->free_ids[s->nfree++] = g->own;
    g->own = NONE;
}

uint32_t sde_segmap_get(const sde_segmap *s, uint64_t i)
{
    const struct seg *g = &s->seg[i / SEG];
    uint32_t j = i % SEG;
    if (!(g->mask >> j & 1))
        return NONE;
    return g->own == NONE ? g->base + j : s->pool[(uint64_t)g->own * SEG + j];
}

/* How many indexes of segment g from j on continue a run that expects value `want` there
 * (NONE: unmapped ones). */
static uint32_t continues(const sde_segmap *s, const struct seg *g, uint32_t j, uint32_t want)
{
    uint64_t m = g->mask >> j;
    if (want == NONE) {
        uint32_t z = m ? (uint32_t)__builtin_ctzll(m) : SEG - j;
        return z;
    }
    uint32_t n = ones(m);
    if (n > SEG - j)
        n = SEG - j;
    if (g->own == NONE)
        return g->base + j == want ? n : 0;
    const uint32_t *v = s->pool + (uint64_t)g->own * SEG + j;
    uint32_t k = 0;
    while (k < n && v[k] == want + k)
        k++;
    return k;
}

uint64_t sde_segmap_run(const sde_segmap *s, uint64_t i, uint64_t limit, uint32_t *v)
{
    uint32_t first = sde_segmap_get(s, i);
    *v = first;
    uint64_t at = i;
    while (at < limit) {
        uint32_t j = at % SEG;
        uint32_t want = first == NONE ? NONE : first + (uint32_t)(at - i);
        uint32_t k = continues(s, &s->seg[at / SEG], j, want);
        if (k > limit - at)
            k = (uint32_t)(limit - at);
        at += k;
        if (j + k < SEG)
            break; /* the run ended inside this segment (or at the limit) */
    }
    return at - i;
}

void sde_segmap_set(sde_segmap *s, uint64_t i, uint64_t k, uint32_t v)
{
    while (k) {
        struct seg *g = &s->seg[i / SEG];
        uint32_t j = i % SEG, n = SEG - j < k ? SEG - j : (uint32_t)k;
        uint64_t bits = span(j, j + n);
        if (!g->mask) {
            if (g->own != NONE)
                unspill(s, g);
            g->base = v - j;
        } else if (g->own != NONE || g->base + j != v) {
            if (g->own == NONE)
                spill(s, g);
            uint32_t *p = s->pool + (uint64_t)g->own * SEG + j;
            for (uint32_t t = 0; t < n; t++)
                p[t] = v + t;
        }
        g->mask |= bits;
        i += n;
        k -= n;
        v += n;
    }
}

/* Runs of removed values, joined while they continue one another (a block trimmed whole
 * is one run of slots, not one per segment), handed on when one breaks. */
struct gone_runs {
    sde_segmap_gone gone;
    void *ctx;
    uint32_t v, n;
};

static inline void gone_add(struct gone_runs *g, uint32_t v, uint32_t n)
{
    if (g->n && v == g->v + g->n) {
        g->n += n;
        return;
    }
    if (g->n)
        g->gone(g->ctx, g->v, g->n);
    g->v = v;
    g->n = n;
}

uint64_t sde_segmap_clear(sde_segmap *s, uint64_t i, uint64_t k, sde_segmap_gone gone,
                          void *ctx)
{
    uint64_t cleared = 0;
    struct gone_runs runs = {gone, ctx, 0, 0};
    while (k) {
        struct seg *g = &s->seg[i / SEG];
        uint32_t j = i % SEG, n = SEG - j < k ? SEG - j : (uint32_t)k;
        if (n == SEG && g->mask == ~0ull && g->own == NONE) {
            /* a whole segment that is one run: a replay's block trimmed whole is ~60 of
             * them, and the general path's masks and scans were most of a trim */
            cleared += SEG;
            if (gone)
                gone_add(&runs, g->base, SEG);
            g->mask = 0;
            i += SEG;
            k -= SEG;
            continue;
        }
        uint64_t rem = g->mask & span(j, j + n);
        if (rem) {
            const uint32_t *p = g->own == NONE ? NULL : s->pool + (uint64_t)g->own * SEG;
            while (rem) {
                uint32_t a = (uint32_t)__builtin_ctzll(rem), len = ones(rem >> a);
                cleared += len;
                if (gone && !p) {
                    gone_add(&runs, g->base + a, len);
                } else if (gone) { /* split where the values jump */
                    uint32_t r0 = a;
                    for (uint32_t t = a + 1; t <= a + len; t++)
                        if (t == a + len || p[t] != p[t - 1] + 1) {
                            gone_add(&runs, p[r0], t - r0);
                            r0 = t;
                        }
                }
                rem &= ~span(a, a + len);
            }
            g->mask &= ~span(j, j + n);
            if (!g->mask && g->own != NONE)
                unspill(s, g);
        }
        i += n;
        k -= n;
    }
    if (runs.n)
        gone(ctx, runs.v, runs.n);
    return cleared;
}

uint64_t sde_segmap_spilled(const sde_segmap *s) { return s->high - s->nfree; }
