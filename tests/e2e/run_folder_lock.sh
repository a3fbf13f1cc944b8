#!/usr/bin/env bash
# run_folder_lock.sh: a second run into a run folder or a checkpoint folder
# that a live run holds is refused (run_folder_lock, src/train/run_folder.h;
# docs/design.md §9), and the live run's files are left alone:
#   1. run A (2 ranks) trains into run/ and ck/; once it has logged a step,
#   2. run B into the same run/ exits 2 within seconds on every rank, its
#      message naming [log] run_dir and A's pid; nothing of B reaches A's
#      train.log or metrics.jsonl;
#   3. run C into another run folder but A's ck/ exits 2 naming
#      [checkpoint] dir;
#   4. A, killed with SIGKILL (no cleanup), does not keep the folders locked:
#      run D resumes from A's checkpoint in run/ and ck/ and completes.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
run=$tmp/run ck=$tmp/ck
# A: many steps with a checkpoint every 2, so it is alive while B and C start.
SMALL_TRAIN_TIMEOUT=300 small_train "$run" "$ck" 1 1 2 0 train.steps=100000 checkpoint.every=2 \
    > "$tmp/a.out" 2>&1 &
a_pid=$!
# On exit A is gone, whatever happened (the trap's own failures, with set -e,
# would become the test's exit status: hence set +e).
cleanup() {
    set +e
    pkill -KILL -P "$a_pid" 2>/dev/null
    kill -KILL "$a_pid" 2>/dev/null
    # mpirun and the ranks outlive a killed timeout: anything naming this
    # test's folder goes too (a failed check left run A training on)
    pkill -KILL -f "$tmp/" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$tmp"
    return 0
}
trap cleanup EXIT
for _ in $(seq 600); do
    metrics_at_least "$run" 3 && [ -e "$ck/latest" ] && break
    kill -0 "$a_pid" 2>/dev/null || { cat "$tmp/a.out"; fail "run A ended before step 3"; }
    sleep 0.1
done
metrics_at_least "$run" 3 || fail "run A logged no step 3 in 60 s"
holder=$(sed -n 's/.*pid \([0-9]*\),.*/\1/p' "$run/.trident.lock")
[ -n "$holder" ] && kill -0 "$holder" || fail "$run/.trident.lock names no live process: $(cat "$run/.trident.lock")"
log_lines=$(grep -c '' "$run/train.log")
starts=$(jq -c 'select(.event == "start")' "$run/metrics.jsonl" | grep -c '')

# B: same run folder (and checkpoint folder).
t0=$(date +%s)
rc=0; SMALL_TRAIN_TIMEOUT=60 small_train "$run" "$ck" 1 1 2 0 train.steps=8 > "$tmp/b.out" 2>&1 || rc=$?
secs=$(( $(date +%s) - t0 ))
[ "$rc" -eq 2 ] || { cat "$tmp/b.out"; fail "run B into A's run folder exited $rc, want 2"; }
[ "$secs" -le 20 ] || fail "run B took $secs s to be refused"
grep -q "\[log\] run_dir = $run is in use by another trident run (host [^,]*, pid $holder," "$tmp/b.out" ||
    { cat "$tmp/b.out"; fail "run B's message does not name [log] run_dir and A's pid $holder"; }
kill -0 "$a_pid" 2>/dev/null || fail "run A died while B was refused"
grep -q "in use by another" "$run/train.log" && fail "run B's refusal reached A's train.log"
now_starts=$(jq -c 'select(.event == "start")' "$run/metrics.jsonl" | grep -c '')
[ "$now_starts" = "$starts" ] || fail "run B added a start record to A's metrics.jsonl ($starts -> $now_starts)"
[ "$(grep -c '' "$run/train.log")" -ge "$log_lines" ] || fail "A's train.log shrank"

# C: its own run folder, A's checkpoint folder.
rc=0; SMALL_TRAIN_TIMEOUT=60 small_train "$tmp/run-c" "$ck" 1 1 2 0 train.steps=8 > "$tmp/c.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat "$tmp/c.out"; fail "run C into A's checkpoint folder exited $rc, want 2"; }
grep -q "\[checkpoint\] dir = $ck is in use by another trident run (host [^,]*, pid $holder," "$tmp/c.out" ||
    { cat "$tmp/c.out"; fail "run C's message does not name [checkpoint] dir and A's pid"; }

# A killed without cleanup; D resumes in the same folders.
pkill -KILL -P "$a_pid" 2>/dev/null || true
kill -KILL "$a_pid" 2>/dev/null || true
wait "$a_pid" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$holder" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$holder" 2>/dev/null || true
last=$(sed -n 's/step-0*//p' "$ck/latest")
rc=0; SMALL_TRAIN_TIMEOUT=120 small_train "$run" "$ck" 1 1 2 0 train.steps=$((last + 2)) \
    train.override_schedule=true > "$tmp/d.out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/d.out"; fail "run D after A was killed exited $rc"; }
jq -c --argjson s "$last" 'select(.event == "start" and .step == $s)' "$run/metrics.jsonl" | grep -q . ||
    { cat "$tmp/d.out"; jq -c "select(.event == \"start\")" "$run/metrics.jsonl"; fail "run D did not resume at A's step $last"; }
echo "B refused in $secs s naming A (pid $holder); C refused on the checkpoint folder; D resumed at step $last after A's SIGKILL"
