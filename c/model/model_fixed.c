/* The fixed-latency model (`--timing fixed`): every command takes a fixed time from its
 * submission (by default the detailed model's unloaded 4 KiB latencies: ssdemu/sim/timing.py),
 * with no contention; the same interface as the detailed model (struct model_ops). */
#define _GNU_SOURCE
#include "model_private.h"

static double fixed_read(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    return submit + m->p.fixed_read_ns;
}

static double fixed_transfer(sde_model *m, double ready, uint64_t nbytes) { return ready; }

static double fixed_receive(sde_model *m, double submit, uint64_t nbytes) { return submit; }

static double fixed_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                            uint64_t *leaving)
{
    return ready + m->p.fixed_write_ns;
}

static double fixed_write(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    m->nand_written += nbytes;
    m->link_bytes += nbytes;
    return submit + m->p.fixed_write_ns;
}

static double fixed_other(sde_model *m, double submit) { return submit + m->p.fixed_other_ns; }

const struct model_ops model_fixed_ops = {
    .read = fixed_read, .sense = fixed_read, .transfer = fixed_transfer,
    .receive = fixed_receive, .program = fixed_program, .write = fixed_write,
    .flush = fixed_other, .nop = fixed_other, .streams = 0,
};
