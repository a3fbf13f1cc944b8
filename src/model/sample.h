// sample.h: text samples from the model during training (temperature, top-k).
#ifndef TRIDENT_SAMPLE_H
#define TRIDENT_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/watchdog.h"
#include "model.h"
#include "tokenizer/tokenizer.h"

// Generates n_tokens after an end-of-text token (a document start) and
// writes their decoded text to f. The model's microbatch (B, T) is the
// context window: row 0 holds the text, and a causal model's logits at
// position t depend only on tokens <= t, so one forward per new token reads
// the logits at the last filled position (no KV cache: fine for samples).
// temperature 0 is greedy; top_k 0 samples from the whole vocabulary.
// Overwrites the model's activations (call between steps). With tp > 1 every
// rank of the TP group calls it (the forward and the logits are collective)
// and draws the same tokens; f NULL: generate without printing. The text is
// decoded at the end, invalid UTF-8 printed as U+FFFD
// (tokenizer_utf8_sanitize). wd (may be NULL): kicked at every token.
// stop (may be NULL): asked before every token; true ends
// the sample there (the trainer's stop flag, agreed over its ranks so that
// every rank of a TP group stops at the same token: a stop within one token).
// Returns the tokens generated (before an end-of-text or a stop, which end it).
// Single-stage models only.
struct sample_stop {
    bool (*poll)(void *ctx);
    void *ctx;
};
int sample_print(struct model *m, const struct tokenizer *tok, int n_tokens, double temperature,
                  int top_k, uint64_t seed, FILE *f, struct watchdog *wd, const struct sample_stop *stop);

// Continues prompt (n_prompt,) ids, 1 <= n_prompt <= T of the model's
// microbatch (B, T), by up to n_tokens ids written to out (n_tokens,): the
// loop of sample_print (one full forward of row 0 per token, logits at the
// last filled position; a full window keeps its last half as context, so
// positions restart: callers that want none keep n_prompt + n_tokens <= T).
// temperature 0 is greedy (the first largest logit); else softmax(logits /
// temperature) over the top_k largest (0: all), drawn with splitmix64 from
// seed. Stops before eot (-1: never) and sets *ended. Returns the ids
// written. Single-stage models; with tp > 1 every rank of the group calls it.
int sample_continue(struct model *m, const int32_t *prompt, int n_prompt, int n_tokens,
                    double temperature, int top_k, uint64_t seed, int eot, int32_t *out,
                    bool *ended, struct watchdog *wd);

#endif
