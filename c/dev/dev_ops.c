/*
 * The opcode table (dev_internal.h, struct dev_op): every opcode the wire format defines,
 * and what the data plane does with it.  The count check fails to compile when an opcode is
 * defined without a row; tests/test_opcode_table.py walks the rows through
 * sde_dev_opcode_info (every wire opcode has a row, every row its handlers, every host
 * opcode a Python handler).
 */
#define _GNU_SOURCE
#include "dev_internal.h"

#include <stdio.h>

#define R SDE_FAULT_DIR_READ
#define W SDE_FAULT_DIR_WRITE
#define DP SDE_RUN_DATA_PLANE

static const struct dev_op op_table[] = {
    /* op, class, where, fault_dir, in_turn, needs_store, keyed, start, kernel_done, name */
    {SDE_CMD_NOP, SDE_CLASS_NOP, DP, 0, 1, 0, 0, dev_nop_start, NULL, "NOP"},
    {SDE_CMD_READ, SDE_CLASS_READ, DP, R, 1, 0, 0, dev_block_io_start, NULL, "READ"},
    {SDE_CMD_WRITE, SDE_CLASS_WRITE, DP, W, 1, 0, 0, dev_block_io_start, NULL, "WRITE"},
    {SDE_CMD_FLUSH, SDE_CLASS_FLUSH, DP, 0, 1, 0, 0, dev_block_io_start, NULL, "FLUSH"},
    {SDE_CMD_WRITE_ZEROES, SDE_CLASS_ZERO, DP, 0, 1, 0, 0, dev_zero_start, NULL, "WRITE_ZEROES"},
    {SDE_CMD_DEALLOCATE, SDE_CLASS_ZERO, DP, 0, 1, 0, 0, dev_zero_start, NULL, "DEALLOCATE"},
    {SDE_CMD_COUNTERS, SDE_CLASS_NOP, DP, 0, 1, 0, 0, dev_counters_start, NULL, "COUNTERS"},
    /* admin commands: the control plane runs them (ssdemu/device/admin.py); not timed */
    {SDE_CMD_IDENTIFY, SDE_CLASS_ADMIN, SDE_RUN_HOST, 0, 0, 0, 0, dev_admin_start, NULL,
     "IDENTIFY"},
    {SDE_CMD_NS_CREATE, SDE_CLASS_ADMIN, SDE_RUN_HOST, 0, 0, 0, 0, dev_admin_start, NULL,
     "NS_CREATE"},
    {SDE_CMD_NS_DELETE, SDE_CLASS_ADMIN, SDE_RUN_HOST, 0, 0, 0, 0, dev_admin_start, NULL,
     "NS_DELETE"},
    {SDE_CMD_NS_LIST, SDE_CLASS_ADMIN, SDE_RUN_HOST, 0, 0, 0, 0, dev_admin_start, NULL,
     "NS_LIST"},
    {SDE_CMD_GET_LOG, SDE_CLASS_ADMIN, SDE_RUN_HOST, 0, 0, 0, 0, dev_admin_start, NULL,
     "GET_LOG"},
    /* KV commands against the store (dev_kv.c) */
    {SDE_CMD_KV_STORE, SDE_CLASS_KV, DP, W, 1, 1, 1, dev_kv_put_start, NULL, "KV_STORE"},
    {SDE_CMD_KV_RETRIEVE, SDE_CLASS_KV, DP, R, 1, 1, 1, dev_kv_get_start, NULL, "KV_RETRIEVE"},
    {SDE_CMD_KV_DELETE, SDE_CLASS_KV, DP, 0, 1, 1, 1, dev_kv_delete_start, NULL, "KV_DELETE"},
    {SDE_CMD_KV_EXIST, SDE_CLASS_KV, DP, 0, 1, 1, 1, dev_kv_exist_start, NULL, "KV_EXIST"},
    {SDE_CMD_KV_LIST, SDE_CLASS_KV, DP, 0, 1, 1, 0, dev_kv_list_start, NULL, "KV_LIST"},
    /* compute commands (dev_compute.c): the four with a firmware kernel join the virtual
     * clock's FIFO themselves, at once */
    {SDE_CMD_KV_STORE_QUANTIZED, SDE_CLASS_COMPUTE, DP, W, 0, 0, 1, dev_qstore_start,
     dev_qstore_kernel_done, "KV_STORE_QUANTIZED"},
    {SDE_CMD_KV_RETRIEVE_DEQUANTIZED, SDE_CLASS_COMPUTE, DP, R, 0, 0, 1, dev_dq_get_start,
     dev_dq_kernel_done, "KV_RETRIEVE_DEQUANTIZED"},
    {SDE_CMD_KV_REQUANTIZE, SDE_CLASS_COMPUTE, DP, W, 0, 0, 1, dev_requant_start,
     dev_requant_kernel_done, "KV_REQUANTIZE"},
    {SDE_CMD_PREFIX_MATCH, SDE_CLASS_COMPUTE, DP, 0, 1, 0, 0, dev_prefix_match_now, NULL,
     "PREFIX_MATCH"},
    {SDE_CMD_PREFIX_MATCH_TOKENS, SDE_CLASS_COMPUTE, DP, 0, 0, 0, 0, dev_prefix_tokens_start,
     dev_pm_tokens_kernel_done, "PREFIX_MATCH_TOKENS"},
    {SDE_CMD_PIN, SDE_CLASS_COMPUTE, DP, 0, 1, 1, 0, dev_pin_start, NULL, "PIN"},
    {SDE_CMD_UNPIN, SDE_CLASS_COMPUTE, DP, 0, 1, 1, 0, dev_pin_start, NULL, "UNPIN"},
    /* retrieval (ssdemu/device/retrieval.py): the daemon's retrieval worker runs them */
    {SDE_CMD_TOPK_PAGES, SDE_CLASS_COMPUTE, SDE_RUN_HOST, 0, 0, 0, 0, dev_retrieval_start,
     NULL, "TOPK_PAGES"},
    {SDE_CMD_ATTEND, SDE_CLASS_COMPUTE, SDE_RUN_HOST, 0, 0, 0, 0, dev_retrieval_start, NULL,
     "ATTEND"},
};
_Static_assert(sizeof(op_table) / sizeof(op_table[0]) == SDE_CMD_COUNT,
               "one row per opcode in sde_queue.h");

/* opcode -> its row + 1 (0: none); built once, so that a command's row is one load */
static uint8_t row_of[256];
static pthread_once_t row_once = PTHREAD_ONCE_INIT;

static void build_rows(void)
{
    for (uint32_t i = 0; i < SDE_CMD_COUNT; i++)
        row_of[op_table[i].op] = (uint8_t)(i + 1);
}

const struct dev_op *dev_op(uint32_t op)
{
    pthread_once(&row_once, build_rows);
    return op < 256 && row_of[op] ? &op_table[row_of[op] - 1] : NULL;
}

int sde_dev_opcode_class(uint32_t op)
{
    const struct dev_op *r = dev_op(op);
    return r ? r->cls : SDE_CLASS_INVALID;
}

int sde_dev_opcode_where(uint32_t op)
{
    const struct dev_op *r = dev_op(op);
    return r ? r->where : -1;
}

int sde_dev_opcode_info(uint32_t op, sde_opcode_info *out)
{
    const struct dev_op *r = dev_op(op);
    if (!r)
        return -ENOENT;
    memset(out, 0, sizeof(*out));
    out->op = r->op;
    out->cls = r->cls;
    out->where = r->where;
    out->fault_dir = r->fault_dir;
    out->in_turn = r->in_turn;
    out->needs_store = r->needs_store;
    out->keyed = r->keyed;
    out->has_start = r->start != NULL;
    out->has_kernel_done = r->kernel_done != NULL;
    snprintf(out->name, sizeof(out->name), "%s", r->name);
    return 0;
}

/* dev_start_command's second half: the command, now, by its row of the opcode table. */
void dev_start_now(sde_dev *dev, int qp, const sde_sqe *c, const struct dev_op *r, uint64_t t0)
{
    if (r->needs_store && !dev->store)
        dev_finish(dev, qp, r->cls, c->cid, SDE_SC_INTERNAL, 0, 0, t0);
    else
        r->start(dev, qp, c, r->cls, t0);
}
