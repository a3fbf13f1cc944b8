#!/usr/bin/env bash
# train_watchdog_startup.sh: the watchdog ([system] watchdog_s) covers start-up.
#   (a) A dp = 2 run of 8 steps stops after step 4 (exit_interval) and saves it (watchdog_s = 2 from the first call on: no
#       false alarm in a fresh start).
#   (b) Its resume with rank 1 stuck reading a checkpoint tensor
#       (TRIDENT_FAULT=hang:ckpt_read_piece@1: a hung file system read) ends
#       the job with exit 1 within the checkpoint load's allowance (5 x
#       watchdog_s for a checkpoint this small) plus a few seconds, rank 1's
#       message naming the phase "start-up: loading checkpoint step-000004
#       (its tensors)", no process left.
#   (c) The same resume without the fault, watchdog_s = 2, with evaluation and
#       samples, completes (exit 0, steps 5-8), and its closing record splits
#       the wall time: the training steps' seconds hold every logged step
#       time (sum of step_time_s, log.every = 1) and, with evaluation,
#       samples and saves, fit in the wall seconds; tokens_per_s is tokens /
#       train_seconds, above tokens / seconds (samples cost time here).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
ck="$tmp/ck"
run() { # RUN_DIR STEPS [overrides...]
    local dir=$1 steps=$2; shift 2
    timeout 60 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" parallel.dp=2 \
        train.global_batch_size=16 train.warmup_steps=1 train.steps="$steps" checkpoint.dir="$ck" log.run_dir="$dir" "$@"
}

# (a)
run "$tmp/a" 8 train.exit_interval=4 train.eval_every=0 system.watchdog_s=2 > "$tmp/a.log" 2>&1 || { tail -5 "$tmp/a.log"; fail "run (a)"; }
[ -d "$ck/step-000004" ] || fail "run (a) saved no step-000004"

# (b)
rc=0
start=$(date +%s%N)
TRIDENT_FAULT=hang:ckpt_read_piece@1 run "$tmp/b" 8 train.eval_every=0 system.watchdog_s=1 \
    > "$tmp/b.log" 2>&1 || rc=$?
secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b - a) / 1e9}')
[ "$rc" = 1 ] || { tail -5 "$tmp/b.log"; fail "the hung resume exited $rc, expected 1"; }
grep -q 'rank 1\] TRIDENT_FAULT: hanging at ckpt_read_piece' "$tmp/b.log" || fail "the fault did not fire"
grep -Eq 'rank 1, host [^]]+\] watchdog: no progress for [0-9]+ s .* in phase "start-up: loading checkpoint step-000004 \(its tensors\)"' \
    "$tmp/b.log" || { grep -a watchdog "$tmp/b.log"; fail "no watchdog message of rank 1 naming the checkpoint load"; }
# 5 x 1 s of allowance, the start before it (~1-2 s) and mpirun's teardown.
awk -v s="$secs" 'BEGIN{exit !(s < 15)}' || fail "the hung resume took $secs s"
mpi_no_leftovers "$tmp/b" || fail "processes of the hung resume left"
echo "ok (b): $(grep -a -m1 'watchdog:' "$tmp/b.log" | cut -c1-200)... after $secs s"

# (c)
run "$tmp/c" 8 train.eval_every=2 train.sample_every=2 train.sample_tokens=60 system.watchdog_s=2 \
    > "$tmp/c.log" 2>&1 || { tail -5 "$tmp/c.log"; fail "the resume with watchdog_s = 2 failed"; }
grep -q '^resumed from .*step-000004' "$tmp/c.log" || fail "run (c) did not resume"
done_rec=$(jq -c 'select(.done == true)' "$tmp/c/metrics.jsonl" | tail -n 1)
[ -n "$done_rec" ] || fail "no closing record"
steps_sum=$(metrics "$tmp/c" '.step_time_s' | awk '{s += $1} END {printf "%.4f", s}')
nsteps=$(metrics "$tmp/c" '.step' | wc -l)
echo "$done_rec" | jq -e --argjson sum "$steps_sum" --argjson n "$nsteps" '
    .ended == "completed" and .steps == 4 and $n == 4 and .eval_seconds > 0 and .sample_seconds > 0 and
    .train_seconds >= $sum - 0.001 and
    .train_seconds + .eval_seconds + .sample_seconds + .save_seconds <= .seconds + 0.002 and
    ((.tokens_per_s / (.tokens / .train_seconds) - 1) | fabs) < 0.01 and
    .tokens_per_s > .tokens / .seconds' >/dev/null ||
    fail "closing record $done_rec (sum of step_time_s $steps_sum over $nsteps steps)"
grep -Eq '^done: 4 steps, 2048 tokens, [0-9.]+ s wall \(train [0-9.]+ s, eval [0-9.]+ s, samples [0-9.]+ s, saves [0-9.]+ s\), mean [0-9]+ tokens/s training' \
    "$tmp/c.log" || { grep '^done' "$tmp/c.log"; fail "done line"; }
echo "ok (c): $(grep '^done:' "$tmp/c.log")"
