// watchdog.c: the progress watchdog (watchdog.h).
#include "watchdog.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

struct watchdog {
    pthread_t thread;
    double timeout_s;
    int rank;
    _Atomic long long last_ms; // monotonic time of the last kick
    atomic_bool stop;
};

static long long now_ms(void) { return (long long)(time_now_s() * 1e3); }

static void *watch(void *arg) {
    struct watchdog *w = arg;
    struct timespec nap = {0, 200 * 1000 * 1000};
    while (!atomic_load(&w->stop)) {
        nanosleep(&nap, NULL);
        double idle = (now_ms() - atomic_load(&w->last_ms)) / 1e3;
        if (idle > w->timeout_s && !atomic_load(&w->stop)) {
            fprintf(stderr, "trident: [rank %d] watchdog: no progress for %.0f s ([system] "
                    "watchdog_s = %g): a peer rank or the file system is stuck; ending the job\n",
                    w->rank, idle, w->timeout_s);
            fflush(stderr);
            _exit(STATUS_RUNTIME);
        }
    }
    return NULL;
}

struct watchdog *watchdog_start(double timeout_s, int rank) {
    if (timeout_s <= 0) return NULL;
    struct watchdog *w = xcalloc(1, sizeof *w);
    w->timeout_s = timeout_s, w->rank = rank;
    atomic_store(&w->last_ms, now_ms());
    if (pthread_create(&w->thread, NULL, watch, w)) {
        free(w);
        return NULL;
    }
    return w;
}

void watchdog_kick(struct watchdog *w) {
    if (w) atomic_store(&w->last_ms, now_ms());
}

void watchdog_stop(struct watchdog *w) {
    if (!w) return;
    atomic_store(&w->stop, true);
    pthread_join(w->thread, NULL);
    free(w);
}
