// check.h: what the emulation's check programs (tests/cuda_emu/check_*.cpp,
// built by `make EMU=1` into $(BUILD)/tests) share: a failure count and
// EXPECT, which prints the file, line, condition and a formatted reason on
// stdout, and in_child, which runs a body in a forked process with its
// stderr captured (for what must abort with a message). A check program
// exits 0 when failures is 0, else 1.
#ifndef TRIDENT_CUDA_EMU_CHECK_H
#define TRIDENT_CUDA_EMU_CHECK_H

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

static int failures, checks;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

// Runs body in a child process with stderr captured into *err; returns its
// wait status (waitpid's), or -1 when no pipe could be made.
template <class F> static inline int in_child(F body, std::string *err) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        body();
        _exit(0);
    }
    close(fds[1]);
    char buf[1024];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) err->append(buf, (size_t)n);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

#endif
