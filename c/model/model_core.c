/* The timing model's core: resources and their gaps, the model's life, the controller, and
 * where a byte of the media lands (channel, die, row). */
#define _GNU_SOURCE
#include "model_private.h"

static inline void res_ends(struct sde_resource *r)
{
    if (r->gaps.n) {
        r->first_end = sde_gaps_first_end(&r->gaps);
        r->last_end = sde_gaps_last_end(&r->gaps);
    }
}

static void res_init(struct sde_resource *r) { memset(r, 0, sizeof(*r)); }

void model_res_fini(struct sde_resource *r) { sde_gaps_free(&r->gaps); }

double model_res_hold(struct sde_resource *r, double ready, double duration)
{
    r->busy += duration;
    double done;
    if (r->gaps.n && r->last_end > ready && sde_gaps_fit(&r->gaps, ready, duration, &done)) {
        res_ends(r);
        return done;
    }
    double start = ready > r->next_free ? ready : r->next_free;
    if (start > r->next_free && sde_gaps_append(&r->gaps, r->next_free, start) == 0)
        res_ends(r);
    r->next_free = start + duration;
    return r->next_free;
}

void model_res_forget_before(struct sde_resource *r, double t)
{
    sde_gaps_forget_before(&r->gaps, t);
    res_ends(r);
}

/* ---- the model -------------------------------------------------------------------------- */

int sde_model_new(const sde_model_params *p, sde_model **out)
{
    if (!p->channels || p->channels > 0xFFFF /* channels_left packs two */ ||
        !p->dies_per_channel || !p->planes_per_die || !p->page_bytes ||
        !p->cores || p->link_bytes_per_s <= 0 || p->channel_bytes_per_s <= 0)
        return -EINVAL;
    sde_model *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->p = *p;
    m->ops = p->fixed ? &model_fixed_ops : &model_detailed_ops;
    /* Dies, with their planes, are the unit that senses and programs: a die senses or
     * programs the pages of its planes at once (a multi-plane operation), so the model's
     * page is a die-row of planes_per_die pages, and rows stripe channel-first over dies. */
    m->p.page_bytes = p->page_bytes * p->planes_per_die;
    m->p.planes_per_die = 1;
    m->ndies = p->channels * p->dies_per_channel;
    m->cores = calloc(p->cores, sizeof(*m->cores));
    m->dies = calloc(m->ndies, sizeof(*m->dies));
    m->channels = calloc(p->channels, sizeof(*m->channels));
    m->ch_pages = calloc(p->channels, sizeof(uint32_t));
    m->ch_bytes = calloc(p->channels, sizeof(uint64_t));
    m->ch_ready = calloc(p->channels, sizeof(double));
    m->ch_last = calloc(p->channels, sizeof(double));
    if (!m->cores || !m->dies || !m->channels || !m->ch_pages || !m->ch_bytes || !m->ch_ready || !m->ch_last) {
        sde_model_free(m);
        return -ENOMEM;
    }
    res_init(&m->link);
    res_init(&m->link_in);
    res_init(&m->prog_path);
    res_init(&m->dram);
    m->ns_per_dram_byte = p->dram_bytes_per_s > 0 ? 1e9 / p->dram_bytes_per_s : 0.0;
    m->ns_per_prog_byte = p->program_bytes_per_s > 0 ? 1e9 / p->program_bytes_per_s : 0.0;
    if (p->ftl_logical_bytes) {
        m->unit = p->ftl_unit_bytes ? p->ftl_unit_bytes : 4096;
        m->upr = m->p.page_bytes / m->unit;
        uint64_t upl = (uint64_t)m->upr * m->ndies * p->ftl_rows_per_die;
        int r = m->upr && m->p.page_bytes % m->unit == 0 && upl < UINT32_MAX
                    ? sde_ftl_new(p->ftl_logical_bytes / m->unit, p->ftl_lines, (uint32_t)upl,
                                  p->ftl_gc_free_lines, &m->ftl)
                    : -EINVAL;
        if (r < 0) {
            sde_model_free(m);
            return r;
        }
        m->upl = (uint32_t)upl;
        m->ftl_units = p->ftl_logical_bytes / m->unit;
    }
    m->ns_per_link_byte = 1e9 / p->link_bytes_per_s;
    m->ns_per_channel_byte = 1e9 / p->channel_bytes_per_s;
    *out = m;
    return 0;
}

void sde_model_free(sde_model *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; m->cores && i < m->p.cores; i++)
        model_res_fini(&m->cores[i]);
    for (uint32_t i = 0; m->dies && i < m->ndies; i++)
        model_res_fini(&m->dies[i]);
    for (uint32_t i = 0; m->channels && i < m->p.channels; i++)
        model_res_fini(&m->channels[i]);
    model_res_fini(&m->link);
    model_res_fini(&m->link_in);
    model_res_fini(&m->prog_path);
    model_res_fini(&m->dram);
    free(m->cores);
    free(m->dies);
    free(m->channels);
    free(m->cache);
    free(m->ch_pages);
    free(m->ch_bytes);
    free(m->ch_ready);
    free(m->ch_last);
    model_helper_stop(m->helper);
    free(m->batch);
    free(m->batch_first);
    free(m->batch_last);
    sde_ftl_free(m->ftl);
    free(m);
}

void sde_model_set_threads(sde_model *m, uint32_t threads)
{
    m->threads = threads;
}

/* Commands come in time order and every stage is ready at or after its command's submission,
 * so gaps that end before the latest submission can no longer be used.  A resource drops them
 * when it is next booked (lazily: a sweep over every plane per command cost more than the
 * bookings themselves). */
int model_advance(sde_model *m, double submit)
{
    if (submit < m->horizon)
        return -1;
    m->horizon = submit;
    return 0;
}

double model_hold(sde_model *m, struct sde_resource *r, double ready, double duration)
{
    if (r->gaps.n && r->first_end <= m->horizon)
        model_res_forget_before(r, m->horizon);
    return model_res_hold(r, ready, duration);
}

double model_controller(sde_model *m, double submit)
{
    struct sde_resource *best = &m->cores[0];
    for (uint32_t i = 1; i < m->p.cores; i++)
        if (m->cores[i].next_free < best->next_free)
            best = &m->cores[i];
    return model_hold(m, best, submit, m->p.command_overhead_ns);
}

/* The bytes of [offset, end) that fall in page p. */
uint64_t model_page_part(uint64_t p, uint64_t page, uint64_t offset, uint64_t end)
{
    uint64_t lo = p * page > offset ? p * page : offset;
    uint64_t hi = (p + 1) * page < end ? (p + 1) * page : end;
    return hi - lo;
}

/* Page p sits on channel p mod C, die (p div C) mod D, plane (p div C*D) mod P. */
void model_locate(const sde_model *m, uint64_t page, uint32_t *plane, uint32_t *ch)
{
    uint32_t C = m->p.channels, D = m->p.dies_per_channel, P = m->p.planes_per_die;
    *ch = (uint32_t)(page % C);
    uint32_t die = (uint32_t)((page / C) % D);
    uint32_t pl = (uint32_t)((page / ((uint64_t)C * D)) % P);
    *plane = (*ch * D + die) * P + pl;
}
