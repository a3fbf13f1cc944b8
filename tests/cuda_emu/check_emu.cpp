// check_emu.cpp: the kernel emulation itself (cuda_emu.h / cuda_emu.cpp),
// with kernels written as CUDA and built by the same preprocess + rewrite
// rule as kernels/cuda/*.cu (`make EMU=1` builds $(BUILD)/tests/check_emu;
// tests/e2e/cuda_emulated.sh runs it). Each check compares with values
// computed independently on the host: thread and block indices of 2-D
// blocks in a 3-D grid; a __syncthreads tree reduction in static shared
// memory; every warp shuffle (xor, down, up, indexed; float and int);
// dynamic shared memory (`extern __shared__`); threads that return before a
// barrier; atomicAdd from many blocks; a templated kernel and a launch with
// two configuration arguments; and that a barrier no thread can complete
// aborts with a message (in a child process). Exit 1 on a mismatch.
#include <cuda_runtime.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "check.h"

__global__ void indices(int *out) {
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[b * blockDim.x * blockDim.y * blockDim.z + t] =
        (int)(blockIdx.z << 24 | blockIdx.y << 20 | blockIdx.x << 16 | threadIdx.z << 12 | threadIdx.y << 8 | threadIdx.x);
}

// Sum of in[block * 256 + t] over t, a shared-memory tree (8 barriers).
__global__ void tree_sum(float *out, const float *in) {
    __shared__ float s[256];
    s[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) s[threadIdx.x] += s[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// out[t * 4 + k]: shuffle k of thread t's value v = 10 * t (xor 5, down 3, up 7, from lane 9).
__global__ void shuffles(float *out, int *iout) {
    int t = threadIdx.x;
    float v = 10.0f * t;
    out[t * 4 + 0] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[t * 4 + 1] = __shfl_down_sync(0xffffffffu, v, 3);
    out[t * 4 + 2] = __shfl_up_sync(0xffffffffu, v, 7);
    out[t * 4 + 3] = __shfl_sync(0xffffffffu, v, 9);
    iout[t] = __shfl_xor_sync(0xffffffffu, -t, 1);
}

// Reversal through dynamic shared memory: out[t] = in[n - 1 - t].
__global__ void reverse_dynamic(float *out, const float *in, int n) {
    extern __shared__ float dyn[];
    int t = threadIdx.x;
    dyn[t] = in[t];
    __syncthreads();
    out[t] = dyn[n - 1 - t];
}

// Threads >= live return at once; the others exchange through shared memory
// across two barriers (which must not wait for the returned ones).
__global__ void early_return(int *out, int live) {
    __shared__ int s[256];
    int t = threadIdx.x;
    if (t >= live) return;
    s[t] = t * t;
    __syncthreads();
    int v = s[live - 1 - t];
    __syncthreads();
    s[t] = v + 1;
    __syncthreads();
    out[t] = s[t];
}

__global__ void count(int *counter) { atomicAdd(counter, 1); }

template <int K> __global__ void scaled(int *out) { out[threadIdx.x] = K * (int)threadIdx.x; }

// Lanes of warp 0 wait at a shuffle while the rest of the block waits at
// __syncthreads: neither barrier can complete.
__global__ void deadlock(float *out) {
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    }
}

int main() {
    {
        dim3 grid(2, 3, 2), block(32, 4, 2);
        std::vector<int> out(12 * 256, -1);
        indices<<<grid, block, 0, nullptr>>>(out.data());
        cudaDeviceSynchronize();
        int bad = 0;
        for (unsigned bz = 0; bz < 2; bz++)
            for (unsigned by = 0; by < 3; by++)
                for (unsigned bx = 0; bx < 2; bx++)
                    for (unsigned tz = 0; tz < 2; tz++)
                        for (unsigned ty = 0; ty < 4; ty++)
                            for (unsigned tx = 0; tx < 32; tx++) {
                                unsigned b = bx + 2 * (by + 3 * bz), t = tx + 32 * (ty + 4 * tz);
                                bad += out[b * 256 + t] != (int)(bz << 24 | by << 20 | bx << 16 | tz << 12 | ty << 8 | tx);
                            }
        EXPECT(bad == 0, "indices: %d of %d wrong", bad, 12 * 256);
    }
    {
        const int blocks = 37;
        std::vector<float> in(blocks * 256), out(blocks);
        for (int i = 0; i < blocks * 256; i++) in[i] = (float)(i % 101);
        tree_sum<<<blocks, 256, 0, nullptr>>>(out.data(), in.data());
        cudaDeviceSynchronize();
        int bad = 0;
        for (int b = 0; b < blocks; b++) {
            double ref = 0;
            for (int t = 0; t < 256; t++) ref += in[b * 256 + t];
            bad += out[b] != (float)ref;
        }
        EXPECT(bad == 0, "tree_sum: %d of %d blocks wrong", bad, blocks);
    }
    {
        std::vector<float> out(128 * 4);
        std::vector<int> iout(128);
        shuffles<<<1, 128, 0, nullptr>>>(out.data(), iout.data());
        cudaDeviceSynchronize();
        int bad = 0;
        for (int t = 0; t < 128; t++) {
            int lane = t % 32, w = t - lane;
            float self = 10.0f * t;
            bad += out[t * 4 + 0] != 10.0f * (w + (lane ^ 5));
            bad += out[t * 4 + 1] != (lane + 3 < 32 ? 10.0f * (t + 3) : self);
            bad += out[t * 4 + 2] != (lane >= 7 ? 10.0f * (t - 7) : self);
            bad += out[t * 4 + 3] != 10.0f * (w + 9);
            bad += iout[t] != -(w + (lane ^ 1));
        }
        EXPECT(bad == 0, "shuffles: %d of %d wrong", bad, 128 * 5);
    }
    {
        const int n = 192;
        std::vector<float> in(n), out(n);
        for (int i = 0; i < n; i++) in[i] = (float)i * 0.5f;
        reverse_dynamic<<<1, n, n * sizeof(float), nullptr>>>(out.data(), in.data(), n);
        cudaDeviceSynchronize();
        int bad = 0;
        for (int i = 0; i < n; i++) bad += out[i] != in[n - 1 - i];
        EXPECT(bad == 0, "dynamic shared memory: %d of %d wrong", bad, n);
    }
    {
        const int live = 100;
        std::vector<int> out(256, -1);
        early_return<<<3, 256>>>(out.data(), live);
        cudaDeviceSynchronize();
        int bad = 0;
        for (int t = 0; t < 256; t++)
            bad += out[t] != (t < live ? (live - 1 - t) * (live - 1 - t) + 1 : -1);
        EXPECT(bad == 0, "early return before barriers: %d of 256 wrong", bad);
    }
    {
        int counter = 0;
        count<<<1000, 64, 0, nullptr>>>(&counter);
        cudaDeviceSynchronize();
        EXPECT(counter == 64000, "atomicAdd from 1000 blocks of 64: %d", counter);
        std::vector<int> out(64);
        scaled<3><<<1, 64>>>(out.data());
        cudaDeviceSynchronize();
        int bad = 0;
        for (int t = 0; t < 64; t++) bad += out[t] != 3 * t;
        EXPECT(bad == 0, "templated kernel: %d of 64 wrong", bad);
    }
    {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            freopen("/dev/null", "w", stderr);
            std::vector<float> out(64);
            deadlock<<<1, 64, 0, nullptr>>>(out.data());
            cudaDeviceSynchronize();
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "a deadlocked block: status %d, expected abort", st);
    }
    printf("check_emu: %s\n", failures ? "FAIL" : "ok");
    return failures != 0;
}
