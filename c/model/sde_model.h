/*
 * The device timing model (see ssdemu/sim/timing.py for the formulas and docs/architecture.md):
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
    /* firmware latency per command (NVMeVirt's FW_4KB_READ_LATENCY and write-buffer latency):
     * a read's NAND work starts this long after its controller stage; a write is
     * acknowledged this long after its data is in the cache.  A pipeline delay, not a held
     * resource: it adds to latency, not to a core's occupancy. */
    double read_latency_ns;
    double write_latency_ns;
    /* the controller's program path: data goes to the NAND at most this fast (its power
     * budget and write datapath: a drive cannot program every die at once; 0: no limit) */
    double program_bytes_per_s;
    /* The controller's DRAM (0: not modelled): host writes and a quantized store's input land
     * in it, programs and dequantized results leave from it, sensed blocks the firmware
     * transforms land in it, and the firmware's kernels move their bytes in it (the budget,
     * sde_budget_share_dram).  Plain reads stream through the controller's SRAM. */
    double dram_bytes_per_s;
    /* block erase (tBERS), charged to every die when GC erases a line */
    double t_erase_ns;
    /* The FTL (0 logical bytes: none; writes land where their offset says, as on a drive
     * that never fills).  It maps ftl_logical_bytes in 4 KiB units onto ftl_lines lines
     * (superblocks: ftl_rows_per_die multi-plane rows on every die) in units of
     * ftl_unit_bytes, GC below
     * ftl_gc_free_lines free lines.  A declared scale: a line at scale holds fewer rows than
     * a real block, so an erase is charged ftl_erase_share of t_erase_ns (rows at scale /
     * pages per real block), which keeps erase time per programmed byte. */
    uint64_t ftl_logical_bytes;
    uint32_t ftl_unit_bytes; /* the mapping unit: 4 KiB, or more at scale (at most a row) */
    uint32_t ftl_lines;
    uint32_t ftl_rows_per_die;
    uint32_t ftl_gc_free_lines;
    double ftl_erase_share;
} sde_model_params;

typedef struct sde_model_stats {
    double horizon_ns;        /* the latest submission seen */
    double link_busy_ns;      /* device to host (reads) */
    double link_in_busy_ns;   /* host to device (writes): PCIe is full duplex */
    double channel_busy_ns;   /* summed over channels */
    double die_busy_ns;       /* summed over dies */
    double controller_busy_ns;
    double dram_busy_ns;
    uint64_t nand_bytes_read;
    uint64_t nand_bytes_written;
    uint64_t link_bytes;
    uint64_t gaps;            /* idle gaps kept over all resources (the model's own cost) */
    double busy_until_ns;     /* the latest time any resource is booked until */
    /* the FTL (all 0 without one) */
    uint64_t ftl_logical_bytes;
    uint64_t ftl_lines, ftl_free_lines;
    uint64_t host_bytes_programmed; /* host data (and KV stores) written to NAND */
    uint64_t gc_bytes_programmed;   /* data GC relocated */
    uint64_t padding_bytes;         /* row space a flush or a write-through left unfilled */
    uint64_t erases;                /* lines erased (each on every die) */
    uint64_t trimmed_bytes;
    uint64_t ftl_valid_bytes;       /* mapped units, in bytes */
    double write_amplification;     /* NAND bytes programmed / host bytes programmed */
    double gc_ns;                   /* die time GC booked (senses, programs, erases), summed */
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
/* n senses submitted at `submit` (offs[i], lens[i], in order): the latest completion, or -1
 * as sde_model_sense: a retrieval command's runs of pages in one call, not one from
 * Python per run. */
double sde_model_sense_runs(sde_model *m, double submit, const uint64_t *offs,
                            const uint64_t *lens, uint32_t n);
/* Runs of the media (offs[i], lens[i], any order) as the drive reads them, in place: sorted
 * by offset, and runs that overlap, touch, or begin in the NAND page (of `page` bytes) where
 * the runs before them end joined into one read (a page is sensed once; the bytes between
 * are transferred with it).  Returns the reads (the first ones of offs and lens), or
 * -ENOMEM. */
int64_t sde_runs_join(uint64_t *offs, uint64_t *lens, uint32_t n, uint64_t page);
double sde_model_transfer(sde_model *m, double ready, uint64_t nbytes);
double sde_model_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes);
/* ...and with *leaving (NULL: not wanted): the bytes whose programs it booked, which leave
 * the write cache when they are done (sde_model_cache_ack): with an FTL, the rows it completed
 * (a write that leaves its row partial stays in the cache until a later write completes the
 * row, whose program then takes the row's bytes out); without one, the write itself. */
double sde_model_program_leaving(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                                 uint64_t *leaving);
/* Streaming (a dequantized retrieve: sensed, dequantized and sent piece by piece, as a
 * controller does): a transfer of nbytes in `pieces` pieces whose first piece is ready at
 * `first` and whose producer ends at `prev_end`: the link is booked from `first`, and the last
 * piece leaves no earlier than the producer's end plus one piece's time on the link.  pieces:
 * sde_model_pieces, a row per channel at a time (at most 64). */
double sde_model_transfer_streamed(sde_model *m, double first, double prev_end, uint32_t pieces,
                                   uint64_t nbytes);
uint32_t sde_model_pieces(const sde_model *m, uint64_t nbytes);
/* The same for a program: nbytes from the controller programmed from `first` (its first
 * piece ready) on, its last piece no earlier than the producer's end `prev_end`; *leaving as
 * for sde_model_program_leaving. */
double sde_model_program_streamed(sde_model *m, double first, double prev_end, uint32_t pieces,
                                  uint64_t offset, uint64_t nbytes, uint64_t *leaving);
/* A write in two halves (sde_model_write is the one after the other): its stages up to its
 * programs (*arrived: when its data is in the controller; *leaving: as for
 * sde_model_program_leaving; -1 before the latest submission; not for a fixed-latency
 * model), and its acknowledgement, given when it is programmed. */
double sde_model_write_programmed(sde_model *m, double submit, uint64_t offset,
                                  uint64_t nbytes, double *arrived, uint64_t *leaving);
double sde_model_write_ack(sde_model *m, double arrived, double programmed, uint64_t nbytes,
                           uint64_t leaving);
/* Batches: n bulk transfers of nbytes at offs[i] whose dies are booked die by die, the rest
 * block by block, every time identical to booking them one after the other (so that the dies
 * can be shared between threads: sde_model_set_threads).  Each returns -1 when the batch
 * cannot be taken (a fixed-latency model, an FTL, a transfer on the page path, an earlier
 * submission), having booked nothing.
 * Reads: read_batch books the controller and the senses of all n, submitted at `submit`;
 * then read_batched(i, sense), for i = 0..n-1 in order, books the rest of block i and
 * returns what sde_model_sense (sense) or sde_model_read would have.
 * Programs: after defer_dies (the n commands submitted at `submit`), the next n bulk
 * programs (sde_model_program*, sde_model_write_programmed, in that order) book all but their dies and return a partial
 * time; run_deferred books the dies and raises programmed[i] (block i's partial time) to
 * block i's completion. */
/* Threads for a batch's dies: 1 (the default) or 2 (a helper thread books half of them, on
 * a host with two CPUs or more; it spins between batches, so ask for it where a core is
 * free for it: a single replay, not cells of a sweep running side by side). */
void sde_model_set_threads(sde_model *m, uint32_t threads);
int sde_model_read_batch(sde_model *m, double submit, const uint64_t *offs, uint32_t n,
                         uint64_t nbytes);
double sde_model_read_batched(sde_model *m, uint32_t i, int sense);
int sde_model_defer_dies(sde_model *m, double submit, const uint64_t *offs, uint32_t n,
                         uint64_t nbytes);
void sde_model_run_deferred(sde_model *m, double *programmed);
/* With the write cache: when nbytes that arrived at `arrived` and are programmed at
 * `programmed` may be acknowledged (the cache's room, as for a write); `leaving`: the bytes
 * that leave the cache at `programmed` (what the program gave in *leaving). */
double sde_model_cache_ack(sde_model *m, double arrived, double programmed, uint64_t nbytes,
                           uint64_t leaving);
double sde_model_nop(sde_model *m, double submit);
/* nbytes through the controller's DRAM from `ready` on (its bandwidth shared with the DMA
 * the model books there): when they are through; `ready` when it has no DRAM. */
double sde_model_dram(void *m, double ready, uint64_t nbytes);
/* Forget the whole 4 KiB units in [offset, offset + nbytes) (a deallocate, a KV delete): the
 * FTL no longer relocates them (whole mapping units).  No time (the map changes in the controller's DRAM). */
void sde_model_trim(sde_model *m, uint64_t offset, uint64_t nbytes);
/* sde_model_trim of n ranges of nbytes each, from offsets[0] on, in order (a replay's evicted
 * blocks: one call per request, not one per block). */
void sde_model_trim_many(sde_model *m, const uint64_t *offsets, uint32_t n, uint64_t nbytes);
void sde_model_get_stats(const sde_model *m, sde_model_stats *out);
/* The latest submission seen (what get_stats reports, without its walk over every plane). */
double sde_model_horizon(const sde_model *m);
/* Every resource's next-free time, in the order controller cores, dies, channels, link;
 * returns how many (call with max 0 to count). */
uint32_t sde_model_next_free(const sde_model *m, double *out, uint32_t max);

/* A closed loop in virtual time (fio's iodepth against the model): `qd` commands always in
 * flight from `start` on, each completion submitting the next at its completion time; n
 * commands of nbytes (write: 1, else reads), sequential from 0 wrapping at span (seed 0) or
 * at uniformly random nbytes-aligned offsets below span (xorshift64 from seed).  marks[i]
 * gets the time by which (i + 1) * n / nmarks commands had completed (the rate over any
 * interval of the run); returns the last completion, or -1 on a bad argument. */
double sde_model_closed_loop(sde_model *m, int write, uint32_t qd, uint64_t n, uint64_t nbytes,
                             uint64_t span, uint64_t seed, double start, double *marks,
                             uint32_t nmarks);

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
