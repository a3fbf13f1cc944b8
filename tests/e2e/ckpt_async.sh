#!/usr/bin/env bash
# ckpt_async.sh: [checkpoint] async (docs/design.md §7 "Asynchronous saves")
# on 2 ranks (dp=2, ZeRO-1: each rank writes its own moment shard), small.ini:
#  1. steps 1-6 saving every 2 steps, synchronous and asynchronous: the rank
#     files and manifests of steps 2 and 4 (written in the background) are
#     byte-identical to the synchronous ones, the losses are the same, and the
#     step records say which saves were asynchronous;
#  2. a resume from the asynchronous step-000004 continues bit-exact: its
#     step-000006 is byte-identical to the straight synchronous run's;
#  3. a failed fsync of rank 1's file in the background write of step 4
#     (TRIDENT_FAULT=fsync:2@1): every rank exits 1 naming rank 1 and its
#     reason, within one step of the failure; `latest` stays step-000002 and verifies;
#  4. SIGTERM while rank 1's background write of step 4 stalls
#     (TRIDENT_FAULT=stall:ckpt_async_write:2@1): the stop waits for that
#     save to commit (its record's wait_s says how long), then saves its own
#     step; exit 3, both verify;
#  5. the emulated CUDA build (device-to-host snapshot): as 1.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
fail=0
common=(checkpoint.keep_last=0)
run() { # NAME [key=value ...]
    local name=$1; shift
    small_train "$tmp/run-$name" "$tmp/ck-$name" 1 1 2 1 "${common[@]}" "$@" >"$tmp/$name.log" 2>&1
}

# 1. byte identity
run sync checkpoint.async=false train.steps=6 checkpoint.every=2 || { tail -30 "$tmp/sync.log"; fail "sync run"; }
run async checkpoint.async=true train.steps=6 checkpoint.every=2 || { tail -5 "$tmp/async.log"; fail "async run"; }
for s in 000002 000004 000006; do
    for f in manifest.ini rank-00000.h5 rank-00001.h5; do
        cmp -s "$tmp/ck-sync/step-$s/$f" "$tmp/ck-async/step-$s/$f" ||
            { echo "FAIL: step-$s/$f differs between the synchronous and the asynchronous save"; fail=1; }
    done
done
[ "$(metrics "$tmp/run-sync" .loss)" = "$(metrics "$tmp/run-async" .loss)" ] ||
    { echo "FAIL: the losses differ with checkpoint.async"; fail=1; }
got=$(jq -r 'select(.event == "checkpoint") | "\(.step):\(.async)"' "$tmp/run-async/metrics.jsonl" | tr '\n' ' ')
[ "$got" = "2:true 4:true 6:false " ] || { echo "FAIL: checkpoint records '$got'"; fail=1; }
got=$(jq -r 'select(.event == "checkpoint") | "\(.step):\(.async)"' "$tmp/run-sync/metrics.jsonl" | tr '\n' ' ')
[ "$got" = "2:false 4:false 6:false " ] || { echo "FAIL: synchronous checkpoint records '$got'"; fail=1; }
grep -q "checkpoint: $tmp/ck-async/step-000004 saved in the background" "$tmp/async.log" ||
    { echo "FAIL: no background save line"; fail=1; }
"$TRIDENT" ckpt verify "$tmp/ck-async/step-000002" >/dev/null || { echo "FAIL: verify step 2 (async)"; fail=1; }
echo "1. async saves of steps 2, 4 byte-identical to synchronous ones"

# 2. resume from the asynchronous step 4: step 6 bit-exact
mkdir -p "$tmp/ck-re"; cp -r "$tmp/ck-async/step-000004" "$tmp/ck-re/"; echo step-000004 >"$tmp/ck-re/latest"
run re checkpoint.async=true train.steps=6 checkpoint.every=2 || { tail -5 "$tmp/re.log"; fail "resume run"; }
for f in rank-00000.h5 rank-00001.h5; do
    cmp -s "$tmp/ck-sync/step-000006/$f" "$tmp/ck-re/step-000006/$f" ||
        { echo "FAIL: step-000006/$f after a resume from the async step 4 differs"; fail=1; }
done
echo "2. resume from the async step 4: step 6 byte-identical"

# 3. a write fault on rank 1 in the background write of step 4
rc=0; TRIDENT_FAULT=fsync:2@1 run fault checkpoint.async=true train.steps=40 checkpoint.every=2 || rc=$?
n=$(grep -c 'checkpoint step 4: writing the rank file failed on 1 of 2 ranks: rank 1 (host [^)]*): .*step-000004.tmp/rank-00001.h5: fsync failed' "$tmp/fault.log" || true)
[ "$rc" -eq 1 ] && [ "$n" -ge 1 ] || { tail -8 "$tmp/fault.log"; echo "FAIL: write fault on rank 1: exit $rc, $n messages"; fail=1; }
[ "$(cat "$tmp/ck-fault/latest")" = step-000002 ] && [ ! -e "$tmp/ck-fault/step-000004" ] ||
    { ls "$tmp/ck-fault"; echo "FAIL: latest moved after the failed background write"; fail=1; }
"$TRIDENT" ckpt verify "$tmp/ck-fault" >/dev/null || { echo "FAIL: verify after the fault"; fail=1; }
# Found at the first step boundary after the writer failed: no save step later than 6 ran.
last=$(metrics "$tmp/run-fault" .step | tail -n 1)
[ "$last" -le 6 ] || { echo "FAIL: the failure was reported only after step $last"; fail=1; }
echo "3. fsync fault on rank 1 during a background write: exit $rc after step $last, latest step-000002"

# 4. SIGTERM during a (stalled) background write
( rc=0; TRIDENT_FAULT=stall:ckpt_async_write:2@1 run term checkpoint.async=true train.steps=100000 checkpoint.every=4 || rc=$?
  echo "$rc" >"$tmp/term.rc" ) &
for _ in $(seq 1 300); do grep -q "step 8 snapshot taken" "$tmp/term.log" 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f "trident train .*$tmp/ck-term" | tail -n 1 || true)
[ -n "$victim" ] && kill -TERM "$victim"
wait $!
rc=$(cat "$tmp/term.rc")
k=$(sed -n 's/^step-0*\([0-9]*\)$/\1/p' "$tmp/ck-term/latest" 2>/dev/null || true)
[ "$rc" = 3 ] && [ -n "$k" ] && [ "$k" -gt 8 ] && [ -d "$tmp/ck-term/step-000008" ] ||
    { tail -8 "$tmp/term.log"; echo "FAIL: SIGTERM during a background write: exit $rc, latest step ${k:-none}"; fail=1; }
"$TRIDENT" ckpt verify "$tmp/ck-term/step-000008" >/dev/null && "$TRIDENT" ckpt verify "$tmp/ck-term" >/dev/null ||
    { echo "FAIL: verify after SIGTERM"; fail=1; }
grep -q "step-000008 saved in the background" "$tmp/term.log" || { echo "FAIL: step 8 not committed before the stop's save"; fail=1; }
# The stop's save waited for the stalled writer, and the record says how long.
w=$(jq -r 'select(.event == "checkpoint" and .step == 8) | .wait_s' "$tmp/run-term/metrics.jsonl" 2>/dev/null || true)
awk -v w="${w:-0}" 'BEGIN { exit !(w > 0.5) }' || { echo "FAIL: the checkpoint record of step 8 says wait_s '$w'"; fail=1; }
echo "4. SIGTERM during the background write of step 8: exit $rc, step 8 committed, then step $k"

# 5. the emulated CUDA backend (make EMU=1): the snapshot is a device-to-host
# copy into the host buffers; the files are those of a synchronous save.
need_emu trident
for m in false true; do
    timeout 300 "${MPIRUN[@]}" -np 2 "$EMU_BUILD/trident" train "$SMALL_INI" data.path="$tmp/shards" \
        system.device=cuda system.share_devices=true parallel.dp=2 parallel.zero_stage=1 \
        train.global_batch_size=16 train.eval_every=0 train.steps=6 checkpoint.every=2 checkpoint.keep_last=0 \
        checkpoint.async=$m checkpoint.dir="$tmp/ck-emu-$m" log.run_dir="$tmp/run-emu-$m" >"$tmp/emu-$m.log" 2>&1 ||
        { tail -5 "$tmp/emu-$m.log"; echo "FAIL: emulated CUDA run (async $m)"; fail=1; }
done
for s in 000002 000004; do
    for f in manifest.ini rank-00000.h5 rank-00001.h5; do
        cmp -s "$tmp/ck-emu-false/step-$s/$f" "$tmp/ck-emu-true/step-$s/$f" ||
            { echo "FAIL: emulated CUDA: step-$s/$f differs with checkpoint.async"; fail=1; }
    done
done
grep -q "step-000004 saved in the background" "$tmp/emu-true.log" || { echo "FAIL: emulated CUDA: no background save"; fail=1; }
echo "5. emulated CUDA: async saves of steps 2, 4 byte-identical to synchronous ones"
mpi_no_leftovers "$TRIDENT train" >/dev/null || true
[ "$fail" -eq 0 ] && echo "ckpt_async: all passed"
exit "$fail"
