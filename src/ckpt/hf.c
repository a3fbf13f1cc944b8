// hf.c: a checkpoint written as a Hugging Face LlamaForCausalLM folder (hf.h).
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

enum { HF_MAX_FILES = 64 };

// The file names written so far under the .tmp folder (removed on failure).
struct written {
    char dir[CKPT_PATH_MAX];
    char names[HF_MAX_FILES + 8][64];
    int n;
};

static void written_path(struct written *w, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", w->dir, name);
    if (w->n < HF_MAX_FILES + 8) snprintf(w->names[w->n++], sizeof w->names[0], "%s", name);
}

static enum status write_json(struct written *w, const char *name, json_t *j, struct error *err) {
    char path[CKPT_PATH_MAX + 64];
    written_path(w, name, path, sizeof path);
    int bad = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(16));
    json_decref(j);
    return bad ? error_set(err, STATUS_RUNTIME, "%s: cannot write", path) : STATUS_OK;
}

// The shortest decimal that reads back as the float f (1e-05, not 9.99999975e-06).
static double shortest_float(float f) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static const char *torch_dtype(enum dtype d) {
    return d == DTYPE_BF16 ? "bfloat16" : d == DTYPE_FP16 ? "float16" : "float32";
}

// ---- trident's tensor names and the folder's ----

// The folder's tensors that make trident's tensor `name` (a row of the
// parameter table): moe_experts of them for the stacked routed experts
// (model.layers.L.mlp.experts.{gate,up,down}_proj.weight: expert e's matrix
// is rows [e grows / E, (e + 1) grows / E) of trident's), else 1.
static int moe_parts(const struct llama_config *lc, const char *name) {
    return lc->moe_experts > 0 && strstr(name, ".mlp.experts.") ? lc->moe_experts : 1;
}

// The folder's name of part e of trident's tensor `name` (parts:
// moe_parts) in family f, into out (cap bytes). Qwen2-MoE: the stacked
// mlp.experts.X.weight is mlp.experts.e.X.weight; Mixtral
// (MixtralSparseMoeBlock): mlp.gate is block_sparse_moe.gate and the
// experts block_sparse_moe.experts.e.w1 (gate_proj), w3 (up_proj), w2
// (down_proj). Every other name is the same in every family.
static void moe_part_name(enum hf_family f, const char *name, int parts, int e, char *out,
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

static bool family_moe(enum hf_family f) { return f == HF_MIXTRAL || f == HF_QWEN2_MOE; }

// An id list as JSON: null (none), one integer, or a list.
static json_t *ids_json(const int *ids, int n) {
    if (n <= 0) return json_null();
    if (n == 1) return json_integer(ids[0]);
    json_t *l = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(l, json_integer(ids[i]));
    return l;
}

static json_t *rope_scaling_json(const struct rope_scaling *r) {
    if (r->type == ROPE_SCALING_LINEAR)
        return json_pack("{s:s, s:f}", "rope_type", "linear", "factor", r->factor);
    if (r->type == ROPE_SCALING_LLAMA3)
        return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", r->factor,
                         "low_freq_factor", r->low_freq_factor, "high_freq_factor",
                         r->high_freq_factor, "original_max_position_embeddings",
                         r->original_max_pos);
    return json_null();
}

// The family a->family asks for, else the one the model needs (Qwen3 for q/k
// norms, Qwen2 for q/k/v biases), else meta's, else Llama. Errors: a model
// the family's transformers class cannot hold, naming both.
static enum status export_family(const struct llama_config *m, const struct hf_export_args *a,
                                 enum hf_family *out, struct error *err) {
    enum hf_family f = a->family >= 0                 ? (enum hf_family)a->family
                       : m->qk_norm                   ? HF_QWEN3
                       : m->qkv_bias                  ? HF_QWEN2
                       : a->meta                      ? a->meta->family
                                                      : HF_LLAMA;
    if (m->moe_experts) {
        // Qwen2-MoE: q/k/v biases and a gated shared expert; Mixtral: neither,
        // renormalised top-k, every layer sparse, no rope_scaling.
        f = m->qkv_bias ? HF_QWEN2_MOE : HF_MIXTRAL;
        bool mix = f == HF_MIXTRAL;
        const char *why =
            m->qk_norm ? "q/k norms"
            : m->head_dim && m->head_dim * m->n_heads != m->d_model
                ? "a head_dim other than hidden_size / heads"
            : mix && m->moe_shared_experts
                ? "a shared expert and no q/k/v biases (Qwen2MoeForCausalLM has both)"
            : mix && !m->moe_norm_topk ? "moe_norm_topk = false (Mixtral renormalises the top k)"
            : mix && m->moe_first_dense_layers ? "dense layers (moe_first_dense_layers > 0)"
            : mix && m->rope_scaling.type != ROPE_SCALING_NONE ? "rope_scaling"
            : !mix && !m->moe_shared_experts
                ? "q/k/v biases and no shared expert (Qwen2MoeForCausalLM has both, Mixtral neither)"
            : !mix && !m->moe_shared_gate ? "an ungated shared expert (moe_shared_gate = false)"
                                          : NULL;
        if (why)
            return error_set(err, STATUS_BAD_INPUT, "%s cannot hold a mixture-of-experts model "
                             "with %s", hf_family_arch(f), why);
        return *out = f, STATUS_OK;
    }
    if (family_moe(f)) f = m->qkv_bias ? HF_QWEN2 : HF_LLAMA; // a dense model: no experts
    if (f == HF_QWEN2 && !m->qkv_bias) f = HF_LLAMA; // Qwen2 always has the biases
    if (f == HF_QWEN3 && !m->qk_norm) f = HF_LLAMA;  // Qwen3 always has the norms
    const char *why = m->qkv_bias && m->qk_norm ? "both q/k/v biases and q/k norms"
                      : f == HF_QWEN2 && m->head_dim && m->head_dim * m->n_heads != m->d_model
                          ? "a head_dim other than hidden_size / heads"
                      : f == HF_MISTRAL && m->rope_scaling.type != ROPE_SCALING_NONE ? "rope_scaling"
                      : (f == HF_LLAMA || f == HF_MISTRAL) && (m->qkv_bias || m->qk_norm)
                          ? "q/k/v biases or q/k norms"
                          : NULL;
    if (why)
        return error_set(err, STATUS_BAD_INPUT, "%s cannot hold a model with %s", hf_family_arch(f), why);
    return *out = f, STATUS_OK;
}

// config.json: the keys the family's config class reads (transformers'
// models/{llama,qwen2,qwen3,mistral}/configuration_*.py; docs/formats.md).
static json_t *config_json(const struct llama_config *m, enum hf_family f, enum dtype d,
                           int bos, const int *eos, int n_eos, int pad) {
    json_t *j = json_object();
    int D = m->head_dim ? m->head_dim : m->d_model / m->n_heads;
    json_object_set_new(j, "architectures", json_pack("[s]", hf_family_arch(f)));
    json_object_set_new(j, "model_type", json_string(hf_family_model_type(f)));
    json_object_set_new(j, "vocab_size", json_integer(m->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(m->d_model));
    // Mixtral's intermediate_size is its experts' width; Qwen2-MoE's the dense layers'
    json_object_set_new(j, "intermediate_size",
                        json_integer(f == HF_MIXTRAL ? llama_moe_ffn(m) : m->ffn_dim));
    json_object_set_new(j, "num_hidden_layers", json_integer(m->n_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(m->n_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(m->n_kv_heads));
    if (f == HF_LLAMA || f == HF_QWEN3 || f == HF_MISTRAL)
        json_object_set_new(j, "head_dim", json_integer(D)); // the others: hidden / heads
    json_object_set_new(j, "max_position_embeddings", json_integer(m->max_seq_len));
    json_object_set_new(j, "rope_theta", json_real(m->rope_theta));
    if (f != HF_MISTRAL && f != HF_MIXTRAL)
        json_object_set_new(j, "rope_scaling", rope_scaling_json(&m->rope_scaling));
    json_object_set_new(j, "rms_norm_eps", json_real(shortest_float(m->norm_eps)));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    if (f == HF_LLAMA || f == HF_QWEN3) json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    if (f == HF_LLAMA) {
        json_object_set_new(j, "mlp_bias", json_false());
        json_object_set_new(j, "pretraining_tp", json_integer(1));
    }
    if (f != HF_LLAMA) json_object_set_new(j, "sliding_window", json_null());
    if (f == HF_QWEN2 || f == HF_QWEN3 || f == HF_QWEN2_MOE) {
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "max_window_layers", json_integer(m->n_layers));
    }
    if (f == HF_MIXTRAL) {
        json_object_set_new(j, "num_local_experts", json_integer(m->moe_experts));
        json_object_set_new(j, "router_jitter_noise", json_real(0.0));
    }
    if (f == HF_QWEN2_MOE) {
        json_object_set_new(j, "num_experts", json_integer(m->moe_experts));
        json_object_set_new(j, "moe_intermediate_size", json_integer(llama_moe_ffn(m)));
        json_object_set_new(j, "shared_expert_intermediate_size",
                            json_integer(llama_moe_shared_ffn(m)));
        json_object_set_new(j, "norm_topk_prob", json_boolean(m->moe_norm_topk));
        json_object_set_new(j, "decoder_sparse_step", json_integer(1));
        json_t *dense = json_array(); // the first moe_first_dense_layers layers
        for (int l = 0; l < m->moe_first_dense_layers; l++) json_array_append_new(dense, json_integer(l));
        json_object_set_new(j, "mlp_only_layers", dense);
    }
    if (family_moe(f)) {
        json_object_set_new(j, "num_experts_per_tok", json_integer(m->moe_top_k));
        json_object_set_new(j, "router_aux_loss_coef", json_real(m->moe_aux_loss_coeff));
        json_object_set_new(j, "output_router_logits", json_false());
    }
    json_object_set_new(j, "tie_word_embeddings", json_boolean(m->tie_embeddings));
    json_object_set_new(j, "torch_dtype", json_string(torch_dtype(d)));
    json_object_set_new(j, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
    json_object_set_new(j, "eos_token_id", ids_json(eos, n_eos));
    if (pad >= 0) json_object_set_new(j, "pad_token_id", json_integer(pad));
    json_object_set_new(j, "use_cache", json_true());
    return j;
}

static enum status copy_file(const char *from, const char *to, struct error *err) {
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

// One parameter read whole and converted to the export dtype.
struct hf_tensor {
    char name[CKPT_NAME_MAX];
    int rows, cols;
    void *data; // (rows * cols,) of the export dtype
    uint64_t bytes;
    bool view;  // data is inside another entry's (an expert of a stacked tensor): not freed
};

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const struct hf_tensor *)a)->name, ((const struct hf_tensor *)b)->name);
}

// t (n, trident's names) as family f's tensors in name order: each stacked
// expert tensor split into its experts' (views into its data), Mixtral's
// names (moe_part_name). Frees t; *out: xmalloc'd.
static void to_family_names(const struct llama_config *m, enum hf_family f, struct hf_tensor *t,
                            int n, enum dtype d, struct hf_tensor **out, int *n_out) {
    int total = 0;
    for (int i = 0; i < n; i++) total += moe_parts(m, t[i].name);
    struct hf_tensor *o = xcalloc((size_t)total + 1, sizeof *o);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int parts = moe_parts(m, t[i].name), rows = t[i].rows / parts;
        for (int e = 0; e < parts; e++) {
            struct hf_tensor *q = &o[k++];
            *q = t[i];
            moe_part_name(f, t[i].name, parts, e, q->name, sizeof q->name);
            q->rows = rows, q->bytes = (uint64_t)rows * t[i].cols * dtype_size(d);
            q->data = (char *)t[i].data + (size_t)e * q->bytes;
            q->view = e > 0;
        }
    }
    qsort(o, (size_t)k, sizeof *o, cmp_tensor);
    free(t);
    *out = o, *n_out = k;
}

static enum status read_params(struct ckpt_reader *r, int want_dtype, enum dtype *out_dtype,
                               struct hf_tensor **out, int *n_out, struct error *err) {
    int n = checkpoint_n_pieces(r), k = 0;
    struct hf_tensor *t = xcalloc((size_t)n + 1, sizeof *t);
    enum status st = STATUS_OK;
    enum dtype d = DTYPE_FP32;
    for (int i = 0; i < n && !st; i++) {
        const struct ckpt_piece *p = checkpoint_piece_at(r, i, NULL);
        if (strncmp(p->name, "param/", 6)) continue;
        if (i > 0 && !strcmp(checkpoint_piece_at(r, i - 1, NULL)->name, p->name)) continue;
        if (k == 0) d = want_dtype >= 0 ? (enum dtype)want_dtype : p->dtype;
        if (d != DTYPE_FP32 && d != DTYPE_BF16 && d != DTYPE_FP16) d = DTYPE_FP32;
        struct ckpt_piece want = *p;
        want.row_offset = want.col_offset = 0, want.rows = p->grows, want.cols = p->gcols;
        want.flat_begin = 0, want.flat_end = (size_t)p->grows * p->gcols;
        // Read as stored (fp32 as fp32, bf16 as bf16), then convert.
        want.dtype = (p->dtype == DTYPE_FP64) ? DTYPE_FP32 : p->dtype;
        want.data = xmalloc(want.flat_end * dtype_size(want.dtype));
        st = checkpoint_read_piece(r, &want, err);
        size_t numel = want.flat_end;
        void *conv = want.data;
        if (!st && want.dtype != d) {
            conv = xmalloc(numel * dtype_size(d));
            for (size_t e = 0; e < numel; e++) {
                float v = want.dtype == DTYPE_FP32   ? ((float *)want.data)[e]
                          : want.dtype == DTYPE_BF16 ? bf16_to_f32(((uint16_t *)want.data)[e])
                                                     : fp16_to_f32(((uint16_t *)want.data)[e]);
                if (d == DTYPE_FP32) ((float *)conv)[e] = v;
                else if (d == DTYPE_BF16) ((uint16_t *)conv)[e] = bf16_from_f32(v);
                else ((uint16_t *)conv)[e] = fp16_from_f32(v);
            }
            free(want.data);
        }
        if (st) {
            free(want.data);
            break;
        }
        snprintf(t[k].name, sizeof t[k].name, "%s", p->name + 6);
        t[k].rows = p->grows, t[k].cols = p->gcols, t[k].data = conv;
        t[k].bytes = numel * dtype_size(d);
        k++;
    }
    if (!st && k == 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s: holds no parameters", checkpoint_info(r)->path);
    if (st) {
        for (int i = 0; i < k; i++) free(t[i].data);
        free(t);
        return st;
    }
    *out = t, *n_out = k, *out_dtype = d;
    return STATUS_OK;
}

static enum status write_weights(struct written *w, const struct hf_tensor *t, int n,
                                 enum dtype d, uint64_t max_shard, struct error *err) {
    // Greedy shards in name order: a new file when the next tensor would pass
    // max_shard (a tensor larger than max_shard gets a file of its own).
    int shard_of[n > 0 ? n : 1], n_shards = 0;
    uint64_t in_shard = 0, total = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || (max_shard && in_shard > 0 && in_shard + t[i].bytes > max_shard))
            n_shards++, in_shard = 0;
        shard_of[i] = n_shards - 1;
        in_shard += t[i].bytes;
        total += t[i].bytes;
    }
    if (n_shards > HF_MAX_FILES)
        return error_set(err, STATUS_BAD_INPUT, "%s: --max-shard-size %llu makes %d files, at "
                         "most %d", w->dir, (unsigned long long)max_shard, n_shards, HF_MAX_FILES);
    const char *meta[] = {"format", "pt"};
    json_t *map = json_object();
    enum status st = STATUS_OK;
    for (int s = 0; s < n_shards && !st; s++) {
        char name[64], path[CKPT_PATH_MAX + 64];
        if (n_shards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        struct safetensors_entry *e = xcalloc((size_t)n, sizeof *e);
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (shard_of[i] != s) continue;
            e[m] = (struct safetensors_entry){.name = t[i].name, .dtype = d, .data = t[i].data};
            e[m].ndim = t[i].cols == 1 ? 1 : 2;
            e[m].shape[0] = t[i].rows, e[m].shape[1] = t[i].cols;
            json_object_set_new(map, t[i].name, json_string(name));
            m++;
        }
        written_path(w, name, path, sizeof path);
        st = safetensors_write(path, e, m, meta, 1, err);
        free(e);
    }
    if (!st && n_shards > 1) {
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                                "weight_map", map);
        return write_json(w, "model.safetensors.index.json", idx, err);
    }
    json_decref(map);
    return st;
}

enum status hf_export(struct ckpt_reader *r, const struct hf_export_args *a, struct error *err) {
    struct stat sb;
    if (stat(a->out_dir, &sb) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: exists; export writes a new folder (remove "
                         "it or choose another name)", a->out_dir);
    struct written w = {.n = 0};
    snprintf(w.dir, sizeof w.dir, "%s.tmp", a->out_dir);
    if (stat(w.dir, &sb) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: exists (a failed export?); remove it",
                         w.dir);
    if (mkdir(w.dir, 0777))
        return error_set(err, STATUS_BAD_INPUT, "%s: cannot create: %s", w.dir, strerror(errno));
    struct hf_tensor *t = NULL;
    int n = 0;
    enum dtype d;
    const struct llama_config *m = &checkpoint_info(r)->model;
    enum hf_family fam = HF_LLAMA;
    int bos = a->bos_id, pad = -1, n_eos = a->eos_id >= 0, eos[HF_MAX_STOP_IDS] = {a->eos_id};
    if (a->meta) {
        bos = a->meta->bos_id, pad = a->meta->pad_id, n_eos = a->meta->n_eos;
        memcpy(eos, a->meta->eos_ids, sizeof eos);
    }
    enum status st = export_family(m, a, &fam, err);
    if (!st) st = read_params(r, a->dtype, &d, &t, &n, err);
    if (!st) to_family_names(m, fam, t, n, d, &t, &n);
    if (!st) st = write_weights(&w, t, n, d, a->max_shard_bytes, err);
    if (!st) st = write_json(&w, "config.json", config_json(m, fam, d, bos, eos, n_eos, pad), err);
    if (!st) {
        // What transformers' generate() reads: its stop ids are every eos id.
        json_t *g = json_object();
        json_object_set_new(g, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
        json_object_set_new(g, "eos_token_id", ids_json(eos, n_eos));
        if (pad >= 0) json_object_set_new(g, "pad_token_id", json_integer(pad));
        st = write_json(&w, "generation_config.json", g, err);
    }
    if (!st && a->tokenizer_json) {
        char path[CKPT_PATH_MAX + 64];
        written_path(&w, "tokenizer.json", path, sizeof path);
        st = copy_file(a->tokenizer_json, path, err);
        if (!st) {
            json_t *tc = json_object();
            json_object_set_new(tc, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
            if (a->eos_token) {
                json_object_set_new(tc, "bos_token", json_string(a->eos_token));
                json_object_set_new(tc, "eos_token", json_string(a->eos_token));
            }
            json_object_set_new(tc, "model_max_length", json_integer(m->max_seq_len));
            json_object_set_new(tc, "clean_up_tokenization_spaces", json_false());
            // what transformers' generate(**tok(text, return_tensors="pt")) accepts:
            // no token_type_ids (PreTrainedTokenizerFast's default returns them)
            json_object_set_new(tc, "model_input_names", json_pack("[s, s]", "input_ids", "attention_mask"));
            if (a->chat_template) json_object_set_new(tc, "chat_template", json_string(a->chat_template));
            st = write_json(&w, "tokenizer_config.json", tc, err);
        }
    }
    for (int i = 0; i < n; i++)
        if (!t[i].view) free(t[i].data);
    free(t);
    if (!st && rename(w.dir, a->out_dir))
        st = error_set(err, STATUS_RUNTIME, "%s: cannot rename to %s: %s", w.dir, a->out_dir,
                       strerror(errno));
    if (st) {
        char path[CKPT_PATH_MAX + 80];
        for (int i = 0; i < w.n; i++) {
            snprintf(path, sizeof path, "%s/%s", w.dir, w.names[i]);
            unlink(path);
        }
        rmdir(w.dir);
    }
    return st;
}

// ---- reading a Hugging Face folder ----

enum { HF_READ_FILES = HF_MAX_FILES };

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
    for (int i = 0; i < h->n_params; i++) n += moe_parts(&h->lc, h->params[i].name);
    h->want = xcalloc((size_t)n + 1, sizeof *h->want);
    for (int i = 0; i < h->n_params; i++) {
        const struct param_info *p = &h->params[i];
        int parts = moe_parts(&h->lc, p->name);
        for (int e = 0; e < parts; e++) {
            struct hf_want *w = &h->want[h->n_want++];
            moe_part_name(h->meta.family, p->name, parts, e, w->name, sizeof w->name);
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
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].used && ints[i].a != ints[i].b)
            return error_set(err, STATUS_BAD_INPUT, "%s/config.json: %s = %d, the run's [model] "
                             "%s = %d", h->dir, ints[i].hf, ints[i].a, ints[i].ours, ints[i].b);
    if (f->rope_theta != m->rope_theta)
        return error_set(err, STATUS_BAD_INPUT, "%s/config.json: rope_theta = %.17g, the run's "
                         "[model] rope_theta = %.17g", h->dir, f->rope_theta, m->rope_theta);
    const struct rope_scaling *a = &f->rope_scaling, *b = &m->rope_scaling;
    static const char *const rs_names[] = {"none", "linear", "llama3"};
    if (a->type != b->type ||
        (a->type != ROPE_SCALING_NONE && a->factor != b->factor) ||
        (a->type == ROPE_SCALING_LLAMA3 &&
         (a->low_freq_factor != b->low_freq_factor || a->high_freq_factor != b->high_freq_factor ||
          a->original_max_pos != b->original_max_pos)))
        return error_set(err, STATUS_BAD_INPUT, "%s/config.json: rope_scaling = %s (factor %g, "
                         "low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings "
                         "%d), the run's [model] rope_scaling = %s (factor %g, %g, %g, %d)", h->dir,
                         rs_names[a->type], a->factor, a->low_freq_factor, a->high_freq_factor,
                         a->original_max_pos, rs_names[b->type], b->factor, b->low_freq_factor,
                         b->high_freq_factor, b->original_max_pos);
    if (f->norm_eps != m->norm_eps)
        return error_set(err, STATUS_BAD_INPUT, "%s/config.json: rms_norm_eps = %.9g, the run's "
                         "[model] norm_eps = %.9g", h->dir, (double)f->norm_eps,
                         (double)m->norm_eps);
    return STATUS_OK;
}

enum status hf_read_piece(struct hf_model *h, struct ckpt_piece *want, struct error *err) {
    const char *name = strncmp(want->name, "param/", 6) ? want->name : want->name + 6;
    // The folder's tensors of this one: trident's stacked experts are E of
    // them, each prow rows (want_table).
    int parts = moe_parts(&h->lc, name), prow = want->grows / parts;
    const struct hf_entry **src = xcalloc((size_t)parts, sizeof *src);
    char pname[CKPT_NAME_MAX];
    enum status st = want->dtype != DTYPE_FP32 || want->grows % parts
                         ? error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: read as F32 in %d "
                                     "parts of equal rows, (%d, %d) asked", h->dir, name, parts,
                                     want->grows, want->gcols)
                         : STATUS_OK;
    for (int e = 0; e < parts && !st; e++) {
        moe_part_name(h->meta.family, name, parts, e, pname, sizeof pname);
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
    json_object_set_new(g, "eos_token_id", ids_json(meta->eos_ids, meta->n_eos));
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
    if (!st && access(tok_from, F_OK) == 0) st = copy_file(tok_from, tok_to, err);
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
