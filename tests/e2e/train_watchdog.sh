#!/usr/bin/env bash
# train_watchdog.sh: a rank that stops making progress (SIGSTOP: a hang) ends
# the whole job through [system] watchdog_s: exit 1 within a few seconds of
# the timeout, a message naming the rank, no process of the run left.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
( rc=0
  timeout 60 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" parallel.dp=2 \
    train.steps=1000000 system.watchdog_s=2 log.run_dir="$tmp/wd-run" > "$tmp/log" 2>&1 || rc=$?
  echo "$rc" > "$tmp/rc" ) &
# Training has started once metrics.jsonl holds the first step.
for _ in $(seq 1 100); do metrics_at_least "$tmp/wd-run" 1 && break; sleep 0.1; done
victim=$(pgrep -f "trident train .*$tmp/wd-run" | tail -n 1 || true)
[ -n "$victim" ] || fail "no rank found"
start=$(date +%s)
kill -STOP "$victim"
wait
secs=$(( $(date +%s) - start ))
fail=0
[ "$(cat "$tmp/rc")" = 1 ] || { echo "FAIL: exit $(cat "$tmp/rc"), expected 1"; fail=1; }
grep -Eq 'watchdog: no progress for [0-9]+ s' "$tmp/log" || { echo "FAIL: no watchdog message"; fail=1; }
[ "$secs" -le 15 ] || { echo "FAIL: took $secs s"; fail=1; }
mpi_no_leftovers "$tmp/wd-run" || { echo "FAIL: processes left"; fail=1; }
grep -m1 "watchdog:" "$tmp/log" || true; echo "ended in $secs s"
exit $fail
