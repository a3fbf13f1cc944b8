// cmd_generate.c: `trident generate MODEL_DIR --prompt TEXT ...`: continues
// prompts with a trident checkpoint's or a Hugging Face folder's weights in
// one process (no mpirun; src/train/generate.h), with the training log's
// sampler (sample_generate: a key/value cache, every prompt of a batch of up
// to GENERATE_ROWS at once; temperature 0 greedy, top-k, top-p, seed), or
// with --no-kv-cache the window recomputed for every token (sample_continue,
// one prompt at a time: the method before the cache, for comparison). The
// new tokens per second go to stderr.
//
// Each prompt is encoded as the end-of-text id (a document start, as every
// document of a prepared corpus follows one) then the prompt's ids; with
// --chat the prompt is first put in `trident prep --format chat`'s template
// (prep_chat_prompt: "User: P\nAssistant:"), or with --chat-template llama3 |
// chatml (default: the one the tokenizer's dataset was prepared with,
// cli_chat_template_of) rendered as a one-message user conversation with the
// generation prompt, as prep and apply_chat_template render it (data/chat.h).
// Generation stops at a stop id (every id of the model's own list when it has
// one, as transformers' generate() stops; else end-of-text; with llama3 /
// chatml also the template's end token, <|eot_id|> / <|im_end|>) or
// after --max-new-tokens ids. The model's window is the longest prompt plus
// --max-new-tokens; a prompt for which that exceeds the model's max_seq_len is
// refused (exit 2) rather than slid: positions past max_seq_len have no RoPE
// rows, and a slid window would change what the model sees.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/threads.h"
#include "config/config.h"
#include "cli.h"
#include "cli_flags.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/index.h"
#include "data/prep.h"
#include "model/sample.h"
#include "tokenizer/tokenizer.h"
#include "train/generate.h"

struct generate_args {
    const char *model_dir;
    struct cli_list prompts; // --prompt TEXT and --prompts FILE, in command-line order
    const char *tokenizer;
    int max_new, top_k, threads;
    int chat_template; // 1 + enum chat_template; 0: not given (the tokenizer's, cli_chat_template_of)
    double temperature, top_p;
    uint64_t seed;
    bool chat, json, no_kv_cache;
};

#define G(field) offsetof(struct generate_args, field)
static const struct config_choice generate_chat_template_choices[] = {{"plain", 1 + CHAT_TEMPLATE_PLAIN},
                                                                      {"llama3", 1 + CHAT_TEMPLATE_LLAMA3},
                                                                      {"chatml", 1 + CHAT_TEMPLATE_CHATML},
                                                                      {NULL, 0}};
static const struct cli_flag generate_flags[] = {
    {"MODEL_DIR", CLI_PATH, NULL, NULL, 0, 0, 0, NULL,
     "a trident checkpoint (step-NNNNNN, or a [checkpoint] dir holding 'latest') or a Hugging Face "
     "folder (Llama, Qwen2, Qwen3, Mistral, Mixtral or Qwen2-MoE: config.json, safetensors); "
     "generation stops at the model's stop ids when it has some "
     "(eos_token_id of generation_config.json or config.json, every id of a list; an import keeps "
     "them), else at the tokenizer's end-of-text", G(model_dir)},
    {"--prompt", CLI_LIST, "TEXT", NULL, 0, 0, 0, NULL, "a prompt to continue", G(prompts)},
    {"--prompts", CLI_LIST, "FILE.jsonl", NULL, 0, 0, 0, NULL,
     "prompts from a JSON Lines file, {\"prompt\": ...} per line (a \"response\" field is printed as the "
     "expected answer)", G(prompts)},
    {"--chat", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "wrap each prompt in prep --format chat's template \"User: P\\nAssistant:\"", G(chat)},
    {"--chat-template", CLI_ENUM, "T", NULL, 0, 0, CLI_HIDDEN_DEFAULT, generate_chat_template_choices,
     "--chat with this template (prep --chat-template's): a one-message user conversation with the "
     "generation prompt; llama3 and chatml stop at <|eot_id|> / <|im_end|>; default: the chat_template of "
     "the index.ini or tokenizer_config.json beside the tokenizer.json, else plain", G(chat_template)},
    {"--tokenizer", CLI_PATH, "PATH", NULL, 0, 0, 0, NULL,
     "a tokenizer.json or a dataset folder holding one; default: the Hugging Face folder's tokenizer.json; "
     "for a trident checkpoint, the tokenizer.json `trident import` keeps next to it, else the [data] "
     "tokenizer, path or first of paths of the run folder's config.ini above it; checked against the "
     "checkpoint's or the folder's tokenizer.json (refused when they differ)", G(tokenizer)},
    {"--max-new-tokens", CLI_INT, "N", "64", 1, 1 << 20, 0, NULL,
     "stop after N ids or at end-of-text; prompt ids + N must fit the model's max_seq_len (refused "
     "otherwise)", G(max_new)},
    {"--temperature", CLI_FLOAT, "T", "0", 0, INFINITY, 0, NULL, "sampling temperature; 0 is greedy",
     G(temperature)},
    {"--top-k", CLI_INT, "K", "0", 0, 1 << 30, 0, NULL,
     "sample among the K most likely ids; 0: the whole vocabulary", G(top_k)},
    {"--top-p", CLI_FLOAT, "P", "1", 0, 1, CLI_MIN_EXCLUSIVE, NULL,
     "sample among the most likely ids whose probability reaches P (nucleus sampling, after top-k); "
     "1: all", G(top_p)},
    {"--seed", CLI_UINT64, "S", "0", 0, INFINITY, 0, NULL,
     "seed of the sampler (each prompt draws as it would alone)", G(seed)},
    {"--threads", CLI_INT, "N", "0", 0, 4096, 0, NULL, "CPU threads; 0: the CPUs of this process",
     G(threads)},
    {"--json", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "one JSON line per prompt: prompt, prompt_ids (end-of-text first), ids, text, ended (and expected); "
     "bytes of prompt or text that are not UTF-8 as U+FFFD (the ids exact)",
     G(json)},
    {"--no-kv-cache", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "recompute the whole window for every new token, one prompt at a time (the method before the "
     "key/value cache: slow; for comparison)", G(no_kv_cache)},
};
#undef G

const struct cli_command cli_generate = {
    .name = "generate",
    .synopsis = "MODEL_DIR (--prompt TEXT ... | --prompts FILE.jsonl) [options]",
    .summary = "Continues prompts with a model's weights in one process (no mpirun), greedy or sampled.",
    .flags = generate_flags,
    .n_flags = CLI_N(generate_flags),
    .notes = "Each prompt is encoded as the end-of-text id then the prompt's ids; generation stops at\n"
             "any stop id of the model's list (else end-of-text) or after --max-new-tokens ids. A prompt\n"
             "whose ids + --max-new-tokens exceed the model's max_seq_len is refused (exit 2), not slid.\n"
             "Prompts run in batches of 16 on a key/value cache (one prefill, then one position per\n"
             "token); stderr gets the new tokens per second.\n",
};

// Prompts continued together (one key/value cache of this many rows), and the
// most tokens of one prefill step.
enum { GENERATE_ROWS = 16, GENERATE_PREFILL = 128 };

struct prompt {
    char *text;     // as given
    char *expected; // a --prompts line's "response", or NULL
};

// Reads {"prompt": ...} lines of path into *ps (appended). Exit-code style errors.
static enum status read_prompts(const char *path, struct prompt **ps, int *n, struct error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return error_set(err, STATUS_BAD_INPUT, "--prompts %s: cannot open", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    enum status st = STATUS_OK;
    for (long no = 1; !st && (len = getline(&line, &cap, f)) >= 0; no++) {
        size_t k = (size_t)len;
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) k--;
        if (!k) continue;
        json_error_t jerr;
        json_t *o = json_loadb(line, k, 0, &jerr);
        json_t *p = o ? json_object_get(o, "prompt") : NULL, *r = o ? json_object_get(o, "response") : NULL;
        if (!json_is_string(p)) {
            st = error_set(err, STATUS_BAD_INPUT, "%s:%ld: expected an object with a string \"prompt\"%s%s",
                           path, no, o ? "" : ": ", o ? "" : jerr.text);
        } else {
            *ps = realloc(*ps, sizeof **ps * (*n + 1));
            CHECK(*ps, "out of memory");
            (*ps)[*n] = (struct prompt){strdup(json_string_value(p)),
                                        json_is_string(r) ? strdup(json_string_value(r)) : NULL};
            (*n)++;
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (!st && *n == 0) st = error_set(err, STATUS_BAD_INPUT, "%s: no prompts", path);
    return st;
}

bool cli_checkpoint_tokenizer(const char *model_dir, char *out, size_t cap) {
    struct stat sb;
    // `trident import`'s copy: OUT/tokenizer.json, next to OUT/step-000000.
    for (int up = 0; up <= 1; up++) {
        snprintf(out, cap, "%s%s/tokenizer.json", model_dir, up ? "/.." : "");
        if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode)) return true;
    }
    for (int up = 1; up <= 2; up++) {
        // The run folder's resolved config, read as `trident train` reads it.
        char ini[CKPT_PATH_MAX + 32];
        snprintf(ini, sizeof ini, "%s%s/config.ini", model_dir, up == 1 ? "/.." : "/../..");
        if (access(ini, F_OK)) continue;
        struct config *c = xmalloc(sizeof *c);
        struct error err = {0};
        bool found = false;
        struct blend_spec *b = xmalloc(sizeof *b);
        if (config_load(ini, 0, NULL, c, &err) == STATUS_OK && (c->data.tokenizer[0] || c->data.path[0])) {
            // A blend's datasets share one tokenizer (checked at start): the first one's.
            if (c->data.tokenizer[0]) snprintf(out, cap, "%s", c->data.tokenizer);
            else if (c->data.paths[0] && blend_parse("[data] paths", c->data.paths, b, &err) == STATUS_OK)
                snprintf(out, cap, "%s/tokenizer.json", b->paths[0]);
            else snprintf(out, cap, "%s/tokenizer.json", c->data.path);
            found = stat(out, &sb) == 0 && S_ISREG(sb.st_mode);
        }
        free(b);
        free(c);
        if (found) return true;
    }
    out[0] = '\0';
    return false;
}

// Decoded text of ids, invalid UTF-8 and control bytes as U+FFFD (as the
// training log's samples).
static char *decode_clean(const struct tokenizer *tok, const int32_t *ids, int n) {
    char *text, *clean;
    size_t len;
    struct error err;
    if (n == 0 || tokenizer_decode(tok, ids, (size_t)n, &text, &len, &err)) return strdup("");
    clean = tokenizer_utf8_sanitize(text, len, NULL);
    free(text);
    return clean;
}

int cli_chat_template_of(const char *tok_file) {
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s", tok_file);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    snprintf(path, sizeof path, "%s/index.ini", dir);
    struct index ix = {0};
    struct error err = {0};
    int t = -1;
    if (access(path, R_OK) == 0 && index_read(path, &ix, &err) == STATUS_OK) {
        t = chat_template_parse(ix.chat_template);
        index_free(&ix);
    }
    if (t >= 0) return t;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *tc = json_load_file(path, 0, NULL);
    const char *jinja = json_string_value(json_object_get(tc, "chat_template"));
    for (int k = 0; jinja && k < CHAT_TEMPLATE_COUNT && t < 0; k++)
        if (!strcmp(jinja, chat_template_jinja(k))) t = k;
    // a model's own template (a Llama 3.x or Qwen folder): by its tokens
    if (jinja && t < 0 && strstr(jinja, "<|start_header_id|>")) t = CHAT_TEMPLATE_LLAMA3;
    if (jinja && t < 0 && strstr(jinja, "<|im_start|>")) t = CHAT_TEMPLATE_CHATML;
    json_decref(tc);
    return t >= 0 ? t : CHAT_TEMPLATE_PLAIN;
}

// A JSON string of text with every invalid UTF-8 byte as U+FFFD (a prompt is
// the command line's bytes, and jansson takes UTF-8 only: json_pack returned
// NULL for "caf\xe9"), other characters kept (JSON escapes them); the ids
// beside it stay exact. NULL only when out of memory.
static json_t *json_text(const char *text) {
    json_t *j = json_string(text);
    if (j) return j;
    size_t n;
    char *clean = tokenizer_utf8_repair(text, strlen(text), &n);
    j = json_stringn(clean, n);
    free(clean);
    return j;
}

static json_t *id_array(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

int cmd_generate(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_generate, stdout);
        return STATUS_OK;
    }
    struct generate_args o = {0};
    struct prompt *ps = NULL;
    int n_prompts = 0;
    struct error err = {0};
    if (cli_parse(&cli_generate, argc, argv, &o, &err) == STATUS_OK) {
        for (int i = 0; i < o.prompts.n && !err.status; i++) {
            if (strcmp(generate_flags[o.prompts.flag[i]].name, "--prompt")) {
                read_prompts(o.prompts.values[i], &ps, &n_prompts, &err);
                continue;
            }
            ps = realloc(ps, sizeof *ps * (n_prompts + 1));
            CHECK(ps, "out of memory");
            ps[n_prompts++] = (struct prompt){strdup(o.prompts.values[i]), NULL};
        }
        if (!err.status && !n_prompts)
            error_set(&err, STATUS_BAD_INPUT, "no prompt: give --prompt TEXT or --prompts FILE.jsonl");
    }
    for (int i = 0; i < n_prompts && !err.status; i++)
        if (!ps[i].text[0])
            error_set(&err, STATUS_BAD_INPUT, "prompt %d is empty: give the text to continue", i + 1);
    const char *model_dir = o.model_dir, *tok_path = o.tokenizer;
    int max_new = o.max_new;
    cli_free(&cli_generate, &o);
    if (err.status) {
        fprintf(stderr, "trident: generate: %s\n(trident generate --help for usage)\n", err.msg);
        for (int i = 0; i < n_prompts; i++) free(ps[i].text), free(ps[i].expected);
        free(ps);
        return err.status;
    }

    struct generator g;
    struct tokenizer *tok = NULL;
    int32_t **ids = xcalloc((size_t)n_prompts, sizeof *ids);
    int *n_ids = xcalloc((size_t)n_prompts, sizeof *n_ids), window = 0;
    char tok_file[2 * CKPT_PATH_MAX + 256] = "";
    if (generator_open(model_dir, &g, &err)) goto out;
    if (tok_path) {
        struct stat sb;
        if (stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode))
            snprintf(tok_file, sizeof tok_file, "%s/tokenizer.json", tok_path);
        else snprintf(tok_file, sizeof tok_file, "%s", tok_path);
    } else if (g.tokenizer_json[0]) {
        snprintf(tok_file, sizeof tok_file, "%s", g.tokenizer_json);
    } else if (g.hf || !cli_checkpoint_tokenizer(model_dir, tok_file, sizeof tok_file)) {
        error_set(&err, STATUS_BAD_INPUT, "%s: %s; give --tokenizer DATASET_DIR (or its tokenizer.json)",
                  model_dir, g.hf ? "the Hugging Face folder holds no tokenizer.json"
                                  : "a trident checkpoint records its tokenizer's identity, not its "
                                    "file, and no run folder config.ini above it names one");
        goto out;
    }
    if (tokenizer_load(tok_file, &tok, &err)) goto out;
    if (g.hf && !g.tokenizer_id[0])
        fprintf(stderr, "trident: generate: note: %s holds no tokenizer.json; %s could not be "
                "checked against the model's tokenizer\n", model_dir, tok_file);
    if (g.tokenizer_id[0] && strcmp(tokenizer_identity(tok), g.tokenizer_id)) {
        error_set(&err, STATUS_BAD_INPUT, "%s: tokenizer %s, the checkpoint %s was trained with %s",
                  tok_file, tokenizer_identity(tok), model_dir, g.tokenizer_id);
        goto out;
    }
    if (tokenizer_vocab_size(tok) > g.lc.vocab_size) {
        error_set(&err, STATUS_BAD_INPUT, "%s: %d token ids, more than the model's vocab_size = %d (%s)",
                  tok_file, tokenizer_vocab_size(tok), g.lc.vocab_size, model_dir);
        goto out;
    }
    int eot = tokenizer_eot_id(tok), chat_stop = -1; // the chat template's end token, -1: none
    bool chat = o.chat || o.chat_template;
    int chat_template = o.chat_template ? o.chat_template - 1 : chat ? cli_chat_template_of(tok_file) : 0;
    if (chat && chat_template != CHAT_TEMPLATE_PLAIN) {
        if (chat_template_check(tok, chat_template, &err)) goto out;
        const char *end = chat_template_end_token(chat_template);
        int32_t *e = NULL;
        size_t k = 0;
        if (tokenizer_encode(tok, end, strlen(end), 1, &e, &k, &err)) goto out;
        chat_stop = e[0];
        free(e);
    }
    for (int i = 0; i < n_prompts; i++) {
        size_t len = strlen(ps[i].text), n;
        int32_t *body;
        enum status st;
        if (chat && chat_template != CHAT_TEMPLATE_PLAIN) {
            struct chat_msg m = {.role = "user", .role_len = 4, .content = ps[i].text, .content_len = len};
            char *buf = NULL;
            size_t blen = 0, bcap = 0;
            uint8_t *mask = NULL;
            st = chat_render(chat_template, &m, 1, 1, &buf, &blen, &bcap, &err);
            if (!st) st = chat_encode(tok, buf, blen, 0, &body, &mask, &n, &err);
            free(buf), free(mask);
        } else {
            char *text = chat ? prep_chat_prompt(ps[i].text, len, &len) : strdup(ps[i].text);
            st = tokenizer_encode(tok, text, len, 0, &body, &n, &err);
            free(text);
        }
        if (st) goto out;
        ids[i] = xmalloc(sizeof **ids * (n + 1));
        n_ids[i] = 0;
        if (eot >= 0) ids[i][n_ids[i]++] = eot;
        memcpy(ids[i] + n_ids[i], body, sizeof *body * n);
        n_ids[i] += (int)n;
        free(body);
        if (n_ids[i] >= g.lc.max_seq_len) { // no room for one new token
            error_set(&err, STATUS_BAD_INPUT, "prompt %d: %d ids (end-of-text included): the "
                      "prompt itself is too long by %d tokens for the window of max_seq_len %d "
                      "(%s; at least one new token needs room): shorten it", i + 1, n_ids[i],
                      n_ids[i] - g.lc.max_seq_len + 1, g.lc.max_seq_len, model_dir);
            goto out;
        }
        if (n_ids[i] + max_new > g.lc.max_seq_len) {
            error_set(&err, STATUS_BAD_INPUT, "prompt %d: %d ids (end-of-text included) + "
                      "--max-new-tokens %d exceed the model's max_seq_len = %d (%s): shorten the "
                      "prompt or ask for at most %d new tokens", i + 1, n_ids[i], max_new,
                      g.lc.max_seq_len, model_dir, MAX(0, g.lc.max_seq_len - n_ids[i]));
            goto out;
        }
        window = MAX(window, n_ids[i] + max_new);
    }
    int threads = o.threads;
    if (!threads) {
        int aff = threads_affinity_cpus();
        threads = aff > 0 ? aff : threads_node_cpus();
    }
    // Stop ids: the model's own list when it has one (an HF folder's
    // eos_token_id, every id; an import's or init_from's generation_config.json),
    // as transformers' generate() stops; else the tokenizer's end-of-text.
    int32_t stops[2 + GENERATOR_MAX_STOP];
    int n_stop = 0;
    if (eot >= 0 && !g.n_stop) stops[n_stop++] = eot;
    for (int i = 0; i < g.n_stop; i++) stops[n_stop++] = g.stop_ids[i];
    bool listed = false; // the chat template's end token, where a chat model's turn ends
    for (int i = 0; i < n_stop; i++) listed |= stops[i] == chat_stop;
    if (chat_stop >= 0 && !listed) stops[n_stop++] = chat_stop;
    int rows = o.no_kv_cache ? 1 : MIN(n_prompts, GENERATE_ROWS);
    if (o.no_kv_cache ? generator_load(&g, window, threads, &err)
                      : generator_load_cached(&g, rows, MIN(window, GENERATE_PREFILL), window, threads, &err))
        goto out;
    int32_t *out = xmalloc(sizeof *out * (size_t)max_new * rows);
    int n_out[GENERATE_ROWS];
    bool ended[GENERATE_ROWS];
    struct sample_params params = {o.temperature, o.top_k, o.top_p, o.seed};
    double t_prefill = 0, t_decode = 0, t0 = time_now_s();
    long n_new = 0, n_prompt_ids = 0;
    for (int i0 = 0; i0 < n_prompts; i0 += rows) {
        int nb = MIN(rows, n_prompts - i0);
        if (o.no_kv_cache) {
            double s0 = time_now_s();
            int stop_id = chat_stop >= 0 ? chat_stop : g.n_stop ? -1 : eot;
            n_out[0] = sample_continue(g.m, ids[i0], n_ids[i0], max_new, params, stop_id, out,
                                       &ended[0], NULL);
            int stop = generator_stop_at(&g, out, n_out[0], stop_id); // the model's list
            if (stop < n_out[0]) n_out[0] = stop, ended[0] = true;
            t_decode += time_now_s() - s0;
            n_new += n_out[0], n_prompt_ids += n_ids[i0];
        } else {
            const int32_t *pp[GENERATE_ROWS];
            for (int b = 0; b < nb; b++) pp[b] = ids[i0 + b];
            struct sample_request rq = {.rows = nb, .prompts = pp, .n_prompt = n_ids + i0,
                                        .n_new = max_new,
                                        .params = params,
                                        .stop_ids = stops, .n_stop = n_stop};
            struct sample_result res = {.out = out, .n_out = n_out, .ended = ended};
            if (sample_generate(g.m, &rq, &res, &err)) {
                free(out);
                goto out;
            }
            t_prefill += res.prefill_s, t_decode += res.decode_s;
            n_new += res.new_tokens, n_prompt_ids += res.prompt_tokens;
        }
        for (int b = 0; b < nb; b++) {
            int i = i0 + b;
            char *text = decode_clean(tok, out + (size_t)b * max_new, n_out[b]);
            if (o.json) {
                // (json_pack takes the references of its "o" values, on failure too)
                json_t *j = json_pack("{s:o, s:o, s:o, s:o, s:b}", "prompt", json_text(ps[i].text),
                                      "prompt_ids", id_array(ids[i], n_ids[i]), "ids",
                                      id_array(out + (size_t)b * max_new, n_out[b]), "text",
                                      json_text(text), "ended", ended[b]);
                if (j && ps[i].expected &&
                    json_object_set_new(j, "expected", json_text(ps[i].expected)))
                    json_decref(j), j = NULL;
                char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
                json_decref(j);
                if (!s) {
                    free(text), free(out);
                    error_set(&err, STATUS_RUNTIME, "prompt %d: cannot make its JSON line (out of "
                              "memory)", i + 1);
                    goto out;
                }
                printf("%s\n", s);
                free(s);
            } else {
                printf("[%d] prompt: %s\n    output: %s%s\n", i + 1, ps[i].text, text,
                       ended[b] ? " <|endoftext|>" : "");
                if (ps[i].expected) printf("    expected: %s\n", ps[i].expected);
            }
            fflush(stdout);
            free(text);
        }
    }
    free(out);
    double wall = time_now_s() - t0;
    fprintf(stderr, "generate: %ld new tokens of %d prompts in %.2f s: %.1f tokens/s (%s; "
            "prefill %ld prompt ids in %.2f s, decoding %.1f tokens/s)\n", n_new, n_prompts, wall,
            wall > 0 ? n_new / wall : 0.0, o.no_kv_cache ? "the window recomputed per token"
            : "key/value cache", n_prompt_ids, t_prefill, t_decode > 0 ? n_new / t_decode : 0.0);
out:
    if (err.status) fprintf(stderr, "trident: generate: %s\n", err.msg);
    for (int i = 0; i < n_prompts; i++) free(ps[i].text), free(ps[i].expected), free(ids[i]);
    free(ps), free(ids), free(n_ids);
    if (tok) tokenizer_free(tok);
    generator_close(&g);
    return err.status;
}
