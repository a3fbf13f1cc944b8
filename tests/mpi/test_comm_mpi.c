// test_comm_mpi.c: topology groups and comm_mpi collectives under mpirun
// (run by tests/e2e/comm_mpi.sh). One mpirun checks several layouts by
// re-splitting MPI_COMM_WORLD; with 8 ranks: (tp,pp,dp) = (2,2,2), (1,2,4),
// (4,1,2), (8,1,1), (1,8,1) and the hybrid-sharded (tp,pp,dp,dp_shard) =
// (1,2,4,2), (2,1,4,2); with N other ranks: (N,1,1), (1,N,1), (1,1,N). Every
// group kind of parallel/axes_list.h is checked in each. The collectives run
// twice: whole, and split into MPI calls of 256 bytes (comm_mpi_set_limits),
// which must give the same values; all-to-all-v once, with chunked
// non-blocking all-reduces in flight across it.
// Expected values come from the pure layout functions and closed-form sums
// over the members, never from the collective under test.
//
//   test_comm_mpi                     all layouts; exit 0 pass, 1 fail
//   test_comm_mpi --layout TP PP DP   topology_init with that layout (dp_shard = dp); on bad
//                                     input rank 0 reports, all exit 2
//   test_comm_mpi --partial-fail R    only rank R detects bad input while the
//                                     others wait in a barrier: exit 2
//   test_comm_mpi --fatal R           a failed CHECK on rank R only: exit 1
//   test_comm_mpi --self-send         a non-blocking send on a group of one
//                                     (to itself): a bug, exit 1
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "../unit/all_to_all_case.h"
#include "base/mpi_util.h"
#include "kernels/cpu/half.h"
#include "parallel/comm_mpi.h"
#include "parallel/topology.h"

static int failures;

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            failures++;                                                        \
            fprintf(stderr, "FAIL [rank %d] %s:%d: %s: ", g_log_rank, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
        }                                                                      \
    } while (0)

// The value world rank r contributes at index i: small integers, exact in fp32.
static double value_of(int r, int i) { return (double)((r * 7 + i * 3) % 101) - 50.0; }

// Group membership read back from MPI itself, against the pure enumeration.
static void check_members(struct topology *topo, enum group_kind kind, const char *layout) {
    int expect[64], n = topology_group_members(&topo->layout, kind, topo->coord,
                                               expect);
    struct comm_group *g = topology_group(topo, kind);
    EXPECT(g->size == n, "%s %s group size %d, expected %d", layout, topology_group_name(kind),
           g->size, n);
    if (g->size != n || n == 0) return;
    MPI_Group world_group, group;
    CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
    CHECK_MPI(MPI_Comm_group(comm_mpi_handle(g), &group));
    int ranks[64], world_ranks[64];
    for (int i = 0; i < n; i++) ranks[i] = i;
    CHECK_MPI(MPI_Group_translate_ranks(group, n, ranks, world_group, world_ranks));
    for (int i = 0; i < n; i++)
        EXPECT(world_ranks[i] == expect[i], "%s %s group rank %d is world %d, expected %d", layout,
               topology_group_name(kind), i, world_ranks[i], expect[i]);
    EXPECT(expect[g->rank] == topo->world_rank, "%s %s: own group rank %d", layout,
           topology_group_name(kind), g->rank);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
}

// All-reduce (sum, max; fp32, fp64, i64), blocking and non-blocking,
// reduce-scatter and all-gather (also in place), broadcast over one group.
static void check_collectives(struct topology *topo, enum group_kind kind, const char *layout) {
    struct comm_group *g = topology_group(topo, kind);
    if (g->size == 0) return;
    const char *name = topology_group_name(kind);
    int members[64], n = topology_group_members(&topo->layout, kind, topo->coord,
                                                members);
    int me = topo->world_rank;
    enum { COUNT = 1000 };

    float f32[COUNT];
    double f64[COUNT];
    int64_t i64[COUNT];
    for (int i = 0; i < COUNT; i++) {
        f32[i] = (float)value_of(me, i);
        f64[i] = value_of(me, i) * 0.5;
        i64[i] = (int64_t)value_of(me, i) + ((int64_t)me << 33); // beyond 32 bits
    }
    comm_all_reduce(g, f32, COUNT, DTYPE_FP32, COMM_SUM);
    comm_all_reduce(g, f64, COUNT, DTYPE_FP64, COMM_MAX);
    // Non-blocking: two buckets in flight at once, a blocking call between.
    struct comm_request req[2];
    comm_all_reduce_start(g, i64, COUNT / 2, DTYPE_I64, COMM_SUM, &req[0]);
    comm_all_reduce_start(g, i64 + COUNT / 2, COUNT - COUNT / 2, DTYPE_I64, COMM_SUM, &req[1]);
    comm_barrier(g);
    comm_all_reduce_wait(&req[1]);
    while (!comm_all_reduce_test(&req[0])) {
    } // the first bucket by polling, as a backward pass would
    comm_all_reduce_wait(&req[0]); // no-op once test said done
    int bad = 0;
    for (int i = 0; i < COUNT; i++) {
        double sum = 0, max = -1e30;
        int64_t isum = 0;
        for (int m = 0; m < n; m++) {
            sum += value_of(members[m], i);
            max = MAX(max, value_of(members[m], i) * 0.5);
            isum += (int64_t)value_of(members[m], i) + ((int64_t)members[m] << 33);
        }
        bad += f32[i] != (float)sum || f64[i] != max || i64[i] != isum;
    }
    EXPECT(bad == 0, "%s %s all_reduce: %d wrong elements", layout, name, bad);
    EXPECT(req[0].done && req[1].done, "%s %s requests not done after wait", layout, name);

    // Reduce-scatter: chunk c of the send buffer is summed into group rank c.
    enum { CHUNK = 37 };
    int S = g->size;
    float *send = xmalloc(sizeof(float) * CHUNK * (size_t)S), recv[CHUNK];
    for (int i = 0; i < CHUNK * S; i++) send[i] = (float)value_of(me, i);
    for (int i = 0; i < CHUNK; i++) recv[i] = NAN;
    comm_reduce_scatter(g, send, recv, CHUNK, DTYPE_FP32, COMM_SUM);
    bad = 0;
    for (int i = 0; i < CHUNK; i++) {
        double sum = 0;
        for (int m = 0; m < n; m++) sum += value_of(members[m], g->rank * CHUNK + i);
        bad += recv[i] != (float)sum;
    }
    EXPECT(bad == 0, "%s %s reduce_scatter: %d wrong elements", layout, name, bad);

    // All-gather: chunk c comes from group rank c; then the same in place.
    float *gathered = xmalloc(sizeof(float) * CHUNK * (size_t)S);
    for (int i = 0; i < CHUNK; i++) recv[i] = (float)value_of(me, i);
    for (int i = 0; i < CHUNK * S; i++) gathered[i] = NAN;
    comm_all_gather(g, recv, gathered, CHUNK, DTYPE_FP32);
    for (int pass = 0; pass < 2; pass++) {
        bad = 0;
        for (int c = 0; c < S; c++)
            for (int i = 0; i < CHUNK; i++) bad += gathered[c * CHUNK + i] != (float)value_of(members[c], i);
        EXPECT(bad == 0, "%s %s all_gather%s: %d wrong elements", layout, name,
               pass ? " in place" : "", bad);
        for (int i = 0; i < CHUNK * S; i++)
            if (i / CHUNK != g->rank) gathered[i] = NAN;
        if (!pass) comm_all_gather(g, gathered + g->rank * CHUNK, gathered, CHUNK, DTYPE_FP32);
    }
    free(gathered);
    free(send);

    // Broadcast from the last group rank; the others start poisoned.
    int root = S - 1;
    for (int i = 0; i < COUNT; i++) f64[i] = g->rank == root ? value_of(me, i) : NAN;
    comm_broadcast(g, f64, COUNT, DTYPE_FP64, root);
    bad = 0;
    for (int i = 0; i < COUNT; i++) bad += f64[i] != value_of(members[root], i);
    EXPECT(bad == 0, "%s %s broadcast: %d wrong elements", layout, name, bad);
}

// All-to-all-v (tests/unit/all_to_all_case.h: uneven counts with zeros, a
// rank sending nothing and one receiving nothing, 80 KB chunks, gaps between
// the chunks on both sides) in FP32, BF16 and I32, each against the buffer
// its formulas give. A non-blocking all-reduce is in flight across them
// (chunked by comm_mpi_set_limits: pieces queued behind the window) and
// must still give its sum.
static void check_all_to_all_v(struct topology *topo, enum group_kind kind, const char *layout) {
    struct comm_group *g = topology_group(topo, kind);
    if (g->size == 0) return;
    enum { COUNT = 1000 };
    int64_t acc[COUNT];
    for (int i = 0; i < COUNT; i++) acc[i] = (int64_t)g->rank * i;
    struct comm_request req;
    comm_all_reduce_start(g, acc, COUNT, DTYPE_I64, COMM_SUM, &req);
    const enum dtype dts[] = {DTYPE_FP32, DTYPE_BF16, DTYPE_I32};
    for (int v = 0; v < A2A_VARIANTS; v++)
        for (int k = 0; k < 3; k++) {
            if (!a2a_takes((enum a2a_variant)v, dts[k])) continue;
            size_t bad = a2a_run_host(g, (enum a2a_variant)v, dts[k]);
            EXPECT(bad == 0, "%s %s all_to_all_v %s %s: %zu wrong elements", layout,
                   topology_group_name(kind), a2a_variant_names[v], dtype_name(dts[k]), bad);
        }
    comm_wait(&req);
    int bad = 0;
    for (int i = 0; i < COUNT; i++) bad += acc[i] != (int64_t)g->size * (g->size - 1) / 2 * i;
    EXPECT(bad == 0, "%s %s all_reduce_start across all_to_all_v: %d wrong", layout,
           topology_group_name(kind), bad);
}

// Send/recv around the pipeline ring: stage p sends to p+1 and receives from
// p-1. Stage 0 sends first, the others receive first, so blocking sends of a
// large (rendezvous-sized) message cannot deadlock.
static void check_ring(struct topology *topo, const char *layout) {
    struct comm_group *g = topology_group(topo, GROUP_PP);
    if (g->size < 2) return;
    enum { COUNT = 200000 }; // 800 KB
    float *out = xmalloc(sizeof(float) * COUNT), *in = xmalloc(sizeof(float) * COUNT);
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
    for (int i = 0; i < COUNT; i++) out[i] = (float)value_of(topo->world_rank, i);
    for (int i = 0; i < COUNT; i++) in[i] = NAN;
    if (g->rank == 0) {
        comm_send(g, out, COUNT, DTYPE_FP32, next, 7);
        comm_recv(g, in, COUNT, DTYPE_FP32, prev, 7);
    } else {
        comm_recv(g, in, COUNT, DTYPE_FP32, prev, 7);
        comm_send(g, out, COUNT, DTYPE_FP32, next, 7);
    }
    int members[64];
    topology_group_members(&topo->layout, GROUP_PP, topo->coord, members);
    int bad = 0;
    for (int i = 0; i < COUNT; i++) bad += in[i] != (float)value_of(members[prev], i);
    EXPECT(bad == 0, "%s pp ring from group rank %d: %d wrong elements", layout, prev, bad);
    free(out);
    free(in);
}

// Non-blocking point-to-point around the pipeline ring: every rank posts both
// receives from p-1 and both sends to p+1 before waiting on anything, a
// pattern that deadlocks with blocking rendezvous sends. The two messages
// carry different tags, are sent in the opposite order to the receives and
// completed by wait and by polling test: tags, not order, must match them.
static void check_ring_nonblocking(struct topology *topo, const char *layout) {
    struct comm_group *g = topology_group(topo, GROUP_PP);
    if (g->size < 2) return;
    enum { COUNT = 200000 }; // 800 KB each: beyond any eager limit
    float *out[2], *in[2];
    struct comm_request rreq[2], sreq[2];
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
    for (int k = 0; k < 2; k++) {
        out[k] = xmalloc(sizeof(float) * COUNT);
        in[k] = xmalloc(sizeof(float) * COUNT);
        for (int i = 0; i < COUNT; i++) {
            out[k][i] = (float)value_of(topo->world_rank, i + k);
            in[k][i] = NAN;
        }
    }
    for (int k = 0; k < 2; k++)
        comm_recv_start(g, in[k], COUNT, DTYPE_FP32, prev, 20 + k, &rreq[k]);
    for (int k = 1; k >= 0; k--)
        comm_send_start(g, out[k], COUNT, DTYPE_FP32, next, 20 + k, &sreq[k]);
    comm_wait(&rreq[0]);
    while (!comm_test(&rreq[1])) {
    }
    comm_wait(&sreq[0]);
    comm_wait(&sreq[1]);
    int members[64];
    topology_group_members(&topo->layout, GROUP_PP, topo->coord, members);
    int bad = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < COUNT; i++) bad += in[k][i] != (float)value_of(members[prev], i + k);
    EXPECT(bad == 0, "%s pp non-blocking ring from group rank %d: %d wrong elements", layout, prev,
           bad);
    EXPECT(rreq[0].done && rreq[1].done && sreq[0].done && sreq[1].done,
           "%s p2p requests not done after wait", layout);
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(in[k]);
    }
}

// BF16 sums (comm_mpi.c's user-defined MPI_Op): two group ranks contribute x
// and y at an element, the others 0 (adding 0 changes nothing, so the result
// is the same in whatever order MPI combines). Every x, y and want is a BF16
// value; want is the FP32 sum rounded once to nearest, ties to even, worked
// out by hand. Fails an operation that adds the 16-bit words as integers
// (MPI_SUM on MPI_UINT16_T), truncates instead of rounding, rounds ties away
// from zero, or widens as FP16.
static const struct { float x, y, want; } bf16_cases[] = {
    {1.0f, 0x1.8p-7f, 0x1.04p0f},   // 1 + 1.5 ulp: a tie, to even upwards (truncation: 1 + ulp)
    {1.0f, 0x1p-8f, 1.0f},          // 1 + 0.5 ulp: a tie, to even downwards (half-up: 1 + ulp)
    {1.0f, 0x1.8p-8f, 0x1.02p0f},   // 1 + 0.75 ulp: up to 1 + ulp (truncation: 1)
    {-1.0f, -0x1.8p-7f, -0x1.04p0f}, // the same below zero
    {256.0f, 3.0f, 260.0f},         // 259 between 258 and 260: a tie, to even (260)
    {0x1.1p16f, 0x1.1p16f, 0x1.1p17f}, // 139264: exact in BF16, inf in FP16
    {0x1.fep127f, 0x1.fep127f, INFINITY}, // beyond BF16's (and FP32's) range
    {0.5f, -0.5f, 0.0f},
};
enum { BF16_CASES = sizeof bf16_cases / sizeof bf16_cases[0] };

// Element i of group rank r's buffer: case i % BF16_CASES, contributed by
// group ranks i % n (x) and (i + 1) % n (y).
static uint16_t bf16_value(int r, int n, size_t i) {
    int a = (int)(i % (size_t)n), b = (int)((i + 1) % (size_t)n);
    float v = r == a ? bf16_cases[i % BF16_CASES].x : r == b ? bf16_cases[i % BF16_CASES].y : 0;
    return bf16_from_f32(v);
}

// Counts the elements of got (count,) that are not the case's want, for
// elements first.. of the global index.
static int bf16_wrong(const uint16_t *got, size_t count, size_t first) {
    int bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += got[i] != bf16_from_f32(bf16_cases[(first + i) % BF16_CASES].want);
    return bad;
}

static void check_bf16_sum(struct topology *topo, enum group_kind kind, const char *layout) {
    struct comm_group *g = topology_group(topo, kind);
    if (g->size < 2) return;
    const char *name = topology_group_name(kind);
    enum { COUNT = 100003 }; // beyond one segment of MPI's reduction pipelines
    uint16_t *buf = xmalloc(sizeof(uint16_t) * COUNT * g->size);
    uint16_t *recv = xmalloc(sizeof(uint16_t) * COUNT);
    for (size_t i = 0; i < COUNT; i++) buf[i] = bf16_value(g->rank, g->size, i);
    comm_all_reduce(g, buf, COUNT, DTYPE_BF16, COMM_SUM);
    int bad = bf16_wrong(buf, COUNT, 0);
    if (bad && buf[0] != bf16_from_f32(bf16_cases[0].want))
        fprintf(stderr, "[rank %d] bf16 sum of %g and %g: 0x%04x, expected 0x%04x\n", g_log_rank,
                bf16_cases[0].x, bf16_cases[0].y, buf[0], bf16_from_f32(bf16_cases[0].want));
    EXPECT(bad == 0, "%s %s bf16 all_reduce: %d of %d elements wrong", layout, name, bad, COUNT);
    for (size_t i = 0; i < COUNT; i++) buf[i] = bf16_value(g->rank, g->size, i);
    struct comm_request req;
    comm_all_reduce_start(g, buf, COUNT, DTYPE_BF16, COMM_SUM, &req);
    comm_wait(&req);
    bad = bf16_wrong(buf, COUNT, 0);
    EXPECT(bad == 0, "%s %s bf16 all_reduce_start: %d of %d elements wrong", layout, name, bad, COUNT);
    // Reduce-scatter: chunk r of the send buffer is elements r * COUNT ...
    for (size_t i = 0; i < (size_t)COUNT * g->size; i++) buf[i] = bf16_value(g->rank, g->size, i);
    comm_reduce_scatter(g, buf, recv, COUNT, DTYPE_BF16, COMM_SUM);
    bad = bf16_wrong(recv, COUNT, (size_t)g->rank * COUNT);
    EXPECT(bad == 0, "%s %s bf16 reduce_scatter: %d of %d elements wrong", layout, name, bad, COUNT);
    free(buf);
    free(recv);
}

static int run_layout(int tp, int pp, int dp, int dp_shard) {
    char layout[64];
    if (dp_shard) snprintf(layout, sizeof layout, "(tp,pp,dp,dp_shard)=(%d,%d,%d,%d)", tp, pp, dp, dp_shard);
    else snprintf(layout, sizeof layout, "(tp,pp,dp)=(%d,%d,%d)", tp, pp, dp);
    struct topology topo;
    struct error err;
    struct grid_layout grid = topology_layout(tp, pp, dp, dp_shard, 1);
    if (topology_init(MPI_COMM_WORLD, &grid, &topo, &err) != STATUS_OK)
        mpi_exit_all(err.status, err.msg);
    int before = failures;
    struct grid_coord c = topo.coord;
    EXPECT(topology_rank_of(&grid, c) == topo.world_rank, "%s coord of rank", layout);
    // One node here: node-local rank and size equal the world's.
    EXPECT(topo.local_rank == topo.world_rank && topo.local_size == topo.world_size,
           "%s local rank %d of %d", layout, topo.local_rank, topo.local_size);
    for (int k = 0; k < GROUP_COUNT; k++) check_members(&topo, (enum group_kind)k, layout);
    for (int k = 0; k < GROUP_COUNT; k++) check_collectives(&topo, (enum group_kind)k, layout);
    check_bf16_sum(&topo, GROUP_DP, layout);
    check_bf16_sum(&topo, GROUP_TP, layout);
    // The same in small MPI calls (comm_mpi.h's bound on MPI's temporaries):
    // chunks of 256 bytes, non-blocking ones 600 bytes in flight at most, so
    // that every collective above is split, its pieces of reduce-scatter
    // staged, and the queue of non-blocking chunks waits for its window.
    for (int k = 0; k < GROUP_COUNT; k++)
        if (topology_group(&topo, (enum group_kind)k)->size > 0)
            comm_mpi_set_limits(topology_group(&topo, (enum group_kind)k), 256, 600);
    char chunked[80];
    snprintf(chunked, sizeof chunked, "%s chunked", layout);
    for (int k = 0; k < GROUP_COUNT; k++) check_collectives(&topo, (enum group_kind)k, chunked);
    for (int k = 0; k < GROUP_COUNT; k++) check_all_to_all_v(&topo, (enum group_kind)k, chunked);
    check_bf16_sum(&topo, GROUP_DP, chunked);
    check_bf16_sum(&topo, GROUP_TP, chunked);
    check_ring(&topo, layout);
    check_ring_nonblocking(&topo, layout);
    // Embedding group: the two ends of each (t, d) pipeline sum their ranks.
    struct comm_group *embed = topology_group(&topo, GROUP_EMBED);
    if (embed->size > 0) {
        int64_t x = topo.world_rank;
        comm_all_reduce(embed, &x, 1, DTYPE_I64, COMM_SUM);
        struct grid_coord first = c, last = c;
        first.at[AXIS_PP] = 0;
        last.at[AXIS_PP] = pp - 1;
        int64_t want = topology_rank_of(&grid, first) + (pp > 1 ? topology_rank_of(&grid, last) : 0);
        EXPECT(x == want, "%s embed sum %lld, expected %lld", layout, (long long)x, (long long)want);
    } else {
        EXPECT(c.at[AXIS_PP] != 0 && c.at[AXIS_PP] != pp - 1, "%s stage %d left out of the embedding group",
               layout, c.at[AXIS_PP]);
    }
    int64_t ranks = topo.world_rank;
    comm_all_reduce(&topo.world, &ranks, 1, DTYPE_I64, COMM_SUM);
    EXPECT(ranks == (int64_t)topo.world_size * (topo.world_size - 1) / 2, "%s world sum", layout);
    if (topo.world_rank == 0 && tp == 2 && pp == 2) topology_describe(stdout, &grid);
    topology_free(&topo);
    int mine = failures - before, total = 0;
    CHECK_MPI(MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (g_log_rank == 0) printf("%s: %s (%d failed checks)\n", layout, total ? "FAIL" : "ok", total);
    return total;
}

// comm_agree over the world: no failure leaves err alone; ranks 1 and N-1
// failing (RUNTIME, BAD_INPUT) give every rank BAD_INPUT (the larger) and a
// message naming both, in rank order, with this host and each one's own
// reason; reasons too long to fit together keep the first whole and count
// the rest. The expected texts are written out here, not built by comm.c.
static int test_agree(int size) {
    struct topology topo;
    struct error err;
    struct grid_layout grid = topology_layout(1, 1, size, 0, 1);
    if (topology_init(MPI_COMM_WORLD, &grid, &topo, &err) != STATUS_OK) mpi_exit_all(err.status, err.msg);
    int before = failures, r = topo.world_rank, n = topo.world_size;
    char host[64] = "?", want[2048];
    gethostname(host, sizeof host - 1);
    snprintf(err.msg, sizeof err.msg, "untouched");
    EXPECT(comm_agree(&topo.world, STATUS_OK, "nothing", &err) == STATUS_OK && !strcmp(err.msg, "untouched"),
           "agree without failures: '%s'", err.msg);
    if (n >= 3) {
        enum status mine = r == 1 ? STATUS_RUNTIME : r == n - 1 ? STATUS_BAD_INPUT : STATUS_OK;
        if (mine) snprintf(err.msg, sizeof err.msg, "disk %d full", r);
        enum status got = comm_agree(&topo.world, mine, "saving", &err);
        snprintf(want, sizeof want, "saving failed on 2 of %d ranks: rank 1 (host %s): disk 1 full; rank %d "
                 "(host %s): disk %d full", n, host, n - 1, host, n - 1);
        EXPECT(got == STATUS_BAD_INPUT && err.status == STATUS_BAD_INPUT && !strcmp(err.msg, want),
               "two failures: status %d, '%s', want '%s'", (int)got, err.msg, want);
        snprintf(err.msg, sizeof err.msg, "one file");   // every rank, the same reason: one entry
        got = comm_agree(&topo.world, STATUS_BAD_INPUT, "loading", &err);
        int wl = snprintf(want, sizeof want, "loading failed on %d of %d ranks: ranks 0", n, n);
        for (int q = 1; q < n; q++) wl += snprintf(want + wl, sizeof want - (size_t)wl, ", %d", q);
        snprintf(want + wl, sizeof want - (size_t)wl, " (host %s): one file", host);
        EXPECT(got == STATUS_BAD_INPUT && !strcmp(err.msg, want), "same reason: '%s', want '%s'", err.msg, want);
        memset(err.msg, 'a' + r % 26, 700), err.msg[700] = '\0'; // every rank, its own long reason
        got = comm_agree(&topo.world, STATUS_RUNTIME, "long", &err);
        snprintf(want, sizeof want, "long failed on %d of %d ranks: rank 0 (host %s): ", n, n, host);
        char more[64];
        snprintf(more, sizeof more, "; %d more: their own lines", n - 1);
        EXPECT(got == STATUS_RUNTIME && !strncmp(err.msg, want, strlen(want)) && strstr(err.msg, more) &&
                   !strstr(err.msg, "rank 1 (host"), "long reasons: '%.120s...'", err.msg);
    }
    topology_free(&topo);
    if (r == 0) printf("comm_agree: %s\n", failures == before ? "ok" : "FAILED");
    return failures != before;
}

int main(int argc, char **argv) {
    struct error start_err = {0};
    CHECK(!mpi_util_start(&argc, &argv, &start_err), "%s", start_err.msg);
    mpi_util_init(MPI_COMM_WORLD);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc == 5 && !strcmp(argv[1], "--layout")) {
        struct topology topo;
        struct error err;
        struct grid_layout grid = topology_layout(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), 0, 1);
        if (topology_init(MPI_COMM_WORLD, &grid, &topo, &err) != STATUS_OK)
            mpi_exit_all(err.status, rank == 0 ? err.msg : NULL); // every rank detects it
        topology_free(&topo);
        MPI_Finalize();
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--partial-fail")) {
        if (rank == atoi(argv[2])) mpi_exit_all(STATUS_BAD_INPUT, "shard-00003.h5: bad magic (only this rank saw it)");
        MPI_Barrier(MPI_COMM_WORLD); // never completes: the aborting rank is missing
        MPI_Finalize();
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--fatal")) {
        CHECK(rank != atoi(argv[2]), "injected failure on rank %d", rank);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--self-send")) {
        struct comm_group self;
        struct comm_request req;
        float x = 1;
        comm_self_init(&self);
        comm_send_start(&self, &x, 1, DTYPE_FP32, 0, 0, &req);
        MPI_Finalize();
        return 0;
    }
    CHECK(size <= 64, "the checks keep group members in arrays of 64, not %d", size);
    if (argc != 1) mpi_exit_all(STATUS_BAD_INPUT, "usage: test_comm_mpi [--layout TP PP DP | --partial-fail R | --fatal R | --self-send]");
    int layouts8[7][4] = {{2, 2, 2, 0}, {1, 2, 4, 0}, {4, 1, 2, 0}, {8, 1, 1, 0}, {1, 2, 4, 2},
                          {2, 1, 4, 2}, {1, 8, 1, 0}};
    int layoutsN[3][4] = {{size, 1, 1, 0}, {1, size, 1, 0}, {1, 1, size, 0}};
    int total = test_agree(size);
    if (size == 8)
        for (int i = 0; i < 7; i++)
            total += run_layout(layouts8[i][0], layouts8[i][1], layouts8[i][2], layouts8[i][3]);
    else
        for (int i = 0; i < 3; i++)
            total += run_layout(layoutsN[i][0], layoutsN[i][1], layoutsN[i][2], layoutsN[i][3]);
    MPI_Finalize();
    return total ? 1 : 0;
}
