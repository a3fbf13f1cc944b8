#!/usr/bin/env bash
# cuda_build.sh: `make CUDA=1` compiles and links the CUDA backend (nvcc for
# sm_80, sm_89 and sm_90, cuBLASLt, cuDNN, NCCL) from scratch into a separate BUILD
# dir with no warning at all; `ldd BUILD-cuda/trident` lists libcudnn and
# libcublasLt and libnccl; test_ops_cuda of that build runs (it skips
# without a device, exit 77, and must not fail); the CPU-only build's binary
# does not link the CUDA runtime. cuDNN and NCCL are where
# tests/gpu/probe.sh finds them (CUDA_HOME, the system or Python wheels; its
# make variables passed to make, as tests/gpu/run.sh does); the probe failing
# fails the test. Skips (77) when nvcc is missing. Takes ~1-2 minutes on 2
# cores. With ccache installed (make test's cache, build-ccache/, or
# CCACHE_DIR), the C files whose text once preprocessed is the CPU build's
# (most: TRIDENT_CUDA changes a few) take that build's objects and warnings.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || skip "no nvcc ($CUDA_HOME/bin/nvcc): no CUDA toolkit"
OUT="$BUILD-cuda"
fail=0
log="$tmp/log"

rm -rf "$OUT"
CUDA_HOME="$CUDA_HOME" tests/gpu/probe.sh "$OUT/cuda_deps" >"$log" 2>&1 || { cat "$log"; fail "tests/gpu/probe.sh"; }
sed 's/^result: /    probe: /' "$log"
mapfile -t deps < <(sed 's/ := /=/; s/ *$//' "$OUT/cuda_deps/cuda_deps.mk")
start=$(date +%s)
cc=${CC:-cc}
if command -v ccache >/dev/null; then
    cc="ccache $cc"; export CCACHE_DIR=${CCACHE_DIR:-$PWD/build-ccache}
fi
rc=0; make -j2 CUDA=1 CUDA_HOME="$CUDA_HOME" BUILD="$OUT" CC="$cc" "${deps[@]}" all >"$log" 2>&1 ||
    rc=$?
echo "== make CUDA=1 BUILD=$OUT: exit $rc in $(( $(date +%s) - start ))s"
[ "$rc" -eq 0 ] || { tail -n 40 "$log"; fail "make CUDA=1 exit $rc"; }
if grep -qiE "warning|remark" "$log"; then
    grep -iE -B2 -A4 "warning|remark" "$log" | head -n 60 || true
    echo "FAIL: make CUDA=1 printed warnings"; fail=1
fi
for f in "$OUT"/kernels/cuda/cuda_backend.o "$OUT"/src/parallel/comm_nccl.o "$OUT"/trident; do
    [ -e "$f" ] || { echo "FAIL: $f not built"; fail=1; }
done
# The three architectures are in the fatbinary.
if command -v "$CUDA_HOME/bin/cuobjdump" >/dev/null; then
    archs=$("$CUDA_HOME/bin/cuobjdump" --list-elf "$OUT/kernels/cuda/cuda_norm.o" 2>/dev/null || true)
    for sm in sm_80 sm_89 sm_90; do
        grep -q "$sm" <<<"$archs" || { echo "FAIL: cuda_norm.o has no $sm code"; fail=1; }
    done
fi
# The trainer calls cuDNN (fused attention), cuBLASLt (matmul) and NCCL (the
# device groups of a multi-rank run): the linker (--as-needed) must keep all
# three (issue 12, acceptance 2).
trident_libs=$(ldd "$OUT/trident" 2>&1 || true)
want=(libcudnn libcublasLt libnccl)
for lib in "${want[@]}"; do
    grep -q "$lib\." <<<"$trident_libs" || { echo "FAIL: ldd $OUT/trident does not list $lib"; fail=1; }
done
grep -E "libcudnn|libcublasLt|libnccl" <<<"$trident_libs" | sed 's/^/    /'
# test_ops_cuda calls backend_init, which pulls the CUDA objects in.
grep -q libcudart <<<"$(ldd "$OUT/tests/test_ops_cuda")" ||
    { echo "FAIL: $OUT/tests/test_ops_cuda does not link libcudart"; fail=1; }
if [ -x "$BUILD/trident" ] && grep -qE "libcudart|libnccl|libcublas" <<<"$(ldd "$BUILD/trident")"; then
    echo "FAIL: the CPU-only $BUILD/trident links CUDA libraries"; fail=1
fi

rc=0; "$OUT/tests/test_ops_cuda" >"$log" 2>&1 || rc=$?
echo "== $OUT/tests/test_ops_cuda: exit $rc"; cat "$log"
case $rc in
    0) ;;
    77) grep -q "^skipped: no CUDA device" "$log" || { echo "FAIL: skip without the reason"; fail=1; } ;;
    *) echo "FAIL: test_ops_cuda exit $rc"; fail=1 ;;
esac
if [ "$fail" -eq 0 ]; then echo "cuda_build: ok"; fi
exit "$fail"
