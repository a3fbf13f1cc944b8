// pinned_emu.cpp: pinned host memory (cudaMallocHost, cudaHostAlloc) whose
// host reads and writes are checked against the copies in flight (see
// emu_internal.h and docs/cuda.md "The emulated build").
//
// An allocation is a memfd mapped twice: the host view, returned to the
// caller, and the device view, through which the streams' workers copy
// (runtime_emu.cpp translates every copy's pinned addresses). While an
// asynchronous copy into a pinned buffer is pending (queued, running, or done
// but not yet covered by a host synchronisation: cudaStreamSynchronize,
// cudaEventSynchronize or a successful cudaEventQuery of an event recorded
// after it, cudaDeviceSynchronize), the host view's pages it touches are
// PROT_NONE; while a copy from one is pending, they are read-only. A host
// access that faults inside such a copy's bytes is the bug a GPU would
// show as stale or torn data: the SIGSEGV handler names the buffer, its
// bytes, the stream and the access, and aborts. An access to other bytes of
// a protected page (another buffer sharing it) is let through: the page is
// opened for one instruction (x86-64's trap flag), then protected again.
// Faults outside pinned memory go to the handler that was there before.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <vector>

namespace {

struct block {
    char *host, *dev;
    size_t bytes; // mapped (whole pages)
    int fd;
};

struct pending_copy {
    uintptr_t lo, hi; // host view bytes [lo, hi)
    bool device_writes;
    int stream;
    uint64_t seq;
};

// Never destroyed (a worker may translate an address while the process exits).
std::mutex &pin_mu = *new std::mutex;
std::map<uintptr_t, block> &blocks = *new std::map<uintptr_t, block>; // by host view address
std::vector<pending_copy> &pendings = *new std::vector<pending_copy>;
size_t page;
struct sigaction old_segv, old_trap;
thread_local uintptr_t stepping_page; // opened for one instruction (see the top)

// The block whose host view holds a, or nullptr. Under pin_mu.
const block *block_of(uintptr_t a) {
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return nullptr;
    --it;
    return a < it->first + it->second.bytes ? &it->second : nullptr;
}

// Sets the protection of the pages of [lo, hi) from the pending copies. Under pin_mu.
void protect(uintptr_t lo, uintptr_t hi) {
    for (uintptr_t p = lo & ~(page - 1); p < hi; p += page) {
        int prot = PROT_READ | PROT_WRITE;
        for (const pending_copy &c : pendings)
            if (c.lo < p + page && p < c.hi) prot = c.device_writes ? PROT_NONE : (prot & PROT_READ);
        mprotect((void *)p, page, prot);
    }
}

void chain(const struct sigaction &old, int sig, siginfo_t *si, void *ctx) {
    if (old.sa_flags & SA_SIGINFO) {
        if (old.sa_sigaction) old.sa_sigaction(sig, si, ctx);
        return;
    }
    if (old.sa_handler == SIG_IGN) return;
    if (old.sa_handler != SIG_DFL) {
        old.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL); // the access runs again and the default action follows
}

void on_segv(int sig, siginfo_t *si, void *ctx) {
    uintptr_t a = (uintptr_t)si->si_addr;
    bool is_write = true; // unknown: treat as the stricter case
#if defined(__x86_64__)
    is_write = (((ucontext_t *)ctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#endif
    pin_mu.lock(); // the faulting thread never holds it: it runs user code
    if (!block_of(a)) {
        pin_mu.unlock();
        chain(old_segv, sig, si, ctx);
        return;
    }
    for (const pending_copy &c : pendings) {
        if (a < c.lo || a >= c.hi || (!c.device_writes && !is_write)) continue;
        char msg[512];
        int n = snprintf(msg, sizeof msg,
                         c.device_writes
                             ? "cuda_emu: host %s of pinned memory %p (%zu bytes) before the copy into it on "
                               "stream %d was synchronised (the access at %p; synchronise with "
                               "cudaStreamSynchronize, cudaEventSynchronize or cudaDeviceSynchronize first)\n"
                             : "cuda_emu: host %s of pinned memory %p (%zu bytes) before the copy from it on "
                               "stream %d was synchronised (the access at %p: the device may not have read "
                               "the buffer yet)\n",
                         is_write ? "write" : "read", (void *)c.lo, (size_t)(c.hi - c.lo), c.stream, (void *)a);
        if (write(2, msg, (size_t)n) < 0) {}
        signal(SIGABRT, SIG_DFL);
        abort();
    }
#if defined(__x86_64__)
    // Other bytes of a protected page: open it for one instruction.
    stepping_page = a & ~(page - 1);
    mprotect((void *)stepping_page, page, PROT_READ | PROT_WRITE);
    ((ucontext_t *)ctx)->uc_mcontext.gregs[REG_EFL] |= 0x100; // TF
    pin_mu.unlock();
#else
    pin_mu.unlock();
    fprintf(stderr, "cuda_emu: host access at %p to a page of pinned memory with a copy pending\n", (void *)a);
    abort();
#endif
}

void on_trap(int sig, siginfo_t *si, void *ctx) {
#if defined(__x86_64__)
    if (stepping_page) {
        uintptr_t p = stepping_page;
        stepping_page = 0;
        ((ucontext_t *)ctx)->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)0x100;
        pin_mu.lock();
        protect(p, p + page);
        pin_mu.unlock();
        return;
    }
#endif
    chain(old_trap, sig, si, ctx);
}

void install_handlers() {
    static bool done = [] {
        page = (size_t)sysconf(_SC_PAGESIZE);
        struct sigaction sa = {};
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sa.sa_sigaction = on_segv;
        sigaction(SIGSEGV, &sa, &old_segv);
        sa.sa_sigaction = on_trap;
        sigaction(SIGTRAP, &sa, &old_trap);
        return true;
    }();
    (void)done;
}

} // namespace

void *emu_pinned_device_view(const void *p) {
    std::lock_guard<std::mutex> lk(pin_mu);
    const block *b = block_of((uintptr_t)p);
    return b ? b->dev + ((uintptr_t)p - (uintptr_t)b->host) : nullptr;
}

void emu_pinned_pending(const void *p, size_t bytes, bool device_writes, int stream_id, uint64_t seq) {
    std::lock_guard<std::mutex> lk(pin_mu);
    pendings.push_back({(uintptr_t)p, (uintptr_t)p + bytes, device_writes, stream_id, seq});
    protect((uintptr_t)p, (uintptr_t)p + bytes);
}

void emu_pinned_synchronised(const uint64_t *known, int n_streams) {
    std::lock_guard<std::mutex> lk(pin_mu);
    std::vector<pending_copy> done;
    for (size_t i = 0; i < pendings.size();) {
        const pending_copy &c = pendings[i];
        if (c.stream < n_streams && known[c.stream] >= c.seq) {
            done.push_back(c);
            pendings[i] = pendings.back();
            pendings.pop_back();
        } else {
            i++;
        }
    }
    for (const pending_copy &c : done) protect(c.lo, c.hi);
}

cudaError_t emu_pinned_alloc(void **p, size_t n) {
    install_handlers();
    size_t bytes = (std::max(n, (size_t)1) + page - 1) / page * page;
    int fd = memfd_create("cuda_emu_pinned", MFD_CLOEXEC);
    if (fd < 0) return cudaErrorMemoryAllocation;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    void *host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void *dev = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (host == MAP_FAILED || dev == MAP_FAILED) {
        if (host != MAP_FAILED) munmap(host, bytes);
        if (dev != MAP_FAILED) munmap(dev, bytes);
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    memset(host, 0xff, n); // as cudaMalloc: unwritten bytes show as NaN
    std::lock_guard<std::mutex> lk(pin_mu);
    blocks[(uintptr_t)host] = {(char *)host, (char *)dev, bytes, fd};
    *p = host;
    return cudaSuccess;
}

cudaError_t emu_pinned_free(void *p) {
    std::lock_guard<std::mutex> lk(pin_mu);
    auto it = blocks.find((uintptr_t)p);
    if (it == blocks.end()) return cudaErrorInvalidValue;
    block b = it->second;
    blocks.erase(it);
    uintptr_t lo = (uintptr_t)b.host, hi = lo + b.bytes;
    for (size_t i = 0; i < pendings.size();) {
        if (pendings[i].lo < hi && lo < pendings[i].hi) {
            pendings[i] = pendings.back();
            pendings.pop_back();
        } else {
            i++;
        }
    }
    munmap(b.host, b.bytes);
    munmap(b.dev, b.bytes);
    close(b.fd);
    return cudaSuccess;
}
