#!/usr/bin/env bash
# train_blend.sh: the loader state in samples and dataset blending in real
# training runs (issue 13, acceptance 5 and 6). The served samples are read
# from TRIDENT_LOG_SAMPLES (one line "epoch position dataset sequence" per
# sample, per DP rank), the numbers from metrics.jsonl.
#  1. 2 steps at global_batch_size = 4, then a resume at 8: the resumed run
#     serves positions 8-15 of epoch 0, and the 16 samples of the two runs
#     are exactly those of a straight run of 4 steps at 4 (each sequence
#     once). A resume with another seq_len or seed exits 2 naming the old
#     and new value (trainer_resume_compare's list). A checkpoint with the older batch-index loader state
#     (rewritten with h5py) resumes at sample 8 too.
#  2. [data] paths = A:0.7, B:0.3 (B prepped with A's tokenizer): over 1,000
#     samples (25 steps of 40) dataset A's share is 0.7 +- 0.02, every sample
#     valid, no sequence twice within an epoch of its dataset; the first 6
#     steps of the mixture are the same (dataset, sequence) per position for
#     dp = 1, 2 and 4; 6 steps stopped at 3 and resumed give the straight
#     run's losses bit for bit and the same samples. A dataset made with
#     another tokenizer is refused naming both folders; a malformed paths
#     value, or path and paths both set, is refused naming the keys. The run
#     folder's config.ini of a blend loads again (`trident plan` of it) and
#     `generate` of the run folder's checkpoints finds the blend's tokenizer.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
A=$tmp/shards B=$tmp/b
awk 'BEGIN{RS=""; ORS="\n\n"} NR > 150 && NR <= 260' "$tmp/kjv.txt" > "$tmp/b.txt"
"$TRIDENT" prep --input "$tmp/b.txt" --output "$B" --tokenizer "$A/tokenizer.json" --val-fraction 0.05 \
    >/dev/null 2>&1 || fail "prep of dataset B"
"$TRIDENT" prep --input "$tmp/b.txt" --output "$tmp/other" --vocab-size 510 >/dev/null 2>&1 ||
    fail "prep of the other-tokenizer dataset"

# train NAME NP [overrides...]: a run with its samples appended to $tmp/NAME.samples
train() {
    local name=$1 np=$2; shift 2
    mkdir -p "$tmp/run-$name"
    TRIDENT_LOG_SAMPLES="$tmp/$name.samples" timeout 300 "${MPIRUN[@]}" -np "$np" "$TRIDENT" train \
        "$SMALL_INI" parallel.dp="$np" train.eval_every=0 checkpoint.every=0 checkpoint.keep_last=0 train.warmup_steps=1 \
        log.run_dir="$tmp/run-$name" "$@" >> "$tmp/$name.log" 2>&1
}
bad=0
# 1. a changed global batch size
train gb-straight 1 data.path="$A" train.global_batch_size=4 train.steps=4 || fail "straight run: $(tail -3 "$tmp/gb-straight.log")"
train gb 1 data.path="$A" train.global_batch_size=4 train.steps=2 checkpoint.dir="$tmp/ck-gb" ||
    fail "first run: $(tail -3 "$tmp/gb.log")"
# (steps 2 -> 3 changes the LR schedule: train.override_schedule; the samples do not depend on it)
train gb 1 data.path="$A" train.global_batch_size=8 train.steps=3 checkpoint.dir="$tmp/ck-gb" train.override_schedule=true ||
    fail "resume at 8: $(tail -3 "$tmp/gb.log")"
[ "$(wc -l < "$tmp/gb.samples")" -eq 16 ] || fail "2 steps of 4 + 1 of 8 served $(wc -l < "$tmp/gb.samples") samples"
[ "$(sed -n 9p "$tmp/gb.samples" | cut -d' ' -f1,2)" = "0 8" ] || fail "the resumed run starts at $(sed -n 9p "$tmp/gb.samples")"
cmp -s "$tmp/gb.samples" "$tmp/gb-straight.samples" ||
    fail "G 4 -> 8 serves other samples than the straight run: $(diff "$tmp/gb-straight.samples" "$tmp/gb.samples" | head -5)"
[ "$(cut -d' ' -f1,4 "$tmp/gb.samples" | sort -u | wc -l)" -eq 16 ] || fail "a sequence served twice in epoch 0"
echo "global batch 4 -> 8: the resumed run serves positions 8-15 of epoch 0, as the straight run"
# An older checkpoint (loader = seed, epoch, batch index, micro; no
# loader_samples) of those 2 steps at 4 resumes at 4 from sample 8. Its
# manifest checksum is updated from ckpt verify's message.
cp -r "$tmp/ck-gb" "$tmp/ck-old"
rm -rf "$tmp/ck-old/step-000003"; echo step-000002 > "$tmp/ck-old/latest"
"$PY" - "$tmp/ck-old/step-000002/rank-00000.h5" <<'PYEOF' || fail "rewriting the loader state as format 1"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    g = f["state"]
    s = g.attrs["loader_samples"]  # format, seed, epoch, sample, micro, ...
    assert list(s[:5]) == [2, 7, 0, 8, 0] and s[7] == 4, s[:8]
    del g.attrs["loader_samples"], g.attrs["loader_weights"]
    g.attrs.create("loader", np.array([s[1], s[2], s[3] // 4, s[4]], dtype=np.uint64))
PYEOF
sum=$( ("$TRIDENT" ckpt verify "$tmp/ck-old" 2>&1 || true) | sed -n 's/.*checksum \(xxh3-64:[0-9a-f]*\), manifest.ini says \(xxh3-64:[0-9a-f]*\).*/\1 \2/p')
[ -n "$sum" ] || fail "ckpt verify did not report the changed checksum"
sed -i "s/${sum#* }/${sum% *}/" "$tmp/ck-old/step-000002/manifest.ini"
train old 1 data.path="$A" train.global_batch_size=4 train.steps=4 checkpoint.dir="$tmp/ck-old" train.override_schedule=true ||
    fail "resume from a format 1 loader state: $(tail -3 "$tmp/old.log")"
cmp -s "$tmp/old.samples" <(sed -n 9,16p "$tmp/gb-straight.samples") ||
    fail "a format 1 loader state resumes elsewhere: $(head -2 "$tmp/old.samples")"
echo "an older (batch-index) checkpoint resumes at sample 8"
for change in train.seq_len=16:"train.seq_len 32 -> 16" train.seed=8:"train.seed 7 -> 8"; do
    rc=0
    "$TRIDENT" train "$SMALL_INI" data.path="$A" train.global_batch_size=8 train.steps=4 train.eval_every=0 train.warmup_steps=1 \
        checkpoint.dir="$tmp/ck-gb" log.run_dir="$tmp/run-refused" "${change%%:*}" > "$tmp/refused.log" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q "${change#*:}" "$tmp/refused.log" ||
        { echo "FAIL: ${change%%:*}: exit $rc, expected 2 and '${change#*:}': $(tail -2 "$tmp/refused.log")"; bad=1; }
done

# 2. blending
mix=(data.paths="$A:0.7, $B:0.3")
train mix1000 1 "${mix[@]}" train.global_batch_size=40 train.micro_batch_size=20 train.steps=25 ||
    fail "blend run: $(tail -3 "$tmp/mix1000.log")"
# Train sequences of a dataset at seq_len 32 (data-check's report).
nseq() { "$TRIDENT" data-check "$1" --seq-len 32 | sed -n 's/^train: .*, \([0-9][0-9]*\) sequences of seq_len.*/\1/p'; }
nA=$(nseq "$A") nB=$(nseq "$B")
[ -n "$nA" ] && [ -n "$nB" ] || fail "data-check gave no sequence counts ($nA, $nB)"
awk -v nA="$nA" -v nB="$nB" '
    { n++; c[$3]++; if ($2 != n - 1) gap++; k = $3 " " $4; e = int((c[$3] - 1) / ($3 == 0 ? nA : nB));
      if ((k in seen) && seen[k] == e) dup++; seen[k] = e; if ($3 != 0 && $3 != 1) badd++ }
    END { share = c[0] / n; printf "blend over %d samples: dataset A %d (share %.4f), B %d\n", n, c[0], share, c[1];
          if (n != 1000 || share < 0.68 || share > 0.72 || gap || dup || badd) {
              printf "FAIL: n %d share %.4f gaps %d repeats %d bad datasets %d\n", n, share, gap, dup, badd; exit 1 } }
' "$tmp/mix1000.samples" || bad=1
for dp in 1 2 4; do
    train "mix-dp$dp" $dp "${mix[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.steps=6 ||
        fail "blend dp $dp: $(tail -3 "$tmp/mix-dp$dp.log")"
    sort -n -k2,2 "$tmp/mix-dp$dp.samples" > "$tmp/mix-dp$dp.sorted"
done
[ "$(wc -l < "$tmp/mix-dp1.sorted")" -eq 48 ] || fail "dp 1 served $(wc -l < "$tmp/mix-dp1.sorted") samples, expected 48"
for dp in 2 4; do
    cmp -s "$tmp/mix-dp1.sorted" "$tmp/mix-dp$dp.sorted" ||
        { echo "FAIL: the mixture of dp $dp differs from dp 1: $(diff "$tmp/mix-dp1.sorted" "$tmp/mix-dp$dp.sorted" | head -3)"; bad=1; }
done
train mix-stop 1 "${mix[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.steps=6 \
    train.exit_interval=3 checkpoint.dir="$tmp/ck-mix" || fail "blend stopped run: $(tail -3 "$tmp/mix-stop.log")"
train mix-stop 1 "${mix[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.steps=6 \
    checkpoint.dir="$tmp/ck-mix" || fail "blend resumed run: $(tail -3 "$tmp/mix-stop.log")"
straight=$(metrics "$tmp/run-mix-dp1" '[.step, .loss]' | paste -sd' ')
# One run folder: the resumed run appends to the stopped run's metrics.jsonl.
resumed=$(metrics "$tmp/run-mix-stop" '[.step, .loss]' | paste -sd' ')
[ -n "$straight" ] && [ "$straight" = "$resumed" ] ||
    { echo "FAIL: blend resume not bit-exact: straight $straight, resumed $resumed"; bad=1; }
cmp -s "$tmp/mix-dp1.samples" "$tmp/mix-stop.samples" || { echo "FAIL: the resumed blend serves other samples"; bad=1; }
echo "blend: dp 1, 2, 4 serve one mixture; stopped at 3 and resumed: the straight run's losses ($straight)"
# The run folder's config.ini of a blend loads and validates again (plan), and
# generate finds the blend's tokenizer through it (the run folder's layout:
# RUN/config.ini, RUN/checkpoints).
rc=0; "$TRIDENT" plan "$tmp/run-mix-stop/config.ini" > "$tmp/plan-mix.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: plan of the blend's run folder config.ini: exit $rc: $(tail -2 "$tmp/plan-mix.log")"; bad=1; }
cp -r "$tmp/ck-mix" "$tmp/run-mix-stop/checkpoints"
rc=0; "$TRIDENT" generate "$tmp/run-mix-stop/checkpoints" --prompt "In the" --max-new-tokens 2 > "$tmp/gen-mix.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: generate from the blend's run folder without --tokenizer: exit $rc: $(tail -2 "$tmp/gen-mix.log")"; bad=1; }
# A blend through the hot tier: each dataset staged into its own cache
# folder, the same samples and losses as without the cache.
train mix-cache 2 "${mix[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.steps=6 \
    data.cache_dir="$tmp/cache" data.prefetch_shards=8 || fail "blend with cache_dir: $(tail -3 "$tmp/mix-cache.log")"
sort -n -k2,2 "$tmp/mix-cache.samples" | cmp -s - "$tmp/mix-dp2.sorted" ||
    { echo "FAIL: the blend through the cache serves other samples"; bad=1; }
[ "$(metrics "$tmp/run-mix-cache" '[.step, .loss]' | paste -sd' ')" = "$(metrics "$tmp/run-mix-dp2" '[.step, .loss]' | paste -sd' ')" ] ||
    { echo "FAIL: the blend through the cache has other losses"; bad=1; }
folders=$(find "$tmp/cache" -mindepth 2 -maxdepth 2 -name '*.h5' -printf '%h\n' | sort -u | wc -l)
[ "$folders" -eq 2 ] || { echo "FAIL: the cache holds staged shards in $folders folders, expected one per dataset (2)"; bad=1; }
rc=0
"$TRIDENT" train "$SMALL_INI" data.paths="$A:0.7, $tmp/other:0.3" train.steps=1 train.warmup_steps=1 log.run_dir="$tmp/run-x" > "$tmp/x.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "$tmp/other/index.ini has tokenizer" "$tmp/x.log" && grep -q "but $A/index.ini" "$tmp/x.log" ||
    { echo "FAIL: another tokenizer: exit $rc: $(tail -2 "$tmp/x.log")"; bad=1; }
rc=0
"$TRIDENT" train "$SMALL_INI" data.paths="$A:0.7, $B:zero" train.steps=1 train.warmup_steps=1 log.run_dir="$tmp/run-x" > "$tmp/x.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "\[data\] paths = .*weight 'zero' is not a number > 0" "$tmp/x.log" ||
    { echo "FAIL: a bad weight: exit $rc: $(tail -2 "$tmp/x.log")"; bad=1; }
rc=0
"$TRIDENT" train "$SMALL_INI" data.path="$A" data.paths="$A:0.7, $B:0.3" train.steps=1 train.warmup_steps=1 \
    log.run_dir="$tmp/run-x" > "$tmp/x.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "set one of \[data\] path and paths" "$tmp/x.log" ||
    { echo "FAIL: path and paths both set: exit $rc: $(tail -2 "$tmp/x.log")"; bad=1; }
[ "$bad" -eq 0 ] || exit 1
echo "train_blend: pass"
