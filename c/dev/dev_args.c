/* A command's arguments checked against its client's own: the buffer range it names, its key,
 * its namespace (one the client may use), the fields every KV command shares.  The daemon
 * never trusts a client: every start goes through these. */
#define _GNU_SOURCE
#include "dev_internal.h"

#include <stddef.h>

/* Whether the client of queue pair q may use namespace nsid: it exists and is shared or its
 * own (same uid and token).  Another owner's namespace looks exactly like a missing one. */
int dev_ns_visible(const sde_dev *dev, const struct dev_qp *q, uint32_t nsid)
{
    if (nsid < 1 || nsid > SDE_MAX_NS)
        return 0;
    const sde_ns_info *ns = &dev->ns[nsid];
    return (ns->flags & SDE_NS_USED) &&
           ((ns->flags & SDE_NS_SHARED) || (ns->uid == q->uid && ns->token == q->token));
}

/* A KV command's key length (param1), or 0 when it is not 1..SDE_KEY_MAX. */
uint32_t dev_key_len(const sde_sqe *c)
{
    return c->param1 >= 1 && c->param1 <= SDE_KEY_MAX ? (uint32_t)c->param1 : 0;
}

/* The key of a KV command: its length (1..16; 0 for any other, never truncated). */
uint32_t dev_kv_key(const sde_sqe *c, uint8_t key[SDE_KEY_MAX])
{
    memcpy(key, &c->lba, 8);
    memcpy(key + 8, &c->key_hi, 8);
    return dev_key_len(c);
}

/* Fields every KV command shares: flags, namespace (0, the shared default, or one the
 * client may use), key.  Returns a status. */
uint16_t dev_kv_common(const sde_dev *dev, const struct dev_qp *q, const sde_sqe *c,
                          uint8_t key[SDE_KEY_MAX], uint32_t *klen)
{
    *klen = dev_kv_key(c, key);
    if (c->flags)
        return SDE_SC_INVALID_FIELD;
    if (c->nsid && !dev_ns_visible(dev, q, c->nsid))
        return SDE_SC_INVALID_NAMESPACE;
    return *klen ? SDE_SC_SUCCESS : SDE_SC_KV_INVALID_KEY_SIZE;
}

/* The client's buffer named by a command, covering [buf_offset, +length), or NULL. */
struct dev_buf *dev_client_range(sde_dev *dev, struct dev_qp *q, const sde_sqe *c)
{
    if (c->buf < 1 || c->buf > SDE_MAX_BUFS)
        return NULL;
    struct dev_buf *b = &dev->bufs[c->buf];
    if (!b->active || b->client != q->client || c->buf_offset > b->len ||
        c->length > b->len - c->buf_offset)
        return NULL;
    return b;
}

/* The arguments every value-moving KV command shares (flags, namespace, key, the client's
 * buffer range); on a failure its completion is posted and NULL returned. */
struct dev_buf *dev_kv_value_args(sde_dev *dev, int qp, const sde_sqe *c, int cls,
                                     uint64_t t0, uint8_t key[SDE_KEY_MAX], uint32_t *klen,
                                     uint16_t (*more)(sde_dev *, const sde_sqe *))
{
    uint16_t st = dev_kv_common(dev, &dev->qps[qp], c, key, klen);
    if (!st && more)
        st = more(dev, c);
    struct dev_buf *b = st ? NULL : dev_client_range(dev, &dev->qps[qp], c);
    if (!st && !b)
        st = SDE_SC_INVALID_BUFFER;
    if (st)
        dev_finish(dev, qp, cls, c->cid, st, 0, 0, t0);
    return b;
}

_Static_assert(offsetof(sde_sqe, key_hi) == offsetof(sde_sqe, lba) + 8,
               "a KV key is lba then key_hi, 16 bytes in a row");
