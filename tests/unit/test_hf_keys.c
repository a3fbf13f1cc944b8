// test_hf_keys.c: the table of Hugging Face config keys (issue 28 acceptance
// 2): src/ckpt/hf_config.c's hf_config_keys, docs/formats.md's table
// ("Hugging Face config keys") and transformers' own key lists
// (tests/reference/fixtures/hf_families/config_keys.json: each family's
// default config's to_dict() with its defaults, and GenerationConfig's, made by
// tests/reference/hf_families_reference.py) agree:
//  - the docs table and the code have the same rows (file, key, families,
//    action);
//  - every key of each family's to_dict() has a config.json row for that
//    family, every key of GenerationConfig's a generation_config.json row;
//  - the code does what each row says, through hf_read_config on a minimal
//    config.json of each family: a "refused" or "checked" key with another
//    value than its only one is refused naming the key; a "no effect" or
//    "decoding" key with a value other than transformers' default (in either
//    file) leaves the model and the ids unchanged; a "model" or "ids" key with
//    another value changes them or is refused naming the key; sliding
//    windows that act are refused. The "model" and "ids" rows' values are compared with
//    transformers' logits by tests/e2e/hf_families.sh and refused when bad by
//    tests/e2e/hf_readers.sh.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hf.h"
#include "model/model.h"
#include "test.h"

#define KEYS "tests/reference/fixtures/hf_families/config_keys.json"
#define DOCS "docs/formats.md"

static const char *fam_names[HF_N_FAMILIES] = {"llama", "qwen2", "qwen3", "mistral", "mixtral",
                                               "qwen2_moe", "qwen3_moe"};

struct doc_row {
    char file[32], key[64], action[16];
    unsigned families;
};

static void trim(char *s) {
    size_t n = strlen(s), a = 0;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '`')) s[--n] = 0;
    while (s[a] == ' ' || s[a] == '`') a++;
    memmove(s, s + a, strlen(s + a) + 1);
}

static int read_docs(struct doc_row *rows, int cap) {
    FILE *f = fopen(DOCS, "r");
    EXPECT(f, "%s: cannot open", DOCS);
    if (!f) return 0;
    char line[2048];
    int n = 0, in = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "<!-- hf-config-keys end")) in = 0;
        else if (strstr(line, "<!-- hf-config-keys")) in = 1;
        if (!in || (strncmp(line, "| config.json", 13) && strncmp(line, "| generation_config.json", 24)))
            continue;
        char *cell[5] = {0}, *p = line + 1;
        for (int c = 0; c < 4 && p; c++) {
            cell[c] = p;
            p = strchr(p, '|');
            if (p) *p++ = 0;
        }
        if (!cell[3] || n == cap) continue;
        struct doc_row *r = &rows[n++];
        for (int c = 0; c < 4; c++) trim(cell[c]);
        snprintf(r->file, sizeof r->file, "%.31s", cell[0]);
        snprintf(r->key, sizeof r->key, "%.63s", cell[1]);
        char *colon = strchr(cell[3], ':');
        if (colon) *colon = 0;
        snprintf(r->action, sizeof r->action, "%.15s", cell[3]);
        r->families = 0;
        if (!strcmp(cell[2], "all")) r->families = (1u << HF_N_FAMILIES) - 1;
        else
            for (int i = 0; i < HF_N_FAMILIES; i++) {
                // whole words only: "qwen2" is not "qwen"
                char w[16];
                snprintf(w, sizeof w, "%s", fam_names[i]);
                for (char *q = strstr(cell[2], w); q; q = strstr(q + 1, w))
                    if ((q == cell[2] || q[-1] == ' ') && (q[strlen(w)] == 0 || q[strlen(w)] == ' '))
                        r->families |= 1u << i;
            }
    }
    fclose(f);
    return n;
}

static const struct hf_key_row *code_row(const char *file, const char *key, int fam) {
    int n;
    const struct hf_key_row *r = hf_config_keys(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(r[i].file, file) && !strcmp(r[i].key, key) && (r[i].families & (1u << fam)))
            return &r[i];
    return NULL;
}

static char dir[] = "/tmp/test_hf_keys.XXXXXX";

static json_t *base_config(int f) {
    static const char *arch[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                 "MistralForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                                 "Qwen3MoeForCausalLM"};
    json_t *j = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "architectures",
                          arch[f], "model_type", fam_names[f], "vocab_size", 264, "hidden_size", 32,
                          "intermediate_size", 48, "num_hidden_layers", 2, "num_attention_heads", 4,
                          "num_key_value_heads", 2, "max_position_embeddings", 128);
    if (f == HF_QWEN3) json_object_set_new(j, "head_dim", json_integer(8)); // 32 / 4
    if (f == HF_MISTRAL) json_object_set_new(j, "sliding_window", json_null());
    return j;
}

// Writes dir/config.json (and dir/generation_config.json when gen) and reads them.
static enum status read_with(json_t *config, json_t *gen, struct llama_config *lc,
                             struct hf_meta *meta, struct error *err) {
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_dump_file(config, path, 0);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    if (gen) json_dump_file(gen, path, 0);
    return hf_read_config(dir, lc, meta, err);
}

// A value other than v, of v's type (null: an integer).
static json_t *other_value(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_TRUE: return json_false();
    case JSON_FALSE: return json_true();
    case JSON_INTEGER: return json_integer(json_integer_value(v) + 1);
    case JSON_REAL: return json_real(json_real_value(v) * 2 + 0.5);
    case JSON_STRING: {
        char s[256];
        snprintf(s, sizeof s, "%sx", json_string_value(v));
        return json_string(s);
    }
    case JSON_ARRAY: return json_pack("[i]", 1);
    case JSON_OBJECT: return json_pack("{s:i}", "x", 1);
    default: return json_integer(1);
    }
}

int main(void) {
    // The docs table against the code.
    static struct doc_row docs[512];
    int nd = read_docs(docs, 512), nc;
    const struct hf_key_row *rows = hf_config_keys(&nc);
    EXPECT(nd == nc, "%s: %d rows in the config-key table, src/ckpt/hf_config.c has %d", DOCS, nd, nc);
    for (int i = 0; i < nc; i++) {
        int found = 0;
        for (int k = 0; k < nd; k++)
            if (!strcmp(docs[k].file, rows[i].file) && !strcmp(docs[k].key, rows[i].key) &&
                docs[k].families == rows[i].families) {
                found = 1;
                EXPECT(!strcmp(docs[k].action, rows[i].action), "%s: %s %s: docs say '%s', the "
                       "code '%s'", DOCS, rows[i].file, rows[i].key, docs[k].action, rows[i].action);
            }
        EXPECT(found, "%s: no row for %s %s (families %#x) of src/ckpt/hf_config.c", DOCS,
               rows[i].file, rows[i].key, rows[i].families);
    }
    // transformers' keys against the code.
    json_error_t je;
    json_t *keys = json_load_file(KEYS, 0, &je);
    EXPECT(json_is_object(keys), "%s: %s", KEYS, je.text);
    int n_keys = 0;
    for (int f = 0; f < HF_N_FAMILIES && keys; f++) {
        json_t *d = json_object_get(keys, fam_names[f]);
        EXPECT(json_object_size(d) > 40, "%s: %s has %zu keys", KEYS, fam_names[f], json_object_size(d));
        const char *k;
        json_t *v;
        json_object_foreach(d, k, v) {
            EXPECT(code_row("config.json", k, f), "config.json key %s of %s's config class: no row "
                   "in src/ckpt/hf_config.c (honour or refuse it)", k, fam_names[f]);
            n_keys++;
        }
        json_object_foreach(json_object_get(keys, "generation_config"), k, v) {
            EXPECT(code_row("generation_config.json", k, f), "generation_config.json key %s: no "
                   "row in src/ckpt/hf_config.c", k);
            n_keys++;
        }
    }
    // The code does what the rows say.
    EXPECT(mkdtemp(dir), "mkdtemp");
    struct error err;
    int n_behaviour = 0;
    for (int f = 0; f < HF_N_FAMILIES && keys; f++) {
        struct llama_config base, lc;
        struct hf_meta bmeta, meta;
        json_t *c = base_config(f);
        enum status st = read_with(c, NULL, &base, &bmeta, &err);
        EXPECT(!st, "%s: the base config: %s", fam_names[f], err.msg);
        // Absent keys take the class's defaults: untied (acceptance 7), head_dim
        // hidden / heads (Qwen3: given), rope_theta 10000 (Mixtral 1e6),
        // rms_norm_eps 1e-6 (Mixtral 1e-5), Llama, Mistral and Mixtral's bos 1
        // and eos 2, none for Qwen; Mixtral's 8 experts of intermediate_size,
        // top-2, renormalised; Qwen2-MoE's 60 of 1408, top-4, not
        // renormalised, a gated shared expert of 5632; Qwen3-MoE's 128 of 768,
        // top-8, not renormalised, no shared expert, head_dim hidden / heads
        // (Qwen3MoeConfig has no head_dim); router_aux_loss_coef 0.001.
        bool mix = f == HF_MIXTRAL, qm = f == HF_QWEN2_MOE, q3m = f == HF_QWEN3_MOE;
        EXPECT(!st && !base.tie_embeddings && base.head_dim == 0 &&
               base.rope_theta == (mix ? 1e6 : 10000.0) && base.norm_eps == (mix ? 1e-5f : 1e-6f) &&
               base.rope_scaling.type == ROPE_SCALING_NONE &&
               base.qkv_bias == (f == HF_QWEN2 || qm) && base.qk_norm == (f == HF_QWEN3 || q3m),
               "%s: the defaults of absent keys", fam_names[f]);
        EXPECT(!st && (mix || qm || q3m ? base.moe_experts == (mix ? 8 : qm ? 60 : 128) &&
                                       base.moe_top_k == (mix ? 2 : qm ? 4 : 8) &&
                                       base.moe_ffn_dim == (mix ? 48 : qm ? 1408 : 768) &&
                                       base.moe_shared_experts == qm &&
                                       base.moe_shared_ffn_dim == (qm ? 5632 : 0) &&
                                       base.moe_norm_topk == mix && base.moe_aux_loss_coeff == 0.001 &&
                                       base.moe_first_dense_layers == 0
                                 : base.moe_experts == 0),
               "%s: the mixture-of-experts defaults of absent keys", fam_names[f]);
        bool bos_eos = f == HF_LLAMA || f == HF_MISTRAL || mix;
        EXPECT(!st && bmeta.bos_id == (bos_eos ? 1 : -1) && bmeta.n_eos == (bos_eos ? 1 : 0) &&
               (!bos_eos || bmeta.eos_ids[0] == 2) && bmeta.pad_id == -1 && (int)bmeta.family == f,
               "%s: the default ids", fam_names[f]);
        json_t *defaults = json_object_get(keys, fam_names[f]);
        for (int i = 0; i < nc && !st; i++) {
            const struct hf_key_row *r = &rows[i];
            if (!(r->families & (1u << f))) continue;
            bool gen = !strcmp(r->file, "generation_config.json");
            json_t *dv = json_object_get(gen ? json_object_get(keys, "generation_config") : defaults, r->key);
            if (!strcmp(r->action, "refused") || !strcmp(r->action, "checked")) {
                json_t *only = r->only ? json_loads(r->only, JSON_DECODE_ANY, NULL) : NULL;
                json_t *v = !strcmp(r->key, "architectures") ? json_pack("[s]", "GPT2LMHeadModel")
                            : only ? other_value(only) : dv ? other_value(dv) : json_string("silux");
                json_t *cc = json_deep_copy(c);
                json_object_set_new(cc, r->key, v);
                st = read_with(cc, NULL, &lc, &meta, &err);
                EXPECT(st == STATUS_BAD_INPUT && strstr(err.msg, r->key) && strstr(err.msg, "config.json"),
                       "%s: %s (%s) with another value: status %d, '%s'", fam_names[f], r->key,
                       r->action, st, st ? err.msg : "accepted");
                st = STATUS_OK;
                json_decref(cc);
                json_decref(only);
                n_behaviour++;
            } else if (!strcmp(r->action, "model") || !strcmp(r->action, "ids")) {
                // Another value changes the model (or the ids), or is refused by name.
                json_t *cc = json_deep_copy(c), *g = gen ? json_object() : NULL;
                // ids: 5, none of the classes' defaults (1, 2, null)
                json_object_set_new(gen ? g : cc, r->key, !strcmp(r->action, "ids") ? json_integer(5)
                                                          : other_value(dv ? dv : json_null()));
                st = read_with(cc, g, &lc, &meta, &err);
                bool changed = memcmp(&lc, &base, sizeof lc) || memcmp(&meta, &bmeta, sizeof meta);
                EXPECT(st ? st == STATUS_BAD_INPUT && strstr(err.msg, r->key) != NULL : changed,
                       "%s: %s %s (%s) with another value: %s", fam_names[f], r->file, r->key,
                       r->action, st ? err.msg : "no change");
                st = STATUS_OK;
                json_decref(cc);
                json_decref(g);
                n_behaviour++;
            } else if (!strcmp(r->action, "no effect") || !strcmp(r->action, "decoding")) {
                json_t *cc = json_deep_copy(c), *g = gen ? json_object() : NULL;
                json_object_set_new(gen ? g : cc, r->key, other_value(dv ? dv : json_null()));
                st = read_with(cc, g, &lc, &meta, &err);
                EXPECT(!st, "%s: %s %s (%s) with another value refused: %s", fam_names[f], r->file,
                       r->key, r->action, err.msg);
                EXPECT(st || (!memcmp(&lc, &base, sizeof lc) && !memcmp(&meta, &bmeta, sizeof meta)),
                       "%s: %s %s (%s) changed the model or the ids", fam_names[f], r->file, r->key,
                       r->action);
                st = STATUS_OK;
                json_decref(cc);
                json_decref(g);
                n_behaviour++;
            }
        }
        if (f != HF_LLAMA) {
            json_t *cc = json_deep_copy(c);
            json_object_set_new(cc, "sliding_window", json_integer(16));
            if (f != HF_MISTRAL && f != HF_MIXTRAL) {
                json_object_set_new(cc, "use_sliding_window", json_true());
                json_object_set_new(cc, "max_window_layers", json_integer(0));
            }
            st = read_with(cc, NULL, &lc, &meta, &err);
            EXPECT(st == STATUS_BAD_INPUT && strstr(err.msg, "sliding_window = 16"),
                   "%s: an acting sliding window: %s", fam_names[f], st ? err.msg : "accepted");
            // A window no sequence reaches past is no window.
            json_object_set_new(cc, "sliding_window", json_integer(128));
            st = read_with(cc, NULL, &lc, &meta, &err);
            EXPECT(!st && !memcmp(&lc, &base, sizeof lc), "%s: sliding_window = "
                   "max_position_embeddings: %s", fam_names[f], st ? err.msg : "changed the model");
            json_decref(cc);
        }
        json_decref(c);
    }
    json_decref(keys);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    rmdir(dir);
    printf("%d table rows = docs rows; %d transformers keys have rows; %d rows' behaviour checked\n",
           nc, n_keys, n_behaviour);
    return test_finish("test_hf_keys");
}
