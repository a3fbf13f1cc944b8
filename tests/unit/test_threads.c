// test_threads.c: threads_choose against a table of cases written out by hand
// from the rules of base/threads.h (config > affinity narrower than the node
// > SLURM_CPUS_PER_TASK > node CPUs / local ranks, at least 1), and the
// affinity probe in a child process whose mask sched_setaffinity narrowed.
#define _GNU_SOURCE
#include <sched.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/threads.h"
#include "test.h"

struct threads_case {
    const char *what;
    int affinity, node, local;
    const char *env;
    int config;
    int want;
    enum threads_source want_source;
};

static void test_choose(void) {
    static const struct threads_case cases[] = {
        {"config wins over everything", 1, 2, 2, "4", 3, 3, THREADS_CONFIG},
        {"srun task/affinity: 1 CPU of 2", 1, 2, 2, NULL, 0, 1, THREADS_AFFINITY},
        {"srun -c 4 bound: 4 CPUs of 64", 4, 64, 16, "4", 0, 4, THREADS_AFFINITY},
        {"affinity narrower wins over a wider env", 2, 8, 1, "6", 0, 2, THREADS_AFFINITY},
        {"unbound, SLURM_CPUS_PER_TASK", 64, 64, 16, "4", 0, 4, THREADS_SLURM},
        {"unbound, no env: 2 ranks on 2 CPUs", 2, 2, 2, NULL, 0, 1, THREADS_NODE_SHARE},
        {"mpirun -np 8 on 2 CPUs (oversubscribed)", 2, 2, 8, NULL, 0, 1, THREADS_NODE_SHARE},
        {"one rank on the node", 2, 2, 1, NULL, 0, 2, THREADS_NODE_SHARE},
        {"64 CPUs, 3 ranks: 21", 64, 64, 3, NULL, 0, 21, THREADS_NODE_SHARE},
        {"affinity unknown (0)", 0, 8, 2, NULL, 0, 4, THREADS_NODE_SHARE},
        {"empty env ignored", 8, 8, 4, "", 0, 2, THREADS_NODE_SHARE},
        {"non-numeric env ignored", 8, 8, 4, "2(x3)", 0, 2, THREADS_NODE_SHARE},
        {"zero env ignored", 8, 8, 4, "0", 0, 2, THREADS_NODE_SHARE},
        {"negative env ignored", 8, 8, 4, "-3", 0, 2, THREADS_NODE_SHARE},
        {"local ranks 0 count as 1", 8, 8, 0, NULL, 0, 8, THREADS_NODE_SHARE},
        {"node CPUs 0 count as 1", 0, 0, 4, NULL, 0, 1, THREADS_NODE_SHARE},
        {"negative config is unset", 1, 4, 1, NULL, -1, 1, THREADS_AFFINITY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct threads_case *k = &cases[i];
        struct threads_choice got = threads_choose(k->affinity, k->node, k->local, k->env, k->config);
        EXPECT(got.threads == k->want && got.source == k->want_source, "%s: got %d (%s), want %d (%s)",
               k->what, got.threads, threads_source_name(got.source), k->want,
               threads_source_name(k->want_source));
    }
    EXPECT(!strcmp(threads_source_name(THREADS_AFFINITY), "cpu affinity"), "source name");
}

// threads_affinity_cpus is between 1 and the node's CPUs; in a child pinned
// to its first allowed CPU it is 1.
static void test_probes(void) {
    int n = threads_affinity_cpus(), node = threads_node_cpus();
    EXPECT(n >= 1 && n <= node, "affinity %d CPUs, node %d", n, node);
    cpu_set_t set;
    EXPECT(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity");
    int first = 0;
    while (first < CPU_SETSIZE && !CPU_ISSET(first, &set)) first++;
    pid_t pid = fork();
    if (pid == 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(first, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(2);
        _exit(threads_affinity_cpus() == 1 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a child pinned to CPU %d sees 1 CPU (exit %d)",
           first, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int main(void) {
    test_choose();
    test_probes();
    return test_finish("test_threads");
}
