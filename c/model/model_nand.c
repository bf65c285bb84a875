/* The physical stages a command books: the controller's DRAM, and the NAND half of a write
 * (the program path, channel transfers, programs) or of a read (senses, channel transfers,
 * the link per page) at given physical offsets.  The FTL (model_ftl.c) maps logical offsets
 * onto these; the commands (model_commands.c) use both. */
#define _GNU_SOURCE
#include "model_private.h"

static double page_programs(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes);

/* nbytes through the DRAM from ready (ready itself without a DRAM) */
double model_dram(sde_model *m, double ready, uint64_t nbytes)
{
    if (m->ns_per_dram_byte <= 0 || !nbytes)
        return ready;
    return model_hold(m, &m->dram, ready, (double)nbytes * m->ns_per_dram_byte);
}

double sde_model_dram(void *model, double ready, uint64_t nbytes)
{
    sde_model *m = model; /* never before the latest submission: older gaps are gone */
    return model_dram(m, ready > m->horizon ? ready : m->horizon, nbytes);
}

/* The NAND half of a write of data in the controller at `arrived`: channel transfers and
 * programs; returns when the last page is programmed. */
double model_program_stages(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes)
{
    double floor = arrived;
    if (m->ns_per_prog_byte > 0) {
        /* the controller's program path (its power budget and write datapath) moves the data
         * at program_bytes_per_s; each page goes on to its channel as it leaves */
        double dur = (double)nbytes * m->ns_per_prog_byte;
        double piped = model_hold(m, &m->prog_path, arrived, dur);
        uint64_t first = nbytes < m->p.page_bytes ? nbytes : m->p.page_bytes;
        arrived = piped - dur + (double)first * m->ns_per_prog_byte;
        floor = piped + m->p.t_prog_ns;
    }
    /* the data leaves the DRAM write cache as the program path takes it */
    double out = model_dram(m, arrived, nbytes) + m->p.t_prog_ns;
    if (out > floor)
        floor = out;
    double done = model_use_bulk(m, offset, nbytes) ? model_write_bulk(m, arrived, offset, nbytes)
                                              : page_programs(m, arrived, offset, nbytes);
    return done > floor ? done : floor;
}

static double page_programs(sde_model *m, double arrived, uint64_t offset, uint64_t nbytes)
{
    double programmed = arrived;
    uint64_t page = m->p.page_bytes;
    uint64_t end = offset + nbytes;
    for (uint64_t p = offset / page; p * page < end; p++) {
        uint64_t n = model_page_part(p, page, offset, end);
        uint32_t plane, ch;
        model_locate(m, p, &plane, &ch);
        double moved = model_hold(m, &m->channels[ch], arrived, (double)n * m->ns_per_channel_byte);
        double prog = model_hold(m, &m->dies[plane], moved, m->p.t_prog_ns);
        if (prog > programmed)
            programmed = prog;
    }
    return programmed;
}

/* The NAND half of a read from t (after the controller): senses and channel transfers, and
 * the link per page when with_link; returns when the last byte is over (no link latency). */
double model_read_stages(sde_model *m, double t, uint64_t offset, uint64_t nbytes,
                          int with_link)
{
    if (model_use_bulk(m, offset, nbytes))
        return model_read_bulk(m, t, offset, nbytes, with_link);
    double done = t;
    uint64_t page = m->p.page_bytes;
    uint64_t end = offset + nbytes;
    for (uint64_t p = offset / page; p * page < end; p++) {
        uint64_t n = model_page_part(p, page, offset, end);
        uint32_t plane, ch;
        model_locate(m, p, &plane, &ch);
        double sensed = model_hold(m, &m->dies[plane], t, m->p.t_read_ns);
        double moved = model_hold(m, &m->channels[ch], sensed, (double)n * m->ns_per_channel_byte);
        double over = with_link ? model_hold(m, &m->link, moved, (double)n * m->ns_per_link_byte)
                                : moved;
        if (over > done)
            done = over;
    }
    return done;
}
