// moe.h: the mixture-of-experts feed-forward layer (issue 31): a
// token-choice router over E routed experts, each a SwiGLU MLP, plus
// optional always-active shared experts, forward and backward on any backend
// through kernels/ops.h, the experts optionally split over ranks (expert
// parallelism, struct moe_ep). The decoder's MoE blocks (model_pass.c) call it.
//
// Math (per token row x of N rows, width C):
//   logits = x Wr^T (E,); p = softmax(logits), in the statistics dtype (FP32;
//   FP64 for an FP64 layer), as transformers' softmax(..., dtype=float);
//   the k experts of largest p (+ expert_bias, selection only) with weights
//   w_j = p_{e_j}, divided by sum_j p_{e_j} when norm_topk (Mixtral, arXiv
//   2401.04088 §2.1, eq. 1-2; Qwen2-MoE's norm_topk_prob);
//   y = sum_j w_j expert_{e_j}(x) + [shared_gate ? sigmoid(x Ws^T) : 1] shared(x),
//   expert_e(x) = down_e(silu(gate_e x) * up_e x) (HF layouts: gate, up
//   (F, C), down (C, F); Mixtral's w1, w3, w2), shared likewise at width
//   shared_F (Qwen2-MoE's shared_expert and shared_expert_gate; DeepSeek's
//   n shared experts are one SwiGLU of n times their width, ungated).
// Reference implementations: transformers 4.46.3 MixtralSparseMoeBlock and
// Qwen2MoeSparseMoeBlock (tests/reference/moe_reference.py checks this
// layer against both, tests/unit/test_moe.c).
//
// Dispatch: the N k (token, slot) assignments are sorted by expert, stably
// (token order inside an expert), the token rows gathered into that order
// (backend_moe_permute), one GEMM per expert over its contiguous rows (three
// forward, six backward; experts with no rows are skipped), and the outputs
// gathered back per token and weighted (backend_moe_combine): Megatron-Core's
// permute / grouped GEMM / unpermute, with the grouped GEMM as a loop of
// backend_matmul. The expert counts are read to the host once per forward
// (a synchronisation: the GEMMs' row counts are host integers; expert
// parallelism's all-to-all needs them there too).
//
// Capacity (capacity_factor > 0; Switch Transformer, arXiv 2101.03961 §2.2):
// expert e keeps its first capacity = ceil(cf N k / E) assignments in token
// order and drops the rest; a dropped assignment contributes nothing (the
// residual around the layer carries its token); counted in moe_stats.
// capacity_factor 0 is dropless (every assignment kept).
//
// Auxiliary losses, returned in moe_stats and added to the gradient by
// moe_backward with their coefficients:
//   aux = E sum_e f_e P_e, f_e = (tokens with e among their top k) / N, P_e =
//   mean_t p[t, e]: Switch Transformer eq. 4-6 as transformers'
//   load_balancing_loss_func computes it (without attention mask; f sums to k
//   over e, so a uniform router gives k); only P carries a gradient.
//   z = mean_t logsumexp(logits_t)^2: ST-MoE, arXiv 2202.08906, eq. 5.
// transformers sums over a model's layers by concatenating their router
// logits before the means (not the sum of per-layer losses): a caller that
// wants that form, or a loss over a global batch, overwrites aux_grad and
// z_grad of the forward's moe_stats before moe_backward (see there).
#ifndef TRIDENT_MOE_H
#define TRIDENT_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "kernels/ops.h"
#include "parallel/comm.h"

// Most routed experts per layer (DeepSeek-V3 has 256): moe_stats holds them inline.
#define MOE_MAX_EXPERTS 256

// Expert parallelism (parallel.ep; Lepikhin et al. 2020, GShard §2.2;
// Megatron-Core's token dispatcher): the E routed experts split over `size`
// ranks, rank r holding El = E / size experts [r El, (r + 1) El) (the
// weights of moe_weights gate, up, down are those El). Each rank routes its
// own N tokens over all E experts as without ep, then (1) the kept row
// counts per expert are all-gathered over `host` (E int32 per rank), (2)
// the permuted rows of each destination's experts (contiguous: they are
// sorted by expert) are sent to it with one all-to-all over `group`, (3)
// each rank runs its El experts on the rows it received, source by source
// (rows of source i for local expert j consecutive, sources in rank order:
// the same rows, in the same order, as source i's own GEMM at ep 1), (4) a
// second all-to-all returns the outputs to their tokens' ranks, which
// combine them. The backward sends the output gradients the same way and
// returns the input gradients. size 1 (or 0): no communication.
struct moe_ep {
    int size, rank;
    struct comm_group *group; // backend buffers (NCCL under CUDA)
    struct comm_group *host;  // the same ranks over host buffers (the counts); NULL: group
};

// The layer's shape and options ([model] moe_* keys).
struct moe_config {
    int C;                  // model width
    int E;                  // routed experts
    int k;                  // experts per token, 1 <= k <= E
    int F;                  // each routed expert's SwiGLU width
    int shared_F;           // the shared experts' SwiGLU width (0: none)
    bool shared_gate;       // Qwen2-MoE: sigmoid(x Ws^T) scales the shared output
    bool norm_topk;         // renormalise the k weights (Mixtral true; Qwen2-MoE norm_topk_prob)
    double capacity_factor; // 0: dropless; else capacity = ceil(cf N k / E) per expert
    double aux_coeff;       // load-balancing loss coefficient (transformers' router_aux_loss_coef)
    double z_coeff;         // router z-loss coefficient (ST-MoE: 1e-3)
    struct moe_ep ep;       // expert parallelism (size 0 or 1: none); E % size == 0
    // moe_forward's GEMMs through backend_matmul_invariant (each row's bits
    // independent of how many rows share the call): generation's steps set it
    // (model_decode_chunk), so that a token routed in a one-token step gets
    // the bits of the same token in a step over the whole window.
    bool invariant;
};

// Parameters (or their gradients: the same shapes) of one layer, in the
// layer's storage dtype dt (gradients: dt, or FP32 for BF16/FP16 dt,
// accumulated). Shapes in Hugging Face's layouts; E experts stored one
// after another.
struct moe_weights {
    struct tensor router;    // (E, C)        Mixtral block_sparse_moe.gate / Qwen2-MoE mlp.gate
    struct tensor gate;      // (E, F, C)     experts.e.w1 / experts.e.gate_proj
    struct tensor up;        // (E, F, C)     experts.e.w3 / experts.e.up_proj
    struct tensor down;      // (E, C, F)     experts.e.w2 / experts.e.down_proj
    struct tensor sh_gate;   // (shared_F, C) shared_expert.gate_proj (shared_F > 0)
    struct tensor sh_up;     // (shared_F, C) shared_expert.up_proj
    struct tensor sh_down;   // (C, shared_F) shared_expert.down_proj
    struct tensor sh_router; // (1, C)        shared_expert_gate (shared_gate)
    // Not a parameter (no gradient; ignored in a gradient struct): optional
    // (E,) statistics-dtype bias added to the probabilities when choosing
    // experts, not to their weights (DeepSeek-V3's auxiliary-loss-free
    // balancing, arXiv 2412.19437 §2.1.2); numel 0: none. Tests force
    // routing with it.
    struct tensor expert_bias;
};

// What a forward routed, on the host (moe_forward fills it; moe_backward
// reads it). Arrays hold E entries.
struct moe_stats {
    int N, E, capacity; // capacity 0: dropless
    int M;              // rows kept, sum_e kept[e] (the expert GEMMs' total rows)
    int32_t kept[MOE_MAX_EXPERTS];   // assignments expert e kept (this rank's tokens)
    // Expert parallelism (c->ep.size > 1): rows this rank received for its
    // experts, recv_rows[i El + j] from source rank i for local expert j
    // (E entries), R their sum (the expert GEMMs' rows; M without ep).
    int32_t recv_rows[MOE_MAX_EXPERTS];
    int R;
    int32_t routed[MOE_MAX_EXPERTS]; // assignments routed to e before the capacity
    int64_t dropped;                 // sum_e routed[e] - kept[e]
    double prob_sum[MOE_MAX_EXPERTS]; // sum_t p[t, e]
    double z_sum;                     // sum_t logsumexp(logits_t)^2
    double aux_loss;                  // E sum_e (routed[e] / N) (prob_sum[e] / N)
    double z_loss;                    // z_sum / N
    // The gradient of the auxiliary terms moe_backward adds, set by
    // moe_forward for this layer's batch: aux_grad[e] = d loss / d p[t, e]
    // = aux_coeff E routed[e] / N^2 (every t), z_grad = d loss / d z_sum =
    // z_coeff / N. A caller may replace them (transformers' concatenated
    // layers: aux_coeff E f_e / (L N) with f_e over all L layers; a global
    // batch; loss scaling).
    double aux_grad[MOE_MAX_EXPERTS];
    double z_grad;
};

// STATUS_OK, or STATUS_BAD_INPUT naming the field and its value: C, E, k, F
// positive, E <= MOE_MAX_EXPERTS, k <= E, shared_F >= 0, shared_gate only
// with shared_F > 0, capacity_factor >= 0 and finite, ep.size dividing E
// and 0 <= ep.rank < ep.size.
enum status moe_config_check(const struct moe_config *c, struct error *err);

// The capacity of each expert for N tokens: ceil(capacity_factor N k / E)
// (computed in double), or 0 when dropless.
int moe_capacity(const struct moe_config *c, int N);

// The most rows the experts keep for N tokens: N k dropless, else
// min(N k, E capacity). The expert buffers' row count.
int moe_rows_max(const struct moe_config *c, int N);

// The most rows one rank's experts receive under expert parallelism (the
// expert GEMMs' and their activations' row count): without ep moe_rows_max;
// else dropless every source may send all its N k assignments here: ep N k;
// with a capacity each source sends at most capacity rows per expert: ep El
// capacity = E capacity (at most ep N k). Buffers are sized for this bound.
int moe_rows_recv_max(const struct moe_config *c, int N);

// Backend bytes one layer keeps from its forward for its backward at N
// tokens in storage dtype dt (the `acts` of moe_forward / moe_backward;
// st: FP32, FP64 for FP64 dt; Mx = moe_rows_max; every buffer rounded up to
// 256 bytes): probs (N, E) st, lse (N,) st, topk_idx (N, k) I32, topk_w
// (N, k) st, stats (E + 1,) FP64, counts (2 E,) I32, dest and src (N k,)
// I32, xp (Mx, C), hg, hu, h (Rx, F), yp (Mx, C) dt, and under expert
// parallelism xr, yr (Rx, C) dt (Rx = moe_rows_recv_max); with shared experts
// sg, su, sh (N, shared_F), sy (N, C) dt and with their gate s (N,) st.
size_t moe_activation_bytes(const struct moe_config *c, int N, enum dtype dt);

// Backend bytes of the working memory of one forward or backward (the
// `scratch`, free between calls: layers may share it): the larger of the
// forward's logits (N, E) st and the backward's dyp, dxp (Mx, C), dh, dhg,
// dhu (Rx, F) dt (under expert parallelism also dyr, dxr (Rx, C) dt), dtopk_w (N, k) st, dlogits (N, E) st (and dt when dt !=
// st), aux_w (E,) st, and with shared experts dsy (N, C), dsh, dsg, dsu (N,
// shared_F) dt, ds (N,) st (and dt when dt != st); each rounded up to 256.
size_t moe_scratch_bytes(const struct moe_config *c, int N, enum dtype dt);

// The grouped expert GEMMs, Megatron-Core's GroupedMLP as a loop of
// backend_matmul: n experts (gate, up (n, F, C), down (n, C, F): all E, or
// a rank's range under expert parallelism), expert e's rows_of[e] rows (host)
// consecutive in expert order in xp (M, C), M = sum rows_of. hg, hu, h (M,
// F) = the gate and up projections and silu(hg) * hu, yp (M, C) = h down_e^T
// (an expert with no rows costs no call). Every tensor of one storage dtype.
// invariant: the GEMMs through backend_matmul_invariant (moe_config's).
void moe_experts_forward(struct backend *be, int n, const int32_t *rows_of, int C, int F,
                         struct tensor yp, struct tensor hg, struct tensor hu, struct tensor h,
                         struct tensor xp, struct tensor gate, struct tensor up,
                         struct tensor down, bool invariant);
// Its backward given dyp (M, C): dxp (M, C) =; dgate, dup, ddown += (the
// gradients' dtype, or FP32 for BF16/FP16 rows); dh, dhg, dhu (M, F):
// working memory, overwritten. Six GEMMs per expert with rows.
void moe_experts_backward(struct backend *be, int n, const int32_t *rows_of, int C, int F,
                          struct tensor dxp, struct tensor dgate, struct tensor dup,
                          struct tensor ddown, struct tensor dh, struct tensor dhg,
                          struct tensor dhu, struct tensor dyp, struct tensor xp, struct tensor hg,
                          struct tensor hu, struct tensor h, struct tensor gate, struct tensor up,
                          struct tensor down);

// y (N, C) = the layer on x (N, C), both of storage dtype dt (FP32, BF16,
// FP16; FP64 on the CPU backend). acts: moe_activation_bytes(c, N, dt)
// bytes of backend memory, kept for moe_backward; scratch:
// moe_scratch_bytes(c, N, dt). Fills *st on the host (one synchronisation,
// after the dispatch). c checked by moe_config_check; N <= the N the
// buffers were sized for; y does not alias x. Under expert parallelism
// (c->ep.size > 1) a collective over c->ep: every ep rank calls it for the
// same layer (with its own N tokens); moe_backward likewise.
void moe_forward(struct backend *be, const struct moe_config *c, struct tensor y, struct tensor x,
                 const struct moe_weights *w, int N, void *acts, void *scratch,
                 struct moe_stats *st);

// transformers' load-balancing loss of a model (MixtralForCausalLM /
// Qwen2MoeForCausalLM's aux_loss, load_balancing_loss_func over the L MoE
// layers' router logits concatenated, no attention mask): E sum_e f_e P_e
// with f_e = sum_l routed_l[e] / (L N) and P_e = sum_l prob_sum_l[e] / (L N),
// from the L layers' forwards (one N and E). Returns it and sets each
// layer's aux_grad[e] = coeff E f_e / (L N), its gradient times coeff
// (moe_backward then adds coeff times this loss's gradient, in place of the
// per-layer default). L = 1 is the layer's own aux_loss and aux_grad.
double moe_aux_loss_layers(struct moe_stats *const *layers, int L, double coeff);

// Views of the routing a forward left in acts (for logs, tests and expert
// parallelism's dispatch): topk_idx (N, k) I32 and topk_w (N, k) st as
// backend_moe_route made them; dest and src (N k,) I32 and counts (2 E,) I32
// as backend_moe_dispatch did.
struct moe_routing {
    struct tensor topk_idx, topk_w, dest, src, counts;
};
struct moe_routing moe_routing_view(const struct moe_config *c, int N, enum dtype dt, void *acts);

// Gradients given dy (N, C): dx (N, C) += d/dx, and each parameter gradient
// of dw += its gradient (expert_bias has none), of sum(dy * y) plus the
// auxiliary terms st->aux_grad and st->z_grad describe (as moe_forward set
// them: aux_coeff aux + z_coeff z). x, w, acts, st: as the forward left
// them; scratch: moe_scratch_bytes(c, N, dt), overwritten. dx does not
// alias dy (dy is read after dx is first added to). Gradients of BF16/FP16
// layers: FP32 (or dt) weight gradients; dx, dy of dt.
void moe_backward(struct backend *be, const struct moe_config *c, struct tensor dx,
                  const struct moe_weights *dw, struct tensor dy, struct tensor x,
                  const struct moe_weights *w, int N, void *acts, void *scratch,
                  const struct moe_stats *st);

#endif
