/* The one monotonic clock of the C layers, in nanoseconds (what every latency, due time and
 * real-clock model time is measured on). */
#ifndef SDE_TIME_H
#define SDE_TIME_H
#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#endif
