/* Commands on the model: reads, senses, transfers, receives, programs, trims. */
#define _GNU_SOURCE
#include "model_private.h"


void sde_model_trim(sde_model *m, uint64_t offset, uint64_t nbytes)
{
    if (!m->ftl)
        return;
    uint64_t u0 = (offset + m->unit - 1) / m->unit, u1 = (offset + nbytes) / m->unit;
    if (u1 - u0 > m->ftl_units)
        u1 = u0 + m->ftl_units;
    /* in runs split where logical units wrap */
    for (uint64_t u = u0, lu = u0 % m->ftl_units; u < u1;) {
        uint64_t k = u1 - u < m->ftl_units - lu ? u1 - u : m->ftl_units - lu;
        sde_ftl_trim_run(m->ftl, lu, k);
        u += k;
        lu = 0;
    }
}

void sde_model_trim_many(sde_model *m, const uint64_t *offsets, uint32_t n, uint64_t nbytes)
{
    for (uint32_t i = 0; i < n; i++)
        sde_model_trim(m, offsets[i], nbytes);
}

/* ---- commands ----------------------------------------------------------------------------- */

double sde_model_read(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    if (model_advance(m, submit) < 0)
        return -1.0;
    double done = m->ops->read(m, submit, offset, nbytes);
    m->nand_read += nbytes;
    m->link_bytes += nbytes;
    return done;
}

double model_detailed_read(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    double t = model_controller(m, submit) + m->p.read_latency_ns;
    return model_nand_read(m, t, offset, nbytes, 1) + m->p.link_latency_ns;
}

double sde_model_sense(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    if (model_advance(m, submit) < 0)
        return -1.0;
    m->nand_read += nbytes;
    return m->ops->sense(m, submit, offset, nbytes);
}

double sde_model_sense_runs(sde_model *m, double submit, const uint64_t *offs,
                            const uint64_t *lens, uint32_t n)
{
    double last = submit;
    for (uint32_t i = 0; i < n; i++) {
        double t = sde_model_sense(m, submit, offs[i], lens[i]);
        if (t < 0)
            return -1.0;
        last = t > last ? t : last;
    }
    return last;
}

/* offs[] ascending, lens[] moved with them: a radix sort on the offsets' bytes, a pass per
 * byte that is not the same in every offset (a command's runs lie within a few megabytes:
 * two or three passes).  tmp: 2n scratch.  Stable, as np.argsort(kind="stable"). */
static void sort_runs(uint64_t *offs, uint64_t *lens, uint32_t n, uint64_t *tmp)
{
    uint64_t *to = tmp, *tl = tmp + n, all_or = 0, all_and = ~0ull;
    for (uint32_t i = 0; i < n; i++) {
        all_or |= offs[i];
        all_and &= offs[i];
    }
    for (int shift = 0; shift < 64; shift += 8) {
        if ((((all_or ^ all_and) >> shift) & 0xFF) == 0)
            continue; /* this byte is the same everywhere: no reordering */
        uint32_t count[257] = {0};
        for (uint32_t i = 0; i < n; i++)
            count[((offs[i] >> shift) & 0xFF) + 1]++;
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (uint32_t i = 0; i < n; i++) {
            uint32_t at = count[(offs[i] >> shift) & 0xFF]++;
            to[at] = offs[i];
            tl[at] = lens[i];
        }
        memcpy(offs, to, n * sizeof(*offs));
        memcpy(lens, tl, n * sizeof(*lens));
    }
}

int64_t sde_runs_join(uint64_t *offs, uint64_t *lens, uint32_t n, uint64_t page)
{
    if (!n)
        return 0;
    if (!page)
        page = 1;
    uint64_t *tmp = malloc(2 * (size_t)n * sizeof(uint64_t));
    if (!tmp)
        return -ENOMEM;
    sort_runs(offs, lens, n, tmp);
    free(tmp);
    uint32_t out = 0;
    uint64_t start = offs[0], reach = offs[0] + lens[0];
    for (uint32_t i = 1; i < n; i++) {
        /* a run starts a read where it begins past every earlier run's end and its page */
        if (offs[i] > reach && (!reach || offs[i] / page > (reach - 1) / page)) {
            offs[out] = start;
            lens[out++] = reach - start;
            start = offs[i];
            reach = offs[i] + lens[i];
        } else if (offs[i] + lens[i] > reach) {
            reach = offs[i] + lens[i];
        }
    }
    offs[out] = start;
    lens[out++] = reach - start;
    return out;
}

double model_detailed_sense(sde_model *m, double submit, uint64_t offset, uint64_t nbytes)
{
    double t = model_controller(m, submit) + m->p.read_latency_ns;
    double sensed = model_nand_read(m, t, offset, nbytes, 0);
    double landed = model_dram(m, t, nbytes); /* into the DRAM, for the firmware */
    return sensed > landed ? sensed : landed;
}

/* Continuations start at `ready`, which a caller derives from its command's submission: never
 * before the latest submission (the gaps before it are gone). */
static double not_before_horizon(const sde_model *m, double ready)
{
    return ready > m->horizon ? ready : m->horizon;
}

double sde_model_transfer(sde_model *m, double ready, uint64_t nbytes)
{
    ready = not_before_horizon(m, ready);
    m->link_bytes += nbytes;
    return m->ops->transfer(m, ready, nbytes);
}

double model_detailed_transfer(sde_model *m, double ready, uint64_t nbytes)
{
    double over = model_hold(m, &m->link, ready, (double)nbytes * m->ns_per_link_byte);
    double out = model_dram(m, ready, nbytes); /* out of the DRAM */
    return (over > out ? over : out) + m->p.link_latency_ns;
}

uint32_t sde_model_pieces(const sde_model *m, uint64_t nbytes)
{
    uint64_t rows = (nbytes + m->p.page_bytes - 1) / m->p.page_bytes;
    uint64_t n = rows / m->p.channels;
    return n < 1 ? 1 : n > 64 ? 64 : (uint32_t)n;
}

double sde_model_transfer_streamed(sde_model *m, double first, double prev_end, uint32_t pieces,
                                   uint64_t nbytes)
{
    double done = sde_model_transfer(m, first, nbytes);
    if (!m->ops->streams || !pieces)
        return done;
    double tail = prev_end + (double)nbytes * m->ns_per_link_byte / pieces + m->p.link_latency_ns;
    return done > tail ? done : tail;
}

double sde_model_program_streamed(sde_model *m, double first, double prev_end, uint32_t pieces,
                                  uint64_t offset, uint64_t nbytes, uint64_t *leaving)
{
    double done = sde_model_program_leaving(m, first, offset, nbytes, leaving);
    if (!m->ops->streams || !pieces)
        return done;
    /* the last piece leaves the kernel at prev_end: its program can end no sooner */
    double tail = prev_end + m->p.t_prog_ns;
    return done > tail ? done : tail;
}

double sde_model_receive(sde_model *m, double submit, uint64_t nbytes)
{
    if (model_advance(m, submit) < 0)
        return -1.0;
    m->link_bytes += nbytes;
    return m->ops->receive(m, submit, nbytes);
}

double model_detailed_receive(sde_model *m, double submit, uint64_t nbytes)
{
    double t = model_controller(m, submit);
    double in = model_hold(m, &m->link_in, t, (double)nbytes * m->ns_per_link_byte);
    double landed = model_dram(m, t, nbytes);
    return in > landed ? in : landed;
}

/* The NAND half of a write whose data is in the controller at `ready`: when its programs are
 * done.  With an FTL and the write cache, rows left partial wait for later writes (their
 * time is the rows completed so far); without the cache the partial row is padded.
 * *leaving: the bytes whose programs this booked, which leave the write cache when done
 * (with an FTL, the rows it completed; without one, the write itself). */
double model_nand_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                           uint64_t *leaving)
{
    *leaving = nbytes;
    if (!m->ftl)
        return model_program_stages(m, ready, offset, nbytes);
    double done = model_ftl_write(m, ready, offset, nbytes, leaving);
    if (!m->p.write_cache) {
        double pad = model_ftl_pad(m, ready);
        done = pad > done ? pad : done;
    }
    return done;
}

double sde_model_program_leaving(sde_model *m, double ready, uint64_t offset, uint64_t nbytes,
                                 uint64_t *leaving)
{
    uint64_t ignored;
    if (!leaving)
        leaving = &ignored;
    *leaving = nbytes;
    ready = not_before_horizon(m, ready);
    m->nand_written += nbytes;
    m->defer_next += m->deferring; /* a deferred batch's next block */
    return m->ops->program(m, ready, offset, nbytes, leaving);
}

double sde_model_program(sde_model *m, double ready, uint64_t offset, uint64_t nbytes)
{
    return sde_model_program_leaving(m, ready, offset, nbytes, NULL);
}

const struct model_ops model_detailed_ops = {
    .read = model_detailed_read, .sense = model_detailed_sense,
    .transfer = model_detailed_transfer, .receive = model_detailed_receive,
    .program = model_nand_program, .write = model_detailed_write,
    .flush = model_detailed_flush, .nop = model_detailed_nop, .streams = 1,
};
