/*
 * The firmware's threads: the data plane hands compute jobs (quantize, dequantize, prefix
 * hash) to a pool of pthreads, which call the firmware's compiled entry points
 * (firmware/entry.py: Numba cfuncs, no Python object, no GIL) and hand the jobs back.
 * The data plane keeps serving I/O meanwhile; a finished job kicks its doorbell.
 */
#ifndef SDE_FW_H
#define SDE_FW_H
#include <pthread.h>
#include <stdint.h>

/* CDEF-BEGIN */
#define SDE_FW_MAX_THREADS 16
/* what an entry point tells about a block (firmware/entry.py INFO_*) */
#define SDE_FW_INFO_ELEMENTS 0
#define SDE_FW_INFO_ELEMENT_BYTES 1
#define SDE_FW_INFO_KIND 2
#define SDE_FW_INFO_GROUP 3
#define SDE_FW_INFO_BITS 4
#define SDE_FW_INFO_COMPRESSED 5
#define SDE_FW_INFO_RAW 6
#define SDE_FW_INFO_SUMMARY_BYTES 7 /* quantize: the page summaries' bytes in the block */
/* requantize: the stored block's kind and group (the fields above describe the new one) */
#define SDE_FW_INFO_FROM_KIND 8
#define SDE_FW_INFO_FROM_GROUP 9
#define SDE_FW_INFO_SLOTS 12 /* an info array's length */
/* the entry points' failures (firmware/blockops.py E_*); -1..-9: a corrupt block */
#define SDE_FW_E_OUT_SMALL -10
#define SDE_FW_E_NONFINITE -11
#define SDE_FW_E_REQUEST -12
#define SDE_FW_E_VALUE_SIZE -13
#define SDE_FW_E_SCHEME -14
#define SDE_FW_E_UNAVAILABLE -15 /* the firmware's compiled code could not be loaded */
/* requantize: the scheme is not below the stored block's (fewer bits, a smaller block) */
#define SDE_FW_E_NOT_LOWER -16

/* Where the entry points come from when sde_dev_set_firmware is given none: a loader
 * called once, on the first command that needs one (ssdemu/device/daemon.py's imports the
 * compiled firmware then, so that a daemon no compute command reaches never loads Numba),
 * filling quantize, dequantize, hash_chain and requantize's addresses; 0 or -errno. */
void sde_fw_set_loader(int (*loader)(uint64_t *addresses));
/* CDEF-END */

typedef int64_t (*sde_fw_quantize_fn)(const uint8_t *req, const uint8_t *src, int64_t src_len,
                                      uint8_t *out, int64_t out_cap, int64_t *info);
typedef int64_t (*sde_fw_dequantize_fn)(const uint8_t *blob, int64_t blob_len, uint8_t *out,
                                        int64_t out_cap, int64_t *info);
typedef int64_t (*sde_fw_hash_fn)(const uint32_t *tokens, int64_t ntokens,
                                  int64_t block_tokens, const uint8_t *root, uint8_t *keys);
/* name: the new scheme's 32 bytes (ASCII, NUL-padded); blob: the stored block */
typedef int64_t (*sde_fw_requantize_fn)(const uint8_t *name, const uint8_t *blob,
                                        int64_t blob_len, uint8_t *out, int64_t out_cap,
                                        int64_t *info);

typedef struct sde_fw_entry {
    sde_fw_quantize_fn quantize;
    sde_fw_dequantize_fn dequantize;
    sde_fw_hash_fn hash_chain;
    sde_fw_requantize_fn requantize;
} sde_fw_entry;

enum { SDE_FW_QUANTIZE = 1, SDE_FW_DEQUANTIZE = 2, SDE_FW_HASH = 3, SDE_FW_REQUANTIZE = 4 };

typedef struct sde_fw_job {
    int kind;
    const uint8_t *in;   /* quantize: the block; dequantize and requantize: the compressed
                          * block; hash: the token ids */
    int64_t in_len;      /* bytes (hash: token count) */
    uint8_t *out;
    int64_t out_cap;
    const uint8_t *req;  /* quantize: the 64-byte request; hash: the 16-byte root key;
                          * requantize: the new scheme's 32-byte name */
    int64_t block_tokens;
    int64_t ret;         /* the entry point's return */
    int64_t info[SDE_FW_INFO_SLOTS];
    uint64_t host_ns;    /* the call's time on this host */
    uint32_t owner;      /* the data plane's context */
    struct sde_fw_job *next;
} sde_fw_job;

typedef struct sde_fw sde_fw;

/* The entry points in *entry, loaded first if they are not (thread-safe; the first call
 * runs the loader): 0, or -errno when they cannot be had. */
int sde_fw_ensure(sde_fw_entry *entry);

/* threads: 1..SDE_FW_MAX_THREADS; done_fd: an eventfd kicked when a job is done.  An
 * entry with no entry points loads them (sde_fw_ensure) before its first job. */
int sde_fw_new(const sde_fw_entry *entry, uint32_t threads, int done_fd, sde_fw **out);
void sde_fw_free(sde_fw *fw);           /* waits for the jobs queued to finish */
void sde_fw_submit(sde_fw *fw, sde_fw_job *job);
sde_fw_job *sde_fw_take_done(sde_fw *fw); /* every finished job, as a list (NULL: none) */
uint32_t sde_fw_pending(sde_fw *fw);    /* submitted, not yet taken back */
#endif
