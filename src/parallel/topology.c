// topology.c: the grid module: ranks to grid coordinates, groups' members,
// and the MPI and NCCL communicators of each group, all derived from the
// axis and group lists of axes_list.h (docs/design.md §2). The only file
// that turns sizes into ranks (tests/layering/check_grid.py).
#include "topology.h"

#include <string.h>

#include "base/mpi_util.h"
#include "comm_mpi.h"
#ifdef TRIDENT_CUDA
#include "comm_nccl.h"
#endif

static const struct {
    const char *name, *key;
} axes[AXIS_COUNT] = {
#define AXIS_ROW(ID, name, key, doc) {name, key},
    GRID_AXES(AXIS_ROW)
#undef AXIS_ROW
};

static const struct {
    const char *name;
    unsigned axes;
    bool ends, size, critical;
} groups[GROUP_COUNT] = {
#define GROUP_ROW(ID, name, axes, ends, size, critical, carries) {name, axes, ends, size, critical},
    GRID_GROUPS(GROUP_ROW)
#undef GROUP_ROW
};

const char *topology_axis_name(enum grid_axis a) {
    CHECK(a >= 0 && a < AXIS_COUNT, "no axis %d", (int)a);
    return axes[a].name;
}

const char *topology_axis_key(enum grid_axis a) {
    CHECK(a >= 0 && a < AXIS_COUNT, "no axis %d", (int)a);
    return axes[a].key;
}

const char *topology_group_name(enum group_kind kind) {
    return kind >= 0 && kind < GROUP_COUNT ? groups[kind].name : "?";
}

unsigned topology_group_axes(enum group_kind kind) {
    CHECK(kind >= 0 && kind < GROUP_COUNT, "no group of kind %d", (int)kind);
    return groups[kind].axes;
}

bool topology_group_is_size(enum group_kind kind) {
    CHECK(kind >= 0 && kind < GROUP_COUNT, "no group of kind %d", (int)kind);
    return groups[kind].size;
}

bool topology_group_is_ends(enum group_kind kind) {
    CHECK(kind >= 0 && kind < GROUP_COUNT, "no group of kind %d", (int)kind);
    return groups[kind].ends;
}

static bool has_axis(enum group_kind kind, int a) { return groups[kind].axes >> a & 1u; }

// The one axis of an `ends` group (a CHECK when the list gives it several).
static int ends_axis(enum group_kind kind) {
    int found = -1;
    for (int a = 0; a < AXIS_COUNT; a++)
        if (has_axis(kind, a)) {
            CHECK(found < 0, "group %s: an ends group spans one axis", groups[kind].name);
            found = a;
        }
    return found;
}

struct grid_layout topology_layout(int tp, int pp, int dp, int dp_shard, int cp) {
    return topology_layout_ep(tp, pp, dp, dp_shard, cp, 1);
}

struct grid_layout topology_layout_ep(int tp, int pp, int dp, int dp_shard, int cp, int ep) {
    if (dp_shard == 0) dp_shard = dp;
    CHECK(tp >= 1 && pp >= 1 && dp >= 1 && dp_shard >= 1 && dp % dp_shard == 0 && cp >= 1 &&
              ep >= 1 && dp_shard % ep == 0,
          "layout tp %d pp %d dp %d dp_shard %d cp %d ep %d", tp, pp, dp, dp_shard, cp, ep);
    struct grid_layout g;
    g.size[AXIS_TP] = tp;
    g.size[AXIS_CP] = cp;
    g.size[AXIS_EP] = ep;
    g.size[AXIS_DP_SHARD] = dp_shard / ep;
    g.size[AXIS_DP_REPLICATE] = dp / dp_shard;
    g.size[AXIS_PP] = pp;
    return g;
}

int topology_group_size(const struct grid_layout *g, enum group_kind kind) {
    if (groups[kind].ends) return MIN(g->size[ends_axis(kind)], 2);
    int n = 1;
    for (int a = 0; a < AXIS_COUNT; a++)
        if (has_axis(kind, a)) n *= g->size[a];
    return n;
}

int topology_world_size(const struct grid_layout *g) {
    int n = 1;
    for (int a = 0; a < AXIS_COUNT; a++) n *= g->size[a];
    return n;
}

int topology_layout_sizes(const struct grid_layout *g, bool axes_only, const char **names,
                          int *sizes) {
    int n = 0;
    if (axes_only)
        for (int a = 0; a < AXIS_COUNT; a++) names[n] = axes[a].name, sizes[n++] = g->size[a];
    else
        for (int k = 0; k < GROUP_COUNT; k++)
            if (topology_group_is_size((enum group_kind)k))
                names[n] = groups[k].name, sizes[n++] = topology_group_size(g, (enum group_kind)k);
    return n;
}

char *topology_layout_text(const struct grid_layout *g, bool axes_only, const char *assign,
                           const char *sep, char *buf, size_t cap) {
    const char *names[GROUP_COUNT + AXIS_COUNT];
    int sizes[GROUP_COUNT + AXIS_COUNT], n = topology_layout_sizes(g, axes_only, names, sizes);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s%s%d", i ? sep : "", names[i], assign,
                         sizes[i]);
        len += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

char *topology_layout_line(const struct grid_layout *g, char *buf, size_t cap) {
    char axes_text[256];
    snprintf(buf, cap, "world %d = %s", topology_world_size(g),
             topology_layout_text(g, true, " ", " x ", axes_text, sizeof axes_text));
    return buf;
}

// Mixed radix over the axes in list order, the first fastest.
int topology_rank_of(const struct grid_layout *g, struct grid_coord c) {
    int rank = 0;
    for (int a = AXIS_COUNT - 1; a >= 0; a--) rank = rank * g->size[a] + c.at[a];
    return rank;
}

struct grid_coord topology_coord_of(const struct grid_layout *g, int rank) {
    struct grid_coord c;
    for (int a = 0; a < AXIS_COUNT; a++) {
        c.at[a] = rank % g->size[a];
        rank /= g->size[a];
    }
    return c;
}

// Mixed radix over the axes in (inside = true) or outside kind's mask.
static int radix_over(const struct grid_layout *g, enum group_kind kind, struct grid_coord c,
                      bool inside) {
    int r = 0;
    for (int a = AXIS_COUNT - 1; a >= 0; a--)
        if (has_axis(kind, a) == inside) r = r * g->size[a] + c.at[a];
    return r;
}

// Whether c is in a group of kind: every coordinate but an `ends` group's
// middle ones.
static bool in_group(const struct grid_layout *g, enum group_kind kind, struct grid_coord c) {
    if (!groups[kind].ends) return true;
    int a = ends_axis(kind);
    return c.at[a] == 0 || c.at[a] == g->size[a] - 1;
}

int topology_group_rank(const struct grid_layout *g, enum group_kind kind, struct grid_coord c) {
    if (!in_group(g, kind, c)) return -1;
    if (groups[kind].ends) return c.at[ends_axis(kind)] == 0 ? 0 : 1;
    return radix_over(g, kind, c, true);
}

int topology_group_index(const struct grid_layout *g, enum group_kind kind, struct grid_coord c) {
    return in_group(g, kind, c) ? radix_over(g, kind, c, false) : -1;
}

// Enumerates the group by setting kind's coordinates of c to each group
// rank in turn (independent of the split colours, which come from
// topology_group_index and topology_group_rank, so the test checks each
// against the other).
int topology_group_members(const struct grid_layout *g, enum group_kind kind, struct grid_coord c,
                           int *members) {
    if (!in_group(g, kind, c)) return 0;
    int n = topology_group_size(g, kind);
    for (int i = 0; i < n; i++) {
        struct grid_coord m = c;
        if (groups[kind].ends) {
            int a = ends_axis(kind);
            m.at[a] = i == 0 ? 0 : g->size[a] - 1;
        } else {
            for (int a = 0, rest = i; a < AXIS_COUNT; a++)
                if (has_axis(kind, a)) {
                    m.at[a] = rest % g->size[a];
                    rest /= g->size[a];
                }
        }
        members[i] = topology_rank_of(g, m);
    }
    return n;
}

int topology_rank_in(const struct topology *topo, enum group_kind kind) {
    return topology_group_rank(&topo->layout, kind, topo->coord);
}

struct comm_group *topology_group(struct topology *topo, enum group_kind kind) {
    CHECK(kind >= 0 && kind < GROUP_COUNT, "no group of kind %d", (int)kind);
    return &topo->host[kind];
}

static void describe_kind(FILE *f, const struct grid_layout *g, enum group_kind kind) {
    enum { MAX_SHOWN = 16 };
    int n_ranks = topology_world_size(g), n_groups = 0;
    int *members = xmalloc(sizeof(int) * (size_t)n_ranks);
    fprintf(f, "  %-12s groups:", topology_group_name(kind));
    for (int r = 0; r < n_ranks; r++) {
        int n = topology_group_members(g, kind, topology_coord_of(g, r), members);
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

void topology_describe(FILE *f, const struct grid_layout *g) {
    char text[256];
    fprintf(f, "grid: %s (%d ranks), rank order:",
            topology_layout_text(g, true, "=", " ", text, sizeof text), topology_world_size(g));
    for (int a = 0; a < AXIS_COUNT; a++) fprintf(f, " %s", axes[a].name);
    fprintf(f, " (first fastest)\n");
    for (int k = 0; k < GROUP_COUNT; k++) describe_kind(f, g, (enum group_kind)k);
}

enum status topology_init(MPI_Comm world, const struct grid_layout *layout, struct topology *out,
                          struct error *err) {
    memset(out, 0, sizeof *out);
    int rank, size;
    CHECK_MPI(MPI_Comm_rank(world, &rank));
    CHECK_MPI(MPI_Comm_size(world, &size));
    long long n = 1;
    bool sane = true;
    for (int a = 0; a < AXIS_COUNT; a++) n *= layout->size[a], sane = sane && layout->size[a] >= 1;
    if (!sane || n != size) {
        char text[256];
        return error_set(err, STATUS_BAD_INPUT,
                         "[parallel] %s = %lld ranks, but the job has N=%d ranks; set the product "
                         "= N (each at least 1)",
                         topology_layout_text(layout, true, "=", " * ", text, sizeof text), n,
                         size);
    }
    out->world_rank = rank;
    out->world_size = size;
    out->layout = *layout;
    out->coord = topology_coord_of(layout, rank);

    MPI_Comm node;
    CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    CHECK_MPI(MPI_Comm_rank(node, &out->local_rank));
    CHECK_MPI(MPI_Comm_size(node, &out->local_size));
    CHECK_MPI(MPI_Comm_free(&node));

    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(world, &dup));
    comm_mpi_init(&out->world, dup);

    // Every rank runs this same loop: one split per kind, in list order. The
    // colour indexes the group among those of its kind, the key orders ranks
    // within it.
    int *members = xmalloc(sizeof(int) * (size_t)size);
    for (int k = 0; k < GROUP_COUNT; k++) {
        enum group_kind kind = (enum group_kind)k;
        int color = topology_group_index(layout, kind, out->coord);
        int key = topology_group_rank(layout, kind, out->coord);
        MPI_Comm comm;
        CHECK_MPI(MPI_Comm_split(world, color < 0 ? MPI_UNDEFINED : color, MAX(key, 0), &comm));
        struct comm_group *g = topology_group(out, kind);
        comm_mpi_init(g, comm);
        int n = topology_group_members(layout, kind, out->coord, members);
        CHECK(g->size == n && (n == 0 || members[g->rank] == rank),
              "%s group of rank %d: MPI size %d rank %d, layout expects %d members",
              topology_group_name(kind), rank, g->size, g->rank, n);
    }
    free(members);
    return STATUS_OK;
}

void topology_init_self(struct topology *out) {
    memset(out, 0, sizeof *out);
    out->world_size = 1;
    out->layout = topology_layout(1, 1, 1, 0, 1);
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
                           groups[k].critical); // on the step's critical path
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
