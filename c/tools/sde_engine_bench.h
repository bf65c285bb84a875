/*
 * The engine's closed-loop benchmark (`ssdemu bench io`'s job beside fio): a tool that runs
 * on an engine's own ring, built into the benchmarks' cffi module (ssdemu.bench._engine_bench,
 * with its own copy of the engine), not into the device's.
 */
#ifndef SDE_ENGINE_BENCH_H
#define SDE_ENGINE_BENCH_H
#include <stdint.h>

#include "sde_engine.h"

/* CDEF-BEGIN */
typedef struct sde_bench_cfg {
    uint64_t region_offset;   /* I/O stays inside [region_offset, region_offset+region_len) */
    uint64_t region_len;
    uint64_t duration_ns;
    uint64_t seed;
    uint64_t buf_addr;        /* qd * bs bytes, one slot per in-flight I/O */
    uint32_t bs;
    uint32_t qd;
    uint8_t write;
    uint8_t random;
    int16_t buf_index;        /* registered buffer holding buf_addr, or -1 */
    uint32_t submit_batch;    /* at most this many I/Os per io_uring_enter; 0: all ready */
} sde_bench_cfg;

typedef struct sde_bench_result {
    uint64_t ios;
    uint64_t bytes;
    uint64_t elapsed_ns;
    uint64_t errors;
    int32_t first_error;
    uint32_t reserved;
} sde_bench_result;

/* A closed-loop fio-like job, all in C: keeps qd I/Os in flight until duration_ns passes.
 * Each I/O's latency goes into hist (SDE_HIST_BUCKETS counters). */
int sde_bench(sde_engine *eng, const sde_bench_cfg *cfg, sde_bench_result *res, uint64_t *hist);
/* CDEF-END */
#endif
