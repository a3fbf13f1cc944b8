// cuda_attention_cudnn.cu: causal grouped-query attention through cuDNN's
// fused flash attention, built with cuDNN 9's graph (backend) API from C-style
// code (no C++ frontend), and the choice between it and the native kernels of
// cuda_attention.cu ([system] attention = auto | cudnn | native).
//
// The graphs are the operation graphs the cuDNN frontend's composite SDPA
// nodes lower to (cudnn-frontend, include/cudnn_frontend/node/
// scaled_dot_product_flash_attention.h, CompositeSDPANode and
// CompositeSDPABackwardNode; softmax.h; attn_score_modifiers.h for the causal
// mask); cuDNN's runtime-fusion engines recognise them as flash attention
// (Dao 2023) and run them fused. Dims are cuDNN's (b, h, s, d); trident's
// layouts enter through strides, without copies:
//   q, out, dq, dout (B, T, H, D):   dims (B, H, T, D),   strides (T*H*D, D, H*D, 1)
//   k, v, dk, dv (B, T, Hkv, D):     dims (B, Hkv, T, D), strides (T*Hkv*D, D, Hkv*D, 1)
//   k^T (and v^T):                   dims (B, Hkv, D, T), strides (T*Hkv*D, D, 1, Hkv*D)
//   lse (B, H, T) FP32:              dims (B, H, T, 1),   strides (H*T, T, 1, 1)
// Query head h reads key/value head h / (H / Hkv) (cuDNN's GQA broadcast, the
// same grouping as ops.h).
//
// Forward: S = q k^T (FP32), S *= 1/sqrt(D), S = row >= col ? S : mask value
// (-inf from cuDNN 9.10, -FLT_MAX before: sdpa_mask_value),
// M = rowmax S, E = exp(S - M), Z = rowsum E, stats = M + log Z, P = E / Z
// (stored as the I/O dtype, as the engines require), out = P v.
// stats is the natural-log log-sum-exp of the scaled, masked score row: the
// same number as trident's lse (m + log l of cuda_attention.cu, log sum exp of
// kernels/cpu/cpu_attention.c), so it is written straight into lse and either
// backward pass (cuDNN's or the native one) can consume the other's forward.
// Backward (FlashAttention-2's, P recomputed from stats):
//   Dsum = rowsum(dO * O) (FP32 workspace), P = exp(mask(scale q k^T) - stats),
//   dV = P^T dO, dS = P * (dO v^T - Dsum) * scale, dK = dS^T q, dQ = dS k
// (dQ accumulated in an FP32 workspace, then converted). With H > Hkv, dK and
// dV are computed per query head and summed over each group (a reduction).
//
// Plans (operation graph -> heuristics mode A -> the first engine config that
// finalises) are built once per (B, T, H, Hkv, D, dtype, direction) and kept
// (CUDNN_PLANS, the oldest replaced when full; ring-attention chunk pairs,
// cuda_attention_cudnn_block.cu, are the same graphs with Tq != Tk, strided
// views and the causal mask optional: struct sdpa_key, cuda_attention_cudnn.cuh),
// so a training step after the
// first builds only a variant pack (the pointers) per call. A shape cuDNN
// cannot plan is remembered too, with cuDNN's status and the call that gave
// it, so `auto` tries it once and logs it once.
//
// Checked without a GPU: backend_cuda_attention_check_graph (test_ops_cuda)
// has the linked cuDNN validate and finalise every graph (no handle, no
// engines). Not yet checked: engine support, plans and the numbers
// (tests/gpu/run.sh step attention_cudnn, the day a GPU is lent).
#include "cuda_attention_cudnn.cuh"

#include <float.h>
#include <stdio.h>
#include <string.h>

struct cudnn_attention *cudnn_attn_state(struct cuda_backend *c) {
    if (!c->cudnn) {
        c->cudnn = (struct cudnn_attention *)xcalloc(1, sizeof *c->cudnn);
        c->cudnn->log = stderr;
    }
    return c->cudnn;
}

// ---- a graph under construction ------------------------------------------------
// Every helper is a no-op once a call failed: the first failure (status, and
// which call on which tensor or op) is what the caller reports.

struct graph {
    struct sdpa_plan *p;
    cudnnBackendDescriptor_t ops[GRAPH_OPS];
    int n_ops;
    int64_t next_uid;
    cudnnStatus_t st;
    char what[160];
};

static void graph_fail(struct graph *g, cudnnStatus_t s, const char *call, const char *name) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = s;
    snprintf(g->what, sizeof g->what, "%s (%s)", call, name);
}

#define GRAPH_TRY(g, stmt, name)                                               \
    do {                                                                       \
        if ((g)->st == CUDNN_STATUS_SUCCESS) {                                 \
            cudnnStatus_t s_ = (stmt);                                         \
            if (s_ != CUDNN_STATUS_SUCCESS) graph_fail(g, s_, #stmt, name);    \
        }                                                                      \
    } while (0)

static cudnnBackendDescriptor_t graph_new(struct graph *g, cudnnBackendDescriptorType_t type,
                                          const char *name) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->p->n_descs == GRAPH_DESCS) {
        graph_fail(g, CUDNN_STATUS_NOT_SUPPORTED, "GRAPH_DESCS too small", name);
        return NULL;
    }
    GRAPH_TRY(g, cudnnBackendCreateDescriptor(type, &d), name);
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    g->p->descs[g->p->n_descs++] = d;
    return d;
}

static void graph_set(struct graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                      cudnnBackendAttributeType_t type, int64_t count, const void *value,
                      const char *name) {
    GRAPH_TRY(g, cudnnBackendSetAttribute(d, attr, type, count, value), name);
}

static void graph_finalize(struct graph *g, cudnnBackendDescriptor_t d, const char *name) {
    GRAPH_TRY(g, cudnnBackendFinalize(d), name);
}

// A tensor of 4 dims. uid 0: a virtual (intermediate) tensor with a fresh uid;
// by_value: a host scalar passed at execution (dims and strides all 1).
static cudnnBackendDescriptor_t graph_tensor(struct graph *g, const char *name, cudnnDataType_t dt,
                                             const int64_t dim[4], const int64_t stride[4],
                                             int64_t uid, bool by_value) {
    cudnnBackendDescriptor_t t = graph_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    bool is_virtual = uid == 0;
    int64_t align = ATTN_ALIGN;
    if (is_virtual) uid = g->next_uid++;
    graph_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, name);
    graph_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, name);
    graph_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, name);
    graph_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, name);
    graph_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, name);
    graph_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, name);
    if (by_value) graph_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, name);
    graph_finalize(g, t, name);
    return t;
}

// A virtual tensor (d0, d1, d2, d3), packed row-major.
static cudnnBackendDescriptor_t graph_virtual(struct graph *g, const char *name, cudnnDataType_t dt,
                                              int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    int64_t dim[4] = {d0, d1, d2, d3};
    int64_t stride[4] = {d1 * d2 * d3, d2 * d3, d3, 1};
    return graph_tensor(g, name, dt, dim, stride, 0, false);
}

// A host FP32 scalar passed by value (uid: its slot in the variant pack).
static cudnnBackendDescriptor_t graph_scalar(struct graph *g, const char *name, int64_t uid) {
    int64_t one[4] = {1, 1, 1, 1};
    return graph_tensor(g, name, CUDNN_DATA_FLOAT, one, one, uid, true);
}

static void graph_add_op(struct graph *g, cudnnBackendDescriptor_t op, const char *name) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (g->n_ops == GRAPH_OPS) {
        graph_fail(g, CUDNN_STATUS_NOT_SUPPORTED, "GRAPH_OPS too small", name);
        return;
    }
    g->ops[g->n_ops++] = op;
}

// y = mode(x[, b][, t]) elementwise, computed in `compute` (broadcasting b and
// t over y's dims); axis >= 0: GEN_INDEX's axis.
static void graph_pointwise(struct graph *g, const char *name, cudnnPointwiseMode_t mode,
                            cudnnDataType_t compute, cudnnBackendDescriptor_t x,
                            cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                            cudnnBackendDescriptor_t y, int64_t axis) {
    cudnnBackendDescriptor_t pw = graph_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    graph_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name);
    graph_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, name);
    if (axis >= 0) graph_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, name);
    graph_finalize(g, pw, name);
    cudnnBackendDescriptor_t op = graph_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    if (b) graph_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, name);
    if (t) graph_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    graph_finalize(g, op, name);
    graph_add_op(g, op, name);
}

// c = a @ b over the last two dims, batched (broadcast) over the first two;
// FP32 compute.
static void graph_matmul(struct graph *g, const char *name, cudnnBackendDescriptor_t a,
                         cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = graph_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    graph_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, name);
    graph_finalize(g, mm, name);
    cudnnBackendDescriptor_t op = graph_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, name);
    graph_finalize(g, op, name);
    graph_add_op(g, op, name);
}

// y = reduce(x) over the dims where y has extent 1 (or a divisor of x's:
// the GQA head sums); FP32 compute.
static void graph_reduce(struct graph *g, const char *name, cudnnReduceTensorOp_t mode,
                         cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t red = graph_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    graph_set(g, red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, name);
    graph_set(g, red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, name);
    graph_finalize(g, red, name);
    cudnnBackendDescriptor_t op = graph_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red, name);
    graph_finalize(g, op, name);
    graph_add_op(g, op, name);
}

// y = x seen through y's dims and strides (a transpose without a copy).
static void graph_reshape(struct graph *g, const char *name, cudnnBackendDescriptor_t x,
                          cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = graph_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name);
    graph_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name);
    graph_finalize(g, op, name);
    graph_add_op(g, op, name);
}

// S (B, H, T, T) with the causal mask applied: S where row >= col, else the
// mask value (sdpa_mask_value) passed by value at execution. As cudnn-frontend
// lowers its causal mask before cuDNN 9.21 (commit 3929da2e,
// include/cudnn_frontend/node/diagonal_band_mask.h,
// CompositeDiagonalBandMaskNode::expand_node, reached from
// utils/attn_score_modifiers.h causal_mask -> sliding_window_mask with right
// bound 0, top-left aligned): GEN_INDEX on axes 2 and 3 with INT32 outputs and
// no compute type of their own, so the graph context's compute type (FLOAT in
// an SDPA graph; graph_properties.h fill_from_context) is their math
// precision; CMP_GE computed in BOOLEAN; BINARY_SELECT in the context's
// FLOAT. The engines match these patterns: an INT32 math precision on the
// index generators is a graph the frontend never builds.
// (B, H, Tq, Tk) scores of a chunk pair (Tq = Tk) keep the same top-left diagonal.
static cudnnBackendDescriptor_t graph_causal_mask(struct graph *g, cudnnBackendDescriptor_t s,
                                                  cudnnBackendDescriptor_t neg_inf, int64_t B,
                                                  int64_t H, int64_t Tq, int64_t Tk) {
    cudnnBackendDescriptor_t row = graph_virtual(g, "row index", CUDNN_DATA_INT32, B, H, Tq, Tk);
    cudnnBackendDescriptor_t col = graph_virtual(g, "col index", CUDNN_DATA_INT32, B, H, Tq, Tk);
    cudnnBackendDescriptor_t keep = graph_virtual(g, "row >= col", CUDNN_DATA_BOOLEAN, B, H, Tq, Tk);
    cudnnBackendDescriptor_t out = graph_virtual(g, "masked scores", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    graph_pointwise(g, "gen row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    graph_pointwise(g, "gen col index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    graph_pointwise(g, "row >= col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    graph_pointwise(g, "causal select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep,
                    out, -1);
    return out;
}

// The value masked scores take, for the cuDNN library loaded at run time
// (cudnnGetVersion(), e.g. 91000 for 9.10.0): the lowest finite float
// (-FLT_MAX) before cuDNN 9.10, -inf from 9.10 on, as cudnn-frontend's
// get_negative_inf_value (commit 3929da2e, include/cudnn_frontend/utils/
// attn_score_modifiers.h: "older cuDNN version prefers lowest for softmax
// mask") chooses for every mask of its SDPA graphs.
static float sdpa_mask_value(size_t cudnn_version) {
    return cudnn_version < 91000 ? -FLT_MAX : -INFINITY;
}
float cudnn_mask_value(void) { return sdpa_mask_value(cudnnGetVersion()); }

static cudnnDataType_t cudnn_dtype(enum dtype dt) {
    return dt == DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// The tensors the plans bind, in trident's layouts (see the file comment):
// inputs with the row strides of their tensors (TQ, TK rows a batch row),
// outputs packed (Tq, Tk); key->Tq = Tk = TQ = TK = T for whole sequences.
struct sdpa_tensors {
    cudnnBackendDescriptor_t q, kt, vt, k, v, o, stats, scale, neg_inf;
};

static void graph_inputs(struct graph *g, const struct sdpa_key *k, struct sdpa_tensors *t) {
    int64_t B = k->B, Tq = k->Tq, Tk = k->Tk, TQ = k->TQ, TK = k->TK, H = k->H, Hkv = k->Hkv, D = k->D;
    cudnnDataType_t io = cudnn_dtype(k->dt);
    int64_t TO = k->backward ? TQ : Tq; // out and lse: backward inputs, forward outputs
    int64_t qdim[4] = {B, H, Tq, D}, qstr[4] = {TQ * H * D, D, H * D, 1}, ostr[4] = {TO * H * D, D, H * D, 1};
    int64_t kdim[4] = {B, Hkv, Tk, D}, kstr[4] = {TK * Hkv * D, D, Hkv * D, 1};
    int64_t ktdim[4] = {B, Hkv, D, Tk}, ktstr[4] = {TK * Hkv * D, D, 1, Hkv * D};
    int64_t sdim[4] = {B, H, Tq, 1}, sstr[4] = {H * TO, TO, 1, 1};
    t->q = graph_tensor(g, "q", io, qdim, qstr, UID_Q, false);
    t->kt = graph_tensor(g, "k^T", io, ktdim, ktstr, UID_K, false);
    t->vt = k->backward ? graph_tensor(g, "v^T", io, ktdim, ktstr, UID_V, false) : NULL;
    t->v = k->backward ? NULL : graph_tensor(g, "v", io, kdim, kstr, UID_V, false);
    t->k = k->backward ? graph_tensor(g, "k", io, kdim, kstr, 0, false) : NULL; // reshape of k^T
    t->o = graph_tensor(g, "out", io, qdim, ostr, UID_O, false);
    t->stats = graph_tensor(g, "lse", CUDNN_DATA_FLOAT, sdim, sstr, UID_STATS, false);
    t->scale = graph_scalar(g, "scale", UID_SCALE);
    t->neg_inf = k->causal ? graph_scalar(g, "-inf", UID_NEG_INF) : NULL;
}

static void graph_forward(struct graph *g, const struct sdpa_key *k) {
    int64_t B = k->B, Tq = k->Tq, Tk = k->Tk, H = k->H;
    struct sdpa_tensors t;
    graph_inputs(g, k, &t);
    cudnnBackendDescriptor_t s = graph_virtual(g, "q k^T", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t ss = graph_virtual(g, "scaled", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    graph_matmul(g, "bmm1 q k^T", t.q, t.kt, s);
    graph_pointwise(g, "attn scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, t.scale, NULL, ss, -1);
    cudnnBackendDescriptor_t sm = k->causal ? graph_causal_mask(g, ss, t.neg_inf, B, H, Tq, Tk) : ss;
    cudnnBackendDescriptor_t m = graph_virtual(g, "row max", CUDNN_DATA_FLOAT, B, H, Tq, 1);
    cudnnBackendDescriptor_t sub = graph_virtual(g, "s - max", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t e = graph_virtual(g, "exp", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t z = graph_virtual(g, "row sum", CUDNN_DATA_FLOAT, B, H, Tq, 1);
    cudnnBackendDescriptor_t logz = graph_virtual(g, "log sum", CUDNN_DATA_FLOAT, B, H, Tq, 1);
    cudnnBackendDescriptor_t p = graph_virtual(g, "softmax", cudnn_dtype(k->dt), B, H, Tq, Tk);
    graph_reduce(g, "max", CUDNN_REDUCE_TENSOR_MAX, sm, m);
    graph_pointwise(g, "sub max", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sm, m, NULL, sub, -1);
    graph_pointwise(g, "exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, e, -1);
    graph_reduce(g, "sum", CUDNN_REDUCE_TENSOR_ADD, e, z);
    graph_pointwise(g, "log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, z, NULL, NULL, logz, -1);
    graph_pointwise(g, "stats = max + log sum", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, m, logz, NULL,
                    t.stats, -1);
    graph_pointwise(g, "div", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, z, NULL, p, -1);
    graph_matmul(g, "bmm2 p v", p, t.v, t.o);
}

static void graph_backward(struct graph *g, const struct sdpa_key *k) {
    int64_t B = k->B, Tq = k->Tq, Tk = k->Tk, TQ = k->TQ, H = k->H, Hkv = k->Hkv, D = k->D;
    cudnnDataType_t io = cudnn_dtype(k->dt);
    struct sdpa_tensors t;
    graph_inputs(g, k, &t);
    // dout: an input (TQ rows); dq, dk, dv, Dsum, the dq accumulator: packed outputs
    int64_t qdim[4] = {B, H, Tq, D}, qstr[4] = {TQ * H * D, D, H * D, 1}, dqstr[4] = {Tq * H * D, D, H * D, 1};
    int64_t kdim[4] = {B, Hkv, Tk, D}, kstr[4] = {Tk * Hkv * D, D, Hkv * D, 1};
    int64_t sdim[4] = {B, H, Tq, 1}, sstr[4] = {H * Tq, Tq, 1, 1};
    int64_t accstr[4] = {H * Tq * D, Tq * D, D, 1};
    int64_t tdim[4] = {B, H, Tk, Tq}, tstr[4] = {H * Tq * Tk, Tq * Tk, 1, Tk}; // (s_kv, s_q) view of (s_q, s_kv)
    cudnnBackendDescriptor_t dout = graph_tensor(g, "dout", io, qdim, qstr, UID_DO, false);
    cudnnBackendDescriptor_t dq = graph_tensor(g, "dq", io, qdim, dqstr, UID_DQ, false);
    cudnnBackendDescriptor_t dk = graph_tensor(g, "dk", io, kdim, kstr, UID_DK, false);
    cudnnBackendDescriptor_t dv = graph_tensor(g, "dv", io, kdim, kstr, UID_DV, false);
    cudnnBackendDescriptor_t one = graph_scalar(g, "one", UID_ONE);
    cudnnBackendDescriptor_t dsum = graph_tensor(g, "sum dout*out", CUDNN_DATA_FLOAT, sdim, sstr, UID_DSUM, false);
    cudnnBackendDescriptor_t dq_acc =
        graph_tensor(g, "dq accumulator", CUDNN_DATA_FLOAT, qdim, accstr, UID_DQ_ACCUM, false);

    // Dsum = rowsum(dO * O)
    cudnnBackendDescriptor_t dodo = graph_virtual(g, "dout*out", CUDNN_DATA_FLOAT, B, H, Tq, D);
    cudnnBackendDescriptor_t dsum0 = graph_virtual(g, "rowsum dout*out", CUDNN_DATA_FLOAT, B, H, Tq, 1);
    graph_pointwise(g, "mul dout out", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, t.o, NULL, dodo, -1);
    graph_reduce(g, "reduce dout*out", CUDNN_REDUCE_TENSOR_ADD, dodo, dsum0);
    graph_pointwise(g, "dsum scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dsum0, one, NULL, dsum, -1);

    // P = exp(mask(scale q k^T) - stats)
    cudnnBackendDescriptor_t s = graph_virtual(g, "q k^T", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t ss = graph_virtual(g, "scaled", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t sub = graph_virtual(g, "s - lse", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    graph_matmul(g, "matmul q k^T", t.q, t.kt, s);
    graph_pointwise(g, "attn scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, t.scale, NULL, ss, -1);
    graph_pointwise(g, "sub lse", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, ss, t.stats, NULL, sub, -1);
    cudnnBackendDescriptor_t sm = k->causal ? graph_causal_mask(g, sub, t.neg_inf, B, H, Tq, Tk) : sub;
    cudnnBackendDescriptor_t p = graph_virtual(g, "p", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    graph_pointwise(g, "exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sm, NULL, NULL, p, -1);

    // dV = P^T dO (per query head, then summed over each group when H > Hkv)
    cudnnBackendDescriptor_t pt = graph_tensor(g, "p^T", io, tdim, tstr, 0, false);
    graph_reshape(g, "reshape p", p, pt);
    if (H == Hkv) {
        graph_matmul(g, "matmul p^T dout", pt, dout, dv);
    } else {
        cudnnBackendDescriptor_t dvh = graph_virtual(g, "dv per head", io, B, H, Tk, D);
        graph_matmul(g, "matmul p^T dout", pt, dout, dvh);
        graph_reduce(g, "sum dv over the group", CUDNN_REDUCE_TENSOR_ADD, dvh, dv);
    }

    // dS = P * (dO v^T - Dsum) * scale
    cudnnBackendDescriptor_t dp = graph_virtual(g, "dout v^T", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t dps = graph_virtual(g, "dp - dsum", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t ds0 = graph_virtual(g, "p (dp - dsum)", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    cudnnBackendDescriptor_t ds = graph_virtual(g, "ds", CUDNN_DATA_FLOAT, B, H, Tq, Tk);
    graph_matmul(g, "matmul dout v^T", dout, t.vt, dp);
    graph_pointwise(g, "sub dsum", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, dsum, NULL, dps, -1);
    graph_pointwise(g, "mul p", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dps, p, NULL, ds0, -1);
    graph_pointwise(g, "ds scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds0, t.scale, NULL, ds, -1);

    // dK = dS^T q
    cudnnBackendDescriptor_t dst = graph_tensor(g, "ds^T", io, tdim, tstr, 0, false);
    graph_reshape(g, "reshape ds", ds, dst);
    if (H == Hkv) {
        graph_matmul(g, "matmul ds^T q", dst, t.q, dk);
    } else {
        cudnnBackendDescriptor_t dkh = graph_virtual(g, "dk per head", io, B, H, Tk, D);
        graph_matmul(g, "matmul ds^T q", dst, t.q, dkh);
        graph_reduce(g, "sum dk over the group", CUDNN_REDUCE_TENSOR_ADD, dkh, dk);
    }

    // dQ = dS k (FP32 accumulator, then dq)
    graph_reshape(g, "reshape k", t.kt, t.k);
    graph_matmul(g, "matmul ds k", ds, t.k, dq_acc);
    graph_pointwise(g, "dq from the accumulator", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_acc, NULL,
                    NULL, dq, -1);
}

// Operation graph -> heuristics (mode A) -> the first engine config whose
// plan finalises.
static void graph_plan(struct graph *g, cudnnHandle_t handle) {
    struct sdpa_plan *p = g->p;
    cudnnBackendDescriptor_t og = graph_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    graph_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
    graph_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops,
              "operation graph");
    graph_finalize(g, og, "operation graph");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = graph_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    graph_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "heuristics");
    graph_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    graph_finalize(g, heur, "heuristics");
    int64_t count = 0;
    GRAPH_TRY(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                          &count, NULL), "heuristics");
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (count <= 0) {
        graph_fail(g, CUDNN_STATUS_NOT_SUPPORTED, "heuristics mode A", "no engine config for this graph");
        return;
    }
    if (count > ENGINE_CONFIGS) count = ENGINE_CONFIGS;
    cudnnBackendDescriptor_t cfg[ENGINE_CONFIGS];
    for (int64_t i = 0; i < count; i++) cfg[i] = graph_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
    int64_t got = 0;
    GRAPH_TRY(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          count, &got, cfg), "heuristics results");
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < got && i < count; i++) {
        cudnnBackendDescriptor_t plan = graph_new(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        graph_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "execution plan");
        graph_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i],
                  "execution plan");
        if (g->st != CUDNN_STATUS_SUCCESS) return;
        last = cudnnBackendFinalize(plan); // an engine that cannot run this graph: try the next
        if (last != CUDNN_STATUS_SUCCESS) continue;
        int64_t n = 0;
        GRAPH_TRY(g, cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                              &n, &p->workspace), "workspace size");
        p->plan = plan;
        return;
    }
    graph_fail(g, last, "cudnnBackendFinalize(execution plan)", "no engine config finalised");
}

static void plan_release(struct sdpa_plan *p) {
    for (int i = p->n_descs - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(p->descs[i]);
    memset(p, 0, sizeof *p);
}

bool cudnn_key_equal(const struct sdpa_key *a, const struct sdpa_key *b) {
    return a->B == b->B && a->Tq == b->Tq && a->Tk == b->Tk && a->TQ == b->TQ && a->TK == b->TK && a->H == b->H &&
           a->Hkv == b->Hkv && a->D == b->D && a->dt == b->dt && a->backward == b->backward &&
           a->causal == b->causal && a->block == b->block;
}

// The shape of key as the log and the errors name it: "forward B=8 T=2048
// H=16 Hkv=16 D=128 bf16" (whole sequence), "block forward B=1 Tq=4096
// Tk=4096 ..." (an attention_block call), "forward B=1 Tq=2048 Tk=2048 of
// 4096, 4096 rows causal H=..." (one chunk pair of a block).
static void key_shape(const struct sdpa_key *k, char *buf, size_t n) {
    const char *dir = k->backward ? "backward" : "forward";
    if (k->block)
        snprintf(buf, n, "block %s B=%d Tq=%d Tk=%d H=%d Hkv=%d D=%d %s", dir, k->B, k->Tq, k->Tk, k->H, k->Hkv,
                 k->D, dtype_name(k->dt));
    else if (k->Tq == k->Tk && k->TQ == k->Tq && k->TK == k->Tk && k->causal)
        snprintf(buf, n, "%s B=%d T=%d H=%d Hkv=%d D=%d %s", dir, k->B, k->Tq, k->H, k->Hkv, k->D, dtype_name(k->dt));
    else
        snprintf(buf, n, "%s B=%d Tq=%d Tk=%d of %d, %d rows %s H=%d Hkv=%d D=%d %s", dir, k->B, k->Tq, k->Tk, k->TQ,
                 k->TK, k->causal ? "causal" : "full", k->H, k->Hkv, k->D, dtype_name(k->dt));
}

// The plan of key, built on first use (a failed build is kept too, with why).
static struct sdpa_plan *plan_for(struct cudnn_attention *ca, const struct sdpa_key *key) {
    for (int i = 0; i < CUDNN_PLANS; i++)
        if (ca->plans[i].used && cudnn_key_equal(&ca->plans[i].key, key)) return &ca->plans[i];
    struct sdpa_plan *p = &ca->plans[ca->next];
    ca->next = (ca->next + 1) % CUDNN_PLANS;
    plan_release(p);
    p->used = true;
    p->key = *key;
    struct graph g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.next_uid = UID_VIRTUAL;
    if (key->backward) graph_backward(&g, key);
    else graph_forward(&g, key);
    graph_plan(&g, ca->handle);
    p->status = g.st;
    if (g.st != CUDNN_STATUS_SUCCESS) {
        char detail[128] = "";
        cudnnGetLastErrorString(detail, sizeof detail);
        snprintf(p->why, sizeof p->why, "%s: %s%s%s", g.what, cudnnGetErrorString(g.st), detail[0] ? "; " : "",
                 detail);
    }
    return p;
}

// Creates the cuDNN handle on the compute stream, once. On failure: in cudnn
// mode an error naming the key, the call and cuDNN's status; in auto mode one
// line on stderr, and attention stays on the native kernels.
static enum status cudnn_open(struct cuda_backend *c, struct error *err) {
    struct cudnn_attention *ca = cudnn_attn_state(c);
    if (ca->handle) return STATUS_OK;
    bool demand = c->attention == BACKEND_ATTENTION_CUDNN;
    if (ca->open_failed && !demand) return STATUS_OK;
    cudnnStatus_t s = cudnnCreate(&ca->handle);
    const char *call = "cudnnCreate";
    if (s == CUDNN_STATUS_SUCCESS) {
        call = "cudnnSetStream";
        s = cudnnSetStream(ca->handle, c->stream);
        if (s != CUDNN_STATUS_SUCCESS) cudnnDestroy(ca->handle);
    }
    if (s == CUDNN_STATUS_SUCCESS) return STATUS_OK;
    ca->handle = NULL;
    if (demand)
        return error_set(err, STATUS_RUNTIME, "system.attention = cudnn: %s on device %d: %s", call, c->device,
                         cudnnGetErrorString(s));
    if (!ca->open_failed && ca->log)
        fprintf(ca->log, "cuda backend: system.attention = auto: %s on device %d: %s; attention runs on the "
                         "native kernels\n", call, c->device, cudnnGetErrorString(s));
    ca->open_failed = true;
    return STATUS_OK;
}

// ---- the choice --------------------------------------------------------------------

static bool aligned(const void *ptr) { return ((uintptr_t)ptr % ATTN_ALIGN) == 0; }

// Whether cuDNN runs the attention of key with these tensor pointers: fills
// *plan_out when it does, else why (the reason the native kernels run: the
// mode native, FP32, cuDNN unusable, a shape cuDNN cannot plan with its
// status, a pointer not 16-byte aligned). In cudnn mode the last three are
// errors (STATUS_RUNTIME) naming the key, the value, the shape and cuDNN's
// status. Announcing is the caller's (cudnn_note_path). A block key (an
// attention_block call) is not planned: why stays "" when the mode, the dtype
// and cuDNN let its chunk pairs be tried (each pair's own key is then chosen).
enum status cudnn_choose(struct backend *be, const struct sdpa_key *key, void *const *ptrs, int n_ptrs,
                         struct sdpa_plan **plan_out, char *why, size_t why_size, struct error *err) {
    struct cuda_backend *c = cuda_state(be);
    *plan_out = NULL;
    why[0] = 0;
    if (c->attention == BACKEND_ATTENTION_NATIVE) {
        snprintf(why, why_size, "system.attention = native");
        return STATUS_OK;
    }
    if (key->dt == DTYPE_FP32) {
        snprintf(why, why_size, "fp32: cuDNN's attention takes bf16 and fp16");
        return STATUS_OK;
    }
    char shape[128];
    key_shape(key, shape, sizeof shape);
    bool demand = c->attention == BACKEND_ATTENTION_CUDNN;
    if (cudnn_open(c, err)) return err->status;
    if (!c->cudnn->handle) { // auto, cuDNN unusable: said once by cudnn_open
        snprintf(why, why_size, "cuDNN could not be opened");
        return STATUS_OK;
    }
    if (key->dt != DTYPE_BF16 && key->dt != DTYPE_FP16) {
        snprintf(why, why_size, "%s: cuDNN's attention takes bf16 and fp16", dtype_name(key->dt));
        if (!demand) return STATUS_OK;
        return error_set(err, STATUS_RUNTIME, "system.attention = cudnn: attention %s: cuDNN takes bf16 and fp16",
                         shape);
    }
    if (key->block) return STATUS_OK;
    struct sdpa_plan *p = plan_for(c->cudnn, key);
    if (p->status != CUDNN_STATUS_SUCCESS) {
        if (demand)
            return error_set(err, STATUS_RUNTIME, "system.attention = cudnn: cuDNN %d.%d cannot run attention %s: %s",
                             (int)(cudnnGetVersion() / 10000), (int)(cudnnGetVersion() / 100 % 100), shape, p->why);
        snprintf(why, why_size, "cuDNN %d.%d cannot run it: %s", (int)(cudnnGetVersion() / 10000),
                 (int)(cudnnGetVersion() / 100 % 100), p->why);
        return STATUS_OK;
    }
    for (int i = 0; i < n_ptrs; i++)
        if (!aligned(ptrs[i])) {
            if (demand)
                return error_set(err, STATUS_RUNTIME, "system.attention = cudnn: attention %s: tensor %d of the "
                                 "call is not %d-byte aligned (%p)", shape, i, ATTN_ALIGN, ptrs[i]);
            snprintf(why, why_size, "tensor %d of the call is not %d-byte aligned", i, ATTN_ALIGN);
            if (!p->warned_align && c->cudnn->log)
                fprintf(c->cudnn->log, "cuda backend: system.attention = auto: attention %s: a tensor is not "
                        "%d-byte aligned; using the native kernel for such calls\n", shape, ATTN_ALIGN);
            p->warned_align = true;
            return STATUS_OK;
        }
    *plan_out = p;
    return STATUS_OK;
}

// Records that a call of shape key ran on cuDNN (why NULL) or on the native
// kernels (why: the reason) for backend_attention_take_path, and the first
// time the shape runs, says so on the log: "attention: forward B=8 T=2048
// H=16 Hkv=16 D=128 bf16 -> cudnn" or "... -> native (REASON)".
void cudnn_note_path(struct cuda_backend *c, const struct sdpa_key *key, const char *why) {
    struct cudnn_attention *ca = cudnn_attn_state(c);
    ca->paths |= why ? BACKEND_ATTENTION_PATH_NATIVE : BACKEND_ATTENTION_PATH_CUDNN;
    for (int i = 0; i < ca->n_said; i++)
        if (cudnn_key_equal(&ca->said[i], key)) return;
    if (ca->n_said == SHAPES_SAID) return;
    ca->said[ca->n_said++] = *key;
    if (!ca->log) return;
    char shape[128];
    key_shape(key, shape, sizeof shape);
    fprintf(ca->log, "attention: %s -> %s%s%s%s\n", shape, why ? "native" : "cudnn", why ? " (" : "",
            why ? why : "", why ? ")" : "");
    fflush(ca->log);
}

// The plan of key for a call with these pointers (NULL: the native kernels),
// the path recorded and announced (cudnn_note_path); doc_mask: the call has a
// document mask, which the cuDNN graph does not take (native). Exits 1 in
// cudnn mode when cuDNN cannot run it.
static struct sdpa_plan *plan_of_call(struct backend *be, const struct sdpa_key *key, void *const *ptrs,
                                      int n_ptrs, bool doc_mask) {
    struct cuda_backend *c = cuda_state(be);
    struct sdpa_plan *p = NULL;
    char why[384];
    if (doc_mask) {
        snprintf(why, sizeof why, "document mask (data.packing = concat_reset): not in the cuDNN graph");
    } else {
        struct error err = {};
        if (cudnn_choose(be, key, ptrs, n_ptrs, &p, why, sizeof why, &err))
            fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s", err.msg);
    }
    cudnn_note_path(c, key, p ? NULL : why);
    return p;
}

// Runs plan p with the (uid, pointer) pairs and the workspace.
void cudnn_execute(struct backend *be, struct sdpa_plan *p, const int64_t *uids, void **ptrs, int n,
                   void *workspace, const char *what) {
    struct cuda_backend *c = cuda_state(be);
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    const char *call = "cudnnBackendCreateDescriptor(variant pack)";
    if (s == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute(variant pack)";
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
        if (s == CUDNN_STATUS_SUCCESS)
            s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
        if (s == CUDNN_STATUS_SUCCESS) call = "cudnnBackendFinalize(variant pack)", s = cudnnBackendFinalize(vp);
        if (s == CUDNN_STATUS_SUCCESS) call = "cudnnBackendExecute", s = cudnnBackendExecute(c->cudnn->handle, p->plan, vp);
    }
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (s != CUDNN_STATUS_SUCCESS) {
        char detail[128] = "";
        cudnnGetLastErrorString(detail, sizeof detail);
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "cuDNN attention %s: %s: %s %s", what, call,
                   cudnnGetErrorString(s), detail);
    }
}

// ---- entry points (cuda_internal.cuh) ------------------------------------------------

bool cuda_attention_cudnn_forward(struct backend *be, struct tensor out, struct tensor lse, struct tensor q,
                                  struct tensor k, struct tensor v, bool doc_mask, int B, int T, int H, int Hkv,
                                  int D) {
    if (B * T == 0) return false;
    struct sdpa_key key = sdpa_key_whole(B, T, H, Hkv, D, q.dtype, false);
    if (q.dtype != k.dtype || q.dtype != v.dtype || q.dtype != out.dtype) {
        cudnn_note_path(cuda_state(be), &key, "mixed dtypes");
        return false;
    }
    void *ptrs[] = {q.data, k.data, v.data, out.data, lse.data};
    struct sdpa_plan *p = plan_of_call(be, &key, ptrs, 5, doc_mask);
    if (!p) return false;
    float scale = (float)(1.0 / sqrt((double)D)), neg_inf = cudnn_mask_value();
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *vals[] = {q.data, k.data, v.data, out.data, lse.data, &scale, &neg_inf};
    void *ws = p->workspace ? cuda_scratch(be, (size_t)p->workspace) : NULL;
    cudnn_execute(be, p, uids, vals, 7, ws, "forward");
    return true;
}

bool cuda_attention_cudnn_backward(struct backend *be, struct tensor dq, struct tensor dk, struct tensor dv,
                                   struct tensor dout, struct tensor q, struct tensor k, struct tensor v,
                                   struct tensor out, struct tensor lse, bool doc_mask, int B, int T, int H,
                                   int Hkv, int D) {
    enum dtype dt = q.dtype;
    if (B * T == 0) return false;
    struct sdpa_key key = sdpa_key_whole(B, T, H, Hkv, D, dt, true);
    if (k.dtype != dt || v.dtype != dt || out.dtype != dt || dout.dtype != dt || dq.dtype != dt ||
        dk.dtype != dt || dv.dtype != dt) {
        cudnn_note_path(cuda_state(be), &key, "mixed dtypes");
        return false;
    }
    void *ptrs[] = {q.data, k.data, v.data, out.data, lse.data, dout.data, dq.data, dk.data, dv.data};
    struct sdpa_plan *p = plan_of_call(be, &key, ptrs, 9, doc_mask);
    if (!p) return false;
    // Workspace: cuDNN's, then Dsum (B, H, T) and the dq accumulator (B, H, T, D), FP32.
    size_t ws = ((size_t)p->workspace + 255) / 256 * 256;
    size_t dsum = (size_t)B * H * T * sizeof(float), acc = dsum * D;
    size_t dsum_pad = (dsum + 255) / 256 * 256;
    char *base = (char *)cuda_scratch(be, cuda_scratch_cudnn_backward(p->workspace, B, T, H, D));
    CHECK_CUDA(cudaMemsetAsync(base + ws + dsum_pad, 0, acc, cuda_stream(be))); // cuDNN < 9.6 accumulates
    float scale = (float)(1.0 / sqrt((double)D)), neg_inf = cudnn_mask_value(), one = 1.0f;
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
                      UID_SCALE, UID_NEG_INF, UID_ONE, UID_DSUM, UID_DQ_ACCUM};
    void *vals[] = {q.data, k.data, v.data, out.data, lse.data, dout.data, dq.data, dk.data, dv.data,
                    &scale, &neg_inf, &one, base + ws, base + ws + dsum_pad};
    cudnn_execute(be, p, uids, vals, 14, p->workspace ? base : NULL, "backward");
    return true;
}

void cuda_attention_cudnn_free(struct cuda_backend *c) {
    if (!c->cudnn) return;
    for (int i = 0; i < CUDNN_PLANS; i++) plan_release(&c->cudnn->plans[i]);
    if (c->cudnn->handle) cudnnDestroy(c->cudnn->handle);
    free(c->cudnn->pos_host);
    free(c->cudnn);
    c->cudnn = NULL;
}

// ---- backend_cuda.h -----------------------------------------------------------------

extern "C" enum status backend_cuda_set_attention(struct backend *be, enum backend_attention mode,
                                                  struct error *err) {
    struct cuda_backend *c = cuda_state(be);
    c->attention = mode;
    // cudnn: the handle now, so that a missing or broken cuDNN stops the run
    // before its first step; auto: at the first BF16/FP16 attention call.
    return mode == BACKEND_ATTENTION_CUDNN ? cudnn_open(c, err) : STATUS_OK;
}

extern "C" enum status backend_cuda_attention_uses_cudnn(struct backend *be, enum dtype dtype, int B, int T,
                                                         int H, int Hkv, int D, bool backward, bool *cudnn,
                                                         struct error *err) {
    struct sdpa_key key = sdpa_key_whole(B, T, H, Hkv, D, dtype, backward);
    struct sdpa_plan *p = NULL;
    char why[384];
    enum status s = cudnn_choose(be, &key, NULL, 0, &p, why, sizeof why, err);
    *cudnn = p != NULL;
    return s;
}

extern "C" void backend_cuda_set_attention_log(struct backend *be, FILE *log) {
    cudnn_attn_state(cuda_state(be))->log = log;
}

extern "C" unsigned backend_cuda_attention_take_path(struct backend *be) {
    struct cudnn_attention *ca = cudnn_attn_state(cuda_state(be));
    unsigned paths = ca->paths;
    ca->paths = 0;
    return paths;
}

// Builds key's graph and finalises the operation graph without a handle.
static enum status check_graph(const struct sdpa_key *key, struct error *err) {
    struct sdpa_plan *p = (struct sdpa_plan *)xcalloc(1, sizeof *p);
    struct graph g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.next_uid = UID_VIRTUAL;
    if (key->dt == DTYPE_BF16 || key->dt == DTYPE_FP16) {
        if (key->backward) graph_backward(&g, key);
        else graph_forward(&g, key);
    } else {
        graph_fail(&g, CUDNN_STATUS_NOT_SUPPORTED, "dtype", "cuDNN attention takes bf16 and fp16");
    }
    cudnnBackendDescriptor_t og = graph_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    graph_set(&g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.n_ops, g.ops,
              "operation graph");
    graph_finalize(&g, og, "operation graph");
    enum status s = STATUS_OK;
    if (g.st != CUDNN_STATUS_SUCCESS) {
        char detail[160] = "", shape[128];
        cudnnGetLastErrorString(detail, sizeof detail);
        key_shape(key, shape, sizeof shape);
        s = error_set(err, STATUS_RUNTIME, "cuDNN attention graph %s: %s: %s; %s", shape, g.what,
                      cudnnGetErrorString(g.st), detail);
    }
    plan_release(p);
    free(p);
    return s;
}

extern "C" enum status backend_cuda_attention_check_graph(enum dtype dtype, int B, int T, int H, int Hkv, int D,
                                                          bool backward, struct error *err) {
    struct sdpa_key key = sdpa_key_whole(B, T, H, Hkv, D, dtype, backward);
    return check_graph(&key, err);
}

extern "C" enum status backend_cuda_attention_check_block_graph(enum dtype dtype, int B, int Tq, int Tk, int TQ,
                                                                int TK, int H, int Hkv, int D, bool causal,
                                                                bool backward, struct error *err) {
    struct sdpa_key key = {B, Tq, Tk, TQ, TK, H, Hkv, D, dtype, backward, causal, false};
    return check_graph(&key, err);
}

size_t cuda_attention_cudnn_scratch(struct backend *be, const struct backend_bounds *b) {
    size_t need = 0;
    for (int bwd = 0; bwd < 2; bwd++) {
        struct sdpa_key key = sdpa_key_whole(b->B, b->T, b->H, b->Hkv, b->D, b->dtype, bwd != 0);
        struct sdpa_plan *p = NULL;
        struct error err = {};
        char why[384];
        if (cudnn_choose(be, &key, NULL, 0, &p, why, sizeof why, &err) || !p) continue;
        size_t ws = (size_t)p->workspace;
        need = MAX(need, bwd ? cuda_scratch_cudnn_backward(ws, b->B, b->T, b->H, b->D) : ws);
    }
    return need;
}
