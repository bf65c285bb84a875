/*
 * What the firmware's kernels cost on the emulated device, and the TOPS budget that turns
 * those costs into device time: the one definition (the daemon's data plane charges it; the
 * Python side, firmware/cost.py, wraps it for model-mode replay and reports).
 *
 * Costs are formulas of a kernel's input shape: ops (elementary integer or floating-point
 * operations, the unit of TOPS) and bytes (read and written in device memory); the formulas
 * are documented in firmware/cost.py.  One call runs on the compute unit that frees up first:
 * start = max(submit, unit's busy-until), device time = max(ops / per-unit rate, bytes /
 * memory bandwidth), busy-until = start + device time.
 */
#ifndef SDE_BUDGET_H
#define SDE_BUDGET_H
#include <stdint.h>

/* CDEF-BEGIN */
#define SDE_KERNEL_QUANTIZE 0
#define SDE_KERNEL_DEQUANTIZE 1
#define SDE_KERNEL_PREFIX_HASH 2
#define SDE_KERNEL_PREFIX_MATCH 3
#define SDE_KERNEL_INDEX_INSERT 4
#define SDE_NKERNELS 5
#define SDE_MAX_UNITS 64
/* scheme kinds, as in compressed block headers (firmware/blockfmt.py) */
#define SDE_SCHEME_INT 1
#define SDE_SCHEME_KIVI 2
#define SDE_SCHEME_FP8 3

typedef struct sde_kernel_cost {
    uint64_t ops;
    uint64_t bytes;
} sde_kernel_cost;

typedef struct sde_kernel_stats {
    uint64_t calls;
    uint64_t ops;
    uint64_t bytes;
    double device_ns;
    double host_ns;
    uint64_t host_lag_calls; /* calls whose real host time exceeded their device time */
} sde_kernel_stats;

typedef struct sde_budget {
    double tops;
    uint32_t units;
    double memory_bytes_per_s;
    double unit_ops_per_ns;
    double memory_bytes_per_ns;
    double busy_until_ns[64];
    double busy_ns[64];
    sde_kernel_stats kernels[5];
} sde_budget;

sde_kernel_cost sde_cost_quantize(uint64_t elements, uint32_t element_bytes, int kind,
                                  uint32_t group, uint64_t compressed_bytes);
sde_kernel_cost sde_cost_dequantize(uint64_t elements, uint32_t element_bytes, int kind,
                                    uint32_t group, uint64_t compressed_bytes);
sde_kernel_cost sde_cost_prefix_hash(uint64_t blocks, uint32_t block_tokens);
sde_kernel_cost sde_cost_prefix_match(uint64_t keys_probed);
sde_kernel_cost sde_cost_index_insert(uint64_t keys);

/* 0, or -EINVAL for a figure that is not positive and finite or too many units. */
int sde_budget_init(sde_budget *b, double tops, uint32_t units, double memory_bytes_per_s);
double sde_budget_device_ns(const sde_budget *b, sde_kernel_cost c);
/* Account one call submitted at submit_ns (device clock): returns its end, *start its
 * start (may be NULL). */
double sde_budget_charge(sde_budget *b, int kernel, sde_kernel_cost c, double submit_ns,
                         double host_ns, double *start);
/* Busy unit-time over available unit-time since the clock's origin. */
double sde_budget_utilization(const sde_budget *b, double elapsed_ns);
/* CDEF-END */
#endif
