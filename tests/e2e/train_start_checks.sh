#!/usr/bin/env bash
# train_start_checks.sh: what is knowable at start is checked at start, and a
# process that can be told to stop is told properly (issue 27):
#  1. Branch clash: resuming from a copy of step 6 into the checkpoint folder
#     whose latest is step 8 exits 2 within 5 s, the folder untouched;
#     checkpoint.branch = true moves steps 7.. and latest aside and trains on
#     to a step 8 that verifies.
#  2. Launcher mismatch: a singleton with SLURM_NTASKS = 2 inside an srun
#     step (SLURM_STEP_ID) exits 2 before its run folder exists.
#  3. SIGTERM during MPI start-up (a test pause before MPI_Init): exit 3 with
#     a checkpoint of step 1, never 143. Two SIGINTs within a few seconds
#     abort (exit 130).
#  4. SIGINT to the ranks, SIGINT and SIGTERM to mpirun during training: a
#     checkpoint of the last step that verifies, "ended": "signal", and
#     (signals to mpirun) the output saying why it stopped.
#  5. kill -9 of mpirun: no rank is alive 10 s later, and the checkpoint
#     they saved verifies.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
fail=0
run() { # run RUN CK NP [overrides...]: a 2-rank data-parallel run in the background ($!)
    local r=$1 c=$2 np=$3; shift 3
    "${MPIRUN[@]}" -np "$np" "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" parallel.dp="$np" \
        train.eval_every=0 log.run_dir="$r" checkpoint.dir="$c" "$@" >"$r.out" 2>&1
}
# mpirun_of PID / ranks_of PID: the mpirun a background `run` (PID) started,
# and its ranks (waits up to 5 s for them to exist)
mpirun_of() { local m; for _ in $(seq 50); do m=$(pgrep -P "$1" mpirun) && { echo "$m"; return; }; sleep 0.1; done; }
ranks_of() { local r; for _ in $(seq 50); do r=$(pgrep -P "$(mpirun_of "$1")" | tr "\n" " ") && [ "$(wc -w <<<"$r")" -ge 2 ] && { echo "$r"; return; }; sleep 0.1; done; }
verify_latest() { "$TRIDENT" ckpt verify "$1" >/dev/null 2>&1 || { echo "FAIL: $2: latest of $1 does not verify"; fail=1; }; }
ended() { [ "$(jq -r 'select(.done) | .ended' "$1/metrics.jsonl" 2>/dev/null | tail -n 1)" = "$2" ] || { echo "FAIL: $3: the run did not end by $2"; fail=1; }; }

# 1. branch clash
ck=$tmp/ck
run "$tmp/base" "$ck" 2 train.steps=8 checkpoint.every=2 checkpoint.keep_last=0 || fail "base run"
cp -r "$ck/step-000006" "$tmp/copy6"
t0=$(date +%s.%N); rc=0
run "$tmp/clash" "$ck" 2 train.steps=8 checkpoint.resume="$tmp/copy6" checkpoint.every=1 || rc=$?
dt=$(echo "$(date +%s.%N) - $t0" | bc)
[ "$rc" -eq 2 ] || { echo "FAIL: branch clash: exit $rc, expected 2"; fail=1; }
(( $(echo "$dt < 5" | bc) )) || { echo "FAIL: branch clash refused after $dt s (limit 5)"; fail=1; }
grep -q 'from step 6 .*latest is step 8.*checkpoint.branch = true' "$tmp/clash.out" || { cat "$tmp/clash.out"; echo "FAIL: the clash message names neither both steps nor the way out"; fail=1; }
[ "$(cat "$ck/latest")" = step-000008 ] && [ ! -e "$ck/step-000007" ] || { echo "FAIL: the refused branch changed the folder"; fail=1; }
rc=0; run "$tmp/branch" "$ck" 2 train.steps=8 checkpoint.resume="$tmp/copy6" checkpoint.branch=true checkpoint.every=1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/branch.out"; echo "FAIL: checkpoint.branch = true: exit $rc"; fail=1; }
aside=$(ls -d "$ck"/branched-after-step-000006-* 2>/dev/null | head -n 1 || true)
[ -n "$aside" ] && [ -d "$aside/step-000008" ] && [ "$(cat "$aside/latest")" = step-000008 ] || { ls -R "$ck"; echo "FAIL: the later steps were not moved aside"; fail=1; }
[ "$(cat "$ck/latest")" = step-000008 ] && [ -d "$ck/step-000007" ] || { echo "FAIL: the branch did not train on to step 8"; fail=1; }
verify_latest "$ck" "branch"
[ "$(metrics "$tmp/branch" .step 2>/dev/null | head -n 1 || true)" = 7 ] || { echo "FAIL: the branch did not resume at step 7"; fail=1; }

# 2. launcher mismatch: before any file is opened (no run folder)
rc=0; SLURM_NTASKS=2 SLURM_STEP_ID=0 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
    log.run_dir="$tmp/mismatch" >"$tmp/mismatch.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q 'world has 1 rank .*SLURM_NTASKS = 2' "$tmp/mismatch.out" || { cat "$tmp/mismatch.out"; echo "FAIL: SLURM_NTASKS mismatch: exit $rc"; fail=1; }
[ ! -e "$tmp/mismatch" ] || { echo "FAIL: the mismatched run created its run folder"; fail=1; }

# 3. SIGTERM during MPI start-up; two SIGINTs
TRIDENT_TEST_PAUSE_BEFORE_MPI_INIT_S=3 run "$tmp/early" "$tmp/ck-early" 2 train.steps=50 & mp=$!
r=$(ranks_of $mp); sleep 0.5; kill -TERM $r 2>/dev/null || true
rc=0; wait $mp || rc=$?
[ "$rc" -eq 3 ] || { tail -5 "$tmp/early.out"; echo "FAIL: SIGTERM during start-up: exit $rc, expected 3"; fail=1; }
[ "$(cat "$tmp/ck-early/latest" 2>/dev/null)" = step-000001 ] || { echo "FAIL: SIGTERM during start-up: no checkpoint of step 1"; fail=1; }
verify_latest "$tmp/ck-early" "SIGTERM during start-up"
TRIDENT_TEST_PAUSE_BEFORE_MPI_INIT_S=20 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
    log.run_dir="$tmp/int2" >/dev/null 2>&1 & p=$!
sleep 0.5; kill -INT $p; sleep 0.3; kill -INT $p
rc=0; wait $p || rc=$?
[ "$rc" -eq 130 ] || { echo "FAIL: two SIGINTs: exit $rc, expected 130"; fail=1; }

# 4. stops during training: SIGINT to the ranks, SIGTERM to mpirun
# mpirun's wait before its SIGTERM (and again before SIGKILL) at 3 s, as a
# job script that gives a save time sets it (README): the ranks' step lines
# fill the pipe mpirun no longer reads well within it
for how in int-ranks int-mpirun term-mpirun; do
    OMPI_MCA_odls_base_sigkill_timeout=3 run "$tmp/$how" "$tmp/ck-$how" 2 train.steps=100000 & mp=$!
    for _ in $(seq 100); do metrics_at_least "$tmp/$how" 3 && break; sleep 0.2; done
    case $how in
        int-ranks) kill -INT $(ranks_of $mp) ;;
        int-mpirun) kill -INT "$(mpirun_of $mp)" ;;  # mpirun sends the ranks SIGTERM
        term-mpirun) kill -TERM "$(mpirun_of $mp)" ;;
    esac
    rc=0; wait $mp || rc=$?
    # Open MPI 4's mpirun, signalled, stops reading the ranks' output (one
    # step line each step fills its pipe within a second), sends SIGTERM
    # odls_base_sigkill_timeout (1 s) later and SIGKILL 1 s after that: the
    # ranks must neither block on the full pipe nor miss that second
    # (base/tee.h), and the reason reaches the output through stderr.
    # mpirun reports 1 when it was signalled itself (README); the ranks' 3 otherwise
    if [ $how = int-ranks ]; then want=3; else want=1; fi
    [ "$rc" -eq "$want" ] || { echo "FAIL: $how: exit $rc, expected $want"; fail=1; }
    grep -q 'stopped by signal 15 after step [0-9]*, checkpoint saved' "$tmp/$how.out" ||
        [ $how = int-ranks ] || { tail -3 "$tmp/$how.out"; echo "FAIL: $how: the output does not say why the run stopped"; fail=1; }
    ended "$tmp/$how" signal "$how"
    last=$(metrics "$tmp/$how" .step 2>/dev/null | tail -n 1 || true)
    [ "$(cat "$tmp/ck-$how/latest" 2>/dev/null)" = "$(printf 'step-%06d' "$last")" ] || { echo "FAIL: $how: latest is not the last step $last"; fail=1; }
    verify_latest "$tmp/ck-$how" "$how"
done

# 5. kill -9 of mpirun: the ranks stop (saving) instead of training on alone
run "$tmp/orphan" "$tmp/ck-orphan" 2 train.steps=100000 & mp=$!
for _ in $(seq 100); do metrics_at_least "$tmp/orphan" 3 && break; sleep 0.2; done
ranks=$(ranks_of $mp)
kill -9 "$(mpirun_of $mp)"; wait $mp 2>/dev/null || true
for _ in $(seq 50); do
    alive=""; for p in $ranks; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -z "$alive" ] && break; sleep 0.2
done
if [ -n "$alive" ]; then
    echo "FAIL: ranks$alive still alive 10 s after kill -9 of mpirun"; fail=1; kill -9 $alive 2>/dev/null || true
fi
ended "$tmp/orphan" signal "kill -9 of mpirun"
verify_latest "$tmp/ck-orphan" "kill -9 of mpirun"

[ "$fail" -eq 0 ] || exit 1
echo "train_start_checks: all passed"
