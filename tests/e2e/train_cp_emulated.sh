#!/usr/bin/env bash
# train_cp_emulated.sh: context parallelism ([parallel] cp = 2) on the CUDA
# backend over NCCL, run on the CPU by the emulated build (make EMU=1: the
# native attention_block kernels, the ring's sends and receives deferred
# onto the CP group's communication stream and ordered by events, against
# tests/cuda_emu). tests/e2e/configs/cp.ini (T 256) with packing =
# concat_reset on single KJV verses as documents, 5 steps, fp32: every
# step's loss and grad norm within 1e-5 relative of the CPU backend's cp 2
# run, every step record's attention path "native" (the CUDA backend's block
# kernels) and the emulation reporting kernel launches. The emulated run goes under
# TRIDENT_EMU_DELAY (random sleeps before each queued operation of each
# stream): a block sent before its producer ran, or read before its
# transfer ended, would give other numbers.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_emu trident
command -v bible >/dev/null || fail "bible-kjv not installed: run make deps"
data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
awk 'NF && n < 600 {print; print ""; n++}' "$tmp/kjv.txt" > "$tmp/verses.txt" # a verse per document
"$TRIDENT" prep --input "$tmp/verses.txt" --output "$tmp/shards" --vocab-size 510 \
    --val-fraction 0.05 >/dev/null 2>&1 || fail "prep of the verse dataset"
common=(data.path="$tmp/shards" data.packing=concat_reset parallel.cp=2 train.steps=5 system.threads=1
        system.peak_tflops=1)
for dev in cpu cuda; do
    bin="$TRIDENT" env=()
    [ "$dev" = cuda ] && bin="$PWD/$EMU_BUILD/trident" env=(TRIDENT_EMU_DELAY=200:7 TRIDENT_EMU_STATS=1)
    rc=0 start=$(date +%s)
    env OMP_NUM_THREADS=1 "${env[@]}" timeout 300 "${MPIRUN[@]}" -np 2 "$bin" train tests/e2e/configs/cp.ini \
        "${common[@]}" system.device=$dev log.run_dir="$tmp/run-$dev" checkpoint.dir="$tmp/ck-$dev" \
        < /dev/null > "$tmp/$dev.log" 2>&1 || rc=$?
    echo "== cp 2 $dev: exit $rc in $(( $(date +%s) - start )) s"
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/$dev.log"; fail "cp 2 on $dev exited $rc"; }
done
# The CUDA backend's native block kernels ran (metrics.jsonl's attention path;
# device = cuda on 2 ranks makes NCCL groups: design.md §2).
paths=$(metrics "$tmp/run-cuda" .attention | sort -u | paste -sd' ')
[ "$paths" = '"native"' ] || fail "the emulated run's attention paths: $paths, expected \"native\""
n=$(sed -n 's/^cuda_emu: \([0-9]*\) launches.*/\1/p' "$tmp/cuda.log" | sort -n | head -1)
[ "${n:-0}" -gt 0 ] || fail "the emulated run reports no kernel launches"
jq -n -r --slurpfile a <(metrics "$tmp/run-cpu" '[.step, .loss, .grad_norm]') \
    --slurpfile b <(metrics "$tmp/run-cuda" '[.step, .loss, .grad_norm]') '
    if ($a | length) != 5 or ($b | length) != 5 then "FAIL: \($b | length) emulated steps, \($a | length) on the CPU"
    else ([range(5) as $i | (1, 2) as $k | (($a[$i][$k] - $b[$i][$k]) | fabs) / ($a[$i][$k] | fabs)] | max) as $w
    | if $w <= 1e-5 then "cp 2: emulated CUDA vs CPU, 5 steps within 1e-5 (worst rel \($w))"
      else "FAIL: cp 2: emulated CUDA vs CPU: worst rel \($w) > 1e-5" end end' | tee "$tmp/verdict"
! grep -q FAIL "$tmp/verdict"
