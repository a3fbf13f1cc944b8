// model.h: the LLaMA-style decoder of docs/design.md §4 for one pipeline stage and
// one tensor-parallel shard, written once against kernels/ops.h.
//
// Math and parameter names match Hugging Face LlamaForCausalLM
// (transformers/models/llama/modeling_llama.py; with llama_config's options
// Qwen2ForCausalLM's q/k/v biases and Qwen3ForCausalLM's q/k norms and
// head_dim, docs/design.md §4): token embedding, L blocks of
// x = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),
// n1 = input_layernorm(x); x = x + down_proj(silu(gate_proj(n2)) * up_proj(n2)),
// n2 = post_attention_layernorm(x); final norm; lm_head (or the embedding
// when tied); cross-entropy over the next-token targets.
//
// Tensor parallel (Megatron-LM, Shoeybi et al. 2019, §3): q/k/v and gate/up
// are column-parallel (rows of the HF weight split over tp), o/down are
// row-parallel (columns split), embedding and lm_head are vocab-parallel.
// tp = 1 and a single stage are the special case of the same code.
#ifndef TRIDENT_MODEL_H
#define TRIDENT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/common.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/pipeline.h"

// Upper bounds of the model's and the layout's integers, wherever they are
// read (the config's key table, a checkpoint's manifest.ini): products the
// code forms in int fit (vocab_size + 1 and the tensor-parallel padding;
// micro_batch_size * seq_len <= 2^30 tokens; tp * pp * dp <= 2^30 ranks),
// and a hostile n_layers does not make naming the parameters run for hours
// (issue 18). Far above any model trained on CPUs or a GPU cluster.
#define LLAMA_MAX_VOCAB (1 << 24)
#define LLAMA_MAX_D_MODEL (1 << 16)
#define LLAMA_MAX_LAYERS (1 << 12)
#define LLAMA_MAX_HEADS (1 << 12)
#define LLAMA_MAX_HEAD_DIM (1 << 12)
#define LLAMA_MAX_FFN (1 << 20)
#define LLAMA_MAX_SEQ_LEN (1 << 20)
#define LLAMA_MAX_MICRO_BATCH (1 << 10)
#define LLAMA_MAX_GLOBAL_BATCH (1 << 24)
#define LLAMA_MAX_PARALLEL (1 << 10) // tp, pp, dp each

// The groups of this rank that the model and the optimizer communicate over,
// handed over as one value (model_set_groups, optimizer_init; the trainer
// fills it from the grid's groups, parallel/topology.h). NULL members (or a
// NULL struct) are groups of one rank. tp, pp, dp take backend buffers
// (gradients, parameters, activations: device memory under CUDA, where they
// are NCCL groups); host_tp, host_pp, host_dp are the same ranks' groups over
// host memory (the scalars: the norm's sum of squares, loss sums, target
// counts; the FP64 logits), NULL when tp, pp, dp take host buffers too (the
// CPU backend's MPI groups). dp is the gradient group (every data-parallel
// rank, times the context-parallel ranks: data x context); dp_shard and
// dp_replicate split it (parallel.dp_shard: dp = dp_shard x dp_replicate,
// shard faster in rank order; dp_shard includes the context ranks): the
// optimizer-shard group of hybrid sharding, and the group of ranks holding
// the same shard. cp is the ring of context parallelism (the attention's
// key/value blocks; model_shard.cp_size ranks).
struct parallel_groups {
    struct comm_group *tp, *pp, *dp;
    int zero_stage;       // 0: every DP rank holds all moments; 1: ZeRO-1; 2: ZeRO-2 (the
                          // trainer reduce-scatters per unit into optimizer_grad_shard);
                          // 3: ZeRO-3 (parameters too: optimizer_param_shard)
    struct comm_group *host_tp, *host_pp, *host_dp;
    struct comm_group *dp_shard, *dp_replicate;
    struct comm_group *host_dp_shard, *host_dp_replicate;
    struct comm_group *cp, *host_cp;
    struct comm_group *ep, *host_ep, *expert_dp, *host_expert_dp;
};

// The group of g's ranks that takes host buffers: host, else g (see
// struct parallel_groups).
static inline struct comm_group *parallel_host_group(struct comm_group *g,
                                                     struct comm_group *host) {
    return host ? host : g;
}

// RoPE frequency scaling: struct rope_scaling (kernels/ops.h, which fills the tables).

// Global model hyperparameters ([model] in the config).
struct llama_config {
    int vocab_size;      // V: real classes
    int d_model;         // C
    int n_layers;        // L
    int n_heads;         // H
    int n_kv_heads;      // Hkv, divides H
    int ffn_dim;         // F
    int max_seq_len;     // rows of the RoPE tables
    double rope_theta;   // RoPE base
    struct rope_scaling rope_scaling; // zero: plain RoPE
    int head_dim;        // D; 0: d_model / n_heads (HF head_dim; Qwen3 sets D H != C)
    bool qkv_bias;       // q, k, v projections have biases (Qwen2: Hl D + 2 Hkvl D per TP
                         // shard, sharded like the weights' rows)
    bool qk_norm;        // Qwen3: RMSNorm (weight (D,), norm_eps) over each head's q and k
                         // before RoPE; the weights are replicated over TP
    float norm_eps;      // RMSNorm epsilon
    bool tie_embeddings; // lm_head shares model.embed_tokens.weight
    float init_std;      // std of the normal init of every matrix
    float label_smoothing;
    // Mixture of experts ([model] moe_*; src/model/moe.h): moe_experts 0 is a
    // dense model. Blocks moe_first_dense_layers.. hold, instead of the dense
    // MLP, mlp.gate.weight (E, C), the stacked experts mlp.experts.gate_proj.weight
    // and up_proj (E moe_ffn_dim, C), down_proj (E C, moe_ffn_dim) (expert e's
    // rows e F.. of each), and with a shared expert mlp.shared_expert.{gate,up,
    // down}_proj.weight (Fs, C), (Fs, C), (C, Fs) and mlp.shared_expert_gate.weight
    // (1, C): Qwen2-MoE's names (hf.c maps Mixtral's block_sparse_moe.*).
    int moe_experts, moe_top_k, moe_ffn_dim; // moe_ffn_dim 0: ffn_dim
    int moe_shared_experts, moe_shared_ffn_dim; // 0 or 1; width 0: moe_ffn_dim
    bool moe_shared_gate, moe_norm_topk;
    double moe_capacity_factor, moe_aux_loss_coeff, moe_z_loss_coeff;
    int moe_first_dense_layers;
};

// Whether global layer l of cfg is a mixture-of-experts block.
static inline bool llama_layer_moe(const struct llama_config *cfg, int l) {
    return cfg->moe_experts > 0 && l >= cfg->moe_first_dense_layers;
}
// Each routed expert's SwiGLU width, and the shared expert's (0: none).
static inline int llama_moe_ffn(const struct llama_config *cfg) {
    return cfg->moe_ffn_dim ? cfg->moe_ffn_dim : cfg->ffn_dim;
}
static inline int llama_moe_shared_ffn(const struct llama_config *cfg) {
    if (!cfg->moe_shared_experts) return 0;
    return cfg->moe_shared_ffn_dim ? cfg->moe_shared_ffn_dim : llama_moe_ffn(cfg);
}

// The MoE layer (moe.h) of cfg's MoE blocks: widths from the moe_* fields
// (shared_gate only with a shared expert), its coefficients.
struct moe_config;
void model_moe_config(const struct llama_config *cfg, struct moe_config *out);

// The head size D of cfg: head_dim, or d_model / n_heads when it is 0.
static inline int llama_head_dim(const struct llama_config *cfg) {
    return cfg->head_dim ? cfg->head_dim : cfg->d_model / (cfg->n_heads > 0 ? cfg->n_heads : 1);
}

enum { MODEL_MAX_CHUNKS = 8 };

// What a block keeps for its backward pass ([model] recompute; docs/design.md §5).
// NONE: every intermediate. SELECTIVE (Korthikanti et al. 2022, §5): not the
// cheap, memory-heavy ones (the norm outputs, RoPE'd q and k, the SwiGLU
// product), which the backward pass recomputes from what is kept. FULL (Chen
// et al. 2016): only each block's input; the backward pass re-runs the
// block's forward, collectives included, before its backward. The results
// are bit-identical in every mode and dtype: a recomputation repeats the
// same ops on the same stored (in 16 bits: rounded) inputs, and an op run in
// place only under recompute (ce_backward over the logits) gives the bits of
// separate buffers.
enum recompute { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL };

// A target id that adds no loss and no gradient (Hugging Face's and PyTorch's
// ignore_index): padding, prompt tokens, positions without a next token.
enum { IGNORE_INDEX = -100 };

// Which part of the model this rank holds.
struct model_shard {
    int n_chunks;               // model chunks (virtual pipeline stages) on this rank
    int layer_begin[MODEL_MAX_CHUNKS], layer_end[MODEL_MAX_CHUNKS]; // layers of each chunk
    int n_slots;                // activation slots: microbatches in flight (0 or 1: one)
    int tp_rank, tp_size;       // tensor-parallel position
    int cp_rank, cp_size;       // context-parallel position (cp_size 0 or 1: none): the
                                // rank keeps chunks cp_rank and 2 cp - 1 - cp_rank of the
                                // 2 cp chunks of every sequence (docs/design.md §4)
    int arena_multiple;         // pad the parameter arena to a multiple of this many
                                // elements (ZeRO-1 shards it evenly); 0: no padding
    int unit_multiple;          // ZeRO-2/3: pad each unit's range of the arenas (model_units)
                                // to a multiple of this many elements; 0: no padding
    bool no_param_arena;        // ZeRO-3: no parameter arena; each unit's parameters live
                                // where model_unit_bind points them (the trainer's buffers)
    bool no_grad_arena;         // ZeRO-2/3: no gradient arena; likewise for the gradients
    enum pp_schedule schedule;  // the pipeline's (model_shard_pipeline): where each chunk's
                                // neighbours live (generation's stage messages)
    bool split_backward;        // zero-bubble schedules (pipeline.h): n_wstash W stashes
                                // keep what a deferred W reads (model_backward_chunk_input;
                                // model_memory.w_stash_bytes); a slot is free after B
    int n_wstash;               // split_backward: W stashes (pipeline_max_w_pending; < 1
                                // means 1); 0 (forced) without it
    int ep_rank, ep_size;       // expert-parallel position (ep_size 0 or 1: none): the rank
                                // holds routed experts [ep_rank E / ep, (ep_rank + 1) E / ep)
                                // of every MoE block (param_info.expert)
    bool sequence_parallel;     // Korthikanti et al. 2022: norms and residuals hold
                                // N / tp rows; all-gather / reduce-scatter over TP
    enum recompute recompute;   // what the activation slots keep
};

// The single-rank shard: every layer, tp = 1, one slot.
struct model_shard model_shard_full(const struct llama_config *cfg);
// Stage s of p with v chunks under schedule kind (Narayanan et al. 2021 §2.2;
// ZB-V: Qi et al. 2024 §6): chunk c is virtual stage u =
// pipeline_virtual_stage(kind, p, s, c) (c p + s; ZB-V: s and 2 p - 1 - s)
// and holds layers [u L / (p v), (u + 1) L / (p v)); split_backward set for
// the split schedules. tp = 1 and one slot: the caller sets tp_rank, tp_size
// and n_slots.
struct model_shard model_shard_pipeline(const struct llama_config *cfg, enum pp_schedule kind,
                                        int p, int s, int v);

// One parameter tensor of this rank, in the parameter arena. Its local block
// (rows, cols) sits at (row_offset, col_offset) of the global (grows, gcols).
struct param_info {
    char name[96];           // Hugging Face name, e.g. "model.layers.0.mlp.up_proj.weight"
    int rows, cols;          // local shape (cols = 1 for vectors)
    int grows, gcols;        // global shape
    int row_offset, col_offset;
    int valid_rows;          // local rows that exist globally (vocab padding excluded)
    size_t offset;           // element offset in the parameter and gradient arenas
    size_t numel;            // rows * cols
    bool decay;              // weight decay applies (matrices, not norm gains)
    bool tp_replicated;      // the same on every TP rank (norm gains, the MoE layer's tensors)
    bool kv_shared;          // a key/value head copied on several TP ranks (tp > n_kv_heads)
    bool norm_skip;          // another rank counts this tensor in the global gradient norm
    bool tp_sum_grad;        // replicated over TP with a partial gradient on each TP rank
                             // (qk_norm's q_norm, k_norm: each rank sees its heads), summed
                             // over TP by model_finish_grads in every layout
    bool tp_whole_grad;      // tp_replicated with its whole gradient on every TP rank, also
                             // under sequence parallelism (the MoE layer's tensors: each TP
                             // rank runs the layer on all N rows): never summed over TP
    float init_std;          // 0: initialised to ones (norm gains)
    bool init_zero;          // initialised to zeros (biases, as HF's _init_weights)
    bool expert;             // a routed-expert tensor (E_l = E / ep experts stacked; rows split
                             // over ep): gradients summed over parallel_groups.expert_dp, not
                             // dp; its norm share summed over ep
};

// Sizes in bytes of every pool, from the config and layout alone (no
// allocation): what model_init allocates, and what `trident plan` prints.
struct model_memory {
    size_t param_bytes;      // weights in the model dtype
    size_t grad_bytes;       // gradients (fp32, fp64 for an fp64 model); with split_backward
                             // on a rank holding the embedding's pass and a tied head (ZB-V's
                             // stage 0) also a (Vl, C) buffer for the head's share
                             // (model_finish_grads), after the arena's n_params (aligned)
    size_t activation_bytes; // n_slots saved-activation slots, n_wstash W stashes (split only)
                             // + backward scratch for (B, T)
    size_t slot_bytes;       // one slot: the activations one microbatch keeps in flight
    size_t recompute_bytes;  // of the scratch: what the blocks recompute (0 for none)
    size_t w_stash_bytes;    // of activation_bytes (not of slot_bytes): the n_wstash W
                             // stashes (shard.split_backward; 0 otherwise), each holding
                             // every operand a deferred W reads (B frees the slot). Per
                             // block of the largest chunk, in the model dtype, each piece
                             // padded to 256 bytes: the weight GEMMs' output gradients,
                             // d x[i+1] and d xmid (Ns, C), dgate and dup (N, Fl), dq (N,
                             // Hl D), dk, dv (N, Hkvl D); their inputs act (N, Fl), att (N,
                             // Hl D), ln1 and ln2 (Ns, C) (sequence parallelism: this rank's
                             // rows, which W all-gathers again). The head: dlogits (N, Vl)
                             // and the final norm's output (Ns, C). The same in every
                             // recompute mode. Without a
                             // gradient arena (ZeRO-2/3) also, in the gradient dtype, B's
                             // gradients of each block's vectors (ln1, ln2 (C), biases,
                             // qk_norm gains) and the final norm's (C). N = B T / cp.
    size_t cp_bytes;         // of the scratch: the context-parallel ring's two travelling
                             // buffers and position table (0 at cp = 1; model.c acts_layout)
    size_t moe_bytes;        // of activation_bytes: the MoE blocks' saved routing and expert
                             // activations (moe_activation_bytes per MoE block of each slot)
                             // and their one shared scratch (moe_scratch_bytes); 0 when dense
    size_t n_params;         // elements of this rank's parameters
    size_t n_expert_params;  // of n_params: the routed-expert tensors' (param_info.expert: gate,
                             // up (El Fe, C), down (El C, Fe) of each MoE block, El = E / ep),
                             // each padded to 128 elements as the arena places them (not a
                             // unit's or the arena's padding after the last); 0 when dense
    int n_units;             // units of this rank (model_units)
    size_t max_unit_numel;   // elements of its largest unit (padding included)
    size_t tied_embed_numel; // elements of the embedding unit when the head reads it (a tied
                             // embedding on the last stage); else 0
};

struct model;

// The parameter table of the whole model (model_shard_full: every layer,
// tp = 1, global shapes) without allocating a model: the tensors a
// checkpoint of cfg holds. *out: (*n,) xmalloc'd, the caller frees it.
// Errors: STATUS_BAD_INPUT as model_plan (shapes that do not divide).
enum status model_param_table(const struct llama_config *cfg, struct param_info **out, int *n,
                              struct error *err);
// The same for the rank holding shard: the table model_params gives of a
// model model_init'ed with shard (local shapes and arena offsets, in arena
// order), without allocating it (`trident plan`'s ZeRO-1 ranges with expert
// parallelism, optimizer_plan_numel). *out: (*n,) xmalloc'd, the caller frees it.
// Errors: as model_plan.
enum status model_shard_param_table(const struct llama_config *cfg, const struct model_shard *shard,
                                    struct param_info **out, int *n, struct error *err);

// Training FLOPs per token of the whole model (every layer, every tensor-
// parallel shard; the same number in every layout), the numerator of MFU
// (docs/design.md §9): 6 x N_matmul + 6 x L x C x T, where N_matmul counts
// every matrix a token is multiplied by (q, k, v, o, gate, up, down of each
// block and the LM head V x C, tied or not; not the embedding lookup nor the
// norm gains nor the biases) and 6 L C T is the attention score and value
// matmuls, with C read as H D when head_dim is set (12 L C T,
// Kaplan et al. 2020 Table 1's 2 n_layer n_ctx d_attn forward, x3 for the
// backward) halved for the causal mask. Sources: Kaplan et al. 2020, §2.1;
// PaLM (Chowdhery et al. 2022) Appendix B ("6N + 12 L H Q T", here halved:
// the causal mask skips half the scores). Recomputation is not counted
// (model FLOPs, not hardware FLOPs). T: sequence length in tokens.
double model_flops_per_token(const struct llama_config *cfg, int T);

// Mixture of experts: what the training backward passes (model_backward_chunk)
// routed since the last take, summed over their microbatches, as doubles:
// [0] microbatches, [1] the load-balancing loss (transformers' over the
// model's MoE blocks, moe_aux_loss_layers), [2] the z-losses summed over
// blocks, [3] assignments dropped by the capacity, then (L, E) tokens
// routed to each expert of each of the model's L MoE blocks
// (model_moe_layers; top-k choices before the capacity). numel 0 for a
// dense model. Each rank counts its own blocks (zeros in the other rows),
// [0] and [1] on the last virtual stage (which has the whole model's
// routing: the pipeline's messages carry it), and only TP rank 0 counts
// (every TP rank runs the same MoE layers on the same rows): the sum over
// every rank is the model's, as on one rank. A backward with loss_scale 0
// (a pipeline's evaluation runs its backward so) counts nothing. Take
// reads and zeroes them.
size_t model_moe_stats_numel(const struct model *m);
void model_moe_stats_take(struct model *m, double *out);
// The routing the last forward of slot `slot` left for the rank's MoE block
// `block` (local index): out (N, k) I32 = each token's k experts in
// descending probability (moe_routing_view's topk_idx), for tests and logs.
// Not under recompute = full (the routing is then kept for no block: a
// CHECK).
void model_moe_topk(struct model *m, int slot, int block, int32_t *out);
// The model's MoE blocks, every stage's (their layer indices into *layers;
// may be NULL): the rows of model_moe_stats_take's routed counts.
int model_moe_layers(const struct model *m, const int **layers);

// Computes the parameter table and pool sizes without allocating.
// Errors: STATUS_BAD_INPUT when the shapes do not divide (H % Hkv, H % tp,
// head size odd, layer range outside [0, L)), head_dim outside [0,
// LLAMA_MAX_HEAD_DIM], or rope_scaling's numbers out of their ranges (struct
// rope_scaling).
enum status model_plan(const struct llama_config *cfg, const struct model_shard *shard,
                       enum dtype dtype, int B, int T, struct model_memory *out,
                       struct error *err);

// Allocates parameters, gradients and activations for microbatches of
// (B, T) tokens on backend be (under context parallelism, shard.cp_size >
// 1, T is the whole sequence and the rank holds B x T / cp of them:
// ring_attention.h) and initialises the weights (normal(0,
// init_std), output projections o_proj/down_proj scaled by 1/sqrt(2L), norm
// gains 1, qkv_bias's biases 0) from seed. The init of every element
// depends only on (seed, name, global index), so any layout initialises the
// same global model.
// dtype: DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16 (weights and activations in
// that dtype; gradients, saved statistics and the RoPE tables FP32; TP sums
// of activations in FP32), or DTYPE_FP64 (tests). Errors: as model_plan, and
// STATUS_RUNTIME when the backend is out of memory.
enum status model_init(struct model **out, struct backend *be, const struct llama_config *cfg,
                       const struct model_shard *shard, enum dtype dtype, int B, int T,
                       uint64_t seed, struct error *err);
void model_free(struct model *m);

// The parameter table of this rank (n entries), and the arenas.
const struct param_info *model_params(const struct model *m, int *n);
struct tensor model_param_arena(struct model *m); // (n_params,) model dtype
struct tensor model_grad_arena(struct model *m);  // (n_params,) fp32 / fp64
const struct model_memory *model_memory(const struct model *m);
struct backend *model_backend(const struct model *m); // the backend its arenas live on
bool model_is_last_stage(const struct model *m);
bool model_is_first_stage(const struct model *m); // holds the embedding's pass

// Finds a parameter by HF name; NULL when this rank does not hold it.
const struct param_info *model_find_param(const struct model *m, const char *name);
// Copies the global tensor `global` (grows, gcols) float32 host values into
// this rank's slice of parameter p.
void model_set_param(struct model *m, const struct param_info *p, const float *global);
// Copies this rank's slice of parameter p (or its gradient) to host as double,
// into `local` (rows * cols).
void model_get_param(struct model *m, const struct param_info *p, double *local);
void model_get_grad(struct model *m, const struct param_info *p, double *local);
// Copies src (any float dtype, backend memory of m's backend) to host as
// double (BF16/FP16 widened exactly). Not for the training loop: it may
// allocate backend staging memory.
void model_to_host_f64(struct model *m, struct tensor src, double *out);

// The groups of this rank (copied; the groups themselves must outlive m).
// Must be called before the first forward when tp > 1 (groups->tp: the
// shard's shard.tp_size ranks; NULL or one rank for tp = 1). The model
// all-reduces over groups->tp (Megatron's f and g operators) and gathers
// what it reduces in host memory (model_get_logits_at's FP64 logits) over
// parallel_host_group(tp, host_tp): under NCCL the TP group takes device
// buffers only. NULL groups: one rank.
void model_set_groups(struct model *m, const struct parallel_groups *groups);

// After the last microbatch's backward: sums over the TP group the partial
// gradients of tensors that several TP ranks hold: key/value heads copied
// when tp > n_kv_heads, and the norm gains under sequence parallelism (each
// rank saw only its rows). With split_backward on a rank that runs both the
// embedding's pass and a tied head's (ZB-V's stage 0), the head's share of
// the embedding's gradient accumulated apart (model_memory.grad_bytes) and
// is added now: dwte = embedding's + head's, the fp32 sum that 1F1B's
// all-reduce of its two copies (first and last stage) makes; the buffer is
// zeroed after. A no-op otherwise.
void model_finish_grads(struct model *m);

// The buffer of a tied head's share of the embedding's gradient (model_finish_grads):
// (Vl, C) in the gradient dtype on a split_backward rank running both passes
// (ZB-V's stage 0), else empty (numel 0). Data parallelism sums it over the DP
// group as it sums the arena (grad_sync.c), before model_finish_grads, so that
// the embedding's gradient is sum(E) + sum(H) as 1F1B's two stages make it.
struct tensor model_tied_head_grad(struct model *m);

// Zeroes the gradient arena (start of a global batch).
void model_zero_grad(struct model *m);

// Forward pass of one microbatch. tokens: (B, T) I32 host ids (first stage);
// targets: (B, T) I32 host next-token ids, IGNORE_INDEX = ignored (last stage).
// Returns in *loss_sum the sum of the per-token losses over non-ignored
// targets (last stage; 0 elsewhere) and in *n_targets their count.
// The activations stay saved for model_backward.
void model_forward(struct model *m, const int32_t *tokens, const int32_t *targets,
                   double *loss_sum, long *n_targets);

// Non-ignored targets among this rank's tokens of n_micro microbatches of
// whole sequences targets (n_micro, B, T) (the T of model_init): all of
// them, or under context parallelism those of this rank's two chunks, so
// that a sum over the gradient group (data x context) counts every target
// of the global batch once. Host memory.
int64_t model_count_targets(const struct model *m, const int32_t *targets, int n_micro);

// Backward pass of the microbatch last given to model_forward, accumulating
// (+=) into the gradient arena. loss_scale multiplies d(loss_sum): pass
// 1 / (non-ignored targets of the whole global batch) for a mean loss.
void model_backward(struct model *m, double loss_scale);

// Packed documents ([data] packing = concat_reset, Megatron-LM's
// --reset-position-ids --reset-attention-mask): eot >= 0 makes every later
// forward build doc_start (B, T) from its tokens on the host
// (doc_start_fill, kernels/ops.h: a document starts at t = 0 and after each
// input token eot), upload it into the microbatch's slot once, and run RoPE
// at positions t - doc_start and attention masked to each token's own
// document, forward, recomputation and backward alike; so every complete
// document of a row computes what it would alone at a row's start. The loss
// is not changed (the target after an eot is kept, as Megatron without
// --eod-mask-loss). Every chunk's forward then needs the tokens, not only the
// first's. eot < 0 (the default): plain causal, the kernels as before.
void model_set_doc_eot(struct model *m, int32_t eot);

// Pipeline-stage passes. Forward of model chunk `chunk` of one microbatch
// into activation slot `slot`: the first virtual stage reads tokens (B, T)
// I32 host ids (every chunk under model_set_doc_eot; under context
// parallelism whole sequences, of which the rank keeps its chunks, and the
// same for targets; Ns and N below count the rank's B T / cp rows), the others `in` (Ns,
// C) in the model dtype (the previous stage's output, Ns = B*T/tp under
// sequence parallelism, else B*T); the last virtual stage reads targets (B,
// T) and returns the loss sum and count (as model_forward), the others write
// `out` (Ns, C) (in and out of a MoE model: model_stage_message_numel
// elements, the routing's tail after the (Ns, C)). loss_sum NULL: the loss
// sum is not read back but added to a device accumulator (backend_sum_into)
// that model_loss_sum_take reads, so a step of many microbatches copies its
// loss back once; n_targets may be NULL.
void model_forward_chunk(struct model *m, int chunk, int slot, const int32_t *tokens,
                         const void *in, const int32_t *targets, void *out, double *loss_sum,
                         long *n_targets);
// The sum of the per-token losses (over non-ignored targets) of the forward
// passes given loss_sum = NULL since model_init or the last call, then resets
// it: one device-to-host copy, which waits for the backend's queued work
// (backend_to_host). 0 on a model without the last stage.
double model_loss_sum_take(struct model *m);
// Backward of that forward (same chunk and slot): dout (Ns, C) the gradient of
// the chunk's output (ignored on the last virtual stage, which starts from the
// loss times loss_scale); din (Ns, C) receives the gradient of its input
// (ignored on the first virtual stage); a MoE model's dout and din hold
// model_stage_message_numel elements, as the forward's messages, and its
// chunks before the last scale the MoE blocks' auxiliary losses by the last
// chunk's loss_scale (dout's tail), not their own. Accumulates into the
// gradient arena.
void model_backward_chunk(struct model *m, int chunk, int slot, double loss_scale,
                          const void *dout, void *din);
// The backward of model_backward_chunk split in two, for the zero-bubble
// schedules (Qi et al. 2024 §2; shard.split_backward): B, the input
// gradient, then W, the weight gradients, later. B takes the same arguments
// and fills din as model_backward_chunk does, with every gradient that is
// not a weight-gradient GEMM (norm gains, biases, the CE backward) computed
// in it; both operands of each weight-gradient GEMM (its output gradient
// and its input: model_memory.w_stash_bytes lists them) are copied into W
// stash wslot in [0, shard.n_wstash), so the activation slot is free when B
// returns (a forward may refill it before the W). W (model_backward_chunk_
// weight) reads only stash wslot, runs those GEMMs (the same calls, beta =
// 1, in the same order within the chunk) and frees the stash: the same
// GEMMs on copied bits. A B then W of every microbatch in order
// leaves the gradient arena bit-identical to model_backward_chunk's, in
// every dtype, recompute mode and under tp, sp and cp; so does any order in
// which, per chunk, the B's run in microbatch order and the W's too (B of
// microbatch k + 1 may come before W of k): each gradient tensor sees the
// same accumulations in the same order (a tensor is written by B or by W,
// never both; a tied head's dW on the embedding's rank goes apart:
// model_finish_grads). A stash's B then W must be of the same chunk; a W of
// a stash no B filled, or a B into a stash whose W has not run, aborts
// (CHECK), as does wslot outside [0, n_wstash). Unit events (enum
// model_unit_event): B reports BACKWARD / INPUT_DONE per unit, W WEIGHT /
// WEIGHT_DONE, and grads_ready fires in W where the fused pass fires it;
// the embedding, whose gradient is no GEMM, runs whole in B with
// BACKWARD / BACKWARD_DONE (its W reports grads_ready(0) only). Without a
// gradient arena (ZeRO-2/3, fsdp.h) the unit's non-GEMM gradients go through
// the stash so that its W's buffer holds the microbatch's whole gradient
// when WEIGHT_DONE reduce-scatters it. Not for FP8 blocks (CHECK).
void model_backward_chunk_input(struct model *m, int chunk, int slot, int wslot, double loss_scale,
                                const void *dout, void *din);
void model_backward_chunk_weight(struct model *m, int chunk, int wslot);
// Where in, out, dout and din of the chunk passes live: host memory (false,
// the default: the passes copy to and from the backend) or the backend's
// own memory (true: device-to-device copies; the pipeline's message buffers
// under NCCL, pipeline_exec.be).
void model_set_stage_messages_on_device(struct model *m, bool on_device);
// Elements of one activation message between stages: Ns * C, and for a
// mixture-of-experts model a tail of 2 E + 1 doubles (in as many elements
// as hold their bytes): the microbatch's routing summed over the MoE blocks
// before the stage (forward) or over all of them (backward), for the
// load-balancing loss over the model's blocks, and the backward's loss
// scale (model_pass.c).
size_t model_stage_message_numel(const struct model *m);
// High-water mark of activation slots used since model_init (1 + largest index).
int model_slots_used(const struct model *m);

// Gradient-ready hook: during model_backward, called with an element offset
// `ready_from` each time the gradients of parameter-arena elements
// [ready_from, n_params) are final for this backward pass (after the head,
// after each block, after the embedding: parameters are laid out in forward
// order and the backward runs in reverse). Data parallelism uses it to start
// the all-reduce of a gradient bucket while the backward goes on.
// fn NULL disables it.
void model_set_grad_ready_hook(struct model *m, void (*fn)(void *ctx, size_t ready_from),
                               void *ctx);

// ---- units (ZeRO-2/3, docs/design.md §5 "ZeRO stages") -------------------------
//
// A unit is what FSDP wraps: the embedding, each decoder block, and the head
// (final norm + lm_head), each a contiguous range [begin, end) of the
// parameter and gradient arenas (parameters are laid out in forward order),
// padded under model_shard.unit_multiple so that every shard rank owns the
// same 1/S slice of every unit. A tied embedding is a unit of its own that
// the head reads too (only at zero_stage <= 1: the trainer refuses it above).
enum model_unit_kind { MODEL_UNIT_EMBED, MODEL_UNIT_BLOCK, MODEL_UNIT_HEAD };
struct model_unit {
    enum model_unit_kind kind;
    int chunk;                // model chunk that runs it
    int block;                // local block index (MODEL_UNIT_BLOCK), else -1
    size_t begin, end;        // element range of the arenas, end - begin a multiple of
                              // unit_multiple when that is set
    int first_param, n_params; // its entries of the parameter table
};
// The unit table of m: (*n) units in arena (= forward) order.
const struct model_unit *model_units(const struct model *m, int *n);
// Points unit u's parameter views (params != NULL: model dtype, end - begin
// elements) and/or gradient views (grads != NULL: the gradient dtype) at the
// given backend buffers, laid out as the unit's range of the arena. The
// passes then read and write there; model_set_param / model_get_param /
// model_get_grad too.
void model_unit_bind(struct model *m, int u, void *params, void *grads);
// Events of a unit the passes report to the unit hook: its forward (or
// backward) is about to run and needs its parameters (and for the backward
// its gradient views) bound, and it has ended. A recomputation of a block
// (recompute = selective or full) runs between its BACKWARD and
// BACKWARD_DONE: it reuses the parameters gathered for the backward. Under
// the hook the passes do not fuse a block's last residual add with the
// next unit's norm (the bits are the same: backend_add_rmsnorm_forward), so
// a unit's pass reads only its own parameters.
// With the backward split (model_backward_chunk_input / _weight) a block's
// or the head's B runs between BACKWARD (parameters and gradient views
// needed: B writes the gradients that are no GEMM's, the norm gains and
// biases) and INPUT_DONE (its parameters are no longer needed; without a
// gradient arena the model has copied what B wrote into the W stash,
// so the views may be bound elsewhere until the W), and its W between
// WEIGHT (gradient views needed: the arena's, or a zeroed buffer the hook
// binds without one, into which the W adds the GEMMs' and puts back B's;
// no parameter is read) and WEIGHT_DONE (its gradients are final for the
// microbatch: what BACKWARD_DONE says of the fused pass; grads_ready fires
// after it). The embedding's backward, no GEMM, runs whole in B between
// BACKWARD and BACKWARD_DONE; its W reports no event.
enum model_unit_event {
    MODEL_UNIT_FORWARD, MODEL_UNIT_FORWARD_DONE, MODEL_UNIT_BACKWARD, MODEL_UNIT_BACKWARD_DONE,
    MODEL_UNIT_INPUT_DONE, MODEL_UNIT_WEIGHT, MODEL_UNIT_WEIGHT_DONE
};
void model_set_unit_hook(struct model *m, void (*fn)(void *ctx, int unit, enum model_unit_event ev),
                         void *ctx);
// model_finish_grads restricted to unit u's tensors (through its current
// gradient views): the TP sums of its key/value heads and norm gains.
// Collective over the TP group.
void model_finish_unit_grads(struct model *m, int u);
// Initialises unit u's parameters (where they are bound) as model_init
// does: normal(0, init_std) from (seed, name, global index), norm gains 1, biases 0.
// For a model without a parameter arena (model_shard.no_param_arena),
// whose model_init leaves them to the caller, unit by unit.
void model_init_unit_weights(struct model *m, int u, uint64_t seed);

// The microbatch shape (B, T) of m and the global vocabulary size V.
void model_microbatch_shape(const struct model *m, int *B, int *T, int *V);

// Logits (V,) over the whole vocabulary of row b, position t of the last
// forward (before its backward, as model_get_logits), as double; the vocab shards are all-gathered over the TP group, so
// with tp > 1 every rank of the group must call it. Last stage.
void model_get_logits_at(struct model *m, int b, int t, double *out);

// ---- generation with a key/value cache (model_pass.c; docs/design.md §4) ---------
//
// Autoregressive decoding without recomputing the window (Hugging Face's
// past_key_values; Pope et al. 2022 §2): a prompt is fed once (prefill), then
// one position per new token, each step's keys and values appended to a cache
// that later steps' queries read (backend_attention_decode). A step is the
// model's forward on the shape (rows, Tq): row b's Tq new tokens sit at
// positions pos[b] .. pos[b] + Tq - 1 (RoPE at those positions, causal
// attention over the cache's positions 0 .. pos[b] + t), so rows of different
// lengths advance together; entries past a row's position are never read
// (padding a short prompt's prefill is harmless: later steps overwrite it).
// The step reuses the training forward (qkv_forward, the blocks, the head's
// GEMM) on the activations of slot 0, whose rows bound rows x Tq: it
// overwrites the model's activations (call between training steps). Every
// rank of a TP group calls it with the same arguments (the TP all-reduces of
// the training forward; sequence parallelism is off for a step, every rank
// computing all rows); under context parallelism each rank decodes the whole
// sequence alone (the weights are whole on every cp rank); pipeline stages
// pass model_decode_message_numel elements from stage to stage as in
// training. A mixture-of-experts block routes the step's rows as the
// training forward does (moe.h, its GEMMs batch-invariant too); under expert
// parallelism every rank of an ep group steps together (the layer's
// all-to-alls), as every data rank does for training's samples; with a
// capacity factor, an expert's capacity counts the step's rows (dropless
// models, every Hugging Face import, decode exactly as the window's forward).
// The cached logits equal the full window's forward within rounding
// (tests/unit/test_kv_decode.c).

// Bytes of model_kv_cache_init(rows, len) for this shard and microbatch (B,
// T): keys and values (rows, len, Hkvl, D) of every local layer in dtype,
// each row's positions, one FP32 logits row and, for a pipeline stage, two
// stage messages (256-byte aligned pieces). Errors as model_plan.
enum status model_kv_cache_bytes(const struct llama_config *cfg, const struct model_shard *shard,
                                 enum dtype dtype, int B, int T, int rows, int len, size_t *bytes,
                                 struct error *err);
// Allocates m's cache for `rows` sequences of up to `len` positions (1 <= len
// <= max_seq_len; the same size again keeps the cache), zeroed. Errors:
// STATUS_BAD_INPUT for a bad size, STATUS_RUNTIME when the backend is out of
// memory. model_free frees it.
enum status model_kv_cache_init(struct model *m, int rows, int len, struct error *err);
// The cache's rows and positions (0 without one).
int model_kv_cache_rows(const struct model *m);
int model_kv_cache_len(const struct model *m);
// The most new tokens per row of one step: min(len, activation rows of the
// microbatch / rows); 0 without a cache.
int model_decode_max_tokens(const struct model *m);
// Elements (model dtype) of a step's stage message: rows x Tq x C.
size_t model_decode_message_numel(const struct model *m, int Tq);
// One step of model chunk `chunk`: pos (rows,) host I32 the first new
// position of each row, pos[b] + Tq <= len; tokens (rows, Tq) host ids (first
// virtual stage), else `in` the previous stage's message; not the last
// virtual stage: `out` receives this one's message (host or backend memory as
// model_set_stage_messages_on_device says). Aborts (CHECK) on a shape or
// position outside the cache.
void model_decode_chunk(struct model *m, int chunk, const int32_t *pos, int Tq,
                        const int32_t *tokens, const void *in, void *out);
// One step of the whole model on this rank's chunks: model_decode_chunk of
// each, in virtual-stage order, under pipeline parallelism receiving each
// chunk's input from the previous stage and sending its output to the next
// (blocking, over the groups' pp group: the stage messages' memory as
// model_set_stage_messages_on_device says). Every rank of the pp and TP
// groups calls it with the same arguments; tokens (rows, Tq) host ids.
void model_decode(struct model *m, const int32_t *pos, int Tq, const int32_t *tokens);
// Whether generation steps run their GEMMs batch-invariantly
// (backend_matmul_invariant; default on): then a step computes each row with
// the same bits whatever the step's shape (rows, Tq), so the cached steps'
// logits equal, bit for bit on the CPU backend, those of one step over the
// whole window from a fresh cache (the generation forward recomputed in
// full: tests/unit/test_kv_decode.c). Off: backend_matmul (oneDNN's BF16
// GEMM picks its kernel by shape; the rows agree within rounding only).
void model_set_decode_invariant(struct model *m, bool on);
// Logits (V,) of row b's t-th new token of the last step (t < Tq), as double,
// gathered over the TP group and, under pipeline parallelism, broadcast from
// the last stage over the pp group: every rank of both calls and gets them.
void model_decode_logits_at(struct model *m, int b, int t, double *out);

// ---- FP8 linear layers (model_fp8.c; docs/design.md §5 "FP8") --------------------
//
// In the manner of NVIDIA Transformer Engine (Micikevicius et al. 2022, "FP8
// Formats for Deep Learning"; transformer_engine/pytorch/fp8.py): the GEMMs of
// every block's linear layers (sites: q/k/v, o, gate/up, down) take FP8
// operands. A site's input x and weight w are cast to E4M3 for the forward
// GEMM (out = matmul_fp8 into the model dtype, BF16); its backward casts the
// output gradient dy to E5M2 (hybrid) or E4M3 (e4m3) for the input gradient
// (dy @ w, with the weight's FP8 copy) and the weight gradient (dy^T @ x,
// into the FP32 gradient with beta 1, x cast again: the same bits as the
// forward's). Each site's x, w and dy are one tensor each (q, k and v share
// one x, one w over [Wq; Wk; Wv] and one dy, as Transformer Engine's fused
// QKV weight; gate and up likewise), with its own FP32 scale, scale inverse
// and amax (and amax history under delayed scaling) in backend memory: 12
// per block. Embeddings, the LM head, norms, attention and the optimizer
// keep the model dtype, and so does generation (model_decode: the blocks'
// GEMMs in BF16).
//
// Scaling: current: before each cast the tensor's amax (fp8_amax, all-reduced
// (max) over the TP group when the tensor is split over it: weights, the
// attention output, the SwiGLU product, the q/k/v and gate/up gradients),
// then its scale (fp8_update_scale, no history). Delayed: the casts use the
// scales of the step before (1 at the start) and record their amaxes (the
// fused amax of fp8_cast); model_fp8_step_end all-reduces (max) every amax
// over the TP group and the gradient group (data x context), then pushes
// them into the histories and computes the next scales. Every rank of a
// stage's TP and gradient groups so holds the same scales. The weights are
// cast once per step (the first forward that runs a block) and the copy
// serves every microbatch, recomputation and backward of the step.
struct model_fp8_config {
    bool on;                   // false: no FP8 (the rest is ignored)
    enum dtype grad;           // dy's format: DTYPE_FP8_E5M2 (hybrid) or DTYPE_FP8_E4M3 (e4m3)
    bool delayed;              // scales from the amax history, else current scaling
    int history_len;           // delayed: amaxes kept per tensor, >= 1
    bool most_recent;          // delayed: the newest amax instead of the history's max
    int margin;                // scale = (FP8 max / amax) / 2^margin, 0..32
    int skip_first, skip_last; // global blocks [0, skip_first) and [L - skip_last, L) stay in
                               // the model dtype ([precision] fp8_skip_layers)
};
// Scaling tensors per FP8 block: the sites (q/k/v, o, gate/up, down) times (x, w, dy).
enum { MODEL_FP8_TENSORS = 12 };

// What model_fp8_init allocates for this shard and microbatch (B, T), in
// bytes, each piece rounded up to 256 (N = B T / cp rows, local widths):
// weights, the FP8 copies of the local FP8 blocks' weights (1 byte per q, k,
// v, o, gate, up, down element); scratch, two FP8 buffers (the largest block
// GEMM input, max(N C, N Hl D, N Fl), and output gradient, max(N (Hl + 2
// Hkvl) D, N C, 2 N Fl)); state, the scaling state (scale, scale inverse,
// amax of 12 tensors per FP8 block in FP32, their histories of
// history_len under delayed scaling, and an I64 saturation count). No FP8
// copy of an activation is kept between passes (x is cast again for the
// weight gradient). All 0 when c->on is false. Errors: as model_plan.
struct model_fp8_memory {
    size_t weights, scratch, state;
};
enum status model_fp8_plan_bytes(const struct llama_config *cfg, const struct model_shard *shard,
                                 const struct model_fp8_config *c, int B, int T,
                                 struct model_fp8_memory *out, struct error *err);
// Turns FP8 on for m's blocks outside c's skipped ones (call once, after
// model_init and before the first pass; c->on false: nothing). Scales start
// at 1, amaxes and histories at 0. Errors: STATUS_BAD_INPUT for a model
// dtype other than BF16 or a bad history_len / margin / grad format,
// STATUS_RUNTIME when the backend is out of memory.
enum status model_fp8_init(struct model *m, const struct model_fp8_config *c, struct error *err);
// Whether m runs FP8 linear layers (model_fp8_init with c->on).
bool model_fp8_on(const struct model *m);
// A training step begins: the weights are cast again at their first use, the
// casts record amaxes (delayed) and count saturations until model_fp8_step_end.
// Outside a step (evaluation) casts record and count nothing.
void model_fp8_step_begin(struct model *m);
// A training step ends (after its last backward, before the optimizer
// changes the weights; skipped: train_step_should_skip's verdict, the same
// on every rank). Delayed: unless skipped, the amaxes are all-reduced (max)
// over the TP and gradient groups (collective: every rank of both calls it)
// and pushed into the histories, and the scales recomputed; a skipped step's
// amaxes are dropped (its histories and scales stay). Returns the values the
// step's casts saturated on this rank (each distinct tensor counted once
// over the TP and gradient groups: a weight on the first rank of the
// gradient group, a tensor replicated over TP on TP rank 0, recomputations
// and the backward's second cast of x not at all); resets the count. One
// device-to-host copy. 0 without FP8.
int64_t model_fp8_step_end(struct model *m, bool skipped);

// The delayed-scaling state as checkpoints hold it (train_ckpt.c): one FP32
// tensor per FP8 block, MODEL_FP8_TENSORS rows (site-major: q/k/v x, w, dy,
// o x, w, dy, gate/up ..., down ...) of 2 + history_len columns: scale, amax,
// then the history, newest first. The same on every rank of the block's TP
// and gradient groups. Prefix of its checkpoint name
// "fp8_scaling/model.layers.<l>".
#define MODEL_FP8_STATE_PREFIX "fp8_scaling"
// FP8 blocks of this rank and the global layer of FP8 block i (in order).
int model_fp8_blocks(const struct model *m);
int model_fp8_block_layer(const struct model *m, int i);
// Columns of a block's state tensor: 2 + history_len (2 under current scaling).
int model_fp8_state_cols(const struct model *m);
// Copies FP8 block i's state into host (MODEL_FP8_TENSORS, model_fp8_state_cols).
void model_fp8_state_get(struct model *m, int i, float *host);
// Restores FP8 block i's state from host (MODEL_FP8_TENSORS, cols), a
// checkpoint's: its scales (scale_inv = 1 / scale) and amaxes, and the newest
// min(cols - 2, history_len) history entries (the rest 0), so that a resume
// with another history length keeps what fits. Non-finite or non-positive
// scales are refused as STATUS_BAD_INPUT naming the block's layer.
enum status model_fp8_state_set(struct model *m, int i, const float *host, int cols, struct error *err);

// Logits of the last forward, (B, T, Vl) copied to host as double (tests,
// sampling). Last stage only. Under recompute selective or full the backward
// pass writes the logits' gradient over them: read them before it.
void model_get_logits(struct model *m, double *out);

#endif
