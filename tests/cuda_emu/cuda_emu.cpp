// cuda_emu.cpp: the emulated CUDA runtime (cuda_runtime_api.h) and the
// kernel machinery of cuda_emu.h: CUDA threads as fibers on the calling OS
// thread, barriers, warp shuffles.
//
// Scheduling: a block's threads are fibers 0..n-1, each on its own stack
// (reserved once per fiber, reused by every block and launch; the pool grows
// to the largest block seen). The scheduler resumes them in index order; a
// fiber runs until it arrives at a barrier that others have not reached, or
// returns. A barrier completes when every live thread of its scope (block, or
// warp for shuffles) has arrived; a returned thread is no longer counted. A
// pass in which no fiber can run while some have not returned is a deadlock
// (a __syncthreads that not every thread reaches): abort with a message.
// Stacks switch by a dozen instructions (x86-64: callee-saved registers,
// MXCSR and the x87 control word; elsewhere ucontext's swapcontext).
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
// the state saved there (System V ABI: rbx, rbp, r12-r15, MXCSR control
// bits, x87 control word).
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
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
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
    uint64_t *sp = (uint64_t *)(top - 72); // entry starts with rsp = top - 8, as after a call
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    sp[0] = mxcsr | (uint64_t)fpucw << 32;
    for (int i = 1; i <= 6; i++) sp[i] = 0; // r15 r14 r13 r12 rbx rbp
    sp[7] = (uint64_t)(uintptr_t)entry;     // popped by ret
    sp[8] = 0;                              // entry's return address: it never returns
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

// Per CUDA thread; only the pages a kernel touches are backed by memory.
constexpr size_t STACK_BYTES = 256 << 10;

struct barrier {
    int arrived = 0, live = 0;
    unsigned gen = 0; // completed rounds
};

struct fiber {
    emu_ctx ctx;
    char *stack = nullptr; // STACK_BYTES, the lowest page a guard
    uint3 idx;
    const barrier *wait_on = nullptr; // runnable once wait_on->gen != wait_gen
    unsigned wait_gen = 0;
    bool done = false;
};

struct scheduler {
    std::vector<fiber> fibers; // grown to the largest block seen
    emu_ctx main;              // the launching thread's context
    int cur = 0;               // the fiber running now
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

void yield_to_scheduler() { ctx_switch(&S.fibers[S.cur].ctx, &S.main); }

void barrier_arrive(barrier &b) {
    if (++b.arrived == b.live) { // the last one: release the others, go on
        b.arrived = 0;
        b.gen++;
        return;
    }
    fiber &f = S.fibers[S.cur];
    f.wait_on = &b;
    f.wait_gen = b.gen;
    yield_to_scheduler();
}

// A returned thread no longer counts: a barrier now only waiting for it completes.
void barrier_leave(barrier &b) {
    b.live--;
    if (b.arrived > 0 && b.arrived == b.live) {
        b.arrived = 0;
        b.gen++;
    }
}

void fiber_entry(void) {
    (*S.body)();
    fiber &f = S.fibers[S.cur];
    f.done = true;
    barrier_leave(S.block);
    barrier_leave(S.warps[S.cur / 32]);
    ctx_switch(&f.ctx, &S.main);
    emu_die("a finished CUDA thread was resumed");
}

void grow(int n) {
    while ((int)S.fibers.size() < n) {
        fiber f;
        void *p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) emu_die("cannot map a fiber stack");
        mprotect(p, (size_t)sysconf(_SC_PAGESIZE), PROT_NONE); // overflow faults
        f.stack = (char *)p;
        S.fibers.push_back(f);
    }
}

// Runs every thread of the current block to its end.
void run_block(int n) {
    S.block = barrier();
    S.block.live = n;
    for (int w = 0; w < (n + 31) / 32; w++) {
        S.warps[w] = barrier();
        S.warps[w].live = std::min(32, n - 32 * w);
    }
    for (int t = 0; t < n; t++) {
        fiber &f = S.fibers[t];
        ctx_make(&f.ctx, f.stack, STACK_BYTES, fiber_entry);
        f.wait_on = nullptr;
        f.done = false;
    }
    int left = n;
    while (left > 0) {
        bool ran = false;
        for (int t = 0; t < n; t++) {
            fiber &f = S.fibers[t];
            if (f.done || (f.wait_on && f.wait_on->gen == f.wait_gen)) continue;
            f.wait_on = nullptr;
            S.cur = t;
            threadIdx = f.idx;
            ctx_switch(&S.main, &f.ctx);
            ran = true;
            if (f.done) left--;
        }
        if (!ran) emu_die("deadlock: a barrier (__syncthreads or a warp shuffle) that not every thread reaches");
    }
}

} // namespace

void emu_syncthreads(void) { barrier_arrive(S.block); }

int emu_lane(void) { return S.cur % 32; }

void emu_shfl_check(unsigned mask, int width) {
    if (mask != 0xffffffffu || width != 32) emu_die("shuffle with a partial mask or width != 32");
}

uint64_t emu_shfl(uint64_t v, int src) {
    int w = S.cur / 32;
    S.lanes[S.cur] = v;
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
    grow(n);
    S.warps.resize(std::max(S.warps.size(), (size_t)(n + 31) / 32));
    S.lanes.resize(std::max(S.lanes.size(), S.warps.size() * 32));
    S.body = &body;
    blockDim = block;
    gridDim = grid;
    for (int t = 0; t < n; t++)
        S.fibers[t].idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                run_block(n);
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
