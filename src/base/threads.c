// threads.c: the thread count of one rank (threads.h).
#define _GNU_SOURCE
#include "threads.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

struct threads_choice threads_choose(int affinity_cpus, int node_cpus, int local_ranks,
                                     const char *slurm_cpus_per_task, int config_threads) {
    if (node_cpus < 1) node_cpus = 1;
    if (local_ranks < 1) local_ranks = 1;
    if (config_threads > 0) return (struct threads_choice){config_threads, THREADS_CONFIG};
    if (affinity_cpus > 0 && affinity_cpus < node_cpus)
        return (struct threads_choice){affinity_cpus, THREADS_AFFINITY};
    if (slurm_cpus_per_task && slurm_cpus_per_task[0]) {
        char *end;
        errno = 0;
        long v = strtol(slurm_cpus_per_task, &end, 10);
        if (!errno && *end == '\0' && v > 0 && v <= INT_MAX)
            return (struct threads_choice){(int)v, THREADS_SLURM};
    }
    int share = node_cpus / local_ranks;
    return (struct threads_choice){share > 0 ? share : 1, THREADS_NODE_SHARE};
}

const char *threads_source_name(enum threads_source source) {
    switch (source) {
    case THREADS_CONFIG: return "config";
    case THREADS_AFFINITY: return "cpu affinity";
    case THREADS_SLURM: return "SLURM_CPUS_PER_TASK";
    case THREADS_NODE_SHARE: return "node cores / local ranks";
    }
    return "?";
}

int threads_affinity_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    return CPU_COUNT(&set);
}

int threads_node_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && n <= INT_MAX ? (int)n : 1;
}
