// generate.h: a model for `trident generate` (src/cli/cmd_generate.c) and
// `trident ckpt logits` (cmd_ckpt.c): the
// weights of a trident checkpoint (any layout it was saved in) or of a
// Hugging Face folder (src/ckpt/hf.h: Llama, Qwen2, Qwen3, Mistral), loaded whole into one process
// ((tp, pp, dp) = (1, 1, 1), FP32, the CPU backend, no MPI), whose prompts
// sample_generate (src/model/sample.h, with a key/value cache) or
// sample_continue (the window recomputed per token) continues.
#ifndef TRIDENT_GENERATE_H
#define TRIDENT_GENERATE_H

#include <stdbool.h>

#include "base/common.h"
#include "ckpt/checkpoint.h"
#include "kernels/ops.h"
#include "model/model.h"

enum { GENERATOR_MAX_STOP = 16 };

struct generator {
    struct llama_config lc;      // the weights' model (max_seq_len: the longest window)
    bool hf;                     // path is a Hugging Face folder (it holds config.json)
    char path[CKPT_PATH_MAX];    // as given
    char tokenizer_id[128];      // a trident checkpoint's tokenizer identity ("" unknown)
    char tokenizer_json[CKPT_PATH_MAX + 32]; // an HF folder's tokenizer.json when present, else ""
    int32_t stop_ids[GENERATOR_MAX_STOP]; // the model's own stop ids (eos_token_id's list)
    int n_stop;                  // 0: none known (the tokenizer's end-of-text only)
    int window;                  // T of the loaded model (0 before generator_load)
    struct backend *be;
    struct model *m;             // microbatch (rows, window)
};

// The stop ids (generator.stop_ids): an HF folder's eos_token_id
// (generation_config.json's, else config.json's, else the class default; every
// id of a list), or those of the generation_config.json `trident import`
// writes next to step-000000 (in path or the folder above it).
// Reads the model config of path: a Hugging Face folder (config.json,
// hf_open: every safetensors header checked) or a trident checkpoint (a
// step-NNNNNN folder or a [checkpoint] dir holding `latest`, checkpoint_open:
// checksums checked). Loads no weights. Errors: STATUS_BAD_INPUT naming the
// path (missing, neither kind) or hf_open's / checkpoint_open's message.
enum status generator_open(const char *path, struct generator *g, struct error *err);

// Builds the model with microbatch (1, window), 1 <= window <= lc.max_seq_len,
// on a CPU backend of `threads` threads, and reads every parameter whole in
// FP32 into it (hf_read_piece or checkpoint_read_piece). Errors:
// STATUS_BAD_INPUT for a bad window or a tensor missing from the file (named);
// STATUS_RUNTIME on a read failure or out of memory.
enum status generator_load(struct generator *g, int window, int threads, struct error *err);
// The same with microbatch (rows, window) and, cache_len > 0, a key/value
// cache of rows x cache_len positions (model_kv_cache_init; sample_generate:
// window bounds the tokens of one prefill step, rows x window the
// activations). 1 <= window, cache_len <= lc.max_seq_len. Errors as above.
enum status generator_load_cached(struct generator *g, int rows, int window, int cache_len,
                                  int threads, struct error *err);

void generator_close(struct generator *g);

// The index in ids[0, n) of the first id that stops generation (g's stop ids
// or eot, -1 for none), or n when none does. `trident generate` stops at the
// model's stop ids when it has some (as transformers' generate() does), else
// at the tokenizer's end-of-text.
int generator_stop_at(const struct generator *g, const int32_t *ids, int n, int eot);

#endif
