/* The firmware's threads (c/fw/sde_fw.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sde_fw.h"

struct sde_fw {
    sde_fw_entry entry;
    pthread_mutex_t lock;
    pthread_cond_t work;
    sde_fw_job *head, *tail;  /* queued, FIFO */
    sde_fw_job *done;         /* finished, LIFO (the data plane does not need their order) */
    uint32_t pending;
    int stop;
    int done_fd;
    uint32_t nthreads;
    pthread_t threads[SDE_FW_MAX_THREADS];
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The process's loaded entry points (one daemon per process), behind load_lock. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int (*loader_fn)(uint64_t *);
static uint64_t loaded[4];
static int load_error; /* sticky: a loader that failed once is not run on every command */

void sde_fw_set_loader(int (*loader)(uint64_t *addresses))
{
    pthread_mutex_lock(&load_lock);
    loader_fn = loader;
    pthread_mutex_unlock(&load_lock);
}

int sde_fw_ensure(sde_fw_entry *e)
{
    if (__atomic_load_n(&e->quantize, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&load_lock);
    if (!loaded[0] && !load_error) {
        uint64_t a[4] = {0};
        int r = loader_fn ? loader_fn(a) : -ENOSYS;
        if (r == 0 && a[0] && a[1] && a[2] && a[3])
            memcpy(loaded, a, sizeof(a));
        else
            load_error = r < 0 ? r : -EIO;
    }
    int r = loaded[0] ? 0 : load_error;
    if (loaded[0] && !e->quantize) {
        e->dequantize = (sde_fw_dequantize_fn)(uintptr_t)loaded[1];
        e->hash_chain = (sde_fw_hash_fn)(uintptr_t)loaded[2];
        e->requantize = (sde_fw_requantize_fn)(uintptr_t)loaded[3];
        __atomic_store_n(&e->quantize, (sde_fw_quantize_fn)(uintptr_t)loaded[0],
                         __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&load_lock);
    return r;
}

static void run_job(sde_fw_entry *e, sde_fw_job *j)
{
    if (sde_fw_ensure(e) < 0) {
        j->ret = SDE_FW_E_UNAVAILABLE;
        j->host_ns = 0;
        return;
    }
    uint64_t t0 = mono_ns();
    switch (j->kind) {
    case SDE_FW_QUANTIZE:
        j->ret = e->quantize(j->req, j->in, j->in_len, j->out, j->out_cap, j->info);
        break;
    case SDE_FW_DEQUANTIZE:
        j->ret = e->dequantize(j->in, j->in_len, j->out, j->out_cap, j->info);
        break;
    case SDE_FW_REQUANTIZE:
        j->ret = e->requantize(j->req, j->in, j->in_len, j->out, j->out_cap, j->info);
        break;
    case SDE_FW_HASH:
        j->ret = e->hash_chain((const uint32_t *)j->in, j->in_len, j->block_tokens, j->req,
                               j->out);
        break;
    default:
        j->ret = SDE_FW_E_REQUEST;
    }
    j->host_ns = mono_ns() - t0;
}

static void *worker(void *arg)
{
    sde_fw *fw = arg;
    pthread_mutex_lock(&fw->lock);
    for (;;) {
        while (!fw->head && !fw->stop)
            pthread_cond_wait(&fw->work, &fw->lock);
        if (!fw->head)
            break; /* stopping, and nothing left */
        sde_fw_job *j = fw->head;
        fw->head = j->next;
        if (!fw->head)
            fw->tail = NULL;
        pthread_mutex_unlock(&fw->lock);
        run_job(&fw->entry, j);
        pthread_mutex_lock(&fw->lock);
        j->next = fw->done;
        __atomic_store_n(&fw->done, j, __ATOMIC_RELEASE);
        uint64_t one = 1;
        ssize_t r = write(fw->done_fd, &one, sizeof(one));
        (void)r;
    }
    pthread_mutex_unlock(&fw->lock);
    return NULL;
}

int sde_fw_new(const sde_fw_entry *entry, uint32_t threads, int done_fd, sde_fw **out)
{
    /* every entry point, or none (loaded on first use) */
    int some = entry && (entry->quantize || entry->dequantize || entry->hash_chain ||
                         entry->requantize);
    if (!entry ||
        (some && (!entry->quantize || !entry->dequantize || !entry->hash_chain ||
                  !entry->requantize)) ||
        threads < 1 || threads > SDE_FW_MAX_THREADS)
        return -EINVAL;
    sde_fw *fw = calloc(1, sizeof(*fw));
    if (!fw)
        return -ENOMEM;
    fw->entry = *entry;
    fw->done_fd = done_fd;
    pthread_mutex_init(&fw->lock, NULL);
    pthread_cond_init(&fw->work, NULL);
    for (uint32_t i = 0; i < threads; i++) {
        if (pthread_create(&fw->threads[i], NULL, worker, fw)) {
            sde_fw_free(fw);
            return -EAGAIN;
        }
        fw->nthreads++;
    }
    *out = fw;
    return 0;
}

void sde_fw_free(sde_fw *fw)
{
    if (!fw)
        return;
    pthread_mutex_lock(&fw->lock);
    fw->stop = 1;
    pthread_cond_broadcast(&fw->work);
    pthread_mutex_unlock(&fw->lock);
    for (uint32_t i = 0; i < fw->nthreads; i++)
        pthread_join(fw->threads[i], NULL);
    pthread_cond_destroy(&fw->work);
    pthread_mutex_destroy(&fw->lock);
    free(fw);
}

void sde_fw_submit(sde_fw *fw, sde_fw_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&fw->lock);
    if (fw->tail)
        fw->tail->next = job;
    else
        fw->head = job;
    fw->tail = job;
    fw->pending++;
    pthread_cond_signal(&fw->work);
    pthread_mutex_unlock(&fw->lock);
}

sde_fw_job *sde_fw_take_done(sde_fw *fw)
{
    /* the data plane asks on every pass: no lock while there is nothing */
    if (!__atomic_load_n(&fw->done, __ATOMIC_ACQUIRE))
        return NULL;
    pthread_mutex_lock(&fw->lock);
    sde_fw_job *d = fw->done;
    __atomic_store_n(&fw->done, NULL, __ATOMIC_RELEASE);
    for (sde_fw_job *j = d; j; j = j->next)
        fw->pending--;
    pthread_mutex_unlock(&fw->lock);
    return d;
}

uint32_t sde_fw_pending(sde_fw *fw)
{
    pthread_mutex_lock(&fw->lock);
    uint32_t n = fw->pending;
    pthread_mutex_unlock(&fw->lock);
    return n;
}
