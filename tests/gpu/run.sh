#!/usr/bin/env bash
# run.sh: the CUDA checks on a GPU machine without network or trident's Debian
# packages (one H200; must end within 8 minutes). Run from the repository
# root, after tests/gpu/prepare.sh ran on a networked machine; ship the
# ignored paths tests/gpu/debs and data/kjv-shards with the working tree.
#   1. unpacks tests/gpu/debs/*.deb with dpkg -x (or ar + tar) into a prefix
#      under /tmp (never into /), points PATH, LD_LIBRARY_PATH, OPAL_PREFIX,
#      PKG_CONFIG_PATH, CPATH and LIBRARY_PATH at it;
#   2. make CUDA=1 into build-gpu (no warning allowed: counted in the summary);
#   3. build-gpu/tests/test_ops_cuda (every op against the CPU backend), the
#      same with TEST_OPS_ATTENTION=cudnn (cuDNN's fused attention against the
#      native kernel and the CPU), and build-gpu/mpi/test_comm_nccl under
#      mpirun, one rank per GPU;
#   4. build-gpu/bench/bench_cuda (op timings on the device);
#   5. 50 steps of configs/tiny.ini with system.device=cuda, when the trainer
#      accepts it, and the same 50 steps on the CPU for comparison.
# Writes $OUT/summary.txt (one line per step: name, status, seconds) and each
# step's log under $OUT (OUT defaults to /tmp/trident-gpu-out). Exit 0 when
# the build and test_ops_cuda passed.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/trident-gpu-out}
PREFIX=${PREFIX:-/tmp/trident-prefix}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUILD=build-gpu
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-450} )) # 7.5 minutes in all
JOBS=$(nproc 2>/dev/null || echo 8)
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_S CMD...: runs CMD with its output in $OUT/NAME.log, under
# the smaller of LIMIT_S and the time left; records "NAME ok|FAIL(rc)|TIMEOUT|SKIP secs".
step() {
    local name=$1 limit=$2; shift 2
    local left=$(( DEADLINE - $(date +%s) )) start rc
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 10 ]; then note "$name SKIP(no time left) 0"; return 124; fi
    start=$(date +%s)
    # bash -c: CMD may be one of the exported functions below
    timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" >"$OUT/$name.log" 2>&1; rc=$?
    local secs=$(( $(date +%s) - start )) status
    case $rc in 0) status=ok ;; 77) status=SKIP ;; 124|137) status="TIMEOUT(${limit}s)" ;; *) status="FAIL($rc)" ;; esac
    note "$name $status ${secs}s"
    [ "$rc" -eq 0 ] || tail -n 30 "$OUT/$name.log" | sed 's/^/    /'
    return "$rc"
}

note "host $(hostname) $(date -u +%FT%TZ) jobs=$JOBS"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader | sed 's/^/gpu /' | tee -a "$SUMMARY"
[ -x "$CUDA_HOME/bin/nvcc" ] || { note "nvcc FAIL(missing $CUDA_HOME/bin/nvcc)"; exit 1; }

# ---- 1. the prefix -------------------------------------------------------------
unpack() {
    local deb tmp
    shopt -s nullglob
    local debs=("$ROOT"/tests/gpu/debs/*.deb)
    [ ${#debs[@]} -gt 0 ] || { echo "no .deb files in tests/gpu/debs: run tests/gpu/prepare.sh"; return 1; }
    case "$PREFIX" in /tmp/?*) ;; *) echo "PREFIX=$PREFIX is not under /tmp"; return 1 ;; esac
    rm -rf "$PREFIX" && mkdir -p "$PREFIX"
    for deb in "${debs[@]}"; do
        if command -v dpkg >/dev/null; then
            dpkg -x "$deb" "$PREFIX" || return 1
        else # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
            tmp=$(mktemp -d)
            (cd "$tmp" && ar x "$deb") || return 1
            tar -xf "$tmp"/data.tar.* -C "$PREFIX" || return 1
            rm -rf "$tmp"
        fi
    done
    # Absolute symlinks (e.g. /usr/lib/x86_64-linux-gnu/libmpi.so) point into
    # the prefix, not at the missing system files.
    find "$PREFIX" -type l | while read -r l; do
        t=$(readlink "$l")
        case "$t" in /*) ln -sfn "$PREFIX$t" "$l" ;; esac
    done
    # .pc files name /usr: rewrite to the prefix.
    find "$PREFIX" -name '*.pc' -type f -exec sed -i \
        -e "s|=/usr|=$PREFIX/usr|g" -e "s| -I/usr| -I$PREFIX/usr|g" -e "s| -L/usr| -L$PREFIX/usr|g" {} +
    # Debian's alternatives (not in any .deb): hdf5.pc, openblas.pc, mpirun.
    local lib="$PREFIX/usr/lib/x86_64-linux-gnu"
    mkdir -p "$PREFIX/pkgconfig" "$PREFIX/bin"
    ln -sfn "$lib/pkgconfig/hdf5-serial.pc" "$PREFIX/pkgconfig/hdf5.pc"
    ln -sfn "$lib/openblas-openmp/pkgconfig/openblas.pc" "$PREFIX/pkgconfig/openblas.pc"
    ln -sfn "$PREFIX/usr/bin/mpirun.openmpi" "$PREFIX/bin/mpirun"
    ln -sfn "$PREFIX/usr/bin/mpicc.openmpi" "$PREFIX/bin/mpicc"
    echo "unpacked ${#debs[@]} packages into $PREFIX ($(du -sh "$PREFIX" | cut -f1))"
}
export -f unpack
export ROOT OUT PREFIX CUDA_HOME BUILD JOBS
step unpack 120 unpack || { note "result FAIL (unpack)"; exit 1; }

LIB="$PREFIX/usr/lib/x86_64-linux-gnu"
libdirs=$(find "$PREFIX" -name '*.so*' \( -type f -o -type l \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd: -)
export PATH="$PREFIX/bin:$PREFIX/usr/bin:$CUDA_HOME/bin:$PATH"
export LD_LIBRARY_PATH="$libdirs:$CUDA_HOME/lib64:$CUDA_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$LIB:$LIB/openmpi/lib:$LIB/hdf5/serial:$LIB/openblas-openmp${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CPATH="$PREFIX/usr/include:$PREFIX/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
export PKG_CONFIG_PATH="$PREFIX/pkgconfig:$LIB/pkgconfig:$PREFIX/usr/share/pkgconfig:$LIB/openmpi/lib/pkgconfig"
export PKG_CONFIG_LIBDIR="$PKG_CONFIG_PATH" # only the prefix: a system .pc must not mask a missing one
export OPAL_PREFIX="$PREFIX/usr"
export PMIX_INSTALL_PREFIX="$LIB/pmix2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
{
    echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; echo "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
    echo "pkg-config: $(command -v pkg-config)"
    pkg-config --cflags --libs hdf5 inih openblas libpcre2-8 jansson ompi-c libxxhash 2>&1
} >"$OUT/env.log"

# ---- 2. build --------------------------------------------------------------------
build() {
    # the Makefile's `$(shell pkg-config ...)` hides failures: check them here
    pkg-config --exists hdf5 inih openblas libpcre2-8 jansson ompi-c libxxhash ||
        { echo "pkg-config cannot find every package:"; cat "$OUT/env.log"; return 1; }
    make -j"$JOBS" CUDA=1 CUDA_HOME="$CUDA_HOME" BUILD="$BUILD" all || return 1
    ! grep -qiE "warning" "$OUT/build.log" || { echo "BUILD PRINTED WARNINGS"; return 3; }
}
export -f build
step build 240 build
build_rc=$?
[ "$build_rc" -eq 0 ] || [ "$build_rc" -eq 3 ] || { note "result FAIL (build)"; exit 1; }

# ---- 3. the op tests -----------------------------------------------------------------
step test_ops_cuda 120 env TEST_VERBOSE=1 "$BUILD/tests/test_ops_cuda"
ops_rc=$?
grep -E "checks (passed|failed)" "$OUT/test_ops_cuda.log" | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- 3a. cuDNN attention (system.attention = cudnn, demanded) --------------------------
# BF16 and FP16, T up to 1024, forward and backward, against the CPU backend
# and against the native kernel on the same inputs (test_ops_cuda.c).
step attention_cudnn 120 env TEST_VERBOSE=1 TEST_OPS_ATTENTION=cudnn "$BUILD/tests/test_ops_cuda"
grep -E "checks (passed|failed)|cannot run attention" "$OUT/attention_cudnn.log" | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- 3b. the NCCL comm table: one rank per GPU --------------------------------------
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${NGPU:-0}" -ge 1 ] || NGPU=1
step comm_nccl 60 mpirun --oversubscribe --bind-to none -np "$NGPU" "$BUILD/mpi/test_comm_nccl"

# ---- 4. device benchmark --------------------------------------------------------------
[ -x "$BUILD/bench/bench_cuda" ] && step bench_cuda 60 "$BUILD/bench/bench_cuda"

# ---- 5. training: cuda when the trainer takes it, cpu for comparison -------------
SHARDS=data/kjv-shards
if [ ! -f "$SHARDS/index.ini" ]; then
    note "train SKIP(no $SHARDS: run tests/gpu/prepare.sh and carry data/kjv-shards) 0"
else
    common=(train.steps=50 train.eval_every=25 train.sample_every=1000 parallel.dp=1
            train.global_batch_size=8 checkpoint.every=1000 checkpoint.resume=none
            data.path="$SHARDS" log.every=10)
    step train_cuda 120 "$BUILD/trident" train configs/tiny.ini system.device=cuda \
        log.run_dir=/tmp/trident-run-cuda checkpoint.dir=/tmp/trident-run-cuda/ckpt "${common[@]}"
    step train_cpu 120 env OMP_NUM_THREADS=8 "$BUILD/trident" train configs/tiny.ini system.device=cpu \
        system.threads=8 log.run_dir=/tmp/trident-run-cpu checkpoint.dir=/tmp/trident-run-cpu/ckpt "${common[@]}"
    for d in cuda cpu; do
        grep -iE "step +(10|20|30|40|50)\b|loss" "$OUT/train_$d.log" | tail -n 6 | sed "s/^/    $d: /" | tee -a "$SUMMARY"
    done
fi

if [ "$ops_rc" -eq 0 ] && [ "$build_rc" -eq 0 ]; then note "result ok"; exit 0; fi
note "result FAIL (build rc $build_rc, test_ops_cuda rc $ops_rc)"
exit 1
