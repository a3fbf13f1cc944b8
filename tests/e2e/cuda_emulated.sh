#!/usr/bin/env bash
# cuda_emulated.sh: the emulated CUDA build (`make EMU=1`, docs/cuda.md) into
# $BUILD-emu: the CUDA backend's kernels (kernels/cuda/*.cu) compiled as host
# C++ against tests/cuda_emu and run by test_ops_cuda on the CPU: every op
# against the CPU backend, FP32, BF16 and FP16, without a GPU, twice: matmul
# through the emulated cuBLASLt (checks cuda_matmul.cu's column-major
# descriptors) and through the fallback GEMM kernel (TRIDENT_EMU_CUBLASLT=0).
# Checks indexing, reductions, barriers, dtype handling, and that it all
# holds with streams that run ahead of the host, with random delays too
# (TRIDENT_EMU_DELAY); not checked here: cuBLASLt's own kernels, real warp
# scheduling. The
# shapes are the small set (TEST_OPS_SMALL=1). First, check_emu
# (tests/cuda_emu/check_emu.cpp) checks the emulation's own semantics, and
# check_half (tests/cuda_emu/check_half.cpp) the emulation's FP16
# conversions against kernels/cpu/half.h on every
# bit pattern (~10 s). It makes the emulated programs the e2e tests run
# (trident, the check_* programs, test_ops_cuda, test_ring_reference, test_moe,
# check_host_work, the NCCL mpi programs; ckpt_async.sh, first in `make
# test`, made trident) and fails on a warning in their build; the other unit
# tests, mpi programs and benches, which no test runs emulated and which do
# not read TRIDENT_CUDA, are left out: cuda_build.sh compiles them with
# TRIDENT_CUDA (make CUDA=1 all) and fails on a warning there.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
EMU_BUILD="$BUILD-emu"
command -v g++ >/dev/null || fail "no g++: run make deps (build-essential)"
command -v perl >/dev/null || fail "no perl: run make deps"
start=$(date +%s)
need_emu trident tests/check_emu tests/check_streams tests/check_backend_async tests/check_half \
    tests/check_host_work tests/test_ops_cuda tests/test_ring_reference tests/test_kv_decode tests/test_moe \
    mpi/test_comm_nccl mpi/test_grad_sync
echo "== make EMU=1 BUILD=$EMU_BUILD: $(( $(date +%s) - start ))s"
if grep -qiE "warning" "$tmp/make.log"; then
    grep -iE -B2 -A4 "warning" "$tmp/make.log" | head -n 40
    fail "make EMU=1 printed warnings"
fi
need_built "$EMU_BUILD/tests/check_half" "$EMU_BUILD/tests/check_emu" "$EMU_BUILD/tests/check_streams" \
    "$EMU_BUILD/tests/check_backend_async" \
    "$EMU_BUILD/tests/test_ops_cuda" "$EMU_BUILD/tests/test_kv_decode" "$EMU_BUILD/tests/test_moe" \
    "$EMU_BUILD/trident" "$EMU_BUILD/mpi/test_comm_nccl"
fail=0
# The emulation's own semantics: indices, barriers, shuffles, dynamic shared
# memory, early returns, atomics, deadlock detection.
"$EMU_BUILD/tests/check_emu" || fail "check_emu: the kernel emulation is wrong"
# Streams that run ahead of the host: pending events, cudaStreamWaitEvent,
# the legacy stream, host reads of pinned memory before a synchronisation
# (tests/cuda_emu/check_streams.cpp); again with random delays before each
# operation (TRIDENT_EMU_DELAY=<max_us>:<seed>).
"$EMU_BUILD/tests/check_streams" || fail "check_streams: the emulated streams are wrong"
TRIDENT_EMU_DELAY=2000:1 "$EMU_BUILD/tests/check_streams" || fail "check_streams under TRIDENT_EMU_DELAY=2000:1"
# The CUDA backend where stream order differs from call order
# (tests/cuda_emu/check_backend_async.cpp).
"$EMU_BUILD/tests/check_backend_async" || fail "check_backend_async: the CUDA backend is wrong on asynchronous streams"
# The seven below are independent and each keeps one core busy (~5 s of CPU
# each): they run at once, their output shown in this order once all ended.
bg() { # NAME COMMAND...: COMMAND in the background, output in $tmp/NAME.out
    local name=$1; shift
    ( start=$(date +%s); rc=0; "$@" >"$tmp/$name.out" 2>&1 || rc=$?
      echo "$rc $(( $(date +%s) - start ))" >"$tmp/$name.rc" ) &
}
# The emulation's FP16 conversions against kernels/cpu/half.h, exhaustively.
bg half "$EMU_BUILD/tests/check_half"
# Matmul through the emulated cuBLASLt, then through the fallback GEMM kernel.
for lt in 1 0; do
    bg "ops$lt" env TRIDENT_EMU_CUBLASLT=$lt TEST_OPS_SMALL=1 TEST_OPS_CUDNN_ABSENT=1 OMP_NUM_THREADS=1 "$EMU_BUILD/tests/test_ops_cuda"
done
# Random delays before each queued operation must not change a result:
# every op again, each worker sleeping 0..30 us before each operation.
bg delay env TRIDENT_EMU_DELAY=30:5 TEST_OPS_SMALL=1 TEST_OPS_CUDNN_ABSENT=1 OMP_NUM_THREADS=1 "$EMU_BUILD/tests/test_ops_cuda"
# Generation with a key/value cache on the CUDA backend: the cached logits
# equal the full window's (fp32, bf16; with the attention options too) and
# greedy tokens equal the window recomputed per token (tests/unit/test_kv_decode.c).
bg kv env TEST_KV_CUDA_ONLY=1 OMP_NUM_THREADS=1 "$EMU_BUILD/tests/test_kv_decode"
# The mixture-of-experts layer on the CUDA backend: the transformers
# fixtures (Mixtral, Qwen2-MoE) in FP32 and BF16, forced capacity, and the
# CPU backend's output and gradients within 1e-5 (tests/unit/test_moe.c).
bg moe env OMP_NUM_THREADS=1 "$EMU_BUILD/tests/test_moe"
# FP8 on a device of compute capability 8.0 (an A100): backend_check_fp8
# must refuse it, naming the device (the FP8 op tests ran in ops0/ops1).
bg fp8old env TRIDENT_EMU_CC=8.0 TEST_OPS_FP8_ONLY=1 TEST_OPS_CUDNN_ABSENT=1 OMP_NUM_THREADS=1 "$EMU_BUILD/tests/test_ops_cuda"
wait
for name in half ops1 ops0 delay kv moe fp8old; do
    cat "$tmp/$name.out"
    read -r rc secs < "$tmp/$name.rc"
    case $name in
        half)  [ "$rc" -eq 0 ] || fail "the emulation's __half conversions differ from kernels/cpu/half.h" ;;
        ops*)  echo "== emulated test_ops_cuda (TRIDENT_EMU_CUBLASLT=${name#ops}): exit $rc in ${secs}s" ;;
        delay) echo "== emulated test_ops_cuda (TRIDENT_EMU_DELAY=30:5): exit $rc in ${secs}s" ;;
        kv)    echo "== emulated test_kv_decode (the CUDA backend): exit $rc in ${secs}s" ;;
        moe)   echo "== emulated test_moe (the MoE layer on the CUDA backend): exit $rc in ${secs}s" ;;
        fp8old) echo "== emulated test_ops_cuda, FP8 refused at compute capability 8.0: exit $rc in ${secs}s" ;;
    esac
    [ "$rc" -eq 0 ] || fail=1
done
exit "$fail"
