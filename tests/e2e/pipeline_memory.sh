#!/usr/bin/env bash
# pipeline_memory.sh: under 1F1B, stage 0 keeps at most p microbatches of
# activations, however many microbatches a step has. With p = 2 and m = 4 or
# 8 microbatches, and p = 4 with m = 8, rank 0 (stage 0) must hold p
# activation slots, use all p of them (the high-water mark of slot indices
# the schedule handed out), and allocate the same bytes for m = 4 and m = 8
# (metrics.jsonl's mem_bytes: the arenas of rank 0, of which only the
# activations could depend on m).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
fail=0
run() { # p global_batch -> prints "mem_bytes slots used"
    local p=$1 g=$2 log="$tmp/log-$1-$2" run_dir="$tmp/run-$1-$2" rc=0
    timeout 120 "${MPIRUN[@]}" -np "$p" "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        parallel.pp="$p" model.n_layers=4 train.global_batch_size="$g" train.steps=2 \
        train.warmup_steps=1 log.run_dir="$run_dir" > "$log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: p=$p run exited $rc" >&2; tail -5 "$log" >&2; return 1; }
    local bytes slots_used
    bytes=$(metrics "$run_dir" .mem_bytes | tail -n 1)
    # The slot count and high-water mark: the run's closing record.
    slots_used=$(jq -r 'select(.done) | "\(.activation_slots) \(.activation_slots_used)"' "$run_dir/metrics.jsonl")
    echo "$bytes $slots_used"
}
read -r b24 s24 u24 <<<"$(run 2 8)" || fail=1
read -r b28 s28 u28 <<<"$(run 2 16)" || fail=1
read -r b48 s48 u48 <<<"$(run 4 16)" || fail=1
echo "p=2 m=4: $s24 slots, $u24 used, $b24 bytes on rank 0"
echo "p=2 m=8: $s28 slots, $u28 used, $b28 bytes on rank 0"
echo "p=4 m=8: $s48 slots, $u48 used, $b48 bytes on rank 0"
[ "$s24" = 2 ] && [ "$u24" = 2 ] && [ "$s28" = 2 ] && [ "$u28" = 2 ] || { echo "FAIL: p=2 stage 0 must hold and use 2 slots"; fail=1; }
[ "$s48" = 4 ] && [ "$u48" = 4 ] || { echo "FAIL: p=4 stage 0 must hold and use 4 slots"; fail=1; }
[ -n "$b24" ] && [ "$b24" = "$b28" ] || { echo "FAIL: rank 0's bytes grew with m: $b24 vs $b28"; fail=1; }
exit $fail
