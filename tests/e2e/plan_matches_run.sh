#!/usr/bin/env bash
# plan_matches_run.sh: `trident plan` prints what a run allocates (docs/design.md
# §5): for layouts (tp,pp,dp,zero) = (1,1,1,0), (2,2,2,1), (1,2,1,0) with
# sequence parallelism off and (2,1,1,0) with it on, the plan's optimizer and
# activation bytes for stage 0, tp rank 0 equal those world rank 0 reports
# when the layout actually runs.
set -u
cd "$(dirname "$0")/../.."
source tests/e2e/lib/train_env.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small_dataset "$tmp"
fail=0
for l in 1,1,1,0,0 2,2,2,1,0 1,2,1,0,0 2,1,1,0,1; do
    IFS=, read -r tp pp dp z sp <<<"$l"
    args=(data.path="$tmp/shards" parallel.tp=$tp parallel.pp=$pp parallel.dp=$dp
          parallel.zero_stage=$z parallel.sequence_parallel=$sp train.global_batch_size=16
          train.steps=1 train.warmup_steps=1 log.run_dir="$tmp/run")
    plan=$("$TRIDENT" plan "$SMALL_INI" "${args[@]}") || { echo "FAIL: plan $l exited $?"; fail=1; continue; }
    want=$(awk '/^0 +0 /{getline; print; exit}' <<<"$plan" | sed -n 's/.*optimizer \([0-9]*\), activations \([0-9]*\).*/\1 \2/p')
    out=$(timeout 120 $MPIRUN -np $((tp * pp * dp)) "$TRIDENT" train "$SMALL_INI" "${args[@]}" 2>&1) \
        || { echo "FAIL: run $l exited"; fail=1; continue; }
    got=$(sed -n 's/.*optimizer [0-9.]* MiB (\([0-9]*\) bytes[^)]*), activations [0-9.]* MiB (\([0-9]*\) bytes.*/\1 \2/p' <<<"$out")
    if [ -z "$want" ] || [ "$want" != "$got" ]; then
        echo "FAIL: $l: plan says optimizer/activations '$want', the run '$got'"; fail=1
    else
        echo "$l: plan == run (optimizer, activation bytes: $got)"
    fi
done
exit $fail
