/*
 * What the firmware's kernels cost on the emulated device, and the TOPS budget that turns
 * those costs into device time: the one definition (the daemon's data plane charges it; the
 * Python side, ssdemu/sim/cost.py, wraps it for model-mode replay and reports).
 *
 * Costs are formulas of a kernel's input shape, by the class of hardware that runs them
 * (documented in ssdemu/sim/cost.py): scalar ops on the controller's embedded cores (hashing,
 * bookkeeping), vector ops on their SIMD lanes (quantizing, packing), MAC ops on the MAC
 * array the TOPS rating counts (scoring, dot products), dependent DRAM probes (index
 * lookups), and bytes moved in the controller's DRAM.  One call runs on the unit (an embedded
 * core) that frees up first: start = max(submit, its busy-until); its compute takes
 * scalar / core rate + vector / (core rate x lanes) + MAC / (TOPS / units) + probes x probe
 * latency; its bytes take the DRAM, which NAND and PCIe DMA share when the budget is tied to
 * a timing model (sde_budget_share_dram): device time = max(compute, DRAM), busy-until =
 * start + device time.
 */
#ifndef SDE_BUDGET_H
#define SDE_BUDGET_H
#include <stdint.h>

/* SDE_SCHEME_* and the kinds' cost rows, generated from firmware/kinds.py */
#include "sde_kinds.h"

/* CDEF-BEGIN */
#define SDE_KERNEL_QUANTIZE 0
#define SDE_KERNEL_DEQUANTIZE 1
#define SDE_KERNEL_PREFIX_HASH 2
#define SDE_KERNEL_PREFIX_MATCH 3
#define SDE_KERNEL_INDEX_INSERT 4
#define SDE_KERNEL_SUMMARIZE 5
#define SDE_KERNEL_SCORE 6
#define SDE_KERNEL_TOPK 7
#define SDE_KERNEL_RERANK 8
#define SDE_KERNEL_ATTEND 9
#define SDE_KERNEL_REQUANTIZE 10
#define SDE_NKERNELS 11
#define SDE_MAX_UNITS 64

typedef struct sde_kernel_cost {
    uint64_t ops;        /* scalar ops on an embedded core */
    uint64_t bytes;      /* moved in the controller's DRAM */
    uint64_t vector_ops; /* element-wise ops, simd_lanes at a time */
    uint64_t mac_ops;    /* multiply-accumulates on the MAC array: 2 ops each in its TOPS */
    uint64_t probes;     /* dependent DRAM probes, one after another */
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
    double unit_ops_per_ns;      /* ops per ns per unit of the MAC array: TOPS / units */
    double memory_bytes_per_ns;
    double core_ops_per_ns;      /* scalar ops per ns per core */
    double vector_ops_per_ns;    /* element-wise ops per ns per core: x simd lanes */
    double probe_ns;
    void *dram;                  /* the sde_model whose DRAM the kernels share, or NULL */
    double busy_until_ns[64];
    double busy_ns[64];
    sde_kernel_stats kernels[11];
} sde_budget;

sde_kernel_cost sde_cost_quantize(uint64_t elements, uint32_t element_bytes, int kind,
                                  uint32_t group, uint64_t compressed_bytes);
sde_kernel_cost sde_cost_dequantize(uint64_t elements, uint32_t element_bytes, int kind,
                                    uint32_t group, uint64_t compressed_bytes);
/* A quantized store's page summaries (firmware/summaries.py): the block's keys dequantized
 * again (the bound is of the keys a retrieve gives back) and their per-page min and max. */
sde_kernel_cost sde_cost_store_summaries(uint64_t elements, uint32_t element_bytes, int kind,
                                         uint32_t group, uint64_t compressed_bytes,
                                         uint64_t summary_bytes);
/* KV_REQUANTIZE (firmware/requant.py): the stored block (from_kind, from_group,
 * from_bytes) dequantized, quantized at the new scheme (kind, group, compressed_bytes, of
 * which summary_bytes are its page summaries, recomputed). */
sde_kernel_cost sde_cost_requantize(uint64_t elements, uint32_t element_bytes, int from_kind,
                                    uint32_t from_group, uint64_t from_bytes, int kind,
                                    uint32_t group, uint64_t compressed_bytes,
                                    uint64_t summary_bytes);
sde_kernel_cost sde_cost_prefix_hash(uint64_t blocks, uint32_t block_tokens);
sde_kernel_cost sde_cost_prefix_match(uint64_t keys_probed);
sde_kernel_cost sde_cost_index_insert(uint64_t keys);
/* Retrieval (firmware/retrieval.py), per call: `heads` KV heads, `group` query heads each. */
sde_kernel_cost sde_cost_summarize(uint64_t tokens, uint32_t heads, uint32_t head_dim,
                                   uint32_t element_bytes, uint64_t summary_bytes, int int8);
sde_kernel_cost sde_cost_score(uint64_t pages, uint32_t heads, uint32_t group,
                               uint32_t head_dim, uint64_t summary_bytes);
/* The re-rank's channel-selective score: `channels` channels chosen per query head by the
 * keys' spread (kept with the summaries), Quest's sum over them, in the bound's pass. */
sde_kernel_cost sde_cost_score_selective(uint64_t pages, uint32_t heads, uint32_t group,
                                         uint32_t head_dim, uint32_t channels);
sde_kernel_cost sde_cost_topk(uint64_t candidates, uint64_t k);
sde_kernel_cost sde_cost_rerank(uint64_t tokens, uint64_t pages, uint32_t heads,
                                uint32_t group, uint32_t head_dim, uint64_t key_bytes);
sde_kernel_cost sde_cost_attend(uint64_t tokens, uint32_t heads, uint32_t group,
                                uint32_t head_dim, uint64_t kv_bytes);
/* Bytes of the summaries of `pages` pages of `heads` KV heads: min and max per channel in
 * the block's element type, or int8 codes and a float32 scale per page and head. */
uint64_t sde_summary_bytes(uint64_t pages, uint32_t heads, uint32_t head_dim,
                           uint32_t element_bytes, int int8);

/* 0, or -EINVAL for a figure that is not positive and finite or too many units. */
int sde_budget_init(sde_budget *b, double tops, uint32_t units, double memory_bytes_per_s,
                    double core_ops_per_s, uint32_t simd_lanes, double probe_ns);
/* Kernels' bytes are booked on this timing model's DRAM (sde_model_dram), beside the NAND and
 * PCIe DMA it books there; NULL: the DRAM is the kernels' alone. */
void sde_budget_share_dram(sde_budget *b, void *model);
/* Of that, the time its MAC ops take on the array (what binds when the TOPS budget does). */
double sde_budget_mac_ns(const sde_budget *b, sde_kernel_cost c);
/* A call's device time on an idle device (its DRAM uncontended). */
double sde_budget_device_ns(const sde_budget *b, sde_kernel_cost c);
/* Account one call submitted at submit_ns (device clock): returns its end, *start its
 * start (may be NULL). */
double sde_budget_charge(sde_budget *b, int kernel, sde_kernel_cost c, double submit_ns,
                         double host_ns, double *start);
/* n calls of one kernel and cost, each submitted at submit_ns (a kernel per KV head): their
 * latest end (submit_ns when n is 0), as n sde_budget_charge calls in turn. */
double sde_budget_charge_n(sde_budget *b, int kernel, sde_kernel_cost c, double submit_ns,
                           uint32_t n);
/* Busy unit-time over available unit-time since the clock's origin. */
double sde_budget_utilization(const sde_budget *b, double elapsed_ns);
/* CDEF-END */

/* two kernels' costs as one */
static inline sde_kernel_cost sde_cost_add(sde_kernel_cost a, sde_kernel_cost b)
{
    return (sde_kernel_cost){.ops = a.ops + b.ops, .bytes = a.bytes + b.bytes,
                             .vector_ops = a.vector_ops + b.vector_ops,
                             .mac_ops = a.mac_ops + b.mac_ops, .probes = a.probes + b.probes};
}
#endif
