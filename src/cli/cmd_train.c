// cmd_train.c: `trident train CONFIG.ini [section.key=value ...]`, the main job
// (the trainer is src/train/train.h). This file decides how the job ends
// (docs/design.md §8): exit 0 done, 1 runtime failure, 2 bad input, 3
// preempted; after a failure every rank exits non-zero within seconds.
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/mpi_util.h"
#include "cli.h"
#include "cli_flags.h"
#include "config/config.h"
#include "kernels/backend.h"
#include "parallel/comm_mpi.h"
#include "base/tee.h"
#include "train/train.h"

// Exit code of a run stopped by SIGTERM or SIGUSR1, or before [train]
// exit_duration_mins, after saving a checkpoint of its last finished step:
// "requeue me" (docs/design.md §8).
enum { EXIT_PREEMPTED = 3 };

// Set by SIGTERM / SIGUSR1 (what Slurm's --signal sends before the time
// limit), SIGINT (Ctrl-C) or the launcher's death (watch_parent): the
// trainer finishes the step, saves and returns. A signal handler can only
// reach a global. The handlers are installed before MPI_Init, so a signal
// during MPI start-up is remembered and honoured once the run can save.
static volatile sig_atomic_t preempt_signal;
// CLOCK_MONOTONIC second of the first SIGINT (0: none yet).
static volatile sig_atomic_t first_sigint_s;
// A second SIGINT within this many seconds of the first aborts at once.
enum { SECOND_SIGINT_S = 5 };

static void on_preempt(int sig) {
    if (sig == SIGINT) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts); // async-signal-safe
        long now = (long)ts.tv_sec + 1;       // + 1: never 0
        if (first_sigint_s && now - first_sigint_s <= SECOND_SIGINT_S) {
            static const char msg[] = "trident: a second SIGINT: aborting without saving\n";
            ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
            (void)w;
            _exit(130); // 128 + SIGINT, the shell's convention
        }
        first_sigint_s = (sig_atomic_t)now;
    }
    preempt_signal = sig;
    tee_stdio_best_effort(); // a signalled mpirun stops reading our output (base/tee.h)
}

static void install_stop_handlers(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_preempt;
    sa.sa_flags = SA_RESTART; // reads and MPI calls the signal interrupts carry on
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    // A launcher that died leaves stdout a broken pipe: a write then fails
    // (EPIPE) instead of killing the rank before it saves.
    signal(SIGPIPE, SIG_IGN);
}

// The task count the launcher started, when one says it (mpirun:
// OMPI_COMM_WORLD_SIZE; PMI launchers: PMI_SIZE; srun: SLURM_STEP_NUM_TASKS,
// else SLURM_NTASKS, read only inside a step, SLURM_STEP_ID set, where they
// count the step's tasks; a batch script's SLURM_NTASKS counts the
// allocation's). Returns the count (0: no launcher says) and names its source.
static long launcher_tasks(const char **source) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS",
                                       "SLURM_NTASKS"};
    const char *step = getenv("SLURM_STEP_ID");
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if (i >= 2 && !(step && step[0])) break;
        const char *v = getenv(vars[i]);
        if (!v || !v[0]) continue;
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10);
        if (errno || *end || n < 1) continue; // not a count: no verdict from it
        *source = vars[i];
        return n;
    }
    return 0;
}

// A rank whose launcher (its parent: mpirun, orted, slurmstepd) died must not
// train on alone: polled every 0.2 s (a parent-death signal would fire when
// the parent's forking thread ends, not only the process), a changed parent
// sets the stop flag, so every rank (all lost their launcher) saves and
// exits 3; if the rank is still alive ORPHAN_GRACE_S later (a peer gone, a
// collective that cannot finish), it exits 1.
enum { ORPHAN_GRACE_S = 60 };
static pid_t launcher_pid;
static void *watch_parent(void *arg) {
    (void)arg;
    for (;;) {
        usleep(200 * 1000);
        if (getppid() == launcher_pid) continue;
        fprintf(stderr, "trident: [pid %d] the launcher (parent pid %d) is gone: stopping after this step "
                "(saving if every rank can), exit 1 in %d s otherwise\n", (int)getpid(), (int)launcher_pid,
                ORPHAN_GRACE_S);
        preempt_signal = SIGHUP;
        sleep(ORPHAN_GRACE_S);
        fprintf(stderr, "trident: [pid %d] the launcher is gone and the run did not end in %d s: exit 1\n",
                (int)getpid(), ORPHAN_GRACE_S);
        _exit(STATUS_RUNTIME);
    }
    return NULL;
}

// Started when a launcher set this process up (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE, SLURM_STEP_ID): a process started by hand (a singleton under
// nohup) outlives its shell as it always did.
static void start_parent_watch(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("SLURM_STEP_ID")) return;
    launcher_pid = getppid();
    if (launcher_pid <= 1) return; // already orphaned or a container's init: nothing to watch
    pthread_t th;
    if (pthread_create(&th, NULL, watch_parent, NULL) == 0) pthread_detach(th);
}

// Ends the job on every rank with the error's status (mpi_exit_all). An error
// every rank found is reported by rank 0; one this rank found alone, by this
// rank, whose MPI_Abort also ends peers blocked waiting for it.
static _Noreturn void fail(const struct trainer_error *e, int world_rank) {
    mpi_exit_all(e->err.status ? (int)e->err.status : STATUS_RUNTIME,
                 e->alone || world_rank == 0 ? e->err.msg : NULL);
}

// Every rank must train the same resolved config (a config file that differs
// between nodes, or an MPMD launch with other overrides, would otherwise
// hang in a collective or train different models silently). cfg: this rank's
// config, NULL when it failed to load or validate (e holds why). Collective
// over MPI_COMM_WORLD; returns only when every rank loaded the same config,
// else ends the job with exit 2: rank 0 prints every failing rank's reason
// with its rank and host (comm_agree; ranks with the same reason share one
// entry: the usual case, every rank reads one file); a rank whose config
// differs from rank 0's names the first differing line of both.
static void check_same_config(const struct config *cfg, struct trainer_error *e, int world_rank) {
    // Every failing rank's reason, on rank 0 (comm_agree: identical ones once).
    struct comm_group world;
    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup)); // the group owns (frees) its communicator
    comm_mpi_init(&world, dup);
    enum status st = comm_agree(&world, cfg ? STATUS_OK : (e->err.status ? e->err.status : STATUS_BAD_INPUT),
                                "loading the config", &e->err);
    comm_group_free(&world);
    if (st) {
        e->alone = false; // rank 0 prints every rank's reason
        fail(e, world_rank);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f, "open_memstream failed");
    config_print(cfg, f);
    fclose(f);
    unsigned long long n0 = len;
    MPI_Bcast(&n0, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    char *text0 = xmalloc(n0 + 1);
    if (world_rank == 0) memcpy(text0, text, n0);
    MPI_Bcast(text0, (int)n0, MPI_CHAR, 0, MPI_COMM_WORLD);
    text0[n0] = '\0';
    int differs = n0 != len || memcmp(text0, text, len), any_differs;
    MPI_Allreduce(&differs, &any_differs, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (differs) { // the first line that differs, both versions
        const char *a = text0, *b = text;
        while (*a && *a == *b) a++, b++;
        while (a > text0 && a[-1] != '\n') a--, b--;
        int la = (int)strcspn(a, "\n"), lb = (int)strcspn(b, "\n");
        error_set(&e->err, STATUS_BAD_INPUT, "the resolved config of this rank differs from rank 0's: "
                  "rank 0 has `%.*s`, this rank `%.*s` (every rank must run the same config file and "
                  "overrides)", la, a, lb, b);
        e->alone = true;
        fail(e, world_rank);
    }
    free(text0);
    free(text);
    if (any_differs) mpi_exit_all(STATUS_BAD_INPUT, NULL);
}

struct train_args {
    const char *config;
    struct cli_list overrides;
    bool print_config;
    int world; // --world-size, with --print-config; 0: none given
};

#define T(field) offsetof(struct train_args, field)
static const struct cli_flag train_flags[] = {
    {"CONFIG.ini", CLI_PATH, NULL, NULL, 0, 0, 0, NULL, "the run's config file (docs/config.md)", T(config)},
    {"section.key=value", CLI_LIST, NULL, NULL, 0, 0, CLI_OPTIONAL, NULL,
     "overrides of config keys, applied in order after the file; every key of docs/config.md can be "
     "overridden", T(overrides)},
    {"--print-config", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "print every key of the resolved config, its value and where it came from (default, FILE:LINE or "
     "command line argument N) and exit 0: no training, no MPI", T(print_config)},
    {"--world-size", CLI_INT, "N", NULL, 1, 1 << 24, 0, NULL,
     "with --print-config: the ranks the run will have, checked and used as a run would (parallel.dp = 0 "
     "infers dp = N / (tp * cp * pp)); without it, dp = 0 shows as 1", T(world)},
};
#undef T

const struct cli_command cli_train = {
    .name = "train",
    .synopsis = "CONFIG.ini [section.key=value ...] [--print-config [--world-size N]]",
    .summary = "Trains a model under mpirun -np N or srun, N = tp * cp * pp * dp (parallel.dp = 0, the default,\n"
               "infers dp = N / (tp * cp * pp)).",
    .flags = train_flags,
    .n_flags = CLI_N(train_flags),
    .notes = "Exit 0 done (also when train.exit_interval stops it), 1 runtime failure, 2 bad input, 3 stopped\n"
             "with a checkpoint by a signal or train.exit_duration_mins (requeue). A bad command line is\n"
             "refused (exit 2) by each rank before MPI starts.\n",
};

// `trident train --print-config CONFIG [--world-size N] [overrides]`: loads and
// validates the config as a run of N ranks would (without MPI; without N,
// tp * cp * pp * dp is not checked against one, and dp = 0 shows as 1 with a
// note) and prints every key, its value and where it came from
// (config_print_origins) to stdout. Returns 0, or 2 after printing the error
// for a bad config.
static int print_config(const struct train_args *o) {
    struct error err = {0};
    struct config cfg;
    enum status st = config_load(o->config, o->overrides.n, (char **)o->overrides.values, &cfg, &err);
    bool infer_dp = !st && cfg.parallel.dp == 0 && !o->world;
    if (!st) st = config_validate(&cfg, o->world, backend_has_cuda(), &err);
    if (st) {
        fprintf(stderr, "trident: %s\n", err.msg);
        return st;
    }
    char unread[2048];
    if (config_unread_keys(&cfg, unread, sizeof unread)) fprintf(stderr, "trident: warning: %s\n", unread);
    config_print_origins(&cfg, stdout);
    if (infer_dp)
        printf("# parallel.dp = 0 (infer): dp = world size / (tp * cp * pp) at run time; shown as 1\n");
    struct grid_layout grid = config_grid(&cfg);
    char text[256];
    printf("# derived: the grid's axes %s (%d ranks)\n",
           topology_layout_text(&grid, true, " = ", ", ", text, sizeof text), topology_world_size(&grid));
    return STATUS_OK;
}

int cmd_train(int argc, char **argv) {
    // Usage without MPI (main() passes --help found anywhere on the line as argv[1]).
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_train, stdout);
        return STATUS_OK;
    }
    // The command line before MPI: a bad one ends each rank alike; --print-config needs no MPI.
    struct train_args o = {0};
    struct error perr = {0};
    if (cli_parse(&cli_train, argc, argv, &o, &perr)) {
        // A Megatron-LM flag (--tensor-model-parallel-size 2) is an override here.
        char hint[512] = "";
        for (int i = 1; i < argc && !hint[0]; i++)
            if (argv[i][0] == '-' && strstr(perr.msg, argv[i])) {
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)strcspn(argv[i], "="), argv[i]);
                if (config_alias_hint(name, hint, sizeof hint)) {
                    size_t k = strlen(hint);
                    snprintf(hint + k, sizeof hint - k, " (overrides are written section.key=value)");
                }
            }
        fprintf(stderr, "trident train: %s%s\n(trident train --help for usage)\n", perr.msg, hint);
        cli_free(&cli_train, &o);
        return perr.status;
    }
    if (o.print_config) {
        int rc = print_config(&o);
        cli_free(&cli_train, &o);
        return rc;
    }
    if (o.world) { // MPI gives a run its world size
        fprintf(stderr, "trident train: --world-size %d: an option of --print-config; a run's ranks are "
                "mpirun's -np (or srun's tasks)\n(trident train --help for usage)\n", o.world);
        cli_free(&cli_train, &o);
        return STATUS_BAD_INPUT;
    }
    install_stop_handlers();
    start_parent_watch();
    // Test hook: a pause before MPI_Init, for a signal during start-up
    // (tests/e2e/train_start_checks.sh).
    const char *pause_s = getenv("TRIDENT_TEST_PAUSE_BEFORE_MPI_INIT_S");
    if (pause_s && atof(pause_s) > 0) usleep((useconds_t)(atof(pause_s) * 1e6));
    struct error start_err = {0};
    if (mpi_util_start(&argc, &argv, &start_err)) {
        fprintf(stderr, "trident: %s\n", start_err.msg);
        return 1;
    }
    mpi_util_init(MPI_COMM_WORLD);
    install_stop_handlers(); // again: MPI_Init may have installed its own
    int world_rank, world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    struct trainer_error e = {0};
    // The launcher's task count against this MPI world, before any file is
    // opened: an MPI that fell back to singletons under a mismatched launcher
    // (srun --mpi=) would otherwise start N independent "rank 0 of 1" trainers.
    const char *source = NULL;
    long tasks = launcher_tasks(&source);
    if (tasks && tasks != world_size) {
        error_set(&e.err, STATUS_BAD_INPUT, "the MPI world has %d rank%s but the launcher started %ld "
                  "tasks (%s = %ld): this MPI does not see the launcher's other tasks (under srun, pick "
                  "the --mpi= plugin this MPI was built for, e.g. srun --mpi=pmix; or start with mpirun)",
                  world_size, world_size == 1 ? "" : "s", tasks, source, tasks);
        e.alone = false; // rank 0 speaks for all
        fail(&e, world_rank);
    }
    struct config cfg;
    enum status st = config_load(o.config, o.overrides.n, (char **)o.overrides.values, &cfg, &e.err);
    cli_free(&cli_train, &o);
    if (!st) st = config_validate(&cfg, world_size, backend_has_cuda(), &e.err);
    check_same_config(st ? NULL : &cfg, &e, world_rank);

    struct trainer *t;
    struct trainer_outcome out;
    if (trainer_open(&t, &cfg, &e) || trainer_run(t, &preempt_signal, &out, &e))
        fail(&e, world_rank);
    int rc = STATUS_OK;
    if (out.signal) {
        if (world_rank == 0) {
            // The wording up to "checkpoint saved" is what requeue scripts look for (README).
            // A launcher that stopped reading (a signalled mpirun) has a full
            // stdout pipe: then the line goes to stderr too (base/tee.h).
            for (int i = 0; i < 1 + tee_stdout_given_up(); i++) {
                fprintf(i ? stderr : stdout, "stopped by signal %d after step %d%s; exit %d (requeue; %s)\n",
                        out.signal, out.steps_done,
                        out.saved ? ", checkpoint saved" : " ([checkpoint] dir = none: nothing saved)",
                        EXIT_PREEMPTED, out.signal == SIGHUP ? "the launcher is gone" : strsignal(out.signal));
                fflush(i ? stderr : stdout);
            }
        }
        rc = EXIT_PREEMPTED;
    } else if (out.out_of_time) {
        if (world_rank == 0) {
            printf("stopped before [train] exit_duration_mins = %g after step %d%s; exit %d (requeue)\n",
                   cfg.train.exit_duration_mins, out.steps_done, out.saved ? ", checkpoint saved"
                   : " ([checkpoint] dir = none: nothing saved)", EXIT_PREEMPTED);
            fflush(stdout);
        }
        rc = EXIT_PREEMPTED;
    }
    trainer_close(t);
    MPI_Finalize();
    return rc;
}
