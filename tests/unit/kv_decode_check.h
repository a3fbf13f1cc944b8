// kv_decode_check.h: the check of test_kv_decode.c and
// tests/mpi/test_kv_decode_mpi.c: a model decoding with its key/value cache
// against the full window's forward of a whole model with the same weights.
// Two rows of different lengths share each step: row 0's prompt is 7 tokens,
// row 1's 12; the prefill feeds 12 tokens of both (row 0 padded with junk
// that later steps overwrite), then one step of 3 tokens, then one token per
// step; the tokens fed are the full window's (teacher forcing), so at every
// position the cached step's logits must equal the full forward's.
#ifndef TRIDENT_KV_DECODE_CHECK_H
#define TRIDENT_KV_DECODE_CHECK_H

#include <math.h>
#include <stdlib.h>

#include "model/model.h"
#include "test.h"

enum { KVC_T = 40, KVC_LEN = 48, KVC_P0 = 7, KVC_P1 = 12 };

// The logits (2, KVC_T, V) of full's forward of tokens (2, KVC_T): a whole
// model of microbatch (2, KVC_T) (under TP: every rank of the group calls).
// malloc'd.
static double *kv_full_logits(struct model *full, const int32_t *tokens, int V) {
    int32_t targets[2 * KVC_T];
    for (int i = 0; i < 2 * KVC_T; i++) targets[i] = IGNORE_INDEX;
    double loss, *ref = malloc(sizeof *ref * 2 * KVC_T * V);
    long n;
    model_forward(full, tokens, targets, &loss, &n);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < KVC_T; t++) model_get_logits_at(full, b, t, ref + ((size_t)b * KVC_T + t) * V);
    return ref;
}

// The full recompute of generation: the logits (2, KVC_T, V) of one
// generation step over the whole window, from position 0 of an empty cache
// (model_decode with Tq = KVC_T: every position's keys, values and logits
// computed from the tokens alone, nothing reused from an earlier step), by
// ref, a model of microbatch rows >= 2 x KVC_T with a cache of 2 rows of
// KVC_LEN. malloc'd. The same forward as kv_decode_vs's cached steps, so with
// batch-invariant steps (model_set_decode_invariant) the two agree bit for
// bit on the CPU backend, where model_forward's (the training pass's)
// BF16 GEMMs round otherwise.
static double *kv_recompute_logits(struct model *ref, const int32_t *tokens, int V) {
    double *out = malloc(sizeof *out * 2 * KVC_T * V);
    int32_t pos[2] = {0, 0};
    model_decode(ref, pos, KVC_T, tokens);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < KVC_T; t++) model_decode_logits_at(ref, b, t, out + ((size_t)b * KVC_T + t) * V);
    return out;
}

// The largest relative error (L2 over the vocabulary) over every position of
// both rows: dec's cached logits (a cache of 2 rows of KVC_LEN, steps of up
// to 12 tokens) against ref (2, KVC_T, V), the full window's logits of
// tokens (2, KVC_T). Collective as model_decode for dec.
static double kv_decode_vs(const double *ref, struct model *dec, const int32_t *tokens, int V) {
    double *got = malloc(sizeof *got * V);
    double worst = 0;
    int len[2] = {KVC_P0, KVC_P1}, pos[2] = {0, 0}; // positions fed so far
    int32_t step[2 * KVC_P1];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < KVC_P1; t++) step[b * KVC_P1 + t] = t < len[b] ? tokens[b * KVC_T + t] : 1 + t % 5;
    model_decode(dec, pos, KVC_P1, step);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < len[b]; t++) {
            model_decode_logits_at(dec, b, t, got);
            worst = fmax(worst, REL_ERR(V, got, ref + ((size_t)b * KVC_T + t) * V));
        }
    for (int s = 0; len[0] < KVC_T; s++) {
        int Tq = s == 0 ? 3 : 1; // a step of several tokens, then one at a time
        for (int b = 0; b < 2; b++) {
            pos[b] = len[b];
            for (int t = 0; t < Tq; t++)
                step[b * Tq + t] = len[b] + t < KVC_T ? tokens[b * KVC_T + len[b] + t] : 3;
        }
        model_decode(dec, pos, Tq, step);
        for (int b = 0; b < 2; b++) {
            for (int t = 0; t < Tq && len[b] + t < KVC_T; t++) {
                model_decode_logits_at(dec, b, t, got);
                worst = fmax(worst, REL_ERR(V, got, ref + ((size_t)b * KVC_T + len[b] + t) * V));
            }
            len[b] += Tq;
        }
    }
    free(got);
    return worst;
}

#endif
