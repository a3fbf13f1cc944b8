// threads.h: how many OpenMP threads one rank runs (docs/design.md §2,
// "Threads per rank"). The decision is a pure function (threads_choose,
// unit-tested in tests/unit/test_threads.c); the facts it weighs come from
// the OS here (threads_affinity_cpus, threads_node_cpus) and from MPI in the
// trainer (the node-local rank count, topology.local_size).
#ifndef TRIDENT_THREADS_H
#define TRIDENT_THREADS_H

enum threads_source {
    THREADS_CONFIG,     // [system] threads > 0
    THREADS_AFFINITY,   // the CPUs of this process's affinity mask (srun's task/affinity, mpirun --bind-to)
    THREADS_SLURM,      // SLURM_CPUS_PER_TASK (srun -c / sbatch --cpus-per-task)
    THREADS_NODE_SHARE, // the node's online CPUs / the node-local ranks
};

struct threads_choice {
    int threads; // >= 1
    enum threads_source source;
};

// The thread count of one rank, first rule that applies:
//  1. config_threads > 0 ([system] threads): that;
//  2. affinity_cpus (CPUs in this rank's affinity mask; <= 0: unknown) fewer
//     than node_cpus: affinity_cpus (the launcher gave this rank those CPUs);
//  3. slurm_cpus_per_task (the SLURM_CPUS_PER_TASK string; NULL, empty or not
//     a positive integer: ignored): that;
//  4. node_cpus / local_ranks (integer division), at least 1 (ranks of one
//     node unbound share its CPUs: 8 ranks on 2 CPUs run 1 thread each).
// node_cpus and local_ranks below 1 count as 1. Pure: no OS or MPI call.
struct threads_choice threads_choose(int affinity_cpus, int node_cpus, int local_ranks,
                                     const char *slurm_cpus_per_task, int config_threads);

// "config", "cpu affinity", "SLURM_CPUS_PER_TASK", "node cores / local ranks".
const char *threads_source_name(enum threads_source source);

// CPUs in the calling thread's affinity mask (sched_getaffinity); 0 when it
// cannot be read.
int threads_affinity_cpus(void);

// The node's online CPUs (sysconf(_SC_NPROCESSORS_ONLN)), at least 1.
int threads_node_cpus(void);

#endif
