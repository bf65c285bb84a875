/* One binary min-heap, for the C layers' three (the daemon's held completions by due time,
 * the model's write cache by program time, the closed loop's completions).  SDE_HEAP(name,
 * type, KEY) defines name_push(h, &n, v) and name_pop(h, &n) on an array h of n `type`s
 * ordered by KEY(x); the caller owns the array and its capacity.  Equal keys: sift-up stops
 * at an equal parent, sift-down prefers the left child and stops at an equal one. */
#ifndef SDE_HEAP_H
#define SDE_HEAP_H
#include <stdint.h>

#define SDE_HEAP(name, type, KEY)                                                          \
    static inline void name##_push(type *h, uint32_t *n, type v)                           \
    {                                                                                      \
        uint32_t i = (*n)++;                                                               \
        while (i && KEY(h[(i - 1) / 2]) > KEY(v)) {                                        \
            h[i] = h[(i - 1) / 2];                                                         \
            i = (i - 1) / 2;                                                               \
        }                                                                                  \
        h[i] = v;                                                                          \
    }                                                                                      \
    static inline type name##_pop(type *h, uint32_t *n)                                    \
    {                                                                                      \
        type top = h[0], last = h[--(*n)];                                                 \
        uint32_t i = 0;                                                                    \
        for (;;) {                                                                         \
            uint32_t c = 2 * i + 1;                                                        \
            if (c >= *n)                                                                   \
                break;                                                                     \
            if (c + 1 < *n && KEY(h[c + 1]) < KEY(h[c]))                                   \
                c++;                                                                       \
            if (!(KEY(h[c]) < KEY(last)))                                                  \
                break;                                                                     \
            h[i] = h[c];                                                                   \
            i = c;                                                                         \
        }                                                                                  \
        if (*n)                                                                            \
            h[i] = last;                                                                   \
        return top;                                                                        \
    }
#endif
