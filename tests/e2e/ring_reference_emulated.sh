#!/usr/bin/env bash
# ring_reference_emulated.sh: issue 26, acceptance 2 on the emulated CUDA
# build: test_ring_reference of $BUILD-emu runs the context-parallel ring of
# the block ops (attention_block_forward / _backward) on the CUDA backend's
# kernels (kernels/cuda/cuda_attention_block.cu, emulated on the CPU) as on
# the CPU backend, at cp 2 and 4, T 1024 and 64, GQA, with and without
# documents, FP32 and BF16, against float64 PyTorch full causal attention
# (tests/reference/fixtures/ring.h5). The CPU-only build's test_ring_reference
# (tests/run.sh runs it) covers the CPU backend; this one must also show the
# CUDA rows. Needs $BUILD-emu (make EMU=1; a no-op when current). ~10 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_emu tests/test_ring_reference
rc=0
# stdout (the checks) apart from stderr (the backend's one line per shape
# that cuDNN declines), so that neither splits the other's lines
TEST_VERBOSE=1 OMP_NUM_THREADS=2 "$EMU_BUILD/tests/test_ring_reference" >"$tmp/ring.log" 2>"$tmp/ring.err" || rc=$?
[ "$rc" -eq 0 ] || { grep -E "FAIL|failed" "$tmp/ring.log" "$tmp/ring.err" | head -n 30; fail "test_ring_reference (emulated CUDA): exit $rc"; }
# every (dtype, cp, size, mask, output) of the CUDA backend was compared
for dt in fp32 bf16; do
    n=$(grep -c "^  cuda $dt cp [24]: T" "$tmp/ring.log" || true)
    [ "$n" -eq 40 ] || fail "expected 40 checked outputs of the cuda backend in $dt, found $n"
done
echo "ring reference on the emulated CUDA backend: $(tail -n 1 "$tmp/ring.log")"
