// topology.c: ranks to grid coordinates, and the MPI communicators of each
// group (docs/design.md §2).
#include "topology.h"

#include <string.h>

#include "base/mpi_util.h"
#include "comm_mpi.h"
#ifdef TRIDENT_CUDA
#include "comm_nccl.h"
#endif

int topology_rank_of(int tp, int pp, int dp, struct grid_coord c) {
    return c.t + tp * (c.d + dp * c.p);
}

struct grid_coord topology_coord_of(int tp, int pp, int dp, int rank) {
    struct grid_coord c;
    c.t = rank % tp;
    c.d = (rank / tp) % dp;
    c.p = rank / (tp * dp);
    return c;
}

const char *topology_group_name(enum group_kind kind) {
    switch (kind) {
    case GROUP_TP: return "tp";
    case GROUP_DP: return "dp";
    case GROUP_PP: return "pp";
    case GROUP_EMBED: return "embed";
    case GROUP_COUNT: break;
    }
    return "?";
}

// Enumerates the group by varying one coordinate of c (independent of the
// split colours below, so each checks the other).
int topology_group_members(enum group_kind kind, int tp, int pp, int dp, struct grid_coord c,
                           int *members) {
    int n = 0;
    struct grid_coord m = c;
    switch (kind) {
    case GROUP_TP:
        for (m.t = 0; m.t < tp; m.t++) members[n++] = topology_rank_of(tp, pp, dp, m);
        break;
    case GROUP_DP:
        for (m.d = 0; m.d < dp; m.d++) members[n++] = topology_rank_of(tp, pp, dp, m);
        break;
    case GROUP_PP:
        for (m.p = 0; m.p < pp; m.p++) members[n++] = topology_rank_of(tp, pp, dp, m);
        break;
    case GROUP_EMBED:
        if (c.p != 0 && c.p != pp - 1) break;
        m.p = 0;
        members[n++] = topology_rank_of(tp, pp, dp, m);
        if (pp > 1) {
            m.p = pp - 1;
            members[n++] = topology_rank_of(tp, pp, dp, m);
        }
        break;
    case GROUP_COUNT: break;
    }
    return n;
}

// MPI_Comm_split colour and key of c's group of kind: the colour indexes the
// group among those of its kind, the key orders ranks within it.
static int group_color(enum group_kind kind, int tp, int pp, int dp, struct grid_coord c,
                       int *key) {
    switch (kind) {
    case GROUP_TP: *key = c.t; return c.d + dp * c.p;
    case GROUP_DP: *key = c.d; return c.t + tp * c.p;
    case GROUP_PP: *key = c.p; return c.t + tp * c.d;
    case GROUP_EMBED:
        *key = c.p;
        return (c.p == 0 || c.p == pp - 1) ? c.t + tp * c.d : MPI_UNDEFINED;
    case GROUP_COUNT: break;
    }
    *key = 0;
    return MPI_UNDEFINED;
}

struct comm_group *topology_group(struct topology *topo, enum group_kind kind) {
    switch (kind) {
    case GROUP_TP: return &topo->tp_group;
    case GROUP_DP: return &topo->dp_group;
    case GROUP_PP: return &topo->pp_group;
    case GROUP_EMBED: return &topo->embed_group;
    case GROUP_COUNT: break;
    }
    CHECK(0, "no group of kind %d", (int)kind);
}

static void describe_kind(FILE *f, enum group_kind kind, int tp, int pp, int dp) {
    enum { MAX_SHOWN = 16 };
    int n_ranks = tp * pp * dp, n_groups = 0;
    int *members = xmalloc(sizeof(int) * (size_t)MAX(tp, MAX(pp, dp)));
    fprintf(f, "  %-5s groups:", topology_group_name(kind));
    for (int r = 0; r < n_ranks; r++) {
        int n = topology_group_members(kind, tp, pp, dp, topology_coord_of(tp, pp, dp, r), members);
        if (n == 0 || members[0] != r) continue; // print each group once, at its first rank
        if (n_groups++ >= MAX_SHOWN) continue;
        fputs(" [", f);
        for (int i = 0; i < n; i++) fprintf(f, i ? " %d" : "%d", members[i]);
        fputc(']', f);
    }
    if (n_groups > MAX_SHOWN) fprintf(f, " ... (%d groups)", n_groups);
    fputc('\n', f);
    free(members);
}

void topology_describe(FILE *f, int tp, int pp, int dp) {
    fprintf(f, "grid: tp=%d pp=%d dp=%d (%d ranks), rank = t + tp * (d + dp * p)\n", tp, pp, dp,
            tp * pp * dp);
    for (int k = 0; k < GROUP_COUNT; k++) describe_kind(f, (enum group_kind)k, tp, pp, dp);
}

enum status topology_init(MPI_Comm world, int tp, int pp, int dp, struct topology *out,
                          struct error *err) {
    memset(out, 0, sizeof *out);
    int rank, size;
    CHECK_MPI(MPI_Comm_rank(world, &rank));
    CHECK_MPI(MPI_Comm_size(world, &size));
    if (tp < 1 || pp < 1 || dp < 1 || (long)tp * pp * dp != size)
        return error_set(err, STATUS_BAD_INPUT,
                         "[parallel] tp=%d * pp=%d * dp=%d = %ld ranks, but the job has N=%d ranks; "
                         "set tp * pp * dp = N (each at least 1)",
                         tp, pp, dp, (long)tp * pp * dp, size);
    out->world_rank = rank;
    out->world_size = size;
    out->tp = tp;
    out->pp = pp;
    out->dp = dp;
    out->coord = topology_coord_of(tp, pp, dp, rank);

    MPI_Comm node;
    CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    CHECK_MPI(MPI_Comm_rank(node, &out->local_rank));
    CHECK_MPI(MPI_Comm_size(node, &out->local_size));
    CHECK_MPI(MPI_Comm_free(&node));

    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(world, &dup));
    comm_mpi_init(&out->world, dup);

    // Every rank runs this same loop: one split per kind, in kind order.
    int *members = xmalloc(sizeof(int) * (size_t)MAX(tp, MAX(pp, dp)));
    for (int k = 0; k < GROUP_COUNT; k++) {
        int key, color = group_color((enum group_kind)k, tp, pp, dp, out->coord, &key);
        MPI_Comm comm;
        CHECK_MPI(MPI_Comm_split(world, color, key, &comm));
        struct comm_group *g = topology_group(out, (enum group_kind)k);
        comm_mpi_init(g, comm);
        int n = topology_group_members((enum group_kind)k, tp, pp, dp, out->coord, members);
        CHECK(g->size == n && (n == 0 || members[g->rank] == rank),
              "%s group of rank %d: MPI size %d rank %d, layout expects %d members",
              topology_group_name((enum group_kind)k), rank, g->size, g->rank, n);
    }
    free(members);
    return STATUS_OK;
}

void topology_init_self(struct topology *out) {
    memset(out, 0, sizeof *out);
    out->world_size = out->tp = out->pp = out->dp = 1;
    out->local_size = 1;
    for (int k = 0; k < GROUP_COUNT; k++) comm_self_init(topology_group(out, (enum group_kind)k));
    comm_self_init(&out->world);
}

enum status topology_init_device(struct topology *topo, struct backend *be, struct error *err) {
#ifdef TRIDENT_CUDA
    for (int k = 0; k < GROUP_COUNT; k++) {
        const struct comm_group *host = topology_group(topo, (enum group_kind)k);
        struct comm_group *g = &topo->device[k];
        if (host->size == 1) comm_self_init(g);
        else if (host->size > 1)
            comm_nccl_init(g, host, be, topology_group_name((enum group_kind)k),
                           k == GROUP_TP || k == GROUP_PP); // on the critical path
        else memset(g, 0, sizeof *g); // not a member: nothing to join
    }
    topo->has_device_groups = true;
    return STATUS_OK;
#else
    return error_set(err, STATUS_BAD_INPUT, "device groups need NCCL: this build has no CUDA "
                     "backend; rebuild with make CUDA=1");
#endif
}

int topology_check_device_groups(void *topo, char *msg, size_t cap) {
    struct topology *t = topo;
    if (!t->has_device_groups) return 0;
    for (int k = 0; k < GROUP_COUNT; k++)
        if (comm_check(&t->device[k], msg, cap)) return 1;
    return 0;
}

struct comm_group *topology_device_group(struct topology *topo, enum group_kind kind) {
    CHECK(kind >= 0 && kind < GROUP_COUNT, "no group of kind %d", (int)kind);
    return topo->has_device_groups ? &topo->device[kind] : topology_group(topo, kind);
}

int topology_device_of(const struct topology *topo, int device_count) {
    CHECK(device_count >= 1, "topology_device_of: %d devices", device_count);
    return topo->local_rank % device_count;
}

void topology_free(struct topology *topo) {
    // NCCL communicators first: they were made over the MPI groups.
    for (int k = 0; k < GROUP_COUNT; k++) comm_group_free(&topo->device[k]);
    topo->has_device_groups = false;
    for (int k = 0; k < GROUP_COUNT; k++) comm_group_free(topology_group(topo, (enum group_kind)k));
    comm_group_free(&topo->world);
}
