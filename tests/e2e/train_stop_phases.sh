#!/usr/bin/env bash
# train_stop_phases.sh: a stop signal is honoured within one unit of work of a
# long phase (issue 27, acceptance 4). SIGTERM to one rank of two during
#  (a) an evaluation of 200000 validation batches after step 2, and
#  (b) a text sample of 200000 tokens (greedy) after a step K, and
#  (c) the same with [checkpoint] async (the save of step K in flight),
#  (d) SIGINT to mpirun during an evaluation, (e) SIGTERM to mpirun
#      during a sample (mpirun's exit is then 1, the ranks' closing record
#      the same, and the output says why the run stopped):
# every rank ends within one batch (one token): exit 3 within 20 s of the
# signal (the whole phase would take many minutes), the closing record says
# `signal 15`, `stopped_in` evaluation (sample), `steps_done` K (the last
# step record) and saved; `latest` is step K (the last completed step),
# `trident ckpt verify` accepts it, and no rank is left behind. Reads exit
# codes, metrics.jsonl and files, not the printed log.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
fail=0

# stop NAME PHASE EVERY [overrides...]: 2 ranks (dp 2), 100 steps (log
# every step), a save every EVERY steps (0 none); SIGTERM to rank 1 once
# metrics.jsonl has shown step 2 and then no new step for 2 s (the run is in
# its long phase); expects the stop in PHASE after the last step recorded.
stop() {
    local name=$1 phase=$2 every=$3; shift 3
    mkdir -p "$tmp/run-$name"
    # samples: 5 ms a token (test hook; the key/value cache made them fast)
    ( rc=0; TRIDENT_TEST_SAMPLE_TOKEN_MS=5 SMALL_TRAIN_TIMEOUT=200 small_train "$tmp/run-$name" "$tmp/ck-$name" 1 1 2 0 train.steps=100 \
          checkpoint.every="$every" "$@" > "$tmp/$name.log" 2>&1 || rc=$?; echo "$rc" > "$tmp/$name.rc" ) &
    local bg=$! seen="" still=0
    for _ in $(seq 1 1200); do metrics_at_least "$tmp/run-$name" 2 && break; sleep 0.1; done
    while [ "$still" -lt 4 ] && kill -0 $bg 2>/dev/null; do
        local now
        now=$(wc -l < "$tmp/run-$name/metrics.jsonl")
        if [ "$now" = "$seen" ]; then still=$((still + 1)); else still=0 seen=$now; fi
        sleep 0.5
    done
    local victim sig=${SIG:-TERM} want_rc=3
    if [ "${TARGET:-rank}" = mpirun ]; then
        # mpirun forwards SIGTERM (for SIGINT too), SIGKILLs the ranks
        # odls_base_sigkill_timeout (1 s) later and exits 1 (README)
        victim=$(pgrep -f "^mpirun .*$tmp/ck-$name" | head -n 1 || true) want_rc=1
    else
        victim=$(pgrep -f "trident train .*$tmp/ck-$name" | tail -n 1 || true)
    fi
    [ -n "$victim" ] || { echo "FAIL: $name: no process to signal"; tail -5 "$tmp/$name.log"; fail=1; wait $bg; return; }
    local t0=$SECONDS
    kill -"$sig" "$victim"
    wait $bg
    local took=$((SECONDS - t0)) rc k
    rc=$(cat "$tmp/$name.rc")
    [ "$rc" = "$want_rc" ] || { echo "FAIL: $name: exit $rc, expected $want_rc"; tail -5 "$tmp/$name.log"; fail=1; }
    [ "$took" -le 20 ] || { echo "FAIL: $name: exited $took s after SIG$sig (not within one $phase unit)"; fail=1; }
    # what the user sees: mpirun's output says why the run stopped
    grep -q "stopped by signal 15 .*checkpoint saved" "$tmp/$name.log" ||
        { echo "FAIL: $name: the output does not say why the run stopped"; tail -3 "$tmp/$name.log"; fail=1; }
    k=$(metrics "$tmp/run-$name" .step | tail -n 1)
    local ended
    ended=$(jq -r 'select(.done) | "\(.ended) \(.signal) \(.stopped_in) \(.steps_done) \(.saved)"' \
        "$tmp/run-$name/metrics.jsonl")
    [ "$ended" = "signal 15 $phase $k true" ] ||
        { echo "FAIL: $name: closing record '$ended', expected 'signal 15 $phase $k true'"; fail=1; }
    [ "$(cat "$tmp/ck-$name/latest" 2>/dev/null)" = "$(printf step-%06d "$k")" ] ||
        { echo "FAIL: $name: latest is '$(cat "$tmp/ck-$name/latest" 2>/dev/null)', expected step $k"; fail=1; }
    "$TRIDENT" ckpt verify "$tmp/ck-$name" > /dev/null || { echo "FAIL: $name: ckpt verify"; fail=1; }
    mpi_no_leftovers "$tmp/ck-$name" > /dev/null || { echo "FAIL: $name: ranks left behind"; fail=1; }
    echo "$name: SIGTERM during the $phase after step $k: exit $rc after $took s"
}

# (a) the evaluation after step 2 (no periodic save: the stop saves step 2)
SMALL_EVAL_EVERY=2 stop eval evaluation 0 train.eval_steps=200000
# (b) a greedy sample after every step (the first ones end at once with an
# end-of-text, until the model's first choice is another token), each step
# saved first: the stop saves nothing twice
stop sample sample 1 train.sample_every=1 train.sample_tokens=200000 train.sample_temperature=0
# (c) the same with each step's save written in the background
# ([checkpoint] async): the stop commits the save in flight, `latest` is K
stop async sample 1 train.sample_every=1 train.sample_tokens=200000 train.sample_temperature=0 \
    checkpoint.async=true
# (d), (e) as a user stops mpirun (Ctrl-C reaching mpirun alone; scancel's
# SIGTERM): mpirun stops reading the ranks' output, waits a second, sends
# SIGTERM and a second later SIGKILL; the ranks end the phase and save in
# that second (base/tee.h: no write to the stalled pipe can hold them)
TARGET=mpirun SIG=INT SMALL_EVAL_EVERY=2 stop mpirun-int-eval evaluation 0 train.eval_steps=200000
TARGET=mpirun SIG=TERM stop mpirun-term-sample sample 1 train.sample_every=1 train.sample_tokens=200000 \
    train.sample_temperature=0
[ "$fail" = 0 ] && echo "PASS: train_stop_phases"
exit "$fail"
