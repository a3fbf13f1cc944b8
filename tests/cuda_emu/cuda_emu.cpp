// cuda_emu.cpp: the thread machinery of cuda_emu.h.
#include "cuda_emu.h"

#include <barrier>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

thread_local uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

struct emu_block {
    std::unique_ptr<std::barrier<>> all;
    std::vector<std::unique_ptr<std::barrier<>>> warp;
    std::vector<float> lanes; // one slot per thread: shuffle exchange
};
static emu_block *g_block;
static thread_local int tl_tid;
static std::mutex g_atomic;

void emu_syncthreads(void) { g_block->all->arrive_and_wait(); }

float emu_shfl_xor(float v, int m) {
    int w = tl_tid / 32, lane = tl_tid % 32;
    g_block->lanes[tl_tid] = v;
    g_block->warp[w]->arrive_and_wait();
    float r = g_block->lanes[w * 32 + (lane ^ m)];
    g_block->warp[w]->arrive_and_wait();
    return r;
}

float emu_shfl_idx(float v, int src) {
    int w = tl_tid / 32;
    g_block->lanes[tl_tid] = v;
    g_block->warp[w]->arrive_and_wait();
    float r = g_block->lanes[w * 32 + src];
    g_block->warp[w]->arrive_and_wait();
    return r;
}

float atomicAdd(float *p, float v) {
    std::lock_guard<std::mutex> lock(g_atomic);
    float old = *p;
    *p = old + v;
    return old;
}
int atomicAdd(int *p, int v) {
    std::lock_guard<std::mutex> lock(g_atomic);
    int old = *p;
    *p = old + v;
    return old;
}

void emu_run(dim3 grid, dim3 block, const std::function<void()> &body) {
    int n = (int)(block.x * block.y * block.z);
    if (n % 32) abort(); // trident's kernels launch whole warps
    emu_block b;
    b.all = std::make_unique<std::barrier<>>(n);
    for (int w = 0; w < n / 32; w++) b.warp.push_back(std::make_unique<std::barrier<>>(32));
    b.lanes.assign(n, 0);
    g_block = &b;
    blockDim = block;
    gridDim = grid;
    std::vector<std::thread> threads;
    for (int t = 0; t < n; t++)
        threads.emplace_back([&, t]() {
            tl_tid = t;
            threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        blockIdx = {x, y, z};
                        body();
                        b.all->arrive_and_wait(); // the block ends for every thread
                    }
        });
    for (auto &t : threads) t.join();
    g_block = nullptr;
}
