/* Fault injection as the data plane applies it, and power-cut emulation's housekeeping. */
#define _GNU_SOURCE
#include "dev_internal.h"

/* Fault injection: whether a rule failed the command (its completion posted); a latency
 * rule leaves a delay for finish_at.  Only commands on namespaces the client may use are
 * looked at: a fault must not tell a client that another's namespace exists. */
int dev_inject_fault(sde_dev *dev, int qp, const sde_sqe *c, const struct dev_op *r, uint64_t t0)
{
    if (c->nsid && !dev_ns_visible(dev, &dev->qps[qp], c->nsid))
        return 0;
    /* block commands match rules by their LBA range, KV commands by their key */
    int block = r->cls == SDE_CLASS_READ || r->cls == SDE_CLASS_WRITE;
    uint8_t key[SDE_KEY_MAX];
    uint32_t klen = block ? 0 : dev_kv_key(c, key);
    uint64_t extra = 0;
    uint16_t st = sde_fault_check(&dev->faults, r->fault_dir, c->nsid, block ? c->lba : 0,
                                  block ? (c->length + dev->lba - 1) / dev->lba : 0, key, klen,
                                  &extra);
    if (st || extra)
        dev->stats.faults_injected++;
    if (extra) {
        if (dev->ndelays < 4096) {
            if (!dev->delays)
                dev->delays = malloc(4096 * sizeof(*dev->delays));
            if (dev->delays)
                dev->delays[dev->ndelays++] = (struct delay){qp, c->cid, extra};
        }
    }
    if (!st)
        return 0;
    dev_finish(dev, qp, r->cls, c->cid, st, 0, 0, t0);
    return 1;
}

int sde_dev_fault_add(sde_dev *dev, const sde_fault_rule *r, uint64_t seed)
{
    pthread_mutex_lock(&dev->lock);
    int id = sde_fault_add(&dev->faults, r, seed);
    pthread_mutex_unlock(&dev->lock);
    return id;
}

int sde_dev_fault_clear(sde_dev *dev, uint32_t id)
{
    pthread_mutex_lock(&dev->lock);
    int n = sde_fault_clear(&dev->faults, id);
    pthread_mutex_unlock(&dev->lock);
    return n;
}

void sde_dev_faults(sde_dev *dev, sde_faults *out)
{
    pthread_mutex_lock(&dev->lock);
    *out = dev->faults;
    pthread_mutex_unlock(&dev->lock);
}

/* Power-cut emulation: a checkpoint synced the media (what had completed is durable), and a
 * write cache past its size destages (a sync), as a real one drains on its own. */
void dev_undo_housekeeping(sde_dev *dev)
{
    uint64_t ck = dev->store ? st_checkpoints(dev->store) : 0;
    if (ck != dev->undo_ckpts) {
        dev->undo_ckpts = ck;
        sde_undo_synced(dev->undo);
    }
    if (sde_undo_bytes(dev->undo) > dev->undo_cap && fdatasync(dev->media_fd) == 0) {
        sde_undo_synced(dev->undo);
        dev->stats.cache_destages++;
    }
}

int sde_dev_set_power_cut(sde_dev *dev, uint64_t cache_bytes)
{
    pthread_mutex_lock(&dev->lock);
    int r = 0;
    if (!dev->undo && !(dev->undo = sde_undo_new(dev->media_fd, dev->lba)))
        r = -ENOMEM;
    dev->undo_cap = cache_bytes;
    dev->undo_ckpts = dev->store ? st_checkpoints(dev->store) : 0;
    pthread_mutex_unlock(&dev->lock);
    return r;
}

int sde_dev_power_cut(sde_dev *dev, uint64_t seed, sde_cut_result *out)
{
    pthread_mutex_lock(&dev->lock);
    int r = dev->undo ? sde_undo_cut(dev->undo, seed, out) : -EINVAL;
    pthread_mutex_unlock(&dev->lock);
    return r;
}
