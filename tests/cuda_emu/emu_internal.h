// emu_internal.h: what the emulation's own files (cuda_emu.cpp,
// runtime_emu.cpp, pinned_emu.cpp, cublaslt_emu.cpp, nccl_emu.cpp) share;
// not CUDA API, not for trident's code.
#ifndef TRIDENT_CUDA_EMU_INTERNAL_H
#define TRIDENT_CUDA_EMU_INTERNAL_H

#include <cstddef>
#include <cstdint>
#include <condition_variable>
#include <mutex>

#include "cuda_runtime_api.h"

// Held by emu_run while a kernel runs (the fiber scheduler and the kernels'
// __shared__ variables are global): one launch at a time in the process.
// Waiters of a higher stream priority (-5 highest .. 0) take it first, so a
// high-priority stream's kernel overtakes queued low-priority ones as on a
// GPU's scheduler (at launch granularity).
struct emu_priority_lock {
    std::mutex m;
    std::condition_variable cv;
    bool held = false;
    int waiting[6] = {0, 0, 0, 0, 0, 0}; // by -priority
    void lock(int priority);
    void unlock();
};
extern emu_priority_lock emu_launch_lock;
// The priority of the stream whose worker runs on this thread (0 elsewhere).
extern thread_local int emu_thread_priority;

// Counts a copy or memset of bytes (TRIDENT_EMU_STATS), at enqueue time.
void emu_count_copy(size_t bytes);
// The host-work counters of TRIDENT_EMU_STATS (cuda_runtime_api.h), one call
// each: a device-to-host copy, a stream or device synchronisation, a
// cudaMalloc, a cudaFree, a host-to-device copy from pageable memory.
void emu_count_d2h(void);
void emu_count_sync(void);
void emu_count_malloc(void);
void emu_count_free(void);
void emu_count_pageable_h2d(void);
// A stream has n operations queued and not completed (TRIDENT_EMU_STATS's
// max_queued: how far the host ran ahead of a stream).
void emu_note_queued(unsigned long long n);
// TRIDENT_EMU_COUNT_ONLY=1 (cuda_runtime_api.h).
bool emu_count_only_mode(void);

// ---- pinned host memory (pinned_emu.cpp) ------------------------------------------
// cudaMallocHost memory is a memfd mapped twice: the host view (returned to the
// caller) and a device view through which stream workers read and write it, so
// that the host view can be protected while a copy into (or from) it is not
// known to the host to be complete.

// The device view of p when p lies in a pinned allocation's host view, else
// nullptr (pageable memory, or device memory).
void *emu_pinned_device_view(const void *p);
// Registers a pending copy on pinned memory [p, p + bytes) (host view): into
// it (device_writes) or from it, by operation seq of stream (stream_id, name
// for messages). Protects the host view's pages: no access while the device
// writes it, read only while it reads it.
void emu_pinned_pending(const void *p, size_t bytes, bool device_writes, int stream_id, uint64_t seq);
// The host has synchronised with operation known[id] of each stream id
// (a vector clock, runtime_emu.cpp): drops the pending copies it covers and
// lifts their protection.
void emu_pinned_synchronised(const uint64_t *known, int n_streams);
// cudaMallocHost / cudaFreeHost.
cudaError_t emu_pinned_alloc(void **p, size_t bytes);
cudaError_t emu_pinned_free(void *p);

#endif
