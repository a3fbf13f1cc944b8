#!/usr/bin/env bash
# train_cp.sh: context parallelism ([parallel] cp, docs/design.md §4 "Context
# parallelism") trains as cp = 1 does. tests/e2e/configs/cp.ini (T 256, 2
# layers, grouped-query heads, global batch 4 of one-sequence microbatches)
# on single KJV verses as documents (about 55 tokens: at cp 4 the 32-token
# chunks cut most of them), 10 steps each; every comparison is of each
# step's loss and gradient norm from metrics.jsonl, relative:
#   - fp32, packing = concat_reset (documents crossing chunk and rank
#     boundaries) and concat: cp 2 and cp 4 against cp 1 within 1e-6;
#   - (tp 2, cp 2, dp 2) with sequence parallelism, (cp 2, pp 2) and (cp 2,
#     dp 2, zero 3), concat_reset: each against cp 1 (one rank) within 1e-6
#     (this model's fp32 numbers agree to metrics.jsonl's 6 decimals in those
#     layouts); (cp 2, dp 2, zero 3) with hybrid sharding (dp_shard 1: shard
#     groups of the 2 cp ranks, 2 replicas) against it without, within 1e-6;
#   - bf16, concat_reset: cp 2 against cp 1, losses within 1e-4 relative
#     (16-bit activations rounded in another order: the online-softmax merge);
#   - recompute = full at cp 2 logs cp 2's numbers exactly (the ring
#     recomputed bit for bit: to metrics.jsonl's 6 decimals);
#   - loss_on = response (SFT loss masks, `trident prep --format chat`): cp 2
#     against cp 1 within 1e-6, the same loss_tokens (the count of response
#     targets: each cp rank counts its own chunks', summed over data x
#     context);
#   - the start record names cp and keeps dp the data-parallel size;
#   - packing = concat against concat_reset at cp 2 differ (the document
#     masks are on through the ring).
# The emulated CUDA build at cp 2 against the CPU: train_cp_emulated.sh.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
command -v bible >/dev/null || fail "bible-kjv not installed: run make deps"
data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
awk 'NF && n < 1500 {print; print ""; n++}' "$tmp/kjv.txt" > "$tmp/verses.txt" # a verse per document
"$TRIDENT" prep --input "$tmp/verses.txt" --output "$tmp/shards" --vocab-size 510 \
    --val-fraction 0.05 >/dev/null 2>&1 || fail "prep of the verse dataset"
data/make_sft_example.sh "$tmp/pairs.jsonl" 400 >/dev/null || fail "make_sft_example.sh"
"$TRIDENT" prep --input "$tmp/pairs.jsonl" --output "$tmp/chat" --format chat \
    --tokenizer "$tmp/shards/tokenizer.json" --val-fraction 0.1 >/dev/null 2>&1 || fail "prep --format chat"
CP_INI=tests/e2e/configs/cp.ini
STEPS=10

# cp_train NAME TP CP PP DP [overrides...]: 10 steps of cp.ini (on the verses
# unless an override gives data.path); the step records' [step, loss,
# grad_norm, loss_tokens] into $tmp/m-NAME.
cp_train() {
    local name=$1 tp=$2 cp=$3 pp=$4 dp=$5 rc=0 a path=(data.path="$tmp/shards"); shift 5
    for a in "$@"; do [[ "$a" != data.path=* ]] || path=(); done # the overrides' own dataset
    timeout 120 "${MPIRUN[@]}" -np $((tp * cp * pp * dp)) "$TRIDENT" train "$CP_INI" \
        "${path[@]}" parallel.tp="$tp" parallel.cp="$cp" parallel.pp="$pp" parallel.dp="$dp" \
        log.run_dir="$tmp/run-$name" checkpoint.dir="$tmp/ck-$name" "$@" \
        < /dev/null > "$tmp/log-$name" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$name"; fail "$name run exited $rc"; }
    metrics "$tmp/run-$name" '[.step, .loss, .grad_norm, .loss_tokens]' > "$tmp/m-$name"
}
# compare REF OTHER TOL KEYS: every step's loss (KEYS "1") and gradient norm
# (KEYS "1, 2") within TOL relative, beyond metrics.jsonl's printing
# resolution (6 decimals: two values 1e-6 apart may be one rounding apart).
compare() {
    jq -n -r --slurpfile a "$tmp/m-$1" --slurpfile b "$tmp/m-$2" --argjson tol "$3" --arg n "$2 vs $1" \
        --argjson steps "$STEPS" '
        if ($a | length) != $steps or ($b | length) != $steps then
            "FAIL: \($n): \($b | length) steps, reference \($a | length)"
        else ([range($steps) as $i | ('"$4"') as $k | ([(($a[$i][$k] - $b[$i][$k]) | fabs) - 1e-6, 0] | max) / ($a[$i][$k] | fabs)]
              | max) as $w
        | if $w <= $tol then "\($n): \($steps) steps match (worst rel \($w))"
          else "FAIL: \($n): worst rel \($w) > \($tol)" end end'
}

reset=(data.packing=concat_reset)
# name tp cp pp dp overrides
runs="reset1 1 1 1 1 ${reset[*]}
reset2 1 2 1 1 ${reset[*]}
reset2full 1 2 1 1 ${reset[*]} model.recompute=full
reset4 1 4 1 1 ${reset[*]}
sft1 1 1 1 1 data.path=$tmp/chat train.loss_on=response
sft2 1 2 1 1 data.path=$tmp/chat train.loss_on=response
plain1 1 1 1 1 data.packing=concat
plain2 1 2 1 1 data.packing=concat
plain4 1 4 1 1 data.packing=concat
tp2cp2dp2sp 2 2 1 2 ${reset[*]} parallel.sequence_parallel=true
cp2pp2 1 2 2 1 ${reset[*]}
cp2dp2z3 1 2 1 2 ${reset[*]} parallel.zero_stage=3
cp2dp2h 1 2 1 2 ${reset[*]} parallel.zero_stage=3 parallel.dp_shard=1
bf16cp1 1 1 1 1 ${reset[*]} precision.dtype=bf16
bf16cp2 1 2 1 1 ${reset[*]} precision.dtype=bf16"
while read -r name tp cp pp dp extra; do
    # shellcheck disable=SC2086 # extra: the overrides, one word each
    cp_train "$name" "$tp" "$cp" "$pp" "$dp" $extra
done <<<"$runs"

out=$(compare reset1 reset2 1e-6 "1, 2"; compare reset1 reset4 1e-6 "1, 2"
      compare plain1 plain2 1e-6 "1, 2"; compare plain1 plain4 1e-6 "1, 2"
      compare reset1 tp2cp2dp2sp 1e-6 "1, 2"; compare reset1 cp2pp2 1e-6 "1, 2"
      compare reset1 cp2dp2z3 1e-6 "1, 2"; compare cp2dp2z3 cp2dp2h 1e-6 "1, 2"
      compare bf16cp1 bf16cp2 1e-4 1; compare sft1 sft2 1e-6 "1, 2, 3")
echo "$out"
! grep -q FAIL <<<"$out" || fail "a cp layout's losses or norms differ from cp 1"

# Recomputation repeats the ring: the same numbers.
for r in reset2full; do
    cmp -s "$tmp/m-reset2" "$tmp/m-$r" || fail "$r logs other numbers than recompute = none at cp 2"
done
# The records: cp its own size, dp the data-parallel size without it.
got=$(jq -r 'select(.event == "start") | "\(.tp) \(.cp) \(.dp) \(.pp)"' "$tmp/run-tp2cp2dp2sp/metrics.jsonl")
[ "$got" = "2 2 2 1" ] || fail "start record's tp cp dp pp = '$got', expected '2 2 2 1'"
# The document masks reach the ring: concat and concat_reset differ at cp 2.
differ=$(jq -n -r --slurpfile a "$tmp/m-reset2" --slurpfile b "$tmp/m-plain2" \
    '[range(3) as $i | (($a[$i][1] - $b[$i][1]) | fabs) / ($a[$i][1] | fabs)] | max')
echo "cp 2: concat vs concat_reset, largest loss difference $differ relative"
jq -e -n --argjson d "$differ" '$d > 1e-4' >/dev/null || fail "cp 2 logs the same losses with and without document masks"
echo "ok"
