// generate.c: a checkpoint's or a Hugging Face folder's weights in one
// process, for `trident generate` (generate.h).
#include "generate.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/hf.h"
#include "tokenizer/tokenizer.h"

enum status generator_open(const char *path, struct generator *g, struct error *err) {
    *g = (struct generator){0};
    snprintf(g->path, sizeof g->path, "%s", path);
    struct stat sb;
    if (stat(path, &sb) || !S_ISDIR(sb.st_mode))
        return error_set(err, STATUS_BAD_INPUT, "%s: no such folder (expected a trident checkpoint "
                         "or a Hugging Face folder)", path);
    char cfg[CKPT_PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    g->hf = access(cfg, F_OK) == 0;
    if (g->hf) {
        struct hf_model *h;
        if (hf_open(path, NULL, &h, err)) return err->status;
        g->lc = *hf_config(h);
        const struct hf_meta *meta = hf_model_meta(h);
        g->n_stop = MIN(meta->n_eos, GENERATOR_MAX_STOP);
        for (int i = 0; i < g->n_stop; i++) g->stop_ids[i] = meta->eos_ids[i];
        hf_close(h);
        // Its identity, compared with a --tokenizer file as a checkpoint's is.
        if (tokenizer_folder_identity(path, g->tokenizer_id, sizeof g->tokenizer_id, err))
            return err->status;
        if (g->tokenizer_id[0])
            snprintf(g->tokenizer_json, sizeof g->tokenizer_json, "%s/tokenizer.json", path);
        return STATUS_OK;
    }
    struct ckpt_reader *r;
    if (checkpoint_open(path, &r, err)) return err->status;
    const struct ckpt_info *in = checkpoint_info(r);
    g->lc = in->model;
    snprintf(g->tokenizer_id, sizeof g->tokenizer_id, "%s", in->tokenizer_id);
    checkpoint_close(r);
    // The stop ids `trident import` keeps next to step-000000.
    struct hf_meta meta = {.bos_id = -1, .pad_id = -1};
    bool found = false;
    enum status st = STATUS_OK;
    for (int up = 0; up <= 1 && !found && !st; up++) {
        char gc[CKPT_PATH_MAX + 40];
        snprintf(gc, sizeof gc, "%s%s/generation_config.json", path, up ? "/.." : "");
        st = hf_read_generation_config(gc, g->lc.vocab_size, &meta, &found, err);
    }
    g->n_stop = MIN(meta.n_eos, GENERATOR_MAX_STOP);
    for (int i = 0; i < g->n_stop; i++) g->stop_ids[i] = meta.eos_ids[i];
    return st;
}

enum status generator_load(struct generator *g, int window, int threads, struct error *err) {
    return generator_load_cached(g, 1, window, 0, threads, err);
}

enum status generator_load_cached(struct generator *g, int rows, int window, int cache_len,
                                  int threads, struct error *err) {
    if (window < 1 || window > g->lc.max_seq_len || cache_len < 0 || cache_len > g->lc.max_seq_len)
        return error_set(err, STATUS_BAD_INPUT, "%s: a window of %d tokens (a cache of %d); the "
                         "model's max_seq_len is %d", g->path, window, cache_len, g->lc.max_seq_len);
    g->be = backend_cpu_init(threads);
    struct model_shard shard = model_shard_full(&g->lc);
    if (model_init(&g->m, g->be, &g->lc, &shard, DTYPE_FP32, rows, window, 0, err)) return err->status;
    if (cache_len && model_kv_cache_init(g->m, rows, cache_len, err)) return err->status;
    g->window = window;
    struct hf_model *h = NULL;
    struct ckpt_reader *r = NULL;
    if (g->hf ? hf_open(g->path, NULL, &h, err) : checkpoint_open(g->path, &r, err)) return err->status;
    int n;
    const struct param_info *p = model_params(g->m, &n);
    enum status st = STATUS_OK;
    for (int i = 0; i < n && !st; i++) {
        struct ckpt_piece want = {.grows = p[i].grows, .gcols = p[i].gcols, .rows = p[i].grows,
                                  .cols = p[i].gcols, .flat_end = (size_t)p[i].grows * p[i].gcols,
                                  .dtype = DTYPE_FP32};
        snprintf(want.name, sizeof want.name, "param/%s", p[i].name);
        want.data = xmalloc(want.flat_end * sizeof(float));
        st = h ? hf_read_piece(h, &want, err) : checkpoint_read_piece(r, &want, err);
        if (!st) model_set_param(g->m, &p[i], want.data);
        free(want.data);
    }
    if (h) hf_close(h);
    if (r) checkpoint_close(r);
    return st;
}

void generator_close(struct generator *g) {
    if (g->m) model_free(g->m);
    if (g->be) backend_free(g->be);
    *g = (struct generator){0};
}

int generator_stop_at(const struct generator *g, const int32_t *ids, int n, int eot) {
    for (int i = 0; i < n; i++) {
        if (ids[i] == eot) return i;
        for (int k = 0; k < g->n_stop; k++)
            if (ids[i] == g->stop_ids[k]) return i;
    }
    return n;
}
