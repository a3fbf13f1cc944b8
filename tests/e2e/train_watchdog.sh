#!/usr/bin/env bash
# train_watchdog.sh: a rank that stops making progress (SIGSTOP: a hang) ends
# the whole job through [system] watchdog_s: exit 1 within a few seconds of
# the timeout, a message naming the rank, no process of the run left.
set -u
cd "$(dirname "$0")/../.."
source tests/e2e/lib/train_env.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small_dataset "$tmp"
( timeout 60 $MPIRUN -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" parallel.dp=2 \
    train.steps=1000000 system.watchdog_s=2 log.run_dir="$tmp/wd-run" > "$tmp/log" 2>&1
  echo "rc=$?" >> "$tmp/log" ) &
for _ in $(seq 1 100); do grep -q '^step ' "$tmp/log" 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f "trident train .*wd-run" | tail -n 1)
[ -n "$victim" ] || { echo "FAIL: no rank found"; exit 1; }
start=$(date +%s)
kill -STOP "$victim"
wait
secs=$(( $(date +%s) - start ))
fail=0
grep -q '^rc=1$' "$tmp/log" || { echo "FAIL: exit $(grep '^rc=' "$tmp/log"), expected 1"; fail=1; }
grep -Eq 'watchdog: no progress for [0-9]+ s' "$tmp/log" || { echo "FAIL: no watchdog message"; fail=1; }
[ "$secs" -le 15 ] || { echo "FAIL: took $secs s"; fail=1; }
mpi_no_leftovers "wd-run" || { echo "FAIL: processes left"; fail=1; }
grep -m1 'watchdog:' "$tmp/log"; echo "ended in $secs s"
exit $fail
