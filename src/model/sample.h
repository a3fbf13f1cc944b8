// sample.h: text samples from the model during training and `trident
// generate`'s continuations: with a key/value cache (sample_generate; model.h
// "generation with a key/value cache") or the window recomputed per token
// (sample_continue, the method before the cache); temperature, top-k, top-p.
#ifndef TRIDENT_SAMPLE_H
#define TRIDENT_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/watchdog.h"
#include "model.h"
#include "tokenizer/tokenizer.h"

// Generates n_tokens after an end-of-text token (a document start) and
// writes their decoded text to f: sample_generate on one row of the model's
// key/value cache (made on first use, one row of the microbatch's T
// positions, when the caller has not made one: the trainer makes it at
// start), stopping at end-of-text; past T positions the last half is kept as
// context (sample_continue's rule). temperature 0 is greedy; top_k 0 samples
// from the whole vocabulary; top_p as struct sample_params. Overwrites the model's activations (call between
// steps). Collective as model_decode: every rank of the TP and pipeline
// groups calls it and draws the same tokens; f NULL: generate without
// printing. The text is decoded at the end, invalid UTF-8 printed as U+FFFD
// (tokenizer_utf8_sanitize). wd (may be NULL): kicked at every token. stop
// (may be NULL): asked before every token; true ends the sample there (the
// trainer's stop flag, agreed over its ranks so that every rank stops at the
// same token: a stop within one token). Returns the tokens generated (before
// an end-of-text or a stop, which end it). Aborts (CHECK) when the cache
// cannot be allocated.
struct sample_stop {
    bool (*poll)(void *ctx);
    void *ctx;
};
int sample_print(struct model *m, const struct tokenizer *tok, int n_tokens, double temperature,
                  int top_k, double top_p, uint64_t seed, FILE *f, struct watchdog *wd,
                  const struct sample_stop *stop);

// Sampling of one token from logits: temperature 0 is greedy (the first
// largest logit); else softmax(logits / temperature) over the top_k largest
// (0: all), then the smallest set of those, most probable first, whose
// probability reaches top_p (nucleus sampling, Holtzman et al. 2020; 1: all;
// Hugging Face's warpers in the same order: temperature, top-k, top-p), drawn
// with splitmix64 from seed (each row's stream starts from seed: a prompt
// gets the tokens it would get alone).
struct sample_params {
    double temperature; // >= 0
    int top_k;          // >= 0
    double top_p;       // (0, 1]
    uint64_t seed;
};

// What sample_generate continues and how.
struct sample_request {
    int rows;                       // prompts, 1 <= rows <= the cache's rows
    const int32_t *const *prompts;  // (rows) of (n_prompt[b],) ids, n_prompt[b] >= 1
    const int *n_prompt;
    int n_new;                      // most new ids per row
    struct sample_params params;
    const int32_t *stop_ids;        // (n_stop,) ids that end a row (not output); may be NULL
    int n_stop;
    struct watchdog *wd;            // kicked every step (may be NULL)
    const struct sample_stop *stop; // asked before every step (may be NULL): true ends all rows
};

// What it produced: out (rows, n_new) row-major, the caller's; n_out (rows,),
// ended (rows,) (stopped at a stop id) the caller's. Timings: prefill_s over
// the steps that fed whole contexts (the prompts, and re-fed contexts after a
// slide), decode_s over the one-token steps; new_tokens the ids output.
struct sample_result {
    int32_t *out;
    int *n_out;
    bool *ended;
    double prefill_s, decode_s;
    long prompt_tokens, new_tokens;
    bool stopped; // the stop poll ended it
};

// Continues rq->rows prompts at once with m's key/value cache
// (model_kv_cache_init: at least rq->rows rows; model_decode): a prefill
// step (in chunks of model_decode_max_tokens) feeds every prompt, then one
// step per new token feeds each row's last id at its own position; a row
// ends at a stop id or after n_new ids (the others go on; an ended row's
// step re-feeds its last id, which changes nothing). A row that fills the
// cache keeps its last half as context (positions restart; every row's
// context is fed again): sample_continue's rule for its window. Rows past
// rq->rows are fed copies of row 0. Collective as model_decode (every rank of
// the TP and pp groups calls with the same request, and draws the same ids).
// Errors: STATUS_BAD_INPUT for a request the cache cannot hold (rows, a
// prompt longer than the cache).
enum status sample_generate(struct model *m, const struct sample_request *rq,
                            struct sample_result *res, struct error *err);

// Continues prompt (n_prompt,) ids, 1 <= n_prompt <= T of the model's
// microbatch (B, T), by up to n_tokens ids written to out (n_tokens,)
// without a key/value cache (one full forward of row 0 per token, logits at
// the last filled position; a full window keeps its last half as context, so
// positions restart: callers that want none keep n_prompt + n_tokens <= T).
// Draws as sample_generate's row for this prompt (struct sample_params:
// temperature, top-k, top-p, seed; the same ids where the logits agree).
// Stops before eot (-1: never) and sets *ended. Returns the ids written.
// Single-stage models; with tp > 1 every rank of the group calls it.
int sample_continue(struct model *m, const int32_t *prompt, int n_prompt, int n_tokens,
                    struct sample_params params, int eot, int32_t *out, bool *ended,
                    struct watchdog *wd);

#endif
