// comm.c: the checked comm_* wrappers over struct comm_ops, and comm_self,
// the group of one rank that needs no MPI (copy semantics).
#include "comm.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/nvtx.h"

// ---- argument checks ---------------------------------------------------------

static void check_group(const struct comm_group *g, const char *what) {
    CHECK(g && g->ops, "%s on a group with no operations (not initialised)", what);
    CHECK(g->size > 0, "%s on a group this rank is not a member of", what);
    CHECK(g->rank >= 0 && g->rank < g->size, "%s: group rank %d of size %d", what, g->rank,
          g->size);
}

static void check_dtype(enum dtype dtype, bool reduction, const char *what) {
    CHECK((unsigned)dtype <= DTYPE_I64, "%s: unknown dtype %d", what, (int)dtype);
    CHECK(!reduction || dtype == DTYPE_FP32 || dtype == DTYPE_FP64 || dtype == DTYPE_I32 ||
              dtype == DTYPE_I64 || dtype == DTYPE_BF16,
          "%s: reductions take fp32, fp64, i32, i64 or bf16, not %s", what, dtype_name(dtype));
}

// The checks every reduction shares: member group, reducible dtype, known op
// (BF16: sums only).
static void check_reduction(const struct comm_group *g, enum dtype dtype, enum comm_op op,
                            const char *what) {
    check_group(g, what);
    check_dtype(dtype, true, what);
    CHECK(op == COMM_SUM || op == COMM_MAX, "%s: unknown reduction %d", what, (int)op);
    CHECK(dtype != DTYPE_BF16 || op == COMM_SUM, "%s: bf16 reductions are sums only", what);
}

static void check_buf(const void *buf, size_t count, const char *what) {
    CHECK(buf || count == 0, "%s: NULL buffer for %zu elements", what, count);
}

static void check_peer(const struct comm_group *g, int peer, int tag, const char *what) {
    CHECK(peer >= 0 && peer < g->size && peer != g->rank,
          "%s: peer %d in a group of %d where this rank is %d", what, peer, g->size, g->rank);
    CHECK(tag >= 0, "%s: negative tag %d", what, tag);
}

static bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

// ---- wrappers ---------------------------------------------------------------

// The checks every point-to-point wrapper makes.
static void check_p2p(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                      int peer, int tag, const char *op) {
    check_group(g, op);
    check_dtype(dtype, false, op);
    check_buf(buf, count, op);
    check_peer(g, peer, tag, op);
}

// A fresh request of group g for a non-blocking operation.
static void request_begin(struct comm_group *g, struct comm_request *req, const char *op) {
    CHECK(req, "%s: NULL request", op);
    memset(req, 0, sizeof *req);
    req->group = g;
}

// Runs a blocking call and adds its duration to the group's busy time;
// an NVTX range names it on a profile: "<op> <count> <dtype>" (src/base/nvtx.h).
#define TIMED(g, op, count, dtype, stmt)                                       \
    do {                                                                       \
        NVTX_PUSH("%s %zu %s", op, (size_t)(count), dtype_name(dtype));        \
        double t0_ = time_now_s();                                             \
        stmt;                                                                  \
        (g)->busy_s += time_now_s() - t0_;                                     \
        NVTX_POP();                                                            \
    } while (0)

// A non-blocking start, named the same way (its wait is comm_wait's range).
#define STARTED(op, count, dtype, stmt)                                        \
    do {                                                                       \
        NVTX_PUSH("%s %zu %s", op, (size_t)(count), dtype_name(dtype));        \
        stmt;                                                                  \
        NVTX_POP();                                                            \
    } while (0)

void comm_all_reduce(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                     enum comm_op op) {
    check_reduction(g, dtype, op, "comm_all_reduce");
    check_buf(buf, count, "comm_all_reduce");
    TIMED(g, "comm_all_reduce", count, dtype, g->ops->all_reduce(g, buf, count, dtype, op));
}

void comm_all_reduce_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           enum comm_op op, struct comm_request *req) {
    check_reduction(g, dtype, op, "comm_all_reduce_start");
    check_buf(buf, count, "comm_all_reduce_start");
    request_begin(g, req, "comm_all_reduce_start");
    STARTED("comm_all_reduce_start", count, dtype,
            g->ops->all_reduce_start(g, buf, count, dtype, op, req));
}

void comm_wait(struct comm_request *req) {
    CHECK(req && req->group && req->group->ops, "comm_wait: request never started");
    if (!req->done) {
        NVTX_PUSH("comm_wait");
        double t0 = time_now_s();
        req->group->ops->wait(req);
        req->group->busy_s += time_now_s() - t0;
        NVTX_POP();
    }
    req->done = true;
}

bool comm_test(struct comm_request *req) {
    CHECK(req && req->group && req->group->ops, "comm_test: request never started");
    if (!req->done) req->done = req->group->ops->test(req);
    return req->done;
}

int comm_check(struct comm_group *g, char *msg, size_t cap) {
    if (!g || g->size == 0 || !g->ops || !g->ops->check) return 0;
    return g->ops->check(g, msg, cap);
}

void comm_all_reduce_wait(struct comm_request *req) { comm_wait(req); }

bool comm_all_reduce_test(struct comm_request *req) { return comm_test(req); }

// The checks comm_reduce_scatter and its start share.
static void check_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                                 enum dtype dtype, enum comm_op op, const char *what) {
    check_reduction(g, dtype, op, what);
    check_buf(send, count, what);
    check_buf(recv, count, what);
    size_t es = dtype_size(dtype);
    CHECK(!ranges_overlap(send, (size_t)g->size * count * es, recv, count * es),
          "%s: send and recv overlap", what);
}

void comm_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                         enum dtype dtype, enum comm_op op) {
    check_reduce_scatter(g, send, recv, count, dtype, op, "comm_reduce_scatter");
    TIMED(g, "comm_reduce_scatter", count, dtype,
          g->ops->reduce_scatter(g, send, recv, count, dtype, op));
}

// The checks comm_all_gather and its start share.
static void check_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                             enum dtype dtype, const char *what) {
    check_group(g, what);
    check_dtype(dtype, false, what);
    check_buf(send, count, what);
    check_buf(recv, count, what);
    size_t es = dtype_size(dtype);
    const char *own = (const char *)recv + (size_t)g->rank * count * es;
    CHECK(send == own || !ranges_overlap(send, count * es, recv, (size_t)g->size * count * es),
          "%s: send overlaps recv but is not this rank's chunk (in place)", what);
}

void comm_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                     enum dtype dtype) {
    check_all_gather(g, send, recv, count, dtype, "comm_all_gather");
    TIMED(g, "comm_all_gather", count, dtype, g->ops->all_gather(g, send, recv, count, dtype));
}

void comm_reduce_scatter_start(struct comm_group *g, const void *send, void *recv, size_t count,
                               enum dtype dtype, enum comm_op op, struct comm_request *req) {
    check_reduce_scatter(g, send, recv, count, dtype, op, "comm_reduce_scatter_start");
    request_begin(g, req, "comm_reduce_scatter_start");
    STARTED("comm_reduce_scatter_start", count, dtype,
            g->ops->reduce_scatter_start(g, send, recv, count, dtype, op, req));
}

void comm_all_gather_start(struct comm_group *g, const void *send, void *recv, size_t count,
                           enum dtype dtype, struct comm_request *req) {
    check_all_gather(g, send, recv, count, dtype, "comm_all_gather_start");
    request_begin(g, req, "comm_all_gather_start");
    STARTED("comm_all_gather_start", count, dtype,
            g->ops->all_gather_start(g, send, recv, count, dtype, req));
}

void comm_broadcast(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int root) {
    check_group(g, "comm_broadcast");
    check_dtype(dtype, false, "comm_broadcast");
    check_buf(buf, count, "comm_broadcast");
    CHECK(root >= 0 && root < g->size, "comm_broadcast: root %d in a group of %d", root, g->size);
    TIMED(g, "comm_broadcast", count, dtype, g->ops->broadcast(g, buf, count, dtype, root));
}

void comm_send(struct comm_group *g, const void *buf, size_t count, enum dtype dtype, int peer,
               int tag) {
    check_p2p(g, buf, count, dtype, peer, tag, "comm_send");
    TIMED(g, "comm_send", count, dtype, g->ops->send(g, buf, count, dtype, peer, tag));
}

void comm_recv(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
               int tag) {
    check_p2p(g, buf, count, dtype, peer, tag, "comm_recv");
    TIMED(g, "comm_recv", count, dtype, g->ops->recv(g, buf, count, dtype, peer, tag));
}

void comm_send_start(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                     int peer, int tag, struct comm_request *req) {
    check_p2p(g, buf, count, dtype, peer, tag, "comm_send_start");
    request_begin(g, req, "comm_send_start");
    STARTED("comm_send_start", count, dtype, g->ops->send_start(g, buf, count, dtype, peer, tag, req));
}

void comm_recv_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                     int tag, struct comm_request *req) {
    check_p2p(g, buf, count, dtype, peer, tag, "comm_recv_start");
    request_begin(g, req, "comm_recv_start");
    STARTED("comm_recv_start", count, dtype, g->ops->recv_start(g, buf, count, dtype, peer, tag, req));
}

void comm_all_to_all_v(struct comm_group *g, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_counts,
                       const size_t *recv_displs, enum dtype dtype) {
    check_group(g, "comm_all_to_all_v");
    check_dtype(dtype, false, "comm_all_to_all_v");
    CHECK(send_counts && send_displs && recv_counts && recv_displs,
          "comm_all_to_all_v: NULL count or offset array");
    size_t es = dtype_size(dtype), sent = 0, got = 0, send_end = 0, recv_end = 0;
    for (int r = 0; r < g->size; r++) {
        sent += send_counts[r], got += recv_counts[r];
        send_end = MAX(send_end, send_displs[r] + send_counts[r]);
        recv_end = MAX(recv_end, recv_displs[r] + recv_counts[r]);
    }
    check_buf(send, sent, "comm_all_to_all_v");
    check_buf(recv, got, "comm_all_to_all_v");
    CHECK(send_counts[g->rank] == recv_counts[g->rank],
          "comm_all_to_all_v: %zu elements to itself but %zu expected from itself",
          send_counts[g->rank], recv_counts[g->rank]);
    CHECK(!send_end || !recv_end || !ranges_overlap(send, send_end * es, recv, recv_end * es),
          "comm_all_to_all_v: send and recv overlap");
    CHECK(g->ops->all_to_all_v, "comm_all_to_all_v: not implemented by %s", g->ops->name);
    TIMED(g, "comm_all_to_all_v", sent, dtype,
          g->ops->all_to_all_v(g, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                               dtype));
}

void comm_barrier(struct comm_group *g) {
    check_group(g, "comm_barrier");
    NVTX_PUSH("comm_barrier");
    double t0 = time_now_s();
    g->ops->barrier(g);
    g->busy_s += time_now_s() - t0;
    NVTX_POP();
}

bool comm_stream_ordered(const struct comm_group *g) {
    return g && g->ops && g->ops->stream_ordered;
}

void comm_order_after_compute(const struct comm_group *g, struct backend *be) {
    if (!comm_stream_ordered(g)) backend_synchronize(be);
}

void comm_group_free(struct comm_group *g) {
    if (!g) return;
    if (g->ops && g->ops->free) g->ops->free(g);
    memset(g, 0, sizeof *g);
}

// ---- comm_self: a group of one ------------------------------------------------

static void self_all_reduce(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                            enum comm_op op) {}

static void self_all_reduce_start(struct comm_group *g, void *buf, size_t count,
                                  enum dtype dtype, enum comm_op op, struct comm_request *req) {
    req->done = true;
}

// Started operations on a group of one complete at once.
static void self_wait(struct comm_request *req) {}

static bool self_test(struct comm_request *req) { return true; }

static void self_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                                enum dtype dtype, enum comm_op op) {
    memcpy(recv, send, count * dtype_size(dtype));
}

static void self_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                            enum dtype dtype) {
    if (send != recv) memcpy(recv, send, count * dtype_size(dtype));
}

static void self_reduce_scatter_start(struct comm_group *g, const void *send, void *recv,
                                      size_t count, enum dtype dtype, enum comm_op op,
                                      struct comm_request *req) {
    memcpy(recv, send, count * dtype_size(dtype));
    req->done = true;
}

static void self_all_gather_start(struct comm_group *g, const void *send, void *recv, size_t count,
                                  enum dtype dtype, struct comm_request *req) {
    if (send != recv) memcpy(recv, send, count * dtype_size(dtype));
    req->done = true;
}

static void self_broadcast(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           int root) {}

// Unreachable (also the _start twins below): the wrappers reject peer ==
// own rank, the only rank there is.
static void self_send(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                      int peer, int tag) {
    CHECK(0, "comm_self has no peer to send to");
}

static void self_recv(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                      int tag) {
    CHECK(0, "comm_self has no peer to receive from");
}

static void self_send_start(struct comm_group *g, const void *buf, size_t count,
                            enum dtype dtype, int peer, int tag, struct comm_request *req) {
    CHECK(0, "comm_self has no peer to send to");
}

static void self_recv_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                            int peer, int tag, struct comm_request *req) {
    CHECK(0, "comm_self has no peer to receive from");
}

static void self_barrier(struct comm_group *g) {}

static void self_all_to_all_v(struct comm_group *g, const void *send, const size_t *send_counts,
                              const size_t *send_displs, void *recv, const size_t *recv_counts,
                              const size_t *recv_displs, enum dtype dtype) {
    size_t es = dtype_size(dtype);
    if (send_counts[0])
        memcpy((char *)recv + recv_displs[0] * es, (const char *)send + send_displs[0] * es,
               send_counts[0] * es);
}

static void self_free(struct comm_group *g) {}

static const struct comm_ops comm_self_ops = {
    .name = "self",
    .all_reduce = self_all_reduce,
    .all_reduce_start = self_all_reduce_start,
    .wait = self_wait,
    .test = self_test,
    .reduce_scatter = self_reduce_scatter,
    .all_gather = self_all_gather,
    .reduce_scatter_start = self_reduce_scatter_start,
    .all_gather_start = self_all_gather_start,
    .broadcast = self_broadcast,
    .send = self_send,
    .recv = self_recv,
    .send_start = self_send_start,
    .recv_start = self_recv_start,
    .barrier = self_barrier,
    .all_to_all_v = self_all_to_all_v,
    .free = self_free,
};

void comm_self_init(struct comm_group *g) {
    g->rank = 0;
    g->size = 1;
    g->ops = &comm_self_ops;
    g->impl = NULL;
}

// One rank's reason as comm_agree gathers it: host name and message, in int32
// words so that any comm implementation moves it.
struct agree_reason {
    char host[64];
    char msg[sizeof ((struct error *)0)->msg];
};

enum status comm_agree(struct comm_group *g, enum status mine, const char *what,
                       struct error *err) {
    check_group(g, "comm_agree");
    int n = g->size;
    int64_t *status = xcalloc((size_t)n, sizeof *status), my = mine;
    comm_all_gather(g, &my, status, 1, DTYPE_I64);
    int failed = 0;
    enum status worst = STATUS_OK;
    for (int r = 0; r < n; r++)
        if (status[r]) failed++, worst = MAX(worst, (enum status)status[r]);
    if (!failed) {
        free(status);
        return STATUS_OK;
    }
    _Static_assert(sizeof(struct agree_reason) % sizeof(int32_t) == 0, "int32 words");
    size_t words = sizeof(struct agree_reason) / sizeof(int32_t);
    struct agree_reason me, *all = xcalloc((size_t)n, sizeof *all);
    memset(&me, 0, sizeof me);
    if (gethostname(me.host, sizeof me.host - 1)) snprintf(me.host, sizeof me.host, "?");
    if (mine) snprintf(me.msg, sizeof me.msg, "%s", err->msg[0] ? err->msg : "(no message)");
    comm_all_gather(g, &me, all, words, DTYPE_I32);
    char out[sizeof err->msg];
    int len = snprintf(out, sizeof out, "%s failed on %d of %d rank%s", what, failed, n, n > 1 ? "s" : "");
    bool mine_fits = false;
    int left_out = 0;
    for (int r = 0; r < n; r++) all[r].host[sizeof all[r].host - 1] = all[r].msg[sizeof all[r].msg - 1] = '\0';
    // Ranks with the same host and reason share one entry ("ranks 0, 1 (host h): ..."),
    // so that an error every rank found (one config file) is not repeated N times.
    bool *done = xcalloc((size_t)n, sizeof *done);
    for (int r = 0, k = 0; r < n; r++) {
        if (!status[r] || done[r]) continue;
        char ranks[256];
        int nr = 0, rl = snprintf(ranks, sizeof ranks, "%d", r);
        bool has_mine = false;
        for (int q = r; q < n; q++) {
            if (!status[q] || strcmp(all[q].msg, all[r].msg) || strcmp(all[q].host, all[r].host)) continue;
            done[q] = true, nr++, has_mine |= q == g->rank;
            if (q > r && rl < (int)sizeof ranks - 16) rl += snprintf(ranks + rl, sizeof ranks - (size_t)rl, ", %d", q);
        }
        char one[sizeof out];
        int m = snprintf(one, sizeof one, "%s rank%s %s (host %s): %s", k++ ? ";" : ":", nr > 1 ? "s" : "",
                         ranks, all[r].host, all[r].msg);
        if (len + m < (int)sizeof out) { // whole reasons only
            memcpy(out + len, one, (size_t)m + 1), len += m;
            if (has_mine) mine_fits = true;
        } else {
            left_out += nr;
        }
    }
    free(done);
    if (left_out && len + 48 < (int)sizeof out)
        snprintf(out + len, sizeof out - (size_t)len, "; %d more: their own lines", left_out);
    if (mine && !mine_fits) {
        fprintf(stderr, "trident: [rank %d, host %s] %s: %s\n", g->rank, me.host, what, me.msg);
        fflush(stderr);
    }
    free(status), free(all);
    return error_set(err, worst, "%s", out);
}
