/*
 * Latency histogram: log-linear buckets, relative error below 2^-SDE_HIST_SUB_BITS.  Pure
 * arithmetic with no liburing, so that client-side tools link it without the engine.
 */
#ifndef SDE_HIST_H
#define SDE_HIST_H
#include <stdint.h>

/* CDEF-BEGIN */
#define SDE_HIST_SUB_BITS 7
#define SDE_HIST_BUCKETS 8192

/* Bucket <-> value mapping of the latency histogram (shared by C and Python). */
uint32_t sde_hist_bucket(uint64_t ns);
uint64_t sde_hist_value(uint32_t bucket);
/* CDEF-END */
#endif
