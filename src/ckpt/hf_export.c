// hf_export.c: a checkpoint written as a Hugging Face folder of one of the
// families (hf.h's hf_export; docs/formats.md "Hugging Face export and import").
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "hf.h"
#include "hf_internal.h"
#include "kernels/cpu/half.h"
#include "safetensors.h"

// The file names written so far under the .tmp folder (removed on failure).
struct written {
    char dir[CKPT_PATH_MAX];
    char names[HF_MAX_SHARDS + 8][64];
    int n;
};

static void written_path(struct written *w, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", w->dir, name);
    if (w->n < HF_MAX_SHARDS + 8) snprintf(w->names[w->n++], sizeof w->names[0], "%s", name);
}

static enum status write_json(struct written *w, const char *name, json_t *j, struct error *err) {
    char path[CKPT_PATH_MAX + 64];
    written_path(w, name, path, sizeof path);
    if (!j) return error_set(err, STATUS_RUNTIME, "%s: out of memory making its JSON", path);
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

static bool family_moe(enum hf_family f) {
    return f == HF_MIXTRAL || f == HF_QWEN2_MOE || f == HF_QWEN3_MOE;
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
        // Qwen3-MoE: q/k norms, no biases, no shared expert (any head_dim, dense
        // first layers, top-k renormalised or not); Qwen2-MoE: q/k/v biases and a
        // gated shared expert; Mixtral: neither, renormalised top-k, every layer
        // sparse, no rope_scaling.
        f = m->qk_norm ? HF_QWEN3_MOE : m->qkv_bias ? HF_QWEN2_MOE : HF_MIXTRAL;
        bool mix = f == HF_MIXTRAL, q3 = f == HF_QWEN3_MOE;
        const char *why =
            q3 && m->qkv_bias ? "both q/k norms and q/k/v biases"
            : q3 && m->moe_shared_experts ? "a shared expert (the class has none)"
            : q3 ? NULL
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
// models/{llama,qwen2,qwen3,mistral,mixtral,qwen2_moe,qwen3_moe}/configuration_*.py;
// docs/formats.md).
static json_t *config_json(const struct llama_config *m, enum hf_family f, enum dtype d,
                           int bos, const int *eos, int n_eos, int pad) {
    json_t *j = json_object();
    int D = m->head_dim ? m->head_dim : m->d_model / m->n_heads;
    // (json_pack's NULL, out of memory: config_json returns NULL, write_json says so)
    bool ok = !json_object_set_new(j, "architectures", json_pack("[s]", hf_family_arch(f)));
    json_object_set_new(j, "model_type", json_string(hf_family_model_type(f)));
    json_object_set_new(j, "vocab_size", json_integer(m->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(m->d_model));
    // Mixtral's intermediate_size is its experts' width; Qwen2-MoE's the dense layers'
    json_object_set_new(j, "intermediate_size",
                        json_integer(f == HF_MIXTRAL ? llama_moe_ffn(m) : m->ffn_dim));
    json_object_set_new(j, "num_hidden_layers", json_integer(m->n_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(m->n_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(m->n_kv_heads));
    if (f == HF_LLAMA || f == HF_QWEN3 || f == HF_MISTRAL || f == HF_QWEN3_MOE)
        json_object_set_new(j, "head_dim", json_integer(D)); // the others: hidden / heads
    json_object_set_new(j, "max_position_embeddings", json_integer(m->max_seq_len));
    json_object_set_new(j, "rope_theta", json_real(m->rope_theta));
    if (f != HF_MISTRAL && f != HF_MIXTRAL)
        ok &= !json_object_set_new(j, "rope_scaling", rope_scaling_json(&m->rope_scaling));
    json_object_set_new(j, "rms_norm_eps", json_real(shortest_float(m->norm_eps)));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    if (f == HF_LLAMA || f == HF_QWEN3 || f == HF_QWEN3_MOE)
        json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    if (f == HF_LLAMA) {
        json_object_set_new(j, "mlp_bias", json_false());
        json_object_set_new(j, "pretraining_tp", json_integer(1));
    }
    if (f != HF_LLAMA) json_object_set_new(j, "sliding_window", json_null());
    if (f == HF_QWEN2 || f == HF_QWEN3 || f == HF_QWEN2_MOE || f == HF_QWEN3_MOE) {
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "max_window_layers", json_integer(m->n_layers));
    }
    if (f == HF_MIXTRAL) {
        json_object_set_new(j, "num_local_experts", json_integer(m->moe_experts));
        json_object_set_new(j, "router_jitter_noise", json_real(0.0));
    }
    if (f == HF_QWEN2_MOE || f == HF_QWEN3_MOE) {
        json_object_set_new(j, "num_experts", json_integer(m->moe_experts));
        json_object_set_new(j, "moe_intermediate_size", json_integer(llama_moe_ffn(m)));
        if (f == HF_QWEN2_MOE)
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
    json_object_set_new(j, "eos_token_id", hf_ids_json(eos, n_eos));
    if (pad >= 0) json_object_set_new(j, "pad_token_id", json_integer(pad));
    json_object_set_new(j, "use_cache", json_true());
    if (!ok) json_decref(j), j = NULL;
    return j;
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
    for (int i = 0; i < n; i++) total += hf_moe_parts(m, t[i].name);
    struct hf_tensor *o = xcalloc((size_t)total + 1, sizeof *o);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int parts = hf_moe_parts(m, t[i].name), rows = t[i].rows / parts;
        for (int e = 0; e < parts; e++) {
            struct hf_tensor *q = &o[k++];
            *q = t[i];
            hf_moe_part_name(f, t[i].name, parts, e, q->name, sizeof q->name);
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
    if (n_shards > HF_MAX_SHARDS)
        return error_set(err, STATUS_BAD_INPUT, "%s: --max-shard-size %llu makes %d files, at "
                         "most %d", w->dir, (unsigned long long)max_shard, n_shards, HF_MAX_SHARDS);
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
        json_object_set_new(g, "eos_token_id", hf_ids_json(eos, n_eos));
        if (pad >= 0) json_object_set_new(g, "pad_token_id", json_integer(pad));
        st = write_json(&w, "generation_config.json", g, err);
    }
    if (!st && a->tokenizer_json) {
        char path[CKPT_PATH_MAX + 64];
        written_path(&w, "tokenizer.json", path, sizeof path);
        st = hf_copy_file(a->tokenizer_json, path, err);
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
            json_t *names = json_pack("[s, s]", "input_ids", "attention_mask");
            if (json_object_set_new(tc, "model_input_names", names)) json_decref(tc), tc = NULL;
            if (tc && a->chat_template)
                json_object_set_new(tc, "chat_template", json_string(a->chat_template));
            st = write_json(&w, "tokenizer_config.json", tc, err); // tc NULL: out of memory
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
