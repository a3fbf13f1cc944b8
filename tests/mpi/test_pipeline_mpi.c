// test_pipeline_mpi.c: the pipeline executor (src/parallel/pipeline.c) over MPI, run by
// tests/e2e/pipeline_mpi.sh. For each (p, m, v) given, the world of N ranks
// is laid out as tp = 1, pp = p, dp = N / p (topology_init), and every pp
// group runs the toy model of tests/unit/pipeline_toy.h: each virtual stage
// an exactly invertible affine map, each microbatch's input and loss gradient
// known, so every activation received, every gradient received, the final
// output and the input gradient are checked on every rank against closed
// forms with ==. Messages are 4096 floats (16 KB, above the shared-memory
// eager limit: a send completes only once its receive is posted). Each layout
// runs with the default ring of buffers and with a ring of 1, two steps each,
// the callbacks calling pipeline_poll; with the ring of 1 the executor also
// waits through its progress callback (comm_test loops instead of comm_wait).
// --schedule runs zb-h1 or zbv (B and W split; the toy's weight gradients
// are checked too), --seeds N repeats every layout with delay_seed 1..N
// (random 0 to 2 ms sleeps before every send and receive) after the
// undelayed run.
//
//   test_pipeline_mpi [--schedule 1f1b|zb-h1|zbv] [--seeds N] P M V [P M V ...]
//   exit 0 pass, 1 fail, 2 bad arguments
#include <stdlib.h>
#include <string.h>

#include "../unit/pipeline_toy.h"
#include "base/mpi_util.h"
#include "parallel/comm_mpi.h"
#include "parallel/pipeline.h"
#include "parallel/topology.h"

enum { COUNT = 4096 };

// Runs one layout; returns the failed checks summed over the world.
static int run_layout(enum pp_schedule kind, int p, int m, int v, int ring, uint64_t seed) {
    int size;
    CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
    struct topology topo;
    struct error err;
    if (p < 1 || size % p != 0) {
        snprintf(err.msg, sizeof err.msg, "p=%d stages do not divide the %d ranks", p, size);
        mpi_exit_all(STATUS_BAD_INPUT, err.msg);
    }
    struct grid_layout grid = topology_layout(1, p, size / p, 0, 1);
    if (topology_init(MPI_COMM_WORLD, &grid, &topo, &err) != STATUS_OK)
        mpi_exit_all(err.status, err.msg);
    int s = topology_group(&topo, GROUP_PP)->rank;
    struct toy toy;
    toy_init(&toy, kind, p, s, m, v, COUNT, pipeline_max_in_flight(kind, p, s, m, v),
             pipeline_max_w_pending(kind, p, s, m, v));
    struct pipeline_exec x = {.kind = kind, .p = p, .s = s, .m = m, .v = v,
                              .group = topology_group(&topo, GROUP_PP), .count = COUNT,
                              .dtype = DTYPE_FP32, .ctx = &toy, .forward = toy_forward,
                              .backward = toy_backward, .weight = toy_weight,
                              .progress = ring ? toy_progress : NULL, .ring = ring,
                              .delay_seed = seed};
    if (pipeline_exec_init(&x, &err) != STATUS_OK) mpi_exit_all(err.status, err.msg);
    toy.poll = &x;
    double t0 = MPI_Wtime();
    // Twice: the executor's state is reset between steps, buffers reused.
    for (int step = 0; step < 2 && toy.bad == 0; step++) {
        if (step) {
            toy_free(&toy);
            toy_init(&toy, kind, p, s, m, v, COUNT, pipeline_max_in_flight(kind, p, s, m, v),
                     pipeline_max_w_pending(kind, p, s, m, v));
            toy.poll = &x;
        }
        if (pipeline_run(&x, &err) != STATUS_OK) mpi_exit_all(err.status, err.msg);
        toy_finish(&toy);
        if (!(x.idle_s >= 0 && x.idle_s < 60) && !toy.bad++)
            snprintf(toy.first, sizeof toy.first, "idle_s %g after the run", x.idle_s);
    }
    double secs = MPI_Wtime() - t0;
    if (toy.bad)
        fprintf(stderr, "FAIL [rank %d] %s (p,m,v)=(%d,%d,%d) ring=%d seed=%llu stage %d: %d "
                "failed checks, first: %s\n", topo.world_rank, pipeline_schedule_name(kind), p, m,
                v, ring, (unsigned long long)seed, s, toy.bad, toy.first);
    int total = 0;
    CHECK_MPI(MPI_Allreduce(&toy.bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (topo.world_rank == 0)
        printf("(p,m,v)=(%d,%d,%d) ring=%s dp=%d: %s (%d failed checks, %.3f s)%s%s%s\n", p, m, v,
               ring ? "1" : "default", size / p, total ? "FAIL" : "ok", total, secs,
               kind != PP_SCHEDULE_1F1B || seed ? " [" : "",
               kind != PP_SCHEDULE_1F1B || seed ? pipeline_schedule_name(kind) : "",
               kind != PP_SCHEDULE_1F1B || seed ? (seed ? " delayed]" : "]") : "");
    pipeline_exec_free(&x);
    toy_free(&toy);
    topology_free(&topo);
    return total;
}

int main(int argc, char **argv) {
    struct error start_err = {0};
    CHECK(!mpi_util_start(&argc, &argv, &start_err), "%s", start_err.msg);
    mpi_util_init(MPI_COMM_WORLD);
    enum pp_schedule kind = PP_SCHEDULE_1F1B;
    int seeds = 0, a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "--seeds")) {
            seeds = atoi(argv[a + 1]);
            continue;
        }
        if (strcmp(argv[a], "--schedule")) break;
        for (kind = 0; kind < PP_SCHEDULE_COUNT; kind++)
            if (!strcmp(argv[a + 1], pipeline_schedule_name(kind))) break;
        if (kind == PP_SCHEDULE_COUNT) mpi_exit_all(STATUS_BAD_INPUT, "unknown --schedule");
    }
    if (argc - a < 3 || (argc - a) % 3 != 0 || seeds < 0)
        mpi_exit_all(STATUS_BAD_INPUT, "usage: test_pipeline_mpi [--schedule 1f1b|zb-h1|zbv] "
                                       "[--seeds N] P M V [P M V ...]");
    int total = 0;
    for (; a + 2 < argc; a += 3) {
        int p = atoi(argv[a]), m = atoi(argv[a + 1]), v = atoi(argv[a + 2]);
        for (int seed = 0; seed <= seeds; seed++) {
            total += run_layout(kind, p, m, v, 0, (uint64_t)seed);
            total += run_layout(kind, p, m, v, 1, (uint64_t)seed);
        }
    }
    MPI_Finalize();
    return total ? 1 : 0;
}
