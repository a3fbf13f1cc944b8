// test_topology.c: the pure grid functions (no MPI): rank <-> coord round
// trips over many layouts, Megatron order properties, group membership
// against a table written out by hand for (tp, pp, dp) = (2, 2, 2), and the
// comm_self group and topology_init_self, device selection.
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "parallel/comm.h"
#include "parallel/topology.h"
#include "test.h"

static int same_members(const int *a, int na, const int *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

// Every layout with sizes 1..6: coord_of inverts rank_of, coordinates stay in
// range, TP groups are tp consecutive ranks starting at a multiple of tp, the
// pipeline stage is rank / (tp * dp), and each kind of group partitions ranks
// (every member of my group sees the same group).
static void test_layouts(void) {
    int members[8], other[8];
    for (int tp = 1; tp <= 6; tp++)
        for (int pp = 1; pp <= 6; pp++)
            for (int dp = 1; dp <= 6; dp++) {
                int n = tp * pp * dp, bad = 0;
                for (int r = 0; r < n; r++) {
                    struct grid_coord c = topology_coord_of(tp, pp, dp, r);
                    bad += c.t < 0 || c.t >= tp || c.d < 0 || c.d >= dp || c.p < 0 || c.p >= pp;
                    bad += topology_rank_of(tp, pp, dp, c) != r;
                    bad += c.p != r / (tp * dp);
                    int nt = topology_group_members(GROUP_TP, tp, pp, dp, c, members);
                    bad += nt != tp || members[0] != r - r % tp;
                    for (int i = 0; i < nt; i++) bad += members[i] != members[0] + i;
                    bad += topology_group_members(GROUP_DP, tp, pp, dp, c, members) != dp;
                    bad += topology_group_members(GROUP_PP, tp, pp, dp, c, members) != pp;
                    int ne = topology_group_members(GROUP_EMBED, tp, pp, dp, c, members);
                    bad += ne != (c.p == 0 || c.p == pp - 1 ? MIN(pp, 2) : 0);
                    for (int k = 0; k < GROUP_COUNT; k++) {
                        int nk = topology_group_members(k, tp, pp, dp, c, members), has_me = 0;
                        for (int i = 0; i < nk; i++) {
                            has_me += members[i] == r;
                            struct grid_coord cm = topology_coord_of(tp, pp, dp, members[i]);
                            int no = topology_group_members(k, tp, pp, dp, cm, other);
                            bad += !same_members(members, nk, other, no);
                        }
                        bad += nk > 0 && has_me != 1;
                    }
                }
                EXPECT(bad == 0, "layout tp=%d pp=%d dp=%d: %d violations", tp, pp, dp, bad);
            }
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
    int members[8];
    for (int r = 0; r < 8; r++) {
        struct grid_coord c = topology_coord_of(2, 2, 2, r);
        EXPECT(c.t == coord[r][0] && c.d == coord[r][1] && c.p == coord[r][2],
               "rank %d: coord (%d,%d,%d)", r, c.t, c.d, c.p);
        for (int k = 0; k < 3; k++) {
            int n = topology_group_members(kinds[k], 2, 2, 2, c, members);
            EXPECT(same_members(members, n, groups[r][k], 2), "rank %d %s group [%d %d] (n=%d)",
                   r, topology_group_name(kinds[k]), members[0], members[1], n);
        }
        // pp == 2: the embedding group {first, last stage} is the pp group.
        int n = topology_group_members(GROUP_EMBED, 2, 2, 2, c, members);
        EXPECT(same_members(members, n, groups[r][2], 2), "rank %d embed group", r);
    }
}

// Embedding groups: middle stages are out, pp == 1 is the rank alone.
static void test_embed(void) {
    int members[8];
    // (tp, pp, dp) = (1, 3, 1): ranks 0, 1, 2 are stages 0, 1, 2.
    int n = topology_group_members(GROUP_EMBED, 1, 3, 1, topology_coord_of(1, 3, 1, 0), members);
    EXPECT(n == 2 && members[0] == 0 && members[1] == 2, "pp=3 stage 0: n=%d", n);
    n = topology_group_members(GROUP_EMBED, 1, 3, 1, topology_coord_of(1, 3, 1, 1), members);
    EXPECT(n == 0, "pp=3 middle stage is in an embedding group of %d", n);
    // (tp, pp, dp) = (2, 1, 2): rank 3 alone.
    n = topology_group_members(GROUP_EMBED, 2, 1, 2, topology_coord_of(2, 1, 2, 3), members);
    EXPECT(n == 1 && members[0] == 3, "pp=1: n=%d first %d", n, members[0]);
}

static void test_describe(void) {
    char buf[1024] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    topology_describe(f, 2, 2, 2);
    fclose(f);
    EXPECT(strstr(buf, "tp    groups: [0 1] [2 3] [4 5] [6 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "dp    groups: [0 2] [1 3] [4 6] [5 7]\n"), "describe: %s", buf);
    EXPECT(strstr(buf, "pp    groups: [0 4] [1 5] [2 6] [3 7]\n"), "describe: %s", buf);
}

// comm_self: reductions leave data, scatter/gather copy, requests complete.
static void test_comm_self(void) {
    struct topology topo;
    topology_init_self(&topo);
    EXPECT(topo.tp_group.size == 1 && topo.embed_group.size == 1 && topo.world.rank == 0,
           "self topology sizes");
    struct comm_group *g = &topo.dp_group;
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
    topology_free(&topo);
    EXPECT(topo.tp_group.ops == NULL && topo.tp_group.size == 0, "free zeroes groups");
}

// The wrappers reject misuse with exit 1 (a bug in trident, not bad input).
// Each case runs in a child process; its message goes to the test log.
static void test_wrapper_checks(void) {
    const char *cases[] = {"root out of range", "fp16 reduction", "send to self",
                           "not a member", "reduce_scatter overlap", "bf16 max"};
    for (int c = 0; c < 6; c++) {
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
    EXPECT(!comm_stream_ordered(&topo.tp_group) && !comm_stream_ordered(NULL),
           "comm_self or NULL claims stream ordering");
    topology_free(&topo);
}

int main(void) {
    test_layouts();
    test_table_222();
    test_embed();
    test_describe();
    test_comm_self();
    test_wrapper_checks();
    test_device_of();
    return test_finish("test_topology");
}
