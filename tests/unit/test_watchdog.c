// test_watchdog.c: the watchdog's check hook (watchdog_add_check, base/watchdog.h).
//   - a check that returns 0 runs at every tick (about 5 a second) and ends
//     nothing; watchdog_stop joins;
//   - a check that fails ends the process (in a forked child) with exit 1
//     1.5 s after its third tick (the linger that lets other ranks print),
//     far before the timeout, its message on stderr after "[rank R, host H]
//     watchdog: ";
//   - a process stopped (SIGSTOP) for 2.5 s in a phase that waits on peers
//     and then continued says that it was stopped, not that it waits on
//     peers (its watchdog thread saw no tick for 2.5 s), and exits 1;
//   - WATCHDOG_MAX_CHECKS checks fit, one more is refused (-1); NULL (no
//     watchdog) accepts and never runs it;
//   - heartbeats (base/heartbeat.h): rank 0 of 5 surveys a folder where rank 1's
//     file never changes (stopped), rank 2's is rewritten by a thread in
//     another phase (alive), rank 3 has none and rank 4's is rewritten but
//     says its process was stopped until 1 s ago (continued since): the
//     survey names ranks 1 and 4 with host and pid as stopped, rank 2 as
//     alive in its phase, rank 3 as without a file; rank 0's own file exists while open and is removed by
//     heartbeat_close.
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/stat.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/heartbeat.h"
#include "base/watchdog.h"
#include "test.h"

static int count_ok(void *ctx, char *msg, size_t cap) {
    (void)msg, (void)cap;
    atomic_fetch_add((atomic_int *)ctx, 1);
    return 0;
}

// Fails at its third call, naming it.
static int fail_third(void *ctx, char *msg, size_t cap) {
    int n = atomic_fetch_add((atomic_int *)ctx, 1) + 1;
    if (n < 3) return 0;
    snprintf(msg, cap, "simulated NCCL error on call %d", n);
    return 1;
}

static void test_passing_check(void) {
    struct watchdog *w = watchdog_start(1000, 0);
    EXPECT(w, "watchdog_start");
    atomic_int calls = 0;
    EXPECT(watchdog_add_check(w, count_ok, &calls) == 0, "add");
    struct timespec nap = {1, 100 * 1000 * 1000};
    nanosleep(&nap, NULL);
    watchdog_stop(w);
    int n = atomic_load(&calls);
    EXPECT(n >= 3 && n <= 7, "a passing check ran %d times in 1.1 s, expected about 5 (a tick per 0.2 s)", n);
}

static void test_failing_check(void) {
    int fd[2];
    EXPECT(pipe(fd) == 0, "pipe");
    double start = time_now_s();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        struct watchdog *w = watchdog_start(1000, 3);
        static atomic_int calls = 0;
        atomic_int passing = 0;
        watchdog_add_check(w, count_ok, &passing); // runs first, passes
        watchdog_add_check(w, fail_third, &calls);
        sleep(10);
        _exit(99); // the check did not end the process
    }
    close(fd[1]);
    char out[4096] = {0};
    size_t len = 0;
    ssize_t got;
    while (len < sizeof out - 1 && (got = read(fd[0], out + len, sizeof out - 1 - len)) > 0) len += (size_t)got;
    close(fd[0]);
    int wst = 0;
    waitpid(pid, &wst, 0);
    double secs = time_now_s() - start;
    EXPECT(WIFEXITED(wst) && WEXITSTATUS(wst) == 1, "the failing check's process ended with status %#x, expected exit 1",
           wst);
    EXPECT(secs >= 1.5 && secs < 4, "the failing check ended the process after %.1f s (3 ticks of 0.2 s and "
           "1.5 s of lingering expected)", secs);
    EXPECT(strstr(out, "trident: [rank 3, host ") != NULL, "no rank and host in: %s", out);
    EXPECT(strstr(out, "] watchdog: simulated NCCL error on call 3; ending the job\n") != NULL,
           "no check message in: %s", out);
}

// Forks a child that runs child() (then exits 99), runs parent(pid) when not
// NULL, reads the child's stderr until it ends into out; returns its wait status.
static int run_child(void (*child)(void), void (*parent)(pid_t), char *out, size_t cap) {
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        child();
        _exit(99);
    }
    close(fd[1]);
    if (parent) parent(pid);
    size_t len = 0;
    ssize_t got;
    while (len < cap - 1 && (got = read(fd[0], out + len, cap - 1 - len)) > 0) len += (size_t)got;
    out[len] = 0;
    close(fd[0]);
    int wst = 0;
    waitpid(pid, &wst, 0);
    return wst;
}

static void stopped_child(void) {
    struct watchdog *w = watchdog_start(1, 5);
    watchdog_phase(w, "unit: a collective", 1, 1);
    sleep(10);
}

static void stop_child(pid_t pid) {
    struct timespec half = {0, 500 * 1000 * 1000}, stop = {2, 500 * 1000 * 1000};
    nanosleep(&half, NULL);
    kill(pid, SIGSTOP);
    nanosleep(&stop, NULL);
    kill(pid, SIGCONT);
}

static void test_stopped_self(void) {
    char out[4096];
    int wst = run_child(stopped_child, stop_child, out, sizeof out);
    EXPECT(WIFEXITED(wst) && WEXITSTATUS(wst) == 1, "the stopped process ended with status %#x, expected exit 1", wst);
    EXPECT(strstr(out, "[rank 5, host ") && strstr(out, "] watchdog: this process was stopped (SIGSTOP") &&
           strstr(out, "in phase \"unit: a collective\"") && !strstr(out, "waiting on peer"),
           "the stopped process's message: %s", out);
}

static void test_limits(void) {
    atomic_int calls = 0;
    EXPECT(watchdog_add_check(NULL, count_ok, &calls) == 0, "NULL accepts");
    struct watchdog *w = watchdog_start(1000, 0);
    for (int i = 0; i < WATCHDOG_MAX_CHECKS; i++)
        EXPECT(watchdog_add_check(w, count_ok, &calls) == 0, "check %d of %d", i + 1, WATCHDOG_MAX_CHECKS);
    EXPECT(watchdog_add_check(w, count_ok, &calls) == -1, "one check over WATCHDOG_MAX_CHECKS accepted");
    watchdog_stop(w);
    EXPECT(watchdog_start(0, 0) == NULL, "watchdog_s = 0 starts no watchdog");
}

struct fake_peer {
    char path[700];
    int rank;
    double stopped_until; // 0: never stopped
    atomic_bool stop;
};

// Rewrites a live peer's record in place every 0.1 s (seq changes), as
// heartbeat.c does: a reader never sees an empty file.
static void *fake_alive(void *arg) {
    struct fake_peer *p = arg;
    for (int seq = 1; !atomic_load(&p->stop); seq++) {
        char rec[256];
        memset(rec, ' ', sizeof rec);
        int n = snprintf(rec, sizeof rec, "trident heartbeat 1\nrank %d\nhost hostb\npid 77\nseq %d\ntime 0\n"
                         "idle_s 0.5\nstopped_s %.1f\nstopped_until %.3f\nphase %s\n", p->rank, seq,
                         p->stopped_until > 0 ? 4.0 : 0.0, p->stopped_until,
                         p->stopped_until > 0 ? "step 5: forward" : "checkpoint save of step 9");
        rec[n] = ' ', rec[sizeof rec - 1] = '\n';
        int fd = open(p->path, O_WRONLY | O_CREAT, 0644);
        if (fd >= 0) {
            if (pwrite(fd, rec, sizeof rec, 0) != (ssize_t)sizeof rec) perror("pwrite");
            close(fd);
        }
        struct timespec nap = {0, 100 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    return NULL;
}

static void test_heartbeat_survey(void) {
    char dir[] = "/tmp/trident-test-heartbeat.XXXXXX", hbdir[600], path[700], msg[4096];
    EXPECT(mkdtemp(dir), "mkdtemp");
    snprintf(hbdir, sizeof hbdir, "%s/heartbeat", dir);
    struct error err = {0};
    struct heartbeat *hb = NULL;
    EXPECT(heartbeat_open(&hb, hbdir, 0, 5, "hosta", &err) == STATUS_OK, "heartbeat_open: %s", err.msg);
    if (!hb) return;
    heartbeat_set(hb, "step 5: forward", 3.0);
    snprintf(path, sizeof path, "%s/rank-1", hbdir);
    FILE *f = fopen(path, "w");
    fprintf(f, "trident heartbeat 1\nrank 1\nhost hoststopped\npid 4242\nseq 3\ntime 1\nidle_s 0.2\n"
            "phase step 5: forward\n");
    fclose(f);
    struct fake_peer alive = {.rank = 2, .stop = false}, continued = {.rank = 4, .stop = false};
    snprintf(alive.path, sizeof alive.path, "%s/rank-2", hbdir);
    snprintf(continued.path, sizeof continued.path, "%s/rank-4", hbdir);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    continued.stopped_until = (double)wall.tv_sec - 1; // continued 1 s ago, within the 3 s without progress
    pthread_t th, th4;
    pthread_create(&th, NULL, fake_alive, &alive);
    pthread_create(&th4, NULL, fake_alive, &continued);
    double start = time_now_s();
    int n = heartbeat_survey(hb, "step 5: forward", 3.0, msg, sizeof msg, 5000);
    double secs = time_now_s() - start;
    atomic_store(&alive.stop, true), atomic_store(&continued.stop, true);
    pthread_join(th, NULL), pthread_join(th4, NULL);
    EXPECT(n == 2, "the survey found %d stopped ranks, expected 2: %s", n, msg);
    EXPECT(strstr(msg, "rank 4 (host hostb, pid 77) was stopped for 4.0 s, until ") != NULL, "rank 4: %s", msg);
    EXPECT(strstr(msg, "rank 1 (host hoststopped, pid 4242) is stopped or dead") != NULL, "rank 1: %s", msg);
    EXPECT(strstr(msg, "rank 2 (host hostb) is alive, in phase \"checkpoint save of step 9\"") != NULL,
           "rank 2: %s", msg);
    EXPECT(strstr(msg, "no heartbeat file of rank 3 ") != NULL, "rank 3: %s", msg);
    EXPECT(secs >= HEARTBEAT_SURVEY_MS / 1e3 && secs < 3, "the survey took %.1f s", secs);
    snprintf(path, sizeof path, "%s/rank-0", hbdir);
    f = fopen(path, "r");
    char rec[HEARTBEAT_RECORD + 1] = {0};
    size_t got = f ? fread(rec, 1, HEARTBEAT_RECORD, f) : 0;
    if (f) fclose(f);
    EXPECT(got == HEARTBEAT_RECORD && strstr(rec, "\nhost hosta\n") && strstr(rec, "\nphase step 5: forward\n") &&
           strstr(rec, "\nidle_s 3.0\n"), "rank 0's record (%zu bytes): %s", got, rec);
    heartbeat_close(hb);
    struct stat sb;
    EXPECT(stat(path, &sb) != 0, "heartbeat_close left %s", path);
    EXPECT(stat(hbdir, &sb) == 0, "heartbeat_close removed %s with other ranks' files in it", hbdir);
    struct heartbeat *alone = NULL;
    char dir2[700];
    snprintf(dir2, sizeof dir2, "%s/alone", dir);
    EXPECT(heartbeat_open(&alone, dir2, 0, 1, "h", &err) == STATUS_OK, "heartbeat_open %s: %s", dir2, err.msg);
    heartbeat_close(alone);
    EXPECT(stat(dir2, &sb) != 0, "heartbeat_close of the last rank left %s", dir2);
    EXPECT(heartbeat_open(&hb, "/nonexistent-trident/heartbeat", 0, 2, "h", &err) == STATUS_RUNTIME &&
           strstr(err.msg, "/nonexistent-trident/heartbeat") != NULL, "a folder without parent: %s", err.msg);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");
}

int main(void) {
    test_heartbeat_survey();
    test_passing_check();
    test_failing_check();
    test_stopped_self();
    test_limits();
    return test_finish("test_watchdog");
}
