// hf.c: a Hugging Face folder of one of the families read (hf_open,
// hf_read_piece, hf_import: hf.h), and what the writer (hf_export.c) shares.
#include "hf.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "hf_internal.h"
#include "kernels/cpu/half.h"
#include "safetensors.h"

// ---- what hf_export.c shares (hf_internal.h) ----

int hf_moe_parts(const struct llama_config *lc, const char *name) {
    return lc->moe_experts > 0 && strstr(name, ".mlp.experts.") ? lc->moe_experts : 1;
}

void hf_moe_part_name(enum hf_family f, const char *name, int parts, int e, char *out,
                      size_t cap) {
    int l = -1, at = -1;
    sscanf(name, "model.layers.%d.%n", &l, &at);
    const char *rest = at > 0 ? name + at : "";
    bool mix = f == HF_MIXTRAL;
    static const char *const ours[] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    static const char *const w[] = {"w1.weight", "w3.weight", "w2.weight"};
    if (mix && !strcmp(rest, "mlp.gate.weight")) {
        snprintf(out, cap, "model.layers.%d.block_sparse_moe.gate.weight", l);
    } else if (parts > 1 && !strncmp(rest, "mlp.experts.", 12)) {
        const char *leaf = rest + 12;
        for (int i = 0; i < 3 && mix; i++)
            if (!strcmp(leaf, ours[i])) {
                leaf = w[i];
                break;
            }
        snprintf(out, cap, "model.layers.%d.%s.experts.%d.%s", l, mix ? "block_sparse_moe" : "mlp",
                 e, leaf);
    } else {
        snprintf(out, cap, "%s", name);
    }
}

json_t *hf_ids_json(const int *ids, int n) {
    if (n <= 0) return json_null();
    if (n == 1) return json_integer(ids[0]);
    json_t *l = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(l, json_integer(ids[i]));
    return l;
}

enum status hf_copy_file(const char *from, const char *to, struct error *err) {
    FILE *in = fopen(from, "rb");
    if (!in) return error_set(err, STATUS_BAD_INPUT, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return error_set(err, STATUS_RUNTIME, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = !ferror(in) && ok;
    fclose(in);
    ok = (fclose(out) == 0) && ok;
    return ok ? STATUS_OK : error_set(err, STATUS_RUNTIME, "%s: cannot copy to %s", from, to);
}

// ---- reading a Hugging Face folder ----

enum { HF_READ_FILES = HF_MAX_SHARDS };

struct hf_entry {
    const struct safetensors_tensor *t;
    int file;
};

// A tensor of the folder the model needs: part `part` of trident's
// parameter `param` (moe_parts).
struct hf_want {
    char name[CKPT_NAME_MAX]; // the folder's name (moe_part_name)
    int64_t rows, cols;       // its shape (cols 1: a vector)
    int param, part;
};

struct hf_model {
    char dir[CKPT_PATH_MAX];
    struct llama_config lc;
    struct hf_meta meta;
    struct param_info *params; // (n_params,) the model's tensors (trident's names), sorted by name
    int n_params;
    struct hf_want *want;      // (n_want,) the folder's tensors they are made of, sorted by name
    int n_want;
    int n_files;
    struct safetensors_file *files[HF_READ_FILES];
    char file_names[HF_READ_FILES][256];
    int n;
    struct hf_entry *e; // (n,) sorted by name
};

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const struct hf_entry *)a)->t->name, ((const struct hf_entry *)b)->t->name);
}

void hf_close(struct hf_model *h) {
    if (!h) return;
    for (int i = 0; i < h->n_files; i++) safetensors_close(h->files[i]);
    free(h->e);
    free(h->params);
    free(h->want);
    free(h);
}

const struct llama_config *hf_config(const struct hf_model *h) { return &h->lc; }
int hf_eos_id(const struct hf_model *h) { return h->meta.n_eos ? h->meta.eos_ids[0] : -1; }
const struct hf_meta *hf_model_meta(const struct hf_model *h) { return &h->meta; }
int hf_n_tensors(const struct hf_model *h) { return h->n; }
const struct safetensors_tensor *hf_tensor_at(const struct hf_model *h, int i) {
    return i >= 0 && i < h->n ? h->e[i].t : NULL;
}

static enum status add_file(struct hf_model *h, const char *name, struct error *err) {
    if (h->n_files == HF_READ_FILES)
        return error_set(err, STATUS_BAD_INPUT, "%s: more than %d safetensors files", h->dir,
                         HF_READ_FILES);
    char path[CKPT_PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", h->dir, name);
    snprintf(h->file_names[h->n_files], sizeof h->file_names[0], "%s", name);
    return safetensors_open(path, &h->files[h->n_files++], err) ? (h->n_files--, err->status)
                                                                 : STATUS_OK;
}

static int cmp_param(const void *a, const void *b) {
    return strcmp(((const struct param_info *)a)->name, ((const struct param_info *)b)->name);
}

static int cmp_want(const void *a, const void *b) {
    return strcmp(((const struct hf_want *)a)->name, ((const struct hf_want *)b)->name);
}

// h->want from h->params: every parameter's parts under the family's names.
static void want_table(struct hf_model *h) {
    int n = 0;
    for (int i = 0; i < h->n_params; i++) n += hf_moe_parts(&h->lc, h->params[i].name);
    h->want = xcalloc((size_t)n + 1, sizeof *h->want);
    for (int i = 0; i < h->n_params; i++) {
        const struct param_info *p = &h->params[i];
        int parts = hf_moe_parts(&h->lc, p->name);
        for (int e = 0; e < parts; e++) {
            struct hf_want *w = &h->want[h->n_want++];
            hf_moe_part_name(h->meta.family, p->name, parts, e, w->name, sizeof w->name);
            w->rows = p->grows / parts, w->cols = p->gcols, w->param = i, w->part = e;
        }
    }
    qsort(h->want, (size_t)h->n_want, sizeof *h->want, cmp_want);
}

static const struct hf_want *want_find(const struct hf_model *h, const char *name) {
    struct hf_want key;
    size_t len = strlen(name);
    if (len >= sizeof key.name) return NULL;
    memcpy(key.name, name, len + 1);
    return bsearch(&key, h->want, (size_t)h->n_want, sizeof *h->want, cmp_want);
}

// The shape the model of config.json gives a tensor name of the folder (its
// parameter table through want_table), or ndim 0 for a name it does not have.
static int expected_shape(const struct hf_model *h, const char *name, int64_t *shape) {
    const struct hf_want *w = want_find(h, name);
    if (!w) return 0;
    shape[0] = w->rows, shape[1] = w->cols;
    return w->cols == 1 ? 1 : 2;
}

static const struct hf_entry *hf_find(const struct hf_model *h, const char *name);

// The tensors the model needs that the folder lacks: how many, and the first
// few named in buf ("a, b, c, ...").
static void missing_tensors(const struct hf_model *h, char *buf, size_t cap, int *n_missing) {
    size_t used = 0;
    buf[0] = '\0';
    *n_missing = 0;
    for (int i = 0; i < h->n_want; i++) {
        if (hf_find(h, h->want[i].name)) continue;
        if (*n_missing < 3 && used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", *n_missing ? ", " : "",
                                     h->want[i].name);
        else if (*n_missing == 3 && used < cap) used += (size_t)snprintf(buf + used, cap - used, ", ...");
        (*n_missing)++;
    }
}

// A weight_map value: a plain file name of a safetensors file in the folder.
static bool shard_name_ok(const char *fn) {
    size_t n = fn ? strlen(fn) : 0;
    return n > 12 && n < 256 && !strchr(fn, '/') && !strcmp(fn + n - 12, ".safetensors") &&
           fn[0] != '.';
}

enum status hf_open(const char *dir, const struct llama_config *expect, struct hf_model **out,
                    struct error *err) {
    *out = NULL;
    struct hf_model *h = xcalloc(1, sizeof *h);
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    enum status st = hf_read_config(dir, &h->lc, &h->meta, err);
    // The run's model against config.json first: a wrong hidden_size is named
    // as such, not through a tensor's shape.
    if (!st && expect) st = hf_check_model(h, expect, err);
    // Every count in h->lc is bounded (hf_read_config): the table is small.
    if (!st && model_param_table(&h->lc, &h->params, &h->n_params, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        st = error_set(err, STATUS_BAD_INPUT, "%s/config.json: not a model trident builds: %s", dir, why);
    }
    if (!st) qsort(h->params, (size_t)h->n_params, sizeof *h->params, cmp_param);
    if (!st) want_table(h);
    const char *arch = hf_family_arch(h->meta.family);
    char idx[CKPT_PATH_MAX + 40];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    json_t *j = NULL, *wm = NULL;
    bool no_index = true;
    if (!st) st = hf_load_json(idx, 16u << 20, &j, &no_index, err);
    if (!st && !no_index) {
        wm = json_object_get(j, "weight_map");
        if (!json_is_object(wm)) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: no weight_map object", idx);
        } else {
            // The distinct file names, in order of first mention.
            const char *k;
            json_t *v;
            json_object_foreach(wm, k, v) {
                const char *fn = json_string_value(v);
                if (!shard_name_ok(fn)) {
                    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
                    st = error_set(err, STATUS_BAD_INPUT, "%s: weight_map[\"%s\"] = %.80s is not "
                                   "the name of a safetensors file in the folder (a plain name "
                                   "ending in .safetensors)", idx, k, s ? s : "?");
                    free(s);
                    break;
                }
                bool seen = false;
                for (int i = 0; i < h->n_files && !seen; i++) seen = !strcmp(h->file_names[i], fn);
                if (!seen && (st = add_file(h, fn, err))) break;
            }
        }
    } else if (!st) {
        st = add_file(h, "model.safetensors", err);
    }
    int total = 0;
    for (int i = 0; i < h->n_files; i++) total += safetensors_n_tensors(h->files[i]);
    h->e = xcalloc((size_t)total + 1, sizeof *h->e);
    for (int i = 0; i < h->n_files && !st; i++)
        for (int k = 0; k < safetensors_n_tensors(h->files[i]); k++)
            h->e[h->n++] = (struct hf_entry){safetensors_tensor_at(h->files[i], k), i};
    qsort(h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
    for (int i = 1; i < h->n && !st; i++)
        if (!strcmp(h->e[i].t->name, h->e[i - 1].t->name))
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is in two safetensors files",
                           dir, h->e[i].t->name);
    // Every tensor is one the model has, of its shape, and none is missing.
    int want = 0;
    for (int i = 0; i < h->n && !st; i++) {
        const struct safetensors_tensor *t = h->e[i].t;
        int64_t shape[2];
        int nd = expected_shape(h, t->name, shape);
        if (!nd && !strcmp(t->name, "lm_head.weight")) continue; // tied: a saved copy
        if (!nd) {
            if (strstr(t->name, "rotary_emb.inv_freq")) continue; // older transformers saved it
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is not a parameter of "
                           "%s with this config.json", dir, t->name, arch);
        } else if (t->ndim != nd || t->shape[0] != shape[0] || (nd == 2 && t->shape[1] != shape[1]))
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s has %d dimensions (%lld, %lld), "
                           "config.json implies (%lld, %lld)", dir, t->name, t->ndim,
                           (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 1),
                           (long long)shape[0], (long long)(nd > 1 ? shape[1] : 1));
        else if (t->dtype != DTYPE_FP32 && t->dtype != DTYPE_BF16 && t->dtype != DTYPE_FP16)
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is %s; expected F32, BF16 or F16",
                           dir, t->name, safetensors_dtype_name(t->dtype));
        else want++;
    }
    // Each tensor is in the shard the index names.
    const char *k;
    json_t *v;
    if (!st && json_is_object(wm)) json_object_foreach(wm, k, v) {
        const struct hf_entry *e = hf_find(h, k);
        const char *fn = json_string_value(v);
        if (!e || strcmp(h->file_names[e->file], fn)) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: weight_map puts tensor %s in %s, which "
                           "does not hold it%s%s", idx, k, fn, e ? "; it is in " : "",
                           e ? h->file_names[e->file] : "");
            break;
        }
    }
    json_decref(j);
    char names[400];
    int n_missing = 0;
    if (!st) missing_tensors(h, names, sizeof names, &n_missing);
    if (!st && want != h->n_want)
        st = error_set(err, STATUS_BAD_INPUT, "%s: %d of the %d tensors %s needs are present; "
                       "missing: %s", dir, h->n_want - n_missing, h->n_want, arch, names);
    if (st) hf_close(h);
    else *out = h;
    return st;
}

static const struct hf_entry *hf_find(const struct hf_model *h, const char *name) {
    struct safetensors_tensor key;
    snprintf(key.name, sizeof key.name, "%s", name);
    struct hf_entry k = {&key, 0};
    return bsearch(&k, h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
}

enum status hf_check_model(const struct hf_model *h, const struct llama_config *m,
                           struct error *err) {
    const struct llama_config *f = &h->lc;
    // ffn_dim is the dense layers' width: compared where the folder has them
    // (Mixtral's intermediate_size is its experts', compared as moe_ffn_dim).
    bool dense = !f->moe_experts || f->moe_first_dense_layers > 0, moe = f->moe_experts > 0;
    struct {
        const char *hf, *ours;
        int a, b;
        bool used;
    } ints[] = {{"hidden_size", "d_model", f->d_model, m->d_model, true},
                {"intermediate_size", "ffn_dim", f->ffn_dim, m->ffn_dim, dense},
                {"num_local_experts / num_experts (0: a dense model)", "moe_experts",
                 f->moe_experts, m->moe_experts, true},
                {"num_experts_per_tok", "moe_top_k", f->moe_top_k, m->moe_top_k, moe},
                {"the experts' width (Mixtral intermediate_size, Qwen2-MoE moe_intermediate_size)",
                 "moe_ffn_dim (0: ffn_dim)", llama_moe_ffn(f), llama_moe_ffn(m), moe},
                {"shared_expert_intermediate_size (Mixtral: none)",
                 "moe_shared_ffn_dim (0: moe_ffn_dim) with moe_shared_experts",
                 llama_moe_shared_ffn(f), llama_moe_shared_ffn(m), moe},
                {"architectures (Qwen2-MoE: the shared expert's sigmoid gate)", "moe_shared_gate",
                 llama_moe_shared_ffn(f) > 0 && f->moe_shared_gate,
                 llama_moe_shared_ffn(m) > 0 && m->moe_shared_gate, moe},
                {"norm_topk_prob (Mixtral: true)", "moe_norm_topk", f->moe_norm_topk,
                 m->moe_norm_topk, moe},
                {"decoder_sparse_step, mlp_only_layers (the dense layers first)",
                 "moe_first_dense_layers", f->moe_first_dense_layers, m->moe_first_dense_layers,
                 moe},
                {"num_attention_heads", "n_heads", f->n_heads, m->n_heads, true},
                {"num_key_value_heads", "n_kv_heads", f->n_kv_heads, m->n_kv_heads, true},
                {"num_hidden_layers", "n_layers", f->n_layers, m->n_layers, true},
                {"vocab_size", "vocab_size", f->vocab_size, m->vocab_size, true},
                {"tie_word_embeddings", "tie_embeddings", f->tie_embeddings, m->tie_embeddings, true},
                {"head_dim", "head_dim", f->head_dim ? f->head_dim : f->d_model / f->n_heads,
                 m->head_dim ? m->head_dim : m->d_model / m->n_heads, true},
                {"architectures (Qwen2, Qwen2-MoE: q/k/v biases)", "qkv_bias", f->qkv_bias,
                 m->qkv_bias, true},
                {"architectures (Qwen3: q/k norms)", "qk_norm", f->qk_norm, m->qk_norm, true}};
    // Every difference in one message: a folder of another model usually
    // differs in several keys, and one refusal per key is a round trip each.
    char msg[sizeof err->msg];
    size_t n = sizeof msg, k = 0;
    int diffs = 0;
#define PUT(...) (k += (size_t)snprintf(msg + MIN(k, n), n - MIN(k, n), __VA_ARGS__))
#define DIFF(...) (PUT("%s", diffs++ ? "; " : ""), PUT(__VA_ARGS__))
    PUT("%s/config.json: ", h->dir);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].used && ints[i].a != ints[i].b)
            DIFF("%s = %d, the run's [model] %s = %d", ints[i].hf, ints[i].a, ints[i].ours,
                 ints[i].b);
    if (f->rope_theta != m->rope_theta)
        DIFF("rope_theta = %.17g, the run's [model] rope_theta = %.17g", f->rope_theta,
             m->rope_theta);
    const struct rope_scaling *a = &f->rope_scaling, *b = &m->rope_scaling;
    static const char *const rs_names[] = {"none", "linear", "llama3"};
    if (a->type != b->type ||
        (a->type != ROPE_SCALING_NONE && a->factor != b->factor) ||
        (a->type == ROPE_SCALING_LLAMA3 &&
         (a->low_freq_factor != b->low_freq_factor || a->high_freq_factor != b->high_freq_factor ||
          a->original_max_pos != b->original_max_pos)))
        DIFF("rope_scaling = %s (factor %g, low_freq_factor %g, high_freq_factor %g, "
             "original_max_position_embeddings %d), the run's [model] rope_scaling = %s "
             "(factor %g, %g, %g, %d)", rs_names[a->type], a->factor, a->low_freq_factor,
             a->high_freq_factor, a->original_max_pos, rs_names[b->type], b->factor,
             b->low_freq_factor, b->high_freq_factor, b->original_max_pos);
    if (f->norm_eps != m->norm_eps)
        DIFF("rms_norm_eps = %.9g, the run's [model] norm_eps = %.9g", (double)f->norm_eps,
             (double)m->norm_eps);
    if (diffs > 1) PUT(" (%d differences)", diffs);
#undef DIFF
#undef PUT
    if (k >= n) memcpy(msg + n - 4, "...", 4); // truncated: say so
    if (diffs) return error_set(err, STATUS_BAD_INPUT, "%s", msg);
    return STATUS_OK;
}

enum status hf_read_piece(struct hf_model *h, struct ckpt_piece *want, struct error *err) {
    const char *name = strncmp(want->name, "param/", 6) ? want->name : want->name + 6;
    // The folder's tensors of this one: trident's stacked experts are E of
    // them, each prow rows (want_table).
    int parts = hf_moe_parts(&h->lc, name), prow = want->grows / parts;
    const struct hf_entry **src = xcalloc((size_t)parts, sizeof *src);
    char pname[CKPT_NAME_MAX];
    enum status st = want->dtype != DTYPE_FP32 || want->grows % parts
                         ? error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: read as F32 in %d "
                                     "parts of equal rows, (%d, %d) asked", h->dir, name, parts,
                                     want->grows, want->gcols)
                         : STATUS_OK;
    for (int e = 0; e < parts && !st; e++) {
        hf_moe_part_name(h->meta.family, name, parts, e, pname, sizeof pname);
        src[e] = hf_find(h, pname);
        if (!src[e]) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: no tensor %s", h->dir, pname);
            break;
        }
        const struct safetensors_tensor *t = src[e]->t;
        int64_t cols = t->ndim > 1 ? t->shape[1] : 1;
        if (t->shape[0] != prow || cols != want->gcols)
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is (%lld, %lld), the model's is "
                           "(%d, %d)", h->dir, pname, (long long)t->shape[0], (long long)cols,
                           prow, want->gcols);
    }
    float *dst = want->data;
    uint32_t *row = xmalloc((size_t)want->cols * sizeof *row); // F32, BF16, F16: <= 4 bytes each
    for (size_t i = want->flat_begin; i < want->flat_end && !st;) {
        size_t br = i / (size_t)want->cols, bc = i % (size_t)want->cols;
        size_t run = MIN((size_t)want->cols - bc, want->flat_end - i);
        size_t R = (size_t)want->row_offset + br; // the row of trident's whole tensor
        const struct hf_entry *e = src[R / (size_t)prow];
        const struct safetensors_tensor *t = e->t;
        size_t es = dtype_size(t->dtype);
        uint64_t at = ((uint64_t)(R % (size_t)prow) * (uint64_t)want->gcols + want->col_offset + bc) * es;
        st = safetensors_read(h->files[e->file], t, at, run * es, row, err);
        for (size_t k = 0; k < run && !st; k++) {
            float v = t->dtype == DTYPE_FP32   ? ((float *)row)[k]
                      : t->dtype == DTYPE_BF16 ? bf16_to_f32(((uint16_t *)row)[k])
                                               : fp16_to_f32(((uint16_t *)row)[k]);
            dst[i - want->flat_begin + k] = v;
        }
        i += run;
    }
    free(row);
    // A NaN or an infinity would train to a NaN loss or generate garbage; a
    // trident checkpoint never holds one (checkpoint_write_rank refuses it).
    size_t first = 0, bad = st ? 0 : ckpt_count_nonfinite(dst, DTYPE_FP32,
                                                          want->flat_end - want->flat_begin, &first);
    if (bad) {
        size_t f = want->flat_begin + first, cols = (size_t)want->gcols;
        size_t R = want->row_offset + f / (size_t)want->cols, c = want->col_offset + f % (size_t)want->cols;
        size_t r = R % (size_t)prow;
        const struct hf_entry *e = src[R / (size_t)prow];
        st = error_set(err, STATUS_BAD_INPUT, "%s/%s: tensor %s holds %zu non-finite values in "
                       "the part read; the first at element %zu (row %zu, column %zu): %g",
                       h->dir, h->file_names[e->file], e->t->name, bad, r * cols + c, r, c,
                       (double)dst[first]);
    }
    free(src);
    return st;
}

enum status hf_write_generation_config(const char *path, const struct hf_meta *meta,
                                       struct error *err) {
    json_t *g = json_object();
    json_object_set_new(g, "bos_token_id", meta->bos_id >= 0 ? json_integer(meta->bos_id) : json_null());
    json_object_set_new(g, "eos_token_id", hf_ids_json(meta->eos_ids, meta->n_eos));
    if (meta->pad_id >= 0) json_object_set_new(g, "pad_token_id", json_integer(meta->pad_id));
    char tmp[CKPT_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    enum status st = STATUS_OK;
    if (json_dump_file(g, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) || rename(tmp, path)) {
        unlink(tmp);
        st = error_set(err, STATUS_RUNTIME, "%s: cannot write: %s", path, strerror(errno));
    }
    json_decref(g);
    return st;
}

enum status hf_import(struct hf_model *h, const char *dir, const char *tokenizer_id,
                      struct error *err) {
    char latest[CKPT_PATH_MAX + 16];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    if (access(latest, F_OK) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: holds checkpoints (%s); import writes into "
                         "a new dir", dir, latest);
    // Every parameter of the model whole, under trident's names (the
    // stacked experts assembled by hf_read_piece).
    struct ckpt_piece *p = xcalloc((size_t)h->n_params + 1, sizeof *p);
    int n = 0;
    enum status st = STATUS_OK;
    for (int i = 0; i < h->n_params && !st; i++) {
        const struct param_info *pi = &h->params[i];
        struct ckpt_piece *q = &p[n++];
        snprintf(q->name, sizeof q->name, "param/%s", pi->name);
        q->grows = q->rows = pi->grows;
        q->gcols = q->cols = pi->gcols;
        q->flat_end = (size_t)q->rows * q->cols, q->dtype = DTYPE_FP32;
        q->data = xmalloc(q->flat_end * sizeof(float));
        st = hf_read_piece(h, q, err);
    }
    struct ckpt_file_sum sum;
    struct ckpt_save_args a = {.dir = dir, .step = 0, .layout = topology_layout(1, 1, 1, 0, 1), .rank = 0,
                               .model = &h->lc, .tokenizer_id = tokenizer_id ? tokenizer_id : "",
                               .pieces = p, .n_pieces = n, .weights_only = true}; // no training state: /state holds step alone
    if (!st && mkdir(dir, 0777) && errno != EEXIST)
        st = error_set(err, STATUS_BAD_INPUT, "%s: cannot create: %s", dir, strerror(errno));
    // The folder's tokenizer.json kept next to step-000000, where generate and
    // ckpt export look for it (docs/formats.md "Hugging Face import").
    char tok_from[CKPT_PATH_MAX + 16], tok_to[CKPT_PATH_MAX + 16];
    snprintf(tok_from, sizeof tok_from, "%s/tokenizer.json", h->dir);
    snprintf(tok_to, sizeof tok_to, "%s/tokenizer.json", dir);
    if (!st && access(tok_from, F_OK) == 0) st = hf_copy_file(tok_from, tok_to, err);
    // Its token ids, for generate's stop ids and the export's config.
    if (!st) {
        char gc[CKPT_PATH_MAX + 40];
        snprintf(gc, sizeof gc, "%s/generation_config.json", dir);
        st = hf_write_generation_config(gc, &h->meta, err);
    }
    if (!st) st = checkpoint_prepare(&a, err);
    if (!st) st = checkpoint_write_rank(&a, &sum, err);
    if (!st) st = checkpoint_commit(&a, &sum, err);
    for (int i = 0; i < n; i++) free(p[i].data);
    free(p);
    return st;
}
