// sample.c: autoregressive sampling for the training log and `trident generate` (sample.h).
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/rng.h"

// Picks a token from logits (V,) with temperature, top-k and top-p; u in
// [0, 1). order (V,) is scratch (top_p < 1 only).
static int pick_p(double *logits, int V, double temperature, int top_k, double top_p, double u,
                  int *order) {
    int best = 0;
    for (int j = 1; j < V; j++) if (logits[j] > logits[best]) best = j;
    if (temperature <= 0) return best;
    double kth = -INFINITY;
    if (top_k > 0 && top_k < V) { // the k-th largest logit, by repeated selection
        double prev = INFINITY;
        for (int r = 0; r < top_k; r++) {
            double cur = -INFINITY;
            for (int j = 0; j < V; j++) if (logits[j] < prev && logits[j] > cur) cur = logits[j];
            prev = cur;
        }
        kth = prev;
    }
    // (the largest logit read once: the loop overwrites logits[best]; before
    // issue 28 it was read in the loop, so ids after best were weighed
    // against exp(0) = 1 instead of the largest logit)
    double sum = 0, mx = logits[best];
    for (int j = 0; j < V; j++) {
        logits[j] = logits[j] >= kth ? exp((logits[j] - mx) / temperature) : 0.0;
        sum += logits[j];
    }
    if (top_p < 1 && order) { // keep the most probable ids until their mass reaches top_p
        int n = 0;
        for (int j = 0; j < V; j++) if (logits[j] > 0) order[n++] = j;
        // insertion sort by probability, descending (ties: lower id first)
        for (int i = 1; i < n; i++)
            for (int k = i; k > 0 && logits[order[k]] > logits[order[k - 1]]; k--) {
                int t = order[k]; order[k] = order[k - 1]; order[k - 1] = t;
            }
        double acc = 0, kept = 0;
        int i = 0;
        for (; i < n && (i == 0 || acc < top_p * sum); i++) acc += logits[order[i]];
        for (int r = i; r < n; r++) logits[order[r]] = 0;
        for (int r = 0; r < i; r++) kept += logits[order[r]];
        sum = kept;
    }
    double acc = 0, target = u * sum;
    for (int j = 0; j < V; j++) {
        acc += logits[j];
        if (acc > target && logits[j] > 0) return j;
    }
    return best;
}

// Continues prompt as sample_continue, asking stop (may be NULL) before every token.
static int continue_until(struct model *m, const int32_t *prompt, int n_prompt, int n_tokens,
                          const struct sample_params *sp, int eot, int32_t *out, bool *ended,
                          struct watchdog *wd, const struct sample_stop *stop) {
    int B, T, V;
    model_microbatch_shape(m, &B, &T, &V);
    CHECK(n_prompt >= 1 && n_prompt <= T, "sample_continue: %d prompt tokens, window %d", n_prompt, T);
    int32_t *tokens = xcalloc((size_t)B * T, sizeof *tokens);
    int32_t *targets = xmalloc(sizeof *targets * B * T);
    double *logits = xmalloc(sizeof *logits * V);
    int *order = xmalloc(sizeof *order * V);
    for (int i = 0; i < B * T; i++) targets[i] = IGNORE_INDEX;
    memcpy(tokens, prompt, sizeof *tokens * n_prompt);
    int len = n_prompt, n_out = 0;
    *ended = false;
    uint64_t state = sp->seed;
    for (int i = 0; i < n_tokens; i++) {
        if (stop && stop->poll(stop->ctx)) break; // a stop within one token
        if (len == T) { // window full: keep the last half as context
            memmove(tokens, tokens + T / 2, sizeof *tokens * (T - T / 2));
            len -= T / 2;
        }
        double loss;
        long count;
        model_forward(m, tokens, targets, &loss, &count);
        watchdog_kick(wd); // a token is progress (a long sample is no hang)
        model_get_logits_at(m, 0, len - 1, logits);
        state = rng_splitmix64(state);
        int next = pick_p(logits, V, sp->temperature, sp->top_k, sp->top_p,
                          (double)(state >> 11) * 0x1.0p-53, order);
        if (next == eot) {
            *ended = true;
            break;
        }
        tokens[len++] = next;
        out[n_out++] = next;
    }
    free(tokens), free(targets), free(logits), free(order);
    return n_out;
}

int sample_continue(struct model *m, const int32_t *prompt, int n_prompt, int n_tokens,
                    struct sample_params params, int eot, int32_t *out, bool *ended,
                    struct watchdog *wd) {
    return continue_until(m, prompt, n_prompt, n_tokens, &params, eot, out, ended, wd, NULL);
}

int sample_print(struct model *m, const struct tokenizer *tok, int n_tokens, double temperature,
                  int top_k, double top_p, uint64_t seed, FILE *f, struct watchdog *wd,
                  const struct sample_stop *stop) {
    int32_t *out = xmalloc(sizeof *out * (size_t)MAX(1, n_tokens)); // the generated ids
    int eot = tokenizer_eot_id(tok);
    int32_t start = eot >= 0 ? eot : 0;
    const int32_t *prompts[1] = {&start};
    int n_prompt = 1, n_out = 0;
    bool ended = false;
    struct error err = {0};
    int B, T, V;
    model_microbatch_shape(m, &B, &T, &V);
    CHECK(model_kv_cache_rows(m) || !model_kv_cache_init(m, 1, T, &err), "sample: %s", err.msg);
    struct sample_request rq = {.rows = 1, .prompts = prompts, .n_prompt = &n_prompt,
                                .n_new = n_tokens, .params = {temperature, top_k, top_p, seed},
                                .stop_ids = &start, .n_stop = eot >= 0, .wd = wd, .stop = stop};
    struct sample_result res = {.out = out, .n_out = &n_out, .ended = &ended};
    CHECK(n_tokens <= 0 || !sample_generate(m, &rq, &res, &err), "sample: %s", err.msg);
    // Decoded at once (a character may span tokens), invalid UTF-8 as U+FFFD.
    char *text;
    size_t n;
    if (f && n_out && tokenizer_decode(tok, out, (size_t)n_out, &text, &n, &err) == STATUS_OK) {
        char *clean = tokenizer_utf8_sanitize(text, n, &n);
        fwrite(clean, 1, n, f);
        free(clean), free(text);
    }
    if (f && ended) fputs(n_out == 0 ? "<|endoftext|> (first token)" : " <|endoftext|>", f);
    free(out);
    return n_out;
}

// ---- with the key/value cache ------------------------------------------------------

static bool is_stop(const struct sample_request *rq, int id) {
    for (int i = 0; i < rq->n_stop; i++) if (rq->stop_ids[i] == id) return true;
    return false;
}

// Feeds every row's whole context (ctx[b], len[b] ids, rows of `stride`) from
// position 0 in chunks of the step's most tokens, rows shorter than a chunk
// padded with their last id; the logits of each row's last id into
// logits[b] (V,).
static void prefill(struct model *m, int32_t *const *ctx, const int *len, int rows, int32_t *step,
                    double *logits, int V) {
    int maxlen = 0, chunk = model_decode_max_tokens(m);
    for (int b = 0; b < rows; b++) maxlen = MAX(maxlen, len[b]);
    int pos[LLAMA_MAX_MICRO_BATCH];
    for (int c0 = 0; c0 < maxlen; c0 += chunk) {
        int Tq = MIN(chunk, maxlen - c0);
        for (int b = 0; b < rows; b++) {
            pos[b] = c0;
            for (int t = 0; t < Tq; t++)
                step[b * Tq + t] = ctx[b][MIN(c0 + t, len[b] - 1)];
        }
        model_decode(m, pos, Tq, step);
        for (int b = 0; b < rows; b++)
            if (len[b] - 1 >= c0 && len[b] - 1 < c0 + Tq)
                model_decode_logits_at(m, b, len[b] - 1 - c0, logits + (size_t)b * V);
    }
}

enum status sample_generate(struct model *m, const struct sample_request *rq,
                            struct sample_result *res, struct error *err) {
    int B, T, V;
    model_microbatch_shape(m, &B, &T, &V);
    int rows = model_kv_cache_rows(m), L = model_kv_cache_len(m);
    if (rq->rows < 1 || rq->rows > rows)
        return error_set(err, STATUS_BAD_INPUT, "generate: %d prompts; the key/value cache holds "
                         "%d rows", rq->rows, rows);
    for (int b = 0; b < rq->rows; b++)
        if (rq->n_prompt[b] < 1 || rq->n_prompt[b] > L)
            return error_set(err, STATUS_BAD_INPUT, "generate: prompt %d has %d ids; the key/value "
                             "cache holds 1 to %d", b + 1, rq->n_prompt[b], L);
    const struct sample_params *sp = &rq->params;
    int32_t **ctx = xmalloc(sizeof *ctx * rows), *step = xmalloc(sizeof *step * rows * L);
    int *len = xcalloc((size_t)rows, sizeof *len), *order = xmalloc(sizeof *order * V);
    uint64_t *state = xmalloc(sizeof *state * rows);
    double *logits = xmalloc(sizeof *logits * rows * V);
    bool *done = xcalloc((size_t)rows, sizeof *done);
    for (int b = 0; b < rows; b++) {
        int src = b < rq->rows ? b : 0;
        ctx[b] = xmalloc(sizeof **ctx * L);
        len[b] = rq->n_prompt[src];
        memcpy(ctx[b], rq->prompts[src], sizeof **ctx * len[b]);
        state[b] = sp->seed;
        done[b] = b >= rq->rows;
        if (b < rq->rows) res->n_out[b] = 0, res->ended[b] = false;
    }
    res->prefill_s = res->decode_s = 0;
    res->prompt_tokens = res->new_tokens = 0;
    res->stopped = false;
    for (int b = 0; b < rq->rows; b++) res->prompt_tokens += rq->n_prompt[b];
    bool fed = false; // the cache holds every row's context but its last id
    int pos[LLAMA_MAX_MICRO_BATCH];
    for (;;) {
        bool any = false;
        for (int b = 0; b < rq->rows; b++) any |= !done[b];
        if (!any) break;
        if (rq->stop && rq->stop->poll(rq->stop->ctx)) { // a stop within one token
            res->stopped = true;
            break;
        }
        for (int b = 0; b < rq->rows; b++)
            if (!done[b] && len[b] == L) { // cache full: keep the last half as context
                memmove(ctx[b], ctx[b] + L / 2, sizeof **ctx * (L - L / 2));
                len[b] -= L / 2;
                fed = false;
            }
        double t0 = time_now_s();
        if (!fed) {
            prefill(m, ctx, len, rows, step, logits, V);
            res->prefill_s += time_now_s() - t0;
        } else {
            for (int b = 0; b < rows; b++) pos[b] = len[b] - 1, step[b] = ctx[b][len[b] - 1];
            model_decode(m, pos, 1, step);
            for (int b = 0; b < rq->rows; b++)
                if (!done[b]) model_decode_logits_at(m, b, 0, logits + (size_t)b * V);
            res->decode_s += time_now_s() - t0;
        }
        fed = true;
        watchdog_kick(rq->wd); // a token is progress (a long sample is no hang)
        for (int b = 0; b < rq->rows; b++) {
            if (done[b]) continue;
            state[b] = rng_splitmix64(state[b]);
            int next = pick_p(logits + (size_t)b * V, V, sp->temperature, sp->top_k, sp->top_p,
                              (double)(state[b] >> 11) * 0x1.0p-53, order);
            if (is_stop(rq, next)) {
                res->ended[b] = done[b] = true;
                continue;
            }
            ctx[b][len[b]++] = next;
            res->out[(size_t)b * rq->n_new + res->n_out[b]++] = next;
            res->new_tokens++;
            done[b] = res->n_out[b] == rq->n_new;
        }
    }
    for (int b = 0; b < rows; b++) free(ctx[b]);
    free(ctx), free(step), free(len), free(order), free(state), free(logits), free(done);
    return STATUS_OK;
}
