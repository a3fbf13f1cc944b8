// hf.h (hf.c reads, hf_export.c writes): a checkpoint as a Hugging Face
// LlamaForCausalLM folder (or another family's, enum hf_family), the one
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
// independent forward pass. The other families (enum hf_family) are read and
// written the same way; a mixture-of-experts model's stacked experts (model.h)
// are split into and read from the family's per-expert tensors by rows
// (MixtralForCausalLM's block_sparse_moe names, Qwen2MoeForCausalLM's and
// Qwen3MoeForCausalLM's mlp.experts.e; tests/e2e/hf_moe.sh and hf_qwen3moe.sh
// against transformers).
#ifndef TRIDENT_HF_H
#define TRIDENT_HF_H

#include <stdint.h>

#include "base/common.h"
#include "checkpoint.h"
#include "kernels/ops.h"
#include "safetensors.h"

// The families read and written: transformers' class names in config.json's
// `architectures` and their model_type. Mixtral, Qwen2-MoE and Qwen3-MoE (Qwen3's
// attention, Qwen2-MoE's expert names, no shared expert) are the
// mixture-of-experts ones ([model] moe_*; docs/formats.md "Hugging Face
// export and import"): their per-expert tensors are trident's stacked ones
// (hf_moe_name).
enum hf_family { HF_LLAMA, HF_QWEN2, HF_QWEN3, HF_MISTRAL, HF_MIXTRAL, HF_QWEN2_MOE,
                 HF_QWEN3_MOE, HF_N_FAMILIES };
const char *hf_family_arch(enum hf_family f);       // "LlamaForCausalLM", ...
const char *hf_family_model_type(enum hf_family f); // "llama", ...

enum { HF_MAX_STOP_IDS = 16 };

// What config.json and generation_config.json say besides the model: the
// family and the token ids (generation_config.json's, when it gives them,
// replace config.json's, as in transformers' generate()).
struct hf_meta {
    enum hf_family family;
    int bos_id, pad_id;              // -1: none
    int n_eos;                       // 0: none
    int eos_ids[HF_MAX_STOP_IDS];    // every one a stop id of generation
};

// One row of the table of config keys (docs/formats.md "Hugging Face config
// keys"): file "config.json" or "generation_config.json", the key, the
// families whose config class defines it (bit 1 << enum hf_family), what
// trident does: "model" (read into struct llama_config, the class default
// when absent), "ids" (struct hf_meta), "checked" (architectures, model_type,
// hidden_act must name the family / silu), "refused" (any value but `only`,
// JSON text, is refused naming the key), "window" (sliding-window attention:
// refused where it takes effect), "no effect" (transformers' meaning changes
// neither weights nor logits), "decoding" (a setting of transformers'
// generate(), not of the model; trident generate takes its own flags). A
// key of neither table is ignored, as transformers keeps it as an unused
// attribute.
struct hf_key_row {
    const char *file, *key;
    unsigned families;
    const char *action, *only;
};
const struct hf_key_row *hf_config_keys(int *n);

// Reads dir/config.json (and dir/generation_config.json when present) into
// *lc (sizes, head_dim 0 when hidden_size / heads, qkv_bias for Qwen2 and
// Qwen2-MoE, qk_norm for Qwen3 and Qwen3-MoE, rope_scaling, max_seq_len =
// max_position_embeddings; Mixtral, Qwen2-MoE, Qwen3-MoE: the moe_* fields, the
// sparse layers as moe_first_dense_layers, router_aux_loss_coef as
// moe_aux_loss_coeff)
// and *meta. Only regular files are opened. Every number is checked for its
// JSON type (a string is not a number, a number not a boolean) and range
// (the [model] INI keys' bounds, 64-bit arithmetic) before use. Errors:
// STATUS_BAD_INPUT naming the file, the key and the value.
enum status hf_read_config(const char *dir, struct llama_config *lc, struct hf_meta *meta,
                           struct error *err);
// Reads the ids of the generation_config.json at path (absent: *found false,
// STATUS_OK) into meta, replacing those it gives; ids must be < vocab.
enum status hf_read_generation_config(const char *path, int vocab, struct hf_meta *meta,
                                      bool *found, struct error *err);

struct hf_export_args {
    const char *out_dir;        // must not exist; made via out_dir.tmp and a rename
    int dtype;                  // DTYPE_FP32, DTYPE_BF16, DTYPE_FP16, or -1: as stored
    uint64_t max_shard_bytes;   // 0: one model.safetensors
    int bos_id, eos_id;         // -1: none
    const struct hf_meta *meta; // or NULL; else its family and ids replace bos_id, eos_id
                                // (every eos id is written, a list when more than one)
    int family;                 // -1: from the model: qk_norm Qwen3, qkv_bias Qwen2, else
                                // meta's family, else Llama (MoE: Qwen3-MoE with qk_norm,
                                // Qwen2-MoE with qkv_bias, else Mixtral)
    const char *tokenizer_json; // copied to out_dir/tokenizer.json, or NULL
    const char *eos_token;      // its text for tokenizer_config.json, or NULL
    const char *chat_template;  // tokenizer_config.json "chat_template" (Jinja text the model was
                                // trained in, data/chat.h), or NULL
};

// Writes the folder of a->out_dir from the checkpoint r (any layout: each
// tensor is reassembled whole). Nothing is left at out_dir on failure.
// Errors: STATUS_BAD_INPUT when out_dir exists or a tensor is missing,
// STATUS_RUNTIME on a write failure; each names the path.
enum status hf_export(struct ckpt_reader *r, const struct hf_export_args *a, struct error *err);

// A Hugging Face folder of one of the families opened for reading: config.json and
// its safetensors (model.safetensors, or the files model.safetensors.index.json
// names), every header validated on open (safetensors_open).
struct hf_model;

// Opens dir. expect: the run's model, compared with config.json
// (hf_check_model) before any shape, or NULL. Errors: STATUS_BAD_INPUT naming
// the file (and tensor or key) for a missing or bad config.json, index or
// safetensors file, an architecture other than the families' (hf_read_config's
// refusals), a config.json other than expect's, a tensor in two files or in
// another shard than the index says, a tensor of the family's class missing
// (the first three named: a MoE folder's per-expert names) or of another
// shape than config.json implies.
enum status hf_open(const char *dir, const struct llama_config *expect, struct hf_model **out,
                    struct error *err);
void hf_close(struct hf_model *h);
// The model config.json describes (shape fields, rope_theta, norm_eps,
// max_seq_len from max_position_embeddings, tie_embeddings).
const struct llama_config *hf_config(const struct hf_model *h);
// The first stop id (generation_config.json's eos_token_id, else
// config.json's, else the class default), or -1.
int hf_eos_id(const struct hf_model *h);
// The family and every id of config.json / generation_config.json: all of
// meta->eos_ids are stop ids for generation.
const struct hf_meta *hf_model_meta(const struct hf_model *h);

// Refuses a run whose model differs from the folder's: Errors:
// STATUS_BAD_INPUT "DIR/config.json: KEY = X, the run's [model] KEY = Y", every
// differing key in one message ("; " between them, "(N differences)" after).
enum status hf_check_model(const struct hf_model *h, const struct llama_config *model,
                           struct error *err);

// Fills want->data (flat_end - flat_begin elements of want->dtype, which must
// be DTYPE_FP32) with the wanted range of the wanted block of the tensor
// "param/<trident name>" (a MoE model's stacked experts: each block row from
// the expert tensor that holds it), reading only those bytes (one pread per
// block row);
// BF16 and F16 values are widened exactly. Errors: STATUS_BAD_INPUT when the
// tensor is absent, its shape is not (grows, gcols) or the range read holds a
// NaN or an infinity ("DIR/FILE: tensor NAME holds K non-finite values ...;
// the first at element E (row R, column C)", E the row-major index in the
// whole tensor); STATUS_RUNTIME on a short read.
enum status hf_read_piece(struct hf_model *h, struct ckpt_piece *want, struct error *err);

// Writes the folder's weights as a trident checkpoint of one rank, step 0,
// in dir (a [checkpoint] dir: dir/step-000000 and dir/latest; dir must hold
// no checkpoint yet): every parameter whole, FP32 (BF16 and F16 widened
// exactly), the config as its manifest's [model], tokenizer_id ("" unknown)
// as its tokenizer; the folder's tokenizer.json, when present, is copied to
// dir/tokenizer.json. No optimizer moments: the manifest says weights_only = 1,
// which `ckpt verify` accepts and a resume refuses (naming model.init_from);
// for init_from, `trident generate` and `trident ckpt export`. Errors: STATUS_BAD_INPUT when dir holds
// `latest`; checkpoint_save's otherwise.
enum status hf_import(struct hf_model *h, const char *dir, const char *tokenizer_id,
                      struct error *err);

// Writes meta's bos, eos (an id, or a list when more than one) and pad ids
// as the generation_config.json at path (via path.tmp and a rename): what
// `trident import` keeps next to step-000000 and a run started with init_from
// keeps in its [checkpoint] dir, where generate and export read them.
// Errors: STATUS_RUNTIME naming path.
enum status hf_write_generation_config(const char *path, const struct hf_meta *meta,
                                       struct error *err);

// The tensors of the folder in name order: i in [0, n).
int hf_n_tensors(const struct hf_model *h);
const struct safetensors_tensor *hf_tensor_at(const struct hf_model *h, int i);

#endif
