/* The transformed commands' timing recipes (sde_recipe.h). */
#include "sde_recipe.h"

#include <stddef.h>

double sde_recipe_dq_sense(sde_model *m, double submit, uint64_t off, uint64_t nbytes,
                           double *sensed, uint32_t *pieces)
{
    *sensed = sde_model_sense(m, submit, off, nbytes);
    *pieces = sde_model_pieces(m, nbytes);
    if (*sensed < 0)
        return *sensed;
    return submit + (*sensed - submit) / *pieces; /* the first piece is in */
}

double sde_recipe_dq_finish(sde_model *m, sde_budget *b, double ready, double sensed,
                            uint32_t pieces, sde_kernel_cost cost, double host_ns,
                            uint64_t out_bytes)
{
    double start;
    double done = sde_budget_charge(b, SDE_KERNEL_DEQUANTIZE, cost, ready, host_ns, &start);
    if (!m)
        return done;
    double piece = (done - start) / (pieces ? pieces : 1);
    if (sensed + piece > done)
        done = sensed + piece;
    return sde_model_transfer_streamed(m, start + piece, done, pieces, out_bytes);
}

double sde_recipe_q_program(sde_model *m, sde_budget *b, double ready, sde_kernel_cost cost,
                            double host_ns, uint64_t off, uint64_t stored, double *ended)
{
    *ended = sde_budget_charge(b, SDE_KERNEL_QUANTIZE, cost, ready, host_ns, NULL);
    return m ? sde_model_program(m, *ended, off, stored) : *ended;
}

double sde_recipe_load_blocks(sde_model *m, sde_budget *b, double t, const uint64_t *offs,
                              uint32_t n, uint64_t stored, uint64_t raw, int in_drive,
                              sde_kernel_cost cost)
{
    double last = t;
    for (uint32_t i = 0; i < n; i++) {
        double done;
        if (in_drive) {
            double sensed;
            uint32_t pieces;
            double ready = sde_recipe_dq_sense(m, t, offs[i], stored, &sensed, &pieces);
            done = sde_recipe_dq_finish(m, b, ready, sensed, pieces, cost, 0.0, raw);
        } else {
            done = sde_model_read(m, t, offs[i], stored);
        }
        if (done > last)
            last = done;
    }
    return last;
}

void sde_recipe_store_blocks(sde_model *m, sde_budget *b, double t, const uint64_t *offs,
                             uint32_t n, uint64_t stored, uint64_t raw, int quantized,
                             sde_kernel_cost cost, double *done)
{
    for (uint32_t i = 0; i < n; i++) {
        if (quantized) {
            double ended;
            double arrived = sde_model_receive(m, t, raw);
            done[i] = sde_recipe_q_program(m, b, arrived, cost, 0.0, offs[i], stored, &ended);
        } else {
            done[i] = sde_model_write(m, t, offs[i], stored);
        }
    }
}
