/* The C layers' two small generators, defined once.  splitmix64 where each user has its own
 * state and wants its sequence well mixed from any seed (fault rules, the power cut's coins);
 * xorshift64* where a tight loop wants the cheapest step (the closed-loop benchmarks' random
 * offsets and keys). */
#ifndef SDE_RAND_H
#define SDE_RAND_H
#include <stdint.h>

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t xorshift64s(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}
#endif
