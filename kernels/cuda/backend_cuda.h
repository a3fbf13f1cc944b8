// backend_cuda.h: the CUDA backend (kernels/cuda/*.cu), built only with
// `make CUDA=1`. C-callable; model and training code reach it through
// backend_init() (kernels/backend.h), never directly.
#ifndef TRIDENT_BACKEND_CUDA_H
#define TRIDENT_BACKEND_CUDA_H

#include "base/common.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// A backend on CUDA device `device` (the node-local rank picks it): a compute
// stream, a cuBLASLt handle, workspace and plan cache, and a pinned staging
// ring for host-to-device copies (4 MiB); the kernels' scratch is sized by
// backend_reserve (kernels/ops.h); each NCCL group makes its own
// communication stream: src/parallel/comm_nccl.h. Storage
// dtypes FP32, BF16 and FP16 (FP32 compute and accumulation); FP64 is
// rejected.
// Returns NULL and fills err (STATUS_RUNTIME) when the device cannot be used.
struct backend *backend_cuda_init(int device, struct error *err);

// Number of CUDA devices visible to this process; 0 when none or the driver
// is missing (never fails).
int backend_cuda_device_count(void);
// The PCI bus id of CUDA device `device` ("0000:01:00.0", cudaDeviceGetPCIBusId:
// what NCCL tells devices apart by) into out (cap >= 16 bytes; no context is
// created). Returns 0, or -1 when the runtime cannot say (out "").
int backend_cuda_device_bus_id(int device, char *out, size_t cap);

// The compute stream of a CUDA backend (cudaStream_t), for the NCCL comm
// table (src/parallel/comm_nccl.c), and the device it runs on.
void *backend_cuda_stream(struct backend *be);
int backend_cuda_device(struct backend *be);

// backend_check_fp8 (kernels/backend.h) for a CUDA backend: its device's
// compute capability (cudaDevAttrComputeCapabilityMajor/Minor) against 8.9.
enum status backend_cuda_check_fp8(struct backend *be, struct error *err);

// backend_set_attention and backend_attention_uses_cudnn (kernels/backend.h)
// for a CUDA backend; cuDNN's side is kernels/cuda/cuda_attention_cudnn.cu.
enum status backend_cuda_set_attention(struct backend *be, enum backend_attention mode, struct error *err);
enum status backend_cuda_attention_uses_cudnn(struct backend *be, enum dtype dtype, int B, int T, int H,
                                              int Hkv, int D, bool backward, bool *cudnn, struct error *err);
// backend_set_attention_log and backend_attention_take_path (kernels/backend.h).
void backend_cuda_set_attention_log(struct backend *be, FILE *log);
unsigned backend_cuda_attention_take_path(struct backend *be);

// Builds the cuDNN operation graph of attention (forward or backward) of this
// shape and storage dtype and finalises it without a device or handle: cuDNN
// checks every tensor, every op and the graph's connections (dims, strides,
// dtypes, the GQA broadcast), not the engines. For test_ops_cuda on machines
// without a GPU. STATUS_RUNTIME with the failing call and cuDNN's message.
enum status backend_cuda_attention_check_graph(enum dtype dtype, int B, int T, int H, int Hkv, int D,
                                               bool backward, struct error *err);
// The same for one chunk pair of a ring-attention block
// (cuda_attention_cudnn_block.cu): Tq query rows against Tk key rows, views
// of tensors of TQ and TK rows a batch row, causal (top-left) or not.
enum status backend_cuda_attention_check_block_graph(enum dtype dtype, int B, int Tq, int Tk, int TQ, int TK,
                                                     int H, int Hkv, int D, bool causal, bool backward,
                                                     struct error *err);

#ifdef __cplusplus
}
#endif

#endif
