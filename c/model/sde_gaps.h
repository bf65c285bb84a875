/*
 * A resource's idle gaps before its next free time (c/model): disjoint, in time order.
 * A stage takes the first gap, in time order, that ends after its ready time and holds it.
 *
 * Kept in chunks of up to SDE_GAP_CHUNK gaps, each chunk with its last end and a bound on its
 * longest gap, so that finding the first gap that ends after a time is a binary search over
 * chunks, chunks whose gaps are all too short are skipped whole, and an insert or a removal
 * moves at most one chunk's gaps.  A flat sorted array did the same in O(n) per change: a
 * drive whose writes queue far ahead (pcie4-tlc on a Mooncake trace) keeps thousands of gaps
 * per plane, and moving them was most of a replay's time.
 */
#ifndef SDE_GAPS_H
#define SDE_GAPS_H
#include <stdint.h>

#define SDE_GAP_CHUNK 64
#define SDE_GAP_SPARES 2

struct sde_gap {
    double start, end;
};

struct sde_gap_chunk {
    uint32_t n;
    struct sde_gap g[SDE_GAP_CHUNK];
};

/* a chunk, its last end and its longest gap (end - start), side by side: a booking reads
 * all three of one chunk, and three arrays were three cache lines a die.  maxlen is a bound,
 * at least the longest gap's length: a gap taken or forgotten leaves it as it was, and a fit
 * that scans the whole chunk in vain sets it exact again.  Kept exact, every take of the
 * longest gap rescanned the chunk (its 16 cache lines): GC's erases take the first gap long
 * enough on every die, often a chunk's longest, and the rescans were 2.5% of a replay's
 * instructions under eviction (cachegrind, conversation trace, blocks:2000). */
struct sde_chunk_ref {
    struct sde_gap_chunk *k;
    double last, maxlen;
};

typedef struct sde_gaps {
    struct sde_chunk_ref *ref; /* the chunks in time order */
    /* a max-tree over maxlen (leaves from tsize on), so that the first chunk after another
     * with a gap long enough is found in O(log chunks): a drive whose programs queue far ahead
     * of its reads (GC under a full write cache) keeps thousands of short gaps per die, and a
     * scan over their chunks for every program was 76% of a steady-state run's time */
    double *tree;
    uint32_t tsize, tcap; /* the tree's leaves, and those its memory holds */
    uint32_t nchunks, cap;
    uint32_t n; /* gaps in all */
    /* chunks given back, kept for the next one this resource needs: its gaps are forgotten
     * at the front and appended at the back, a chunk at a time, and malloc and free of those
     * chunks were 7% of a replay under eviction (perf, conversation trace, blocks:2000) */
    struct sde_gap_chunk *spare[SDE_GAP_SPARES];
    uint32_t nspare;
} sde_gaps;

void sde_gaps_free(sde_gaps *g);
/* The first gap that ends after `ready` and holds [max(its start, ready), + duration): the
 * stage takes it (the parts before and after stay gaps) and *done is the stage's end; 1.
 * 0 when no gap holds it. */
int sde_gaps_fit(sde_gaps *g, double ready, double duration, double *done);
/* A gap after every other.  0, or -ENOMEM (the gap is lost: the model stays valid, only
 * pessimistic). */
int sde_gaps_append(sde_gaps *g, double start, double end);
/* Forget the gaps that end by t. */
void sde_gaps_forget_before(sde_gaps *g, double t);

static inline double sde_gaps_first_end(const sde_gaps *g) { return g->ref[0].k->g[0].end; }
static inline double sde_gaps_last_end(const sde_gaps *g) { return g->ref[g->nchunks - 1].last; }
#endif
