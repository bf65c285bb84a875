/* The client's copies between its own memory and registered buffers (hostlib's staging). */
#ifndef SDE_COPY_H
#define SDE_COPY_H
#include <stddef.h>
#include <stdint.h>
/* CDEF-BEGIN */
/* memcpy's result, without memcpy's `rep movsb` above a few KiB: on some CPUs (the AMD EPYC
 * this project is built on, glibc 2.36) it runs at 3 GB/s instead of 35 when the
 * destination lies 16 bytes past the source modulo 4096, which is every copy from a
 * page-aligned buffer into a numpy array malloc placed 16 bytes into its pages. */
void sde_copy(void *dst, const void *src, size_t n);
/* The same between two addresses as integers: a caller in Python passes them as it has them
 * (hostlib keeps its buffers' addresses), with no pointer objects made per copy. */
void sde_copy_at(uintptr_t dst, uintptr_t src, size_t n);
/* CDEF-END */
#endif
