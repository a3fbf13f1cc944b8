// test_comm_nccl.c: the NCCL comm table (src/parallel/comm_nccl.c) on device buffers,
// one rank per GPU: run as `mpirun -np G build/mpi/test_comm_nccl` with G <=
// the GPUs of the node (tests/gpu/run.sh). Each rank fills device buffers
// with rank-dependent values, runs every collective (sum and max all-reduce,
// the non-blocking start/test/wait, reduce-scatter, all-gather in and out of
// place, broadcast, a send/recv ring when G > 1, barrier) and compares with
// the values computed on the host. Kernels enqueued after a collective must
// see its result (stream ordering): the checks read back through the compute
// stream without any explicit wait. Exit 77 (skipped) in a build without
// CUDA or on a machine without a device.
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../unit/test.h"
#include "base/common.h"
#include "base/mpi_util.h"
#include "kernels/backend.h"

#ifdef TRIDENT_CUDA
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

static void run(int rank, int size) {
    struct comm_group mpi, g;
    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    comm_mpi_init(&mpi, dup);
    comm_nccl_init(&g, &mpi, be);
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
    comm_group_free(&g);
    comm_group_free(&mpi);
}
#endif

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
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
    run(rank, size);
    backend_free(be);
#endif
    int total = 0;
    CHECK_MPI(MPI_Allreduce(&test_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) printf("test_comm_nccl: %d ranks, %s (%d failed checks)\n", size, total ? "FAIL" : "ok", total);
    MPI_Finalize();
    return total ? 1 : 0;
}
