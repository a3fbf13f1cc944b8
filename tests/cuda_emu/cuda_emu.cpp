// cuda_emu.cpp: the emulated CUDA runtime (cuda_runtime_api.h) and the
// kernel machinery of cuda_emu.h: CUDA threads as fibers on the calling OS
// thread, barriers, warp shuffles.
//
// Scheduling: a block's CUDA threads (linear index t = 0..n-1) start in
// order on fibers (stacks of their own, switched in user space, no OS thread
// and no lock). A fiber runs one thread after another on its stack, with no
// switch, until a thread arrives at a barrier (__syncthreads, or a warp
// shuffle: a barrier of the warp) that others have not reached: the fiber
// stays with that thread and parks, and a fresh fiber (from an idle pool,
// reused by every block and launch) starts the next thread. So a kernel
// without barriers runs a whole block on one fiber, and one with barriers
// holds as many fibers as threads wait. Once every thread has started, the
// parked fibers whose barrier has completed resume, in arrival order. A
// barrier completes when every thread of its scope that has not returned
// has arrived (a returned thread no longer counts). A round in which nothing
// can run while threads remain is a deadlock (a __syncthreads that not every
// thread reaches): abort with a message. Stack switch: x86-64, the six
// callee-saved registers (asm below); elsewhere ucontext's swapcontext.
#include "cuda_emu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// ---- stack switching ------------------------------------------------------------

#if defined(__x86_64__)
// emu_ctx_switch(&save_sp, load_sp): pushes the callee-saved state on the
// current stack, stores the stack pointer in *save_sp, loads load_sp and pops
// the state saved there (System V ABI: rbx, rbp, r12-r15). The MXCSR and x87
// control words are not switched: nothing in the emulation or the kernels
// changes rounding modes.
extern "C" void emu_ctx_switch(void **save_sp, void *load_sp);
asm(R"(
    .text
    .globl emu_ctx_switch
    .type emu_ctx_switch, @function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch
)");
struct emu_ctx {
    void *sp;
};
static void ctx_switch(emu_ctx *save, emu_ctx *load) { emu_ctx_switch(&save->sp, load->sp); }
// A context that starts entry() on the stack [base, base + bytes).
static void ctx_make(emu_ctx *c, char *base, size_t bytes, void (*entry)(void)) {
    uintptr_t top = ((uintptr_t)base + bytes) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 64); // entry starts with rsp = top - 8, as after a call
    for (int i = 0; i < 6; i++) sp[i] = 0;  // r15 r14 r13 r12 rbx rbp
    sp[6] = (uint64_t)(uintptr_t)entry;     // popped by ret
    sp[7] = 0;                              // entry's return address: it never returns
    c->sp = sp;
}
#else
#include <ucontext.h>
struct emu_ctx {
    ucontext_t uc;
};
static void ctx_switch(emu_ctx *save, emu_ctx *load) { swapcontext(&save->uc, &load->uc); }
static void ctx_make(emu_ctx *c, char *base, size_t bytes, void (*entry)(void)) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = base;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
#endif

// ---- fibers and barriers --------------------------------------------------------

namespace {

// Per fiber; only the pages a kernel touches are backed by memory.
constexpr size_t STACK_BYTES = 256 << 10;

struct barrier {
    int arrived = 0, live = 0; // live: threads of its scope not yet returned
    unsigned gen = 0;          // completed rounds
};

struct fiber {
    emu_ctx ctx;
    char *stack = nullptr;            // STACK_BYTES, the lowest page a guard
    int thread = -1;                  // the CUDA thread it runs now
    const barrier *wait_on = nullptr; // runnable once wait_on->gen != wait_gen
    unsigned wait_gen = 0;
};

struct scheduler {
    std::vector<fiber *> idle;    // LIFO: the stack last used is warm in cache
    std::vector<fiber *> waiting; // at a barrier, in the order they arrived
    emu_ctx main;                 // the launching thread's context
    fiber *cur = nullptr;         // the fiber running now
    int thread = 0;               // its CUDA thread (linear index in the block)
    int n = 0, next = 0, left = 0; // threads per block, next to start, not yet returned
    const std::function<void()> *body = nullptr;
    barrier block;
    std::vector<barrier> warps;
    std::vector<uint64_t> lanes; // shuffle exchange, one slot per thread
};
scheduler S;
std::mutex launch_lock; // one launch at a time (S and the kernels' __shared__ are global)

[[noreturn]] void emu_die(const char *what) {
    fprintf(stderr, "cuda_emu: %s (block %u,%u,%u of a %ux%ux%u grid, %ux%ux%u threads)\n", what,
            blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
            blockDim.y, blockDim.z);
    abort();
}

void set_thread(int t) {
    S.thread = t;
    S.cur->thread = t;
    threadIdx = {t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
}

void barrier_arrive(barrier &b) {
    if (++b.arrived == b.live) { // the last one: release the others, go on
        b.arrived = 0;
        b.gen++;
        return;
    }
    fiber *f = S.cur;
    f->wait_on = &b;
    f->wait_gen = b.gen;
    S.waiting.push_back(f);
    ctx_switch(&f->ctx, &S.main);
}

// A returned thread no longer counts: a barrier now only waiting for it completes.
void barrier_leave(barrier &b) {
    b.live--;
    if (b.arrived > 0 && b.arrived == b.live) {
        b.arrived = 0;
        b.gen++;
    }
}

// A fiber runs CUDA threads not yet started, one after another on its stack,
// until one of them waits at a barrier (the fiber stays with that thread) or
// none is left (the fiber goes back to the idle pool).
void fiber_entry(void) {
    for (;;) {
        while (S.next < S.n) {
            set_thread(S.next++);
            (*S.body)();
            S.left--;
            barrier_leave(S.block);
            barrier_leave(S.warps[S.thread / 32]);
        }
        fiber *f = S.cur;
        f->thread = -1;
        ctx_switch(&f->ctx, &S.main);
        emu_die("an idle fiber was resumed");
    }
}

fiber *take_fiber() {
    if (!S.idle.empty()) {
        fiber *f = S.idle.back();
        S.idle.pop_back();
        return f;
    }
    fiber *f = new fiber;
    void *p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) emu_die("cannot map a fiber stack");
    mprotect(p, (size_t)sysconf(_SC_PAGESIZE), PROT_NONE); // overflow faults
    f->stack = (char *)p;
    return f;
}

// Switches to f; back here when f waits at a barrier or runs out of threads.
void resume(fiber *f) {
    S.cur = f;
    if (f->thread >= 0) set_thread(f->thread);
    ctx_switch(&S.main, &f->ctx);
    if (f->thread < 0) S.idle.push_back(f);
}

// Runs every thread of the current block to its end.
void run_block() {
    S.block = barrier();
    S.block.live = S.n;
    for (int w = 0; w < (S.n + 31) / 32; w++) {
        S.warps[w] = barrier();
        S.warps[w].live = std::min(32, S.n - 32 * w);
    }
    S.next = 0;
    S.left = S.n;
    std::vector<fiber *> ready;
    while (S.left > 0) {
        if (S.next < S.n) { // threads not started yet: a fresh fiber runs them
            fiber *f = take_fiber();
            f->thread = -1;
            ctx_make(&f->ctx, f->stack, STACK_BYTES, fiber_entry);
            resume(f);
            continue;
        }
        ready.clear();
        ready.swap(S.waiting);
        bool ran = false;
        for (fiber *f : ready) {
            if (f->wait_on->gen == f->wait_gen) {
                S.waiting.push_back(f);
                continue;
            }
            f->wait_on = nullptr;
            resume(f);
            ran = true;
        }
        if (!ran) emu_die("deadlock: a barrier (__syncthreads or a warp shuffle) that not every thread reaches");
    }
}

} // namespace

void emu_syncthreads(void) { barrier_arrive(S.block); }

int emu_lane(void) { return S.thread % 32; }

void emu_shfl_check(unsigned mask, int width) {
    if (mask != 0xffffffffu || width != 32) emu_die("shuffle with a partial mask or width != 32");
}

uint64_t emu_shfl(uint64_t v, int src) {
    int t = S.thread, w = t / 32;
    S.lanes[t] = v;
    barrier_arrive(S.warps[w]);
    uint64_t r = src >= 0 && src < 32 ? S.lanes[w * 32 + src] : v;
    barrier_arrive(S.warps[w]); // nobody overwrites a slot before every lane has read
    return r;
}

// One thread at a time: no lock needed beyond launch_lock.
float atomicAdd(float *p, float v) {
    float old = *p;
    *p = old + v;
    return old;
}
int atomicAdd(int *p, int v) {
    int old = *p;
    *p = old + v;
    return old;
}

void emu_run(dim3 grid, dim3 block, const std::function<void()> &body) {
    int n = (int)(block.x * block.y * block.z);
    if (n <= 0 || n > 1024) {
        fprintf(stderr, "cuda_emu: a launch of %d threads per block (1..1024)\n", n);
        abort();
    }
    std::lock_guard<std::mutex> lock(launch_lock);
    S.warps.resize(std::max(S.warps.size(), (size_t)(n + 31) / 32));
    S.lanes.resize(std::max(S.lanes.size(), S.warps.size() * 32));
    S.body = &body;
    S.n = n;
    blockDim = block;
    gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                run_block();
            }
    S.body = nullptr;
}

// ---- the runtime API (cuda_runtime_api.h) ---------------------------------------

namespace {
int current_device = 0;
cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
} // namespace

struct emu_stream {
    unsigned flags;
};
struct emu_event {
    double ms; // host time of the last record
};

extern "C" {

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (emulated)";
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

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (attr != cudaDevAttrMultiProcessorCount) return fail(cudaErrorInvalidValue);
    *value = 4;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    size_t total = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    size_t avail = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    *free_bytes = avail;
    *total_bytes = total;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new emu_stream{flags};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    *e = new emu_event{now_ms()};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    if (!e) return fail(cudaErrorInvalidValue);
    e->ms = now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p) return fail(cudaErrorMemoryAllocation);
    memset(*p, 0xff, n);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { return cudaMalloc(p, n); }

cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind) {
    if (n) memmove(d, s, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t) {
    return cudaMemcpy(d, s, n, k);
}

cudaError_t cudaMemset(void *d, int v, size_t n) {
    if (n) memset(d, v, n);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { return cudaMemset(d, v, n); }

} // extern "C"
