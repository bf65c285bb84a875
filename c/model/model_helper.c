/* The helper thread that books half of a batch's dies. */
#define _GNU_SOURCE
#include "model_private.h"
#include "sde_time.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spin until *word != value or HELPER_SPIN_NS have passed. */
void model_spin_while(_Atomic uint64_t *word, uint64_t value)
{
    double until = 0.0;
    for (uint32_t spin = 1; atomic_load(word) == value; spin++) {
        cpu_relax();
        if (spin % 256 == 0) {
            double t = now_ns();
            if (until == 0.0)
                until = t + HELPER_SPIN_NS;
            else if (t > until)
                return;
        }
    }
}

static void *helper_main(void *arg)
{
    struct helper *h = arg;
    uint64_t seen = 0;
    for (;;) {
        if (h->missed < HELPER_MISSES)
            model_spin_while(&h->posted, seen);
        pthread_mutex_lock(&h->mu);
        while (atomic_load(&h->posted) == seen && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        int stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (stop)
            return NULL;
        seen = atomic_load(&h->posted);
        uint64_t before = seen - 1;
        if (!atomic_compare_exchange_strong(&h->taken, &before, seen)) {
            h->missed++; /* the poster booked it all before this thread started */
            continue;
        }
        h->missed = 0;
        h->work(h->m, h->programs, h->programmed, 1);
        pthread_mutex_lock(&h->mu);
        atomic_store(&h->finished, seen);
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
}

struct helper *model_helper_start(sde_model *m, model_dies_fn work)
{
    if (m->helper_failed || sysconf(_SC_NPROCESSORS_ONLN) < 2)
        return NULL;
    struct helper *h = calloc(1, sizeof(*h));
    if (!h || pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        m->helper_failed = 1;
        return NULL;
    }
    pthread_cond_init(&h->cv, NULL);
    h->m = m;
    h->work = work;
    if (pthread_create(&h->thread, NULL, helper_main, h) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        m->helper_failed = 1;
        return NULL;
    }
    return h;
}

void model_helper_stop(struct helper *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h->programmed);
    free(h);
}
