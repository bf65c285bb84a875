/* The store's synchronous I/O, its errors, and the content hash. */
#define _GNU_SOURCE
#include "store_private.h"

static __thread char last_error[256];

const char *sde_store_last_error(void) { return last_error; }

int store_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return err;
}

uint64_t st_value_hash(const void *data, uint64_t len)
{
    static int avx2 = -1;
    if (avx2 < 0)
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    return avx2 ? sde_hash_avx2(data, len) : XXH3_64bits(data, len);
}

uint64_t store_roundup(uint64_t n, uint64_t b) { return (n + b - 1) / b * b; }

/* ---- synchronous I/O --------------------------------------------------------------- */

int store_pio(int fd, int write, void *buf, uint64_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = write ? pwrite(fd, p, len, (off_t)off) : pread(fd, p, len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EIO;
        p += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

void *store_aligned(uint64_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? store_roundup(bytes, 4096) : 4096))
        return NULL;
    return p;
}

uint8_t *store_scratch(sde_store *st, uint64_t bytes)
{
    if (bytes > st->scratch_bytes) {
        uint8_t *n = store_aligned(bytes);
        if (!n)
            return NULL;
        free(st->scratch);
        st->scratch = n;
        st->scratch_bytes = store_roundup(bytes, 4096);
    }
    return st->scratch;
}
