#!/usr/bin/env bash
# run_folder.sh: the run folder keeps its history across a requeue chain
# (issue 14; docs/design.md §9, "The run folder"). One 12-step run on 2 ranks
# (dp 2) in three attempts into one run folder:
#   1. stopped at step 5 by train.exit_interval (checkpoint of step 5);
#   2. resumed at 5 and SIGKILLed after step 8, while saving step 8
#      (TRIDENT_FAULT=kill:h5_create@0 with checkpoint.every=8: rank 0 kills
#      itself as the checkpoint's first file is made, so `latest` stays 5 and
#      metrics.jsonl holds steps 6-8 of an attempt that will be run again);
#   3. resumed at 5 again, to the end.
# Checked against a straight 12-step run in its own folder (the reference):
#   - metrics.jsonl holds every step 1..12 exactly once and its [step, loss]
#     are the straight run's, bit for bit; three start records (steps 0, 5,
#     5; attempts 1, 2, 3; world 2; one thread count per rank; the version
#     of `trident --version`); closing records of attempts 1 (exit_interval,
#     5) and 3 (completed, 12) only;
#   - config-0.ini, config-5.ini and config-5-2.ini (the second start at step
#     5 does not overwrite the first's) and config.ini exist, start with the
#     version line and load (`trident plan`);
#   - train.log holds the three attempts in order (each begins with the
#     version line), attempt 2's step 8 and attempt 3's last step; it equals
#     rank 0's stdout of attempt 3 at its end;
#   - a run that fails on rank 0 after startup has its error in train.log;
#   - a fresh run (checkpoint.resume=none) into that folder moves the old
#     metrics.jsonl aside, byte for byte, and starts a new one;
#   - `trident --version` names the commit of `git rev-parse --short HEAD`
#     when built in a git checkout.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
run=$tmp/run ck=$tmp/ck
# train NAME RUN_DIR CK_DIR [overrides...]: ${STEPS:-12} steps on tp 1 x pp 1 x
# dp 2, checkpoints every ${EVERY:-0} steps, output to $tmp/NAME.out.
train() {
    local name=$1 dir=$2 c=$3; shift 3
    SMALL_TRAIN_TIMEOUT=120 small_train "$dir" "$c" 1 1 2 0 train.steps="${STEPS:-12}" checkpoint.every="${EVERY:-0}" "$@" \
        > "$tmp/$name.out" 2>&1
}
version=$("$TRIDENT" --version)
[[ "$version" =~ ^trident\ [^\ ]+\ \(git\ [^\ ]+\)$ ]] || fail "trident --version printed '$version'"

train straight "$tmp/run-straight" "$tmp/ck-straight" || fail "straight run: $(tail -3 "$tmp/straight.out")"
train a1 "$run" "$ck" train.exit_interval=5 || fail "attempt 1: $(tail -3 "$tmp/a1.out")"
rc=0
TRIDENT_FAULT=kill:h5_create@0 EVERY=8 train a2 "$run" "$ck" || rc=$?
[ "$rc" -ne 0 ] || fail "attempt 2 was not killed"
[ "$(cat "$ck/latest")" = step-000005 ] || fail "attempt 2 left latest = $(cat "$ck/latest")"
metrics_at_least "$run" 8 || { cat "$tmp/a2.out"; cat "$run/metrics.jsonl"; fail "attempt 2 did not log step 8"; }
echo "attempt 2 killed (exit $rc) while saving step 8; metrics.jsonl then held steps $(metrics "$run" .step | paste -sd' ')"
cp "$run/metrics.jsonl" "$tmp/metrics-after-a2.jsonl"
train a3 "$run" "$ck" || fail "attempt 3: $(tail -3 "$tmp/a3.out")"

# metrics.jsonl: one curve, the straight run's
got=$(metrics "$run" '[.step, .loss]' | paste -sd' ')
want=$(metrics "$tmp/run-straight" '[.step, .loss]' | paste -sd' ')
[ "$(metrics "$run" .step | paste -sd' ')" = "$(seq -s' ' 1 12)" ] || fail "steps in metrics.jsonl: $(metrics "$run" .step | paste -sd' ')"
[ "$got" = "$want" ] || fail "losses differ from the straight run: got $got, want $want"
starts=$(jq -c 'select(.event == "start") | [.step, .attempt, .world_size, .tp, .pp, .dp, (.threads | length), (.threads | min >= 1)]' "$run/metrics.jsonl" | paste -sd' ')
[ "$starts" = "[0,1,2,1,1,2,2,true] [5,2,2,1,1,2,2,true] [5,3,2,1,1,2,2,true]" ] || fail "start records: $starts"
[ "$(jq -r 'select(.event == "start") | "trident \(.version) (git \(.git))"' "$run/metrics.jsonl" | sort -u)" = "$version" ] ||
    fail "start records' version differs from '$version'"
[ "$(jq -r 'select(.event == "start") | .time' "$run/metrics.jsonl" | sort -n | paste -sd' ')" = \
  "$(jq -r 'select(.event == "start") | .time' "$run/metrics.jsonl" | paste -sd' ')" ] || fail "start times out of order"
closing=$(jq -c 'select(.done) | [.ended, .steps_done]' "$run/metrics.jsonl" | paste -sd' ')
[ "$closing" = '["exit_interval",5] ["completed",12]' ] || fail "closing records: $closing"
# The first start record comes first; every record of attempt 3 after its start record.
[ "$(head -n 1 "$run/metrics.jsonl" | jq -r .event)" = start ] || fail "metrics.jsonl does not begin with a start record"
[ "$(jq -c 'select(.event == "start" or (has("loss") and .step > 5)) | .event // .step' "$run/metrics.jsonl" | paste -sd' ')" = \
  '"start" "start" "start" 6 7 8 9 10 11 12' ] || fail "attempt 3's steps do not follow its start record"
[ ! -e "$run/metrics.jsonl.tmp" ] || fail "metrics.jsonl.tmp left behind"
echo "metrics.jsonl: steps 1-12 once each, losses == the straight run's; starts at 0, 5, 5 (attempts 1-3)"

# configs of each start
for f in config.ini config-0.ini config-5.ini config-5-2.ini; do
    [ -f "$run/$f" ] || fail "$f missing (run folder: $(ls "$run" | paste -sd' '))"
    [ "$(head -n 1 "$run/$f")" = "# $version" ] || fail "$f begins with '$(head -n 1 "$run/$f")'"
    "$TRIDENT" plan "$run/$f" > "$tmp/plan.out" 2>&1 || fail "$f does not load: $(tail -2 "$tmp/plan.out")"
done
[ ! -e "$run/config-5-3.ini" ] && [ ! -e "$run/config-12.ini" ] || fail "unexpected configs: $(ls "$run")"
grep -q '^# .*attempt 3) at step 5, world size 2 = tp 1 x cp 1 x ep 1 x dp_shard 2 x dp_replicate 1 x pp 1$' "$run/config.ini" || fail "config.ini is not attempt 3's: $(head -3 "$run/config.ini")"
grep -q '(attempt 1) at step 0' "$run/config-0.ini" && grep -q '(attempt 2) at step 5' "$run/config-5.ini" &&
    grep -q '(attempt 3) at step 5' "$run/config-5-2.ini" || fail "config-<step>.ini headers name other attempts"
echo "configs: config.ini, config-0.ini, config-5.ini, config-5-2.ini; each loads"

# train.log: the three attempts, one after the other
log=$run/train.log
[ "$(grep -cxF "$version" "$log")" -eq 3 ] || fail "train.log: $(grep -c '^trident ' "$log") version lines, expected 3"
[ "$(head -n 1 "$log")" = "$version" ] || fail "train.log begins with '$(head -n 1 "$log")'"
[ "$(head -n 1 "$tmp/a1.out")" = "$version" ] || fail "the log's first line is '$(head -n 1 "$tmp/a1.out")'"
[ "$(grep -o '^start: attempt [0-9]* at step [0-9]*' "$log" | paste -sd,)" = \
  "start: attempt 1 at step 0,start: attempt 2 at step 5,start: attempt 3 at step 5" ] || fail "train.log's start lines: $(grep '^start:' "$log")"
grep -q '^exit_interval 5: stopping after step 5' "$log" || fail "train.log lacks attempt 1's end"
grep -q '^step     8/12 | loss' "$log" || fail "train.log lacks attempt 2's step 8"
a3_start=$(grep -nxF "$version" "$log" | tail -n 1 | cut -d: -f1)
tail -n +"$a3_start" "$log" > "$tmp/a3.log"
# Attempt 3's part of train.log is rank 0's output: every line of it is in
# the job's output (which also has mpirun's and other ranks' lines).
missing=$(grep -vxF -f "$tmp/a3.out" "$tmp/a3.log" | head -3 || true)
[ -z "$missing" ] || fail "train.log has lines attempt 3 did not print: $missing"
grep -q '^step    12/12 | loss' "$tmp/a3.log" && grep -q '^done: 7 steps' "$tmp/a3.log" || fail "train.log lacks attempt 3's end"
echo "train.log: 3 attempts ($(wc -l < "$log") lines); attempt 3's part == its rank 0 output"

# A failure on rank 0 after startup (no dataset) is in train.log too.
rc=0
"$TRIDENT" train "$SMALL_INI" data.path="$tmp/no-such-data" log.run_dir="$tmp/run-bad" > "$tmp/bad.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "a run without data exited $rc"
msg=$(grep -m1 'no-such-data' "$tmp/bad.out") || fail "no error naming the dataset: $(cat "$tmp/bad.out")"
grep -qxF "$msg" "$tmp/run-bad/train.log" || fail "train.log lacks the error '$msg': $(cat "$tmp/run-bad/train.log")"
echo "a failing run's error is in its train.log"

# A fresh run into the folder: the old metrics are moved aside, unchanged.
cp "$run/metrics.jsonl" "$tmp/chain.jsonl"
STEPS=2 train fresh "$run" "$tmp/ck-fresh" train.warmup_steps=1 checkpoint.resume=none || fail "fresh run: $(tail -3 "$tmp/fresh.out")"
aside=$(ls "$run" | grep -E '^metrics-[0-9]{8}-[0-9]{6}\.jsonl$' || true)
[ "$(printf '%s\n' "$aside" | grep -c .)" -eq 1 ] || fail "expected one metrics-<time>.jsonl, found: $(ls "$run" | paste -sd' ')"
cmp -s "$tmp/chain.jsonl" "$run/$aside" || fail "$aside differs from the chain's metrics.jsonl"
grep -q "moved to $run/$aside" "$tmp/fresh.out" || fail "the fresh run does not say where the old metrics went"
[ "$(metrics "$run" .step | paste -sd' ')" = "1 2" ] && [ "$(jq -c 'select(.event == "start") | [.step, .attempt]' "$run/metrics.jsonl")" = "[0,1]" ] ||
    fail "the fresh run's metrics.jsonl: $(cat "$run/metrics.jsonl")"
echo "fresh run: the chain's metrics moved to $aside, byte for byte"

# trident --version names the checkout's commit.
if command -v git >/dev/null && [ -e .git ]; then
    head=$(git rev-parse --short HEAD)
    [[ "$version" =~ \(git\ $head(-dirty)?\)$ ]] || fail "trident --version says '$version', HEAD is $head (rebuild: make)"
    echo "trident --version: $version (HEAD $head)"
else
    echo "not a git checkout: trident --version says $version"
fi
echo "run_folder: ok"
