// config.h: the training configuration. An INI file (read with inih) plus
// `section.key=value` command-line overrides fill one struct config; one table
// of key descriptors (src/config/config_keys.c) drives parsing, defaults, range checks,
// printing and docs/config.md. Key names are contracts (docs/design.md §10).
//
// File syntax (also in docs/config.md, generated from config_write_docs):
// - `[section]` headers and `key = value` lines; values are not quoted.
// - A full-line comment starts with `#` or `;`. An inline comment is `#` or `;`
//   preceded by whitespace and runs to the end of the line. Any other text after
//   a value is part of it, so `steps = 100 total` and `steps = 100abc` are errors.
// - Lines may not be indented (inih would read an indented line as the
//   continuation of the previous value); `key: value` is not accepted.
// - A key may appear once per file; an override may name a key once.
// Every error is STATUS_BAD_INPUT and names file:line (or the command-line
// argument), section.key, the value found and what was expected.
#ifndef TRIDENT_CONFIG_H
#define TRIDENT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/common.h"
#include "ckpt/checkpoint.h" // enum resume_mode
#include "kernels/ops.h"     // enum dtype
#include "model/optimizer.h" // enum lr_schedule, enum recompute (model.h)
#include "parallel/pipeline.h" // enum pp_schedule
#include "parallel/topology.h" // struct grid_layout

#define CONFIG_PATH_MAX 512
#define CONFIG_MAX_KEYS 128 // >= number of rows in the key table (checked)

enum model_arch { MODEL_ARCH_LLAMA };
enum device { DEVICE_CPU, DEVICE_CUDA };
enum attention_impl { ATTENTION_AUTO, ATTENTION_CUDNN, ATTENTION_NATIVE };
enum loss_scale_mode { LOSS_SCALE_DYNAMIC, LOSS_SCALE_STATIC };
// [precision] fp8: the block linear layers' GEMM operands in FP8 (docs/design.md §5):
// none; hybrid: E4M3 forward, E5M2 output gradients (Transformer Engine's default); e4m3: E4M3 everywhere.
enum fp8_mode { FP8_NONE, FP8_HYBRID, FP8_E4M3 };
// [precision] fp8_scaling: each tensor's scale from its amax just before the cast, or from an amax history.
enum fp8_scaling { FP8_SCALING_CURRENT, FP8_SCALING_DELAYED };
// [precision] fp8_amax_compute: the delayed scale from the history's max or its newest entry.
enum fp8_amax_compute { FP8_AMAX_MAX, FP8_AMAX_MOST_RECENT };
// [precision] fp8_skip_layers: blocks kept in bf16 under fp8 (Megatron-LM's
// --first-last-layers-bf16): none, the first block, the last, both, or a
// count N (the first N and the last N blocks: FP8_SKIP_COUNT, fp8_skip_count).
enum fp8_skip { FP8_SKIP_NONE, FP8_SKIP_FIRST, FP8_SKIP_LAST, FP8_SKIP_FIRST_LAST, FP8_SKIP_COUNT };
// [train] loss_on: every target, or only those the shards' /loss_mask marks.
enum loss_on { LOSS_ON_ALL, LOSS_ON_RESPONSE };
// [data] packing: documents concatenated into the token stream, attending
// across boundaries (concat) or each to itself with positions reset at every
// end-of-text (concat_reset, model_set_doc_eot).
enum packing { PACKING_CONCAT, PACKING_CONCAT_RESET };

struct model_config {
    enum model_arch arch;
    int vocab_size;      // V
    int d_model;         // C
    int n_layers;        // L
    int n_heads;         // H
    int n_kv_heads;      // Hkv
    int ffn_dim;         // F
    int max_seq_len;     // longest T the RoPE tables cover
    double rope_theta;
    int head_dim;        // D; 0: d_model / n_heads
    bool qkv_bias;       // q, k, v projections have biases (Qwen2)
    bool qk_norm;        // RMSNorm over each head's q and k before RoPE (Qwen3)
    enum rope_scaling_type rope_scaling;
    double rope_scaling_factor;
    double rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    double norm_eps;
    bool tie_embeddings;
    double init_std;
    enum recompute recompute;
    char init_from[CONFIG_PATH_MAX]; // HF folder or trident checkpoint for a fresh run; "" unset
    // Mixture of experts (moe_experts 0: dense); see config_keys.c
    int moe_experts, moe_top_k, moe_ffn_dim, moe_shared_experts, moe_shared_ffn_dim;
    bool moe_shared_gate, moe_norm_topk;
    double moe_capacity_factor, moe_aux_loss_coeff, moe_z_loss_coeff;
    int moe_first_dense_layers;
};

// The head size D of m: head_dim, or d_model / n_heads when it is 0.
static inline int config_head_dim(const struct model_config *m) {
    return m->head_dim ? m->head_dim : m->d_model / m->n_heads;
}

struct train_config {
    int seq_len;           // T
    int micro_batch_size;  // B: sequences per microbatch per DP rank
    int global_batch_size; // sequences per optimizer step over all DP ranks
    int steps;
    double lr;
    double min_lr;
    int warmup_steps;
    enum lr_schedule lr_schedule;
    double weight_decay;
    double beta1;
    double beta2;
    double adam_eps;
    double grad_clip;  // 0: no clipping
    double label_smoothing;
    enum loss_on loss_on;
    int64_t seed;
    int eval_every;    // 0: no evaluation
    int eval_steps;
    int sample_every;  // 0: no sampling
    int sample_tokens;
    double sample_temperature; // 0: greedy
    int sample_top_k;          // 0: the whole vocabulary
    double sample_top_p;       // (0, 1]; 1: every token the top-k keeps
    int exit_interval;         // 0: run to steps
    int max_skipped_steps;     // consecutive non-finite steps that stop the run
    double exit_duration_mins; // wall-clock budget of one `trident train`; 0: none
    bool override_schedule;    // resume with another LR schedule (continued without a jump)
};

struct data_config {
    char path[CONFIG_PATH_MAX];      // dataset folder (cold tier)
    char paths[CONFIG_PATH_MAX];     // blend "a:0.7, b:0.3" (blend_parse); "" unset: path
    char tokenizer[CONFIG_PATH_MAX]; // tokenizer.json; "" unset
    char cache_dir[CONFIG_PATH_MAX]; // hot tier; "" none
    int64_t cache_bytes;
    int prefetch_shards;
    enum packing packing;
};

struct parallel_config {
    int tp;
    int pp;
    int dp;
    int dp_shard; // 0: dp (one shard group of every data rank); dp_replicate = dp / dp_shard
    int cp;       // context parallel: each sequence's tokens over cp ranks (ring attention)
    int ep;       // expert parallel: the routed experts over ep data ranks (all-to-all)
    int virtual_stages;
    enum pp_schedule pp_schedule; // 1f1b (interleaved when virtual_stages > 1), zb-h1, zbv
    bool sequence_parallel;
    int zero_stage; // 0 to 3
    bool reshard_after_forward; // zero_stage 3
    int bucket_mb;
};

struct precision_config {
    enum dtype dtype; // DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16
    enum dtype grad_dtype; // DTYPE_FP32 or DTYPE_BF16: the data-parallel gradient reduction
    enum loss_scale_mode loss_scale_mode;
    double loss_scale; // the fixed scale when LOSS_SCALE_STATIC, else 0
    // fp16 dynamic loss scale (Megatron-LM's DynamicGradScaler defaults, no hysteresis)
    double loss_scale_initial;      // 2^32
    double loss_scale_min;          // 1
    double loss_scale_backoff;      // 0.5: the factor on an overflow
    double loss_scale_growth;       // 2: the factor after growth_interval good steps
    int loss_scale_growth_interval; // 1000
    // FP8 linear layers (issue 29; Transformer Engine's DelayedScaling defaults)
    enum fp8_mode fp8;                     // FP8_NONE
    enum fp8_scaling fp8_scaling;          // FP8_SCALING_DELAYED
    int fp8_amax_history_len;              // 1024 steps
    enum fp8_amax_compute fp8_amax_compute; // FP8_AMAX_MAX
    int fp8_margin;                        // 0: scale = (fp8 max / amax) / 2^margin
    enum fp8_skip fp8_skip_layers;         // FP8_SKIP_NONE
    double fp8_skip_count;                 // FP8_SKIP_COUNT: N (an integer >= 1), else 0
};

struct checkpoint_config {
    char dir[CONFIG_PATH_MAX];
    int every;     // 0: no periodic checkpoints
    int keep_last; // 0: keep all
    bool async;    // background writer (docs/design.md §7 "Asynchronous saves")
    enum resume_mode resume;
    char resume_path[CONFIG_PATH_MAX]; // when RESUME_PATH, else ""
    bool branch; // resuming before dir's latest moves the later steps aside (else refused)
};

struct log_config {
    int every;
    char metrics_file[CONFIG_PATH_MAX]; // "": <run_dir>/metrics.jsonl
    char run_dir[CONFIG_PATH_MAX];
    bool tensorboard;                      // event files in run_dir (rank 0)
    char prometheus_file[CONFIG_PATH_MAX]; // textfile-collector file; "" off
};

struct system_config {
    enum device device;
    enum attention_impl attention; // cuda: cuDNN's fused attention or the native kernels
    int threads;        // 0: OpenMP's default
    double peak_tflops; // 0: measure at start
    double watchdog_s;  // 0: no watchdog
    bool share_devices; // cuda: more ranks on a node than devices share them round-robin (else refused)
};

struct config {
    struct model_config model;
    struct train_config train;
    struct data_config data;
    struct parallel_config parallel;
    struct precision_config precision;
    struct checkpoint_config checkpoint;
    struct log_config log;
    struct system_config system;
    // Where each value came from, indexed like the key table:
    // > 0: line in `file`; 0: default; < 0: command-line override number -origin.
    char file[CONFIG_PATH_MAX];
    int origin[CONFIG_MAX_KEYS];
};

// ---- the key table ----------------------------------------------------------

enum config_type {
    CONFIG_INT,   // int
    CONFIG_INT64, // int64_t
    CONFIG_FLOAT, // double
    CONFIG_BOOL,  // bool: true, false, 1, 0
    CONFIG_ENUM,  // an int-sized enum named by choices
    CONFIG_SIZE,  // int64_t bytes; K, M, G, T suffixes (powers of 1024)
    CONFIG_PATH,  // char[CONFIG_PATH_MAX]
};

struct config_choice {
    const char *name;
    int value;
};

#define CONFIG_MIN_EXCLUSIVE 1u // value > min rather than >= min
#define CONFIG_MAX_EXCLUSIVE 2u // value < max rather than <= max
#define CONFIG_OPTIONAL 4u      // a path that may stay unset ("")

// One key. min/max bound INT, INT64, FLOAT, SIZE values and the alternative of an
// ENUM (-INFINITY/INFINITY: unbounded). An ENUM with alt_type set accepts a
// value that is none of its choices when it parses as alt_type: then the enum
// becomes alt_value and the value goes to alt_offset (resume = <path>,
// loss_scale = <number>); a choice resets alt_offset to zero.
struct config_key {
    const char *section;
    const char *key;
    enum config_type type;
    const char *def; // default, written as in a file; "" for an unset path
    double min, max;
    unsigned flags;
    const char *unit;
    const char *doc;
    size_t offset; // into struct config
    const struct config_choice *choices; // ENUM: ends with {NULL, 0}
    int has_alt;
    enum config_type alt_type;
    size_t alt_offset;
    int alt_value;
};

extern const struct config_key config_keys[];
extern const int config_n_keys;
extern const char *const config_sections[]; // NULL-terminated, in file order

// Another trainer's name for a setting, so that an unknown key written as
// Megatron-LM or llm.c spells it is answered with trident's key (config.c's
// unknown-key messages): "Megatron-LM's --moe-router-topk is model.moe_top_k
// here". Only settings whose meaning is the same are listed; note says what
// differs (a unit, a value to write) or, with target NULL, why there is no key.
struct config_alias {
    const char *name;   // as written in an INI: Megatron-LM's argument with '_', llm.c's variable
    const char *flag;   // llm.c's flag ("-l"); NULL: Megatron-LM's --name with '-' for '_'
    const char *target; // "section.key" or "section.key = value"; NULL: none
    const char *note;   // NULL, or the difference
};
extern const struct config_alias config_aliases[];
extern const int config_n_aliases;
// "; Megatron-LM's --moe-router-topk is model.moe_top_k here" into buf when
// key is the name of a config_aliases row (compared without case, '-' read as
// '_', leading dashes dropped: `--moe-router-topk` finds it too) or an llm.c
// flag ("-l"); false, buf untouched, when it is none. The unknown-key
// messages of config_load end so.
bool config_alias_hint(const char *key, char *buf, size_t n);

// ---- API ----------------------------------------------------------------------

// Fills every value with its default (the table's def) and origins with 0.
void config_defaults(struct config *cfg);

// Defaults, then the INI file at path (NULL: no file), then the overrides
// ("section.key=value", applied in order). Syntax, types and per-key ranges
// are checked here; cross-key rules in config_validate.
// Errors: STATUS_BAD_INPUT (see the top of this file; also a file that cannot
// be opened), STATUS_RUNTIME on a read error.
enum status config_load(const char *path, int n_overrides, char **overrides, struct config *out,
                        struct error *err);

// The largest head size (config_head_dim) system.device = cuda takes: the
// CUDA attention kernels' limit (kernels/cuda/cuda_attention.cu).
#define CONFIG_CUDA_MAX_HEAD_DIM 256

// First resolves parallel.dp = 0 (config_resolve_dp), then the cross-key
// checks: tp * cp * pp * dp == world_size (skipped when world_size <= 0),
// head, layer, batch and sequence divisibility, lr and warmup order, and that
// device = cuda only when has_cuda (pass whether this build has a CUDA backend),
// with a head size <= CONFIG_CUDA_MAX_HEAD_DIM; attention = cudnn only with
// device = cuda and a 16-bit dtype.
// Each message names the keys, their values and where they were set.
// The model against the data (vocab_size, tokenizer identity, seq_len) is
// checked by dataset_open, which reads index.ini.
enum status config_validate(struct config *cfg, int world_size, bool has_cuda,
                            struct error *err);

// Keys set to another value than their default that the rest of the config
// leaves unread: [precision] fp8_scaling, fp8_amax_history_len,
// fp8_amax_compute, fp8_margin and fp8_skip_layers with fp8 = none. Not an
// error (a user toggles fp8 and keeps the rest); `trident train` prints the
// text as a warning at start (rank 0, stderr). Writes into buf a sentence
// naming each such key, its value and origin, and the key that makes them
// unread ("" when none). Returns how many keys it names.
int config_unread_keys(const struct config *cfg, char *buf, size_t n);

// The blocks [precision] fp8_skip_layers keeps in bf16: the first *first and
// the last *last of the model's n_layers (0, 0 without fp8).
void config_fp8_skip(const struct config *cfg, int *first, int *last);

// parallel.dp = 0 means "infer it": dp = world_size / (tp * cp * pp); with
// world_size <= 0 (no world: `trident plan` without --world-size), dp = 1.
// A dp already set is left as it is. Errors: STATUS_BAD_INPUT when
// world_size is not a multiple of tp * pp (naming the world sizes around it
// that are), or when global_batch_size is not a multiple of micro_batch_size
// times the inferred dp (naming the nearest global_batch_size values below
// and above and the nearest world sizes that divide it).
enum status config_resolve_dp(struct config *cfg, int world_size, struct error *err);

// The grid of the [parallel] keys (parallel/topology.h: topology_layout of
// tp, pp, dp, dp_shard, cp); parallel.dp resolved (config_resolve_dp) and
// dp_shard dividing it (config_validate).
struct grid_layout config_grid(const struct config *cfg);

// Writes the resolved config as an INI file that config_load reads back to an
// equal config (config_equal). Unset optional paths are written as comments.
void config_print(const struct config *cfg, FILE *f);
// config_print with, after each key, a comment naming where its value came
// from: "default", "FILE:LINE" or "command line argument N" (config_origin);
// config_load reads the text back to an equal config. `trident train
// --print-config` prints it.
void config_print_origins(const struct config *cfg, FILE *f);
// config_print to path, after header (NULL: none): each of its lines
// ('\n'-separated) as a `# ` comment line, which config_load skips.
// Errors: STATUS_RUNTIME naming path.
enum status config_write(const struct config *cfg, const char *header, const char *path,
                         struct error *err);

// True when every value in the table is equal (origins are not compared).
bool config_equal(const struct config *a, const struct config *b);

// The key's row in the table, or -1.
int config_key_index(const char *section, const char *key);
// "file:line", "command line argument N" or "default" for key index i.
const char *config_origin(const struct config *cfg, int i, char *buf, size_t n);
// The value of key index i as it would be written in a file ("" unset path).
const char *config_format_value(const struct config *cfg, int i, char *buf, size_t n);

// Tooling and tests: the Markdown reference of every key (docs/config.md).
// The suite compares the committed file with this text; regenerate it with
// `build/tests/test_config --write-docs`.
void config_write_docs(FILE *f);

#endif
