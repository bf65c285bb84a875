/* A closed loop of commands (bench device), and one resource alone, for tests. */
#define _GNU_SOURCE
#include "model_private.h"
#include "sde_heap.h"

/* ---- a closed loop ------------------------------------------------------------------------ */

#define VALUE(x) (x)
SDE_HEAP(heap, double, VALUE)

double sde_model_closed_loop(sde_model *m, int write, uint32_t qd, uint64_t n, uint64_t nbytes,
                             uint64_t span, uint64_t seed, double start, double *marks,
                             uint32_t nmarks)
{
    if (!qd || !n || !nbytes || span < nbytes || start < m->horizon)
        return -1.0;
    double *heap = malloc(qd * sizeof(double));
    if (!heap)
        return -1.0;
    uint64_t slots = span / nbytes, next = 0, x = seed ? seed : 1, submitted = 0, done = 0;
    uint32_t nh = 0, mark = 0;
    double last = start;
    for (; submitted < n && submitted < qd; submitted++) {
        uint64_t off = NEXT_OFFSET();
        heap_push(heap, &nh, write ? sde_model_write(m, start, off, nbytes)
                                   : sde_model_read(m, start, off, nbytes));
    }
    while (nh) {
        double t = heap_pop(heap, &nh);
        last = t;
        done++;
        while (mark < nmarks && done * nmarks >= (mark + 1) * n)
            marks[mark++] = t;
        if (submitted < n) {
            uint64_t off = NEXT_OFFSET();
            heap_push(heap, &nh, write ? sde_model_write(m, t, off, nbytes)
                                       : sde_model_read(m, t, off, nbytes));
            submitted++;
        }
    }
#undef NEXT_OFFSET
    free(heap);
    return last;
}

/* ---- one resource, for tests --------------------------------------------------------------- */

sde_resource *sde_resource_new(void) { return calloc(1, sizeof(sde_resource)); }
void sde_resource_free(sde_resource *r)
{
    if (r)
        model_res_fini(r);
    free(r);
}
double sde_resource_hold(sde_resource *r, double ready, double duration)
{
    return model_res_hold(r, ready, duration);
}
void sde_resource_forget_before(sde_resource *r, double t) { model_res_forget_before(r, t); }
uint32_t sde_resource_gaps(const sde_resource *r) { return r->gaps.n; }
double sde_resource_next_free(const sde_resource *r) { return r->next_free; }
