// check_streams.cpp: the emulation's streams, events and pinned-memory checks
// (tests/cuda_emu/runtime_emu.cpp, pinned_emu.cpp), built by `make EMU=1` into
// $(BUILD)/tests/check_streams and run by tests/e2e/cuda_emulated.sh (also
// under TRIDENT_EMU_DELAY). A stream is held back by a gate (a queued host
// function that waits until the check opens it), so that what must not have
// run yet can be seen not to have run:
// - an event is pending (cudaEventQuery, cudaStreamQuery: cudaErrorNotReady)
//   until its stream reaches it, then complete; cudaEventElapsedTime measures
//   the workers' times;
// - cudaStreamWaitEvent holds a second stream's kernel until the first
//   stream's record (and only then: the same kernel without the wait runs
//   at once); an event never recorded holds nothing;
// - the legacy stream waits for a blocking stream, not for a non-blocking one;
// - of two kernels waiting for the one-kernel-at-a-time lock, the one of the
//   higher-priority stream runs first;
// - a host read of a pinned D2H destination before a synchronisation aborts
//   naming the buffer, its bytes and the stream (child process), even when
//   the copy itself has long finished; so does a host write into the pinned
//   source of an H2D copy not synchronised; a read after
//   cudaStreamSynchronize or cudaEventSynchronize sees the data; other bytes
//   of a protected page stay usable.
// - exit() with work still queued ends the process normally.
// Exit 1 on a failed check.
#include <cuda_runtime.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "check.h"
#include "emu_internal.h" // emu_launch_lock: kernels waiting for it (check_priority)

__global__ void set_value(int *p, int v) { *p = v; }
__global__ void add_one(int *out, const int *in) { *out = *in + 1; }
__global__ void fill(int *p, int v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

// Spins until *flag (host memory: the emulation only) while holding the
// one-kernel-at-a-time lock; mark appends id to order.
__global__ void spin(volatile int *flag, volatile int *started) {
    *started = 1;
    while (!*flag) {
    }
}
__global__ void mark(int *order, int *n, int id) { order[atomicAdd(n, 1)] = id; }

// A stream held until open() (emu_gate_close / emu_gate_open, cuda_runtime_api.h).
struct gate {
    struct emu_gate *g = nullptr;
    void close_on(cudaStream_t s) { g = emu_gate_close(s); }
    void open() { emu_gate_open(g); }
};

static void settle() { usleep(30000); } // time for a worker that could run ahead to do so

// Polls until ready() holds, at most 10 s (a loaded machine schedules the
// workers late); whether it held.
template <class F> static bool wait_until(F ready) {
    for (int i = 0; i < 10000; i++) {
        if (ready()) return true;
        usleep(1000);
    }
    return ready();
}
// Kernels waiting for the emulation's one-launch-at-a-time lock at -priority p.
static int lock_waiters(int p) {
    std::lock_guard<std::mutex> lk(emu_launch_lock.m);
    return emu_launch_lock.waiting[p];
}

static void check_events() {
    cudaStream_t a;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaEvent_t start, e;
    cudaEventCreate(&start);
    cudaEventCreate(&e);
    EXPECT(cudaEventQuery(e) == cudaSuccess, "an event never recorded is complete");
    gate g;
    cudaEventRecord(start, a);
    g.close_on(a);
    cudaEventRecord(e, a);
    settle();
    EXPECT(cudaEventQuery(e) == cudaErrorNotReady, "an event behind a closed gate is pending");
    EXPECT(cudaStreamQuery(a) == cudaErrorNotReady, "a stream with a closed gate is busy");
    EXPECT(emu_stream_pending(a) == 2, "emu_stream_pending: %llu, expected 2 (the gate, the record)",
           emu_stream_pending(a));
    g.open();
    EXPECT(cudaEventSynchronize(e) == cudaSuccess, "cudaEventSynchronize");
    EXPECT(cudaEventQuery(e) == cudaSuccess, "an event reached is complete");
    EXPECT(cudaStreamQuery(a) == cudaSuccess, "an idle stream is done");
    float ms = -1;
    EXPECT(cudaEventElapsedTime(&ms, start, e) == cudaSuccess && ms >= 20.0f,
           "elapsed time across a gate held >= 30 ms: %g ms", ms);
    cudaEventDestroy(start);
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
}

static void check_wait_event() {
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithPriority(&b, cudaStreamNonBlocking, -5);
    int prio = 1, least = 1, greatest = 1;
    cudaStreamGetPriority(b, &prio);
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    EXPECT(prio == -5 && least == 0 && greatest == -5, "priorities: %d in [%d, %d]", prio, least, greatest);
    int *x, *y, *z;
    cudaMalloc(&x, sizeof(int));
    cudaMalloc(&y, sizeof(int));
    cudaMalloc(&z, sizeof(int));
    set_value<<<1, 1, 0, b>>>(y, -1);
    set_value<<<1, 1, 0, b>>>(z, -1);
    cudaStreamSynchronize(b);
    cudaEvent_t e, never;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&never, cudaEventDisableTiming);
    gate g;
    g.close_on(a);
    set_value<<<1, 1, 0, a>>>(x, 41);
    cudaEventRecord(e, a);
    // Without a wait, b runs ahead of a's gate: the check below can fail.
    add_one<<<1, 1, 0, b>>>(z, y);
    cudaStreamSynchronize(b);
    int hz = 0;
    cudaMemcpy(&hz, z, sizeof hz, cudaMemcpyDeviceToHost);
    EXPECT(hz == 0, "a stream that does not wait runs ahead: z = %d, expected 0", hz);
    cudaStreamWaitEvent(b, never, 0); // holds nothing
    cudaStreamWaitEvent(b, e, 0);
    add_one<<<1, 1, 0, b>>>(y, x);
    settle();
    EXPECT(cudaStreamQuery(b) == cudaErrorNotReady, "a stream waiting for a pending event is busy");
    g.open();
    cudaStreamSynchronize(b);
    int hy = 0;
    cudaMemcpy(&hy, y, sizeof hy, cudaMemcpyDeviceToHost);
    EXPECT(hy == 42, "cudaStreamWaitEvent: y = %d, expected 42 (x written on a before the record)", hy);
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

// Two kernels wait for the launch lock (a third kernel holds it): the one of
// the higher-priority stream runs first, though queued second.
static void check_priority() {
    cudaStream_t x, low, high;
    cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
    cudaStreamCreateWithPriority(&low, cudaStreamNonBlocking, 0);
    cudaStreamCreateWithPriority(&high, cudaStreamNonBlocking, -5);
    static volatile int flag, started;
    flag = 0;
    started = 0;
    int *order, *n;
    cudaMalloc(&order, 2 * sizeof(int));
    cudaMalloc(&n, sizeof(int));
    cudaMemsetAsync(n, 0, sizeof(int), x);
    spin<<<1, 1, 0, x>>>(&flag, &started);
    EXPECT(wait_until([] { return started != 0; }), "the spinning kernel never started");
    mark<<<1, 1, 0, low>>>(order, n, 1);
    EXPECT(wait_until([] { return lock_waiters(0) == 1; }), "the low-priority kernel never waited for the lock");
    mark<<<1, 1, 0, high>>>(order, n, 2);
    EXPECT(wait_until([] { return lock_waiters(5) == 1; }), "the high-priority kernel never waited for the lock");
    flag = 1;
    cudaDeviceSynchronize();
    int h[2] = {0, 0};
    cudaMemcpy(h, order, sizeof h, cudaMemcpyDeviceToHost);
    EXPECT(h[0] == 2 && h[1] == 1, "priorities at the launch lock: ran %d then %d, expected 2 (high) then 1", h[0],
           h[1]);
    cudaFree(order);
    cudaFree(n);
    cudaStreamDestroy(x);
    cudaStreamDestroy(low);
    cudaStreamDestroy(high);
}

static void check_legacy() {
    cudaStream_t blocking, nonblocking;
    cudaStreamCreate(&blocking);
    cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking);
    int *p;
    cudaMalloc(&p, 2 * sizeof(int));
    gate g;
    g.close_on(blocking);
    set_value<<<1, 1>>>(p, 7); // the legacy stream: after the blocking stream's gate
    set_value<<<1, 1, 0, nonblocking>>>(p + 1, 8);
    cudaStreamSynchronize(nonblocking); // not ordered after the legacy stream
    settle();
    EXPECT(cudaStreamQuery(0) == cudaErrorNotReady, "the legacy stream waits for a blocking stream");
    g.open();
    int h[2] = {0, 0};
    cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost);
    EXPECT(h[0] == 7 && h[1] == 8, "legacy and non-blocking streams: %d %d", h[0], h[1]);
    cudaFree(p);
    cudaStreamDestroy(blocking);
    cudaStreamDestroy(nonblocking);
}

static void check_pinned() {
    const int n = 16;
    cudaStream_t a;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    int *d, *h;
    cudaMalloc(&d, n * sizeof(int));
    cudaMallocHost(&h, 4096);
    fill<<<1, 32, 0, a>>>(d, 100, n);
    cudaStreamSynchronize(a); // nothing in flight at the fork
    // Read before any synchronisation: reported though the copy has finished.
    std::string err;
    int st = in_child([&] {
        cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, a);
        usleep(20000);
        volatile int v = h[3];
        (void)v;
    }, &err);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "a read before sync: status %d, expected abort", st);
    char want[160];
    snprintf(want, sizeof want, "host read of pinned memory %p (%d bytes) before the copy into it on stream",
             (void *)h, (int)(n * sizeof(int)));
    EXPECT(err.find(want) != std::string::npos, "a read before sync: message\n  %s\nwithout\n  %s", err.c_str(), want);
    // A write into the pinned source of an H2D copy not synchronised.
    err.clear();
    st = in_child([&] {
        gate g;
        g.close_on(a);
        cudaMemcpyAsync(d, h, n * sizeof(int), cudaMemcpyHostToDevice, a);
        volatile int v = h[1]; // reading it is fine
        (void)v;
        h[2] = 5;
        g.open();
    }, &err);
    cudaStreamSynchronize(a);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "a write into an H2D source: status %d, expected abort", st);
    EXPECT(err.find("host write of pinned memory") != std::string::npos &&
               err.find("before the copy from it on stream") != std::string::npos,
           "a write into an H2D source: message %s", err.c_str());
    // After cudaStreamSynchronize: the data.
    cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, a);
    h[512] = 9; // other bytes of the protected page
    EXPECT(h[512] == 9, "other bytes of a page with a copy pending");
    cudaStreamSynchronize(a);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != 100 + i;
    EXPECT(bad == 0, "pinned D2H after cudaStreamSynchronize: %d of %d wrong", bad, n);
    // After cudaEventSynchronize of an event recorded after the copy.
    fill<<<1, 32, 0, a>>>(d, 200, n);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, a);
    cudaEventRecord(e, a);
    cudaEventSynchronize(e);
    bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != 200 + i;
    EXPECT(bad == 0, "pinned D2H after cudaEventSynchronize: %d of %d wrong", bad, n);
    cudaEventDestroy(e);
    cudaFreeHost(h);
    cudaFree(d);
    cudaStreamDestroy(a);
}

// exit() while streams still have work queued and a kernel runs: the
// process ends normally (the workers use nothing that static destructors free).
static void check_exit_with_work_queued() {
    std::string err;
    int st = in_child([] {
        cudaStream_t a;
        cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
        int *d;
        cudaMalloc(&d, 1 << 20);
        for (int i = 0; i < 50; i++) fill<<<256, 1024, 0, a>>>(d, i, 1 << 18);
        cudaMemsetAsync(d, 0, 1 << 20, a);
        exit(0);
    }, &err);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit() with work queued: status %d, stderr %s", st, err.c_str());
}

int main() {
    check_events();
    check_wait_event();
    check_legacy();
    check_priority();
    check_pinned();
    check_exit_with_work_queued();
    printf("check_streams: %s\n", failures ? "FAIL" : "ok");
    return failures != 0;
}
