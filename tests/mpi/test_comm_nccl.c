// test_comm_nccl.c: the NCCL comm table (src/parallel/comm_nccl.c) on device buffers,
// one rank per GPU: run as `mpirun -np G build/mpi/test_comm_nccl` with G <=
// the GPUs of the node (tests/gpu/run.sh), or on CPUs against the emulated
// CUDA and NCCL (`make EMU=1`, tests/e2e/nccl_emulated.sh, 2 and 4 ranks).
//  1. Known values: each rank fills device buffers with rank-dependent values,
//     runs every collective (sum and max all-reduce, the non-blocking
//     start/test/wait, reduce-scatter, all-gather in and out of place,
//     broadcast, a send/recv ring when G > 1, barrier, all-to-all-v with
//     uneven, zero and large counts: tests/unit/all_to_all_case.h) and
//     compares with the values computed on the host. Kernels enqueued after a collective must
//     see its result (stream ordering): the checks read back through the
//     compute stream without any explicit wait.
//  2. Against MPI: every collective x every dtype trident passes to comm
//     (reductions: FP32, FP64, I32, I64 and BF16 sums; data movement also
//     FP16) on pseudo-random inputs, the NCCL group's result on device
//     buffers against the MPI group's (comm_mpi.c) on host copies of the same
//     inputs, byte for byte: BF16 sums round once per pairwise combine in
//     both (the emulation combines in MPI's order, so even 4-rank FP32 and
//     BF16 sums agree exactly; real NCCL on more than 2 GPUs adds along its
//     ring, so there float sums are compared within a few roundings).
//  3. The NCCL API directly (what comm_nccl.c does not reach): communicators
//     whose ranks are not the world's (reversed), communicators of
//     sub-groups created in different orders by different ranks, an in-place
//     reduce-scatter, out-of-place broadcast and all-reduce, and a group in
//     which every rank posts its receive before its send (4 MB each: that
//     order deadlocks unless the group issues them together) next to a
//     collective.
//  4. `--streams` (>= 2 ranks; nccl_emulated.sh): orderings that need streams
//     running apart from the host (see streams()): a TP collective not held
//     behind a DP all-reduce started before it, a deferred send ordered by
//     its producer only. Each deadlocks on the code it guards against.
//  5. `--fault` under TRIDENT_FAULT=nccl:N@R (emulated build): a failed
//     collective ends the job from comm_nccl's waits (see fault()).
// Exit 77 (skipped) in a build without CUDA or on a machine without a device.
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../unit/all_to_all_case.h"
#include "../unit/test.h"
#include "base/common.h"
#include "base/mpi_util.h"
#include "kernels/backend.h"

#ifdef TRIDENT_CUDA
#include <nccl.h>

#include "kernels/cpu/half.h"
#include "kernels/cuda/backend_cuda.h"
#include "parallel/comm_mpi.h"
#include "parallel/comm_nccl.h"

static struct backend *be;

static float *dev_floats(const float *h, size_t n) {
    float *d = backend_alloc(be, n * sizeof(float) + 4);
    CHECK(d, "out of device memory");
    backend_to_device(be, d, h, n * sizeof(float));
    return d;
}

static void read_back(float *h, const float *d, size_t n) {
    backend_to_host(be, h, d, n * sizeof(float)); // on the compute stream: after the collective
}

// ---- 2. against MPI ----------------------------------------------------------------

static const enum dtype all_dtypes[] = {DTYPE_FP32, DTYPE_FP64, DTYPE_I32, DTYPE_I64, DTYPE_BF16, DTYPE_FP16};

// n pseudo-random values of dtype dt, different per rank and seed: floats in
// [-2, 2), I32 in [-2^23, 2^23), I64 in [-2^59, 2^59) (8 ranks sum without overflow).
static void fill(void *buf, enum dtype dt, size_t n, int rank, int seed) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(rank * 131 + seed * 7 + 1);
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(x >> 11) * 0x1p-53 * 4 - 2;
        switch (dt) {
        case DTYPE_FP32: ((float *)buf)[i] = (float)u; break;
        case DTYPE_FP64: ((double *)buf)[i] = u; break;
        case DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)(x >> 40) - (1 << 23); break;
        case DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)(x >> 4) - ((int64_t)1 << 59); break;
        case DTYPE_BF16: ((uint16_t *)buf)[i] = bf16_from_f32((float)u); break;
        case DTYPE_FP16: ((uint16_t *)buf)[i] = fp16_from_f32((float)u); break;
        case DTYPE_FP8_E4M3:
        case DTYPE_FP8_E5M2: ((uint8_t *)buf)[i] = (uint8_t)(x >> 56); break; // not in all_dtypes
        }
    }
}

// Elements of es bytes that differ between a and b.
static size_t differ(const void *a, const void *b, size_t n, size_t es) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0;
    return bad;
}

// A device buffer holding host bytes h.
static void *dev_copy(const void *h, size_t bytes) {
    void *d = backend_alloc(be, bytes + 4);
    CHECK(d, "out of device memory");
    backend_to_device(be, d, h, bytes);
    return d;
}

// Sums of FP32, FP64 and BF16 over the same inputs agree bit for bit when
// they add in the same order: two ranks (one addition), or the emulated
// NCCL, which reduces through MPI (tests/cuda_emu/nccl.h defines
// TRIDENT_NCCL_EMULATED). Real NCCL on more than two GPUs adds along its
// ring: within a few roundings of the sum (|values| < 2 per rank).
static size_t sum_differ(const void *a, const void *b, size_t n, enum dtype dt, int size) {
#ifdef TRIDENT_NCCL_EMULATED
    bool exact = true;
#else
    bool exact = size <= 2;
#endif
    if (exact || dt == DTYPE_I32 || dt == DTYPE_I64) return differ(a, b, n, dtype_size(dt));
    double tol = dt == DTYPE_FP64 ? 1e-12 : dt == DTYPE_FP32 ? 1e-5 : 0.0625 * size;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double x = dt == DTYPE_FP64 ? ((const double *)a)[i] : dt == DTYPE_FP32 ? ((const float *)a)[i] : bf16_to_f32(((const uint16_t *)a)[i]);
        double y = dt == DTYPE_FP64 ? ((const double *)b)[i] : dt == DTYPE_FP32 ? ((const float *)b)[i] : bf16_to_f32(((const uint16_t *)b)[i]);
        bad += !(fabs(x - y) <= tol);
    }
    return bad;
}

static bool reducible(enum dtype dt, enum comm_op op) {
    return dt != DTYPE_FP16 && (dt != DTYPE_BF16 || op == COMM_SUM);
}

static void against_mpi(struct comm_group *g, struct comm_group *mpi) {
    int size = g->size, rank = g->rank;
    const size_t sizes[] = {1037, 70001}; // the second: MPI's large-message algorithms
    for (size_t k = 0; k < sizeof all_dtypes / sizeof *all_dtypes; k++) {
        enum dtype dt = all_dtypes[k];
        size_t es = dtype_size(dt);
        const char *name = dtype_name(dt);
        for (int si = 0; si < 2; si++) {
            size_t n = sizes[si], bytes = n * es;
            char *h = xmalloc(bytes * size), *ref = xmalloc(bytes * size), *out = xmalloc(bytes * size);
            // all-reduce, blocking and started, sum and max
            for (int op = COMM_SUM; op <= COMM_MAX; op++)
                for (int started = 0; started < 2; started++) {
                    if (!reducible(dt, (enum comm_op)op)) continue;
                    fill(h, dt, n, rank, 10 * op + started);
                    memcpy(ref, h, bytes);
                    void *d = dev_copy(h, bytes);
                    // The reference is MPI's blocking all-reduce for both: MPI's
                    // non-blocking one may add in another order (3 ranks).
                    if (started) {
                        struct comm_request req;
                        comm_all_reduce_start(g, d, n, dt, (enum comm_op)op, &req);
                        comm_wait(&req);
                    } else {
                        comm_all_reduce(g, d, n, dt, (enum comm_op)op);
                    }
                    comm_all_reduce(mpi, ref, n, dt, (enum comm_op)op);
                    backend_to_host(be, out, d, bytes);
                    size_t bad = op == COMM_SUM ? sum_differ(out, ref, n, dt, size) : differ(out, ref, n, es);
                    EXPECT(bad == 0, "all_reduce%s %s %s n=%zu: %zu elements differ from MPI's",
                           started ? "_start" : "", op == COMM_SUM ? "sum" : "max", name, n, bad);
                    backend_dealloc(be, d);
                }
            // reduce-scatter: send (size * n,), out of place
            for (int op = COMM_SUM; op <= COMM_MAX; op++) {
                if (!reducible(dt, (enum comm_op)op)) continue;
                fill(h, dt, n * size, rank, 20 + op);
                void *ds = dev_copy(h, bytes * size), *dr = dev_copy(h, bytes);
                comm_reduce_scatter(g, ds, dr, n, dt, (enum comm_op)op);
                comm_reduce_scatter(mpi, h, ref, n, dt, (enum comm_op)op);
                backend_to_host(be, out, dr, bytes);
                size_t bad = op == COMM_SUM ? sum_differ(out, ref, n, dt, size) : differ(out, ref, n, es);
                EXPECT(bad == 0, "reduce_scatter %s %s n=%zu: %zu elements differ from MPI's",
                       op == COMM_SUM ? "sum" : "max", name, n, bad);
                backend_dealloc(be, ds), backend_dealloc(be, dr);
            }
            // all-gather, out of place and in place
            for (int inplace = 0; inplace < 2; inplace++) {
                fill(h, dt, n, rank, 30 + inplace);
                fill(out, dt, n * size, rank, 99); // poison: every chunk must be written
                void *da = dev_copy(out, bytes * size), *dsrc = NULL;
                if (inplace) backend_to_device(be, (char *)da + (size_t)rank * bytes, h, bytes);
                else dsrc = dev_copy(h, bytes);
                comm_all_gather(g, inplace ? (char *)da + (size_t)rank * bytes : dsrc, da, n, dt);
                comm_all_gather(mpi, h, ref, n, dt);
                backend_to_host(be, out, da, bytes * size);
                size_t bad = differ(out, ref, n * size, es);
                EXPECT(bad == 0, "all_gather%s %s n=%zu: %zu elements differ from MPI's",
                       inplace ? " in place" : "", name, n, bad);
                backend_dealloc(be, da);
                if (dsrc) backend_dealloc(be, dsrc);
            }
            // broadcast from the first and the last rank
            for (int root = 0; root < size; root += size > 1 ? size - 1 : 1) {
                fill(h, dt, n, rank, 40 + root);
                memcpy(ref, h, bytes);
                void *d = dev_copy(h, bytes);
                comm_broadcast(g, d, n, dt, root);
                comm_broadcast(mpi, ref, n, dt, root);
                backend_to_host(be, out, d, bytes);
                size_t bad = differ(out, ref, n, es);
                EXPECT(bad == 0, "broadcast from %d %s n=%zu: %zu elements differ from MPI's", root,
                       name, n, bad);
                backend_dealloc(be, d);
                if (size == 1) break;
            }
            // ring of started sends and receives (even ranks send first, as
            // comm_nccl.c requires matching order), then blocking ones
            if (size > 1) {
                int next = (rank + 1) % size, prev = (rank + size - 1) % size;
                for (int blocking = 0; blocking < 2; blocking++) {
                    fill(h, dt, n, rank, 50 + blocking);
                    void *ds = dev_copy(h, bytes), *dr = dev_copy(h, bytes);
                    struct comm_request sreq, rreq, msreq, mrreq;
                    comm_send_start(mpi, h, n, dt, next, 3, &msreq);
                    comm_recv_start(mpi, ref, n, dt, prev, 3, &mrreq);
                    for (int turn = 0; turn < 2; turn++) {
                        if (turn == rank % 2) {
                            if (blocking) comm_send(g, ds, n, dt, next, 3);
                            else comm_send_start(g, ds, n, dt, next, 3, &sreq);
                        } else {
                            if (blocking) comm_recv(g, dr, n, dt, prev, 3);
                            else comm_recv_start(g, dr, n, dt, prev, 3, &rreq);
                        }
                    }
                    if (!blocking) comm_wait(&sreq), comm_wait(&rreq);
                    comm_wait(&msreq), comm_wait(&mrreq);
                    backend_to_host(be, out, dr, bytes);
                    size_t bad = differ(out, ref, n, es);
                    EXPECT(bad == 0, "%s send/recv ring %s n=%zu: %zu elements differ from MPI's",
                           blocking ? "blocking" : "started", name, n, bad);
                    backend_dealloc(be, ds), backend_dealloc(be, dr);
                }
            }
            free(h), free(ref), free(out);
        }
    }
}

// ---- all-to-all-v ----------------------------------------------------------------------

// The cases of tests/unit/all_to_all_case.h on device buffers (uneven counts
// with zeros, a rank sending nothing and one receiving nothing, 80 KB
// chunks, gaps between the chunks on both sides), FP32, BF16 and I32, each
// against the buffer its formulas give. Stream ordering: the send buffer is
// written on the compute stream just before the call and overwritten with
// poison just after it, and the result is read back through the compute
// stream, all without a host wait; a DP-style all-reduce started before
// the all-to-alls is waited on after them. Then every dtype of all_dtypes
// on pseudo-random bytes with the large case's counts: NCCL's result byte
// for byte against MPI_Alltoallv's (comm_mpi.c) on host copies.
static void all_to_all_v(struct comm_group *g, struct comm_group *mpi) {
    int rank = g->rank, size = g->size;
    enum { N = 4096 };
    float *hacc = xmalloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) hacc[i] = (float)rank + (float)i;
    float *dacc = dev_floats(hacc, N);
    struct comm_request req;
    comm_all_reduce_start(g, dacc, N, DTYPE_FP32, COMM_SUM, &req);
    const enum dtype dts[] = {DTYPE_FP32, DTYPE_BF16, DTYPE_I32};
    struct a2a_layout l;
    for (int v = 0; v < A2A_VARIANTS; v++)
        for (int k = 0; k < 3; k++) {
            enum dtype dt = dts[k];
            if (!a2a_takes((enum a2a_variant)v, dt)) continue;
            a2a_layout(&l, (enum a2a_variant)v, rank, size);
            size_t es = dtype_size(dt);
            char *hs = xmalloc(l.send_len * es), *want = xmalloc(l.recv_len * es);
            char *got = xmalloc(l.recv_len * es);
            memset(got, 0xff, l.recv_len * es);
            void *ds = backend_alloc(be, l.send_len * es + 4), *dr = dev_copy(got, l.recv_len * es);
            CHECK(ds, "out of device memory");
            a2a_fill_send(hs, dt, &l, rank, size);
            backend_to_device(be, ds, hs, l.send_len * es); // the producer, on the compute stream
            comm_all_to_all_v(g, ds, l.send_counts, l.send_displs, dr, l.recv_counts, l.recv_displs,
                              dt);
            memset(hs, 0xff, l.send_len * es);
            backend_to_device(be, ds, hs, l.send_len * es); // later compute: unseen by the call
            backend_to_host(be, got, dr, l.recv_len * es);
            a2a_expected(want, dt, &l, (enum a2a_variant)v, rank, size);
            size_t bad = a2a_wrong(got, want, l.recv_len, dt);
            EXPECT(bad == 0, "all_to_all_v %s %s: %zu of %zu elements wrong", a2a_variant_names[v],
                   dtype_name(dt), bad, l.recv_len);
            backend_dealloc(be, ds), backend_dealloc(be, dr);
            free(hs), free(want), free(got);
        }
    comm_wait(&req);
    read_back(hacc, dacc, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += hacc[i] != (float)size * (size - 1) / 2 + (float)size * (float)i;
    EXPECT(bad == 0, "all_reduce_start in flight across all_to_all_v: %d of %d wrong", bad, N);
    backend_dealloc(be, dacc);
    free(hacc);
    // Against MPI, every dtype.
    a2a_layout(&l, A2A_LARGE, rank, size);
    for (size_t k = 0; k < sizeof all_dtypes / sizeof *all_dtypes; k++) {
        enum dtype dt = all_dtypes[k];
        size_t es = dtype_size(dt);
        char *hs = xmalloc(l.send_len * es), *ref = xmalloc(l.recv_len * es);
        char *got = xmalloc(l.recv_len * es);
        fill(hs, dt, l.send_len, rank, 60);
        fill(ref, dt, l.recv_len, rank, 61); // the gaps: the same on both sides, untouched
        memcpy(got, ref, l.recv_len * es);
        void *ds = dev_copy(hs, l.send_len * es), *dr = dev_copy(got, l.recv_len * es);
        comm_all_to_all_v(g, ds, l.send_counts, l.send_displs, dr, l.recv_counts, l.recv_displs,
                          dt);
        comm_all_to_all_v(mpi, hs, l.send_counts, l.send_displs, ref, l.recv_counts,
                          l.recv_displs, dt);
        backend_to_host(be, got, dr, l.recv_len * es);
        size_t nbad = differ(got, ref, l.recv_len, es);
        EXPECT(nbad == 0, "all_to_all_v %s: %zu of %zu elements differ from MPI's", dtype_name(dt),
               nbad, l.recv_len);
        backend_dealloc(be, ds), backend_dealloc(be, dr);
        free(hs), free(ref), free(got);
    }
}

// ---- 3. the NCCL API directly ------------------------------------------------------

#define EXPECT_NCCL(stmt) EXPECT((stmt) == ncclSuccess, "%s", #stmt)

// A communicator over the ranks of MPI communicator m (NCCL rank = nccl_rank),
// the id made by the member of m rank 0 and sent over m.
static ncclComm_t nccl_comm(MPI_Comm m, int nccl_rank) {
    int msize, mrank;
    MPI_Comm_size(m, &msize);
    MPI_Comm_rank(m, &mrank);
    ncclUniqueId id;
    if (mrank == 0) EXPECT_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, m));
    ncclComm_t c = NULL;
    EXPECT_NCCL(ncclCommInitRank(&c, msize, id, nccl_rank));
    int r = -1, n = -1;
    EXPECT_NCCL(ncclCommUserRank(c, &r));
    EXPECT_NCCL(ncclCommCount(c, &n));
    EXPECT(r == nccl_rank && n == msize, "communicator rank %d of %d, expected %d of %d", r, n, nccl_rank, msize);
    return c;
}

static void nccl_api(int rank, int size) {
    cudaStream_t s = (cudaStream_t)backend_cuda_stream(be);
    // Communicators: the world reversed, and pairs (2k, 2k+1); pairs of
    // even k create theirs before the reversed one, the others after it.
    MPI_Comm pair_mpi = MPI_COMM_NULL;
    int pair = size > 1 && !(size % 2 && rank == size - 1);
    CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, pair ? rank / 2 : MPI_UNDEFINED, rank, &pair_mpi));
    ncclComm_t rev, pc = NULL;
    bool pair_first = (rank / 2) % 2 == 0;
    if (pair && pair_first) pc = nccl_comm(pair_mpi, rank % 2);
    MPI_Comm world_rev;
    CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, 0, size - 1 - rank, &world_rev));
    rev = nccl_comm(world_rev, size - 1 - rank);
    if (pair && !pair_first) pc = nccl_comm(pair_mpi, rank % 2);
    int nr = size - 1 - rank; // rank in rev
    enum { n = 1 << 20 };      // 4 MB of FP32: beyond MPI's eager sends
    float *h = xmalloc(sizeof(float) * n * size), *o = xmalloc(sizeof(float) * n * size);

    // In-place reduce-scatter on rev: element j of rank r is (r + 1) * (j % 13),
    // exact in FP32 in any order; chunk nr of the sum lands at buf + nr * n.
    for (size_t j = 0; j < (size_t)n * size; j++) h[j] = (float)(rank + 1) * (float)(j % 13);
    float *d = dev_floats(h, (size_t)n * size);
    EXPECT_NCCL(ncclReduceScatter(d, d + (size_t)nr * n, n, ncclFloat32, ncclSum, rev, s));
    read_back(o, d + (size_t)nr * n, n);
    int bad = 0;
    for (size_t j = 0; j < n; j++)
        bad += o[j] != (float)size * (size + 1) / 2 * (float)(((size_t)nr * n + j) % 13);
    EXPECT(bad == 0, "in-place reduce-scatter on the reversed communicator: %d of %d wrong", bad, n);

    // Out-of-place broadcast from rev's rank 0 (world rank size - 1) and
    // all-reduce (max, int64) on rev.
    for (int j = 0; j < n; j++) h[j] = (float)rank * 3 + (float)j;
    float *src = dev_floats(h, n), *dst = dev_floats(o, n);
    EXPECT_NCCL(ncclBroadcast(src, dst, n, ncclFloat32, 0, rev, s));
    read_back(o, dst, n);
    bad = 0;
    for (int j = 0; j < n; j++) bad += o[j] != (float)(size - 1) * 3 + (float)j;
    EXPECT(bad == 0, "out-of-place broadcast: %d of %d wrong", bad, n);
    int64_t hi[64], ho[64];
    for (int j = 0; j < 64; j++) hi[j] = ((int64_t)rank << 40) - j * (int64_t)rank;
    int64_t *di = dev_copy(hi, sizeof hi), *dout = dev_copy(hi, sizeof hi);
    EXPECT_NCCL(ncclAllReduce(di, dout, 64, ncclInt64, ncclMax, rev, s));
    backend_to_host(be, ho, dout, sizeof ho);
    backend_to_host(be, hi, di, sizeof hi);
    bad = 0;
    for (int j = 0; j < 64; j++)
        bad += ho[j] != (size - 1 ? ((int64_t)(size - 1) << 40) - j * (int64_t)(size - 1) : 0) ||
               hi[j] != ((int64_t)rank << 40) - j * (int64_t)rank;
    EXPECT(bad == 0, "out-of-place int64 max all-reduce: %d of 64 wrong (or the input changed)", bad);

    // One group: on the pair, each receives 4 MB from the other before
    // sending (both first: deadlocks outside a group), and an all-reduce on rev.
    for (int j = 0; j < n; j++) h[j] = (float)rank * 7 + (float)j;
    float *sd = dev_floats(h, n), *rd = dev_floats(h, n), *ar = dev_floats(h, n);
    int peer = 1 - rank % 2;
    EXPECT_NCCL(ncclGroupStart());
    if (pc) EXPECT_NCCL(ncclRecv(rd, n, ncclFloat32, peer, pc, s));
    EXPECT_NCCL(ncclGroupStart()); // nested: only the outermost end issues
    if (pc) EXPECT_NCCL(ncclSend(sd, n, ncclFloat32, peer, pc, s));
    EXPECT_NCCL(ncclAllReduce(ar, ar, n, ncclFloat32, ncclSum, rev, s));
    EXPECT_NCCL(ncclGroupEnd());
    EXPECT_NCCL(ncclGroupEnd());
    if (pc) {
        read_back(o, rd, n);
        bad = 0;
        int from = rank - rank % 2 + peer;
        for (int j = 0; j < n; j++) bad += o[j] != (float)from * 7 + (float)j;
        EXPECT(bad == 0, "recv before send in a group: %d of %d wrong", bad, n);
    }
    read_back(o, ar, n);
    bad = 0;
    for (int j = 0; j < n; j++) bad += o[j] != 7.0f * size * (size - 1) / 2 + (float)size * j;
    EXPECT(bad == 0, "all-reduce in a group with send/recv: %d of %d wrong", bad, n);
    backend_dealloc(be, sd), backend_dealloc(be, rd), backend_dealloc(be, ar);
    EXPECT_NCCL(ncclCommDestroy(rev));
    if (pc) EXPECT_NCCL(ncclCommDestroy(pc));
    backend_dealloc(be, d), backend_dealloc(be, src), backend_dealloc(be, dst);
    backend_dealloc(be, di), backend_dealloc(be, dout);
    free(h), free(o);
    MPI_Comm_free(&world_rev);
    if (pair_mpi != MPI_COMM_NULL) MPI_Comm_free(&pair_mpi);
}

// More operations in flight on one group than the old ring of 64 events
// held: IN_FLIGHT all-reduces started (no test, no wait in between: a ~1B
// model's 167 gradient buckets at dp = 2 start during one backward), then
// waited on in reverse order; buffer k of rank r holds r + k.
static void in_flight(struct comm_group *g, int rank, int size) {
    enum { IN_FLIGHT = 200, N = 33 };
    float *h = xmalloc(sizeof(float) * IN_FLIGHT * N);
    for (int k = 0; k < IN_FLIGHT * N; k++) h[k] = (float)rank + (float)(k / N);
    float *d = dev_floats(h, (size_t)IN_FLIGHT * N);
    struct comm_request *req = xcalloc(IN_FLIGHT, sizeof *req);
    for (int k = 0; k < IN_FLIGHT; k++)
        comm_all_reduce_start(g, d + (size_t)k * N, N, DTYPE_FP32, COMM_SUM, &req[k]);
    for (int k = IN_FLIGHT - 1; k >= 0; k--) comm_wait(&req[k]);
    read_back(h, d, (size_t)IN_FLIGHT * N);
    int bad = 0;
    for (int k = 0; k < IN_FLIGHT * N; k++)
        bad += h[k] != (float)size * (size - 1) / 2 + (float)size * (float)(k / N);
    EXPECT(bad == 0, "%d all_reduce_start in flight: %d of %d wrong", IN_FLIGHT, bad, IN_FLIGHT * N);
    backend_dealloc(be, d);
    free(req), free(h);
}

// ---- 4. streams per kind of traffic (`test_comm_nccl --streams`) -----------------------

// A group over the world on its own MPI communicator (freed with it).
static void world_group(struct comm_group *mpi, struct comm_group *g, const char *name, bool high) {
    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    comm_mpi_init(mpi, dup);
    comm_nccl_init(g, mpi, be, name, high);
}

// Whether d (n floats on the device) holds want + i at element i.
static int wrong(const float *d, int n, float want) {
    float *h = xmalloc(sizeof(float) * n);
    read_back(h, d, n);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != want + (float)i;
    free(h);
    return bad;
}

// Orderings that only a device whose streams run apart from the host shows
// (the asynchronous emulation, or a GPU), at >= 2 ranks; each deadlocks on
// the code it guards against, so tests/e2e/nccl_emulated.sh bounds the run.
//  a. A TP collective is not ordered behind a DP all-reduce started before
//     it: rank 0 starts a DP all-reduce, then runs a TP all-reduce and reads
//     its result; the other ranks join the TP one first and the DP one only
//     after they have read the TP result (a late DP peer). One shared
//     communication stream puts rank 0's TP behind its DP: deadlock.
//  b. A deferred pipeline send waits for its producer, not for compute
//     enqueued after it: rank 0 starts a send to rank 1, then makes its
//     compute stream wait for a DP all-reduce, then waits on the send (which
//     enqueues it); rank 1 joins that all-reduce only once it has read the
//     message. A send ordered after all compute enqueued by its flush waits
//     for the all-reduce: deadlock.
static void streams(int rank, int size) {
    enum { n = 4096 };
    struct comm_group dp_mpi, tp_mpi, pp_mpi, dp, tp, pp;
    world_group(&dp_mpi, &dp, "dp", false);
    world_group(&tp_mpi, &tp, "tp", true);
    world_group(&pp_mpi, &pp, "pp", true);
    float h[n];
    for (int i = 0; i < n; i++) h[i] = (float)rank + (float)i;
    float *a = dev_floats(h, n), *b = dev_floats(h, n), *msg = dev_floats(h, n);
    float sum = (float)size * (size - 1) / 2; // element i of a sum over ranks: sum + size * i
    struct comm_request req;
    // a.
    if (rank == 0) comm_all_reduce_start(&dp, a, n, DTYPE_FP32, COMM_SUM, &req);
    comm_all_reduce(&tp, b, n, DTYPE_FP32, COMM_MAX);
    EXPECT(wrong(b, n, (float)(size - 1)) == 0, "TP all-reduce with a DP one pending: wrong values");
    if (rank != 0) comm_all_reduce_start(&dp, a, n, DTYPE_FP32, COMM_SUM, &req);
    comm_wait(&req);
    float *ha = xmalloc(sizeof(float) * n);
    read_back(ha, a, n);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += ha[i] != sum + (float)size * (float)i;
    EXPECT(bad == 0, "DP all-reduce joined late: %d of %d wrong", bad, n);
    if (rank == 0) printf("streams: a TP all-reduce completed while a DP one started before it waited for a late peer\n");
    // b.
    for (int i = 0; i < n; i++) h[i] = (float)rank + (float)i;
    backend_to_device(be, a, h, n * sizeof(float));
    struct comm_request sreq;
    if (rank == 0) {
        for (int i = 0; i < n; i++) h[i] = 1000.0f + (float)i;
        backend_to_device(be, msg, h, n * sizeof(float)); // the producer
        comm_send_start(&pp, msg, n, DTYPE_FP32, 1, 5, &sreq);
        comm_all_reduce_start(&dp, a, n, DTYPE_FP32, COMM_SUM, &req);
        comm_wait(&req); // the compute stream now waits for the all-reduce
        comm_wait(&sreq);
    } else {
        if (rank == 1) {
            comm_recv_start(&pp, msg, n, DTYPE_FP32, 0, 5, &sreq);
            comm_wait(&sreq);
            EXPECT(wrong(msg, n, 1000.0f) == 0, "pipeline message: wrong values");
        }
        comm_all_reduce_start(&dp, a, n, DTYPE_FP32, COMM_SUM, &req);
        comm_wait(&req);
    }
    read_back(ha, a, n);
    bad = 0;
    for (int i = 0; i < n; i++) bad += ha[i] != sum + (float)size * (float)i;
    EXPECT(bad == 0, "DP all-reduce after the message: %d of %d wrong", bad, n);
    if (rank == 0) printf("streams: a deferred send went out while later compute waited for a DP all-reduce its receiver joins after it\n");
    free(ha);
    backend_dealloc(be, a), backend_dealloc(be, b), backend_dealloc(be, msg);
    comm_group_free(&dp), comm_group_free(&tp), comm_group_free(&pp);
    comm_group_free(&dp_mpi), comm_group_free(&tp_mpi), comm_group_free(&pp_mpi);
}

// ---- 5. a failed collective (`TRIDENT_FAULT=nccl:N@R test_comm_nccl --fault`) ----------

// Emulated build only (tests/cuda_emu/nccl_fault.h): rank R's Nth operation
// fails on its stream; the peers' streams block in it. Every rank starts 4
// all-reduces, waits on them (stream-ordered: no host wait) and then
// barriers (the host waits for the streams, polling NCCL's asynchronous
// error): rank R must end the job naming its own failure, the others
// rank R's (NCCL's remote error), each from its main thread, in comm_nccl's
// waits; nccl_emulated.sh reads the messages and the exit code (1). Prints
// "fault: not reported" and returns if the barrier completes.
static void fault(int rank, int size) {
    enum { n = 1000, OPS = 4 };
    struct comm_group mpi, g;
    world_group(&mpi, &g, "world", false);
    float h[n * OPS];
    for (int i = 0; i < n * OPS; i++) h[i] = (float)rank;
    float *d = dev_floats(h, (size_t)n * OPS);
    struct comm_request req[OPS];
    for (int k = 0; k < OPS; k++) comm_all_reduce_start(&g, d + (size_t)k * n, n, DTYPE_FP32, COMM_SUM, &req[k]);
    for (int k = 0; k < OPS; k++) comm_wait(&req[k]);
    comm_barrier(&g);
    printf("fault: not reported on rank %d\n", rank);
    EXPECT(0, "the injected NCCL failure was not reported");
    backend_dealloc(be, d);
    comm_group_free(&g), comm_group_free(&mpi);
}

static void run(int rank, int size) {
    struct comm_group mpi, g;
    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    comm_mpi_init(&mpi, dup);
    comm_nccl_init(&g, &mpi, be, "world", false);
    EXPECT(g.rank == rank && g.size == size, "nccl group rank %d size %d, expected %d %d", g.rank,
           g.size, rank, size);
    enum { n = 1000 };
    float h[n];
    // all-reduce sum and max: element i of rank r is r + i / n
    for (int i = 0; i < n; i++) h[i] = (float)rank + (float)i / n;
    float *d = dev_floats(h, n);
    comm_all_reduce(&g, d, n, DTYPE_FP32, COMM_SUM);
    read_back(h, d, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += fabsf(h[i] - ((float)size * (size - 1) / 2 + (float)size * i / n)) > 1e-3f;
    EXPECT(bad == 0, "all_reduce sum: %d of %d wrong", bad, n);
    for (int i = 0; i < n; i++) h[i] = (float)rank + (float)i / n;
    backend_to_device(be, d, h, n * sizeof(float));
    comm_all_reduce(&g, d, n, DTYPE_FP32, COMM_MAX);
    read_back(h, d, n);
    bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != (float)(size - 1) + (float)i / n;
    EXPECT(bad == 0, "all_reduce max: %d of %d wrong", bad, n);
    // non-blocking: start, poll, wait
    for (int i = 0; i < n; i++) h[i] = 1;
    backend_to_device(be, d, h, n * sizeof(float));
    struct comm_request req;
    comm_all_reduce_start(&g, d, n, DTYPE_FP32, COMM_SUM, &req);
    for (int spins = 0; spins < 1000000 && !comm_all_reduce_test(&req); spins++) {}
    comm_all_reduce_wait(&req);
    read_back(h, d, n);
    bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != (float)size;
    EXPECT(bad == 0, "all_reduce_start/wait: %d of %d wrong", bad, n);
    in_flight(&g, rank, size);
    // reduce-scatter: send (size * n,) with element j of rank r = r * j; chunk r of the sum
    float *send_h = xmalloc(sizeof(float) * n * size);
    for (int j = 0; j < n * size; j++) send_h[j] = (float)rank * (j % 97);
    float *send = dev_floats(send_h, (size_t)n * size), *recv = dev_floats(h, n);
    comm_reduce_scatter(&g, send, recv, n, DTYPE_FP32, COMM_SUM);
    read_back(h, recv, n);
    bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != (float)size * (size - 1) / 2 * ((rank * n + i) % 97);
    EXPECT(bad == 0, "reduce_scatter: %d of %d wrong", bad, n);
    // all-gather: chunk r = r + i / n; out of place, then in place
    float *all = dev_floats(send_h, (size_t)n * size);
    for (int i = 0; i < n; i++) h[i] = (float)rank + (float)i / n;
    backend_to_device(be, recv, h, n * sizeof(float));
    for (int inplace = 0; inplace < 2; inplace++) {
        float *src = inplace ? all + (size_t)rank * n : recv;
        if (inplace) backend_to_device(be, src, h, n * sizeof(float));
        comm_all_gather(&g, src, all, n, DTYPE_FP32);
        read_back(send_h, all, (size_t)n * size);
        bad = 0;
        for (int r = 0; r < size; r++)
            for (int i = 0; i < n; i++) bad += send_h[(size_t)r * n + i] != (float)r + (float)i / n;
        EXPECT(bad == 0, "all_gather%s: %d wrong", inplace ? " in place" : "", bad);
    }
    // broadcast from the last rank
    for (int i = 0; i < n; i++) h[i] = (float)rank * 10 + i;
    backend_to_device(be, d, h, n * sizeof(float));
    comm_broadcast(&g, d, n, DTYPE_FP32, size - 1);
    read_back(h, d, n);
    bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != (float)(size - 1) * 10 + i;
    EXPECT(bad == 0, "broadcast: %d of %d wrong", bad, n);
    // ring: even ranks send then receive, odd ranks receive then send
    if (size > 1) {
        int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        for (int i = 0; i < n; i++) h[i] = (float)rank * 1000 + i;
        backend_to_device(be, d, h, n * sizeof(float));
        if (rank % 2 == 0) {
            comm_send(&g, d, n, DTYPE_FP32, next, 7);
            comm_recv(&g, recv, n, DTYPE_FP32, prev, 7);
        } else {
            comm_recv(&g, recv, n, DTYPE_FP32, prev, 7);
            comm_send(&g, d, n, DTYPE_FP32, next, 7);
        }
        read_back(h, recv, n);
        bad = 0;
        for (int i = 0; i < n; i++) bad += h[i] != (float)prev * 1000 + i;
        EXPECT(bad == 0, "send/recv ring: %d of %d wrong", bad, n);
    }
    comm_barrier(&g);
    backend_dealloc(be, d), backend_dealloc(be, send), backend_dealloc(be, recv), backend_dealloc(be, all);
    free(send_h);
    against_mpi(&g, &mpi);
    all_to_all_v(&g, &mpi);
    comm_group_free(&g);
    comm_group_free(&mpi);
    nccl_api(rank, size);
}
#endif

int main(int argc, char **argv) {
    struct error start_err = {0};
    CHECK(!mpi_util_start(&argc, &argv, &start_err), "%s", start_err.msg);
    mpi_util_init(MPI_COMM_WORLD);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int devices = backend_device_count();
    if (!backend_has_cuda() || devices == 0) {
        if (rank == 0) printf("skipped: no CUDA device%s\n", backend_has_cuda() ? "" : " (build without CUDA=1)");
        MPI_Finalize();
        return 77;
    }
#ifdef TRIDENT_CUDA
    MPI_Comm node;
    int local_rank;
    CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    CHECK_MPI(MPI_Comm_rank(node, &local_rank));
    MPI_Comm_free(&node);
    CHECK(local_rank < devices, "rank %d: node-local rank %d but %d devices: one rank per GPU",
          rank, local_rank, devices);
    struct error err = {0};
    be = backend_init(BACKEND_CUDA, local_rank, 0, &err);
    CHECK(be, "%s", err.msg);
    if (argc > 1 && !strcmp(argv[1], "--fault")) {
        fault(rank, size);
    } else if (argc > 1 && !strcmp(argv[1], "--streams")) {
        CHECK(size >= 2, "test_comm_nccl --streams needs at least 2 ranks, not %d", size);
        streams(rank, size);
    } else {
        run(rank, size);
    }
    backend_free(be);
#endif
    int total = 0;
    CHECK_MPI(MPI_Allreduce(&test_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) printf("test_comm_nccl: %d ranks, %s (%d failed checks)\n", size, total ? "FAIL" : "ok", total);
    MPI_Finalize();
    return total ? 1 : 0;
}
