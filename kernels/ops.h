// ops.h: the operations every compute backend implements (docs/design.md §3).
//
// The model above this line is written once; a backend is a table of function
// pointers (struct backend_ops, its compute entries listed once in
// kernels/ops_list.h) and the model calls the checked wrappers backend_*()
// below, never the pointers. Each wrapper checks element counts and dtypes and
// then dispatches.
//
// Conventions
// - Tensors are row-major, contiguous, and carry their dtype (struct tensor).
//   Storage dtypes: FP32 on every backend; FP64 on the CPU backend, used by
//   tests for finite differences; BF16 and FP16 on both backends, as 16-bit
//   storage only: every op loads BF16/FP16 to FP32, computes and accumulates
//   in FP32 (GEMMs included) and rounds each output element once to its
//   storage dtype, to nearest even (torch's .to(bfloat16) / .to(half); FP16
//   keeps subnormals, overflows to inf). Unless an op says otherwise, its
//   float tensors share one storage dtype, and the statistics below are
//   FP32. Token ids and targets are I32.
// - Parameter gradients (matmul's FP32 out, rmsnorm dw, embedding dwte) of
//   BF16/FP16 activations may be FP32: they then accumulate ("+=") in FP32.
// - Shape letters: B batch, T sequence, C model width, H query heads, Hkv
//   key/value heads, D head size, F feed-forward width, V vocabulary,
//   Vl the local vocabulary slice of a vocab-parallel shard, N = B*T rows.
// - "dx +=": the op accumulates into dx (residual branches, weight gradients).
//   "dx =": the op overwrites dx.
// - Statistics saved for backward passes (rstd, lse, row max) are FP32 for
//   FP32/BF16/FP16 storage, and of the input dtype for FP64.
// - A wrapper aborts (exit 1, file:line) on a shape or dtype error: those are
//   bugs in trident, not user input.
#ifndef TRIDENT_OPS_H
#define TRIDENT_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/common.h"
#include "ops_list.h"

// DTYPE_I64: counters (tokens, steps) summed across ranks by src/parallel/comm.h.
// DTYPE_FP8_E4M3 / DTYPE_FP8_E5M2: one byte each, the OCP 8-bit floating point
// formats (OCP "8-bit Floating Point Specification (OFP8)" rev 1.0, 2023):
// E4M3 has max 448, no infinities and one NaN pattern per sign (S.1111.111);
// E5M2 is IEEE-like (max 57344, infinities, NaNs). Storage of FP8 training's
// GEMM operands only (fp8_cast, matmul_fp8); no other op takes them.
enum dtype { DTYPE_FP32, DTYPE_BF16, DTYPE_FP16, DTYPE_FP64, DTYPE_I32, DTYPE_I64, DTYPE_FP8_E4M3,
             DTYPE_FP8_E5M2 };

// Bytes per element of dtype.
size_t dtype_size(enum dtype dtype);
// "fp32", "bf16", "fp16", "fp64", "i32", "i64", "fp8_e4m3", "fp8_e5m2".
const char *dtype_name(enum dtype dtype);

// A view of n elements of one dtype in a backend's memory.
struct tensor {
    void *data;
    enum dtype dtype;
    size_t numel;
};

static inline struct tensor tensor_view(void *data, enum dtype dtype, size_t numel) {
    struct tensor t = {data, dtype, numel};
    return t;
}
// A sub-view starting at element offset, of numel elements.
struct tensor tensor_slice(struct tensor t, size_t offset, size_t numel);

struct backend;

// The largest problem a caller will give the ops (backend_reserve): what the
// backend's working memory (the CUDA backend's scratch) must hold.
struct backend_bounds {
    int rows, cols;          // rows (N) and width (C) of the row-wise ops (rmsnorm)
    int B, T, H, Hkv, D;     // attention: batch, sequence, query and key/value heads, head size
    enum dtype dtype;        // the activations' storage dtype
    // matmul_fp8: the largest M K + K N of a call, in elements (0: no FP8
    // GEMMs). The CUDA backend keeps K-major copies of operands in its scratch
    // (cuBLASLt's FP8 GEMMs take only that layout; docs/cuda.md "FP8").
    size_t fp8_gemm;
};

// The table a backend fills. Every entry is required unless marked optional.
struct backend_ops {
    const char *name; // "cpu", "cuda"
    // Frees the backend's private state and the struct backend itself.
    void (*destroy)(struct backend *be);

    // Memory: allocations are aligned to 64 bytes; alloc returns NULL on failure.
    void *(*alloc)(struct backend *be, size_t bytes);
    void (*free)(struct backend *be, void *ptr);
    void (*to_device)(struct backend *be, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(struct backend *be, void *host_dst, const void *src, size_t bytes);
    void (*memset0)(struct backend *be, void *dst, size_t bytes);
    void (*synchronize)(struct backend *be);
    // Optional, default false: true when alloc returns host memory that host
    // code may read directly once synchronize has returned (the CPU backend),
    // so a reader need not copy it out (a checkpoint save).
    bool host_memory;
    // Optional (NULL: nothing to reserve): sizes the working memory the ops
    // need up to bounds now, so that no op allocates later; keeps the largest
    // of several calls. STATUS_RUNTIME when the memory cannot be had.
    enum status (*reserve)(struct backend *be, const struct backend_bounds *bounds, struct error *err);
    // Optional (NULL: matmul, whose row results may depend on the shape):
    // backend_matmul_invariant below.
    void (*matmul_invariant)(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                             int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta);

    // The compute ops, one entry per line of kernels/ops_list.h: e.g.
    // void (*matmul)(struct backend *be, struct tensor out, ...). What each
    // computes: at its wrapper backend_<name>() below.
#define BACKEND_OPS_ENTRY(name, ret, params) ret(*name) params;
    BACKEND_OPS(BACKEND_OPS_ENTRY)
#undef BACKEND_OPS_ENTRY
};

// A backend instance: its table plus its private state (threads, streams,
// workspaces). Created by backend_cpu_init() / backend_cuda_init().
struct backend_profile;
struct backend {
    const struct backend_ops *ops;
    void *impl;
    int threads;
    struct backend_profile *profile; // NULL unless backend_profile_enable()
};

// The CPU backend (C, OpenMP, OpenBLAS): the reference implementation.
// threads <= 0 keeps OpenMP's default. Never fails.
struct backend *backend_cpu_init(int threads);
void backend_free(struct backend *be);

// ---- memory ---------------------------------------------------------------

// Allocates bytes of backend memory (64-byte aligned); NULL on failure.
void *backend_alloc(struct backend *be, size_t bytes);
void backend_dealloc(struct backend *be, void *ptr);
void backend_to_device(struct backend *be, void *dst, const void *host_src, size_t bytes);
void backend_to_host(struct backend *be, void *host_dst, const void *src, size_t bytes);
void backend_memset0(struct backend *be, struct tensor t);
void backend_synchronize(struct backend *be);
// struct backend_ops.host_memory of be.
bool backend_host_memory(const struct backend *be);
// Sizes the backend's working memory for ops up to bounds (struct
// backend_ops.reserve; a no-op on a backend without it). model_init calls it
// so that a training step allocates nothing. Errors: STATUS_RUNTIME (out of
// device memory), naming the backend and the bytes.
enum status backend_reserve(struct backend *be, const struct backend_bounds *bounds, struct error *err);

// ---- linear algebra -------------------------------------------------------

// out (M, N) = alpha * op(a) @ op(b) + beta * out, row-major.
// op(a) is (M, K): a is stored (M, K), or (K, M) when trans_a.
// op(b) is (K, N): b is stored (K, N), or (N, K) when trans_b.
// A linear layer with PyTorch's weight layout W (out, in) is
// matmul(y, x, W, N, out, in, false, true, 1, 0).
// a and b share a dtype; out has it too, or is FP32 when a and b are BF16/FP16
// (FP32 accumulation into FP32 weight gradients). BF16/FP16 out: the FP32
// result of alpha * op(a) @ op(b) + beta * out, rounded once.
// Math: BLAS sgemm/dgemm (the CPU backend calls OpenBLAS, and for BF16
// oneDNN's dnnl_gemm_bf16bf16f32 where the CPU has AVX512_BF16, else the
// operands converted to FP32 and sgemm; FP16 converts too; the CUDA backend
// calls cuBLASLt with FP32 compute, CUBLAS_COMPUTE_32F, for FP32, BF16 and
// FP16 operands).
void backend_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                    int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta);

// backend_matmul's product (same arguments, shapes and dtypes) computed
// batch-invariantly: each element of out is one dot product of a row of
// op(a) and a column of op(b) summed in an order that depends on K alone, so
// a row of out (a column) has the same bits whatever M (N) is and whichever
// other rows (columns) share the call: generation (model_decode_chunk) runs
// its GEMMs through it, so that a one-token step gives the bits of the same
// position in a step over the whole window. The CPU backend: FP32 lanes of
// FMAs (BF16: vdpbf16ps where the CPU has AVX512_BF16) then a fixed
// reduction tree (kernels/cpu/cpu_matmul_dot.c); fast for the few rows of a
// step (it streams the weights once), slower than backend_matmul for many
// rows. A backend without it (the CUDA backend: cuBLASLt picks its
// algorithm per shape) runs backend_matmul: rows then agree within rounding
// only. Math: as backend_matmul; the sum order is not BLAS's.
void backend_matmul_invariant(struct backend *be, struct tensor out, struct tensor a,
                              struct tensor b, int M, int N, int K, bool trans_a, bool trans_b,
                              float alpha, float beta);

// ---- embedding (vocab-parallel, Megatron VocabParallelEmbedding) ----------

// out (N, C) = wte[tokens[i] - vocab_start] for tokens in [vocab_start,
// vocab_start + Vl), else a zero row (another tensor-parallel rank owns it;
// the TP all-reduce of out completes the lookup).
// wte: (Vl, C); tokens: (N,) I32.
void backend_embedding_forward(struct backend *be, struct tensor out, struct tensor wte,
                               struct tensor tokens, int N, int C, int vocab_start, int Vl);
// dwte (Vl, C) += scatter-add of dout (N, C) rows at tokens owned by this shard.
// dwte: dout's dtype, or FP32 for BF16/FP16 dout (FP32 sums); a BF16/FP16
// dwte is rounded after each row added (a token repeated k times: k roundings).
void backend_embedding_backward(struct backend *be, struct tensor dwte, struct tensor dout,
                                struct tensor tokens, int N, int C, int vocab_start, int Vl);

// ---- RMSNorm (Zhang & Sennrich 2019, eq. 4; torch LlamaRMSNorm) ------------

// y (N, C) = x / sqrt(mean(x^2) + eps) * w; rstd (N,) = 1 / sqrt(mean(x^2) + eps).
// x: (N, C); w: (C,).
void backend_rmsnorm_forward(struct backend *be, struct tensor y, struct tensor rstd,
                             struct tensor x, struct tensor w, int N, int C, float eps);
// The residual add and the RMSNorm after it, in one pass (issue 24):
// xout (N, C) = a + b (rounded to the storage dtype), then y, rstd =
// rmsnorm_forward(xout, w) computed from the rounded xout: the bits of
// backend_add then backend_rmsnorm_forward. xout may alias a or b; a, b,
// xout, y, w: one dtype; rstd as rmsnorm_forward's.
void backend_add_rmsnorm_forward(struct backend *be, struct tensor xout, struct tensor y,
                                 struct tensor rstd, struct tensor a, struct tensor b,
                                 struct tensor w, int N, int C, float eps);
// dx (N, C) +=, dw (C,) += the gradients of the forward above given dy (N, C).
// dx, dy, x, w: one dtype; dw: that dtype, or FP32 for BF16/FP16 x (the row
// sums in FP64/FP32 either way, added to dw once).
void backend_rmsnorm_backward(struct backend *be, struct tensor dx, struct tensor dw,
                              struct tensor dy, struct tensor x, struct tensor w,
                              struct tensor rstd, int N, int C);

// ---- RoPE (Su et al. 2021, RoFormer eq. 34; HF LLaMA rotate_half) ---------

// In place on x (B, T, Hx, D): for each position p = pos_offset + t and
// i < D/2, with c = cos[p, i], s = sin[p, i]:
//   x'[i]       = x[i] * c - x[i + D/2] * s
//   x'[i + D/2] = x[i + D/2] * c + x[i] * s
// inverse = true applies the transposed rotation (angle -theta): that is the
// backward pass of the forward rotation. cos, sin: (Tmax, D/2) FP32 (for FP64
// x: FP64) from rope_table_fill(); pos_offset + T <= Tmax.
void backend_rope_forward(struct backend *be, struct tensor x, struct tensor cos,
                          struct tensor sin, int B, int T, int Hx, int D, int pos_offset);
void backend_rope_backward(struct backend *be, struct tensor dx, struct tensor cos,
                           struct tensor sin, int B, int T, int Hx, int D, int pos_offset);
// The same with per-token positions for packed documents ([data] packing =
// concat_reset): doc_start (B, T) I32 holds, for each token (b, t), the index
// t0 <= t in its row where its document starts, and the token's position is
// p = pos_offset + t - doc_start[b, t] (Megatron-LM's --reset-position-ids).
// An empty doc_start (numel 0) is doc_start[b, t] = 0: the plain wrappers
// above, bit for bit. Build it with doc_start_fill().
void backend_rope_forward_docs(struct backend *be, struct tensor x, struct tensor cos,
                               struct tensor sin, struct tensor doc_start, int B, int T, int Hx,
                               int D, int pos_offset);
void backend_rope_backward_docs(struct backend *be, struct tensor dx, struct tensor cos,
                                struct tensor sin, struct tensor doc_start, int B, int T, int Hx,
                                int D, int pos_offset);

// q, k and v from one GEMM over the consecutive [Wq; Wk; Wv] (issue 24):
// qkv (B, T, H + 2 Hkv, D) holds each token's q heads, then its k heads, then
// its v heads (the GEMM's output rows, W = (H + 2 Hkv) D elements). The split
// writes q (B, T, H, D) and k (B, T, Hkv, D) rotated as
// backend_rope_forward_docs does (positions t - doc_start[b, t], pos_offset
// 0) and v (B, T, Hkv, D) copied: RoPE as the QKV GEMM's epilogue, one pass.
// The join is its backward: dqkv rows from dq, dk rotated back (as
// backend_rope_backward_docs) and dv. One dtype for all but cos, sin (as
// rope's) and doc_start (empty: plain causal positions).
void backend_rope_qkv_split(struct backend *be, struct tensor q, struct tensor k, struct tensor v,
                            struct tensor qkv, struct tensor cos, struct tensor sin,
                            struct tensor doc_start, int B, int T, int H, int Hkv, int D);
void backend_rope_qkv_join(struct backend *be, struct tensor dqkv, struct tensor dq,
                           struct tensor dk, struct tensor dv, struct tensor cos,
                           struct tensor sin, struct tensor doc_start, int B, int T, int H,
                           int Hkv, int D);

// Host helper: doc_start (B, T) = for each row b, the start of the document
// holding token t: 0 at t = 0 and a new document at every t whose previous
// input token tokens[b, t - 1] is eot (Megatron-LM's
// get_ltor_masks_and_position_ids, megatron/core/datasets/gpt_dataset.py,
// with reset_position_ids and reset_attention_mask). tokens: (B, T) I32 ids.
void doc_start_fill(int32_t *doc_start, const int32_t *tokens, int B, int T, int32_t eot);

// RoPE frequency scaling ([model] rope_scaling, llama_config.rope_scaling in model.h; Hugging Face's config.json
// `rope_scaling`): NONE is plain RoPE (Su et al. 2021; HF "default"); LINEAR
// divides every position by `factor` (HF "linear", Chen et al. 2023,
// position interpolation); LLAMA3 rescales each frequency by its wavelength
// against original_max_pos (HF `_compute_llama3_parameters`: wavelengths
// below original_max_pos / high_freq_factor unchanged, above
// original_max_pos / low_freq_factor divided by factor, smooth between).
enum rope_scaling_type { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3 };
struct rope_scaling {
    enum rope_scaling_type type;
    double factor;                            // LINEAR, LLAMA3: > 0 (1: no change)
    double low_freq_factor, high_freq_factor; // LLAMA3: high > low > 0
    int original_max_pos;                     // LLAMA3: original_max_position_embeddings
};

// inv_freq of pair i < D/2 (angle p * inv_freq at position p), in double:
// theta^(-2i/D) (HF's _compute_default_rope_parameters), then scaled by sc
// (NULL or NONE: unchanged): LINEAR divides by factor
// (_compute_linear_scaling_rope_parameters); LLAMA3 is
// _compute_llama3_parameters (transformers' modeling_rope_utils.py): with
// wavelength w = 2 pi / inv_freq, lo = original_max_pos / low_freq_factor
// and hi = original_max_pos / high_freq_factor, w < hi keeps inv_freq, w >
// lo divides it by factor, and between them s = (original_max_pos / w -
// low_freq_factor) / (high_freq_factor - low_freq_factor) gives
// (1 - s) inv_freq / factor + s inv_freq. HF computes in FP32; here double.
double rope_inv_freq(int i, int D, double theta, const struct rope_scaling *sc);

// Host helper: cos/sin tables (Tmax, D/2) of angle p * theta^(-2i/D), the
// angle and its cos/sin computed in double (HF's inv_freq, without its fp32
// rounding), then stored as float.
void rope_table_fill(float *cos, float *sin, int Tmax, int D, double theta);
void rope_table_fill_f64(double *cos, double *sin, int Tmax, int D, double theta);
// The same with the frequencies scaled by sc (rope_inv_freq; NULL: plain).
void rope_table_fill_scaled(float *cos, float *sin, int Tmax, int D, double theta,
                            const struct rope_scaling *sc);
void rope_table_fill_scaled_f64(double *cos, double *sin, int Tmax, int D, double theta,
                                const struct rope_scaling *sc);

// ---- causal grouped-query attention (Vaswani et al. 2017 eq. 1; GQA: ------
// ---- Ainslie et al. 2023; matches torch scaled_dot_product_attention) -----

// out (B, T, H, D) = softmax(q k^T / sqrt(D) + causal mask) v, per head, where
// query head h reads key/value head h / (H / Hkv). q: (B, T, H, D);
// k, v: (B, T, Hkv, D); lse (B, H, T): the log-sum-exp of each score row,
// saved so the backward pass recomputes the probabilities (FlashAttention,
// Dao et al. 2022, algorithm 2) instead of storing (B, H, T, T).
void backend_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                               struct tensor q, struct tensor k, struct tensor v,
                               int B, int T, int H, int Hkv, int D);
// dq (B, T, H, D) =, dk (B, T, Hkv, D) =, dv (B, T, Hkv, D) = the gradients of
// the forward above given dout (B, T, H, D) and the forward's out and lse.
void backend_attention_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                struct tensor dv, struct tensor dout, struct tensor q,
                                struct tensor k, struct tensor v, struct tensor out,
                                struct tensor lse, int B, int T, int H, int Hkv, int D);
// Document-masked attention ([data] packing = concat_reset): with doc_start
// (B, T) I32 as for backend_rope_forward_docs, query i of row b attends to
// keys j with doc_start[b, i] <= j <= i only (block-diagonal causal: each
// document of a packed row computes as it would alone at a row's start;
// Megatron-LM's --reset-attention-mask). Keys before doc_start are skipped,
// not computed and masked. An empty doc_start is the plain causal mask: the
// wrappers above, bit for bit. dtypes, shapes and lse as above.
void backend_attention_forward_docs(struct backend *be, struct tensor out, struct tensor lse,
                                    struct tensor q, struct tensor k, struct tensor v,
                                    struct tensor doc_start, int B, int T, int H, int Hkv, int D);
void backend_attention_backward_docs(struct backend *be, struct tensor dq, struct tensor dk,
                                     struct tensor dv, struct tensor dout, struct tensor q,
                                     struct tensor k, struct tensor v, struct tensor out,
                                     struct tensor lse, struct tensor doc_start, int B, int T,
                                     int H, int Hkv, int D);

// ---- one block of context-parallel ring attention ------------------------
// Math: Liu et al. 2023, "Ring Attention with Blockwise Transformers for
// Near-Infinite Context" (arXiv 2310.01889): each rank's queries meet every
// rank's key/value block in turn and the partial results are merged;
// the merge is FlashAttention-2's online softmax (Dao 2023, algorithm 1:
// rescale by the running log-sum-exp) and the backward FlashAttention-2's
// algorithm 2 (P recomputed from the final lse); the load-balanced causal
// chunks and document masks across them as Megatron-Core / TransformerEngine
// context parallelism (attn_forward_func_with_cp). Under cp, a rank's
// queries (Tq tokens) and one rank's keys (Tk tokens) are arbitrary sets of
// a sequence's tokens, identified by their global positions:
// - q (B, Tq, H, D); k, v (B, Tk, Hkv, D); out, dout (B, Tq, H, D); lse (B,
//   H, Tq) FP32 (FP64 for FP64 storage); q, k, v, out, dout, dq, dk, dv share
//   one storage dtype (FP32, FP64, BF16, FP16). GQA as backend_attention_forward:
//   query head h reads kv head h / (H / Hkv).
// - q_pos (B, Tq) I32, k_pos (B, Tk) I32: each token's global position in its
//   sequence (under context parallelism a rank holds two non-adjacent chunks,
//   so positions are up to two increasing runs); q_doc (B, Tq) I32: the
//   global position of the first token of the query's document ([data]
//   packing = concat_reset), or an empty tensor (numel 0): 0 for every query
//   (plain causal).
// - Mask: query i of row b may read key j iff
//   q_doc[b, i] <= k_pos[b, j] <= q_pos[b, i]. Scores scale 1 / sqrt(D).
// - Keys a query cannot read are skipped, not computed and masked: a tile
//   (or a whole call) with no readable (query, key) pair costs no GEMM.
// Summed over blocks whose keys are all of a sequence's tokens, each once,
// forward with accumulate and backward give backend_attention_forward_docs /
// _backward_docs of the whole sequence (tests/unit/test_attention_block.c,
// tests/unit/test_ring_reference.c against float64 PyTorch).
// Position and document values live in backend memory and are not checked.

// accumulate = false: out, lse = this block's attention: out row i =
// softmax over the readable keys j of (q_i . k_j / sqrt(D)) applied to v;
// lse[b, h, i] = log sum over readable j of exp(q_i . k_j / sqrt(D)); a row
// with no readable key gets out row 0 and lse -inf.
// accumulate = true: merges this block into the (out, lse) already there
// (online softmax): lse' = logaddexp(lse, lse_blk),
// out' = out e^(lse - lse') + out_blk e^(lse_blk - lse'); a row with no
// readable key in this block is left as it is (bits untouched), and a row
// whose lse is -inf takes the block's out, lse. BF16/FP16 out is rounded
// once per call (after the merge, computed in FP32).
void backend_attention_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                     struct tensor q, struct tensor k, struct tensor v,
                                     struct tensor q_pos, struct tensor q_doc,
                                     struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                     int D, bool accumulate);
// dq (B, Tq, H, D) +=, dk (B, Tk, Hkv, D) +=, dv (B, Tk, Hkv, D) += this
// block's contribution to the gradients, given dout and the FINAL merged out
// and lse of the query rows (after every block's forward): with
// S = q k^T / sqrt(D) on readable pairs, P = exp(S - lse), dP = dout v^T,
// Delta_i = rowsum(dout * out), dS = P * (dP - Delta):
// dq += dS k / sqrt(D), dk += dS^T q / sqrt(D) (summed over the query heads
// of a kv head), dv += P^T dout. dq, dk, dv have the storage dtype of q:
// BF16/FP16 accumulate this call's contribution in FP32 and add it to the
// stored value, rounding once per element per call (the ring keeps its dk /
// dv travelling buffers in the storage dtype).
void backend_attention_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                      struct tensor dv, struct tensor dout, struct tensor q,
                                      struct tensor k, struct tensor v, struct tensor out,
                                      struct tensor lse, struct tensor q_pos, struct tensor q_doc,
                                      struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                      int D);

// ---- attention against a key/value cache (generation) ----------------------
// Autoregressive decoding with cached keys and values (the "past_key_values"
// of Hugging Face's generate(); Pope et al. 2022, "Efficiently Scaling
// Transformer Inference", §2): each row b of the batch adds Tq new tokens at
// cache positions pos[b] .. pos[b] + Tq - 1 (already rotated by RoPE at those
// positions). The op first writes k, v (B, Tq, Hkv, D) into k_cache, v_cache
// (B, Tmax, Hkv, D) at those positions, then computes for every new query
//   out[b, t, h] = softmax_j (q[b, t, h] . k_cache[b, j, h/G] / sqrt(D)) v_cache[b, j, h/G]
// over the causal keys j = 0 .. pos[b] + t (G = H / Hkv: GQA as
// backend_attention_forward). The cache entries past pos[b] + t are not read,
// so a row's stale or padded entries there are harmless. q, out (B, Tq, H, D);
// q, k, v, out, k_cache, v_cache share one float storage dtype (FP32, FP64,
// BF16, FP16); the scores, softmax and sums are computed in FP32 (FP64 for
// FP64), out rounded once. pos (B,) I32 in backend memory, not checked: the
// caller keeps 0 <= pos[b] and pos[b] + Tq <= Tmax. Equal, within rounding,
// to backend_attention_forward's rows pos[b] .. pos[b] + Tq - 1 of the whole
// sequence (tests/unit/test_kv_decode.c).
void backend_attention_decode(struct backend *be, struct tensor out, struct tensor q,
                              struct tensor k, struct tensor v, struct tensor k_cache,
                              struct tensor v_cache, struct tensor pos, int B, int Tq, int Tmax,
                              int H, int Hkv, int D);

// ---- SwiGLU (Shazeer 2020, eq. 6; HF LlamaMLP act_fn(gate) * up) ----------

// out (n,) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void backend_swiglu_forward(struct backend *be, struct tensor out, struct tensor gate,
                            struct tensor up, size_t n);
// dgate (n,) =, dup (n,) = the gradients given dout (n,).
void backend_swiglu_backward(struct backend *be, struct tensor dgate, struct tensor dup,
                             struct tensor dout, struct tensor gate, struct tensor up, size_t n);

// ---- vocab-parallel cross-entropy (Megatron vocab_parallel_cross_entropy) --
// A rank holds logits (N, Vl) for global columns [vocab_start, vocab_start+Vl);
// only the first Vvalid columns are real (the rest pad a vocabulary not
// divisible by tp and act as logits of -inf). The loss of row i is
//   lse_i - (1 - s) * z_{i,y_i} - (s / V) * sum_j z_ij,  lse_i = log sum_j exp z_ij,
// i.e. torch cross_entropy with label_smoothing = s over V real classes.
// The pieces compose across tensor-parallel ranks:
//   1. ce_row_max      -> rowmax (N,)          then all-reduce MAX over TP
//   2. ce_partials     -> partials (N, 3)      then all-reduce SUM over TP
//   3. ce_loss         -> loss (N,), lse (N,)  (same on every TP rank)
//   4. ce_backward     -> dlogits (N, Vl)
// Rows whose target is ignore_index have loss 0 and gradient 0.

// rowmax (N,) = max over the Vvalid real local columns of logits (N, Vl);
// -INFINITY when Vvalid == 0.
void backend_ce_row_max(struct backend *be, struct tensor rowmax, struct tensor logits,
                        int N, int Vl, int Vvalid);
// partials (N, 3): [0] sum_j exp(z_ij - rowmax_i), [1] z_{i,y_i} if this shard
// owns y_i else 0, [2] sum_j z_ij; all over the Vvalid real local columns.
// targets: (N,) I32 global ids.
void backend_ce_partials(struct backend *be, struct tensor partials, struct tensor logits,
                         struct tensor rowmax, struct tensor targets, int N, int Vl,
                         int Vvalid, int vocab_start);
// loss (N,) and lse (N,) from the globally reduced partials and rowmax;
// V is the global number of real classes.
void backend_ce_loss(struct backend *be, struct tensor loss, struct tensor lse,
                     struct tensor partials, struct tensor rowmax, struct tensor targets,
                     int N, int V, float smoothing, int ignore_index);
// dlogits (N, Vl) = scale * (exp(z - lse) - (1 - s) * onehot(y) - s / V) on
// real columns, 0 on padding columns and ignored rows. scale is d(loss)/d(row
// loss), e.g. 1 / (number of non-ignored targets in the global batch).
// dlogits may be logits (in place: the model's recompute modes), with the
// bits of separate buffers.
void backend_ce_backward(struct backend *be, struct tensor dlogits, struct tensor logits,
                         struct tensor lse, struct tensor targets, int N, int Vl, int Vvalid,
                         int vocab_start, int V, float smoothing, int ignore_index, double scale);

// ---- optimizer (Loshchilov & Hutter 2019, alg. 2; torch.optim.AdamW) ------

// One AdamW step on n elements, with g = grad * grad_scale:
//   w = w * (1 - lr * weight_decay)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   w = w - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// with w the FP32 master weights when master.data != NULL (then param, FP32,
// BF16 or FP16, receives w rounded to its dtype), else param itself (FP32 or
// FP64: a BF16/FP16 param needs master weights).
// grad, m, v: FP32 (FP64 when param is FP64). step counts from 1.
void backend_adamw(struct backend *be, struct tensor param, struct tensor master,
                   struct tensor grad, struct tensor m, struct tensor v, size_t n, double lr,
                   double beta1, double beta2, double eps, double weight_decay, double grad_scale,
                   int step);

// ---- elementwise and reductions -------------------------------------------

// sum_i x_i^2 over n elements (any float dtype), accumulated in double; synchronizes.
double backend_sum_squares(struct backend *be, struct tensor x, size_t n);
// acc (1,) FP64 += sum_i x_i over x (n,), accumulated in double (the CPU
// backend adds in index order; the CUDA backend in a fixed tree order, so the
// two differ in the last bits of a double). x: FP32 or FP64 on the CPU
// backend, FP32, BF16 or FP16 on the CUDA backend. Stream-ordered: no
// synchronisation; read acc with backend_to_host. For the step's loss sum,
// kept on the device over the microbatches (src/model/model_pass.c).
void backend_sum_into(struct backend *be, struct tensor acc, struct tensor x, size_t n);
// out (n,) = a + b (out may alias a or b)
void backend_add(struct backend *be, struct tensor out, struct tensor a, struct tensor b, size_t n);
// dst (n,) = src (n,), converting dtype if they differ (round to nearest even
// when narrowing; FP64 to BF16/FP16 rounds through FP32 on the CPU backend).
// CPU: any pair of FP32, FP64, BF16, FP16; CUDA: any pair of FP32, BF16, FP16
// (through FP32, which holds BF16 and FP16 exactly: one rounding).
void backend_copy(struct backend *be, struct tensor dst, struct tensor src, size_t n);

// ---- FP8 (docs/design.md §5) -----------------------------------------------
// FP8 training's linear layers in the manner of NVIDIA Transformer Engine:
// each GEMM operand x gets a per-tensor scale s (FP32); it is cast as
// q = fp8(x * s) and the GEMM multiplies the FP8 values with FP32
// accumulation and scales the result by (1/s_a) * (1/s_b). Tensors' scales,
// scale inverses and amaxes live in backend memory so that no op waits for
// the host. The CPU backend is the reference: every FP8 value is exactly a
// BF16 value, so it computes on those exactly; the CUDA backend uses
// cuBLASLt's FP8 matmul and must match it within FP32 accumulation order.

// Largest finite magnitude of an FP8 dtype: 448 (E4M3), 57344 (E5M2).
float fp8_max_finite(enum dtype fp8);

// amax (1,) FP32 = max(amax, max_i |x_i|) over x (n,) FP32, BF16 or FP16.
// A NaN in x makes amax NaN; an infinity makes it inf. Stream-ordered.
void backend_fp8_amax(struct backend *be, struct tensor amax, struct tensor x, size_t n);
// out (n,) FP8_E4M3 or FP8_E5M2 = fp8(x_i * scale[0]): x (n,) FP32, BF16 or
// FP16 loaded to FP32, the product rounded once in FP32, then rounded to the
// format to nearest even, saturating: a finite product beyond the format's
// max becomes +-max; NaN becomes NaN of its sign (S.1111.111 / S.11111.11)
// and +-inf becomes NaN (E4M3, S.1111.111) or +-inf (E5M2) so that the
// GEMM's output and the step's non-finite check see it (a product that
// overflows FP32 is an inf). The scalar conversions: kernels/cpu/fp8.h,
// checked bit for bit against torch's float8 types (tests/unit/test_fp8.c).
// scale (1,) FP32. amax (1,) FP32, optional (numel 0: skipped) = max(amax,
// max_i |x_i|) as fp8_amax (the fused amax of delayed scaling). saturated
// (1,) I64, optional (numel 0: skipped) += the number of finite x_i that
// saturation clipped: whose |x_i * scale| rounds (to nearest even, as if the
// format went on) beyond the format's max: > 464 for E4M3 (480 - 16: the tie
// rounds to even 448), >= 61440 for E5M2 (the tie rounds to even 65536);
// fp8_clips in kernels/cpu/fp8.h. A product that rounds to max itself is not
// counted (current scaling maps the amax to about max). Stream-ordered.
void backend_fp8_cast(struct backend *be, struct tensor out, struct tensor amax,
                      struct tensor saturated, struct tensor x, struct tensor scale, size_t n);
// Scales of n tensors from their amaxes (Transformer Engine's
// DelayedScaling, transformer_engine/pytorch/fp8.py _default_sf_compute):
// scale, scale_inv, amax (n,) FP32; history (n, len) FP32, row i tensor i's
// amaxes, newest first. For each i: if len > 0, history row i shifts by one
// (the oldest drops) and history[i][0] = amax[i]; a = amax[i] if len == 0 or
// most_recent, else the max over history row i (as fmaxf: a NaN entry is
// passed over unless all are NaN, as TE's kernel). If a is finite and > 0,
// scale[i] = (fp8_max / a) / 2^margin (FP32, in that order; FLT_MAX where
// that overflows, a tiny a, as TE's compute_scale_from_amax), else scale[i]
// is kept; scale_inv[i] = 1 / scale[i]; amax[i] = 0 for the next
// accumulation. fp8_max: fp8_max_finite of the tensors' format. len 0 is
// current scaling (history unused, numel may be 0). Stream-ordered.
void backend_fp8_update_scale(struct backend *be, struct tensor scale, struct tensor scale_inv,
                              struct tensor history, struct tensor amax, int n, int len,
                              float fp8_max, int margin, bool most_recent);
// out (M, N) = (scale_inv_a[0] * scale_inv_b[0]) * (op(a) @ op(b)) + beta * out,
// the FP8 GEMM: a (M, K) or its transpose, b (K, N) or its transpose, each
// FP8_E4M3 or FP8_E5M2 (not both E5M2, as cuBLASLt), row-major as
// backend_matmul; products and sums in FP32 (the CPU backend computes on the
// FP8 values' exact BF16 images), the FP32 sum multiplied by the FP32 product
// of the scale inverses, beta * out added (one FMA: fmaf(beta, out, s *
// sum); out is not read when beta is 0), then rounded once to out's dtype
// (BF16 or FP32; FP32 out with beta = 1: weight gradients). scale_inv_a,
// scale_inv_b (1,) FP32 in backend memory. Reference: cuBLASLt's FP8 matmul
// (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER), D = scale_a *
// scale_b * (A @ B) + beta * C.
void backend_matmul_fp8(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                        struct tensor scale_inv_a, struct tensor scale_inv_b, int M, int N, int K,
                        bool trans_a, bool trans_b, float beta);

// ---- mixture of experts (src/model/moe.h) -----------------------------------
// The pieces of a token-choice MoE layer around its expert GEMMs (which are
// backend_matmul calls, one per expert over its contiguous rows): routing,
// the stable counting sort of (token, slot) assignments by expert
// (dispatch), the gather of token rows into expert order (permute) and the
// weighted sum back into token order (combine), each with its backward.
// Shapes: N tokens, C width, E experts, k experts per token; an assignment
// a = t k + j is token t's j-th choice. "st" below is the statistics dtype
// of the layer's storage dtype (ops.h conventions: FP32, FP64 for FP64).
// Reference implementations: transformers 4.46.3 MixtralSparseMoeBlock and
// Qwen2MoeSparseMoeBlock (softmax in FP32, top-k, optional renormalisation,
// index_add_ of the weighted expert outputs); Megatron-Core's
// moe_utils.permute / unpermute for the sorted layout and token dropping.
// Index tensors (topk_idx, dest, src) live in backend memory and are
// trusted (values not checked).

// Softmax top-k routing of N tokens (Mixtral, arXiv 2401.04088 §2.1; Shazeer
// et al. 2017): logits (N, E) st ->
//   probs (N, E) st   = softmax over E, computed as exp(l - max) / sum;
//   lse (N,) st       = logsumexp of the row (the router z-loss's term);
//   topk_idx (N, k) I32 = the k experts of largest key probs[t, e] +
//                       sel_bias[e], in descending key order, ties to the
//                       lower index (torch.topk's order on distinct values);
//   topk_w (N, k) st  = probs[t, topk_idx[t, j]], divided by their sum when
//                       renorm (Mixtral; Qwen2-MoE norm_topk_prob);
//   stats (E + 1,) FP64 = [e] sum_t probs[t, e], [E] sum_t lse[t]^2 (the
//                       load-balancing loss's P and the z-loss's sum; each
//                       in a fixed order: the same bits run to run).
// sel_bias (E,) st, optional (numel 0: none): biases the choice, not the
// weights (DeepSeek-V3's auxiliary-loss-free balancing bias, arXiv
// 2412.19437 §2.1.2; also trident's test hook that forces routing).
// 1 <= k <= E.
void backend_moe_route(struct backend *be, struct tensor probs, struct tensor lse,
                       struct tensor topk_idx, struct tensor topk_w, struct tensor stats,
                       struct tensor logits, struct tensor sel_bias, int N, int E, int k,
                       bool renorm);
// dlogits (N, E) st = the gradient through the softmax of
//   sum_{t,j} dtopk_w[t, j] topk_w[t, j]  +  sum_{t,e} aux_w[e] probs[t, e]
//   + (z_scale / 2) sum_t lse[t]^2,
// topk_w as backend_moe_route made it from probs and topk_idx (renorm: the
// quotient's gradient, ds_j = (dw_j - sum_m dw_m w_m) / sum_m s_m). With
// dp = d/dprobs: dlogits = p (dp - sum_e p_e dp_e) + z_scale lse p.
// aux_w (E,) st, optional (numel 0: no term): the load-balancing loss's
// d/dprobs[t, e] (src/model/moe.h: coeff E f_e / N); z_scale: d(loss)/d(sum
// lse^2) * 2 (coeff 2 / N for the z-loss's mean). dtopk_w (N, k) st.
void backend_moe_route_backward(struct backend *be, struct tensor dlogits, struct tensor dtopk_w,
                                struct tensor probs, struct tensor lse, struct tensor topk_idx,
                                struct tensor aux_w, int N, int E, int k, bool renorm,
                                float z_scale);
// The dispatch plan: a stable counting sort of the N k assignments by expert
// (token order within an expert), with an optional capacity per expert
// (Switch Transformer, arXiv 2101.03961 §2.2: an expert's tokens past its
// capacity are dropped, in token order; capacity <= 0: dropless).
// topk_idx (N k,) I32 -> counts (2 E,) I32: [e] the assignments expert e
// keeps (min(routed, capacity)), [E + e] those routed to it; dest (N k,)
// I32: the row of assignment a in expert order (experts one after another,
// rows offset_e = sum_{e' < e} counts[e']), -1 when dropped; src (N k,) I32:
// for a row r < M = sum_e counts[e], the assignment there (dest[src[r]] =
// r), -1 for r >= M.
void backend_moe_dispatch(struct backend *be, struct tensor counts, struct tensor dest,
                          struct tensor src, struct tensor topk_idx, int N, int E, int k,
                          int capacity);
// xp (M, C) row r = x (N, C) row src[r] / k: the tokens in expert order.
// x, xp: one float storage dtype.
void backend_moe_permute(struct backend *be, struct tensor xp, struct tensor x, struct tensor src,
                         int M, int C, int k);
// dx (N, C) += row t: the sum over the kept j of dxp row dest[t k + j] (the
// permute's gradient, gathered per token: no atomics, one order). BF16/FP16
// dx: the sum in FP32, added and rounded once.
void backend_moe_permute_backward(struct backend *be, struct tensor dx, struct tensor dxp,
                                  struct tensor dest, int N, int C, int k);
// y (N, C) =, or += when accumulate, row t: sum over the kept j of g(w[t k +
// j]) yp row r(t k + j), in slot order, summed in FP32 and rounded once;
// r(a) = dest[a] (skipped when -1), or a itself when dest is empty (numel 0:
// yp has N k rows). g: the identity (routing weights), or the logistic
// sigmoid when sigmoid (Qwen2-MoE's shared-expert gate, k = 1). A token
// with every slot dropped gets 0 (=) or is left as it was (+=). w (N k,) st;
// y, yp: one float storage dtype.
void backend_moe_combine(struct backend *be, struct tensor y, struct tensor yp, struct tensor w,
                         struct tensor dest, int N, int C, int k, bool sigmoid, bool accumulate);
// The combine's gradients given dy (N, C): dyp row r(a) = g(w[a]) dy row
// a / k for every kept a (rows no kept a names are not written);
// dw (N k,) st = g'(w[a]) sum_c dy[a / k, c] yp[r(a), c], 0 for a dropped a.
void backend_moe_combine_backward(struct backend *be, struct tensor dyp, struct tensor dw,
                                  struct tensor dy, struct tensor yp, struct tensor w,
                                  struct tensor dest, int N, int C, int k, bool sigmoid);

// ---- profile ----------------------------------------------------------------

// When on, every op wrapper synchronizes the backend and adds its wall time and
// call count to a per-op table (for `make bench`'s breakdown). Off by default.
void backend_profile_enable(struct backend *be, bool on);
// Prints "op  calls  seconds  share" rows, slowest first, to f.
void backend_profile_print(struct backend *be, FILE *f);

#endif
