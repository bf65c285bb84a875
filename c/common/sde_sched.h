/* The data plane's slice of the CPU scheduler (EEVDF, Linux 6.6+).  A thread that sleeps and
 * is woken many times a millisecond (by a doorbell, a completion) asks, while the host has no
 * CPU to spare, for the shortest slice the kernel grants (100 us; the default is 0.75 ms times
 * 1 + log2 of the CPUs): its virtual deadline comes sooner, so when woken on a CPU where a
 * longer-sliced task runs it is picked sooner, and since Linux 6.12 it may preempt that task
 * at once (a real drive's completion interrupts whatever runs).  Its weight, and so its share
 * of the CPU, is unchanged, and it needs no privilege (unlike serve --realtime's SCHED_RR).
 * Measured, bench queue on mem: beside four CPU-bound processes (two per core), twelve
 * rounds against the same code without it, interleaved: 4 KiB QD32 p99 2.8-3.8 ms against
 * 4.0-5.3 ms in every round, the ratio to fio ahead in ten of twelve (0.72-0.96x against
 * 0.62-0.87x); beside two, no difference beyond the run-to-run spread.  Quiet it buys
 * nothing and may cost (always asked for: 0.81-1.12x fio against 0.99-1.13x in seven
 * rounds), so it is asked for only while busy.  Threads it starts keep the slice (io_uring's
 * workers, also woken per I/O); the firmware's threads are started before it. */
#ifndef SDE_SCHED_H
#define SDE_SCHED_H
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SDE_SCHED_SLICE_NS 100000ull /* the kernel's floor for a requested slice */

/* struct sched_attr as the kernel defines it (glibc 2.36 has no wrapper) */
struct sde_sched_attr {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
};

/* Ask for the shortest slice (short != 0) or the kernel's default for the calling thread, if
 * it runs SCHED_OTHER (a SCHED_RR thread keeps its policy; its nice value is kept).  Returns
 * the slice now asked for in ns (0: the default), or -1 when the thread is not SCHED_OTHER or
 * the kernel refused (older kernels take the call and ignore the slice). */
static inline int64_t sde_sched_slice(int short_slice)
{
    if (sched_getscheduler(0) != SCHED_OTHER)
        return -1;
    struct sde_sched_attr a;
    memset(&a, 0, sizeof(a));
    a.size = sizeof(a);
    a.policy = SCHED_OTHER;
    a.nice = (int32_t)getpriority(PRIO_PROCESS, 0); /* this thread's (per thread on Linux) */
    a.runtime = short_slice ? SDE_SCHED_SLICE_NS : 0;
    return syscall(SYS_sched_setattr, 0, &a, 0) == 0 ? (int64_t)a.runtime : -1;
}
#endif
