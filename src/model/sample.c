// sample.c: autoregressive sampling for the training log and `trident generate` (sample.h).
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

// Picks a token from logits (V,) with temperature and top-k; u in [0, 1).
static int pick(double *logits, int V, double temperature, int top_k, double u) {
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
    double sum = 0;
    for (int j = 0; j < V; j++) {
        logits[j] = logits[j] >= kth ? exp((logits[j] - logits[best]) / temperature) : 0.0;
        sum += logits[j];
    }
    double acc = 0, target = u * sum;
    for (int j = 0; j < V; j++) {
        acc += logits[j];
        if (acc > target && logits[j] > 0) return j;
    }
    return best;
}

// sample_continue, asking stop (may be NULL) before every token.
static int continue_until(struct model *m, const int32_t *prompt, int n_prompt, int n_tokens,
                          double temperature, int top_k, uint64_t seed, int eot, int32_t *out,
                          bool *ended, struct watchdog *wd, const struct sample_stop *stop) {
    int B, T, V;
    model_microbatch_shape(m, &B, &T, &V);
    CHECK(n_prompt >= 1 && n_prompt <= T, "sample_continue: %d prompt tokens, window %d", n_prompt, T);
    int32_t *tokens = xcalloc((size_t)B * T, sizeof *tokens);
    int32_t *targets = xmalloc(sizeof *targets * B * T);
    double *logits = xmalloc(sizeof *logits * V);
    for (int i = 0; i < B * T; i++) targets[i] = IGNORE_INDEX;
    memcpy(tokens, prompt, sizeof *tokens * n_prompt);
    int len = n_prompt, n_out = 0;
    *ended = false;
    uint64_t state = seed;
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
        int next = pick(logits, V, temperature, top_k, (double)(state >> 11) * 0x1.0p-53);
        if (next == eot) {
            *ended = true;
            break;
        }
        tokens[len++] = next;
        out[n_out++] = next;
    }
    free(tokens), free(targets), free(logits);
    return n_out;
}

int sample_continue(struct model *m, const int32_t *prompt, int n_prompt, int n_tokens,
                    double temperature, int top_k, uint64_t seed, int eot, int32_t *out,
                    bool *ended, struct watchdog *wd) {
    return continue_until(m, prompt, n_prompt, n_tokens, temperature, top_k, seed, eot, out, ended, wd, NULL);
}

int sample_print(struct model *m, const struct tokenizer *tok, int n_tokens, double temperature,
                  int top_k, uint64_t seed, FILE *f, struct watchdog *wd, const struct sample_stop *stop) {
    int32_t *out = xmalloc(sizeof *out * (size_t)MAX(1, n_tokens)); // the generated ids
    int eot = tokenizer_eot_id(tok);
    int32_t start = eot >= 0 ? eot : 0;
    bool ended;
    int n_out = continue_until(m, &start, 1, n_tokens, temperature, top_k, seed, eot, out, &ended, wd, stop);
    // Decoded at once (a character may span tokens), invalid UTF-8 as U+FFFD.
    char *text;
    size_t n;
    struct error err;
    if (f && n_out && tokenizer_decode(tok, out, (size_t)n_out, &text, &n, &err) == STATUS_OK) {
        char *clean = tokenizer_utf8_sanitize(text, n, &n);
        fwrite(clean, 1, n, f);
        free(clean), free(text);
    }
    if (f && ended) fputs(n_out == 0 ? "<|endoftext|> (first token)" : " <|endoftext|>", f);
    free(out);
    return n_out;
}
