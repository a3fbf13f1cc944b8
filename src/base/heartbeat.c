// heartbeat.c: per-rank heartbeat files and the survey that names stopped
// ranks (heartbeat.h).
#include "heartbeat.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { SURVEY_IDLE, SURVEY_ASKED, SURVEY_WAITING, SURVEY_ANSWERED };
enum { LIST_MAX = 8 }; // ranks named per kind in a survey's message

struct heartbeat {
    pthread_t thread;
    pthread_mutex_t lock; // guards everything below but the constants
    pthread_cond_t cv;    // on CLOCK_MONOTONIC
    char dir[4096];
    int rank, world, pid;
    char host[64];
    char phase[256];
    double idle_s;
    double stopped_s, stopped_until; // this process's last stop: seconds, Unix time it ended (0: none)
    unsigned long long seq;
    bool stop, exited;
    int survey;           // SURVEY_*
    char my_phase[256];   // the surveying rank's phase
    double my_idle_s;     // and its seconds without progress
    long long survey_asked, survey_due; // ms: when asked, the second read
    uint64_t *first;      // (world,) hash of each rank's first read, 0: no file
    char result[4096];
    int nstopped;
    char peer_failure[1200]; // another rank's announcement (heartbeat_announce), "" none
};

static long long mono_ms(void) { return (long long)(time_now_s() * 1e3); }

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

// FNV-1a, 64-bit; never 0 (0 stands for "no file").
static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h ? h : 1;
}

static void rank_path(const struct heartbeat *hb, int r, char *path, size_t cap) {
    snprintf(path, cap, "%s/rank-%d", hb->dir, r);
}

// Reads DIR/failure ("rank R host H pid P\nMSG"); when another rank wrote
// it, keeps "rank R (host H, pid P) ended the job: MSG" in hb->peer_failure.
static void read_failure(struct heartbeat *hb) {
    char path[4200], buf[1100];
    snprintf(path, sizeof path, "%s/failure", hb->dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    int rank = -1, pid = 0;
    char host[64] = "?";
    char *nl = strchr(buf, '\n');
    if (!nl || sscanf(buf, "rank %d host %63s pid %d", &rank, host, &pid) != 3 || rank == hb->rank) return;
    char *msg = nl + 1;
    msg[strcspn(msg, "\n")] = 0;
    pthread_mutex_lock(&hb->lock);
    snprintf(hb->peer_failure, sizeof hb->peer_failure, "rank %d (host %s, pid %d) ended the job: %s", rank,
             host, pid, msg);
    pthread_mutex_unlock(&hb->lock);
}

// Writes this rank's record in place. Returns 0 or -1 with errno.
static int write_record(struct heartbeat *hb) {
    char phase[256], rec[HEARTBEAT_RECORD], path[4200];
    pthread_mutex_lock(&hb->lock);
    snprintf(phase, sizeof phase, "%s", hb->phase);
    double idle = hb->idle_s, stopped = hb->stopped_s, until = hb->stopped_until;
    unsigned long long seq = ++hb->seq;
    pthread_mutex_unlock(&hb->lock);
    for (char *c = phase; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    int n = snprintf(rec, sizeof rec,
                     "trident heartbeat 1\nrank %d\nhost %s\npid %d\nseq %llu\ntime %.3f\nidle_s %.1f\n"
                     "stopped_s %.1f\nstopped_until %.3f\nphase %s\n",
                     hb->rank, hb->host, hb->pid, seq, unix_now(), idle, stopped, until, phase);
    if (n < 0 || n >= (int)sizeof rec) n = (int)sizeof rec - 1, rec[n - 1] = '\n';
    memset(rec + n, ' ', sizeof rec - 1 - (size_t)n);
    rec[sizeof rec - 1] = '\n';
    rank_path(hb, hb->rank, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    ssize_t wrote = pwrite(fd, rec, sizeof rec, 0);
    int saved = errno;
    close(fd);
    errno = saved;
    return wrote == (ssize_t)sizeof rec ? 0 : -1;
}

// Rank r's record into buf (NUL-terminated). Returns its length, -1 when absent.
static int read_record(const struct heartbeat *hb, int r, char *buf, size_t cap) {
    char path[4200];
    rank_path(hb, r, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = pread(fd, buf, cap - 1, 0);
    close(fd);
    if (n < 0) return -1;
    buf[n] = 0;
    return (int)n;
}

// The rest of the line after "\nKEY " in rec ("" when absent).
static void field(const char *rec, const char *key, char *out, size_t cap) {
    char pat[32];
    snprintf(pat, sizeof pat, "\n%s ", key);
    const char *p = strstr(rec, pat);
    out[0] = 0;
    if (!p) return;
    p += strlen(pat);
    size_t n = strcspn(p, "\n");
    while (n && p[n - 1] == ' ') n--;
    snprintf(out, cap, "%.*s", (int)MIN(n, cap - 1), p);
}

static void append(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *msg, size_t cap, const char *fmt, ...) {
    size_t len = strlen(msg);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + len, cap - len, fmt, ap);
    va_end(ap);
}

static void survey_first(struct heartbeat *hb) {
    char rec[HEARTBEAT_RECORD + 1];
    for (int r = 0; r < hb->world; r++) {
        int n = r == hb->rank ? -1 : read_record(hb, r, rec, sizeof rec);
        hb->first[r] = n < 0 ? 0 : hash_bytes(rec, (size_t)n);
    }
}

// The second read: compares with the first and describes what it found.
// A rank whose file changed but that says it was stopped until after this
// rank's progress ended (continued meanwhile: Open MPI sends SIGCONT to every
// rank when the first one exits) counts as stopped too.
static int survey_second(struct heartbeat *hb, const char *my_phase, double my_idle_s, char *msg, size_t cap) {
    char rec[HEARTBEAT_RECORD + 1], host[64], pid[32], t[32], idle[32], phase[256], stopped[32], until[32];
    int nstopped = 0, nother = 0, nsame = 0, nmissing = 0;
    char missing[256] = "";
    char other[2048] = "";
    msg[0] = 0;
    double now = unix_now();
    for (int r = 0; r < hb->world; r++) {
        if (r == hb->rank) continue;
        int n = read_record(hb, r, rec, sizeof rec);
        if (n < 0) {
            if (nmissing++ < LIST_MAX) append(missing, sizeof missing, "%s%d", nmissing > 1 ? ", " : "", r);
            continue;
        }
        field(rec, "host", host, sizeof host), field(rec, "pid", pid, sizeof pid);
        field(rec, "time", t, sizeof t), field(rec, "idle_s", idle, sizeof idle);
        field(rec, "stopped_s", stopped, sizeof stopped), field(rec, "stopped_until", until, sizeof until);
        field(rec, "phase", phase, sizeof phase);
        bool unchanged = hash_bytes(rec, (size_t)n) == hb->first[r];
        // 1 s of slack for the clocks of two hosts
        bool was_stopped = atof(stopped) * 1e3 >= HEARTBEAT_STOPPED_GAP_MS && atof(until) >= now - my_idle_s - 1;
        if (unchanged || was_stopped) {
            if (nstopped++ >= LIST_MAX) continue;
            if (unchanged)
                append(msg, cap, "%srank %d (host %s, pid %s) is stopped or dead: its heartbeat %s/rank-%d did not "
                       "change in %.1f s (last written %.1f s ago, in phase \"%s\", %s s without progress then)",
                       nstopped > 1 ? "; " : "", r, host, pid, hb->dir, r, HEARTBEAT_SURVEY_MS / 1e3,
                       now - atof(t), phase, idle);
            else
                append(msg, cap, "%srank %d (host %s, pid %s) was stopped for %s s, until %.1f s ago (its "
                       "heartbeat %s/rank-%d; in phase \"%s\")", nstopped > 1 ? "; " : "", r, host, pid,
                       stopped, now - atof(until), hb->dir, r, phase);
        } else if (strcmp(phase, my_phase)) {
            if (nother++ < LIST_MAX)
                append(other, sizeof other, "%srank %d (host %s) is alive, in phase \"%s\" without progress for %s s",
                       nother > 1 ? "; " : "", r, host, phase, idle);
        } else {
            nsame++;
        }
    }
    if (nstopped > LIST_MAX) append(msg, cap, "; %d more stopped", nstopped - LIST_MAX);
    if (!nstopped) append(msg, cap, "no peer's heartbeat (%s) stopped", hb->dir);
    if (nother) append(msg, cap, "; %s%s", other, nother > LIST_MAX ? "; more in other phases" : "");
    if (nsame) append(msg, cap, "; %d other rank%s alive in this phase", nsame, nsame > 1 ? "s" : "");
    if (nmissing)
        append(msg, cap, "; no heartbeat file of rank%s %s%s (not started, ended, or %s not shared with this host)",
               nmissing > 1 ? "s" : "", missing, nmissing > LIST_MAX ? ", ..." : "", hb->dir);
    return nstopped;
}

static void wait_ms(struct heartbeat *hb, long long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = ts.tv_nsec + ms * 1000000;
    ts.tv_sec += ns / 1000000000, ts.tv_nsec = ns % 1000000000;
    pthread_cond_timedwait(&hb->cv, &hb->lock, &ts);
}

static void *beat(void *arg) {
    struct heartbeat *hb = arg;
    long long next_write = mono_ms() + HEARTBEAT_WRITE_MS;
    pthread_mutex_lock(&hb->lock);
    while (!hb->stop) {
        long long now = mono_ms();
        if (hb->survey == SURVEY_ASKED) {
            pthread_mutex_unlock(&hb->lock);
            survey_first(hb);
            pthread_mutex_lock(&hb->lock);
            hb->survey = SURVEY_WAITING, hb->survey_due = mono_ms() + HEARTBEAT_SURVEY_MS;
        } else if (hb->survey == SURVEY_WAITING && now >= hb->survey_due) {
            char phase[256], result[sizeof hb->result];
            snprintf(phase, sizeof phase, "%s", hb->my_phase);
            double idle = hb->my_idle_s + (now - hb->survey_asked) / 1e3;
            pthread_mutex_unlock(&hb->lock);
            int n = survey_second(hb, phase, idle, result, sizeof result);
            pthread_mutex_lock(&hb->lock);
            memcpy(hb->result, result, sizeof result);
            hb->nstopped = n, hb->survey = SURVEY_ANSWERED;
            pthread_cond_broadcast(&hb->cv);
        } else if (now >= next_write) {
            pthread_mutex_unlock(&hb->lock);
            write_record(hb); // a failed write shows as a stopped rank to the peers
            if (!hb->peer_failure[0]) read_failure(hb);
            pthread_mutex_lock(&hb->lock);
            next_write = mono_ms() + HEARTBEAT_WRITE_MS;
        } else {
            // A 50 ms wait that took seconds: the process did not run
            // (SIGSTOP, a debugger, a suspended machine); the records say so.
            wait_ms(hb, 50);
            long long after = mono_ms();
            if (after - now >= HEARTBEAT_STOPPED_GAP_MS)
                hb->stopped_s = (after - now) / 1e3, hb->stopped_until = unix_now(), next_write = after;
        }
    }
    pthread_mutex_unlock(&hb->lock);
    char path[4200];
    rank_path(hb, hb->rank, path, sizeof path);
    unlink(path);
    rmdir(hb->dir); // the last rank to end removes the folder (ENOTEMPTY for the others)
    pthread_mutex_lock(&hb->lock);
    hb->exited = true;
    pthread_cond_broadcast(&hb->cv);
    pthread_mutex_unlock(&hb->lock);
    return NULL;
}

static void heartbeat_free(struct heartbeat *hb) {
    pthread_cond_destroy(&hb->cv);
    pthread_mutex_destroy(&hb->lock);
    free(hb->first);
    free(hb);
}

enum status heartbeat_open(struct heartbeat **out, const char *dir, int rank, int world_size,
                           const char *host, struct error *err) {
    *out = NULL;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return error_set(err, STATUS_RUNTIME, "heartbeat folder %s: mkdir: %s", dir, strerror(errno));
    if (rank == 0) { // an earlier start's announcement (this run folder resumed)
        char stale[4200];
        snprintf(stale, sizeof stale, "%s/failure", dir);
        unlink(stale);
    }
    struct heartbeat *hb = xcalloc(1, sizeof *hb);
    snprintf(hb->dir, sizeof hb->dir, "%s", dir);
    snprintf(hb->host, sizeof hb->host, "%s", host);
    hb->rank = rank, hb->world = world_size, hb->pid = (int)getpid();
    hb->first = xcalloc((size_t)(world_size > 0 ? world_size : 1), sizeof *hb->first);
    snprintf(hb->phase, sizeof hb->phase, "start");
    pthread_mutex_init(&hb->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (write_record(hb)) {
        error_set(err, STATUS_RUNTIME, "heartbeat file %s/rank-%d: %s", dir, rank, strerror(errno));
        heartbeat_free(hb);
        return STATUS_RUNTIME;
    }
    if (pthread_create(&hb->thread, NULL, beat, hb)) {
        char path[4200];
        rank_path(hb, rank, path, sizeof path);
        unlink(path);
        heartbeat_free(hb);
        return error_set(err, STATUS_RUNTIME, "heartbeat thread: pthread_create failed");
    }
    *out = hb;
    return STATUS_OK;
}

void heartbeat_set(struct heartbeat *hb, const char *phase, double idle_s) {
    if (!hb) return;
    pthread_mutex_lock(&hb->lock);
    snprintf(hb->phase, sizeof hb->phase, "%s", phase);
    hb->idle_s = idle_s;
    pthread_mutex_unlock(&hb->lock);
}

void heartbeat_announce(struct heartbeat *hb, const char *msg) {
    if (!hb) return;
    char tmp[4200], path[4200];
    snprintf(tmp, sizeof tmp, "%s/failure.rank-%d", hb->dir, hb->rank);
    snprintf(path, sizeof path, "%s/failure", hb->dir);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "rank %d host %s pid %d\n%s\n", hb->rank, hb->host, hb->pid, msg);
    if (fclose(f) == 0) (void)link(tmp, path); // best effort; EEXIST: an earlier one stands
    unlink(tmp);
}

int heartbeat_peer_failure(struct heartbeat *hb, char *msg, size_t cap) {
    if (!hb) return 0;
    pthread_mutex_lock(&hb->lock);
    int found = hb->peer_failure[0] != 0;
    if (found) snprintf(msg, cap, "%s", hb->peer_failure);
    pthread_mutex_unlock(&hb->lock);
    return found;
}

int heartbeat_survey(struct heartbeat *hb, const char *my_phase, double my_idle_s, char *msg, size_t cap, int wait) {
    pthread_mutex_lock(&hb->lock);
    if (hb->survey == SURVEY_IDLE) {
        snprintf(hb->my_phase, sizeof hb->my_phase, "%s", my_phase);
        hb->my_idle_s = my_idle_s, hb->survey_asked = mono_ms();
        hb->survey = SURVEY_ASKED;
        pthread_cond_broadcast(&hb->cv);
    }
    long long deadline = mono_ms() + wait;
    while (hb->survey != SURVEY_ANSWERED && mono_ms() < deadline) wait_ms(hb, 50);
    int n = -1;
    if (hb->survey == SURVEY_ANSWERED) {
        snprintf(msg, cap, "%s", hb->result);
        n = hb->nstopped, hb->survey = SURVEY_IDLE;
    } else {
        snprintf(msg, cap, "the heartbeat files in %s were not read within %.1f s (a hung file system?)", hb->dir,
                 wait / 1e3);
    }
    pthread_mutex_unlock(&hb->lock);
    return n;
}

void heartbeat_close(struct heartbeat *hb) {
    if (!hb) return;
    pthread_mutex_lock(&hb->lock);
    hb->stop = true;
    pthread_cond_broadcast(&hb->cv);
    long long deadline = mono_ms() + 2000;
    while (!hb->exited && mono_ms() < deadline) wait_ms(hb, 50);
    bool exited = hb->exited;
    pthread_mutex_unlock(&hb->lock);
    if (!exited) { // stuck in a file system call: leave it its memory
        pthread_detach(hb->thread);
        return;
    }
    pthread_join(hb->thread, NULL);
    heartbeat_free(hb);
}
