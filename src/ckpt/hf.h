// hf.h: a checkpoint as a Hugging Face LlamaForCausalLM folder, the one
// transformers' from_pretrained loads (docs/formats.md "Hugging Face export"):
//
//   config.json                      LlamaForCausalLM: sizes, rope_theta,
//                                    rms_norm_eps, tie_word_embeddings,
//                                    torch_dtype, bos/eos ids
//   generation_config.json           bos/eos ids
//   model.safetensors                every parameter, whole, by its HF name
//   (or model-0000i-of-0000n.safetensors + model.safetensors.index.json
//    when the tensors exceed max_shard_bytes)
//   tokenizer.json, tokenizer_config.json   when a tokenizer file is given
//
// trident's parameter names, shapes and q/k row order are those of
// LlamaForCausalLM (rotate_half RoPE pairs (i, i + D/2) of each head), so
// tensors are copied, not permuted; tests/e2e/hf_export.sh checks that with an
// independent forward pass.
#ifndef TRIDENT_HF_H
#define TRIDENT_HF_H

#include <stdint.h>

#include "base/common.h"
#include "ckpt/checkpoint.h"
#include "kernels/ops.h"

struct hf_export_args {
    const char *out_dir;        // must not exist; made via out_dir.tmp and a rename
    int dtype;                  // DTYPE_FP32, DTYPE_BF16, DTYPE_FP16, or -1: as stored
    uint64_t max_shard_bytes;   // 0: one model.safetensors
    int bos_id, eos_id;         // -1: none
    const char *tokenizer_json; // copied to out_dir/tokenizer.json, or NULL
    const char *eos_token;      // its text for tokenizer_config.json, or NULL
};

// Writes the folder of a->out_dir from the checkpoint r (any layout: each
// tensor is reassembled whole). Nothing is left at out_dir on failure.
// Errors: STATUS_BAD_INPUT when out_dir exists or a tensor is missing,
// STATUS_RUNTIME on a write failure; each names the path.
enum status hf_export(struct ckpt_reader *r, const struct hf_export_args *a, struct error *err);

#endif
