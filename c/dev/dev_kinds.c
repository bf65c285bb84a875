/* The context kinds' table: what carries each kind of command on once its media I/O, its
 * value or its turn comes back.  The data plane dispatches on a context's kind here alone
 * (tests/test_c_shape.py holds it), as it starts a command from its row of dev_ops.c. */
#define _GNU_SOURCE
#include "dev_internal.h"

static const struct dev_kind KINDS[] = {
    [CTX_BLOCK] = {.name = "block", .media_done = dev_block_media_done},
    [CTX_KV_PUT] = {.name = "kv put", .media_done = dev_value_media_done,
                    .value_done = dev_put_value_done, .resume = dev_put_resume,
                    .put_timing = dev_kv_put_timing, .stores_value = 1, .result_existed = 1},
    [CTX_KV_GET] = {.name = "kv get", .media_done = dev_value_media_done,
                    .value_done = dev_get_value_done, .copies_out = 1},
    [CTX_KV_DELETE] = {.name = "kv delete"},
    [CTX_QSTORE] = {.name = "quantized store", .media_done = dev_value_media_done,
                    .value_done = dev_put_value_done, .resume = dev_put_resume,
                    .book_input = dev_qstore_book_input, .put_timing = dev_qstore_put_timing,
                    .stores_value = 1},
    [CTX_DQ_GET] = {.name = "dequantized retrieve", .media_done = dev_value_media_done,
                    .value_done = dev_dq_read_done, .book_input = dev_dq_book_input,
                    .reports_raw_size = 1},
    [CTX_PM_TOKENS] = {.name = "prefix match (tokens)"},
    [CTX_DEL_PARKED] = {.name = "kv delete, held back", .resume = dev_delete_resume},
    [CTX_DEFERRED] = {.name = "deferred"},
    [CTX_RQ_READ] = {.name = "requantize (read)", .media_done = dev_value_media_done,
                     .value_done = dev_requant_read_done, .book_input = dev_dq_book_input},
    [CTX_RQ_PUT] = {.name = "requantize (store)", .media_done = dev_value_media_done,
                    .value_done = dev_put_value_done, .resume = dev_put_resume,
                    .put_timing = dev_qstore_put_timing},
};

_Static_assert(sizeof(KINDS) / sizeof(KINDS[0]) == CTX_NKINDS, "a row for every kind");

const struct dev_kind *dev_kind(const struct dev_ctx *x) { return &KINDS[x->kind]; }
