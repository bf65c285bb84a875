/* The command contexts: the pool, and finishing a command that holds one (its copies counted,
 * its completion posted or held for its modelled time, the context back in the pool). */
#define _GNU_SOURCE
#include "dev_internal.h"

uint32_t dev_ctx_index(sde_dev *dev, struct dev_ctx *x) { return (uint32_t)(x - dev->ctx); }

struct dev_ctx *dev_ctx_take(sde_dev *dev, int qp, const sde_sqe *c, int cls, int kind,
                                uint64_t t0)
{
    struct dev_ctx *x = &dev->ctx[dev->free_ctx[--dev->nfree]];
    uint8_t *spare = x->spare; /* the context's kept buffer outlives its commands */
    uint64_t spare_cap = x->spare_cap;
    memset(x, 0, sizeof(*x));
    x->spare = spare;
    x->spare_cap = spare_cap;
    x->used = 1;
    x->qp = qp;
    x->cid = c->cid;
    x->cls = (uint8_t)cls;
    x->kind = (uint8_t)kind;
    x->op = c->opcode;
    x->t0 = t0;
    x->serial = ++dev->ctx_serial;
    x->io.user_data = dev_ctx_index(dev, x);
    x->io.buf_index = -1;
    x->io2.user_data = dev_ctx_index(dev, x) | UD_IO2;
    x->io2.buf_index = -1;
    x->next_wait = NO_CTX;
    x->next_park = NO_CTX;
    return x;
}

void dev_ctx_put(sde_dev *dev, struct dev_ctx *x)
{
    dev_bounce_drop(dev, x);
    x->used = 0;
    dev->free_ctx[dev->nfree++] = dev_ctx_index(dev, x);
}

void dev_ctx_finish(sde_dev *dev, struct dev_ctx *x, uint16_t status, uint64_t bytes)
{
    dev_copied(dev, x->qp, x->cls, x->copied);
    /* an error keeps its result (a retrieve's value length) and is not held */
    dev_finish_at(dev, x->qp, x->cls, x->cid, status, x->result, bytes, x->t0,
              status ? 0 : x->due, status ? 0 : x->dtime);
    dev_ctx_put(dev, x);
}
