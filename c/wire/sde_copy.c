/* A copy by 16-byte vector moves (SSE2, every x86-64), whose speed does not depend on how
 * the two addresses fall within their pages; elsewhere, memcpy. */
#include "sde_copy.h"

#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

void sde_copy(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    /* small copies never take the slow path, and large ones use non-temporal stores */
    if (n < 4096 || n >= (2u << 20)) {
        memcpy(d, s, n);
        return;
    }
    while (n >= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_storeu_si128((__m128i *)d, a);
        _mm_storeu_si128((__m128i *)(d + 16), b);
        _mm_storeu_si128((__m128i *)(d + 32), c);
        _mm_storeu_si128((__m128i *)(d + 48), e);
        s += 64;
        d += 64;
        n -= 64;
    }
    memcpy(d, s, n);
}
#else
void sde_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif

void sde_copy_at(uintptr_t dst, uintptr_t src, size_t n)
{
    sde_copy((void *)dst, (const void *)src, n);
}
