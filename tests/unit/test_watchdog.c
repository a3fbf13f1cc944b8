// test_watchdog.c: the watchdog's check hook (watchdog_add_check, base/watchdog.h).
//   - a check that returns 0 runs at every tick (about 5 a second) and ends
//     nothing; watchdog_stop joins;
//   - a check that fails ends the process (in a forked child) with exit 1
//     within a tick or two, far before the timeout, its message on stderr
//     after "[rank R, host H] watchdog: ";
//   - WATCHDOG_MAX_CHECKS checks fit, one more is refused (-1); NULL (no
//     watchdog) accepts and never runs it.
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
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
    EXPECT(secs < 3, "the failing check ended the process after %.1f s (3 ticks of 0.2 s expected)", secs);
    EXPECT(strstr(out, "trident: [rank 3, host ") != NULL, "no rank and host in: %s", out);
    EXPECT(strstr(out, "] watchdog: simulated NCCL error on call 3; ending the job\n") != NULL,
           "no check message in: %s", out);
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

int main(void) {
    test_passing_check();
    test_failing_check();
    test_limits();
    return test_finish("test_watchdog");
}
