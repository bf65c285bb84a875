/*
 * The timing recipes of the commands the firmware transforms between the NAND and the link,
 * over the timing model (sde_model.h) and the firmware's budget (sde_budget.h): one
 * definition for the daemon's data plane (c/dev), which runs each recipe's halves around
 * its kernel, and for model-mode replay (ssdemu/replay/model_mode.py), which runs them whole, a request's
 * blocks per call.
 */
#ifndef SDE_RECIPE_H
#define SDE_RECIPE_H
#include <stdint.h>

#include "sde_budget.h"
#include "sde_model.h"

/* CDEF-BEGIN */
/* A dequantized retrieve, at its submission: the compressed block (nbytes at off) sensed into
 * the controller; returns when the kernel may start (on the first of *pieces pieces); *sensed:
 * when the last piece is in. */
double sde_recipe_dq_sense(sde_model *m, double submit, uint64_t off, uint64_t nbytes,
                           double *sensed, uint32_t *pieces);
/* ...and once the kernel has run: charged from `ready`, ending no earlier than the last piece
 * sensed plus one piece of its work; the result (out_bytes) over the link from its first
 * piece.  Returns the completion. */
double sde_recipe_dq_finish(sde_model *m, sde_budget *b, double ready, double sensed,
                            uint32_t pieces, sde_kernel_cost cost, double host_ns,
                            uint64_t out_bytes);
/* A quantized store, at its submission: the raw block received into the controller; returns
 * when the kernel may start (on the first of *pieces pieces); *received: when the last piece
 * is in. */
double sde_recipe_q_receive(sde_model *m, double submit, uint64_t raw, double *received,
                            uint32_t *pieces);
/* ...once the kernel has run: charged from `ready`, ending no earlier than the last piece
 * received plus one piece of its work.  Returns its end; *first: when its first piece is out
 * (the program may start). */
double sde_recipe_q_kernel(sde_budget *b, double ready, double received, uint32_t pieces,
                           sde_kernel_cost cost, double host_ns, double *first);
/* The same for any kernel that streams over its input's pieces (a requantize's over the
 * stored block's senses). */
double sde_recipe_streamed_kernel(sde_budget *b, int kernel, double ready, double received,
                                  uint32_t pieces, sde_kernel_cost cost, double host_ns,
                                  double *first);
/* ...and its result (stored bytes at off) programmed streaming from *first: when the last
 * piece is programmed; *leaving (NULL: not wanted): what leaves the write cache then
 * (sde_model_cache_ack). */
double sde_recipe_q_program(sde_model *m, double first, double ended, uint32_t pieces,
                            uint64_t off, uint64_t stored, uint64_t *leaving);

/* Model mode, a request's blocks at once (offs[n]), all submitted at t.  Loads: in_drive,
 * each sensed, dequantized and sent (raw bytes) streaming; otherwise a plain read of the
 * stored bytes.  Returns the last completion. */
double sde_recipe_load_blocks(sde_model *m, sde_budget *b, double t, const uint64_t *offs,
                              uint32_t n, uint64_t stored, uint64_t raw, int in_drive,
                              sde_kernel_cost cost);
/* Stores: quantized, each raw block received, quantized and programmed; otherwise a plain
 * write of the stored bytes.  done[i]: when block i is programmed (or acknowledged). */
void sde_recipe_store_blocks(sde_model *m, sde_budget *b, double t, const uint64_t *offs,
                             uint32_t n, uint64_t stored, uint64_t raw, int quantized,
                             sde_kernel_cost cost, double *done);
/* CDEF-END */
#endif
