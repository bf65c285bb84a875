/*
 * ssdemu queue pairs: the command layout and the shared-memory rings between a host client
 * and the device daemon.  This header is the one definition of both; the block between
 * CDEF-BEGIN and CDEF-END is read by cffi, and ssdemu_wire/layout.py derives its numpy
 * views from the compiled structs (a test checks sizes and offsets on both sides).
 *
 * A queue pair is one shared memory region (a memfd the daemon creates and passes to the
 * client):  [sde_ring_hdr][SQ: sq_entries x sde_sqe][CQ: cq_entries x sde_cqe].
 * Entries are powers of two; indices are free-running uint32 (masked on use).
 *   SQ: the client produces (writes entries, then sq_tail with release); the daemon consumes
 *       (reads sq_tail with acquire, copies each SQE out once, then sq_head with release).
 *   CQ: the daemon produces (cq_tail), the client consumes (cq_head).
 * Each index sits on its own cache line, written by one side only.  The daemon never trusts
 * the header: it keeps its own copy of the sizes and its own head/tail, and reads only the
 * client's sq_tail and cq_head, which it checks against the ring size.
 * Doorbells: the daemon sets SDE_SQF_NEED_WAKEUP in sq_flags before it sleeps on its eventfd;
 * the client, after publishing sq_tail, does a full fence and kicks the eventfd only if the
 * flag is set (the SQPOLL handshake of io_uring).  The mirror image wakes a sleeping client:
 * cq_waiters, the number of the client's waiters asleep on its completion eventfd (blocking
 * waits and an event loop's arming each hold one), signalled by the daemon while nonzero.
 * A count, not a flag: no waiter's leaving can take away another's wake-ups.
 */
#ifndef SDE_QUEUE_H
#define SDE_QUEUE_H
#include <stdint.h>

/* CDEF-BEGIN */
#define SDE_PROTOCOL_VERSION 1
#define SDE_RING_MAGIC 0x53444551

/* opcodes */
#define SDE_CMD_NOP 0
#define SDE_CMD_READ 1
#define SDE_CMD_WRITE 2
#define SDE_CMD_FLUSH 3
#define SDE_CMD_WRITE_ZEROES 4
#define SDE_CMD_DEALLOCATE 5
/* COUNTERS: the drive model's books as they stand at the command's turn, written to the
 * buffer as an sde_counters (result: its size).  On the virtual clock it waits behind the
 * compute commands fetched before it, as every command does, so it reads what every command
 * fetched before it booked and nothing fetched after: a client learns what its commands
 * cost without waiting for them to complete.  It books nothing itself.  An admin's (the whole
 * drive's books, as GET_LOG's counters page); namespace 0. */
#define SDE_CMD_COUNTERS 6
#define SDE_CMD_IDENTIFY 16
#define SDE_CMD_NS_CREATE 17
#define SDE_CMD_NS_DELETE 18
#define SDE_CMD_NS_LIST 19
#define SDE_CMD_GET_LOG 20
/* KV commands (the NVMe KV command set's Store, Retrieve, Delete, Exist, List): the key is
 * lba (bytes 0-7) and key_hi (bytes 8-15), its length in param1 (1..16); Store's option in
 * param0 (1 only if the key exists, 2 only if it does not); Delete's param0 may be
 * SDE_KV_DELETE_FORCE. */
#define SDE_CMD_KV_STORE 32
#define SDE_CMD_KV_RETRIEVE 33
#define SDE_CMD_KV_DELETE 34
#define SDE_CMD_KV_EXIST 35
#define SDE_CMD_KV_LIST 36
/* Compute commands, run by the in-drive firmware under the TOPS budget:
 * KV_STORE_QUANTIZED: the buffer holds an sde_quant_req (64 bytes: magic SQRQ, element
 *   dtype, layout, scheme name, block shape, and the tokens per page of the page summaries to
 *   keep with it, 0 for none) and the raw KV block; the drive quantizes it and stores the compressed block, with
 *   its page summaries after the body, under the key (KV_RETRIEVE returns that block).
 * KV_RETRIEVE_DEQUANTIZED: the drive dequantizes the stored block into the buffer.
 * PREFIX_MATCH: the buffer holds N 16-byte keys; result = the leading run present.
 * PREFIX_MATCH_TOKENS: the buffer holds a 16-byte root key and token ids (uint32), param0 the
 *   block size in tokens; the drive hashes the chain itself, then matches.
 * PIN / UNPIN: a 16-byte key that in-flight work uses is never evicted.
 * TOPK_PAGES: the buffer holds an sde_retrieval_req, the sequence's block keys (nkeys x 16
 *   bytes, each key_len long, zero-padded) and one layer's queries (float32, q_heads x
 *   head_dim); the drive scores every page of every KV head by its summary (Quest: the
 *   per-channel min and max of its keys), keeps the k best per KV head (optionally re-ranked
 *   among rerank x k candidates, half by that bound and half by a channel-selective score,
 *   by each page's exact share of a query head's attention over them: the scores are then
 *   those log shares) and writes page ids (int32, kv_heads x k, -1 past the candidates)
 *   then their scores (float32) to the output range:
 *   param0 = output buffer handle << 40 | offset, param1 = its length.  Result: the pages.
 * ATTEND: the same request, then page ids (int32, kv_heads x k; -1: none); the drive attends
 *   each query head over those pages (plus the sink and recent pages) and writes the outputs
 *   (float32, q_heads x head_dim) then the log-sum-exps (float32, q_heads) to the output
 *   range.  Result: the pages attended per KV head, at most.
 * KV_REQUANTIZE: the key's stored compressed block rewritten in place at a lower scheme (the
 *   buffer range holds the scheme's name, ASCII, 1..32 bytes): the drive reads it, dequantizes
 *   and quantizes it again (its page summaries recomputed) and stores the result under the
 *   key as a put does, journaled, unless the key changed meanwhile (then ABORTED, the newer
 *   value kept).  INVALID_FIELD: not a compressed block, a scheme that is unknown, does not
 *   fit the block, or is not lower (fewer bits per element and a smaller block).  Result:
 *   the new block's size.  A promotion is a dequantized retrieve. */
#define SDE_CMD_KV_STORE_QUANTIZED 40
#define SDE_CMD_KV_RETRIEVE_DEQUANTIZED 41
#define SDE_CMD_PREFIX_MATCH 42
#define SDE_CMD_PREFIX_MATCH_TOKENS 43
#define SDE_CMD_PIN 44
#define SDE_CMD_UNPIN 45
#define SDE_CMD_TOPK_PAGES 46
#define SDE_CMD_ATTEND 47
#define SDE_CMD_KV_REQUANTIZE 48
#define SDE_CMD_LAST 49
#define SDE_CMD_COUNT 26 /* opcodes defined above: the data plane's table has a row each */

/* completion status */
#define SDE_SC_SUCCESS 0
#define SDE_SC_INVALID_OPCODE 1
#define SDE_SC_INVALID_FIELD 2
#define SDE_SC_INVALID_NAMESPACE 3
#define SDE_SC_INVALID_BUFFER 4
#define SDE_SC_LBA_OUT_OF_RANGE 5
#define SDE_SC_MEDIA_ERROR 6
#define SDE_SC_ABORTED 7
#define SDE_SC_CAPACITY_EXCEEDED 8
#define SDE_SC_INTERNAL 9
/* an owner acting on what is not its own (a shared namespace it did not create) */
#define SDE_SC_ACCESS_DENIED 10
/* the NVMe KV command set's own status codes */
#define SDE_SC_KV_INVALID_VALUE_SIZE 0x85
#define SDE_SC_KV_INVALID_KEY_SIZE 0x86
#define SDE_SC_KV_KEY_NOT_EXIST 0x87
#define SDE_SC_KV_KEY_EXISTS 0x89
/* vendor specific (NVMe's C0h-FFh): a delete of a key pinned by in-flight work (unpin it,
 * or force the delete as the namespace's owner or an admin) */
#define SDE_SC_KV_KEY_PINNED 0xC0
/* vendor specific: a retrieval command past a bound on the work, memory or result one command
 * may ask of the drive (SDE_RETRIEVAL_MAX_*): split it, or ask for fewer pages */
#define SDE_SC_RETRIEVAL_LIMIT 0xC1

/* KV_DELETE's param0: delete the key even though other clients pinned it (their pins go).
 * An admin's, or the namespace's owner's (a private namespace's or a shared one's creator);
 * the default key space 0 has no owner.  Anyone else: ACCESS_DENIED. */
#define SDE_KV_DELETE_FORCE 1

/* namespace flags: NS_CREATE's param1 takes SDE_NS_SHARED (every client may use it;
 * otherwise only its owner); SDE_NS_USED marks a taken id in the store's table */
#define SDE_NS_USED 1
#define SDE_NS_SHARED 2
/* NS_LIST's and NS_DELETE's param1: an admin acting on every owner's namespaces (the list
 * then has each namespace's owner uid; a delete may take any); without it an admin is an
 * owner like any other */
#define SDE_NS_ALL_OWNERS 1
/* NS_CREATE's result with CAPACITY_EXCEEDED when the drive has room but the creator's uid
 * is at its namespace quota (serve --max-namespaces-per-uid, --max-namespace-bytes-per-uid) */
#define SDE_NS_QUOTA 1

/* ring flags */
#define SDE_SQF_NEED_WAKEUP 1 /* daemon: asleep, kick the doorbell */
#define SDE_SQF_DEAD 2        /* daemon: shut down, nothing more will complete */

/* COUNTERS' output (GET_LOG's counters page names the same fields). */
typedef struct sde_counters {
    double horizon_ns;       /* the latest submission booked */
    double busy_until_ns;    /* the latest time a resource (a compute unit too) is booked to */
    double link_busy_ns;     /* device to host */
    double link_in_busy_ns;  /* host to device */
    double channel_busy_ns;  /* summed over channels */
    double die_busy_ns;      /* summed over dies */
    double compute_busy_ns;  /* the kernels' device time, summed over kernels */
    uint64_t link_bytes;
    uint64_t nand_bytes_read;
    uint64_t nand_bytes_written;
    uint64_t kernel_calls;
    uint64_t reserved;
} sde_counters;

/* KV_STORE_QUANTIZED's request (64 bytes): at the start of the command's buffer with the raw
 * block after it, or apart in a buffer of the client's (param0).  The firmware parses it
 * (firmware/blockops.py, at the offsets c/gen_abi.py writes into firmware/abi.py). */
#define SDE_QUANT_MAGIC 0x51525153u /* "SQRQ" */
#define SDE_QUANT_LAYOUT_T2L 0      /* the drive's (tokens, 2, layers, heads, head_dim) */
#define SDE_QUANT_LAYOUT_2LT 1      /* LMCache's KV_2LTD (2, layers, tokens, heads, head_dim) */
typedef struct sde_quant_req {
    uint32_t magic;
    uint8_t dtype;          /* element type of the raw block (ssdemu_wire.codes) */
    uint8_t layout;         /* SDE_QUANT_LAYOUT_* */
    uint8_t reserved0[2];
    uint8_t scheme[32];     /* the scheme's name, ASCII, zero-padded (firmware/kinds.py) */
    uint32_t tokens;        /* the block's shape */
    uint32_t layers;
    uint32_t heads;
    uint32_t head_dim;
    uint16_t summary_page;  /* tokens per page of the summaries kept with it; 0: none */
    uint8_t reserved1[6];   /* zero */
} sde_quant_req;

/* TOPK_PAGES and ATTEND's request (64 bytes), at the start of the command's buffer. */
#define SDE_RETRIEVAL_MAGIC 0x51525253u /* "SRRQ" */
#define SDE_RETRIEVAL_INT8 1            /* flags: score on int8 summaries (rounded outwards) */
/* What one retrieval command may ask (past them: SDE_SC_RETRIEVAL_LIMIT), so that no client's
 * command holds a worker, or the drive's memory, without bound.  The drive streams over the
 * blocks; what it keeps per command is its summaries and the pages it reads. */
#define SDE_RETRIEVAL_MAX_KEYS 16384    /* blocks of a sequence: 1M tokens at 64 a block */
#define SDE_RETRIEVAL_MAX_SCORED 4194304 /* kv_heads x pages x head_dim scored: Llama-3-8B's
                                          * 64K tokens at 16-token pages (32 MiB of float32
                                          * bounds while scoring) */
#define SDE_RETRIEVAL_MAX_READ 4194304  /* kv_heads x tokens x head_dim of keys a re-rank reads
                                         * ((k x rerank) pages a head), or of keys and values an
                                         * ATTEND reads ((k + sink + recent) pages) */
#define SDE_RETRIEVAL_MAX_RESULT 1048576 /* bytes of TOPK_PAGES' result (kv_heads x k x 8) */
typedef struct sde_retrieval_req {
    uint32_t magic;
    uint8_t dtype;         /* element type of plain blocks (ssdemu_wire.codes); a quantized
                            * block names its own */
    uint8_t flags;
    uint16_t layer;        /* the layer the queries belong to */
    uint16_t layers;       /* the blocks' layers */
    uint16_t kv_heads;
    uint16_t q_heads;      /* a multiple of kv_heads (GQA) */
    uint16_t head_dim;
    uint16_t page_tokens;  /* every block but the last holds whole pages */
    uint16_t key_len;      /* 1..16: every key of the sequence (one length per request: the
                            * keys are 16-byte slots; name blocks with keys of one length,
                            * "s/01".."s/10" rather than "s/1".."s/10") */
    uint32_t nkeys;        /* blocks of the sequence, in token order */
    uint32_t k;            /* TOPK_PAGES: pages kept per KV head; ATTEND: ids given per head */
    uint32_t sink_pages;   /* the first pages: never candidates, always attended */
    uint32_t recent_pages; /* the last pages: likewise */
    uint32_t rerank;       /* TOPK_PAGES: candidates per kept page for the exact re-rank
                            * (0 or 1: Quest alone) */
    uint32_t reserved[6];
} sde_retrieval_req;

/* A command: 64 bytes, in the NVMe spirit. */
typedef struct sde_sqe {
    uint8_t opcode;
    uint8_t flags;
    uint16_t cid;            /* the client's command id, echoed in the completion */
    uint32_t nsid;           /* namespace, 0 for none */
    uint32_t buf;            /* registered buffer handle, 0 for none */
    uint32_t length;         /* bytes */
    uint64_t buf_offset;     /* byte offset into the buffer */
    uint64_t lba;            /* first logical block (block commands); key bytes 0-7 (KV) */
    uint64_t key_hi;         /* key bytes 8-15 (KV) */
    uint64_t param0;
    uint64_t param1;
    uint64_t submit_time_ns; /* virtual-time submission stamp; 0 in real time */
} sde_sqe;

/* A completion: 32 bytes. */
typedef struct sde_cqe {
    uint16_t cid;
    uint16_t status;
    uint32_t reserved;
    uint64_t result;
    uint64_t device_time_ns; /* modelled latency (real time) or completion time (virtual) */
    uint64_t reserved2;
} sde_cqe;

typedef struct sde_ring_hdr {
    uint32_t magic;
    uint32_t version;
    uint32_t sq_entries;
    uint32_t cq_entries;
    uint32_t sq_offset;
    uint32_t cq_offset;
    uint32_t qid;
    uint32_t reserved[9];
    uint32_t sq_tail;  /* client */
    uint32_t pad1[15];
    uint32_t sq_head;  /* daemon */
    uint32_t pad2[15];
    uint32_t cq_tail;  /* daemon */
    uint32_t pad3[15];
    uint32_t cq_head;  /* client */
    uint32_t pad4[15];
    uint32_t sq_flags; /* daemon */
    uint32_t daemon_cpu; /* daemon: 1 + the CPU its data plane last ran on (0: unknown) */
    uint32_t pad5[14];
    uint32_t cq_waiters; /* client: waiters asleep on its completion eventfd */
    uint32_t client_cpu; /* client: 1 + the CPU its last waiter ran on (a hint: never trusted) */
    uint32_t pad6[14];
} sde_ring_hdr;

/* Bytes of queue-pair memory for these ring sizes (powers of two, 2..65536); 0 if invalid. */
uint64_t sde_qp_bytes(uint32_t sq_entries, uint32_t cq_entries);
/* Daemon: lay out a fresh queue pair in mem (sde_qp_bytes long). */
int sde_qp_init(void *mem, uint32_t sq_entries, uint32_t cq_entries, uint32_t qid);
/* Client: check a queue pair it was handed (magic, version, sizes within `bytes`). */
int sde_qp_check(const void *mem, uint64_t bytes);

/* Client: publish up to n commands; returns how many fit.  Kicks doorbell_fd (an eventfd)
 * if the daemon is asleep; *kicked tells whether it did. */
int sde_sq_submit(void *mem, const sde_sqe *sqes, uint32_t n, int doorbell_fd, int *kicked);
/* Client: take up to max completions. */
int sde_cq_reap(void *mem, sde_cqe *out, uint32_t max);
/* Client: wait until a completion is there, or until timeout_ns (0: forever): poll for
 * spin_ns, then sleep on completion_fd (holding one of cq_waiters while asleep) and on
 * kick_fd (an eventfd of this client's own, or -1: another of its waiters that reaped
 * what this one waits for kicks it there, where an event loop watching completion_fd
 * cannot take the kick).  hangup_fd (the control socket, or -1) hung up means the daemon
 * is gone: -ENOTCONN, as for a queue marked dead.  Returns completions ready; 0 on
 * timeout, or when woken with none ready (another waiter reaped them: look again);
 * -errno. */
int sde_cq_wait(void *mem, int completion_fd, int hangup_fd, int kick_fd, uint64_t spin_ns,
                uint64_t timeout_ns);
/* Client, event-loop style (hostlib.aio): waiting 1 takes one of cq_waiters (the daemon
 * signals completion_fd for every completion it posts while any is held), 0 gives it back;
 * each 1 is balanced by one 0.  Returns the completions ready (look at them before
 * sleeping: one may have been posted just before the daemon saw the count). */
int sde_cq_arm(void *mem, int waiting);
/* CDEF-END */

#endif
