#!/usr/bin/env bash
# train_watchdog.sh: a rank that stops making progress (SIGSTOP: a hang) ends
# the whole job through [system] watchdog_s: exit 1 within a few seconds of
# the timeout, a message naming the rank, its host and the phase it was in
# ("step N: ..."; no evaluation in that run, so a fast machine cannot stop
# it between steps), no process of the run left. And a legitimate long phase is
# progress: a dp = 2 run whose samples (every rank samples; a kick per token)
# take several times watchdog_s completes (exit 0, both samples printed).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
( rc=0
  timeout 60 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" parallel.dp=2 \
    train.steps=1000000 train.eval_every=0 system.watchdog_s=2 log.run_dir="$tmp/wd-run" > "$tmp/log" 2>&1 || rc=$?
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
grep -Eq 'rank [01], host [^]]+\] watchdog: no progress for [0-9]+ s .* in phase "step [0-9]+: [^"]+"' "$tmp/log" ||
    { echo "FAIL: no watchdog message naming the rank, host and phase"; fail=1; }
[ "$secs" -le 15 ] || { echo "FAIL: took $secs s"; fail=1; }
mpi_no_leftovers "$tmp/wd-run" || { echo "FAIL: processes left"; fail=1; }
grep -m1 "watchdog:" "$tmp/log" || true; echo "ended in $secs s"

# Sampling: up to 400 tokens (an end-of-text ends one early), each made 8 ms
# long by the test hook TRIDENT_TEST_SAMPLE_TOKEN_MS (the key/value cache
# makes this model's tokens take microseconds) against watchdog_s = 1; steps
# 1-4 sample (idle: 92, 400, 219 and 400 tokens; 3.2 s for 400). At least one
# sample must last over 2 x watchdog_s (else this proves nothing); the
# duration is the one the sample line prints.
rc=0
TRIDENT_TEST_SAMPLE_TOKEN_MS=8 timeout 120 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" parallel.dp=2 \
    train.steps=4 train.warmup_steps=1 train.sample_every=1 train.sample_tokens=400 system.watchdog_s=1 \
    train.seq_len=64 train.micro_batch_size=32 train.global_batch_size=64 \
    log.run_dir="$tmp/wd-sample" > "$tmp/log-sample" 2>&1 || rc=$?
samples=$(grep -ac '| sample (' "$tmp/wd-sample/train.log" || true)
longest=$(grep -ao '| sample ([0-9]* tokens, [0-9.]* s)' "$tmp/wd-sample/train.log" |
          sed 's/.*, \([0-9.]*\) s)/\1/' | sort -g | tail -n 1)
if [ "$rc" -ne 0 ] || [ "$samples" -ne 4 ]; then
    tail -5 "$tmp/log-sample"; echo "FAIL: the sampling run exited $rc with $samples samples (expected 0, 4)"; fail=1
elif ! awk -v s="${longest:-0}" 'BEGIN{exit !(s > 2)}'; then
    echo "FAIL: the longest sample took ${longest:-?} s, not over 2 x watchdog_s: raise sample_tokens"; fail=1
else
    # The samples were printed as text: the log is valid UTF-8 without NUL or
    # other control bytes (invalid sequences became U+FFFD).
    python3 -c 'import sys, re; t = open(sys.argv[1], "rb").read().decode("utf-8")
assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", t), "control byte in train.log"' "$tmp/wd-sample/train.log" ||
        { echo "FAIL: train.log of the sampling run is not text"; fail=1; }
    echo "ok: samples of up to $longest s against watchdog_s = 1 completed ($(grep -a '^done:' "$tmp/wd-sample/train.log"))"
fi
exit $fail
