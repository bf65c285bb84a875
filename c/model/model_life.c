/* The model's life: made from its parameters (its resources, its FTL), freed (its helper
 * thread stopped), its threads set.  Above every other part of c/model. */
#define _GNU_SOURCE
#include "model_private.h"

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
    model_res_init(&m->link);
    model_res_init(&m->link_in);
    model_res_init(&m->prog_path);
    model_res_init(&m->dram);
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
    free(m->batch_owner);
    free(m->batch_prog);
    free(m->defer_raise);
    free(m->batch_last);
    sde_ftl_free(m->ftl);
    free(m);
}

void sde_model_set_threads(sde_model *m, uint32_t threads)
{
    m->threads = threads;
}
