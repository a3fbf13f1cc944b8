#!/usr/bin/env bash
# pipeline_memory.sh: under 1F1B, stage 0 keeps at most p microbatches of
# activations, however many microbatches a step has. With p = 2 and m = 4 or
# 8 microbatches, and p = 4 with m = 8, rank 0 (stage 0) must report p
# activation slots, use all p of them (the high-water mark of slot indices
# the schedule handed out), and allocate the same activation bytes for m = 4
# and m = 8.
set -u
cd "$(dirname "$0")/../.."
source tests/e2e/lib/train_env.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small_dataset "$tmp"
fail=0
run() { # p global_batch -> prints "slots used act_bytes"
    local p=$1 g=$2 log="$tmp/log-$1-$2"
    timeout 120 $MPIRUN -np "$p" "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        parallel.pp="$p" model.n_layers=4 train.global_batch_size="$g" train.steps=2 \
        train.warmup_steps=1 log.run_dir="$tmp/run-$p-$g" > "$log" 2>&1 || { echo "FAIL: p=$p run exited $?" >&2; tail -5 "$log" >&2; return 1; }
    local slots used bytes
    bytes=$(sed -n 's/.*activations [0-9.]* MiB (\([0-9]*\) bytes: \([0-9]*\) slots.*/\1 \2/p' "$log")
    used=$(sed -n 's/^activation slots on rank 0: \([0-9]*\) used of \([0-9]*\).*/\1/p' "$log")
    echo "$bytes $used"
}
read -r b24 s24 u24 <<<"$(run 2 8)" || fail=1
read -r b28 s28 u28 <<<"$(run 2 16)" || fail=1
read -r b48 s48 u48 <<<"$(run 4 16)" || fail=1
echo "p=2 m=4: $s24 slots, $u24 used, $b24 activation bytes"
echo "p=2 m=8: $s28 slots, $u28 used, $b28 activation bytes"
echo "p=4 m=8: $s48 slots, $u48 used, $b48 activation bytes"
[ "$s24" = 2 ] && [ "$u24" = 2 ] && [ "$s28" = 2 ] && [ "$u28" = 2 ] || { echo "FAIL: p=2 stage 0 must hold and use 2 slots"; fail=1; }
[ "$s48" = 4 ] && [ "$u48" = 4 ] || { echo "FAIL: p=4 stage 0 must hold and use 4 slots"; fail=1; }
[ -n "$b24" ] && [ "$b24" = "$b28" ] || { echo "FAIL: activation bytes grew with m: $b24 vs $b28"; fail=1; }
exit $fail
