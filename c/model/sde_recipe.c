/* The transformed commands' timing recipes (sde_recipe.h). */
#include "sde_recipe.h"

#include <stddef.h>
#include <stdlib.h>

/* when the first of `pieces` pieces sensed or received from `submit` on is in */
static double first_piece(double submit, double last, uint32_t pieces)
{
    return submit + (last - submit) / pieces;
}

double sde_recipe_dq_sense(sde_model *m, double submit, uint64_t off, uint64_t nbytes,
                           double *sensed, uint32_t *pieces)
{
    *sensed = sde_model_sense(m, submit, off, nbytes);
    *pieces = sde_model_pieces(m, nbytes);
    if (*sensed < 0)
        return *sensed;
    return first_piece(submit, *sensed, *pieces);
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

double sde_recipe_q_receive(sde_model *m, double submit, uint64_t raw, double *received,
                            uint32_t *pieces)
{
    *received = sde_model_receive(m, submit, raw);
    *pieces = sde_model_pieces(m, raw);
    if (*received < 0)
        return *received;
    return first_piece(submit, *received, *pieces);
}

double sde_recipe_q_kernel(sde_budget *b, double ready, double received, uint32_t pieces,
                           sde_kernel_cost cost, double host_ns, double *first)
{
    return sde_recipe_streamed_kernel(b, SDE_KERNEL_QUANTIZE, ready, received, pieces, cost,
                                      host_ns, first);
}

double sde_recipe_streamed_kernel(sde_budget *b, int kernel, double ready, double received,
                                  uint32_t pieces, sde_kernel_cost cost, double host_ns,
                                  double *first)
{
    double start;
    double done = sde_budget_charge(b, kernel, cost, ready, host_ns, &start);
    double piece = (done - start) / (pieces ? pieces : 1);
    if (received + piece > done)
        done = received + piece;
    *first = start + piece;
    return done;
}

double sde_recipe_q_program(sde_model *m, double first, double ended, uint32_t pieces,
                            uint64_t off, uint64_t stored, uint64_t *leaving)
{
    return sde_model_program_streamed(m, first, ended, pieces, off, stored, leaving);
}

/* A request's blocks are booked as a batch of the model's (sde_model.h: its dies die by die,
 * the rest block by block, every time identical) when the model can take one. */
double sde_recipe_load_blocks(sde_model *m, sde_budget *b, double t, const uint64_t *offs,
                              uint32_t n, uint64_t stored, uint64_t raw, int in_drive,
                              sde_kernel_cost cost)
{
    double last = t;
    int batched = sde_model_read_batch(m, t, offs, n, stored) == 0;
    for (uint32_t i = 0; i < n; i++) {
        double done;
        if (in_drive) {
            double sensed, ready;
            uint32_t pieces;
            if (batched) {
                sensed = sde_model_read_batched(m, i, 1);
                pieces = sde_model_pieces(m, stored);
                ready = first_piece(t, sensed, pieces);
            } else {
                ready = sde_recipe_dq_sense(m, t, offs[i], stored, &sensed, &pieces);
            }
            done = sde_recipe_dq_finish(m, b, ready, sensed, pieces, cost, 0.0, raw);
        } else {
            done = batched ? sde_model_read_batched(m, i, 0) : sde_model_read(m, t, offs[i], stored);
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
    /* a batch's plain writes are acknowledged once their dies are booked */
    double *arrived = quantized ? NULL : malloc(n * sizeof(double));
    uint64_t *leaving = quantized ? NULL : malloc(n * sizeof(uint64_t));
    int batched = (quantized || (arrived && leaving)) &&
                  sde_model_defer_dies(m, t, offs, n, stored) == 0;
    for (uint32_t i = 0; i < n; i++) {
        if (quantized) {
            double received, first;
            uint32_t pieces;
            double ready = sde_recipe_q_receive(m, t, raw, &received, &pieces);
            double ended = sde_recipe_q_kernel(b, ready, received, pieces, cost, 0.0, &first);
            done[i] = sde_recipe_q_program(m, first, ended, pieces, offs[i], stored, NULL);
        } else if (batched) {
            done[i] = sde_model_write_programmed(m, t, offs[i], stored, &arrived[i],
                                                 &leaving[i]);
        } else {
            done[i] = sde_model_write(m, t, offs[i], stored);
        }
    }
    if (batched) {
        sde_model_run_deferred(m, done);
        for (uint32_t i = 0; !quantized && i < n; i++)
            done[i] = sde_model_write_ack(m, arrived[i], done[i], stored, leaving[i]);
    }
    free(arrived);
    free(leaving);
}
