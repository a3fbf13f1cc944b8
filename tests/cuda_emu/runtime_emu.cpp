// runtime_emu.cpp: the emulated CUDA runtime API (cuda_runtime_api.h):
// devices, streams, events, memory and copies, with streams that run ahead of
// the host as a GPU's do.
//
// Streams: each stream is a FIFO of operations (kernel launches, copies,
// memsets, cuBLASLt matmuls, NCCL operations, event markers, waits) run by a
// worker thread of its own, started at the stream's first operation, after
// the host call that queued it has returned. The legacy default stream
// (cudaStream_t 0) is a stream too, id 0, with CUDA's implicit ordering: an
// operation on it waits for everything queued before on every blocking
// stream (cudaStreamCreate, flags 0), and an operation on a blocking stream
// waits for everything queued before on it; cudaStreamNonBlocking streams
// take no part. An operation carries its dependencies as (stream, sequence
// number) pairs; a worker waits (on a condition variable: no spinning) until
// they have completed, then runs it without any lock held (kernels take
// emu_launch_lock: one kernel at a time in the process).
//
// What the host knows: every stream's tail carries a vector clock (vc[id]:
// the last operation of stream id that it is ordered after, through the
// stream itself, cudaStreamWaitEvent and the legacy stream's ordering); a
// synchronisation (cudaStreamSynchronize, cudaEventSynchronize, a
// successful cudaEventQuery or cudaStreamQuery, cudaDeviceSynchronize, the
// copies that return after completing) merges the clock it waited for into
// the host's own, and pinned_emu.cpp lifts the protection of the pinned
// buffers whose pending copies the host's clock now covers.
//
// TRIDENT_EMU_DELAY=<max_us>[:seed]: each worker sleeps a random 0..max_us
// microseconds before each operation (seed: the process id by default), to
// make ordering bugs show.
//
// Nothing here is freed that a queued operation may still point at: streams
// live until the process exits (cudaStreamDestroy lets the worker drain the
// queue and end; other streams' dependencies name the stream), an event
// until its destroy and its last queued marker (dependencies copy the
// record's stream and number, not the event).
#include "cuda_emu.h"
#include "emu_internal.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <new>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

typedef std::pair<emu_stream *, uint64_t> dep_t; // done when the stream's operation seq has completed

struct job {
    std::function<void()> fn;
    std::vector<dep_t> deps;
    uint64_t seq;
};

void merge(std::vector<uint64_t> &into, const std::vector<uint64_t> &from) {
    if (into.size() < from.size()) into.resize(from.size(), 0);
    for (size_t i = 0; i < from.size(); i++) into[i] = std::max(into[i], from[i]);
}

} // namespace

struct emu_stream {
    int id;
    unsigned flags;
    int priority;
    std::deque<job> q;                 // queued, front running or next
    uint64_t enqueued = 0, completed = 0; // sequence numbers of operations
    std::vector<uint64_t> vc;          // the tail's vector clock (see the top)
    bool worker = false;               // a worker thread serves the queue
    bool destroyed = false;
    std::condition_variable cv;        // work queued, or destroyed
    std::mt19937_64 rng;               // TRIDENT_EMU_DELAY
};

struct emu_event {
    unsigned flags;
    emu_stream *stream = nullptr; // of the last record; nullptr: never recorded (complete)
    uint64_t seq = 0;             // the record's marker on stream
    uint64_t gen = 0;             // records so far
    double ms = 0;                // when the worker reached the last record's marker
    std::vector<uint64_t> vc;     // the stream's clock at the record
    int markers = 0;              // queued markers not yet reached (they point at the event)
    bool destroyed = false;       // freed when the last marker is reached
};

namespace {

// Under mu: every stream and event field above, the queues, host_vc. Never
// destroyed (workers may run while the process exits).
std::mutex &mu = *new std::mutex;
std::condition_variable &done_cv = *new std::condition_variable; // an operation completed
std::vector<emu_stream *> &streams = *new std::vector<emu_stream *>; // by id; [0] the legacy stream
std::vector<uint64_t> &host_vc = *new std::vector<uint64_t>;          // what the host has synchronised with
unsigned delay_us;
uint64_t delay_seed;
bool respawn; // after fork(): queues whose worker did not survive

int current_device = 0;
cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

void fork_prepare() {
    emu_launch_lock.lock(-5); // no kernel runs during the fork
    mu.lock();
}
void fork_parent() {
    mu.unlock();
    emu_launch_lock.unlock();
}
// The child has the calling thread only: its workers are gone. Locks and
// condition variables are made afresh; workers are started again on demand.
void fork_child() {
    new (&mu) std::mutex;
    new (&emu_launch_lock.m) std::mutex;
    new (&emu_launch_lock.cv) std::condition_variable;
    emu_launch_lock.held = false;
    for (int &w : emu_launch_lock.waiting) w = 0;
    new (&done_cv) std::condition_variable;
    for (emu_stream *s : streams) {
        new (&s->cv) std::condition_variable;
        s->worker = false;
    }
    respawn = true;
}

emu_stream *new_stream_locked(unsigned flags, int priority) {
    emu_stream *s = new emu_stream;
    s->id = (int)streams.size();
    s->flags = flags;
    s->priority = priority;
    s->rng.seed(delay_seed * 1000003u + (uint64_t)s->id);
    streams.push_back(s);
    return s;
}

// Reads TRIDENT_EMU_DELAY, makes the legacy stream and the fork handlers,
// once; returns mu locked.
std::unique_lock<std::mutex> lock_runtime() {
    static bool ready = [] {
        const char *d = getenv("TRIDENT_EMU_DELAY");
        delay_seed = (uint64_t)getpid();
        if (d && *d) {
            char *end = nullptr;
            delay_us = (unsigned)strtoul(d, &end, 10);
            if (end && *end == ':') delay_seed = strtoull(end + 1, nullptr, 10);
            else if (end && *end) {
                fprintf(stderr, "cuda_emu: TRIDENT_EMU_DELAY=%s: expected <max_us>[:seed]\n", d);
                abort();
            }
        }
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        std::lock_guard<std::mutex> lk(mu);
        new_stream_locked(0, 0); // the legacy default stream
        return true;
    }();
    (void)ready;
    return std::unique_lock<std::mutex>(mu);
}

emu_stream *resolve(cudaStream_t s) { return s ? s : streams[0]; }
bool is_legacy(const emu_stream *s) { return s->id == 0; }
bool is_blocking(const emu_stream *s) { return !is_legacy(s) && !(s->flags & cudaStreamNonBlocking); }

void worker_main(emu_stream *s) {
    emu_thread_priority = s->priority;
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
        s->cv.wait(lk, [s] { return !s->q.empty() || s->destroyed; });
        if (s->q.empty()) break; // destroyed and drained
        job &j = s->q.front();   // references into a deque survive push_back
        done_cv.wait(lk, [&j] {
            for (const dep_t &d : j.deps)
                if (d.first->completed < d.second) return false;
            return true;
        });
        std::function<void()> fn = std::move(j.fn);
        uint64_t seq = j.seq;
        unsigned sleep_us = delay_us ? (unsigned)(s->rng() % ((uint64_t)delay_us + 1)) : 0;
        lk.unlock();
        if (sleep_us) usleep(sleep_us);
        if (fn) fn(); // empty: it was running when the process forked (the child's copy of the queue)
        fn = nullptr; // the closure's captures go outside the lock
        lk.lock();
        s->q.pop_front();
        s->completed = seq;
        done_cv.notify_all();
    }
    s->worker = false;
}

void start_worker_locked(emu_stream *s) {
    if (s->worker) return;
    s->worker = true;
    std::thread(worker_main, s).detach();
}

void respawn_locked() {
    if (!respawn) return;
    respawn = false;
    for (emu_stream *s : streams)
        if (!s->q.empty()) start_worker_locked(s);
}

// Queues fn on s after deps and the legacy stream's implicit ordering;
// returns its sequence number. Under mu.
uint64_t enqueue_locked(emu_stream *s, std::function<void()> fn, std::vector<dep_t> deps = {}) {
    if (s->destroyed) {
        fprintf(stderr, "cuda_emu: an operation queued on stream %d after cudaStreamDestroy\n", s->id);
        abort();
    }
    respawn_locked();
    if (s->vc.size() < streams.size()) s->vc.resize(streams.size(), 0);
    if (is_legacy(s)) {
        for (emu_stream *b : streams)
            if (is_blocking(b)) {
                if (b->enqueued > b->completed) deps.push_back({b, b->enqueued});
                merge(s->vc, b->vc);
            }
    } else if (is_blocking(s)) {
        emu_stream *l = streams[0];
        if (l->enqueued > l->completed) deps.push_back({l, l->enqueued});
        merge(s->vc, l->vc);
    }
    job j;
    j.fn = std::move(fn);
    j.deps = std::move(deps);
    j.seq = ++s->enqueued;
    s->vc[s->id] = j.seq;
    s->q.push_back(std::move(j));
    emu_note_queued(s->enqueued - s->completed);
    start_worker_locked(s);
    s->cv.notify_one();
    return s->enqueued;
}

void wait_locked(std::unique_lock<std::mutex> &lk, emu_stream *s, uint64_t seq) {
    respawn_locked();
    done_cv.wait(lk, [s, seq] { return s->completed >= seq; });
}

// The host has seen everything of clock vc complete.
void host_knows_locked(const std::vector<uint64_t> &vc) {
    merge(host_vc, vc);
    emu_pinned_synchronised(host_vc.data(), (int)host_vc.size());
}

void device_synchronize_locked(std::unique_lock<std::mutex> &lk) {
    std::vector<uint64_t> vc;
    for (size_t i = 0; i < streams.size(); i++) {
        emu_stream *s = streams[i];
        wait_locked(lk, s, s->enqueued);
        merge(vc, s->vc);
    }
    host_knows_locked(vc);
}

} // namespace

void emu_enqueue(cudaStream_t s, std::function<void()> fn) {
    auto lk = lock_runtime();
    enqueue_locked(resolve(s), std::move(fn));
}

// ---- test hooks (cuda_runtime_api.h) -------------------------------------------------

struct emu_gate {
    bool open = false; // under mu
};

extern "C" struct emu_gate *emu_gate_close(cudaStream_t s) {
    emu_gate *g = new emu_gate;
    emu_enqueue(s, [g] {
        std::unique_lock<std::mutex> lk(mu);
        done_cv.wait(lk, [g] { return g->open; });
        delete g;
    });
    return g;
}

extern "C" void emu_gate_open(struct emu_gate *g) {
    auto lk = lock_runtime();
    g->open = true;
    done_cv.notify_all();
}

extern "C" unsigned long long emu_stream_pending(cudaStream_t s) {
    auto lk = lock_runtime();
    emu_stream *st = resolve(s);
    return st->enqueued - st->completed;
}

extern "C" {

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (emulated)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (emulated)";
    case cudaErrorNotReady: return "device not ready (emulated)";
    default: return "emulated CUDA error";
    }
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetDeviceCount(int *n) {
    const char *s = getenv("TRIDENT_EMU_DEVICES");
    *n = s && *s ? atoi(s) : 8;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    int n;
    cudaGetDeviceCount(&n);
    if (device < 0 || device >= n) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = current_device;
    return cudaSuccess;
}

// TRIDENT_EMU_CC as (major, minor); 9.0 when unset or unreadable.
static void emu_compute_capability(int *major, int *minor) {
    *major = 9, *minor = 0;
    const char *v = getenv("TRIDENT_EMU_CC");
    int a, b;
    if (v && sscanf(v, "%d.%d", &a, &b) == 2) *major = a, *minor = b;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    int n, major, minor;
    cudaGetDeviceCount(&n);
    if (device < 0 || device >= n) return fail(cudaErrorInvalidDevice);
    emu_compute_capability(&major, &minor);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 4; break;
    case cudaDevAttrComputeCapabilityMajor: *value = major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = minor; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    int n;
    cudaGetDeviceCount(&n);
    if (device < 0 || device >= n) return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "emulated GPU");
    emu_compute_capability(&prop->major, &prop->minor);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    int n;
    cudaGetDeviceCount(&n);
    if (device < 0 || device >= n || len < 13) return fail(device < 0 || device >= n ? cudaErrorInvalidDevice
                                                                                   : cudaErrorInvalidValue);
    int physical = device;
    if (const char *v = getenv("CUDA_VISIBLE_DEVICES")) {
        for (int i = 0; *v && i < device; i++) v = strchr(v, ',') ? strchr(v, ',') + 1 : "";
        if (*v >= '0' && *v <= '9') physical = atoi(v);
    }
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", physical & 0xff);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    emu_count_sync();
    auto lk = lock_runtime();
    device_synchronize_locked(lk);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    size_t total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    size_t avail = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    *free_bytes = avail;
    *total_bytes = total;
    return cudaSuccess;
}

// ---- streams ----------------------------------------------------------------------

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;     // as on an H100
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    return cudaStreamCreateWithPriority(s, flags, 0);
}

// A priority outside [-5, 0] is clamped, as CUDA does.
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
    if (!s || (flags & ~(unsigned)cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
    auto lk = lock_runtime();
    *s = new_stream_locked(flags, std::min(0, std::max(-5, priority)));
    return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority) {
    auto lk = lock_runtime();
    *priority = resolve(s)->priority;
    return cudaSuccess;
}

// Returns at once; the queued work still runs, then the worker ends.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return fail(cudaErrorInvalidResourceHandle);
    auto lk = lock_runtime();
    s->destroyed = true;
    s->cv.notify_one();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    emu_count_sync();
    auto lk = lock_runtime();
    emu_stream *st = resolve(s);
    // The legacy stream: a marker, so that it also waits for the blocking streams.
    uint64_t seq = is_legacy(st) ? enqueue_locked(st, [] {}) : st->enqueued;
    std::vector<uint64_t> vc = st->vc;
    wait_locked(lk, st, seq);
    host_knows_locked(vc);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    auto lk = lock_runtime();
    emu_stream *st = resolve(s);
    bool done = st->completed >= st->enqueued;
    if (is_legacy(st))
        for (emu_stream *b : streams)
            if (is_blocking(b)) done = done && b->completed >= b->enqueued;
    if (!done) return cudaErrorNotReady; // not an error: not sticky
    std::vector<uint64_t> vc = st->vc;
    if (is_legacy(st))
        for (emu_stream *b : streams)
            if (is_blocking(b)) merge(vc, b->vc);
    host_knows_locked(vc);
    return cudaSuccess;
}

// Work queued on s from now on waits for e's record current now (none: no wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    auto lk = lock_runtime();
    emu_stream *st = resolve(s);
    if (!e->stream) return cudaSuccess;
    if (e->stream != st && e->stream->completed < e->seq)
        enqueue_locked(st, [] {}, {{e->stream, e->seq}});
    if (st->vc.size() < streams.size()) st->vc.resize(streams.size(), 0);
    merge(st->vc, e->vc);
    return cudaSuccess;
}

// ---- events -----------------------------------------------------------------------

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (!e) return fail(cudaErrorInvalidValue);
    *e = new emu_event;
    (*e)->flags = flags;
    return cudaSuccess;
}

// As CUDA: returns at once; a marker still queued keeps the event until it is reached.
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    auto lk = lock_runtime();
    e->destroyed = true;
    if (e->markers == 0) delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e || e->destroyed) return fail(cudaErrorInvalidResourceHandle);
    auto lk = lock_runtime();
    emu_stream *st = resolve(s);
    uint64_t gen = ++e->gen;
    e->markers++;
    e->seq = enqueue_locked(st, [e, gen] {
        double t = now_ms();
        std::lock_guard<std::mutex> g(mu);
        if (e->gen == gen) e->ms = t;
        if (--e->markers == 0 && e->destroyed) delete e;
    });
    e->stream = st;
    e->vc = st->vc;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    auto lk = lock_runtime();
    if (e->stream && e->stream->completed < e->seq) return cudaErrorNotReady;
    host_knows_locked(e->vc);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    auto lk = lock_runtime();
    if (e->stream) wait_locked(lk, e->stream, e->seq);
    host_knows_locked(e->vc);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end || !start->stream || !end->stream) return fail(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
    auto lk = lock_runtime();
    if (start->stream->completed < start->seq || end->stream->completed < end->seq) return cudaErrorNotReady;
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

// ---- memory -----------------------------------------------------------------------

} // extern "C"

namespace {
// Count-only mode: device memory is mapped, never touched (zero pages).
std::mutex &mapped_lock = *new std::mutex;
std::unordered_map<void *, size_t> &mapped = *new std::unordered_map<void *, size_t>;
} // namespace

extern "C" {

cudaError_t cudaMalloc(void **p, size_t n) {
    emu_count_malloc();
    if (emu_count_only_mode()) {
        size_t bytes = n ? n : 1;
        void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
        std::lock_guard<std::mutex> lock(mapped_lock);
        mapped[m] = bytes;
        *p = m;
        return cudaSuccess;
    }
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p) return fail(cudaErrorMemoryAllocation);
    memset(*p, 0xff, n);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) { return emu_pinned_alloc(p, n); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { return emu_pinned_alloc(p, n); }

// As CUDA's: waits for the whole device first (no queued kernel still uses p).
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    emu_count_free();
    cudaDeviceSynchronize();
    if (emu_count_only_mode()) {
        std::lock_guard<std::mutex> lock(mapped_lock);
        auto it = mapped.find(p);
        if (it != mapped.end()) {
            munmap(p, it->second);
            mapped.erase(it);
            return cudaSuccess;
        }
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    cudaDeviceSynchronize();
    return emu_pinned_free(p);
}

} // extern "C"

namespace {

// Every copy and memset. sync_api: cudaMemcpy / cudaMemset (the legacy stream).
// As CUDA does (its "API synchronization behavior" page): from pageable host
// memory the source is staged at the call, which returns before the device
// has it; into pageable host memory the call returns once the copy is done;
// host to host completes before returning; everything else is asynchronous,
// except cudaMemcpy with pinned memory, which completes before returning.
// Pinned memory is read and written through its device view, and an
// asynchronous copy registers it as pending (pinned_emu.cpp).
cudaError_t copy(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t stream, bool sync_api,
                 bool memset_value, int value) {
    if (!n) return cudaSuccess;
    emu_count_copy(n);
    void *dv = emu_pinned_device_view(d);
    const void *sv = memset_value ? nullptr : emu_pinned_device_view(s);
    if (!memset_value && k == cudaMemcpyDeviceToHost) emu_count_d2h();
    if (!memset_value && k == cudaMemcpyHostToDevice && !sv) emu_count_pageable_h2d();
    void *dst = dv ? dv : d;
    const void *src = sv ? sv : s;
    bool dst_host = !memset_value && (k == cudaMemcpyDeviceToHost || k == cudaMemcpyHostToHost);
    bool src_host = !memset_value && (k == cudaMemcpyHostToDevice || k == cudaMemcpyHostToHost);
    if (emu_count_only_mode()) { // host destinations read zeros (the device's untouched pages)
        if (dst_host || dv) memset(dst, 0, n);
        return cudaSuccess;
    }
    auto lk = lock_runtime();
    emu_stream *st = resolve(stream);
    if (memset_value) {
        uint64_t seq = enqueue_locked(st, [dst, value, n] { memset(dst, value, n); });
        if (dv && sync_api) wait_locked(lk, st, seq);
        else if (dv) emu_pinned_pending(d, n, true, st->id, seq);
        return cudaSuccess;
    }
    if (src_host && !sv && !dst_host) { // staged from pageable memory
        std::shared_ptr<char[]> staged(new char[n]);
        memcpy(staged.get(), s, n);
        enqueue_locked(st, [dst, staged, n] { memcpy(dst, staged.get(), n); });
        return cudaSuccess;
    }
    uint64_t seq = enqueue_locked(st, [dst, src, n] { memmove(dst, src, n); });
    // cudaMemcpyDefault: which side is the host is not known here (no
    // unified addressing), so it completes before returning.
    bool wait = (dst_host && !dv) || (src_host && dst_host) || (sync_api && (dv || sv)) || k == cudaMemcpyDefault;
    if (wait) {
        std::vector<uint64_t> vc = st->vc;
        wait_locked(lk, st, seq);
        host_knows_locked(vc);
        return cudaSuccess;
    }
    if (dv) emu_pinned_pending(d, n, true, st->id, seq);
    if (sv) emu_pinned_pending(s, n, false, st->id, seq);
    return cudaSuccess;
}

} // namespace

extern "C" {

cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    return copy(d, s, n, k, nullptr, true, false, 0);
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    return copy(d, s, n, k, st, false, false, 0);
}

cudaError_t cudaMemset(void *d, int v, size_t n) {
    return copy(d, nullptr, n, cudaMemcpyDeviceToDevice, nullptr, true, true, v);
}

cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t s) {
    return copy(d, nullptr, n, cudaMemcpyDeviceToDevice, s, false, true, v);
}

} // extern "C"
