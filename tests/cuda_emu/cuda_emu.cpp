// cuda_emu.cpp: the kernel machinery of cuda_emu.h (CUDA threads as fibers
// on the stream worker that runs the launch, barriers, warp shuffles) and the
// counters of TRIDENT_EMU_STATS; the runtime API (streams, events, memory,
// copies) is runtime_emu.cpp, pinned memory pinned_emu.cpp.
//
// Scheduling: a block's CUDA threads (linear index t = 0..n-1) start in
// order on fibers (stacks of their own, switched in user space: no OS
// thread, no lock, deterministic). A fiber runs one thread after another on
// its stack, with no switch, until a thread arrives at a barrier
// (__syncthreads, or a warp shuffle: a barrier of the warp) that others have
// not reached: the fiber parks with that thread and switches straight to the
// next fiber to run: one released from a completed barrier (in arrival
// order) if any, else a fresh one (from an idle pool, reused by every block
// and launch) for the next thread not started. So a kernel without barriers
// runs a whole block on one fiber, warp-level shuffles keep about a warp of
// fibers alive, and __syncthreads as many as the block has threads. A
// barrier completes when every thread of its scope that has not returned has
// arrived (a returned thread no longer counts). When nothing can run while
// threads remain, the block is deadlocked (a __syncthreads that not every
// thread reaches): abort with a message. Stack switch: x86-64, the six
// callee-saved registers (asm below); elsewhere ucontext's swapcontext.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
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

// One launch at a time (S and the kernels' __shared__ are global); emu_internal.h.
emu_priority_lock emu_launch_lock;
thread_local int emu_thread_priority;

void emu_priority_lock::lock(int priority) {
    int p = std::min(5, std::max(0, -priority));
    std::unique_lock<std::mutex> lk(m);
    waiting[p]++;
    cv.wait(lk, [this, p] {
        if (held) return false;
        for (int q = 5; q > p; q--)
            if (waiting[q]) return false;
        return true;
    });
    waiting[p]--;
    held = true;
}

void emu_priority_lock::unlock() {
    {
        std::lock_guard<std::mutex> lk(m);
        held = false;
    }
    cv.notify_all();
}

namespace {

// Per fiber; only the pages a kernel touches are backed by memory.
constexpr size_t STACK_BYTES = 256 << 10;

struct fiber;

struct barrier {
    int arrived = 0, live = 0;     // live: threads of its scope not yet returned
    std::vector<fiber *> waiters; // parked here, in arrival order
};

struct fiber {
    emu_ctx ctx;
    char *stack = nullptr; // STACK_BYTES, the lowest page a guard
    size_t used = 0;       // the top bytes left unused (see take_fiber)
    int thread = -1;       // the CUDA thread it runs now, -1 when idle
};

struct scheduler {
    std::vector<fiber *> idle;     // LIFO: the stack last used is warm in cache
    std::vector<fiber *> runq;     // released from a barrier, to resume in order
    size_t runq_head = 0;
    emu_ctx main;                  // the launching thread's context
    fiber *cur = nullptr;          // the fiber running now
    int thread = 0;                // its CUDA thread (linear index in the block)
    int n = 0, next = 0, left = 0; // threads per block, next to start, not yet returned
    const std::function<void()> *body = nullptr;
    barrier block;
    std::vector<barrier> warps;
    std::vector<uint64_t> lanes[2]; // shuffle exchange, one slot per thread, double-buffered
    std::vector<uint8_t> parity;    // per thread: the buffer of its next shuffle
    std::vector<uint3> idx;      // threadIdx of each thread of the launch
};
// Never destroyed: a stream's worker may still run a kernel while the process
// exits (static destructors would free what it uses).
scheduler &S = *new scheduler;
unsigned long long n_switches; // fiber switches (TRIDENT_EMU_STATS)

[[noreturn]] void emu_die(const char *what) {
    fprintf(stderr, "cuda_emu: %s (block %u,%u,%u of a %ux%ux%u grid, %ux%ux%u threads)\n", what,
            blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
            blockDim.y, blockDim.z);
    abort();
}

void set_thread(int t) {
    S.thread = t;
    S.cur->thread = t;
    threadIdx = S.idx[t];
}

void fiber_entry(void);

fiber *take_fiber() {
    fiber *f;
    if (!S.idle.empty()) {
        f = S.idle.back();
        S.idle.pop_back();
    } else {
        f = new fiber;
        void *p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) emu_die("cannot map a fiber stack");
        mprotect(p, (size_t)sysconf(_SC_PAGESIZE), PROT_NONE); // overflow faults
        f->stack = (char *)p;
        // Stacks are STACK_BYTES apart: their tops would all fall in the same
        // cache sets, and a barrier touches every one of them in turn. Each
        // fiber's stack starts 17 cache lines (mod 32 KiB) below the last one's.
        static unsigned made;
        f->used = (size_t)(made++ * 17 % 512) * 64;
    }
    f->thread = -1;
    ctx_make(&f->ctx, f->stack, STACK_BYTES - f->used, fiber_entry);
    return f;
}

// Switches from the context from to fiber to.
void enter(fiber *to, emu_ctx *from) {
    n_switches++;
    S.cur = to;
    if (to->thread >= 0) set_thread(to->thread);
    ctx_switch(from, &to->ctx);
}

// The fiber running now parks (at a barrier) or goes idle: the next one to
// run is a released one, else a fresh one for threads not started yet; with
// neither, back to run_block (the block is done, or deadlocked).
void switch_away(fiber *self) {
    fiber *to = nullptr;
    if (S.runq_head < S.runq.size()) {
        to = S.runq[S.runq_head++];
        if (S.runq_head == S.runq.size()) S.runq.clear(), S.runq_head = 0;
    } else if (S.next < S.n) {
        to = take_fiber();
    }
    if (to) enter(to, &self->ctx);
    else ctx_switch(&self->ctx, &S.main);
}

void release(barrier &b) {
    b.arrived = 0;
    if (S.runq_head == S.runq.size()) { // the run queue is empty (usual): take the list whole
        S.runq.clear();
        S.runq_head = 0;
        S.runq.swap(b.waiters);
    } else {
        S.runq.insert(S.runq.end(), b.waiters.begin(), b.waiters.end());
        b.waiters.clear();
    }
}

void barrier_arrive(barrier &b) {
    if (++b.arrived == b.live) { // the last one: release the others, go on
        release(b);
        return;
    }
    b.waiters.push_back(S.cur);
    switch_away(S.cur);
}

// A returned thread no longer counts: a barrier now only waiting for it completes.
void barrier_leave(barrier &b) {
    b.live--;
    if (b.arrived > 0 && b.arrived == b.live) release(b);
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
        S.idle.push_back(f); // not reused before this fiber has switched away
        switch_away(f);
        emu_die("an idle fiber was resumed");
    }
}

// Runs every thread of the current block to its end.
void run_block() {
    S.block.arrived = 0;
    S.block.live = S.n;
    S.block.waiters.clear();
    for (int w = 0; w < (S.n + 31) / 32; w++) {
        S.warps[w].arrived = 0;
        S.warps[w].live = std::min(32, S.n - 32 * w);
        S.warps[w].waiters.clear();
    }
    S.runq.clear();
    S.runq_head = 0;
    S.next = 0;
    S.left = S.n;
    std::fill(S.parity.begin(), S.parity.begin() + S.n, 0);
    enter(take_fiber(), &S.main);
    if (S.left > 0) emu_die("deadlock: a barrier (__syncthreads or a warp shuffle) that not every thread reaches");
}

} // namespace

void emu_syncthreads(void) { barrier_arrive(S.block); }

int emu_lane(void) { return S.thread % 32; }

void emu_shfl_check(unsigned mask, int width) {
    if (mask != 0xffffffffu || width != 32) emu_die("shuffle with a partial mask or width != 32");
}

// One barrier per shuffle: consecutive shuffles of a warp use the two
// buffers in turn, and a lane can only write buffer b again (two shuffles
// later) after the barrier of the shuffle in between, which every lane
// reaches after reading buffer b.
uint64_t emu_shfl(uint64_t v, int src) {
    int t = S.thread, w = t / 32;
    std::vector<uint64_t> &lanes = S.lanes[S.parity[t]];
    S.parity[t] ^= 1;
    lanes[t] = v;
    barrier_arrive(S.warps[w]);
    return src >= 0 && src < 32 ? lanes[w * 32 + src] : v;
}

// One thread at a time: no lock needed beyond emu_launch_lock.
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
unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    unsigned long long old = *p;
    *p = old + v;
    return old;
}
int atomicMax(int *p, int v) {
    int old = *p;
    *p = std::max(old, v);
    return old;
}

void emu_syncwarp(void) { barrier_arrive(S.warps[S.thread / 32]); }

namespace {
std::vector<float4> &dynamic_shared = *new std::vector<float4>; // float4: 16-byte aligned; never destroyed (as S)
}
void *emu_dynamic_shared(void) { return dynamic_shared.data(); }

// The counters of TRIDENT_EMU_STATS and TRIDENT_EMU_COUNT_ONLY
// (cuda_runtime_api.h): written under stats_lock, by the host thread at
// enqueue time (n_switches by the worker running the kernel).
struct emu_stats {
    unsigned long long launches, blocks, threads, gemms, gemm_flops, traffic_bytes, copies, copy_bytes,
        collectives, max_queued, d2h_copies, syncs, mallocs, frees, pageable_h2d, lt_setups, lt_unaligned;
};
static emu_stats stats;
static std::mutex stats_lock;
static void print_stats(void) {
    const char *path = getenv("TRIDENT_EMU_STATS");
    if (!path || !*path) return;
    if (!strcmp(path, "1")) {
        fprintf(stderr,
                "cuda_emu: %llu launches, %llu blocks, %llu threads, %llu fiber switches, %llu gemms, "
                "%llu traffic bytes, %llu copies, %llu collectives, at most %llu operations queued on a stream\n",
                stats.launches, stats.blocks, stats.threads, n_switches, stats.gemms, stats.traffic_bytes,
                stats.copies, stats.collectives, stats.max_queued);
        return;
    }
    std::string file;
    for (const char *c = path; *c; c++) {
        if (c[0] == '%' && c[1] == 'p') { file += std::to_string((long)getpid()); c++; }
        else file += *c;
    }
    FILE *f = fopen(file.c_str(), "w");
    if (!f) { fprintf(stderr, "cuda_emu: TRIDENT_EMU_STATS: cannot write %s\n", file.c_str()); return; }
    fprintf(f,
            "{\"launches\": %llu, \"blocks\": %llu, \"threads\": %llu, \"gemms\": %llu, "
            "\"gemm_flops\": %llu, \"traffic_bytes\": %llu, \"copies\": %llu, \"copy_bytes\": %llu, "
            "\"collectives\": %llu, \"max_queued\": %llu, \"d2h_copies\": %llu, \"syncs\": %llu, "
            "\"mallocs\": %llu, \"frees\": %llu, \"pageable_h2d\": %llu, \"lt_setups\": %llu, "
            "\"lt_unaligned\": %llu}\n",
            stats.launches, stats.blocks, stats.threads, stats.gemms, stats.gemm_flops, stats.traffic_bytes,
            stats.copies, stats.copy_bytes, stats.collectives, stats.max_queued, stats.d2h_copies, stats.syncs,
            stats.mallocs, stats.frees, stats.pageable_h2d, stats.lt_setups, stats.lt_unaligned);
    fclose(f);
}
// Reads TRIDENT_EMU_COUNT_ONLY and registers print_stats, once.
static bool count_only_mode(void) {
    static bool on = [] {
        const char *s = getenv("TRIDENT_EMU_STATS");
        if (s && *s) atexit(print_stats);
        const char *c = getenv("TRIDENT_EMU_COUNT_ONLY");
        return c && *c && strcmp(c, "0") != 0;
    }();
    return on;
}

extern "C" int emu_count_only(void) { return count_only_mode(); }
bool emu_count_only_mode(void) { return count_only_mode(); }
extern "C" void emu_traffic(unsigned long long bytes) {
    count_only_mode();
    std::lock_guard<std::mutex> lock(stats_lock);
    stats.traffic_bytes += bytes;
}
extern "C" void emu_count_gemm(unsigned long long m, unsigned long long n, unsigned long long k) {
    count_only_mode();
    std::lock_guard<std::mutex> lock(stats_lock);
    stats.launches++;
    stats.gemms++;
    stats.gemm_flops += 2 * m * n * k;
}
extern "C" void emu_count_collective(void) {
    count_only_mode();
    std::lock_guard<std::mutex> lock(stats_lock);
    stats.collectives++;
}
void emu_note_queued(unsigned long long n) {
    std::lock_guard<std::mutex> lock(stats_lock);
    stats.max_queued = std::max(stats.max_queued, n);
}
void emu_count_copy(size_t n) {
    count_only_mode();
    std::lock_guard<std::mutex> lock(stats_lock);
    stats.copies++;
    stats.copy_bytes += n;
}
// The host-work counters (cuda_runtime_api.h), at the call.
static void count_event(unsigned long long emu_stats::*field) {
    count_only_mode();
    std::lock_guard<std::mutex> lock(stats_lock);
    stats.*field += 1;
}
void emu_count_d2h(void) { count_event(&emu_stats::d2h_copies); }
void emu_count_sync(void) { count_event(&emu_stats::syncs); }
void emu_count_malloc(void) { count_event(&emu_stats::mallocs); }
void emu_count_free(void) { count_event(&emu_stats::frees); }
void emu_count_pageable_h2d(void) { count_event(&emu_stats::pageable_h2d); }
extern "C" void emu_count_lt_setup(void) { count_event(&emu_stats::lt_setups); }
extern "C" void emu_count_lt_unaligned(void) { count_event(&emu_stats::lt_unaligned); }
extern "C" unsigned long long emu_stat(const char *name) {
    static const struct {
        const char *name;
        unsigned long long emu_stats::*field;
    } fields[] = {{"launches", &emu_stats::launches},         {"copies", &emu_stats::copies},
                  {"d2h_copies", &emu_stats::d2h_copies},     {"syncs", &emu_stats::syncs},
                  {"mallocs", &emu_stats::mallocs},           {"frees", &emu_stats::frees},
                  {"pageable_h2d", &emu_stats::pageable_h2d}, {"lt_setups", &emu_stats::lt_setups},
                  {"lt_unaligned", &emu_stats::lt_unaligned}, {"gemms", &emu_stats::gemms}};
    std::lock_guard<std::mutex> lock(stats_lock);
    for (const auto &f : fields)
        if (!strcmp(f.name, name)) return stats.*f.field;
    fprintf(stderr, "cuda_emu: emu_stat(\"%s\"): no such counter\n", name);
    abort();
}

void emu_enqueue_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, std::function<void()> body) {
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "cuda_emu: a launch of grid (%u, %u, %u): CUDA allows x <= 2^31-1, y and z <= 65535\n",
                grid.x, grid.y, grid.z);
        abort();
    }
    int n = (int)(block.x * block.y * block.z);
    if (n <= 0 || n > 1024) {
        fprintf(stderr, "cuda_emu: a launch of %d threads per block (1..1024)\n", n);
        abort();
    }
    bool count_only = count_only_mode();
    unsigned long long nb = (unsigned long long)grid.x * grid.y * grid.z;
    {
        std::lock_guard<std::mutex> slock(stats_lock);
        stats.launches++;
        stats.blocks += nb;
        stats.threads += nb * (unsigned long long)n;
    }
    if (count_only) return;
    emu_enqueue(s, [grid, block, shmem, body = std::move(body)]() { emu_run(grid, block, shmem, body); });
}

void emu_run(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body) {
    int n = (int)(block.x * block.y * block.z);
    emu_launch_lock.lock(emu_thread_priority);
    struct unlock_at_end {
        ~unlock_at_end() { emu_launch_lock.unlock(); }
    } unlock;
    S.warps.resize(std::max(S.warps.size(), (size_t)(n + 31) / 32));
    for (auto &l : S.lanes) l.resize(std::max(l.size(), S.warps.size() * 32));
    S.parity.resize(std::max(S.parity.size(), S.warps.size() * 32));
    dynamic_shared.assign((shmem + 15) / 16, float4{NAN, NAN, NAN, NAN}); // NaN: unwritten shows
    S.body = &body;
    S.n = n;
    S.idx.resize(n);
    for (int t = 0; t < n; t++)
        S.idx[t] = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
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
