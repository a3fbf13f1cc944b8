// watchdog.c: the progress watchdog (watchdog.h).
#include "watchdog.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "heartbeat.h"

struct watchdog {
    pthread_t thread;
    double timeout_s;
    int rank;
    char host[64];
    _Atomic long long last_ms; // monotonic time of the last kick
    atomic_bool stop;
    pthread_mutex_t lock;      // guards the phase fields
    char phase[128];
    double allowance;          // x timeout_s in this phase
    long long phase_ms;        // when the phase began
    bool peers;                // the phase waits on other ranks
    int nchecks;               // watchdog_add_check's, guarded by lock
    struct {
        int (*fn)(void *ctx, char *msg, size_t cap);
        void *ctx;
    } checks[WATCHDOG_MAX_CHECKS];
    struct heartbeat *hb;      // NULL until watchdog_heartbeat; set under lock
    long long tick_ms;         // the watch thread's last tick
    long long gap_ms, gap_end_ms; // its last gap over STOPPED_GAP_MS and when it ended
};

static long long now_ms(void) { return (long long)(time_now_s() * 1e3); }

// A phase that waits on peers fires this much later than its allowance, so
// that when a stuck rank and a peer waiting on it time out together (both
// entered their phases within a moment), the stuck rank, whose message names
// the cause, reports first (it is polled every 0.2 s).
enum { PEER_GRACE_MS = 1000 };
// The watch thread ticks every 0.2 s: a gap this long between two ticks means
// the process did not run (SIGSTOP, a debugger, a suspended machine).
enum { STOPPED_GAP_MS = 2000 };
// How long a firing watchdog waits for the heartbeat survey (its two reads
// are HEARTBEAT_SURVEY_MS apart).
enum { SURVEY_WAIT_MS = HEARTBEAT_SURVEY_MS + 2000 };
// How long a rank lingers after its message (linger).
enum { PEER_EXIT_DELAY_MS = 1500 };

// The first rank to exit ends every other one within milliseconds (Open
// MPI's runtime aborts the job's processes): a rank whose message is one of
// several expected at once (peers timing out together, a check that every
// rank's watchdog runs) waits PEER_EXIT_DELAY_MS after printing it, so the
// others print theirs too.
static void linger(void) { sleep_s(PEER_EXIT_DELAY_MS / 1e3); }

// Runs the checks (the lock held); the first that fails ends the job, and so
// does another rank's announced failure (heartbeat_announce).
static void run_checks(struct watchdog *w) {
    char msg[1280];
    if (heartbeat_peer_failure(w->hb, msg, sizeof msg)) {
        fprintf(stderr, "trident: [rank %d, host %s] watchdog: %s; ending the job\n", w->rank, w->host, msg);
        fflush(stderr);
        linger();
        _exit(STATUS_RUNTIME);
    }
    for (int i = 0; i < w->nchecks; i++) {
        msg[0] = 0;
        if (!w->checks[i].fn(w->checks[i].ctx, msg, sizeof msg)) continue;
        msg[sizeof msg - 1] = 0;
        if (msg[0]) heartbeat_announce(w->hb, msg);
        fprintf(stderr, "trident: [rank %d, host %s] watchdog: %s; ending the job\n", w->rank, w->host,
                msg[0] ? msg : "a check failed (it gave no reason)");
        fflush(stderr);
        linger();
        _exit(STATUS_RUNTIME);
    }
}

// Ends the job for a timeout (the lock held; released for the survey).
// idle: seconds since the last progress; now: this tick.
static _Noreturn void fire(struct watchdog *w, long long now, double idle) {
    char head[512];
    snprintf(head, sizeof head, "trident: [rank %d, host %s] watchdog: ", w->rank, w->host);
    char what[512];
    snprintf(what, sizeof what, "no progress for %.0f s ([system] watchdog_s = %g%s) in phase \"%s\" (entered %.0f s ago)",
             idle, w->timeout_s, w->allowance > 1 ? ", x allowance" : "", w->phase, (now - w->phase_ms) / 1e3);
    if (w->gap_ms >= STOPPED_GAP_MS && w->gap_end_ms >= atomic_load(&w->last_ms)) {
        // Continued after a stop (Open MPI sends SIGCONT before it kills the
        // job): this rank is the cause, whatever its phase waits on.
        fprintf(stderr, "%sthis process was stopped (SIGSTOP, a debugger, a suspended machine): its watchdog "
                "did not run for %.1f s, until %.1f s ago; %s; its peers waited on it; ending the job\n",
                head, w->gap_ms / 1e3, (now - w->gap_end_ms) / 1e3, what);
    } else if (!w->peers) {
        fprintf(stderr, "%s%s: this rank itself (or the file system, the device) is stuck; ending the job\n",
                head, what);
    } else if (!w->hb) {
        fprintf(stderr, "%s%s: waiting on peer ranks there: a peer did not reach it (stopped, crashed or stuck; "
                "a live peer that times out too prints its phase; no heartbeats yet to name it); ending the job\n",
                head, what);
    } else {
        // The survey takes about a second; the main thread may move on
        // meanwhile, which changes nothing: the job ends.
        char phase[sizeof w->phase], survey[4096];
        memcpy(phase, w->phase, sizeof phase);
        struct heartbeat *hb = w->hb;
        pthread_mutex_unlock(&w->lock);
        heartbeat_survey(hb, phase, idle, survey, sizeof survey, SURVEY_WAIT_MS);
        fprintf(stderr, "%s%s: waiting on peer ranks there: %s; ending the job\n", head, what, survey);
        fflush(stderr);
        linger(); // the peers waiting here too fire within a tick or two
    }
    fflush(stderr);
    _exit(STATUS_RUNTIME);
}

static void *watch(void *arg) {
    struct watchdog *w = arg;
    struct timespec nap = {0, 200 * 1000 * 1000};
    while (!atomic_load(&w->stop)) {
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&w->lock);
        long long now = now_ms();
        if (now - w->tick_ms >= STOPPED_GAP_MS) w->gap_ms = now - w->tick_ms, w->gap_end_ms = now;
        w->tick_ms = now;
        if (!atomic_load(&w->stop)) run_checks(w);
        double idle = (now - atomic_load(&w->last_ms)) / 1e3;
        double limit = w->timeout_s * w->allowance + (w->peers ? PEER_GRACE_MS / 1e3 : 0);
        if (idle > limit && !atomic_load(&w->stop)) fire(w, now, idle);
        heartbeat_set(w->hb, w->phase, idle);
        pthread_mutex_unlock(&w->lock);
    }
    return NULL;
}

struct watchdog *watchdog_start(double timeout_s, int rank) {
    if (timeout_s <= 0) return NULL;
    struct watchdog *w = xcalloc(1, sizeof *w);
    w->timeout_s = timeout_s, w->rank = rank;
    if (gethostname(w->host, sizeof w->host - 1)) snprintf(w->host, sizeof w->host, "?");
    pthread_mutex_init(&w->lock, NULL);
    snprintf(w->phase, sizeof w->phase, "start");
    w->allowance = 1, w->phase_ms = now_ms();
    atomic_store(&w->last_ms, now_ms());
    w->tick_ms = now_ms();
    if (pthread_create(&w->thread, NULL, watch, w)) {
        free(w);
        return NULL;
    }
    return w;
}

void watchdog_kick(struct watchdog *w) {
    if (w) atomic_store(&w->last_ms, now_ms());
}

void watchdog_phase(struct watchdog *w, const char *phase, double allowance, int peers) {
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    snprintf(w->phase, sizeof w->phase, "%s", phase);
    w->allowance = allowance >= 1 ? allowance : 1, w->peers = peers != 0;
    w->phase_ms = now_ms();
    atomic_store(&w->last_ms, w->phase_ms);
    heartbeat_set(w->hb, w->phase, 0); // at once: a rank stopped right after a phase change shows the new one
    pthread_mutex_unlock(&w->lock);
}

int watchdog_add_check(struct watchdog *w, int (*check)(void *ctx, char *msg, size_t cap), void *ctx) {
    if (!w) return 0;
    pthread_mutex_lock(&w->lock);
    int full = w->nchecks == WATCHDOG_MAX_CHECKS;
    if (!full) w->checks[w->nchecks].fn = check, w->checks[w->nchecks++].ctx = ctx;
    pthread_mutex_unlock(&w->lock);
    return full ? -1 : 0;
}

// The process's watchdog with heartbeats, for fatal_announce (one a process).
static struct watchdog *announcing;
static void announce(const char *msg) {
    struct watchdog *w = announcing;
    if (w) heartbeat_announce(w->hb, msg);
}

enum status watchdog_heartbeat(struct watchdog *w, const char *dir, int world_size, struct error *err) {
    if (!w) return STATUS_OK;
    struct heartbeat *hb;
    enum status st = heartbeat_open(&hb, dir, w->rank, world_size, w->host, err);
    if (st) return st;
    pthread_mutex_lock(&w->lock);
    heartbeat_set(hb, w->phase, (now_ms() - atomic_load(&w->last_ms)) / 1e3);
    w->hb = hb;
    pthread_mutex_unlock(&w->lock);
    announcing = w;
    fatal_set_announcer(announce);
    return STATUS_OK;
}

void watchdog_stop(struct watchdog *w) {
    if (!w) return;
    if (announcing == w) fatal_set_announcer(NULL), announcing = NULL;
    atomic_store(&w->stop, true);
    pthread_join(w->thread, NULL);
    heartbeat_close(w->hb);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
