#!/usr/bin/env bash
# cuda_emulated.sh: the CUDA backend's kernels (kernels/cuda/*.cu) compiled as
# host C++ against tests/cuda_emu/cuda_emu.h and run by test_ops_cuda on the
# CPU: every op against the CPU backend, FP32, BF16 and FP16, without a GPU.
# Checks indexing, reductions, dtype handling and the matmul fallback kernel; not
# checked here: cuBLASLt (the emulated heuristic finds no algorithm), real
# warp scheduling, streams, NCCL. Each kernel launch becomes one OS thread
# per CUDA thread, so the test shapes are the small set (TEST_OPS_SMALL=1).
# First, tests/cuda_emu/check_half.cpp checks the emulation's FP16
# conversions against kernels/cpu/half.h on every bit pattern (~10 s).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
OUT="$BUILD/cuda-emu"
command -v g++ >/dev/null || fail "no g++: run make deps (build-essential)"
command -v perl >/dev/null || fail "no perl: run make deps"
mkdir -p "$OUT"
CFLAGS="-O1 -g -Isrc -I. $(pkg-config --cflags openblas 2>/dev/null)"
fail=0
objs=()
for cu in kernels/cuda/*.cu; do
    name=$(basename "$cu" .cu)
    # preprocess, then rewrite kernel<<<cfg>>>(args) as emu_launch(cfg, kernel, args)
    g++ -E -x c++ -std=c++20 -Itests/cuda_emu $CFLAGS "$cu" -o "$OUT/$name.ii" || { echo "FAIL: preprocess $cu"; exit 1; }
    perl -0pe 's/([A-Za-z_]\w*(?:\s*<\s*\d+\s*>)?)\s*<\s*<\s*<(.*?)>\s*>\s*>\s*\(/emu_launch($2, $1, /gs' \
        "$OUT/$name.ii" >"$OUT/$name.cpp"
    g++ -c -x c++ -std=c++20 -O1 -g -w -pthread -Itests/cuda_emu $CFLAGS "$OUT/$name.cpp" -o "$OUT/$name.o" ||
        { echo "FAIL: compile $cu (emulated)"; exit 1; }
    objs+=("$OUT/$name.o")
done
g++ -c -std=c++20 -O1 -g -pthread -Itests/cuda_emu tests/cuda_emu/cuda_emu.cpp -o "$OUT/cuda_emu.o" || fail "compile cuda_emu.cpp"
# The emulation's FP16 conversions against kernels/cpu/half.h, exhaustively.
g++ -std=c++20 -O2 -Itests/cuda_emu $CFLAGS tests/cuda_emu/check_half.cpp -o "$OUT/check_half" || fail "compile check_half.cpp"
"$OUT/check_half" || fail "the emulation's __half conversions differ from kernels/cpu/half.h"
csrc=(kernels/ops.c kernels/backend.c kernels/rope_table.c kernels/cpu/*.c src/base/common.c tests/unit/test_ops_cuda.c)
for c in "${csrc[@]}"; do
    o="$OUT/c_$(basename "$c" .c).o"
    gcc -c -std=gnu11 -fopenmp -DTRIDENT_CUDA -Itests/unit $CFLAGS "$c" -o "$o" || { echo "FAIL: compile $c"; exit 1; }
    objs+=("$o")
done
# The CPU backend's serial build (one thread), as the Makefile makes it.
for c in kernels/cpu/*.c; do
    case "$c" in kernels/cpu/cpu_backend.c|kernels/cpu/cpu_memory.c) continue ;; esac
    o="$OUT/s_$(basename "$c" .c).o"
    gcc -c -std=gnu11 -fno-openmp -Wno-unknown-pragmas -DCPU_SERIAL \
        -Itests/unit $CFLAGS "$c" -o "$o" || { echo "FAIL: compile $c (serial)"; exit 1; }
    objs+=("$o")
done
g++ -fopenmp -pthread "${objs[@]}" "$OUT/cuda_emu.o" -o "$OUT/test_ops_cuda" \
    $(pkg-config --libs openblas 2>/dev/null) -ldnnl -lm || { echo "FAIL: link"; exit 1; }
start=$(date +%s)
rc=0; TEST_OPS_SMALL=1 TEST_OPS_CUDNN_ABSENT=1 OMP_NUM_THREADS=1 "$OUT/test_ops_cuda" || rc=$?
echo "== emulated test_ops_cuda: exit $rc in $(( $(date +%s) - start ))s"
[ "$rc" -eq 0 ] || fail=1
exit "$fail"
