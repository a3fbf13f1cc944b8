// config_keys.c: the table of configuration keys (docs/design.md §10). Each row
// gives the type, default, range, unit and meaning of one key; parsing,
// defaults, printing and docs/config.md all come from here, so a new key is
// one new row (and a field in config.h).
#include <limits.h>
#include <math.h>

#include "config.h"

#define F(field) offsetof(struct config, field)
#define NOMIN (-INFINITY)
#define NOMAX INFINITY

#define KEY_INT(sec, name, field, def_, lo, hi, unit_, doc_)                       \
    {.section = sec, .key = name, .type = CONFIG_INT, .def = def_, .min = lo, .max = hi, \
     .unit = unit_, .doc = doc_, .offset = F(field)}
#define KEY_INT64(sec, name, field, def_, lo, hi, unit_, doc_)                     \
    {.section = sec, .key = name, .type = CONFIG_INT64, .def = def_, .min = lo, .max = hi, \
     .unit = unit_, .doc = doc_, .offset = F(field)}
#define KEY_SIZE(sec, name, field, def_, lo, hi, doc_)                             \
    {.section = sec, .key = name, .type = CONFIG_SIZE, .def = def_, .min = lo, .max = hi, \
     .unit = "bytes", .doc = doc_, .offset = F(field)}
#define KEY_FLOAT(sec, name, field, def_, lo, hi, flags_, unit_, doc_)             \
    {.section = sec, .key = name, .type = CONFIG_FLOAT, .def = def_, .min = lo, .max = hi, \
     .flags = flags_, .unit = unit_, .doc = doc_, .offset = F(field)}
#define KEY_BOOL(sec, name, field, def_, doc_)                                     \
    {.section = sec, .key = name, .type = CONFIG_BOOL, .def = def_, .unit = "", .doc = doc_, \
     .offset = F(field)}
#define KEY_ENUM(sec, name, field, def_, choices_, doc_)                           \
    {.section = sec, .key = name, .type = CONFIG_ENUM, .def = def_, .unit = "", .doc = doc_, \
     .offset = F(field), .choices = choices_}
#define KEY_PATH(sec, name, field, def_, flags_, doc_)                             \
    {.section = sec, .key = name, .type = CONFIG_PATH, .def = def_, .flags = flags_,  \
     .unit = "", .doc = doc_, .offset = F(field)}

static const struct config_choice arch_choices[] = {{"llama", MODEL_ARCH_LLAMA}, {NULL, 0}};
static const struct config_choice recompute_choices[] = {
    {"none", RECOMPUTE_NONE}, {"selective", RECOMPUTE_SELECTIVE}, {"full", RECOMPUTE_FULL}, {NULL, 0}};
static const struct config_choice rope_scaling_choices[] = {
    {"none", ROPE_SCALING_NONE}, {"linear", ROPE_SCALING_LINEAR}, {"llama3", ROPE_SCALING_LLAMA3}, {NULL, 0}};
static const struct config_choice schedule_choices[] = {{"cosine", LR_SCHEDULE_COSINE},
                                                        {"linear", LR_SCHEDULE_LINEAR},
                                                        {"constant", LR_SCHEDULE_CONSTANT},
                                                        {NULL, 0}};
static const struct config_choice loss_on_choices[] = {
    {"all", LOSS_ON_ALL}, {"response", LOSS_ON_RESPONSE}, {NULL, 0}};
static const struct config_choice packing_choices[] = {
    {"concat", PACKING_CONCAT}, {"concat_reset", PACKING_CONCAT_RESET}, {NULL, 0}};
static const struct config_choice dtype_choices[] = {
    {"fp32", DTYPE_FP32}, {"bf16", DTYPE_BF16}, {"fp16", DTYPE_FP16}, {NULL, 0}};
static const struct config_choice grad_dtype_choices[] = {
    {"fp32", DTYPE_FP32}, {"bf16", DTYPE_BF16}, {NULL, 0}};
static const struct config_choice loss_scale_choices[] = {{"dynamic", LOSS_SCALE_DYNAMIC}, {NULL, 0}};
static const struct config_choice fp8_choices[] = {
    {"none", FP8_NONE}, {"hybrid", FP8_HYBRID}, {"e4m3", FP8_E4M3}, {NULL, 0}};
static const struct config_choice fp8_scaling_choices[] = {
    {"current", FP8_SCALING_CURRENT}, {"delayed", FP8_SCALING_DELAYED}, {NULL, 0}};
static const struct config_choice fp8_amax_compute_choices[] = {
    {"max", FP8_AMAX_MAX}, {"most_recent", FP8_AMAX_MOST_RECENT}, {NULL, 0}};
static const struct config_choice fp8_skip_choices[] = {
    {"none", FP8_SKIP_NONE}, {"first", FP8_SKIP_FIRST}, {"last", FP8_SKIP_LAST},
    {"first,last", FP8_SKIP_FIRST_LAST}, {NULL, 0}};
static const struct config_choice pp_schedule_choices[] = {
    {"1f1b", PP_SCHEDULE_1F1B}, {"interleaved", PP_SCHEDULE_INTERLEAVED},
    {"zb-h1", PP_SCHEDULE_ZB_H1}, {"zbv", PP_SCHEDULE_ZBV}, {NULL, 0}};
static const struct config_choice resume_choices[] = {{"auto", RESUME_AUTO}, {"none", RESUME_NONE}, {NULL, 0}};
static const struct config_choice device_choices[] = {{"cpu", DEVICE_CPU}, {"cuda", DEVICE_CUDA}, {NULL, 0}};
static const struct config_choice attention_choices[] = {
    {"auto", ATTENTION_AUTO}, {"cudnn", ATTENTION_CUDNN}, {"native", ATTENTION_NATIVE}, {NULL, 0}};

const char *const config_sections[] = {"model", "train", "data", "parallel", "precision",
                                       "checkpoint", "log", "system", NULL};

const struct config_key config_keys[] = {
    // [model]: a LLaMA-style decoder (docs/design.md §4)
    KEY_ENUM("model", "arch", model.arch, "llama", arch_choices, "model family; only LLaMA-style decoders"),
    KEY_INT("model", "vocab_size", model.vocab_size, "8192", 2, LLAMA_MAX_VOCAB, "tokens",
            "vocabulary size V; must equal the dataset's vocab_size (index.ini)"),
    KEY_INT("model", "d_model", model.d_model, "256", 1, LLAMA_MAX_D_MODEL, "", "model width C"),
    KEY_INT("model", "n_layers", model.n_layers, "4", 1, LLAMA_MAX_LAYERS, "", "decoder blocks L"),
    KEY_INT("model", "n_heads", model.n_heads, "8", 1, LLAMA_MAX_HEADS, "", "query heads H; head size D = head_dim, or d_model / n_heads when head_dim is 0"),
    KEY_INT("model", "n_kv_heads", model.n_kv_heads, "4", 1, LLAMA_MAX_HEADS, "",
            "key/value heads Hkv (grouped-query attention); divides n_heads"),
    KEY_INT("model", "ffn_dim", model.ffn_dim, "704", 1, LLAMA_MAX_FFN, "", "SwiGLU hidden width F"),
    KEY_INT("model", "max_seq_len", model.max_seq_len, "256", 1, LLAMA_MAX_SEQ_LEN, "tokens",
            "longest sequence the RoPE tables cover"),
    KEY_FLOAT("model", "rope_theta", model.rope_theta, "10000", 0, NOMAX, CONFIG_MIN_EXCLUSIVE, "",
              "RoPE base frequency"),
    KEY_INT("model", "head_dim", model.head_dim, "0", 0, LLAMA_MAX_HEAD_DIM, "",
            "head size D (even); 0: d_model / n_heads. q_proj is (n_heads D, d_model), k_proj and "
            "v_proj (n_kv_heads D, d_model), o_proj (d_model, n_heads D): Hugging Face's head_dim, "
            "which Qwen3 sets with n_heads D != d_model"),
    KEY_BOOL("model", "qkv_bias", model.qkv_bias, "false",
             "q_proj, k_proj and v_proj have biases (Qwen2's q_proj.bias (n_heads D), k_proj.bias, "
             "v_proj.bias (n_kv_heads D)), split over tp with the weights' rows"),
    KEY_BOOL("model", "qk_norm", model.qk_norm, "false",
             "RMSNorm (norm_eps, weights q_norm, k_norm of size D) over each head's q and k before "
             "RoPE (Qwen3); the weights are replicated over tp"),
    KEY_ENUM("model", "rope_scaling", model.rope_scaling, "none", rope_scaling_choices,
             "RoPE frequency scaling (Hugging Face rope_scaling.rope_type): none; linear divides "
             "every position by rope_scaling_factor; llama3 (Llama 3.1/3.2) divides the frequencies "
             "of wavelengths above rope_original_max_pos / rope_low_freq_factor by "
             "rope_scaling_factor, keeps those below rope_original_max_pos / rope_high_freq_factor "
             "and interpolates between"),
    KEY_FLOAT("model", "rope_scaling_factor", model.rope_scaling_factor, "1", 0, NOMAX,
              CONFIG_MIN_EXCLUSIVE, "", "rope_scaling = linear or llama3: the factor (HF factor)"),
    KEY_FLOAT("model", "rope_low_freq_factor", model.rope_low_freq_factor, "1", 0, NOMAX,
              CONFIG_MIN_EXCLUSIVE, "", "rope_scaling = llama3: HF low_freq_factor; < rope_high_freq_factor"),
    KEY_FLOAT("model", "rope_high_freq_factor", model.rope_high_freq_factor, "4", 0, NOMAX,
              CONFIG_MIN_EXCLUSIVE, "", "rope_scaling = llama3: HF high_freq_factor"),
    KEY_INT("model", "rope_original_max_pos", model.rope_original_max_pos, "8192", 1,
            LLAMA_MAX_SEQ_LEN, "tokens",
            "rope_scaling = llama3: the context length of the unscaled model (HF "
            "original_max_position_embeddings)"),
    KEY_FLOAT("model", "norm_eps", model.norm_eps, "1e-05", 0, NOMAX, CONFIG_MIN_EXCLUSIVE, "",
              "RMSNorm epsilon"),
    KEY_BOOL("model", "tie_embeddings", model.tie_embeddings, "true",
             "LM head shares the token embedding matrix"),
    KEY_FLOAT("model", "init_std", model.init_std, "0.02", 0, NOMAX, CONFIG_MIN_EXCLUSIVE, "",
              "standard deviation of the normal weight init"),
    KEY_PATH("model", "init_from", model.init_from, "", CONFIG_OPTIONAL,
             "a fresh run starts from these weights: a Hugging Face Llama, Qwen2, Qwen3, Mistral, "
             "Mixtral, Qwen2-MoE or Qwen3-MoE folder (config.json, safetensors) or a trident "
             "checkpoint; every [model] size must match them; the optimizer starts fresh; with "
             "eval_every > 0 their validation loss is measured first (step 0); ignored when "
             "resuming"),
    KEY_ENUM("model", "recompute", model.recompute, "none", recompute_choices,
             "activation recomputation in the backward pass: selective recomputes the norm "
             "outputs, RoPE'd q/k and SwiGLU product, full keeps only each block's input "
             "(bit-identical results; docs/design.md §5)"),

    // [model] moe_*: mixture-of-experts feed-forward layers (issue 31; src/model/moe.h,
    // docs/design.md §3 "The mixture-of-experts ops")
    KEY_INT("model", "moe_experts", model.moe_experts, "0", 0, 256, "",
            "routed experts E per MoE layer; 0: a dense model (every block a SwiGLU MLP of ffn_dim). "
            "With E > 0 every block from moe_first_dense_layers on holds a router (E, d_model), E "
            "SwiGLU experts of moe_ffn_dim and the shared expert instead of the dense MLP "
            "(Mixtral's num_local_experts, Qwen2-MoE's num_experts)"),
    KEY_INT("model", "moe_top_k", model.moe_top_k, "2", 1, 256, "",
            "experts k each token is routed to, k <= moe_experts (num_experts_per_tok)"),
    KEY_INT("model", "moe_ffn_dim", model.moe_ffn_dim, "0", 0, LLAMA_MAX_FFN, "",
            "each routed expert's SwiGLU width; 0: ffn_dim (Qwen2-MoE's moe_intermediate_size; "
            "Mixtral's intermediate_size)"),
    KEY_INT("model", "moe_shared_experts", model.moe_shared_experts, "0", 0, 1, "",
            "always-active shared experts per MoE layer: 0 or 1 (Qwen2-MoE's shared_expert)"),
    KEY_INT("model", "moe_shared_ffn_dim", model.moe_shared_ffn_dim, "0", 0, LLAMA_MAX_FFN, "",
            "the shared expert's SwiGLU width; 0: moe_ffn_dim (Qwen2-MoE's "
            "shared_expert_intermediate_size)"),
    KEY_BOOL("model", "moe_shared_gate", model.moe_shared_gate, "true",
             "the shared expert's output is scaled by sigmoid(x Ws^T), Ws (1, d_model) "
             "(Qwen2-MoE's shared_expert_gate); false: added as is (DeepSeek)"),
    KEY_BOOL("model", "moe_norm_topk", model.moe_norm_topk, "true",
             "renormalise the k routing weights to sum to 1 (Mixtral: true; Qwen2-MoE's "
             "norm_topk_prob, false in its released models)"),
    KEY_FLOAT("model", "moe_capacity_factor", model.moe_capacity_factor, "0", 0, NOMAX, 0, "",
              "expert capacity ceil(f N k / E) tokens per expert and microbatch, the rest dropped "
              "(Switch Transformer); 0: dropless"),
    KEY_FLOAT("model", "moe_aux_loss_coeff", model.moe_aux_loss_coeff, "0.001", 0, NOMAX, 0, "",
              "coefficient of the load-balancing loss added to the training loss (transformers' "
              "router_aux_loss_coef; its loss over all MoE layers' router logits)"),
    KEY_FLOAT("model", "moe_z_loss_coeff", model.moe_z_loss_coeff, "0", 0, NOMAX, 0, "",
              "coefficient of the router z-loss mean(logsumexp(logits)^2) per MoE layer, summed "
              "over layers (ST-MoE; Megatron's moe_z_loss_coeff, 1e-3 there)"),
    KEY_INT("model", "moe_first_dense_layers", model.moe_first_dense_layers, "0", 0,
            LLAMA_MAX_LAYERS, "",
            "the first blocks keep the dense MLP of ffn_dim, the others are MoE (DeepSeek's "
            "first_k_dense_replace); must be < n_layers"),

    // [train]: batch terms as in Megatron (docs/design.md §4)
    KEY_INT("train", "seq_len", train.seq_len, "128", 1, LLAMA_MAX_SEQ_LEN, "tokens", "training sequence length T"),
    KEY_INT("train", "micro_batch_size", train.micro_batch_size, "8", 1, LLAMA_MAX_MICRO_BATCH, "sequences",
            "sequences per microbatch on one DP rank"),
    KEY_INT("train", "global_batch_size", train.global_batch_size, "16", 1, LLAMA_MAX_GLOBAL_BATCH, "sequences",
            "sequences per optimizer step over all DP ranks; a multiple of micro_batch_size * dp"),
    KEY_INT("train", "steps", train.steps, "1000", 1, INT_MAX, "steps", "optimizer steps to train"),
    KEY_FLOAT("train", "lr", train.lr, "0.0003", 0, NOMAX, CONFIG_MIN_EXCLUSIVE, "",
              "peak learning rate, reached after warmup"),
    KEY_FLOAT("train", "min_lr", train.min_lr, "3e-05", 0, NOMAX, 0, "",
              "learning rate at the end of the decay; <= lr"),
    KEY_INT("train", "warmup_steps", train.warmup_steps, "100", 0, INT_MAX, "steps",
            "linear warmup from 0 to lr; <= steps"),
    KEY_ENUM("train", "lr_schedule", train.lr_schedule, "cosine", schedule_choices,
             "decay from lr to min_lr after warmup"),
    KEY_FLOAT("train", "weight_decay", train.weight_decay, "0.1", 0, NOMAX, 0, "", "AdamW decoupled weight decay"),
    KEY_FLOAT("train", "beta1", train.beta1, "0.9", 0, 1, CONFIG_MAX_EXCLUSIVE, "", "AdamW first-moment decay"),
    KEY_FLOAT("train", "beta2", train.beta2, "0.95", 0, 1, CONFIG_MAX_EXCLUSIVE, "", "AdamW second-moment decay"),
    KEY_FLOAT("train", "adam_eps", train.adam_eps, "1e-08", 0, NOMAX, CONFIG_MIN_EXCLUSIVE, "", "AdamW epsilon"),
    KEY_FLOAT("train", "grad_clip", train.grad_clip, "1", 0, NOMAX, 0, "",
              "clip the global gradient norm to this; 0 disables"),
    KEY_FLOAT("train", "label_smoothing", train.label_smoothing, "0", 0, 1, CONFIG_MAX_EXCLUSIVE, "",
              "cross-entropy label smoothing"),
    KEY_ENUM("train", "loss_on", train.loss_on, "all", loss_on_choices,
             "targets with loss: all, or response (only tokens the shards' /loss_mask marks, "
             "trident prep --format chat; averaged over the global batch's marked tokens)"),
    KEY_INT64("train", "seed", train.seed, "1234", 0, NOMAX, "", "seed of weight init, data order and sampling"),
    KEY_INT("train", "eval_every", train.eval_every, "0", 0, INT_MAX, "steps",
            "steps between evaluations; 0 disables"),
    KEY_INT("train", "eval_steps", train.eval_steps, "10", 1, (1 << 20), "batches", "batches per evaluation"),
    KEY_INT("train", "sample_every", train.sample_every, "0", 0, INT_MAX, "steps",
            "steps between text samples; 0 disables"),
    KEY_INT("train", "sample_tokens", train.sample_tokens, "64", 1, LLAMA_MAX_SEQ_LEN, "tokens", "tokens per sample"),
    KEY_FLOAT("train", "sample_temperature", train.sample_temperature, "1", 0, NOMAX, 0, "",
              "sampling temperature; 0 is greedy"),
    KEY_INT("train", "sample_top_k", train.sample_top_k, "0", 0, INT_MAX, "tokens",
            "sample among the k most likely tokens; 0 uses the whole vocabulary"),
    KEY_FLOAT("train", "sample_top_p", train.sample_top_p, "1", 0, 1, CONFIG_MIN_EXCLUSIVE, "",
              "sample among the most likely tokens whose probability reaches p (nucleus sampling, "
              "after top-k); 1 uses every token"),
    KEY_INT("train", "exit_interval", train.exit_interval, "0", 0, INT_MAX, "steps",
            "stop (after saving a checkpoint) once the step count is a multiple of this, as "
            "Megatron-LM's --exit-interval; 0 runs to steps"),
    KEY_FLOAT("train", "exit_duration_mins", train.exit_duration_mins, "0", 0, NOMAX, 0, "minutes",
              "wall-clock budget of one `trident train` (from its start): when the next step would "
              "end past it (judged from the mean step time so far, agreed over the ranks), save a "
              "checkpoint and exit 3 as a preemption does; Megatron-LM's --exit-duration-in-mins; "
              "0 disables"),
    KEY_BOOL("train", "override_schedule", train.override_schedule, "false",
             "resume although steps, lr, min_lr, warmup_steps or lr_schedule differ from the "
             "checkpoint's (refused otherwise): the change is printed and the LR continues from "
             "the value it had at the resumed step, without a jump (docs/design.md §7, \"Resuming "
             "with another schedule\")"),
    KEY_INT("train", "max_skipped_steps", train.max_skipped_steps, "10", 1, INT_MAX, "steps",
            "a step whose loss or gradient norm is NaN or infinite is skipped (no update, the "
            "LR schedule held, its batch consumed); this many in a row stop the run with exit 1"),

    // [data]: HDF5 shards on tiered storage (docs/design.md §6)
    KEY_PATH("data", "path", data.path, "data/kjv-shards", 0, "dataset folder with index.ini and shards (cold tier)"),
    KEY_PATH("data", "paths", data.paths, "", CONFIG_OPTIONAL,
             "blend of datasets instead of path: path:weight, comma-separated (weights > 0, "
             "normalised); each sample comes from the dataset whose realised share lags its "
             "weight most (Megatron-LM's blend); all datasets share one tokenizer"),
    KEY_PATH("data", "tokenizer", data.tokenizer, "", CONFIG_OPTIONAL,
             "tokenizer.json of the dataset (its identity must match index.ini; checked before "
             "training), used to decode samples; unset: <path>/tokenizer.json when present"),
    KEY_PATH("data", "cache_dir", data.cache_dir, "", CONFIG_OPTIONAL,
             "hot-tier folder (local NVMe): node-local rank 0 stages shards from path into "
             "cache_dir/<index.ini hash>/ ahead of the loader; readers use a staged copy when "
             "there is one; unset: read from path"),
    KEY_SIZE("data", "cache_bytes", data.cache_bytes, "4G", 1, NOMAX,
             "hot-tier budget: bytes of shards one stager keeps in cache_dir, least recently "
             "used evicted first (with cache_dir)"),
    KEY_INT("data", "prefetch_shards", data.prefetch_shards, "2", 0, INT_MAX, "shards",
            "shards staged ahead of the one being read, in the order the next global batches "
            "need them; with the global shuffle, cover a few batches' shards (with cache_dir)"),
    KEY_ENUM("data", "packing", data.packing, "concat", packing_choices,
             "concat: documents joined by end-of-text into one stream cut into sequences, "
             "attending across document boundaries; concat_reset: the same sequences, but a "
             "document starts at each row's start and after each end-of-text input token, and "
             "a token attends only to its own document, at positions counted from its start "
             "(Megatron-LM's --reset-position-ids --reset-attention-mask; the loss is "
             "unchanged: the target after an end-of-text still counts), so every complete "
             "document computes as if alone; none (one padded document per row) is not "
             "offered: concat_reset gives the same per-document result without padding"),

    // [parallel]: the sizes of the grid's axes (parallel/axes_list.h; docs/design.md §2)
    KEY_INT("parallel", "tp", parallel.tp, "1", 1, LLAMA_MAX_PARALLEL, "ranks", "tensor-parallel size"),
    KEY_INT("parallel", "cp", parallel.cp, "1", 1, LLAMA_MAX_PARALLEL, "ranks",
            "context-parallel size: every sequence's seq_len tokens split over cp ranks (2 cp chunks, "
            "rank r holding chunks r and 2 cp - 1 - r: the same causal attention work on each), "
            "attention as a ring of key/value blocks over them; seq_len must be a multiple of 2 cp; "
            "the cp ranks of one data rank read the same sequences; gradients are reduced over dp x cp"),
    KEY_INT("parallel", "pp", parallel.pp, "1", 1, LLAMA_MAX_PARALLEL, "ranks", "pipeline-parallel size"),
    KEY_INT("parallel", "dp", parallel.dp, "0", 0, LLAMA_MAX_PARALLEL, "ranks",
            "data-parallel size; tp * cp * pp * dp = ranks; 0 infers it: ranks / (tp * cp * pp) (`trident "
            "plan`: its --world-size, else 1)"),
    KEY_INT("parallel", "dp_shard", parallel.dp_shard, "0", 0, LLAMA_MAX_PARALLEL, "ranks",
            "data-parallel ranks that zero_stage 2 and 3 shard over (hybrid sharding: groups of "
            "dp_shard consecutive data ranks, replicated dp / dp_shard = dp_replicate times, which "
            "is derived); must divide dp; 0: dp (one shard group); zero_stage 0 and 1 reduce over "
            "all of dp whatever it is"),
    KEY_INT("parallel", "ep", parallel.ep, "1", 1, LLAMA_MAX_PARALLEL, "ranks",
            "expert-parallel size: the MoE layers' routed experts split over ep data ranks "
            "(Megatron-Core's expert_model_parallel_size; consecutive data ranks), each token sent "
            "to its experts' ranks and back by all-to-all; must divide dp (and dp_shard when set) "
            "and moe_experts; dense layers and the router stay replicated over the data ranks; "
            "with zero_stage 1 the experts' optimizer state is sharded over the dp / ep ranks "
            "holding the same experts (zero_stage 2 and 3 refused)"),
    KEY_INT("parallel", "virtual_stages", parallel.virtual_stages, "1", 1, LLAMA_MAX_LAYERS, "",
            "model chunks per pipeline rank (interleaved schedule); 1 is plain 1F1B; zbv needs 2"),
    KEY_ENUM("parallel", "pp_schedule", parallel.pp_schedule, "1f1b", pp_schedule_choices,
             "pipeline schedule: 1f1b (interleaved when virtual_stages > 1), interleaved (needs "
             "virtual_stages > 1), zb-h1 (zero bubble, 1F1B's activation memory; backward split into "
             "input and weight gradients, W deferred into the bubble), zbv (zero bubble V: "
             "virtual_stages = 2, chunk 1 runs the stages back; Qi et al. 2024)"),
    KEY_BOOL("parallel", "sequence_parallel", parallel.sequence_parallel, "false",
             "shard norms and dropout-free regions along T over the TP group"),
    KEY_INT("parallel", "zero_stage", parallel.zero_stage, "0", 0, 3, "",
            "0: replicated optimizer state; 1: optimizer state sharded over DP (ZeRO-1); 2: "
            "gradients too, reduce-scattered per unit during the backward (ZeRO-2); 3: parameters "
            "too, all-gathered per unit before its forward and backward (ZeRO-3, FSDP)"),
    KEY_BOOL("parallel", "reshard_after_forward", parallel.reshard_after_forward, "true",
             "zero_stage 3: free a gathered unit after its forward and gather it again before its "
             "backward (2 gather buffers); false keeps every unit of the stage gathered until the "
             "step's backward ends"),
    KEY_INT("parallel", "bucket_mb", parallel.bucket_mb, "25", 1, INT_MAX, "MiB",
            "gradient all-reduce bucket size (zero_stage 0 only: ZeRO-1 reduce-scatters in its optimizer, ZeRO-2/3 per unit)"),

    // [precision] (docs/design.md §5)
    KEY_ENUM("precision", "dtype", precision.dtype, "fp32", dtype_choices,
             "weights and activations; master weights, moments, gradients and statistics stay fp32"),
    KEY_ENUM("precision", "grad_dtype", precision.grad_dtype, "fp32", grad_dtype_choices,
             "dtype of the data-parallel gradient reduction (bucketed all-reduce; ZeRO-1 "
             "reduce-scatter; ZeRO-2/3's per-unit reduce-scatters and hybrid sharding's all-reduce "
             "across replicas): bf16 rounds the fp32 gradients for the transfer, sums each pair "
             "in fp32 rounded once, and widens the result back into the fp32 gradients"),
    {.section = "precision", .key = "loss_scale", .type = CONFIG_ENUM, .def = "dynamic", .min = 0,
     .max = NOMAX, .flags = CONFIG_MIN_EXCLUSIVE, .unit = "",
     .doc = "fp16 loss scale: dynamic (back off on inf/NaN, grow after good steps) or a fixed number; bf16 and fp32 use none",
     .offset = F(precision.loss_scale_mode), .choices = loss_scale_choices, .has_alt = 1,
     .alt_type = CONFIG_FLOAT, .alt_offset = F(precision.loss_scale), .alt_value = LOSS_SCALE_STATIC},
    KEY_FLOAT("precision", "loss_scale_initial", precision.loss_scale_initial, "4294967296", 0, NOMAX,
              CONFIG_MIN_EXCLUSIVE, "", "fp16, loss_scale = dynamic: the scale of the first step "
              "(Megatron-LM's 2^32; overflowing steps halve it until it settles)"),
    KEY_FLOAT("precision", "loss_scale_min", precision.loss_scale_min, "1", 0, NOMAX,
              CONFIG_MIN_EXCLUSIVE, "", "fp16, dynamic: the scale never backs off below this; an "
              "overflow at this scale counts toward [train] max_skipped_steps"),
    KEY_FLOAT("precision", "loss_scale_backoff", precision.loss_scale_backoff, "0.5", 0, 1,
              CONFIG_MIN_EXCLUSIVE, "", "fp16, dynamic: the scale is multiplied by this on a step "
              "whose gradients hold an inf or NaN (the step is skipped)"),
    KEY_FLOAT("precision", "loss_scale_growth", precision.loss_scale_growth, "2", 1, NOMAX, 0, "",
              "fp16, dynamic: the scale is multiplied by this after loss_scale_growth_interval "
              "applied steps in a row"),
    KEY_INT("precision", "loss_scale_growth_interval", precision.loss_scale_growth_interval, "1000",
            1, INT_MAX, "steps", "fp16, dynamic: applied steps without an overflow before the "
            "scale grows"),
    KEY_ENUM("precision", "fp8", precision.fp8, "none", fp8_choices,
             "with dtype = bf16, the GEMMs of every block's linear layers (q, k, v, o, gate, up, "
             "down) take FP8 operands: hybrid: activations and weights E4M3, output gradients E5M2 "
             "(Transformer Engine's default); e4m3: E4M3 everywhere; embeddings, LM head, norms, "
             "attention and the optimizer stay as they are"),
    KEY_ENUM("precision", "fp8_scaling", precision.fp8_scaling, "delayed", fp8_scaling_choices,
             "fp8: current: each tensor's scale from its amax measured just before its cast; "
             "delayed: from the amax history of earlier steps (Transformer Engine's DelayedScaling)"),
    KEY_INT("precision", "fp8_amax_history_len", precision.fp8_amax_history_len, "1", 1,
            1048576, "steps", "fp8_scaling = delayed: amaxes kept per tensor (Megatron-LM's default "
            "1; Transformer Engine's is 1024)"),
    KEY_ENUM("precision", "fp8_amax_compute", precision.fp8_amax_compute, "most_recent",
             fp8_amax_compute_choices,
             "fp8_scaling = delayed: the amax a scale is computed from: the history's max or its "
             "most recent entry (Megatron-LM's default most_recent; Transformer Engine's is max)"),
    KEY_INT("precision", "fp8_margin", precision.fp8_margin, "0", 0, 32, "",
            "fp8: scale = (FP8 max / amax) / 2^margin"),
    {.section = "precision", .key = "fp8_skip_layers", .type = CONFIG_ENUM, .def = "none", .min = 1,
     .max = LLAMA_MAX_LAYERS, .unit = "",
     .doc = "fp8: blocks whose linear layers stay bf16 (Megatron-LM's --first-last-layers-bf16): none, "
            "first, last, first,last (the first and the last block), or a count N (the first N and the "
            "last N blocks)",
     .offset = F(precision.fp8_skip_layers), .choices = fp8_skip_choices, .has_alt = 1,
     .alt_type = CONFIG_FLOAT, .alt_offset = F(precision.fp8_skip_count), .alt_value = FP8_SKIP_COUNT},

    // [checkpoint] (docs/design.md §7)
    KEY_PATH("checkpoint", "dir", checkpoint.dir, "", CONFIG_OPTIONAL,
             "folder of step-NNNNNN/ checkpoints (warm tier); unset: <run_dir>/checkpoints; none: "
             "no checkpoints are written and resume = auto starts fresh"),
    KEY_INT("checkpoint", "every", checkpoint.every, "0", 0, INT_MAX, "steps",
            "steps between checkpoints; 0 disables periodic checkpoints (the end, exit_interval and "
            "a stop still save)"),
    KEY_INT("checkpoint", "keep_last", checkpoint.keep_last, "3", 0, INT_MAX, "checkpoints",
            "checkpoints kept; older ones are deleted; 0 keeps all"),
    KEY_BOOL("checkpoint", "async", checkpoint.async, "false",
             "a periodic save snapshots this rank's pieces into host memory and a background "
             "thread writes, fsyncs and checksums them while training goes on; the commit "
             "(manifest, latest) follows at a later step boundary once every rank's writer is "
             "done (docs/design.md §7)"),
    {.section = "checkpoint", .key = "resume", .type = CONFIG_ENUM, .def = "auto", .min = NOMIN,
     .max = NOMAX, .unit = "",
     .doc = "auto: from dir/latest when present; none: start fresh; else a checkpoint folder",
     .offset = F(checkpoint.resume), .choices = resume_choices, .has_alt = 1, .alt_type = CONFIG_PATH,
     .alt_offset = F(checkpoint.resume_path), .alt_value = RESUME_PATH},

    KEY_BOOL("checkpoint", "branch", checkpoint.branch, "false",
             "resuming from a step before dir's latest (a branch): false refuses it at start (exit "
             "2); true moves the later steps and latest aside into dir/branched-after-step-N-<time>/ "
             "and continues (docs/design.md §7)"),

    // [log] (docs/design.md §9)
    KEY_INT("log", "every", log.every, "10", 1, INT_MAX, "steps", "steps between log lines"),
    KEY_PATH("log", "metrics_file", log.metrics_file, "", CONFIG_OPTIONAL,
             "JSON-lines metrics, kept across resumes (docs/design.md §9); unset: <run_dir>/metrics.jsonl"),
    KEY_PATH("log", "run_dir", log.run_dir, "runs/default", 0,
             "folder for train.log, metrics.jsonl, config.ini, each start's config-<step>.ini and TensorBoard event files"),
    KEY_BOOL("log", "tensorboard", log.tensorboard, "true",
             "TensorBoard event files (events.out.tfevents.*) in run_dir: the scalars of every log "
             "line and evaluation, Megatron-LM's tag names (docs/design.md §9)"),
    KEY_PATH("log", "prometheus_file", log.prometheus_file, "", CONFIG_OPTIONAL,
             "node_exporter textfile-collector file (name it *.prom) rewritten atomically at every "
             "log line by rank 0: step, loss, tokens/s, MFU, memory, checkpoint age, step time "
             "(docs/design.md §9); unset: none"),

    // [system]
    KEY_ENUM("system", "device", system.device, "cpu", device_choices, "compute backend"),
    KEY_ENUM("system", "attention", system.attention, "auto", attention_choices,
             "cuda, bf16/fp16: auto uses cuDNN's fused attention where cuDNN supports the shape, else "
             "the native kernels; cudnn demands it (an error otherwise); native never uses it; fp32 and "
             "cpu: native"),
    KEY_INT("system", "threads", system.threads, "0", 0, INT_MAX, "threads",
            "OpenMP threads per rank; 0: this rank's CPU affinity when narrower than the node, else "
            "SLURM_CPUS_PER_TASK, else the node's cores / its ranks (docs/design.md §2)"),
    KEY_FLOAT("system", "peak_tflops", system.peak_tflops, "0", 0, NOMAX, 0, "TFLOP/s",
              "peak rate for MFU; 0 measures a GEMM at start"),
    KEY_FLOAT("system", "watchdog_s", system.watchdog_s, "300", 0, NOMAX, 0, "s",
              "end the job (exit 1, naming the rank) when a rank makes no progress (a start-up phase, "
              "a tensor of a checkpoint read, a step, an evaluation batch, a sampled token, a save) "
              "for this long (x an allowance in long phases: docs/design.md §8); 0 disables"),
    KEY_BOOL("system", "share_devices", system.share_devices, "false",
             "cuda: when two ranks of a node would use one CUDA device (more ranks than devices; "
             "devices told apart by PCI bus id), let them share round-robin (device = node-local rank "
             "mod devices: slower, and NCCL before 2.30 refuses two ranks of one group on one GPU); "
             "false refuses such a launch (exit 2) instead of sharing silently (docs/design.md §2)"),
};

const int config_n_keys = (int)(sizeof config_keys / sizeof config_keys[0]);

// Megatron-LM's arguments (megatron/training/arguments.py and the config
// dataclasses it builds flags from: TransformerConfig, TrainingConfig, ...;
// checked against its main branch of 2026-08) and llm.c's train_gpt2.cu flags
// whose meaning is that of a trident key, for config.c's unknown-key
// messages. Names trident shares (lr, min_lr, seed, weight_decay, adam_eps,
// micro_batch_size, global_batch_size, sequence_parallel, zero_stage,
// moe_aux_loss_coeff, moe_z_loss_coeff, fp8_margin, fp8_amax_history_len, ...)
// are left out: the edit-distance suggestion finds them in their section.
#define MEG(name_, target_, note_) {.name = name_, .flag = NULL, .target = target_, .note = note_}
#define LLMC(name_, flag_, target_, note_) {.name = name_, .flag = flag_, .target = target_, .note = note_}
const struct config_alias config_aliases[] = {
    // [model]
    MEG("num_layers", "model.n_layers", NULL),
    MEG("hidden_size", "model.d_model", NULL),
    MEG("ffn_hidden_size", "model.ffn_dim", NULL),
    MEG("num_attention_heads", "model.n_heads", NULL),
    MEG("num_query_groups", "model.n_kv_heads", NULL),
    MEG("group_query_attention", NULL,
        "grouped-query attention is on whenever model.n_kv_heads < model.n_heads"),
    MEG("kv_channels", "model.head_dim", NULL),
    MEG("max_position_embeddings", "model.max_seq_len", NULL),
    MEG("rotary_base", "model.rope_theta", NULL),
    MEG("use_rope_scaling", "model.rope_scaling = llama3", NULL),
    MEG("norm_epsilon", "model.norm_eps", NULL),
    MEG("init_method_std", "model.init_std", NULL),
    MEG("untie_embeddings_and_output_weights", "model.tie_embeddings = false", NULL),
    MEG("qk_layernorm", "model.qk_norm", NULL),
    MEG("add_qkv_bias", "model.qkv_bias", NULL),
    MEG("recompute_granularity", "model.recompute", NULL),
    MEG("num_experts", "model.moe_experts", NULL),
    MEG("moe_router_topk", "model.moe_top_k", NULL),
    MEG("moe_ffn_hidden_size", "model.moe_ffn_dim", NULL),
    MEG("moe_shared_expert_intermediate_size", "model.moe_shared_ffn_dim",
        "with model.moe_shared_experts = 1"),
    MEG("moe_shared_expert_gate", "model.moe_shared_gate", NULL),
    MEG("moe_expert_capacity_factor", "model.moe_capacity_factor", "0 is dropless, Megatron-LM's unset"),
    MEG("moe_router_load_balancing_type", NULL,
        "the one load-balancing loss is model.moe_aux_loss_coeff's, 0 turns it off"),
    MEG("finetune", "model.init_from = CHECKPOINT",
        "a fresh run from its weights: step 0, a new optimizer"),
    // [train]
    MEG("seq_length", "train.seq_len", NULL),
    MEG("train_iters", "train.steps", NULL),
    MEG("lr_warmup_iters", "train.warmup_steps", NULL),
    MEG("lr_decay_style", "train.lr_schedule", NULL),
    MEG("clip_grad", "train.grad_clip", NULL),
    MEG("adam_beta1", "train.beta1", NULL),
    MEG("adam_beta2", "train.beta2", NULL),
    MEG("eval_interval", "train.eval_every", NULL),
    MEG("eval_iters", "train.eval_steps", NULL),
    MEG("exit_duration_in_mins", "train.exit_duration_mins", NULL),
    MEG("override_opt_param_scheduler", "train.override_schedule = true", NULL),
    // [data]
    MEG("data_path", "data.path", "a folder of `trident prep` shards; a weighted blend is data.paths"),
    MEG("reset_position_ids", "data.packing = concat_reset",
        "which also resets the attention mask, as --reset-attention-mask"),
    MEG("reset_attention_mask", "data.packing = concat_reset",
        "which also resets the position ids, as --reset-position-ids"),
    // [parallel]
    MEG("tensor_model_parallel_size", "parallel.tp", NULL),
    MEG("pipeline_model_parallel_size", "parallel.pp", NULL),
    MEG("context_parallel_size", "parallel.cp", NULL),
    MEG("expert_model_parallel_size", "parallel.ep", NULL),
    MEG("num_virtual_stages_per_pipeline_rank", "parallel.virtual_stages", NULL),
    MEG("num_layers_per_virtual_pipeline_stage", "parallel.virtual_stages",
        "counted in model chunks per pipeline rank: n_layers / (pp x layers per chunk)"),
    MEG("use_distributed_optimizer", "parallel.zero_stage = 1", NULL),
    // [precision]
    MEG("bf16", "precision.dtype = bf16", NULL),
    MEG("fp16", "precision.dtype = fp16", NULL),
    MEG("grad_reduce_in_bf16", "precision.grad_dtype = bf16", NULL),
    MEG("fp8_format", "precision.fp8", NULL),
    MEG("fp8_recipe", "precision.fp8_scaling", "delayed is delayed, tensorwise is current"),
    MEG("fp8_amax_compute_algo", "precision.fp8_amax_compute", NULL),
    MEG("first_last_layers_bf16", "precision.fp8_skip_layers",
        "first,last, or a count N: N blocks at each end"),
    MEG("num_layers_at_start_in_bf16", "precision.fp8_skip_layers = N", "N blocks at each end"),
    MEG("num_layers_at_end_in_bf16", "precision.fp8_skip_layers = N", "N blocks at each end"),
    MEG("initial_loss_scale", "precision.loss_scale_initial", NULL),
    MEG("min_loss_scale", "precision.loss_scale_min", NULL),
    MEG("loss_scale_window", "precision.loss_scale_growth_interval", NULL),
    // [checkpoint]
    MEG("save", "checkpoint.dir", NULL),
    MEG("load", "checkpoint.dir",
        "resume = auto, the default, continues from its latest; checkpoint.resume = FOLDER reads one "
        "step-N folder"),
    MEG("save_interval", "checkpoint.every", NULL),
    MEG("async_save", "checkpoint.async", NULL),
    // [log]
    MEG("log_interval", "log.every", NULL),
    MEG("tensorboard_dir", "log.run_dir",
        "its TensorBoard event files; log.tensorboard = false turns them off"),
    // llm.c (train_gpt2.cu's usage text)
    LLMC("B", "-b", "train.micro_batch_size", NULL),
    LLMC("T", "-t", "train.seq_len", NULL),
    LLMC("total_batch_size", "-d", "train.global_batch_size", "counted in sequences: tokens / seq_len"),
    LLMC("max_steps", "-x", "train.steps", NULL),
    LLMC("learning_rate", "-l", "train.lr", NULL),
    LLMC("warmup_iterations", "-u", "train.warmup_steps", NULL),
    LLMC("final_learning_rate_frac", "-q", "train.min_lr", "a rate: lr x the fraction"),
    LLMC("lr_scheduler_type", "-k", "train.lr_schedule", NULL),
    LLMC("val_loss_every", "-v", "train.eval_every", NULL),
    LLMC("val_max_steps", "-m", "train.eval_steps", NULL),
    LLMC("genT", "-g", "train.sample_tokens", NULL),
    LLMC("train_data_pattern", "-i", "data.path", "a folder of `trident prep` shards"),
    LLMC("val_data_pattern", "-j", NULL,
         "the validation split is in data.path's folder (`trident prep --val-fraction`)"),
    LLMC("checkpoint_every", "-n", "checkpoint.every", NULL),
    LLMC("checkpoints_keep", "-nk", "checkpoint.keep_last", NULL),
    LLMC("output_log_dir", "-o", "log.run_dir", NULL),
};
#undef MEG
#undef LLMC

const int config_n_aliases = (int)(sizeof config_aliases / sizeof config_aliases[0]);

_Static_assert(sizeof config_keys / sizeof config_keys[0] <= CONFIG_MAX_KEYS,
               "raise CONFIG_MAX_KEYS in config.h");
// The parser stores enums through an int *.
_Static_assert(sizeof(enum dtype) == sizeof(int) && sizeof(enum recompute) == sizeof(int) &&
                   sizeof(enum attention_impl) == sizeof(int),
               "enums must be int-sized");
