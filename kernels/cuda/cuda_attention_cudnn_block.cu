// cuda_attention_cudnn_block.cu: one block of context-parallel ring attention
// (attention_block_forward / _backward, kernels/ops.h) as cuDNN fused
// attention calls per chunk pair, for BF16 and FP16 without a document mask
// ([system] attention = auto | cudnn; cuda_attention_cudnn.cu builds and
// plans the graphs). What cuDNN does not take runs on the native kernels of
// cuda_attention_block.cu.
//
// Under load-balanced context parallelism a rank's tokens are two runs of
// consecutive global positions (chunks r and 2 cp - 1 - r), so the rows of a
// block's queries and keys are a few runs, and each (query run, key run)
// pair is either unreadable (every key after every query: skipped), fully
// readable (every key at or before every query: a cuDNN call without a mask)
// or the same run (causal, top-left aligned: the causal graph). The host
// cannot know the runs (q_pos and k_pos are device tensors), so the first
// call with a pair of position tensors reads them back (one copy of B (Tq +
// Tk) ints and a wait on the compute stream, not the device), splits them
// into runs (at most BLOCK_RUNS a side, equal in every batch row, no negative
// position) and classifies the pairs; the layout is remembered by the two
// tensors' addresses and shapes (BLOCK_LAYOUTS), so later calls with them
// (the ring's: its position tensors are fixed) wait for nothing. Each call
// checks on the device that the positions still are the remembered runs
// (attention_block_verify_kernel, into a flag): the pair path's merges and
// adds run only if so, and the native kernels, enqueued behind them, only if
// not, so a tensor rewritten in place still gets the right answer (at the
// cost of the wasted cuDNN calls; the path is then recorded as cuDNN's). Any
// other overlap (a key run reaching into a query run), a document mask
// (q_doc) or a pair cuDNN cannot plan sends the whole call to the native
// kernels. A shape whose pairs cuDNN could not plan is remembered: later
// calls of that shape go native at once.
//
// Forward: each readable pair is one cuDNN SDPA forward on strided views (q
// rows [qa, qa + ql) of the (B, Tq, H, D) tensor: pointer + qa H D, batch
// stride Tq H D; likewise k, v) into packed scratch (o_pair (B, ql, H, D) in
// the I/O dtype, stats (B, H, ql) FP32), then merged into out and lse by the
// online-softmax rule (attention_block_merge_kernel). accumulate = false
// first sets out = 0, lse = -inf, so a row that no pair reaches reads out 0,
// lse -inf. Each merge rounds out once, so a query run with two readable key
// runs is rounded twice (the native kernels: once).
// Backward: each readable pair is one cuDNN SDPA backward (Dsum = rowsum(dout
// out) from the final out, P from the final lse: the pair's share of the
// gradients) into packed scratch, then added: dq += the pair's FP32 dq
// accumulator (one rounding), dk, dv += the pair's dk, dv (I/O dtype: two
// roundings). No device-wide synchronisation; a first read-back of a layout
// waits on the compute stream only.
//
// Not yet run on a GPU (none lent): the graphs of the chunk pairs are
// validated by the linked cuDNN without a device (test_ops_cuda,
// backend_cuda_attention_check_block_graph); the emulation's cuDNN has no
// engines, so there these calls decline and the native kernels run, except
// under TRIDENT_EMU_SDPA=1 (emulated build only): then a naive kernel computes
// each pair's SDPA as the cuDNN graph defines it (same views, same packed
// outputs, the FP32 dq accumulator), so that the layout, the views, the
// merges and the adds are checked against the CPU (test_ops_cuda).
#include "cuda_attention_cudnn.cuh"

#include <stdlib.h>
#include <string.h>

// Splits pos (n entries of batch row 0, n >= 1) into runs of consecutive
// positions; -1 when more than BLOCK_RUNS or a position is negative.
static int runs_of(const int32_t *pos, int n, struct pos_run *r) {
    int nr = 0;
    for (int i = 0; i < n; i++) {
        if (pos[i] < 0) return -1;
        if (i > 0 && pos[i] == pos[i - 1] + 1) {
            r[nr - 1].len++;
            continue;
        }
        if (nr == BLOCK_RUNS) return -1;
        r[nr].row = i, r[nr].pos = pos[i], r[nr].len = 1;
        nr++;
    }
    return nr;
}

// Reads q_pos (B, Tq) and k_pos (B, Tk) back and classifies the pairs into
// L; false with why when the block is not pairs of whole runs.
static bool block_layout_read(struct backend *be, struct tensor q_pos, struct tensor k_pos, int B, int Tq, int Tk,
                              struct block_layout *L, char *why, size_t why_size) {
    struct cudnn_attention *ca = cudnn_attn_state(cuda_state(be));
    size_t nq = (size_t)B * Tq, n = nq + (size_t)B * Tk;
    if (ca->pos_cap < n) {
        free(ca->pos_host);
        ca->pos_host = (int32_t *)xmalloc(n * sizeof(int32_t));
        ca->pos_cap = n;
    }
    int32_t *h = ca->pos_host;
    cudaStream_t st = cuda_stream(be);
    CHECK_CUDA(cudaMemcpyAsync(h, q_pos.data, nq * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaMemcpyAsync(h + nq, k_pos.data, (n - nq) * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    const int32_t *kp = h + nq;
    for (int b = 1; b < B; b++)
        if (memcmp(h, h + (size_t)b * Tq, Tq * sizeof(int32_t)) || memcmp(kp, kp + (size_t)b * Tk, Tk * sizeof(int32_t))) {
            snprintf(why, why_size, "positions differ across the batch");
            return false;
        }
    L->nq = runs_of(h, Tq, L->q), L->nk = runs_of(kp, Tk, L->k);
    if (L->nq < 0 || L->nk < 0) {
        snprintf(why, why_size, "positions are not %d runs or fewer a side", BLOCK_RUNS);
        return false;
    }
    L->np = 0;
    for (int i = 0; i < L->nq; i++)
        for (int j = 0; j < L->nk; j++) {
            const struct pos_run *a = &L->q[i], *c = &L->k[j];
            if (c->pos > a->pos + a->len - 1) continue; // every key after every query
            bool full = c->pos + c->len - 1 <= a->pos, same = c->pos == a->pos && c->len == a->len;
            if (!full && !same) {
                snprintf(why, why_size, "key run [%d, %d] overlaps query run [%d, %d] partially", c->pos,
                         c->pos + c->len - 1, a->pos, a->pos + a->len - 1);
                return false;
            }
            L->pairs[L->np].qr = i, L->pairs[L->np].kr = j, L->pairs[L->np].causal = !full;
            L->np++;
        }
    return true;
}

// The layout of a call with these position tensors: remembered, or read back
// now and remembered (whole-run pairs or not, with why).
static const struct block_layout_entry *layout_of(struct backend *be, struct tensor q_pos, struct tensor k_pos,
                                                  int B, int Tq, int Tk) {
    struct cudnn_attention *ca = cudnn_attn_state(cuda_state(be));
    for (int i = 0; i < ca->n_layouts; i++) {
        const struct block_layout_entry *e = &ca->layouts[i];
        if (e->q_pos == q_pos.data && e->k_pos == k_pos.data && e->B == B && e->Tq == Tq && e->Tk == Tk) return e;
    }
    struct block_layout_entry *e = &ca->layouts[ca->next_layout];
    ca->next_layout = (ca->next_layout + 1) % BLOCK_LAYOUTS;
    ca->n_layouts = MAX(ca->n_layouts, ca->next_layout == 0 ? BLOCK_LAYOUTS : ca->next_layout);
    memset(e, 0, sizeof *e);
    e->q_pos = q_pos.data, e->k_pos = k_pos.data, e->B = B, e->Tq = Tq, e->Tk = Tk;
    e->pairs_ok = block_layout_read(be, q_pos, k_pos, B, Tq, Tk, &e->L, e->why, sizeof e->why);
    return e;
}

// The runs of one side, by value for a kernel.
struct runs_arg {
    int n, row[BLOCK_RUNS], pos[BLOCK_RUNS], len[BLOCK_RUNS];
};
static struct runs_arg runs_arg_of(const struct pos_run *r, int n) {
    struct runs_arg a = {};
    a.n = n;
    for (int i = 0; i < n; i++) a.row[i] = r[i].row, a.pos[i] = r[i].pos, a.len[i] = r[i].len;
    return a;
}

// *mismatch := 1 if q_pos (B, Tq) or k_pos (B, Tk) is not the runs qa, ka
// (the caller zeroed it). Grid-stride over B (Tq + Tk) positions.
__global__ void attention_block_verify_kernel(int *mismatch, const int32_t *q_pos, const int32_t *k_pos, int B,
                                              int Tq, int Tk, struct runs_arg qa, struct runs_arg ka) {
    size_t nq = (size_t)B * Tq, n = nq + (size_t)B * Tk;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        bool key = e >= nq;
        const struct runs_arg &a = key ? ka : qa;
        int T = key ? Tk : Tq, i = (int)((key ? e - nq : e) % T), want = -1;
        for (int r = 0; r < a.n; r++)
            if (i >= a.row[r] && i < a.row[r] + a.len[r]) want = a.pos[r] + i - a.row[r];
        if ((key ? k_pos[e - nq] : q_pos[e]) != want) *mismatch = 1;
    }
}

// The cuDNN problem of pair i of L.
static struct sdpa_key pair_key(const struct block_layout *L, int i, int B, int Tq, int Tk, int H, int Hkv, int D,
                                enum dtype dt, bool backward) {
    struct sdpa_key k = {B, L->q[L->pairs[i].qr].len, L->k[L->pairs[i].kr].len, Tq, Tk, H, Hkv, D, dt, backward,
                         L->pairs[i].causal, false};
    return k;
}

static char *at(struct tensor t, size_t elems) { return (char *)t.data + elems * dtype_size(t.dtype); }
static size_t pad256(size_t n) { return (n + 255) / 256 * 256; }

#ifdef TRIDENT_CUDA_EMU
// TRIDENT_EMU_SDPA=1: the naive stand-in for cuDNN's pairs (file comment).
static bool emu_sdpa(void) {
    const char *e = getenv("TRIDENT_EMU_SDPA");
    return e && e[0] == '1';
}

// One pair's forward as the SDPA graph: q view (B, ql, H, D) of rows of TQ,
// k, v views (B, kl, Hkv, D) of rows of TK; o (B, ql, H, D) and stats (B, H,
// ql) packed. One thread a (b, h, i) row.
__global__ void emu_sdpa_forward_kernel(struct dptr o, float *stats, struct dptr q, struct dptr k, struct dptr v,
                                        int B, int ql, int kl, int TQ, int TK, int H, int Hkv, int D, float scale,
                                        bool causal) {
    size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= (size_t)B * H * ql) return;
    int i = (int)(r % ql), h = (int)(r / ql % H), b = (int)(r / ql / H), hk = h / (H / Hkv);
    size_t qi = (((size_t)b * TQ + i) * H + h) * D;
    int jn = causal ? min(kl, i + 1) : kl;
    float m = -INFINITY, l = 0, acc[256];
    for (int d = 0; d < D; d++) acc[d] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < jn; j++) {
            size_t kj = (((size_t)b * TK + j) * Hkv + hk) * D;
            float sc = 0;
            for (int d = 0; d < D; d++) sc += ld(q, qi + d) * ld(k, kj + d);
            sc *= scale;
            if (pass == 0) {
                m = fmaxf(m, sc);
                continue;
            }
            float p = expf(sc - m);
            l += p;
            for (int d = 0; d < D; d++) acc[d] += p * ld(v, kj + d);
        }
    size_t oi = (((size_t)b * ql + i) * H + h) * D;
    for (int d = 0; d < D; d++) st(o, oi + d, acc[d] / l);
    stats[((size_t)b * H + h) * ql + i] = m + logf(l);
}

// One pair's backward as the SDPA graph: q, out, dout views of rows of TQ,
// lse view (B, H, ql) of rows of TQ, k, v views of rows of TK; dq_acc (B, H,
// ql, D) FP32, dk, dv (B, kl, Hkv, D) packed. Threads [0, B H ql): dq rows;
// [B H ql, + B Hkv kl): dk, dv rows.
__global__ void emu_sdpa_backward_kernel(float *dq_acc, struct dptr dk, struct dptr dv, struct dptr q,
                                         struct dptr k, struct dptr v, struct dptr out, struct dptr dout,
                                         const float *lse, int B, int ql, int kl, int TQ, int TK, int H, int Hkv,
                                         int D, float scale, bool causal) {
    size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nq = (size_t)B * H * ql;
    int G = H / Hkv;
    float acc[256], acc2[256];
    for (int d = 0; d < D; d++) acc[d] = acc2[d] = 0;
    if (r < nq) {
        int i = (int)(r % ql), h = (int)(r / ql % H), b = (int)(r / ql / H), hk = h / G;
        size_t qi = (((size_t)b * TQ + i) * H + h) * D;
        float li = lse[((size_t)b * H + h) * TQ + i], dsum = 0;
        for (int d = 0; d < D; d++) dsum += ld(dout, qi + d) * ld(out, qi + d);
        for (int j = 0; j < (causal ? min(kl, i + 1) : kl); j++) {
            size_t kj = (((size_t)b * TK + j) * Hkv + hk) * D;
            float sc = 0, dp = 0;
            for (int d = 0; d < D; d++) sc += ld(q, qi + d) * ld(k, kj + d), dp += ld(dout, qi + d) * ld(v, kj + d);
            float p = expf(sc * scale - li), ds = p * (dp - dsum) * scale;
            for (int d = 0; d < D; d++) acc[d] += ds * ld(k, kj + d);
        }
        for (int d = 0; d < D; d++) dq_acc[(((size_t)b * H + h) * ql + i) * D + d] = acc[d];
    } else if (r < nq + (size_t)B * Hkv * kl) {
        r -= nq;
        int j = (int)(r % kl), hk = (int)(r / kl % Hkv), b = (int)(r / kl / Hkv);
        size_t kj = (((size_t)b * TK + j) * Hkv + hk) * D;
        for (int h = hk * G; h < (hk + 1) * G; h++)
            for (int i = causal ? j : 0; i < ql; i++) {
                size_t qi = (((size_t)b * TQ + i) * H + h) * D;
                float li = lse[((size_t)b * H + h) * TQ + i], dsum = 0, sc = 0, dp = 0;
                for (int d = 0; d < D; d++)
                    dsum += ld(dout, qi + d) * ld(out, qi + d), sc += ld(q, qi + d) * ld(k, kj + d),
                        dp += ld(dout, qi + d) * ld(v, kj + d);
                float p = expf(sc * scale - li), ds = p * (dp - dsum) * scale;
                for (int d = 0; d < D; d++) acc[d] += ds * ld(q, qi + d), acc2[d] += p * ld(dout, qi + d);
            }
        size_t ko = (((size_t)b * kl + j) * Hkv + hk) * D;
        for (int d = 0; d < D; d++) st(dk, ko + d, acc[d]), st(dv, ko + d, acc2[d]);
    }
}
#else
static bool emu_sdpa(void) { return false; }
#endif

// Whether cuDNN may take a block call at all (before reading its positions):
// the mode, the dtype, cuDNN opened, no document mask, not a shape already
// declined. Otherwise the path is noted native with the reason.
static bool block_eligible(struct backend *be, const struct sdpa_key *bkey, bool same_dtypes, bool doc_mask) {
    struct cuda_backend *c = cuda_state(be);
    char why[384] = "";
    struct sdpa_plan *none = NULL;
    struct error err = {};
    if (!same_dtypes) snprintf(why, sizeof why, "mixed dtypes");
    else if (doc_mask) snprintf(why, sizeof why, "document mask (q_doc): not in the cuDNN graph");
    else if (cudnn_choose(be, bkey, NULL, 0, &none, why, sizeof why, &err))
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s", err.msg);
    if (!why[0]) {
        struct cudnn_attention *ca = c->cudnn;
        for (int i = 0; i < ca->n_declined; i++)
            if (cudnn_key_equal(&ca->declined[i], bkey)) {
                snprintf(why, sizeof why, "cuDNN could not run a chunk pair of this shape");
                break;
            }
    }
    if (why[0]) cudnn_note_path(c, bkey, why);
    return !why[0];
}

// The plans of every pair of L for a call with these views (ptrs: n_ptrs
// pointers a pair, checked for alignment). NULL entries: cuDNN declines the
// call (noted native with why; a plan failure also remembers the shape).
// Exits 1 in cudnn mode when cuDNN cannot run a pair.
static bool block_plans(struct backend *be, const struct sdpa_key *bkey, const struct block_layout *L,
                        struct sdpa_plan **plans, void *const *ptrs, int n_ptrs, size_t *ws) {
    struct cuda_backend *c = cuda_state(be);
    *ws = 0;
    if (emu_sdpa()) { // the emulation's stand-in needs no plan
        for (int i = 0; i < L->np; i++) plans[i] = NULL;
        return true;
    }
    for (int i = 0; i < L->np; i++) {
        struct sdpa_key k = pair_key(L, i, bkey->B, bkey->Tq, bkey->Tk, bkey->H, bkey->Hkv, bkey->D, bkey->dt,
                                     bkey->backward);
        char why[384] = "";
        struct error err = {};
        if (cudnn_choose(be, &k, ptrs + (size_t)i * n_ptrs, n_ptrs, &plans[i], why, sizeof why, &err))
            fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s", err.msg);
        if (!plans[i]) {
            struct cudnn_attention *ca = c->cudnn;
            bool misaligned = strstr(why, "aligned") != NULL; // a property of the call, not of the shape
            if (!misaligned && ca->n_declined < SHAPES_SAID) ca->declined[ca->n_declined++] = *bkey;
            cudnn_note_path(c, bkey, why);
            return false;
        }
        *ws = MAX(*ws, (size_t)plans[i]->workspace);
    }
    return true;
}

// The pair path's kernels below do nothing when *mismatch (the positions
// are not the remembered runs: the native kernels run instead).

// out rows [qa, qa + ql) of (B, Tq, H, D), lse (B, H, Tq) := the online-
// softmax merge with a pair's (ob (B, ql, H, D), lb (B, H, ql)): one block a
// (b, i, h) row, threads over D. A row whose old lse is -inf takes the pair's.
__global__ void attention_block_merge_kernel(struct dptr out, float *lse, struct dptr ob, const float *lb, int Tq,
                                             int qa, int ql, int H, int D, const int *mismatch) {
    if (*mismatch) return;
    size_t row = blockIdx.x;
    int h = (int)(row % H), i = (int)(row / H % ql), b = (int)(row / H / ql);
    size_t li = ((size_t)b * H + h) * Tq + qa + i;
    float lo = lse[li], lk = lb[((size_t)b * H + h) * ql + i];
    __syncthreads(); // every thread has read lse before thread 0 writes it
    if (lk == -INFINITY) return;
    float mx = fmaxf(lo, lk), ea = expf(lo - mx), eb = expf(lk - mx), sum = ea + eb;
    float a = lo == -INFINITY ? 0.0f : ea / sum, c = eb / sum;
    size_t oo = (((size_t)b * Tq + qa + i) * H + h) * D, bo = (((size_t)b * ql + i) * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        st(out, oo + d, (a != 0 ? a * ld(out, oo + d) : 0.0f) + c * ld(ob, bo + d));
    if (threadIdx.x == 0) lse[li] = mx + logf(sum);
}

// dst rows [r0, r0 + rows) of (B, T, H, D) += src: packed (B, rows, H, D), or
// with bhtd (B, H, rows, D) (cuDNN's dq accumulator). FP32 sums, one rounding.
__global__ void attention_block_add_rows_kernel(struct dptr dst, struct dptr src, int B, int T, int r0, int rows,
                                                int H, int D, bool bhtd, const int *mismatch) {
    if (*mismatch) return;
    size_t n = (size_t)B * rows * H * D;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(e % D), h = (int)(e / D % H), i = (int)(e / D / H % rows), b = (int)(e / D / H / rows);
        size_t di = (((size_t)b * T + r0 + i) * H + h) * D + d;
        size_t si = bhtd ? (((size_t)b * H + h) * rows + i) * D + d : e;
        st(dst, di, ld(dst, di) + ld(src, si));
    }
}

// out (n16 elements of its dtype) := 0 and lse (nl floats) := -inf.
__global__ void attention_block_clear_kernel(struct dptr out, size_t no, float *lse, size_t nl,
                                             const int *mismatch) {
    if (*mismatch) return;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < no; e += stride) st(out, e, 0.0f);
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < nl; e += stride) lse[e] = -INFINITY;
}

// The position check of a call with layout L into a zeroed flag at the front
// of the scratch; returns the flag. The bytes it takes: CHECK_BYTES.
#define CHECK_BYTES 256
static int *block_check(struct backend *be, char *scratch, struct tensor q_pos, struct tensor k_pos, int B, int Tq,
                        int Tk, const struct block_layout *L) {
    int *flag = (int *)scratch;
    cudaStream_t st = cuda_stream(be);
    CHECK_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), st));
    size_t n = (size_t)B * (Tq + Tk);
    attention_block_verify_kernel<<<grid_for(n, 256), 256, 0, st>>>(flag, (const int32_t *)q_pos.data,
                                                                    (const int32_t *)k_pos.data, B, Tq, Tk,
                                                                    runs_arg_of(L->q, L->nq), runs_arg_of(L->k, L->nk));
    CHECK_LAUNCH();
    return flag;
}

// The layout of a call whose pairs cuDNN may run (L), or NULL: the path noted
// native with why. Reads the positions back on a layout's first call.
static const struct block_layout *block_layout_for(struct backend *be, const struct sdpa_key *bkey,
                                                   struct tensor q_pos, struct tensor k_pos) {
    const struct block_layout_entry *e = layout_of(be, q_pos, k_pos, bkey->B, bkey->Tq, bkey->Tk);
    if (e->pairs_ok) return &e->L;
    cudnn_note_path(cuda_state(be), bkey, e->why);
    return NULL;
}

bool cuda_attention_cudnn_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                        struct tensor q, struct tensor k, struct tensor v, struct tensor q_pos,
                                        struct tensor q_doc, struct tensor k_pos, int B, int Tq, int Tk, int H,
                                        int Hkv, int D, bool accumulate) {
    enum dtype dt = q.dtype;
    if ((size_t)B * Tq * Tk == 0) return false;
    struct sdpa_key bkey = {B, Tq, Tk, Tq, Tk, H, Hkv, D, dt, false, false, true};
    if (!block_eligible(be, &bkey, k.dtype == dt && v.dtype == dt && out.dtype == dt, q_doc.numel != 0))
        return false;
    const struct block_layout *Lp = block_layout_for(be, &bkey, q_pos, k_pos);
    if (!Lp) return false;
    const struct block_layout &L = *Lp;
    struct sdpa_plan *plans[BLOCK_RUNS * BLOCK_RUNS];
    void *ptrs[BLOCK_RUNS * BLOCK_RUNS][3];
    size_t qrow = (size_t)H * D, krow = (size_t)Hkv * D, ql_max = 0;
    for (int i = 0; i < L.np; i++) {
        const struct pos_run *a = &L.q[L.pairs[i].qr], *c = &L.k[L.pairs[i].kr];
        ptrs[i][0] = at(q, a->row * qrow), ptrs[i][1] = at(k, c->row * krow), ptrs[i][2] = at(v, c->row * krow);
        ql_max = MAX(ql_max, (size_t)a->len);
    }
    size_t ws;
    if (!block_plans(be, &bkey, &L, plans, &ptrs[0][0], 3, &ws)) return false;
    // scratch: the check's flag, cuDNN's workspace, the pair's out (I/O
    // dtype) and stats (FP32), the native kernels' (the fallback)
    size_t ob_bytes = pad256((size_t)B * ql_max * qrow * dtype_size(dt));
    size_t lb_bytes = pad256(sizeof(float) * (size_t)B * H * ql_max);
    char *base = (char *)cuda_scratch(be, CHECK_BYTES + pad256(ws) + ob_bytes + lb_bytes +
                                              cuda_scratch_attention_block(B, Tq, Tk, H, false));
    int *mismatch = block_check(be, base, q_pos, k_pos, B, Tq, Tk, &L);
    char *wsp = base + CHECK_BYTES, *ob = wsp + pad256(ws), *native = ob + ob_bytes + lb_bytes;
    float *lb = (float *)(ob + ob_bytes);
    cudaStream_t st = cuda_stream(be);
    struct dptr po = {out.data, dt}, pob = {ob, dt};
    if (!accumulate) {
        size_t no = (size_t)B * Tq * qrow, nl = (size_t)B * H * Tq;
        attention_block_clear_kernel<<<grid_for(MAX(no, nl), 256), 256, 0, st>>>(po, no, (float *)lse.data, nl,
                                                                                   mismatch);
        CHECK_LAUNCH();
    }
    float scale = (float)(1.0 / sqrt((double)D)), neg_inf = cudnn_mask_value();
    for (int i = 0; i < L.np; i++) {
        const struct pos_run *a = &L.q[L.pairs[i].qr];
        int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
        void *vals[] = {ptrs[i][0], ptrs[i][1], ptrs[i][2], ob, lb, &scale, &neg_inf};
        if (!emu_sdpa()) {
            cudnn_execute(be, plans[i], uids, vals, L.pairs[i].causal ? 7 : 6, ws ? wsp : NULL, "block forward");
        } else {
#ifdef TRIDENT_CUDA_EMU
            const struct pos_run *c = &L.k[L.pairs[i].kr];
            struct dptr vq = {ptrs[i][0], dt}, vk = {ptrs[i][1], dt}, vv = {ptrs[i][2], dt};
            size_t rows = (size_t)B * H * a->len;
            emu_sdpa_forward_kernel<<<grid_for(rows, 64), 64, 0, st>>>(pob, lb, vq, vk, vv, B, a->len, c->len, Tq, Tk,
                                                                       H, Hkv, D, scale, L.pairs[i].causal);
            CHECK_LAUNCH();
#endif
        }
        attention_block_merge_kernel<<<(unsigned)((size_t)B * a->len * H), 128, 0, st>>>(
            po, (float *)lse.data, pob, lb, Tq, a->row, a->len, H, D, mismatch);
        CHECK_LAUNCH();
    }
    // the positions are not the remembered runs (rewritten in place): the native kernels
    cuda_attention_block_native_forward(be, out, lse, q, k, v, q_pos, q_doc, k_pos, B, Tq, Tk, H, Hkv, D,
                                        accumulate, native, mismatch);
    cudnn_note_path(cuda_state(be), &bkey, NULL);
    return true;
}

bool cuda_attention_cudnn_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                         struct tensor dv, struct tensor dout, struct tensor q, struct tensor k,
                                         struct tensor v, struct tensor out, struct tensor lse,
                                         struct tensor q_pos, struct tensor q_doc, struct tensor k_pos, int B,
                                         int Tq, int Tk, int H, int Hkv, int D) {
    enum dtype dt = q.dtype;
    if ((size_t)B * Tq * Tk == 0) return false;
    struct sdpa_key bkey = {B, Tq, Tk, Tq, Tk, H, Hkv, D, dt, true, false, true};
    bool same = k.dtype == dt && v.dtype == dt && out.dtype == dt && dout.dtype == dt && dq.dtype == dt &&
                dk.dtype == dt && dv.dtype == dt;
    if (!block_eligible(be, &bkey, same, q_doc.numel != 0)) return false;
    const struct block_layout *Lp = block_layout_for(be, &bkey, q_pos, k_pos);
    if (!Lp) return false;
    const struct block_layout &L = *Lp;
    enum { NP = 6 }; // q, k, v, out, dout, lse views of a pair
    struct sdpa_plan *plans[BLOCK_RUNS * BLOCK_RUNS];
    void *ptrs[BLOCK_RUNS * BLOCK_RUNS][NP];
    size_t qrow = (size_t)H * D, krow = (size_t)Hkv * D, ql_max = 0, kl_max = 0;
    for (int i = 0; i < L.np; i++) {
        const struct pos_run *a = &L.q[L.pairs[i].qr], *c = &L.k[L.pairs[i].kr];
        ptrs[i][0] = at(q, a->row * qrow), ptrs[i][1] = at(k, c->row * krow), ptrs[i][2] = at(v, c->row * krow);
        ptrs[i][3] = at(out, a->row * qrow), ptrs[i][4] = at(dout, a->row * qrow), ptrs[i][5] = at(lse, a->row);
        ql_max = MAX(ql_max, (size_t)a->len), kl_max = MAX(kl_max, (size_t)c->len);
    }
    size_t ws;
    if (!block_plans(be, &bkey, &L, plans, &ptrs[0][0], NP, &ws)) return false;
    // scratch: the check's flag, the workspace, the pair's dq, dk, dv (I/O
    // dtype), Dsum (B, H, ql) and the dq accumulator (B, H, ql, D) (FP32),
    // the native kernels' (the fallback)
    size_t es = dtype_size(dt);
    size_t dq_b = pad256((size_t)B * ql_max * qrow * es), dkv_b = pad256((size_t)B * kl_max * krow * es);
    size_t dsum_b = pad256(sizeof(float) * (size_t)B * H * ql_max);
    size_t acc_b = pad256(sizeof(float) * (size_t)B * ql_max * qrow);
    char *base = (char *)cuda_scratch(be, CHECK_BYTES + pad256(ws) + dq_b + 2 * dkv_b + dsum_b + acc_b +
                                              cuda_scratch_attention_block(B, Tq, Tk, H, true));
    int *mismatch = block_check(be, base, q_pos, k_pos, B, Tq, Tk, &L);
    char *wsp = base + CHECK_BYTES, *tdq = wsp + pad256(ws), *tdk = tdq + dq_b, *tdv = tdk + dkv_b;
    char *dsum = tdv + dkv_b, *acc = dsum + dsum_b, *native = acc + acc_b;
    cudaStream_t st = cuda_stream(be);
    float scale = (float)(1.0 / sqrt((double)D)), neg_inf = cudnn_mask_value(), one = 1.0f;
    struct dptr pdq = {dq.data, dt}, pdk = {dk.data, dt}, pdv = {dv.data, dt};
    struct dptr pacc = {acc, DTYPE_FP32}, ptdk = {tdk, dt}, ptdv = {tdv, dt};
    for (int i = 0; i < L.np; i++) {
        const struct pos_run *a = &L.q[L.pairs[i].qr], *c = &L.k[L.pairs[i].kr];
        size_t acc_n = sizeof(float) * (size_t)B * a->len * qrow;
        CHECK_CUDA(cudaMemsetAsync(acc, 0, acc_n, st)); // cuDNN < 9.6 accumulates
        bool causal = L.pairs[i].causal;
        int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
                          UID_SCALE, UID_ONE, UID_DSUM, UID_DQ_ACCUM, UID_NEG_INF};
        void *vals[] = {ptrs[i][0], ptrs[i][1], ptrs[i][2], ptrs[i][3], ptrs[i][5], ptrs[i][4], tdq, tdk, tdv,
                        &scale, &one, dsum, acc, &neg_inf};
        if (!emu_sdpa()) {
            cudnn_execute(be, plans[i], uids, vals, causal ? 14 : 13, ws ? wsp : NULL, "block backward");
        } else {
#ifdef TRIDENT_CUDA_EMU
            struct dptr vq = {ptrs[i][0], dt}, vk = {ptrs[i][1], dt}, vv = {ptrs[i][2], dt};
            struct dptr vo = {ptrs[i][3], dt}, vdo = {ptrs[i][4], dt};
            size_t rows = (size_t)B * H * a->len + (size_t)B * Hkv * c->len;
            emu_sdpa_backward_kernel<<<grid_for(rows, 64), 64, 0, st>>>((float *)acc, ptdk, ptdv, vq, vk, vv, vo, vdo,
                                                                        (const float *)ptrs[i][5], B, a->len, c->len,
                                                                        Tq, Tk, H, Hkv, D, scale, causal);
            CHECK_LAUNCH();
#endif
        }
        size_t nq = (size_t)B * a->len * qrow, nk = (size_t)B * c->len * krow;
        attention_block_add_rows_kernel<<<grid_for(nq, 256), 256, 0, st>>>(pdq, pacc, B, Tq, a->row, a->len, H, D,
                                                                          true, mismatch);
        CHECK_LAUNCH();
        attention_block_add_rows_kernel<<<grid_for(nk, 256), 256, 0, st>>>(pdk, ptdk, B, Tk, c->row, c->len, Hkv,
                                                                          D, false, mismatch);
        CHECK_LAUNCH();
        attention_block_add_rows_kernel<<<grid_for(nk, 256), 256, 0, st>>>(pdv, ptdv, B, Tk, c->row, c->len, Hkv,
                                                                          D, false, mismatch);
        CHECK_LAUNCH();
    }
    cuda_attention_block_native_backward(be, dq, dk, dv, dout, q, k, v, out, lse, q_pos, q_doc, k_pos, B, Tq, Tk, H,
                                         Hkv, D, native, mismatch);
    cudnn_note_path(cuda_state(be), &bkey, NULL);
    return true;
}
