// moe.c: the mixture-of-experts feed-forward layer (moe.h): routing, the
// dispatch plan, the per-expert GEMMs over contiguous rows, the combine,
// shared experts, and their backward, all through kernels/ops.h.
#include "moe.h"

#include <math.h>
#include <string.h>

// Every buffer starts 256-byte aligned (cuBLASLt's alignment classes, and
// the vectorised kernels' 16 bytes).
#define MOE_ALIGN 256

static enum dtype stat_of(enum dtype dt) { return dt == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32; }

// Carves consecutive aligned tensors out of base (NULL: only counts bytes).
struct carve {
    char *base;
    size_t bytes;
};

static struct tensor take(struct carve *cv, enum dtype dt, size_t numel) {
    struct tensor t = tensor_view(cv->base ? cv->base + cv->bytes : NULL, dt, numel);
    cv->bytes += (numel * dtype_size(dt) + MOE_ALIGN - 1) / MOE_ALIGN * MOE_ALIGN;
    return t;
}

// What the forward keeps (moe_activation_bytes lists it).
struct moe_acts {
    struct tensor probs, lse, topk_idx, topk_w, stats, counts, dest, src;
    struct tensor xp, hg, hu, h, yp;
    struct tensor xr, yr; // expert parallelism: the rows received (xp, yp without it)
    struct tensor s, sg, su, sh, sy;
};

static struct moe_acts acts_layout(const struct moe_config *c, int N, enum dtype dt, void *base,
                                   size_t *bytes) {
    struct carve cv = {base, 0};
    struct moe_acts a = {0};
    enum dtype st = stat_of(dt);
    size_t Mx = (size_t)moe_rows_max(c, N), nk = (size_t)N * c->k;
    size_t Rx = (size_t)moe_rows_recv_max(c, N);
    a.probs = take(&cv, st, (size_t)N * c->E);
    a.lse = take(&cv, st, N);
    a.topk_idx = take(&cv, DTYPE_I32, nk);
    a.topk_w = take(&cv, st, nk);
    a.stats = take(&cv, DTYPE_FP64, (size_t)c->E + 1);
    a.counts = take(&cv, DTYPE_I32, 2 * (size_t)c->E);
    a.dest = take(&cv, DTYPE_I32, nk);
    a.src = take(&cv, DTYPE_I32, nk);
    a.xp = take(&cv, dt, Mx * c->C);
    a.hg = take(&cv, dt, Rx * c->F);
    a.hu = take(&cv, dt, Rx * c->F);
    a.h = take(&cv, dt, Rx * c->F);
    a.yp = take(&cv, dt, Mx * c->C);
    a.xr = a.xp, a.yr = a.yp;
    if (c->ep.size > 1) a.xr = take(&cv, dt, Rx * c->C), a.yr = take(&cv, dt, Rx * c->C);
    if (c->shared_F > 0) {
        size_t ns = (size_t)N * c->shared_F;
        if (c->shared_gate) a.s = take(&cv, st, N);
        a.sg = take(&cv, dt, ns);
        a.su = take(&cv, dt, ns);
        a.sh = take(&cv, dt, ns);
        a.sy = take(&cv, dt, (size_t)N * c->C);
    }
    *bytes = cv.bytes;
    return a;
}

// The backward's working memory (moe_scratch_bytes lists it); the forward
// uses only logits, at the start of the same region.
struct moe_scratch {
    struct tensor dyr, dxr; // expert parallelism: the rows received (dyp, dxp without it)
    struct tensor dyp, dxp, dh, dhg, dhu, dtopk_w, dlogits, dlogits_dt, aux_w;
    struct tensor dsy, dsh, dsg, dsu, ds, ds_dt;
};

static struct moe_scratch scratch_layout(const struct moe_config *c, int N, enum dtype dt,
                                         void *base, size_t *bytes) {
    struct carve cv = {base, 0};
    struct moe_scratch s = {0};
    enum dtype st = stat_of(dt);
    size_t Mx = (size_t)moe_rows_max(c, N), Rx = (size_t)moe_rows_recv_max(c, N);
    s.dyp = take(&cv, dt, Mx * c->C);
    s.dxp = take(&cv, dt, Mx * c->C);
    s.dh = take(&cv, dt, Rx * c->F);
    s.dhg = take(&cv, dt, Rx * c->F);
    s.dhu = take(&cv, dt, Rx * c->F);
    s.dyr = s.dyp, s.dxr = s.dxp;
    if (c->ep.size > 1) s.dyr = take(&cv, dt, Rx * c->C), s.dxr = take(&cv, dt, Rx * c->C);
    s.dtopk_w = take(&cv, st, (size_t)N * c->k);
    s.dlogits = take(&cv, st, (size_t)N * c->E);
    s.dlogits_dt = dt != st ? take(&cv, dt, (size_t)N * c->E) : s.dlogits;
    s.aux_w = take(&cv, st, c->E);
    if (c->shared_F > 0) {
        size_t ns = (size_t)N * c->shared_F;
        s.dsy = take(&cv, dt, (size_t)N * c->C);
        s.dsh = take(&cv, dt, ns);
        s.dsg = take(&cv, dt, ns);
        s.dsu = take(&cv, dt, ns);
        if (c->shared_gate) {
            s.ds = take(&cv, st, N);
            s.ds_dt = dt != st ? take(&cv, dt, N) : s.ds;
        }
    }
    struct carve fw = {NULL, 0};
    take(&fw, st, (size_t)N * c->E); // the forward's logits
    *bytes = cv.bytes > fw.bytes ? cv.bytes : fw.bytes;
    return s;
}

enum status moe_config_check(const struct moe_config *c, struct error *err) {
    if (c->C <= 0)
        return error_set(err, STATUS_BAD_INPUT, "moe: model width C=%d, expected > 0", c->C);
    if (c->E <= 0 || c->E > MOE_MAX_EXPERTS)
        return error_set(err, STATUS_BAD_INPUT, "moe: experts E=%d, expected 1..%d", c->E,
                         MOE_MAX_EXPERTS);
    if (c->k < 1 || c->k > c->E)
        return error_set(err, STATUS_BAD_INPUT, "moe: top_k k=%d, expected 1..E=%d", c->k, c->E);
    if (c->F <= 0)
        return error_set(err, STATUS_BAD_INPUT, "moe: expert width F=%d, expected > 0", c->F);
    if (c->shared_F < 0)
        return error_set(err, STATUS_BAD_INPUT, "moe: shared width shared_F=%d, expected >= 0",
                         c->shared_F);
    if (c->shared_gate && c->shared_F == 0)
        return error_set(err, STATUS_BAD_INPUT,
                         "moe: shared_gate set with shared_F=0: a gate needs a shared expert");
    if (!(c->capacity_factor >= 0) || !isfinite(c->capacity_factor))
        return error_set(err, STATUS_BAD_INPUT,
                         "moe: capacity_factor=%g, expected 0 (dropless) or > 0",
                         c->capacity_factor);
    int ep = MAX(1, c->ep.size);
    if (c->E % ep || c->ep.rank < 0 || c->ep.rank >= ep)
        return error_set(err, STATUS_BAD_INPUT, "moe: ep size %d (rank %d) must divide E=%d",
                         ep, c->ep.rank, c->E);
    return STATUS_OK;
}

int moe_capacity(const struct moe_config *c, int N) {
    if (c->capacity_factor <= 0) return 0;
    return (int)ceil(c->capacity_factor * N * c->k / c->E);
}

int moe_rows_max(const struct moe_config *c, int N) {
    long nk = (long)N * c->k, cap = moe_capacity(c, N);
    if (cap > 0 && (long)c->E * cap < nk) return (int)(c->E * cap);
    return (int)nk;
}

int moe_rows_recv_max(const struct moe_config *c, int N) {
    if (c->ep.size <= 1) return moe_rows_max(c, N);
    long all = (long)c->ep.size * N * c->k, cap = moe_capacity(c, N);
    if (cap > 0 && (long)c->E * cap < all) return (int)(c->E * cap);
    return (int)all;
}

size_t moe_activation_bytes(const struct moe_config *c, int N, enum dtype dt) {
    size_t bytes;
    acts_layout(c, N, dt, NULL, &bytes);
    return bytes;
}

size_t moe_scratch_bytes(const struct moe_config *c, int N, enum dtype dt) {
    size_t bytes;
    scratch_layout(c, N, dt, NULL, &bytes);
    return bytes;
}

struct moe_routing moe_routing_view(const struct moe_config *c, int N, enum dtype dt, void *acts) {
    size_t unused;
    struct moe_acts a = acts_layout(c, N, dt, acts, &unused);
    struct moe_routing r = {a.topk_idx, a.topk_w, a.dest, a.src, a.counts};
    return r;
}

// Rows [o, o + m) of a (rows, width) tensor.
static struct tensor rows(struct tensor t, int o, int m, int width) {
    return tensor_slice(t, (size_t)o * width, (size_t)m * width);
}

// Expert e's (a, b) matrix of a stacked (E, a, b) weight.
static struct tensor expert(struct tensor w, int e, int a, int b) {
    return tensor_slice(w, (size_t)e * a * b, (size_t)a * b);
}

// The rows of n consecutive experts (or sources' experts) of a count array.
static int sum_rows(const int32_t *rows_of, int n) {
    int m = 0;
    for (int j = 0; j < n; j++) m += rows_of[j];
    return m;
}

// out (M, N) = a (M, K) b^T (b (N, K)): a forward GEMM, batch-invariant
// when asked (moe_config.invariant).
static void mm_nt(struct backend *be, bool invariant, struct tensor out, struct tensor a,
                  struct tensor b, int M, int N, int K) {
    if (invariant) backend_matmul_invariant(be, out, a, b, M, N, K, false, true, 1.0f, 0.0f);
    else backend_matmul(be, out, a, b, M, N, K, false, true, 1.0f, 0.0f);
}

void moe_experts_forward(struct backend *be, int n, const int32_t *rows_of, int C, int F,
                         struct tensor yp, struct tensor hg, struct tensor hu, struct tensor h,
                         struct tensor xp, struct tensor gate, struct tensor up,
                         struct tensor down, bool invariant) {
    int M = sum_rows(rows_of, n);
    for (int e = 0, o = 0; e < n; o += rows_of[e], e++) {
        int m = rows_of[e];
        if (!m) continue;
        struct tensor xe = rows(xp, o, m, C);
        mm_nt(be, invariant, rows(hg, o, m, F), xe, expert(gate, e, F, C), m, F, C);
        mm_nt(be, invariant, rows(hu, o, m, F), xe, expert(up, e, F, C), m, F, C);
    }
    backend_swiglu_forward(be, h, hg, hu, (size_t)M * F);
    for (int e = 0, o = 0; e < n; o += rows_of[e], e++) {
        int m = rows_of[e];
        if (!m) continue;
        mm_nt(be, invariant, rows(yp, o, m, C), rows(h, o, m, F), expert(down, e, C, F), m, C, F);
    }
}

void moe_experts_backward(struct backend *be, int n, const int32_t *rows_of, int C, int F,
                          struct tensor dxp, struct tensor dgate, struct tensor dup,
                          struct tensor ddown, struct tensor dh, struct tensor dhg,
                          struct tensor dhu, struct tensor dyp, struct tensor xp, struct tensor hg,
                          struct tensor hu, struct tensor h, struct tensor gate, struct tensor up,
                          struct tensor down) {
    int M = sum_rows(rows_of, n);
    // down: dh = dyp Wd_e, dWd_e += dyp^T h
    for (int e = 0, o = 0; e < n; o += rows_of[e], e++) {
        int m = rows_of[e];
        if (!m) continue;
        struct tensor dye = rows(dyp, o, m, C);
        backend_matmul(be, rows(dh, o, m, F), dye, expert(down, e, C, F), m, F, C, false, false,
                       1.0f, 0.0f);
        backend_matmul(be, expert(ddown, e, C, F), dye, rows(h, o, m, F), C, F, m, true, false,
                       1.0f, 1.0f);
    }
    backend_swiglu_backward(be, dhg, dhu, dh, hg, hu, (size_t)M * F);
    // gate and up: dxp = dhg Wg_e + dhu Wu_e, dWg_e += dhg^T xp, dWu_e += dhu^T xp
    for (int e = 0, o = 0; e < n; o += rows_of[e], e++) {
        int m = rows_of[e];
        if (!m) continue;
        struct tensor xe = rows(xp, o, m, C), dxe = rows(dxp, o, m, C);
        struct tensor dhge = rows(dhg, o, m, F), dhue = rows(dhu, o, m, F);
        backend_matmul(be, dxe, dhge, expert(gate, e, F, C), m, C, F, false, false, 1.0f, 0.0f);
        backend_matmul(be, dxe, dhue, expert(up, e, F, C), m, C, F, false, false, 1.0f, 1.0f);
        backend_matmul(be, expert(dgate, e, F, C), dhge, xe, F, C, m, true, false, 1.0f, 1.0f);
        backend_matmul(be, expert(dup, e, F, C), dhue, xe, F, C, m, true, false, 1.0f, 1.0f);
    }
}

// Expert parallelism's counts (moe_ep): every ep rank's kept counts,
// all-gathered, give the rows this rank receives from each source for each
// of its experts (st->recv_rows, st->R). A collective over c->ep.host.
static void ep_counts(const struct moe_config *c, struct moe_stats *st) {
    int P = c->ep.size, E = c->E, El = E / P, me = c->ep.rank;
    struct comm_group *g = c->ep.host ? c->ep.host : c->ep.group;
    CHECK(g && g->size == P, "moe: ep = %d but the ep group has %d ranks", P, g ? g->size : 0);
    int32_t *all = xmalloc((size_t)P * E * sizeof *all);
    comm_all_gather(g, st->kept, all, (size_t)E, DTYPE_I32);
    st->R = 0;
    for (int i = 0; i < P; i++)
        for (int j = 0; j < El; j++)
            st->R += st->recv_rows[i * El + j] = all[(size_t)i * E + me * El + j];
    free(all);
}

// Moves rows of width w between this rank's tokens' order (local: st->M rows
// sorted by expert, each destination's experts contiguous) and the rows its
// experts received (st->R rows, by source then local expert): to_experts
// sends local -> received, else received -> local. One all-to-all over
// c->ep.group, after the compute queued so far.
static void ep_exchange(struct backend *be, const struct moe_config *c, const struct moe_stats *st,
                        struct tensor local, struct tensor received, int w, bool to_experts) {
    int P = c->ep.size, El = c->E / P;
    size_t *v = xcalloc(4 * (size_t)P, sizeof *v); // local counts, offsets, received ...
    for (int j = 0, lo = 0, ro = 0; j < P; j++) {
        size_t nl = (size_t)sum_rows(st->kept + j * El, El);
        size_t nr = (size_t)sum_rows(st->recv_rows + j * El, El);
        v[j] = nl * w, v[P + j] = (size_t)lo * w, v[2 * P + j] = nr * w, v[3 * P + j] = (size_t)ro * w;
        lo += (int)nl, ro += (int)nr;
    }
    comm_order_after_compute(c->ep.group, be);
    if (to_experts)
        comm_all_to_all_v(c->ep.group, local.data, v, v + P, received.data, v + 2 * P, v + 3 * P,
                          local.dtype);
    else
        comm_all_to_all_v(c->ep.group, received.data, v + 2 * P, v + 3 * P, local.data, v, v + P,
                          local.dtype);
    free(v);
}

void moe_forward(struct backend *be, const struct moe_config *c, struct tensor y, struct tensor x,
                 const struct moe_weights *w, int N, void *acts, void *scratch,
                 struct moe_stats *st) {
    enum dtype dt = x.dtype, sdt = stat_of(dt);
    int C = c->C, E = c->E, k = c->k, F = c->F;
    size_t unused;
    struct moe_acts a = acts_layout(c, N, dt, acts, &unused);
    struct tensor logits = tensor_view(scratch, sdt, (size_t)N * E);
    CHECK(E <= MOE_MAX_EXPERTS, "moe_forward: E=%d", E);

    // routing and the dispatch plan, then the counts on the host
    bool inv = c->invariant;
    mm_nt(be, inv, logits, x, w->router, N, E, C);
    backend_moe_route(be, a.probs, a.lse, a.topk_idx, a.topk_w, a.stats, logits, w->expert_bias, N,
                      E, k, c->norm_topk);
    int capacity = moe_capacity(c, N);
    backend_moe_dispatch(be, a.counts, a.dest, a.src, a.topk_idx, N, E, k, capacity);
    int32_t counts[2 * MOE_MAX_EXPERTS];
    double stats[MOE_MAX_EXPERTS + 1];
    backend_to_host(be, counts, a.counts.data, 2 * (size_t)E * sizeof *counts);
    backend_to_host(be, stats, a.stats.data, ((size_t)E + 1) * sizeof *stats);
    backend_synchronize(be);

    memset(st, 0, sizeof *st);
    st->N = N, st->E = E, st->capacity = capacity;
    for (int e = 0; e < E; e++) {
        st->kept[e] = counts[e];
        st->routed[e] = counts[E + e];
        st->M += counts[e];
        st->dropped += counts[E + e] - counts[e];
        st->prob_sum[e] = stats[e];
    }
    st->z_sum = stats[E];
    double n = N > 0 ? N : 1;
    for (int e = 0; e < E; e++) {
        st->aux_loss += E * (st->routed[e] / n) * (st->prob_sum[e] / n);
        st->aux_grad[e] = c->aux_coeff * E * st->routed[e] / (n * n);
    }
    st->z_loss = st->z_sum / n;
    st->z_grad = c->z_coeff / n;

    // the experts over their rows (under ep: this rank's experts over the
    // rows every source sent, source by source)
    backend_moe_permute(be, a.xp, x, a.src, st->M, C, k);
    if (c->ep.size > 1) {
        int El = E / c->ep.size;
        ep_counts(c, st);
        ep_exchange(be, c, st, a.xp, a.xr, C, true);
        for (int i = 0, o = 0; i < c->ep.size; i++) {
            const int32_t *rows_of = st->recv_rows + i * El;
            int m = sum_rows(rows_of, El);
            moe_experts_forward(be, El, rows_of, C, F, rows(a.yr, o, m, C), rows(a.hg, o, m, F),
                                rows(a.hu, o, m, F), rows(a.h, o, m, F), rows(a.xr, o, m, C),
                                w->gate, w->up, w->down, inv);
            o += m;
        }
        ep_exchange(be, c, st, a.yp, a.yr, C, false);
    } else {
        st->R = st->M;
        moe_experts_forward(be, E, st->kept, C, F, a.yp, a.hg, a.hu, a.h, a.xp, w->gate, w->up,
                            w->down, inv);
    }
    backend_moe_combine(be, y, a.yp, a.topk_w, a.dest, N, C, k, false, false);

    if (c->shared_F > 0) { // y += [sigmoid(x Ws^T)] down(silu(gate x) * up x)
        int Fs = c->shared_F;
        mm_nt(be, inv, a.sg, x, w->sh_gate, N, Fs, C);
        mm_nt(be, inv, a.su, x, w->sh_up, N, Fs, C);
        backend_swiglu_forward(be, a.sh, a.sg, a.su, (size_t)N * Fs);
        mm_nt(be, inv, a.sy, a.sh, w->sh_down, N, C, Fs);
        if (c->shared_gate) {
            struct tensor no_dest = tensor_view(NULL, DTYPE_I32, 0);
            mm_nt(be, inv, a.s, x, w->sh_router, N, 1, C);
            backend_moe_combine(be, y, a.sy, a.s, no_dest, N, C, 1, true, true);
        } else {
            backend_add(be, y, y, a.sy, (size_t)N * C);
        }
    }
}

// The stat-dtype gradient g (n,) as the storage dtype's GEMM operand: g
// itself, or converted into g_dt.
static struct tensor as_operand(struct backend *be, struct tensor g, struct tensor g_dt, size_t n) {
    if (g_dt.data == g.data) return g;
    backend_copy(be, g_dt, g, n);
    return g_dt;
}

void moe_backward(struct backend *be, const struct moe_config *c, struct tensor dx,
                  const struct moe_weights *dw, struct tensor dy, struct tensor x,
                  const struct moe_weights *w, int N, void *acts, void *scratch,
                  const struct moe_stats *st) {
    enum dtype dt = x.dtype, sdt = stat_of(dt);
    int C = c->C, E = c->E, k = c->k, F = c->F;
    size_t unused;
    struct moe_acts a = acts_layout(c, N, dt, acts, &unused);
    struct moe_scratch s = scratch_layout(c, N, dt, scratch, &unused);
    CHECK(st->N == N && st->E == E, "moe_backward: stats of N=%d E=%d for N=%d E=%d", st->N, st->E,
          N, E);

    // the combine: dyp (M, C) and the weights' gradient dtopk_w (N, k)
    backend_moe_combine_backward(be, s.dyp, s.dtopk_w, dy, a.yp, a.topk_w, a.dest, N, C, k, false);
    if (c->ep.size > 1) { // the output gradients to the experts' ranks and back (moe_ep)
        int El = E / c->ep.size;
        ep_exchange(be, c, st, s.dyp, s.dyr, C, true);
        for (int i = 0, o = 0; i < c->ep.size; i++) {
            const int32_t *rows_of = st->recv_rows + i * El;
            int m = sum_rows(rows_of, El);
            moe_experts_backward(be, El, rows_of, C, F, rows(s.dxr, o, m, C), dw->gate, dw->up,
                                 dw->down, rows(s.dh, o, m, F), rows(s.dhg, o, m, F),
                                 rows(s.dhu, o, m, F), rows(s.dyr, o, m, C), rows(a.xr, o, m, C),
                                 rows(a.hg, o, m, F), rows(a.hu, o, m, F), rows(a.h, o, m, F),
                                 w->gate, w->up, w->down);
            o += m;
        }
        ep_exchange(be, c, st, s.dxp, s.dxr, C, false);
    } else {
        moe_experts_backward(be, E, st->kept, C, F, s.dxp, dw->gate, dw->up, dw->down, s.dh,
                             s.dhg, s.dhu, s.dyp, a.xp, a.hg, a.hu, a.h, w->gate, w->up, w->down);
    }
    backend_moe_permute_backward(be, dx, s.dxp, a.dest, N, C, k);

    // the router: through the weights, the load-balancing and the z terms
    if (sdt == DTYPE_FP64) {
        backend_to_device(be, s.aux_w.data, st->aux_grad, (size_t)E * sizeof(double));
    } else {
        float aux[MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) aux[e] = (float)st->aux_grad[e];
        backend_to_device(be, s.aux_w.data, aux, (size_t)E * sizeof(float));
    }
    backend_moe_route_backward(be, s.dlogits, s.dtopk_w, a.probs, a.lse, a.topk_idx, s.aux_w, N, E,
                               k, c->norm_topk, (float)(2 * st->z_grad));
    struct tensor dl = as_operand(be, s.dlogits, s.dlogits_dt, (size_t)N * E);
    backend_matmul(be, dx, dl, w->router, N, C, E, false, false, 1.0f, 1.0f);
    backend_matmul(be, dw->router, dl, x, E, C, N, true, false, 1.0f, 1.0f);

    if (c->shared_F > 0) {
        int Fs = c->shared_F;
        struct tensor dsy = dy;
        if (c->shared_gate) { // dsy = sigmoid(s) dy, ds = sigmoid'(s) <dy, sy>
            struct tensor no_dest = tensor_view(NULL, DTYPE_I32, 0);
            backend_moe_combine_backward(be, s.dsy, s.ds, dy, a.sy, a.s, no_dest, N, C, 1, true);
            dsy = s.dsy;
            struct tensor ds = as_operand(be, s.ds, s.ds_dt, N);
            backend_matmul(be, dx, ds, w->sh_router, N, C, 1, false, false, 1.0f, 1.0f);
            backend_matmul(be, dw->sh_router, ds, x, 1, C, N, true, false, 1.0f, 1.0f);
        }
        backend_matmul(be, s.dsh, dsy, w->sh_down, N, Fs, C, false, false, 1.0f, 0.0f);
        backend_matmul(be, dw->sh_down, dsy, a.sh, C, Fs, N, true, false, 1.0f, 1.0f);
        backend_swiglu_backward(be, s.dsg, s.dsu, s.dsh, a.sg, a.su, (size_t)N * Fs);
        backend_matmul(be, dx, s.dsg, w->sh_gate, N, C, Fs, false, false, 1.0f, 1.0f);
        backend_matmul(be, dx, s.dsu, w->sh_up, N, C, Fs, false, false, 1.0f, 1.0f);
        backend_matmul(be, dw->sh_gate, s.dsg, x, Fs, C, N, true, false, 1.0f, 1.0f);
        backend_matmul(be, dw->sh_up, s.dsu, x, Fs, C, N, true, false, 1.0f, 1.0f);
    }
}

double moe_aux_loss_layers(struct moe_stats *const *layers, int L, double coeff) {
    CHECK(L > 0, "moe_aux_loss_layers: L=%d", L);
    int N = layers[0]->N, E = layers[0]->E;
    double n = (double)L * (N > 0 ? N : 1), f[MOE_MAX_EXPERTS] = {0}, loss = 0;
    for (int l = 0; l < L; l++)
        CHECK(layers[l]->N == N && layers[l]->E == E,
              "moe_aux_loss_layers: layer %d has N=%d E=%d, layer 0 N=%d E=%d", l, layers[l]->N,
              layers[l]->E, N, E);
    for (int e = 0; e < E; e++) {
        double routed = 0, psum = 0;
        for (int l = 0; l < L; l++) routed += layers[l]->routed[e], psum += layers[l]->prob_sum[e];
        f[e] = routed / n;
        loss += E * f[e] * (psum / n);
    }
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) layers[l]->aux_grad[e] = coeff * E * f[e] / n;
    return loss;
}
