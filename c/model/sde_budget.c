/* The firmware's cost formulas and TOPS budget (c/model/sde_budget.h; formulas explained in
 * ssdemu/sim/cost.py). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "sde_budget.h"
#include "sde_model.h"

static uint64_t groups(uint64_t n, uint32_t group) { return group ? (n + group - 1) / group : 0; }

/* A kind's cost row (c/model/sde_kinds.h); an unknown code costs as the first kind. */
static const struct sde_kind_cost *kind_cost(int kind)
{
    for (size_t i = 0; i < SDE_NKINDS; i++)
        if (SDE_KIND_COSTS[i].kind == kind)
            return &SDE_KIND_COSTS[i];
    return &SDE_KIND_COSTS[0];
}

sde_kernel_cost sde_cost_quantize(uint64_t elements, uint32_t element_bytes, int kind,
                                  uint32_t group, uint64_t compressed_bytes)
{
    const struct sde_kind_cost *k = kind_cost(kind);
    uint64_t ops = k->q_element * elements + k->q_group * groups(elements, group) + k->q_block;
    return (sde_kernel_cost){.vector_ops = ops, .bytes = elements * element_bytes +
                                                         compressed_bytes};
}

sde_kernel_cost sde_cost_dequantize(uint64_t elements, uint32_t element_bytes, int kind,
                                    uint32_t group, uint64_t compressed_bytes)
{
    const struct sde_kind_cost *k = kind_cost(kind);
    uint64_t ops = k->dq_element * elements + k->dq_group * groups(elements, group) +
                   k->dq_block;
    return (sde_kernel_cost){.vector_ops = ops,
                             .bytes = elements * element_bytes + compressed_bytes};
}

sde_kernel_cost sde_cost_store_summaries(uint64_t elements, uint32_t element_bytes, int kind,
                                         uint32_t group, uint64_t compressed_bytes,
                                         uint64_t summary_bytes)
{
    if (!summary_bytes)
        return (sde_kernel_cost){0};
    uint64_t keys = elements / 2;
    /* a plain block's keys are its body: nothing to dequantize */
    sde_kernel_cost d = !kind_cost(kind)->summaries_dequantize
                            ? (sde_kernel_cost){0}
                            : sde_cost_dequantize(keys, element_bytes, kind, group,
                                                  (compressed_bytes - summary_bytes) / 2);
    /* one "token" of every layer and head: the summarize cost counts key elements */
    sde_kernel_cost s = sde_cost_summarize(keys, 1, 1, element_bytes, summary_bytes, 0);
    /* then the block's checksum again, over its words */
    sde_kernel_cost sum = {.vector_ops = compressed_bytes / 8, .bytes = compressed_bytes};
    return sde_cost_add(sde_cost_add(d, s), sum);
}

sde_kernel_cost sde_cost_requantize(uint64_t elements, uint32_t element_bytes, int from_kind,
                                    uint32_t from_group, uint64_t from_bytes, int kind,
                                    uint32_t group, uint64_t compressed_bytes,
                                    uint64_t summary_bytes)
{
    sde_kernel_cost d =
        sde_cost_dequantize(elements, element_bytes, from_kind, from_group, from_bytes);
    sde_kernel_cost q = sde_cost_quantize(elements, element_bytes, kind, group,
                                          compressed_bytes - summary_bytes);
    sde_kernel_cost s = sde_cost_store_summaries(elements, element_bytes, kind, group,
                                                 compressed_bytes, summary_bytes);
    return sde_cost_add(sde_cost_add(d, q), s);
}

sde_kernel_cost sde_cost_prefix_hash(uint64_t blocks, uint32_t block_tokens)
{
    uint64_t message = 16 + 4 * (uint64_t)block_tokens;
    uint64_t compressions = (message + 127) / 128;
    return (sde_kernel_cost){.ops = blocks * compressions * 1400,
                             .bytes = blocks * (message + 16)};
}

sde_kernel_cost sde_cost_prefix_match(uint64_t keys_probed)
{
    /* a hash-table probe per key: a dependent load from DRAM, then compare and step */
    return (sde_kernel_cost){.ops = 20 * keys_probed, .bytes = 48 * keys_probed,
                             .probes = keys_probed};
}

sde_kernel_cost sde_cost_index_insert(uint64_t keys)
{
    /* a probe for the slot, and the LRU list's neighbour */
    return (sde_kernel_cost){.ops = 40 * keys, .bytes = 112 * keys, .probes = 2 * keys};
}

/* ---- retrieval: costs documented in ssdemu/sim/cost.py ---------------------------------- */

uint64_t sde_summary_bytes(uint64_t pages, uint32_t heads, uint32_t head_dim,
                           uint32_t element_bytes, int int8)
{
    uint64_t per = int8 ? 2ull * head_dim + 4 : 2ull * head_dim * element_bytes;
    return pages * heads * per;
}

sde_kernel_cost sde_cost_summarize(uint64_t tokens, uint32_t heads, uint32_t head_dim,
                                   uint32_t element_bytes, uint64_t summary_bytes, int int8)
{
    uint64_t n = tokens * heads * head_dim;
    /* convert (16-bit elements), min, max per key element; int8: 6 per summary element
     * (abs, max, divide, round, check, narrow); each page's max - min per channel added to
     * its head's running sum (the spread the channel-selective score weighs by): 2 per
     * channel, summary_bytes / element_bytes for the min-max pairs */
    uint64_t ops = (element_bytes == 2 ? 3 : 2) * n + (int8 ? 3 * summary_bytes : 0) +
                   summary_bytes / (element_bytes ? element_bytes : 1);
    return (sde_kernel_cost){.vector_ops = ops, .bytes = n * element_bytes + summary_bytes};
}

sde_kernel_cost sde_cost_score(uint64_t pages, uint32_t heads, uint32_t group,
                               uint32_t head_dim, uint64_t summary_bytes)
{
    /* sum_c max(q_c min_c, q_c max_c) = q+ . max + q- . min: two dot products per page and
     * query head on the MAC array; the largest over the group on the lanes */
    uint64_t qh = (uint64_t)heads * group;
    return (sde_kernel_cost){.mac_ops = 2 * pages * qh * head_dim,
                             .vector_ops = pages * qh + 2 * qh * head_dim,
                             .bytes = summary_bytes + qh * head_dim * 2 + pages * heads * 4};
}

sde_kernel_cost sde_cost_score_selective(uint64_t pages, uint32_t heads, uint32_t group,
                                         uint32_t head_dim, uint32_t channels)
{
    /* what it adds to the bound's pass (firmware/retrieval.py computes both in one pass over
     * the summaries, so no summary byte is read twice): per query head a ratio per channel
     * against the spread the summaries keep (lanes) and a heap of `channels` on the cores;
     * Quest's two dot products again over the chosen channels only (the operands already in
     * the array); the scores written */
    uint64_t qh = (uint64_t)heads * group;
    double levels = channels > 1 ? ceil(log2((double)channels)) : 1;
    return (sde_kernel_cost){
        .ops = qh * (3 * (uint64_t)head_dim + (uint64_t)ceil(8 * channels * levels)),
        .mac_ops = 2 * pages * qh * channels,
        .vector_ops = qh * head_dim + pages * qh,
        .bytes = qh * head_dim * 4 + pages * heads * 4};
}

sde_kernel_cost sde_cost_topk(uint64_t candidates, uint64_t k)
{
    /* a heap of k: every candidate compared with the worst kept (3 ops); the expected
     * k (1 + ln(n / k)) of them that enter sift down log2 k levels (8 ops a level) */
    if (!candidates)
        return (sde_kernel_cost){.ops = 1, .bytes = 8};
    if (k > candidates)
        k = candidates;
    double levels = k > 1 ? ceil(log2((double)k)) : 1;
    double inserts = k * (1.0 + log((double)candidates / (double)k));
    if (inserts > candidates)
        inserts = (double)candidates;
    return (sde_kernel_cost){.ops = 3 * candidates + (uint64_t)ceil(8 * inserts * levels),
                             .bytes = 8 * candidates + 8 * k};
}

/* per logit: scale, max, subtract, exp (8: a polynomial on the lanes), accumulate */
#define SOFTMAX_OPS 12

sde_kernel_cost sde_cost_rerank(uint64_t tokens, uint64_t pages, uint32_t heads,
                                uint32_t group, uint32_t head_dim, uint64_t key_bytes)
{
    /* q.k per key element on the MAC array, a softmax per logit for each page's
     * log-sum-exp, then per query head one over the pages' (each page's share) */
    uint64_t qh = (uint64_t)heads * group;
    return (sde_kernel_cost){.mac_ops = tokens * qh * head_dim,
                             .vector_ops = SOFTMAX_OPS * (tokens + pages) * qh,
                             .bytes = key_bytes + qh * head_dim * 2};
}

sde_kernel_cost sde_cost_attend(uint64_t tokens, uint32_t heads, uint32_t group,
                                uint32_t head_dim, uint64_t kv_bytes)
{
    /* q.k and p.v: two MACs per key element per query head; softmax on the lanes; the
     * output normalized and written (fp16) with its log-sum-exp */
    uint64_t qh = (uint64_t)heads * group;
    return (sde_kernel_cost){.mac_ops = 2 * tokens * qh * head_dim,
                             .vector_ops = SOFTMAX_OPS * tokens * qh + 2 * qh * head_dim,
                             .bytes = kv_bytes + qh * (head_dim * 4 + 4)};
}

static int positive(double v) { return isfinite(v) && v > 0; }

int sde_budget_init(sde_budget *b, double tops, uint32_t units, double memory_bytes_per_s,
                    double core_ops_per_s, uint32_t simd_lanes, double probe_ns)
{
    if (!positive(tops) || !positive(memory_bytes_per_s) || !positive(core_ops_per_s) ||
        !simd_lanes || !(isfinite(probe_ns) && probe_ns >= 0) || units < 1 ||
        units > SDE_MAX_UNITS)
        return -EINVAL;
    memset(b, 0, sizeof(*b));
    b->tops = tops;
    b->units = units;
    b->memory_bytes_per_s = memory_bytes_per_s;
    b->unit_ops_per_ns = tops * 1e12 / units / 1e9; /* a MAC is 2 of these ops */
    b->memory_bytes_per_ns = memory_bytes_per_s / 1e9;
    b->core_ops_per_ns = core_ops_per_s / 1e9;
    b->vector_ops_per_ns = core_ops_per_s * simd_lanes / 1e9;
    b->probe_ns = probe_ns;
    return 0;
}

void sde_budget_share_dram(sde_budget *b, void *model) { b->dram = model; }

static double compute_ns(const sde_budget *b, sde_kernel_cost c)
{
    return (double)c.ops / b->core_ops_per_ns + (double)c.vector_ops / b->vector_ops_per_ns +
           2.0 * (double)c.mac_ops / b->unit_ops_per_ns + (double)c.probes * b->probe_ns;
}

double sde_budget_mac_ns(const sde_budget *b, sde_kernel_cost c)
{
    return 2.0 * (double)c.mac_ops / b->unit_ops_per_ns;
}

double sde_budget_device_ns(const sde_budget *b, sde_kernel_cost c)
{
    double compute = compute_ns(b, c);
    double memory = (double)c.bytes / b->memory_bytes_per_ns;
    return compute > memory ? compute : memory;
}

double sde_budget_charge(sde_budget *b, int kernel, sde_kernel_cost c, double submit_ns,
                         double host_ns, double *start)
{
    uint32_t unit = 0;
    for (uint32_t u = 1; u < b->units; u++)
        if (b->busy_until_ns[u] < b->busy_until_ns[unit])
            unit = u;
    double s = submit_ns > b->busy_until_ns[unit] ? submit_ns : b->busy_until_ns[unit];
    double done;
    if (b->dram) { /* its bytes wait their turn on the DRAM the NAND and PCIe DMA use */
        double compute = s + compute_ns(b, c);
        double memory = sde_model_dram(b->dram, s, c.bytes);
        done = compute > memory ? compute : memory;
    } else {
        done = s + sde_budget_device_ns(b, c);
    }
    double duration = done - s;
    b->busy_until_ns[unit] = done;
    b->busy_ns[unit] += duration;
    if (kernel >= 0 && kernel < SDE_NKERNELS) {
        sde_kernel_stats *k = &b->kernels[kernel];
        k->calls++;
        k->ops += c.ops + c.vector_ops + c.mac_ops;
        k->bytes += c.bytes;
        k->device_ns += duration;
        k->host_ns += host_ns;
        if (host_ns > duration)
            k->host_lag_calls++;
    }
    if (start)
        *start = s;
    return done;
}

double sde_budget_charge_n(sde_budget *b, int kernel, sde_kernel_cost c, double submit_ns,
                           uint32_t n)
{
    double end = submit_ns;
    for (uint32_t i = 0; i < n; i++) {
        double done = sde_budget_charge(b, kernel, c, submit_ns, 0.0, NULL);
        if (done > end)
            end = done;
    }
    return end;
}

double sde_budget_utilization(const sde_budget *b, double elapsed_ns)
{
    if (elapsed_ns <= 0)
        return 0.0;
    double busy = 0;
    for (uint32_t u = 0; u < b->units; u++)
        busy += b->busy_ns[u];
    return busy / (elapsed_ns * b->units);
}
