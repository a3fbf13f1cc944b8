// hf_config.c: config.json and generation_config.json of a Hugging Face
// folder read into a struct llama_config and struct hf_meta (hf.h): every key
// of the families' config classes honoured or refused by the table
// hf_config_keys (docs/formats.md "Hugging Face config keys"), every value
// checked for type and range before use.
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf.h"
#include "hf_internal.h"

enum { L = 1 << HF_LLAMA, Q2 = 1 << HF_QWEN2, Q3 = 1 << HF_QWEN3, M = 1 << HF_MISTRAL,
       X = 1 << HF_MIXTRAL, QM = 1 << HF_QWEN2_MOE, Q3M = 1 << HF_QWEN3_MOE,
       ALL = L | Q2 | Q3 | M | X | QM | Q3M };

static const struct {
    const char *arch, *model_type;
} families[HF_N_FAMILIES] = {{"LlamaForCausalLM", "llama"}, {"Qwen2ForCausalLM", "qwen2"},
                             {"Qwen3ForCausalLM", "qwen3"}, {"MistralForCausalLM", "mistral"},
                             {"MixtralForCausalLM", "mixtral"},
                             {"Qwen2MoeForCausalLM", "qwen2_moe"},
                             {"Qwen3MoeForCausalLM", "qwen3_moe"}};

const char *hf_family_arch(enum hf_family f) { return families[f].arch; }
const char *hf_family_model_type(enum hf_family f) { return families[f].model_type; }

#define C "config.json"
#define G "generation_config.json"
// Actions (docs/formats.md): model: read into struct llama_config; ids: token
// ids kept in struct hf_meta; checked: must name this family (architectures,
// model_type) or silu (hidden_act); refused: any value but `only` is refused
// by name; window: sliding-window attention, refused when it takes effect;
// no effect: transformers' meaning does not change the weights or the logits
// (outputs, bookkeeping, initialisation); decoding: a setting of
// transformers' generate(), not of the model (trident generate's flags choose).
static const struct hf_key_row rows[] = {
    {C, "architectures", ALL, "checked", NULL},
    {C, "model_type", ALL, "checked", NULL},
    {C, "hidden_act", ALL, "checked", NULL},
    {C, "vocab_size", ALL, "model", NULL},
    {C, "hidden_size", ALL, "model", NULL},
    {C, "intermediate_size", ALL, "model", NULL},
    {C, "num_hidden_layers", ALL, "model", NULL},
    {C, "num_attention_heads", ALL, "model", NULL},
    {C, "num_key_value_heads", ALL, "model", NULL},
    {C, "head_dim", L | Q3 | M | Q3M, "model", NULL},
    {C, "max_position_embeddings", ALL, "model", NULL},
    {C, "rms_norm_eps", ALL, "model", NULL},
    {C, "rope_theta", ALL, "model", NULL},
    {C, "rope_scaling", L | Q2 | Q3 | QM | Q3M, "model", NULL},
    {C, "rope_scaling", M | X, "refused", "null"},
    {C, "tie_word_embeddings", ALL, "model", NULL},
    {C, "bos_token_id", ALL, "ids", NULL},
    {C, "eos_token_id", ALL, "ids", NULL},
    {C, "pad_token_id", ALL, "ids", NULL},
    {C, "attention_bias", L | Q3 | Q3M, "refused", "false"},
    {C, "mlp_bias", L, "refused", "false"},
    {C, "attention_dropout", ALL, "refused", "0"},
    {C, "add_cross_attention", ALL, "refused", "false"},
    {C, "is_encoder_decoder", ALL, "refused", "false"},
    {C, "pruned_heads", ALL, "refused", "{}"},
    {C, "sliding_window", Q2 | Q3 | M | X | QM | Q3M, "window", NULL},
    {C, "use_sliding_window", Q2 | Q3 | QM | Q3M, "window", NULL},
    {C, "max_window_layers", Q2 | Q3 | QM | Q3M, "window", NULL},
    // mixture of experts (get_moe)
    {C, "num_local_experts", X, "model", NULL},
    {C, "num_experts", QM | Q3M, "model", NULL},
    {C, "num_experts_per_tok", X | QM | Q3M, "model", NULL},
    {C, "moe_intermediate_size", QM | Q3M, "model", NULL},
    {C, "shared_expert_intermediate_size", QM, "model", NULL},
    // Qwen3MoeConfig has no shared expert: a folder that gives one is not this class's
    {C, "shared_expert_intermediate_size", Q3M, "refused", "0"},
    {C, "norm_topk_prob", QM | Q3M, "model", NULL},
    {C, "decoder_sparse_step", QM | Q3M, "model", NULL},
    {C, "mlp_only_layers", QM | Q3M, "model", NULL},
    {C, "router_aux_loss_coef", X | QM | Q3M, "model", NULL},
    {C, "router_jitter_noise", X, "refused", "0"},
    {C, "output_router_logits", X | QM | Q3M, "no effect", NULL},
    {C, "_attn_implementation_autoset", ALL, "no effect", NULL},
    {C, "_name_or_path", ALL, "no effect", NULL},
    {C, "chunk_size_feed_forward", ALL, "no effect", NULL},
    {C, "cross_attention_hidden_size", ALL, "no effect", NULL},
    {C, "decoder_start_token_id", ALL, "no effect", NULL},
    {C, "finetuning_task", ALL, "no effect", NULL},
    {C, "id2label", ALL, "no effect", NULL},
    {C, "initializer_range", ALL, "no effect", NULL},
    {C, "is_decoder", ALL, "no effect", NULL},
    {C, "label2id", ALL, "no effect", NULL},
    {C, "output_attentions", ALL, "no effect", NULL},
    {C, "output_hidden_states", ALL, "no effect", NULL},
    {C, "prefix", ALL, "no effect", NULL},
    {C, "pretraining_tp", L, "no effect", NULL},
    {C, "problem_type", ALL, "no effect", NULL},
    {C, "return_dict", ALL, "no effect", NULL},
    {C, "sep_token_id", ALL, "no effect", NULL},
    {C, "task_specific_params", ALL, "no effect", NULL},
    {C, "tf_legacy_loss", ALL, "no effect", NULL},
    {C, "tie_encoder_decoder", ALL, "no effect", NULL},
    {C, "tokenizer_class", ALL, "no effect", NULL},
    {C, "torch_dtype", ALL, "no effect", NULL},
    {C, "torchscript", ALL, "no effect", NULL},
    {C, "transformers_version", ALL, "no effect", NULL},
    {C, "use_bfloat16", ALL, "no effect", NULL},
    {C, "use_cache", ALL, "no effect", NULL},
    {C, "bad_words_ids", ALL, "decoding", NULL},
    {C, "begin_suppress_tokens", ALL, "decoding", NULL},
    {C, "diversity_penalty", ALL, "decoding", NULL},
    {C, "do_sample", ALL, "decoding", NULL},
    {C, "early_stopping", ALL, "decoding", NULL},
    {C, "encoder_no_repeat_ngram_size", ALL, "decoding", NULL},
    {C, "exponential_decay_length_penalty", ALL, "decoding", NULL},
    {C, "forced_bos_token_id", ALL, "decoding", NULL},
    {C, "forced_eos_token_id", ALL, "decoding", NULL},
    {C, "length_penalty", ALL, "decoding", NULL},
    {C, "max_length", ALL, "decoding", NULL},
    {C, "min_length", ALL, "decoding", NULL},
    {C, "no_repeat_ngram_size", ALL, "decoding", NULL},
    {C, "num_beam_groups", ALL, "decoding", NULL},
    {C, "num_beams", ALL, "decoding", NULL},
    {C, "num_return_sequences", ALL, "decoding", NULL},
    {C, "output_scores", ALL, "decoding", NULL},
    {C, "remove_invalid_values", ALL, "decoding", NULL},
    {C, "repetition_penalty", ALL, "decoding", NULL},
    {C, "return_dict_in_generate", ALL, "decoding", NULL},
    {C, "suppress_tokens", ALL, "decoding", NULL},
    {C, "temperature", ALL, "decoding", NULL},
    {C, "top_k", ALL, "decoding", NULL},
    {C, "top_p", ALL, "decoding", NULL},
    {C, "typical_p", ALL, "decoding", NULL},
    // generation_config.json (GenerationConfig, the same for every family)
    {G, "bos_token_id", ALL, "ids", NULL},
    {G, "eos_token_id", ALL, "ids", NULL},
    {G, "pad_token_id", ALL, "ids", NULL},
    {G, "_from_model_config", ALL, "no effect", NULL},
    {G, "transformers_version", ALL, "no effect", NULL},
    {G, "output_attentions", ALL, "no effect", NULL},
    {G, "output_hidden_states", ALL, "no effect", NULL},
    {G, "use_cache", ALL, "no effect", NULL},
    {G, "assistant_confidence_threshold", ALL, "decoding", NULL},
    {G, "bad_words_ids", ALL, "decoding", NULL},
    {G, "begin_suppress_tokens", ALL, "decoding", NULL},
    {G, "cache_config", ALL, "decoding", NULL},
    {G, "cache_implementation", ALL, "decoding", NULL},
    {G, "constraints", ALL, "decoding", NULL},
    {G, "decoder_start_token_id", ALL, "decoding", NULL},
    {G, "diversity_penalty", ALL, "decoding", NULL},
    {G, "do_sample", ALL, "decoding", NULL},
    {G, "dola_layers", ALL, "decoding", NULL},
    {G, "early_stopping", ALL, "decoding", NULL},
    {G, "encoder_no_repeat_ngram_size", ALL, "decoding", NULL},
    {G, "encoder_repetition_penalty", ALL, "decoding", NULL},
    {G, "epsilon_cutoff", ALL, "decoding", NULL},
    {G, "eta_cutoff", ALL, "decoding", NULL},
    {G, "exponential_decay_length_penalty", ALL, "decoding", NULL},
    {G, "force_words_ids", ALL, "decoding", NULL},
    {G, "forced_bos_token_id", ALL, "decoding", NULL},
    {G, "forced_decoder_ids", ALL, "decoding", NULL},
    {G, "forced_eos_token_id", ALL, "decoding", NULL},
    {G, "generation_kwargs", ALL, "decoding", NULL},
    {G, "guidance_scale", ALL, "decoding", NULL},
    {G, "is_assistant", ALL, "decoding", NULL},
    {G, "length_penalty", ALL, "decoding", NULL},
    {G, "low_memory", ALL, "decoding", NULL},
    {G, "max_length", ALL, "decoding", NULL},
    {G, "max_matching_ngram_size", ALL, "decoding", NULL},
    {G, "max_new_tokens", ALL, "decoding", NULL},
    {G, "max_time", ALL, "decoding", NULL},
    {G, "min_length", ALL, "decoding", NULL},
    {G, "min_new_tokens", ALL, "decoding", NULL},
    {G, "min_p", ALL, "decoding", NULL},
    {G, "no_repeat_ngram_size", ALL, "decoding", NULL},
    {G, "num_assistant_tokens", ALL, "decoding", NULL},
    {G, "num_assistant_tokens_schedule", ALL, "decoding", NULL},
    {G, "num_beam_groups", ALL, "decoding", NULL},
    {G, "num_beams", ALL, "decoding", NULL},
    {G, "num_return_sequences", ALL, "decoding", NULL},
    {G, "output_logits", ALL, "decoding", NULL},
    {G, "output_scores", ALL, "decoding", NULL},
    {G, "penalty_alpha", ALL, "decoding", NULL},
    {G, "prompt_lookup_num_tokens", ALL, "decoding", NULL},
    {G, "remove_invalid_values", ALL, "decoding", NULL},
    {G, "renormalize_logits", ALL, "decoding", NULL},
    {G, "repetition_penalty", ALL, "decoding", NULL},
    {G, "return_dict_in_generate", ALL, "decoding", NULL},
    {G, "return_legacy_cache", ALL, "decoding", NULL},
    {G, "sequence_bias", ALL, "decoding", NULL},
    {G, "stop_strings", ALL, "decoding", NULL},
    {G, "suppress_tokens", ALL, "decoding", NULL},
    {G, "temperature", ALL, "decoding", NULL},
    {G, "token_healing", ALL, "decoding", NULL},
    {G, "top_k", ALL, "decoding", NULL},
    {G, "top_p", ALL, "decoding", NULL},
    {G, "typical_p", ALL, "decoding", NULL},
    {G, "watermarking_config", ALL, "decoding", NULL},
};
#undef C
#undef G

const struct hf_key_row *hf_config_keys(int *n) {
    *n = (int)(sizeof rows / sizeof rows[0]);
    return rows;
}

// ---- files ----

enum status hf_load_json(const char *path, size_t max_bytes, json_t **out, bool *absent,
                         struct error *err) {
    *out = NULL;
    uint64_t size = 0;
    int fd = open_regular_file(path, NULL, absent, &size, err);
    if (fd < 0) return absent && *absent ? STATUS_OK : err->status;
    enum status st = STATUS_OK;
    char *buf = NULL;
    if (size > max_bytes)
        st = error_set(err, STATUS_BAD_INPUT, "%s: %llu bytes, at most %zu for this file", path,
                       (unsigned long long)size, max_bytes);
    if (!st) {
        size_t n = (size_t)size, got = 0;
        buf = xmalloc(n + 1);
        while (got < n) {
            ssize_t r = read(fd, buf + got, n - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        json_error_t je;
        json_t *j = got == n ? json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je) : NULL;
        if (got != n) st = error_set(err, STATUS_RUNTIME, "%s: short read", path);
        else if (!json_is_object(j))
            st = error_set(err, STATUS_BAD_INPUT, "%s: not a JSON object: %s (line %d)", path,
                           j ? "another value" : je.text, j ? 1 : je.line);
        if (st) json_decref(j);
        else *out = j;
    }
    free(buf);
    close(fd);
    return st;
}

// v as compact JSON, cut to fit buf.
static const char *show(json_t *v, char *buf, size_t cap) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    snprintf(buf, cap, "%s", s ? s : "?");
    if (s && strlen(s) >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
    free(s);
    return buf;
}

// An integer key: absent or null gives *out = dflt (dflt_ok false: absent is
// an error); else it must be a JSON integer (not a real, string or boolean)
// in [lo, hi]. Errors name the file, key and value.
static enum status get_int(const char *path, json_t *j, const char *key, long long lo,
                           long long hi, long long dflt, long long *out, struct error *err) {
    json_t *v = json_object_get(j, key);
    char b[80];
    if (!v || json_is_null(v)) return *out = dflt, STATUS_OK;
    if (!json_is_integer(v))
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s is not an integer", path, key,
                         show(v, b, sizeof b));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %lld, must be in [%lld, %lld]", path,
                         key, x, lo, hi);
    return *out = x, STATUS_OK;
}

// A positive finite number (integer or real) at most hi.
static enum status get_pos(const char *path, json_t *j, const char *key, double hi, double dflt,
                           double *out, struct error *err) {
    json_t *v = json_object_get(j, key);
    char b[80];
    if (!v) return *out = dflt, STATUS_OK;
    if (!json_is_number(v))
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s is not a number", path, key,
                         show(v, b, sizeof b));
    double x = json_number_value(v);
    if (!(x > 0) || !(x <= hi))
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s, must be > 0 and <= %g", path, key,
                         show(v, b, sizeof b), hi);
    return *out = x, STATUS_OK;
}

static enum status get_bool(const char *path, json_t *j, const char *key, bool dflt, bool *out,
                            struct error *err) {
    json_t *v = json_object_get(j, key);
    char b[80];
    if (!v) return *out = dflt, STATUS_OK;
    if (!json_is_boolean(v))
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s is not a boolean (true or false)",
                         path, key, show(v, b, sizeof b));
    return *out = json_is_true(v), STATUS_OK;
}

// A token id (null: -1) or, for eos_token_id, a list of them: ids in [0, vocab).
static enum status get_ids(const char *path, json_t *j, const char *key, int vocab, bool list_ok,
                           int *ids, int *n, struct error *err) {
    json_t *v = json_object_get(j, key);
    char b[80];
    *n = 0;
    if (!v || json_is_null(v)) return STATUS_OK;
    if (json_is_array(v) && list_ok) {
        if (json_array_size(v) < 1 || json_array_size(v) > HF_MAX_STOP_IDS)
            return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s: a list of 1 to %d ids", path,
                             key, show(v, b, sizeof b), HF_MAX_STOP_IDS);
    } else if (!json_is_integer(v))
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s is not a token id (an integer%s)",
                         path, key, show(v, b, sizeof b), list_ok ? " or a list of them" : "");
    size_t count = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= vocab)
            return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s: token ids are integers in "
                             "[0, vocab_size = %d)", path, key, show(v, b, sizeof b), vocab);
        ids[(*n)++] = (int)json_integer_value(e);
    }
    return STATUS_OK;
}

// Two JSON values equal, numbers by value (0 == 0.0).
static bool same_value(json_t *a, json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

// rope_scaling (null, or an object with rope_type or the older type):
// "default" is plain RoPE; "linear" and "llama3" with their parameters;
// every other type (dynamic, yarn, longrope, ...) is refused by name.
static enum status get_rope_scaling(const char *path, json_t *j, struct llama_config *lc,
                                    struct error *err) {
    json_t *rs = json_object_get(j, "rope_scaling");
    char b[120];
    lc->rope_scaling = (struct rope_scaling){0};
    if (!rs || json_is_null(rs)) return STATUS_OK;
    if (!json_is_object(rs))
        return error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling = %s is not an object or null",
                         path, show(rs, b, sizeof b));
    json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *type = json_string_value(t);
    if (!type)
        return error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling = %s: rope_type must be a "
                         "string", path, show(rs, b, sizeof b));
    const char *keys[8];
    int nk = 0;
    keys[nk++] = "rope_type", keys[nk++] = "type";
    char where[CKPT_PATH_MAX + 64];
    snprintf(where, sizeof where, "%s: rope_scaling", path);
    enum status st = STATUS_OK;
    if (!strcmp(type, "default")) {
    } else if (!strcmp(type, "linear")) {
        lc->rope_scaling.type = ROPE_SCALING_LINEAR;
        keys[nk++] = "factor";
        if (!json_object_get(rs, "factor"))
            return error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling: linear needs factor", path);
        st = get_pos(where, rs, "factor", DBL_MAX, 1, &lc->rope_scaling.factor, err);
    } else if (!strcmp(type, "llama3")) {
        struct rope_scaling *r = &lc->rope_scaling;
        r->type = ROPE_SCALING_LLAMA3;
        const char *need[] = {"factor", "low_freq_factor", "high_freq_factor",
                              "original_max_position_embeddings"};
        for (int i = 0; i < 4; i++) {
            keys[nk++] = need[i];
            if (!json_object_get(rs, need[i]))
                return error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling: llama3 needs %s", path,
                                 need[i]);
        }
        long long omp = 0;
        if (!st) st = get_pos(where, rs, "factor", DBL_MAX, 1, &r->factor, err);
        if (!st) st = get_pos(where, rs, "low_freq_factor", DBL_MAX, 1, &r->low_freq_factor, err);
        if (!st) st = get_pos(where, rs, "high_freq_factor", DBL_MAX, 1, &r->high_freq_factor, err);
        if (!st) st = get_int(where, rs, "original_max_position_embeddings", 1, LLAMA_MAX_SEQ_LEN,
                              0, &omp, err);
        r->original_max_pos = (int)omp;
        if (!st && !(r->high_freq_factor > r->low_freq_factor))
            st = error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling: high_freq_factor = %g must "
                           "be above low_freq_factor = %g", path, r->high_freq_factor,
                           r->low_freq_factor);
    } else {
        return error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling rope_type = \"%s\": trident "
                         "implements default, linear and llama3", path, type);
    }
    const char *k;
    json_t *v;
    if (!st) json_object_foreach(rs, k, v) {
        bool known = false;
        for (int i = 0; i < nk && !known; i++) known = !strcmp(k, keys[i]);
        if (!known)
            return error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling.%s: not a key of rope_type "
                             "%s (trident would not apply it)", path, k, type);
    }
    return st;
}

// The class defaults for an absent key (transformers 4.46.3's LlamaConfig,
// Qwen2Config, MistralConfig, MixtralConfig, Qwen2MoeConfig; 4.51's Qwen3Config and
// Qwen3MoeConfig, which has no head_dim parameter: Qwen3MoeAttention takes the
// key when given, else hidden / heads).
static const struct {
    long long vocab, hidden, inter, layers, heads, kv_heads, max_pos, head_dim, sliding_window;
    int bos, eos; // -1: none
    double rope_theta, eps;
} dflt[HF_N_FAMILIES] = {
    [HF_LLAMA] = {32000, 4096, 11008, 32, 32, 0, 2048, 0, 0, 1, 2, 1e4, 1e-6},
    [HF_QWEN2] = {151936, 4096, 22016, 32, 32, 32, 32768, 0, 4096, -1, -1, 1e4, 1e-6},
    [HF_QWEN3] = {151936, 4096, 22016, 32, 32, 32, 32768, 128, 4096, -1, -1, 1e4, 1e-6},
    [HF_MISTRAL] = {32000, 4096, 14336, 32, 32, 8, 131072, 0, 4096, 1, 2, 1e4, 1e-6},
    [HF_MIXTRAL] = {32000, 4096, 14336, 32, 32, 8, 131072, 0, 0, 1, 2, 1e6, 1e-5},
    [HF_QWEN2_MOE] = {151936, 2048, 5632, 24, 16, 16, 32768, 0, 4096, -1, -1, 1e4, 1e-6},
    [HF_QWEN3_MOE] = {151936, 2048, 6144, 24, 32, 4, 32768, 0, 4096, -1, -1, 1e4, 1e-6},
};

// A number >= 0 (integer or real), finite.
static enum status get_nonneg(const char *path, json_t *j, const char *key, double dflt_v,
                              double *out, struct error *err) {
    json_t *v = json_object_get(j, key);
    char b[80];
    if (!v) return *out = dflt_v, STATUS_OK;
    if (!json_is_number(v) || !(json_number_value(v) >= 0) || !(json_number_value(v) <= DBL_MAX))
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %s is not a finite number >= 0", path,
                         key, show(v, b, sizeof b));
    return *out = json_number_value(v), STATUS_OK;
}

// The mixture-of-experts keys of MixtralConfig / Qwen2MoeConfig (transformers
// 4.46.3) / Qwen3MoeConfig (4.51: Qwen2-MoE's keys and defaults of its own, no
// shared expert) into lc's moe_* fields: num_local_experts / num_experts,
// num_experts_per_tok (<= the experts), the experts' width (Mixtral:
// intermediate_size F; Qwen2-MoE: moe_intermediate_size, intermediate_size
// being the dense layers'), Qwen2-MoE's gated shared expert of
// shared_expert_intermediate_size (> 0: trident's Qwen2-MoE has one),
// norm_topk_prob (Mixtral: always renormalised), router_aux_loss_coef. Which
// layers are sparse (Qwen2MoeDecoderLayer: l not in mlp_only_layers and
// (l + 1) % decoder_sparse_step == 0) must be "all from some d on":
// moe_first_dense_layers = d; another pattern is refused naming both keys.
static enum status get_moe(const char *path, json_t *j, enum hf_family f, long long Ly,
                           long long F, struct llama_config *lc, struct error *err) {
    bool mix = f == HF_MIXTRAL, q3 = f == HF_QWEN3_MOE;
    const char *ek = mix ? "num_local_experts" : "num_experts";
    long long E = 0, k = 0, Fe = F, Fs = 0, step = 1;
    bool norm = true;
    double coef = 0;
    char b[120];
    enum status st = get_int(path, j, ek, 1, 256, mix ? 8 : q3 ? 128 : 60, &E, err);
    if (!st) st = get_int(path, j, "num_experts_per_tok", 1, E, mix ? 2 : q3 ? 8 : 4, &k, err);
    if (!st && !mix)
        st = get_int(path, j, "moe_intermediate_size", 1, LLAMA_MAX_FFN, q3 ? 768 : 1408, &Fe, err);
    if (!st && !mix && !q3) // Qwen3-MoE: none (the key is refused unless 0)
        st = get_int(path, j, "shared_expert_intermediate_size", 0, LLAMA_MAX_FFN, 5632, &Fs, err);
    if (!st && !mix && !q3 && Fs == 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s: shared_expert_intermediate_size = 0: trident's "
                       "Qwen2MoeForCausalLM has its gated shared expert (> 0)", path);
    if (!st && !mix) st = get_bool(path, j, "norm_topk_prob", false, &norm, err);
    if (!st && !mix) st = get_int(path, j, "decoder_sparse_step", 1, INT64_MAX, 1, &step, err);
    if (!st) st = get_nonneg(path, j, "router_aux_loss_coef", 0.001, &coef, err);
    // The sparse layers: a suffix [d, Ly) of the layers.
    json_t *mo = mix ? NULL : json_object_get(j, "mlp_only_layers");
    if (!st && mo && !json_is_null(mo) && !json_is_array(mo))
        st = error_set(err, STATUS_BAD_INPUT, "%s: mlp_only_layers = %s is not a list of layer "
                       "indices", path, show(mo, b, sizeof b));
    size_t i;
    json_t *v;
    if (!st && json_is_array(mo)) json_array_foreach(mo, i, v) {
        if (!json_is_integer(v)) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: mlp_only_layers = %s is not a list of "
                           "layer indices (integers)", path, show(mo, b, sizeof b));
            break;
        }
    }
    long long d = -1;
    for (long long l = 0; l < Ly && !st; l++) {
        bool dense = (l + 1) % step != 0;
        if (json_is_array(mo)) json_array_foreach(mo, i, v) dense |= json_integer_value(v) == l;
        if (!dense && d < 0) d = l;
        if (dense && d >= 0)
            st = error_set(err, STATUS_BAD_INPUT, "%s: decoder_sparse_step = %lld, mlp_only_layers "
                           "= %s make layer %lld dense after the sparse layer %lld: trident's dense "
                           "layers come first (moe_first_dense_layers)", path, step,
                           mo ? show(mo, b, sizeof b) : "[]", l, d);
    }
    if (!st && d < 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s: decoder_sparse_step = %lld, mlp_only_layers = "
                       "%s leave no sparse layer among the %lld", path, step,
                       mo ? show(mo, b, sizeof b) : "[]", Ly);
    if (st) return st;
    lc->moe_experts = (int)E, lc->moe_top_k = (int)k, lc->moe_ffn_dim = (int)Fe;
    lc->moe_shared_experts = Fs > 0, lc->moe_shared_ffn_dim = (int)Fs;
    lc->moe_shared_gate = true, lc->moe_norm_topk = norm;
    lc->moe_aux_loss_coeff = coef, lc->moe_first_dense_layers = (int)d;
    return STATUS_OK;
}

static enum status read_ids(const char *path, json_t *j, int vocab, struct hf_meta *meta,
                            bool defaults_from_class, struct error *err) {
    int ids[HF_MAX_STOP_IDS], n;
    enum status st;
    const char *keys[] = {"bos_token_id", "pad_token_id", "eos_token_id"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(j, keys[i]);
        if (!v && !defaults_from_class) continue; // generation_config.json: keep config.json's
        if ((st = get_ids(path, j, keys[i], vocab, i == 2, ids, &n, err))) return st;
        if (!v) continue; // config.json: the class default already set
        if (i == 0) meta->bos_id = n ? ids[0] : -1;
        else if (i == 1) meta->pad_id = n ? ids[0] : -1;
        else {
            meta->n_eos = n;
            memcpy(meta->eos_ids, ids, (size_t)n * sizeof *ids);
        }
    }
    return STATUS_OK;
}

enum status hf_read_generation_config(const char *path, int vocab, struct hf_meta *meta,
                                      bool *found, struct error *err) {
    json_t *j;
    bool absent;
    enum status st = hf_load_json(path, 1 << 20, &j, &absent, err);
    if (found) *found = !st && !absent;
    if (st || absent) return st;
    st = read_ids(path, j, vocab, meta, false, err);
    json_decref(j);
    return st;
}

enum status hf_read_config(const char *dir, struct llama_config *lc, struct hf_meta *meta,
                           struct error *err) {
    char path[CKPT_PATH_MAX + 32], b[120];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j;
    bool absent;
    enum status st = hf_load_json(path, 1 << 20, &j, &absent, err);
    if (st) return st;
    if (absent)
        return error_set(err, STATUS_BAD_INPUT, "%s: no such file; a Hugging Face folder holds "
                         "config.json and model.safetensors (or its shards)", path);
    *lc = (struct llama_config){0};
    *meta = (struct hf_meta){.bos_id = -1, .pad_id = -1};
    json_t *arch = json_object_get(j, "architectures");
    const char *a0 = json_string_value(json_array_get(arch, 0));
    int f = -1;
    for (int i = 0; i < HF_N_FAMILIES && a0; i++)
        if (!strcmp(a0, families[i].arch)) f = i;
    if (f < 0 || json_array_size(arch) != 1)
        st = error_set(err, STATUS_BAD_INPUT, "%s: architectures = %s; trident reads "
                       "[\"LlamaForCausalLM\"], [\"Qwen2ForCausalLM\"], [\"Qwen3ForCausalLM\"], "
                       "[\"MistralForCausalLM\"], [\"MixtralForCausalLM\"], "
                       "[\"Qwen2MoeForCausalLM\"] or [\"Qwen3MoeForCausalLM\"]", path,
                       arch ? show(arch, b, sizeof b) : "(absent)");
    meta->family = f < 0 ? HF_LLAMA : (enum hf_family)f;
    json_t *mt = json_object_get(j, "model_type");
    if (!st && mt && (!json_is_string(mt) || strcmp(json_string_value(mt), families[f].model_type)))
        st = error_set(err, STATUS_BAD_INPUT, "%s: model_type = %s, %s's is \"%s\"", path,
                       show(mt, b, sizeof b), families[f].arch, families[f].model_type);
    json_t *act = json_object_get(j, "hidden_act");
    if (!st && act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        st = error_set(err, STATUS_BAD_INPUT, "%s: hidden_act = %s, trident computes silu "
                       "(SwiGLU)", path, show(act, b, sizeof b));
    // The keys refused unless they hold their only accepted value.
    for (size_t i = 0; i < sizeof rows / sizeof rows[0] && !st; i++) {
        const struct hf_key_row *r = &rows[i];
        if (strcmp(r->file, "config.json") || strcmp(r->action, "refused") ||
            !(r->families & (1u << f)))
            continue;
        json_t *v = json_object_get(j, r->key), *only = json_loads(r->only, JSON_DECODE_ANY, NULL);
        if (v && !same_value(v, only))
            st = error_set(err, STATUS_BAD_INPUT, "%s: %s = %s: trident implements only %s = %s "
                           "for %s", path, r->key, show(v, b, sizeof b), r->key, r->only,
                           families[f].arch);
        json_decref(only);
    }
    if (st) {
        json_decref(j);
        return st;
    }
    long long V, Cm, F, Ly, H, Hkv, P, D;
    st = get_int(path, j, "vocab_size", 2, LLAMA_MAX_VOCAB, dflt[f].vocab, &V, err);
    if (!st) st = get_int(path, j, "hidden_size", 1, LLAMA_MAX_D_MODEL, dflt[f].hidden, &Cm, err);
    if (!st) st = get_int(path, j, "intermediate_size", 1, LLAMA_MAX_FFN, dflt[f].inter, &F, err);
    if (!st) st = get_int(path, j, "num_hidden_layers", 1, LLAMA_MAX_LAYERS, dflt[f].layers, &Ly, err);
    if (!st) st = get_int(path, j, "num_attention_heads", 1, LLAMA_MAX_HEADS, dflt[f].heads, &H, err);
    // null: as many as the query heads (every class); absent: the class
    // default (Llama's is null)
    json_t *kvh = json_object_get(j, "num_key_value_heads");
    if (!st) st = get_int(path, j, "num_key_value_heads", 1, LLAMA_MAX_HEADS,
                          dflt[f].kv_heads && !json_is_null(kvh) ? dflt[f].kv_heads : H, &Hkv, err);
    if (!st) st = get_int(path, j, "max_position_embeddings", 1, LLAMA_MAX_SEQ_LEN, dflt[f].max_pos, &P, err);
    // head_dim: null is hidden / heads; absent too, but for Qwen3 (128);
    // Qwen2 (no such key in 4.46.3) computes hidden / heads.
    json_t *hd = json_object_get(j, "head_dim");
    if (!st) st = get_int(path, j, "head_dim", 1, LLAMA_MAX_HEAD_DIM,
                          dflt[f].head_dim && !hd ? dflt[f].head_dim : Cm / H, &D, err);
    // Qwen2, Mixtral, Qwen2-MoE (4.46.3) have no head_dim: hidden / heads.
    bool no_head_dim = f == HF_QWEN2 || f == HF_MIXTRAL || f == HF_QWEN2_MOE;
    if (!st && no_head_dim && hd && !json_is_null(hd) && D != Cm / H)
        st = error_set(err, STATUS_BAD_INPUT, "%s: head_dim = %lld: %s uses "
                       "hidden_size / num_attention_heads = %lld", path, D, families[f].arch, Cm / H);
    if (!st && H % Hkv)
        st = error_set(err, STATUS_BAD_INPUT, "%s: num_key_value_heads = %lld does not divide "
                       "num_attention_heads = %lld", path, Hkv, H);
    if (!st && D % 2)
        st = error_set(err, STATUS_BAD_INPUT, "%s: head_dim = %lld is odd; RoPE rotates pairs",
                       path, D);
    if (!st && !(hd && !json_is_null(hd)) && !(dflt[f].head_dim && !hd) && Cm % H)
        st = error_set(err, STATUS_BAD_INPUT, "%s: hidden_size = %lld is not a multiple of "
                       "num_attention_heads = %lld and head_dim is not given", path, Cm, H);
    double theta = 0, eps = 0;
    if (!st) st = get_pos(path, j, "rope_theta", DBL_MAX, dflt[f].rope_theta, &theta, err);
    if (!st) st = get_pos(path, j, "rms_norm_eps", FLT_MAX, dflt[f].eps, &eps, err);
    if (!st) st = get_bool(path, j, "tie_word_embeddings", false, &lc->tie_embeddings, err);
    bool mistral_like = f == HF_MISTRAL || f == HF_MIXTRAL; // the window always used
    if (!st && !mistral_like) st = get_rope_scaling(path, j, lc, err);
    // Sliding-window attention: refused where it takes effect, i.e. where a
    // sequence of max_position_embeddings tokens reaches past the window in
    // some layer (Mistral, Mixtral: every layer; Qwen2/3, Qwen2-MoE: with
    // use_sliding_window, the layers from max_window_layers on).
    if (!st && f != HF_LLAMA) {
        long long w = 0, mwl = 0;
        bool use = mistral_like;
        json_t *sw = json_object_get(j, "sliding_window");
        if (!mistral_like) st = get_bool(path, j, "use_sliding_window", false, &use, err);
        if (!st) st = get_int(path, j, "sliding_window", 1, INT64_MAX, dflt[f].sliding_window, &w, err);
        if (!st && sw && json_is_null(sw)) w = 0;
        if (!st && !mistral_like)
            st = get_int(path, j, "max_window_layers", 0, INT64_MAX, 28, &mwl, err);
        if (!st && use && w > 0 && w < P && mwl < Ly)
            st = error_set(err, STATUS_BAD_INPUT, "%s: sliding_window = %lld (below "
                           "max_position_embeddings = %lld%s): trident has no sliding-window "
                           "attention", path, w, P, mistral_like ? "" : ", use_sliding_window "
                           "true");
    }
    if (!st && (f == HF_MIXTRAL || f == HF_QWEN2_MOE || f == HF_QWEN3_MOE))
        st = get_moe(path, j, f, Ly, F, lc, err);
    if (!st) {
        lc->vocab_size = (int)V, lc->d_model = (int)Cm, lc->ffn_dim = (int)F;
        lc->n_layers = (int)Ly, lc->n_heads = (int)H, lc->n_kv_heads = (int)Hkv;
        lc->max_seq_len = (int)P, lc->rope_theta = theta, lc->norm_eps = (float)eps;
        lc->head_dim = D * H == Cm ? 0 : (int)D; // 0: the default, d_model / n_heads
        lc->qkv_bias = f == HF_QWEN2 || f == HF_QWEN2_MOE;
        lc->qk_norm = f == HF_QWEN3 || f == HF_QWEN3_MOE;
        lc->init_std = 0.02f;
        if (dflt[f].bos >= 0) meta->bos_id = dflt[f].bos < V ? dflt[f].bos : -1;
        if (dflt[f].eos >= 0 && dflt[f].eos < V) meta->eos_ids[meta->n_eos++] = dflt[f].eos;
        st = read_ids(path, j, (int)V, meta, true, err);
    }
    json_decref(j);
    if (!st) {
        char gpath[CKPT_PATH_MAX + 40];
        snprintf(gpath, sizeof gpath, "%s/generation_config.json", dir);
        st = hf_read_generation_config(gpath, lc->vocab_size, meta, NULL, err);
    }
    return st;
}
