// nvtx.h: named ranges on the NVTX timeline (forward, backward, optimizer,
// each collective, each microbatch), so that an Nsight Systems profile
// (`nsys profile -t cuda,nvtx,mpi ...`, docs/performance.md) names trident's
// phases. Only builds with TRIDENT_NVTX (`make CUDA=1`, and `make EMU=1`
// where the CUDA toolkit's headers are present) have them: there the calls
// go to src/base/nvtx.c, the one file that includes the toolkit's
// header-only nvtx3; elsewhere (the CPU build) the macros compile to nothing
// and their arguments are not evaluated, so nothing may depend on them.
//
// A range is pushed and popped on the calling thread (NVTX's per-thread
// stack); every NVTX_PUSH has its NVTX_POP on the same thread before the
// function returns. Without a tool attached (NVTX_INJECTION64_PATH, set by
// nsys) each call costs a formatted name and an empty function call.
#ifndef TRIDENT_NVTX_H
#define TRIDENT_NVTX_H

#ifdef TRIDENT_NVTX
// Pushes a range named by the printf-style fmt (truncated to 127 bytes).
void nvtx_range_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Pops the innermost range of this thread.
void nvtx_range_pop(void);
#define NVTX_PUSH(...) nvtx_range_push(__VA_ARGS__)
#define NVTX_POP() nvtx_range_pop()
#else
#define NVTX_PUSH(...) ((void)0)
#define NVTX_POP() ((void)0)
#endif

#endif
