/*
 * The client side of `ssdemu bench queue` and `bench kv`, in C (c/tools/sde_client_loop.c): a tool
 * above both the device and the client library, so it is built with the device's engine (it
 * uses the engine's latency buckets), not with the wire format's ring functions.
 */
#ifndef SDE_CLIENT_LOOP_H
#define SDE_CLIENT_LOOP_H
#include <stdint.h>

/* CDEF-BEGIN */
/* No completion for this long: the daemon is stuck, the loop ends with -ETIMEDOUT. */
#define SDE_CLIENT_LOOP_STALL_NS 30000000000
/* A closed-loop job through a queue pair, in C (the client side of `ssdemu bench queue` and
 * `bench kv`): keeps qd commands of `opcode` in flight, each `bs` bytes at a random
 * block-aligned lba below `nblocks` of namespace nsid (a KV opcode: on a random one of
 * `nblocks` 16-byte keys, key index in bytes 0-7, "skv00000" in bytes 8-15), into buffer
 * handle buf (slot i at offset i*bs), for duration_ns.  stamp (or NULL): that buffer's
 * address, to write a serial number in each slot's first 8 bytes before it is sent.  Latencies (submit to reap, ns) go into hist[SDE_HIST_BUCKETS] (the engine's
 * log-linear buckets).  With no completion to reap it polls up to spin_ns (hostlib's
 * SPIN_NS) while the data plane says the host has a CPU to spare, and sleeps at once when it
 * says not.  out[0] = commands completed, out[1] = errors, out[2] = elapsed ns. */
int sde_client_loop(void *mem, int doorbell_fd, int completion_fd, uint8_t opcode,
                    uint32_t nsid, uint32_t buf, uint32_t bs, uint32_t qd, uint64_t nblocks,
                    uint64_t duration_ns, uint64_t seed, uint64_t spin_ns, void *stamp,
                    uint64_t *hist, uint64_t *out);
/* How long the loop polls for a completion before it sleeps, by the ring header at mem:
 * spin_ns while the data plane says the host has a CPU to spare (daemon_cpu 0), else 0. */
uint64_t sde_client_loop_spin(const void *mem, uint64_t spin_ns);
/* CDEF-END */
#endif
