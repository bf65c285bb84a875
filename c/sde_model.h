/*
 * The device timing model (see ssdemu/timing.py for the formulas and docs/architecture.md):
 * pure arithmetic over next-free times per resource, no I/O and no clock.  One definition in
 * C, so that the data plane can time every command at full speed; Python wraps it.
 */
#ifndef SDE_MODEL_H
#define SDE_MODEL_H
#include <stdint.h>

/* CDEF-BEGIN */
typedef struct sde_model_params {
    double link_bytes_per_s;
    double link_latency_ns;
    uint32_t channels;
    uint32_t dies_per_channel;
    uint32_t planes_per_die;
    uint32_t page_bytes;
    double t_read_ns;
    double t_prog_ns;
    double channel_bytes_per_s;
    uint32_t cores;
    double command_overhead_ns;
    int32_t write_cache;
    /* the simple model beside the detailed one: every command takes a fixed time */
    int32_t fixed;
    double fixed_read_ns;
    double fixed_write_ns;
    double fixed_other_ns;
    /* transfers of at least this many pages take the bulk path: one booking per plane touched,
     * per channel and on the link instead of three per page (0: never) */
    uint32_t bulk_pages;
    /* the volatile write cache's size (with write_cache): a write is acknowledged once its
     * data is in the cache, and the cache holds this many bytes not yet programmed; a write
     * that finds it full waits for programs to make room (0: no bound) */
    uint64_t write_cache_bytes;
} sde_model_params;

typedef struct sde_model_stats {
    double horizon_ns;        /* the latest submission seen */
    double link_busy_ns;      /* device to host (reads) */
    double link_in_busy_ns;   /* host to device (writes): PCIe is full duplex */
    double channel_busy_ns;   /* summed over channels */
    double plane_busy_ns;     /* summed over planes */
    double controller_busy_ns;
    uint64_t nand_bytes_read;
    uint64_t nand_bytes_written;
    uint64_t link_bytes;
    uint64_t gaps;            /* idle gaps kept over all resources (the model's own cost) */
    double busy_until_ns;     /* the latest time any resource is booked until */
} sde_model_stats;

typedef struct sde_model sde_model;

int sde_model_new(const sde_model_params *p, sde_model **out);
void sde_model_free(sde_model *m);
/* Completion times (ns) of commands submitted at `submit` (ns, non-decreasing: an earlier
 * one returns -1). */
double sde_model_read(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
double sde_model_write(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
double sde_model_flush(sde_model *m, double submit);
/* The stages of commands whose data the drive's firmware transforms in between (a quantized
 * store: receive, quantize, program; a dequantized retrieve: sense, dequantize, transfer).
 * sense: the controller, the senses and the channels, without the link; receive: the
 * controller and the link, without the NAND; transfer and program continue a command at
 * `ready` (the link plus its latency; the channels and the programs). */
double sde_model_sense(sde_model *m, double submit, uint64_t offset, uint64_t nbytes);
double sde_model_receive(sde_model *m, double submit, uint64_t nbytes);
double sde_model_transfer(sde_model *m, double ready, uint64_t nbytes);
double sde_model_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes);
/* With the write cache: when nbytes that arrived at `arrived` and are programmed at
 * `programmed` may be acknowledged (the cache's room, as for a write). */
double sde_model_cache_ack(sde_model *m, double arrived, double programmed, uint64_t nbytes);
double sde_model_nop(sde_model *m, double submit);
void sde_model_get_stats(const sde_model *m, sde_model_stats *out);
/* The latest submission seen (what get_stats reports, without its walk over every plane). */
double sde_model_horizon(const sde_model *m);
/* Every resource's next-free time, in the order controller cores, planes, channels, link;
 * returns how many (call with max 0 to count). */
uint32_t sde_model_next_free(const sde_model *m, double *out, uint32_t max);

/* One resource alone (for tests of the gap rule). */
typedef struct sde_resource sde_resource;
sde_resource *sde_resource_new(void);
void sde_resource_free(sde_resource *r);
double sde_resource_hold(sde_resource *r, double ready, double duration);
void sde_resource_forget_before(sde_resource *r, double t);
uint32_t sde_resource_gaps(const sde_resource *r);
double sde_resource_next_free(const sde_resource *r);
/* CDEF-END */
#endif
