// test_topology.c: the grid of named axes (parallel/axes_list.h) and its
// pure functions (no MPI): the axis and group lists; for every layout of N =
// 1..64 ranks (every factorisation over tp, cp, dp_shard, dp_replicate, pp) the
// rank -> coordinate -> rank round trip against Megatron's formula written
// out here, and every group kind's members (they share the coordinates of
// the axes outside the group, differ in the group's, count the product of
// its axes' sizes, come in group-rank order, and the group's index is the
// same for all); tables written out by hand for (2,2,2), a hybrid-sharded
// layout and one with context parallelism; the comm_self group (all-to-all-v:
// tests/unit/all_to_all_case.h's cases on one rank) and topology_init_self, device selection.
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "all_to_all_case.h"
#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "test.h"

static int same_members(const int *a, int na, const int *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

// The lists: names unique, the axes in Megatron's order, each axis' key a
// [parallel] key of the config (or "" for dp_replicate, derived), every
// group's axes a non-empty subset, the named sizes the groups the records
// print, the gradient groups data x context.
static void test_lists(void) {
    const char *order[] = {"tp", "cp", "ep", "dp_shard", "dp_replicate", "pp"};
    EXPECT(AXIS_COUNT == 6, "%d axes", AXIS_COUNT);
    for (int a = 0; a < AXIS_COUNT && a < 6; a++) {
        EXPECT(!strcmp(topology_axis_name((enum grid_axis)a), order[a]), "axis %d is %s", a,
               topology_axis_name((enum grid_axis)a));
        const char *key = topology_axis_key((enum grid_axis)a);
        EXPECT(key[0] ? config_key_index("parallel", key) >= 0 : a == AXIS_DP_REPLICATE,
               "axis %s: key '%s' is no [parallel] key", order[a], key);
    }
    for (int k = 0; k < GROUP_COUNT; k++) {
        unsigned m = topology_group_axes((enum group_kind)k);
        EXPECT(m && m < (1u << AXIS_COUNT), "group %s axes %#x", topology_group_name(k), m);
        for (int j = 0; j < k; j++)
            EXPECT(strcmp(topology_group_name(k), topology_group_name(j)), "two groups named %s",
                   topology_group_name(k));
    }
    unsigned data = 1u << AXIS_EP | 1u << AXIS_DP_SHARD | 1u << AXIS_DP_REPLICATE;
    EXPECT(topology_group_axes(GROUP_DP) == data, "the data ranks span the data axes");
    EXPECT(topology_group_axes(GROUP_DP_CP) == (data | 1u << AXIS_CP),
           "the gradient group spans the data axes and cp");
    EXPECT(topology_group_axes(GROUP_DP_SHARD_CP) ==
               (1u << AXIS_EP | 1u << AXIS_DP_SHARD | 1u << AXIS_CP),
           "the shard group spans ep, dp_shard and cp");
    EXPECT(topology_group_axes(GROUP_EP) == 1u << AXIS_EP, "the ep group spans ep");
    EXPECT(topology_group_axes(GROUP_EXPERT_DP) == ((data & ~(1u << AXIS_EP)) | 1u << AXIS_CP),
           "the expert gradient group spans the data axes but ep, and cp");
    EXPECT(topology_group_axes(GROUP_CP) == 1u << AXIS_CP, "the ring spans cp");
    EXPECT(!topology_group_is_size(GROUP_EMBED) && topology_group_is_ends(GROUP_EMBED) &&
               topology_group_is_size(GROUP_DP) && topology_group_is_size(GROUP_CP) &&
               !topology_group_is_size(GROUP_DP_CP) && !topology_group_is_size(GROUP_DP_SHARD_CP),
           "sizes");
    // The [parallel] size keys the config has are sized groups of the list.
    const char *keys[] = {"tp", "cp", "pp", "dp", "dp_shard", "ep"};
    for (int i = 0; i < 6; i++) {
        int found = 0;
        for (int k = 0; k < GROUP_COUNT; k++)
            found += !strcmp(topology_group_name(k), keys[i]) && topology_group_is_size(k);
        EXPECT(found == 1 && config_key_index("parallel", keys[i]) >= 0, "key %s", keys[i]);
    }
}

// Megatron's rank of a coordinate, written out by hand (the one place
// outside src/parallel/topology.c: a check of it): tensor, context, data,
// pipeline, first fastest.
static int megatron_rank(const int *size, struct grid_coord c) {
    int t = c.at[AXIS_TP], x = c.at[AXIS_CP], s = c.at[AXIS_DP_SHARD], r = c.at[AXIS_DP_REPLICATE];
    int p = c.at[AXIS_PP], e = c.at[AXIS_EP], ep = size[AXIS_EP];
    int d = e + ep * (s + size[AXIS_DP_SHARD] * r);
    int dp = ep * size[AXIS_DP_SHARD] * size[AXIS_DP_REPLICATE];
    return t + size[AXIS_TP] * (x + size[AXIS_CP] * (d + dp * p));
}

// Violations of the group of kind that holds rank r of layout g.
static int check_group(const struct grid_layout *g, enum group_kind kind, int r, int *members) {
    int bad = 0, n_ranks = topology_world_size(g);
    unsigned axes = topology_group_axes(kind);
    struct grid_coord c = topology_coord_of(g, r);
    int n = topology_group_members(g, kind, c, members);
    int want = 1, index = topology_group_index(g, kind, c);
    for (int a = 0; a < AXIS_COUNT; a++)
        if (axes >> a & 1u) want *= g->size[a];
    if (topology_group_is_ends(kind)) { // the ends of its one axis
        int a = __builtin_ctz(axes), at = c.at[a], last = g->size[a] - 1;
        want = at == 0 || at == last ? (last > 0 ? 2 : 1) : 0;
    }
    bad += n != want || (n > 0) != (index >= 0) || topology_group_rank(g, kind, c) >= MAX(n, 1);
    if (n > 0) bad += topology_group_size(g, kind) != n;
    int has_me = 0;
    for (int i = 0; i < n; i++) {
        bad += members[i] < 0 || members[i] >= n_ranks;
        if (members[i] < 0 || members[i] >= n_ranks) continue;
        has_me += members[i] == r;
        struct grid_coord m = topology_coord_of(g, members[i]);
        // Same coordinates outside the group, the same group, group rank i.
        for (int a = 0; a < AXIS_COUNT; a++)
            if (!(axes >> a & 1u)) bad += m.at[a] != c.at[a];
        bad += topology_group_index(g, kind, m) != index || topology_group_rank(g, kind, m) != i;
        // Group-rank order: mixed radix over the group's axes, first fastest.
        if (!topology_group_is_ends(kind)) {
            int gr = 0;
            for (int a = AXIS_COUNT - 1; a >= 0; a--)
                if (axes >> a & 1u) gr = gr * g->size[a] + m.at[a];
            bad += gr != i;
        }
        for (int j = 0; j < i; j++) bad += members[j] == members[i];
    }
    bad += n > 0 && has_me != 1;
    // The index orders the groups by the other axes' coordinates.
    if (n > 0 && !topology_group_is_ends(kind)) {
        int idx = 0;
        for (int a = AXIS_COUNT - 1; a >= 0; a--)
            if (!(axes >> a & 1u)) idx = idx * g->size[a] + c.at[a];
        bad += idx != index || index >= n_ranks / n;
    }
    return bad;
}

// Every layout of N = 1..64 ranks over (tp, cp, dp_shard, dp_replicate, pp),
// and with ep = 2 where the shard part is even (ep x dp_shard' = dp_shard).
static void test_layouts(void) {
    int members[64], layouts = 0, with_cp = 0, with_ep = 0;
    for (int N = 1; N <= 64; N++)
        for (int tp = 1; tp <= N; tp++)
            for (int cp = 1; tp * cp <= N; cp++)
                for (int ds = 1; tp * cp * ds <= N; ds++)
                    for (int dr = 1; tp * cp * ds * dr <= N; dr++)
                    for (int ep = 1; ep <= 2; ep++) {
                        if (N % (tp * cp * ds * dr) || ds % ep) continue;
                        int pp = N / (tp * cp * ds * dr), bad = 0;
                        struct grid_layout g = topology_layout_ep(tp, pp, ds * dr, ds, cp, ep);
                        layouts++, with_cp += cp > 1, with_ep += ep > 1;
                        bad += topology_world_size(&g) != N || g.size[AXIS_TP] != tp ||
                               g.size[AXIS_CP] != cp || g.size[AXIS_DP_SHARD] != ds / ep ||
                               g.size[AXIS_EP] != ep ||
                               g.size[AXIS_DP_REPLICATE] != dr || g.size[AXIS_PP] != pp;
                        bad += topology_group_size(&g, GROUP_DP_CP) != cp * ds * dr ||
                               topology_group_size(&g, GROUP_DP) != ds * dr ||
                               topology_group_size(&g, GROUP_DP_SHARD) != ds ||
                               topology_group_size(&g, GROUP_EP) != ep ||
                               topology_group_size(&g, GROUP_EXPERT_DP) != cp * ds * dr / ep;
                        for (int r = 0; r < N; r++) {
                            struct grid_coord c = topology_coord_of(&g, r);
                            for (int a = 0; a < AXIS_COUNT; a++) bad += c.at[a] < 0 || c.at[a] >= g.size[a];
                            bad += topology_rank_of(&g, c) != r || megatron_rank(g.size, c) != r;
                            for (int k = 0; k < GROUP_COUNT; k++) bad += check_group(&g, k, r, members);
                        }
                        EXPECT(bad == 0, "layout tp=%d cp=%d dp_shard=%d dp_replicate=%d ep=%d pp=%d: "
                               "%d violations", tp, cp, ds, dr, ep, pp, bad);
                    }
    EXPECT(with_ep > 1000, "only %d layouts with ep", with_ep);
    EXPECT(layouts > 3000 && with_cp > 1500, "only %d layouts (%d with cp)", layouts, with_cp);
}

// (tp, pp, dp) = (2, 2, 2): rank = t + 2 * (d + 2 * p), written out by hand.
static void test_table_222(void) {
    static const int coord[8][3] = { // t, d, p
        {0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
    static const int groups[8][3][2] = { // tp, dp, pp groups of each rank
        {{0, 1}, {0, 2}, {0, 4}}, {{0, 1}, {1, 3}, {1, 5}}, {{2, 3}, {0, 2}, {2, 6}},
        {{2, 3}, {1, 3}, {3, 7}}, {{4, 5}, {4, 6}, {0, 4}}, {{4, 5}, {5, 7}, {1, 5}},
        {{6, 7}, {4, 6}, {2, 6}}, {{6, 7}, {5, 7}, {3, 7}}};
    const enum group_kind kinds[3] = {GROUP_TP, GROUP_DP, GROUP_PP};
    struct grid_layout g = topology_layout(2, 2, 2, 0, 1);
    int members[8];
    for (int r = 0; r < 8; r++) {
        struct grid_coord c = topology_coord_of(&g, r);
        int d = topology_group_rank(&g, GROUP_DP, c);
        EXPECT(c.at[AXIS_TP] == coord[r][0] && d == coord[r][1] && c.at[AXIS_PP] == coord[r][2],
               "rank %d: coord (%d,%d,%d)", r, c.at[AXIS_TP], d, c.at[AXIS_PP]);
        for (int k = 0; k < 3; k++) {
            int n = topology_group_members(&g, kinds[k], c, members);
            EXPECT(same_members(members, n, groups[r][k], 2), "rank %d %s group [%d %d] (n=%d)",
                   r, topology_group_name(kinds[k]), members[0], members[1], n);
        }
        // dp_shard = dp: the shard group is the DP group, no replicas.
        int n = topology_group_members(&g, GROUP_DP_SHARD, c, members);
        EXPECT(same_members(members, n, groups[r][1], 2), "rank %d dp_shard group", r);
        n = topology_group_members(&g, GROUP_DP_REPLICATE, c, members);
        EXPECT(n == 1 && members[0] == r, "rank %d dp_replicate group of %d", r, n);
        // pp == 2: the embedding group {first, last stage} is the pp group.
        n = topology_group_members(&g, GROUP_EMBED, c, members);
        EXPECT(same_members(members, n, groups[r][2], 2), "rank %d embed group", r);
    }
}

// Embedding groups: middle stages are out, pp == 1 is the rank alone.
static void test_embed(void) {
    int members[8];
    // (tp, pp, dp) = (1, 3, 1): ranks 0, 1, 2 are stages 0, 1, 2.
    struct grid_layout g = topology_layout(1, 3, 1, 0, 1);
    int n = topology_group_members(&g, GROUP_EMBED, topology_coord_of(&g, 0), members);
    EXPECT(n == 2 && members[0] == 0 && members[1] == 2, "pp=3 stage 0: n=%d", n);
    n = topology_group_members(&g, GROUP_EMBED, topology_coord_of(&g, 1), members);
    EXPECT(n == 0, "pp=3 middle stage is in an embedding group of %d", n);
    // (tp, pp, dp) = (2, 1, 2): rank 3 alone.
    g = topology_layout(2, 1, 2, 0, 1);
    n = topology_group_members(&g, GROUP_EMBED, topology_coord_of(&g, 3), members);
    EXPECT(n == 1 && members[0] == 3, "pp=1: n=%d first %d", n, members[0]);
}

static void test_describe(void) {
    char buf[2048] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    struct grid_layout g = topology_layout(2, 2, 2, 0, 1);
    topology_describe(f, &g);
    fclose(f);
    EXPECT(strstr(buf, "tp           groups: [0 1] [2 3] [4 5] [6 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp           groups: [0 2] [1 3] [4 6] [5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "pp           groups: [0 4] [1 5] [2 6] [3 7]\n"), "describe: %s", buf);
    // Hybrid sharding, (tp, dp_shard, dp_replicate, pp) = (2, 2, 2, 1), by hand:
    // rank = t + 2 * (s + 2 * r).
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf - 1, "w");
    g = topology_layout(2, 1, 4, 2, 1);
    topology_describe(f, &g);
    fclose(f);
    EXPECT(strstr(buf, "grid: tp=2 cp=1 ep=1 dp_shard=2 dp_replicate=2 pp=1 (8 ranks)"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp           groups: [0 2 4 6] [1 3 5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp_shard     groups: [0 2] [1 3] [4 6] [5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp_replicate groups: [0 4] [1 5] [2 6] [3 7]\n"), "describe: %s", buf);
    char text[128];
    EXPECT(!strcmp(topology_layout_text(&g, false, "=", " ", text, sizeof text),
                   "tp=2 cp=1 dp=4 dp_shard=2 dp_replicate=2 ep=1 pp=1"), "sizes: %s", text);
    // Context parallelism, (tp, cp, dp, pp) = (2, 2, 2, 1), by hand: rank = t +
    // 2 * (c + 2 * d). The ring is the ranks of one tensor rank and data rank,
    // the data ranks exclude cp, the gradient group spans both.
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf - 1, "w");
    g = topology_layout(2, 1, 2, 0, 2);
    topology_describe(f, &g);
    fclose(f);
    EXPECT(strstr(buf, "grid: tp=2 cp=2 ep=1 dp_shard=2 dp_replicate=1 pp=1 (8 ranks)"), "describe: %s", buf);
    EXPECT(strstr(buf, "tp           groups: [0 1] [2 3] [4 5] [6 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "cp           groups: [0 2] [1 3] [4 6] [5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp           groups: [0 4] [1 5] [2 6] [3 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp_cp        groups: [0 2 4 6] [1 3 5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp_shard_cp  groups: [0 2 4 6] [1 3 5 7]\n"), "describe: %s", buf);
    EXPECT(!strcmp(topology_layout_text(&g, false, "=", " ", text, sizeof text),
                   "tp=2 cp=2 dp=2 dp_shard=2 dp_replicate=1 ep=1 pp=1"), "sizes: %s", text);
    // Hybrid sharding with cp, (tp, cp, dp_shard, dp_replicate) = (1, 2, 2, 2):
    // rank = c + 2 * (s + 2 * r); the shard group is shard x context.
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf - 1, "w");
    g = topology_layout(1, 1, 4, 2, 2);
    topology_describe(f, &g);
    fclose(f);
    EXPECT(strstr(buf, "dp_shard_cp  groups: [0 1 2 3] [4 5 6 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp_replicate groups: [0 4] [1 5] [2 6] [3 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp           groups: [0 2 4 6] [1 3 5 7]\n"), "describe: %s", buf);
    // Expert parallelism, (tp, dp, ep) = (2, 4, 2), by hand: rank = t + 2 * (e
    // + 2 * s); the ep group is consecutive data ranks, the expert gradient
    // group the data ranks of one ep coordinate.
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf - 1, "w");
    g = topology_layout_ep(2, 1, 4, 0, 1, 2);
    topology_describe(f, &g);
    fclose(f);
    EXPECT(strstr(buf, "grid: tp=2 cp=1 ep=2 dp_shard=2 dp_replicate=1 pp=1 (8 ranks)"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp           groups: [0 2 4 6] [1 3 5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "ep           groups: [0 2] [1 3] [4 6] [5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "expert_dp    groups: [0 4] [1 5] [2 6] [3 7]\n"), "describe: %s", buf);
    EXPECT(!strcmp(topology_layout_text(&g, false, "=", " ", text, sizeof text),
                   "tp=2 cp=1 dp=4 dp_shard=4 dp_replicate=1 ep=2 pp=1"), "sizes: %s", text);
    // The phrase of the start line and `ckpt info`: the axes (dp_shard the key's / ep).
    EXPECT(!strcmp(topology_layout_line(&g, text, sizeof text),
                   "world 8 = tp 2 x cp 1 x ep 2 x dp_shard 2 x dp_replicate 1 x pp 1"), "line: %s", text);
}

// comm_self: reductions leave data, scatter/gather copy, requests complete.
static void test_comm_self(void) {
    struct topology topo;
    topology_init_self(&topo);
    EXPECT(topology_group(&topo, GROUP_TP)->size == 1 && topology_group(&topo, GROUP_EMBED)->size == 1 &&
               topo.world.rank == 0, "self topology sizes");
    struct comm_group *g = topology_group(&topo, GROUP_DP);
    double x[3] = {1.5, -2, 3};
    comm_all_reduce(g, x, 3, DTYPE_FP64, COMM_SUM);
    EXPECT(x[0] == 1.5 && x[1] == -2 && x[2] == 3, "self all_reduce changed data");
    struct comm_request req;
    int64_t n[2] = {7, 1LL << 40};
    comm_all_reduce_start(g, n, 2, DTYPE_I64, COMM_MAX, &req);
    EXPECT(comm_all_reduce_test(&req), "self request not done at once");
    comm_all_reduce_wait(&req);
    EXPECT(req.done && n[0] == 7 && n[1] == 1LL << 40, "self non-blocking all_reduce");
    float src[4] = {1, 2, 3, 4}, dst[4] = {-1, -1, -1, -1};
    comm_reduce_scatter(g, src, dst, 4, DTYPE_FP32, COMM_SUM);
    EXPECT(!memcmp(src, dst, sizeof src), "self reduce_scatter copies");
    float gat[2] = {-1, -1};
    comm_all_gather(g, src, gat, 2, DTYPE_FP32);
    EXPECT(gat[0] == 1 && gat[1] == 2, "self all_gather copies");
    comm_all_gather(g, gat, gat, 2, DTYPE_FP32); // in place
    EXPECT(gat[0] == 1 && gat[1] == 2, "self all_gather in place");
    comm_broadcast(g, x, 3, DTYPE_FP64, 0);
    comm_barrier(g);
    EXPECT(x[2] == 3, "self broadcast");
    // All-to-all-v: the chunk to itself lands at its displacement, gaps stay poison.
    const enum dtype a2a_dtypes[] = {DTYPE_FP32, DTYPE_BF16, DTYPE_I32};
    for (int v = 0; v < A2A_VARIANTS; v++)
        for (int k = 0; k < 3; k++)
            if (a2a_takes((enum a2a_variant)v, a2a_dtypes[k]))
                EXPECT(a2a_run_host(g, (enum a2a_variant)v, a2a_dtypes[k]) == 0,
                       "self all_to_all_v %s %s: wrong elements", a2a_variant_names[v],
                       dtype_name(a2a_dtypes[k]));
    topology_free(&topo);
    EXPECT(topo.host[GROUP_TP].ops == NULL && topo.host[GROUP_TP].size == 0, "free zeroes groups");
}

// The wrappers reject misuse with exit 1 (a bug in trident, not bad input).
// Each case runs in a child process; its message goes to the test log.
static void test_wrapper_checks(void) {
    const char *cases[] = {"root out of range", "fp16 reduction", "send to self",
                           "not a member", "reduce_scatter overlap", "bf16 max",
                           "all_to_all_v own counts differ", "all_to_all_v overlap"};
    for (int c = 0; c < 8; c++) {
        pid_t pid = fork();
        if (pid == 0) {
            struct comm_group self, none;
            comm_self_init(&self);
            none = self;
            none.size = 0; // as on a middle stage's embedding group
            float x[4] = {0};
            switch (c) {
            case 0: comm_broadcast(&self, x, 4, DTYPE_FP32, 1); break;
            case 1: comm_all_reduce(&self, x, 2, DTYPE_FP16, COMM_SUM); break;
            case 2: comm_send(&self, x, 4, DTYPE_FP32, 0, 0); break;
            case 3: comm_all_reduce(&none, x, 4, DTYPE_FP32, COMM_SUM); break;
            case 4: comm_reduce_scatter(&self, x, x + 1, 2, DTYPE_FP32, COMM_SUM); break;
            case 5: comm_all_reduce(&self, x, 2, DTYPE_BF16, COMM_MAX); break; // sums only
            case 6: { // 2 elements to itself, 1 expected from itself
                size_t two = 2, one = 1, zero = 0;
                comm_all_to_all_v(&self, x, &two, &zero, x + 2, &one, &zero, DTYPE_FP32);
                break;
            }
            case 7: { // recv [1, 3) inside send [0, 2)
                size_t two = 2, zero = 0;
                comm_all_to_all_v(&self, x, &two, &zero, x + 1, &two, &zero, DTYPE_FP32);
                break;
            }
            }
            _exit(0); // the check did not fire
        }
        int status = 0;
        waitpid(pid, &status, 0);
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 1, "%s: child status %d", cases[c],
               status);
    }
}

// The device of a rank: node-local rank modulo the visible devices; before
// topology_init_device the device-buffer groups are the host (MPI) groups,
// and comm_self is not stream-ordered (callers synchronize before it).
static void test_device_of(void) {
    struct topology topo;
    topology_init_self(&topo);
    int want[][3] = {{0, 8, 0}, {7, 8, 7}, {5, 4, 1}, {3, 1, 0}, {2, 3, 2}, {6, 3, 0}};
    for (int i = 0; i < 6; i++) {
        topo.local_rank = want[i][0];
        EXPECT(topology_device_of(&topo, want[i][1]) == want[i][2],
               "node-local rank %d with %d devices: device %d, expected %d", want[i][0],
               want[i][1], topology_device_of(&topo, want[i][1]), want[i][2]);
    }
    for (int k = 0; k < GROUP_COUNT; k++)
        EXPECT(topology_device_group(&topo, (enum group_kind)k) ==
                   topology_group(&topo, (enum group_kind)k),
               "%s: device group is not the host group before topology_init_device",
               topology_group_name((enum group_kind)k));
    EXPECT(!comm_stream_ordered(topology_group(&topo, GROUP_TP)) && !comm_stream_ordered(NULL),
           "comm_self or NULL claims stream ordering");
    topology_free(&topo);
}

int main(void) {
    test_lists();
    test_layouts();
    test_table_222();
    test_embed();
    test_describe();
    test_comm_self();
    test_wrapper_checks();
    test_device_of();
    return test_finish("test_topology");
}
