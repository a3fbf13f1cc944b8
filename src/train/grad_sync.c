// grad_sync.c: bucketed data-parallel all-reduce of gradients (grad_sync.h).
#include "grad_sync.h"

struct bucket {
    size_t begin, end; // element range of the gradient arena
    struct comm_group *group; // dp, or expert_dp for a bucket of routed-expert tensors
    bool started;
    struct comm_request req;
};

struct grad_sync {
    struct model *model;
    struct comm_group *dp;
    struct tensor grads;
    struct tensor low;    // grad_dtype BF16: (grads.numel,) what the buckets all-reduce; else empty
    int n_buckets;        // buckets[0] is the last range of the arena
    struct bucket *buckets;
    int next;             // first bucket not started, in start order
    int started_early;
    bool armed;           // grad_sync_arm ran in the current step (reset by grad_sync_finish)
    bool final;           // the running backward finalises what the hook reports
};

struct grad_sync *grad_sync_init(struct model *m, struct comm_group *dp, size_t bucket_bytes,
                                 enum dtype grad_dtype) {
    return grad_sync_init_ep(m, dp, NULL, bucket_bytes, grad_dtype);
}

struct grad_sync *grad_sync_init_ep(struct model *m, struct comm_group *dp,
                                    struct comm_group *expert_dp, size_t bucket_bytes,
                                    enum dtype grad_dtype) {
    CHECK(grad_dtype == DTYPE_FP32 || grad_dtype == DTYPE_BF16, "grad_sync: grad_dtype %s",
          dtype_name(grad_dtype));
    struct grad_sync *s = xcalloc(1, sizeof *s);
    s->model = m, s->dp = dp, s->grads = model_grad_arena(m);
    size_t n = s->grads.numel, per = bucket_bytes / dtype_size(s->grads.dtype);
    if (per < 1) per = 1;
    int np;
    const struct param_info *p = model_params(m, &np);
    bool any_expert = false;
    for (int k = 0; k < np; k++) any_expert |= p[k].expert;
    CHECK(!any_expert || expert_dp, "grad_sync: routed-expert tensors but no expert_dp group");
    // Buckets from the arena's end, at most per elements, cut where the
    // tensors change between dense (summed over dp) and routed experts
    // (summed over expert_dp: the ranks holding the same experts). A tensor's
    // range reaches to the next one's offset (its alignment padding); the
    // parameter table is in arena order.
    s->buckets = xcalloc(n / per + 2 * (size_t)np + 2, sizeof *s->buckets);
    if (dp && dp->size > 1)
        for (size_t end = n, k = np; end > 0;) {
            size_t begin = end > per ? end - per : 0;
            bool ex = false;
            if (any_expert) { // the tensor holding element end - 1, and where its kind's run starts
                while (k > 1 && p[k - 1].offset >= end) k--;
                ex = p[k - 1].expert;
                size_t j = k - 1;
                while (j > 0 && p[j - 1].expert == ex) j--;
                begin = MAX(begin, j > 0 ? p[j].offset : 0);
            }
            s->buckets[s->n_buckets++] = (struct bucket){.begin = begin, .end = end,
                                                         .group = ex ? expert_dp : dp};
            end = begin;
        }
    s->low = tensor_view(NULL, DTYPE_BF16, 0);
    if (s->n_buckets && grad_dtype == DTYPE_BF16 && s->grads.dtype == DTYPE_FP32) {
        void *q = backend_alloc(model_backend(m), n * sizeof(uint16_t));
        CHECK(q, "grad_sync: no memory for %zu bytes of bf16 gradient buckets",
              n * sizeof(uint16_t));
        s->low = tensor_view(q, DTYPE_BF16, n);
    }
    return s;
}

void grad_sync_free(struct grad_sync *s) {
    if (!s) return;
    if (s->low.data) backend_dealloc(model_backend(s->model), s->low.data);
    free(s->buckets);
    free(s);
}

size_t grad_sync_bytes(const struct grad_sync *s) { return s->low.numel * sizeof(uint16_t); }

size_t grad_sync_plan_bytes(size_t n_params, int dp, int zero_stage, enum dtype grad_dtype) {
    return zero_stage == 0 && dp > 1 && grad_dtype == DTYPE_BF16 ? n_params * sizeof(uint16_t) : 0;
}

// Under grad_dtype BF16 the bucket's final FP32 gradients are rounded into
// its range of s->low, which is all-reduced (comm.h's BF16 sum) and widened
// back in grad_sync_finish.
static void bucket_start(struct grad_sync *s, struct bucket *b) {
    struct tensor t = tensor_slice(s->grads, b->begin, b->end - b->begin);
    if (s->low.numel) {
        struct tensor l = tensor_slice(s->low, b->begin, t.numel);
        struct backend *be = model_backend(s->model);
        backend_copy(be, l, t, t.numel);
        comm_order_after_compute(b->group, be); // NCCL orders itself
        t = l;
    }
    if (b->group->size <= 1) { // an expert bucket with ep = dp: nothing to sum
        b->req = (struct comm_request){.group = b->group, .done = true};
        b->started = true;
        return;
    }
    comm_all_reduce_start(b->group, t.data, t.numel, t.dtype, COMM_SUM, &b->req);
    b->started = true;
}

void grad_sync_poll(struct grad_sync *s) {
    for (int k = 0; k < s->next; k++)
        if (!s->buckets[k].req.done) comm_test(&s->buckets[k].req);
}

// Model hook: in a final backward, [ready_from, n) is final; start every
// bucket inside it. MPI advances non-blocking collectives only inside MPI
// calls, so the started ones are also polled here, between layers of every
// backward pass (paused ones too).
static void on_grads_ready(void *ctx, size_t ready_from) {
    struct grad_sync *s = ctx;
    while (s->final && s->next < s->n_buckets && s->buckets[s->next].begin >= ready_from) {
        bucket_start(s, &s->buckets[s->next++]);
        s->started_early++;
    }
    grad_sync_poll(s);
}

void grad_sync_arm(struct grad_sync *s) {
    if (!s->n_buckets) return;
    if (!s->armed) {
        s->next = 0, s->started_early = 0, s->armed = true;
        for (int k = 0; k < s->n_buckets; k++) s->buckets[k].started = false;
        model_set_grad_ready_hook(s->model, on_grads_ready, s);
    }
    s->final = true;
}

void grad_sync_pause(struct grad_sync *s) { s->final = false; }

void grad_sync_finish(struct grad_sync *s) {
    if (!s->n_buckets) return;
    model_set_grad_ready_hook(s->model, NULL, NULL);
    if (!s->armed) s->next = 0, s->started_early = 0; // no overlap this time: start all here
    s->armed = false, s->final = false;
    while (s->next < s->n_buckets) bucket_start(s, &s->buckets[s->next++]);
    for (int k = 0; k < s->n_buckets; k++) comm_all_reduce_wait(&s->buckets[k].req);
    struct backend *be = model_backend(s->model);
    if (s->low.numel) backend_copy(be, s->grads, s->low, s->grads.numel);
    // ZB-V's stage 0 with a tied embedding (model_tied_head_grad): the head's
    // share, summed as the arena is (1F1B's last stage sums it in its arena;
    // model_finish_grads adds it after). Under BF16 through s->low, free now.
    struct tensor tied = model_tied_head_grad(s->model), t = tied;
    if (!tied.numel) return;
    if (s->low.numel) {
        CHECK(s->low.numel >= tied.numel, "grad_sync: %zu bf16 elements for a head of %zu",
              s->low.numel, tied.numel);
        t = tensor_slice(s->low, 0, tied.numel);
        backend_copy(be, t, tied, tied.numel);
    }
    comm_order_after_compute(s->dp, be);
    comm_all_reduce(s->dp, t.data, t.numel, t.dtype, COMM_SUM);
    if (s->low.numel) backend_copy(be, tied, t, tied.numel);
}

int grad_sync_buckets(const struct grad_sync *s) { return s->n_buckets; }
int grad_sync_started_early(const struct grad_sync *s) { return s->started_early; }
