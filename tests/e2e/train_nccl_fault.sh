#!/usr/bin/env bash
# train_nccl_fault.sh: a failed NCCL collective ends a data-parallel run on
# every rank, each naming the failed rank and NCCL's error. The emulated
# build (make EMU=1) trains the small config at dp = 2 with
# system.device=cuda and TRIDENT_FAULT=nccl:3@1: the third NCCL operation of
# world rank 1 (a gradient all-reduce of step 3) fails on its stream and sets
# its communicator's asynchronous error (tests/cuda_emu/nccl_fault.h); rank
# 0, whose stream blocks in the same all-reduce, sees NCCL's remote error.
# comm_nccl's waits or the watchdog's poll of ncclCommGetAsyncError
# (topology_check_device_groups, every 0.2 s, while a main thread blocks on
# the device) must find it: the job must exit 1 within watchdog_s (30 s) of
# the last step logged,
# rank 1's message naming its own failure ("NCCL error on the dp_cp group ...
# unhandled system error ... TRIDENT_FAULT=nccl:3") and rank 0's naming rank 1
# ("remote process exited ... world rank 1"), no process left. Without the
# poll both ranks hang until the watchdog's timeout, whose message names no
# NCCL error. Reading the messages is the point here (stderr of both ranks,
# merged by mpirun, each line prefixed "[rank R, host H]"). ~15 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_emu trident
need_built "$TRIDENT" "$EMU_BUILD/trident"
small_dataset "$tmp"
WATCHDOG_S=30
start=$(date +%s)
rc=0
TRIDENT_FAULT=nccl:3@1 timeout 120 "${MPIRUN[@]}" -np 2 "$PWD/$EMU_BUILD/trident" train "$SMALL_INI" \
    data.path="$tmp/shards" parallel.dp=2 system.device=cuda train.steps=1000 train.eval_every=0 \
    system.watchdog_s=$WATCHDOG_S log.run_dir="$tmp/run" >"$tmp/log" 2>&1 || rc=$?
end=$(date +%s)
last=$(stat -c %Y "$tmp/run/metrics.jsonl" 2>/dev/null || echo "$start")
fail=0
[ "$rc" = 1 ] || { echo "FAIL: exit $rc, expected 1"; fail=1; }
[ $((end - last)) -lt $WATCHDOG_S ] ||
    { echo "FAIL: ended $((end - last)) s after the last step logged, not within watchdog_s = $WATCHDOG_S"; fail=1; }
grep -Eq '^trident: \[rank 1[],].*NCCL error on the dp_cp group \(NCCL rank 1 of 2.*unhandled system error.*TRIDENT_FAULT=nccl:3' "$tmp/log" ||
    { echo "FAIL: rank 1 did not report its NCCL error"; fail=1; }
grep -Eq '^trident: \[rank 0[],].*NCCL error on the dp_cp group \(NCCL rank 0 of 2.*remote process exited.*world rank 1, host [^)]+\) failed' "$tmp/log" ||
    { echo "FAIL: rank 0 did not report rank 1's NCCL error"; fail=1; }
metrics_at_least "$tmp/run" 1 || { echo "FAIL: no step logged before the fault"; fail=1; }
mpi_no_leftovers "$tmp/run" || { echo "FAIL: processes left"; fail=1; }
[ "$fail" -eq 0 ] || { grep -a 'trident:' "$tmp/log" | tail -n 8; exit 1; }
grep -a 'NCCL error' "$tmp/log" | cut -c1-240

# (b) tp = 2 x dp = 2: the fifth NCCL operation of world rank 1 fails (a
# tensor-parallel collective of step 1); ranks 2 and 3 are in neither of its
# communicators (tp group {0, 1}, dp group {1, 3}: rank 3 waits in a dp
# all-reduce, rank 2 in its own tp group), yet every rank must name rank 1
# and its NCCL error: rank 1 announces it in <run_dir>/heartbeat/failure
# (base/heartbeat.h) before its grace period, the others' watchdogs read it
# (failed before that: ranks 2 and 3 printed nothing).
rc=0
start=$(date +%s)
TRIDENT_FAULT=nccl:5@1 timeout 120 "${MPIRUN[@]}" -np 4 "$PWD/$EMU_BUILD/trident" train "$SMALL_INI" \
    data.path="$tmp/shards" parallel.tp=2 parallel.dp=2 system.device=cuda train.steps=1000 train.eval_every=0 \
    system.watchdog_s=$WATCHDOG_S log.run_dir="$tmp/run4" >"$tmp/log4" 2>&1 || rc=$?
end=$(date +%s)
[ "$rc" = 1 ] || { echo "FAIL: (b) exit $rc, expected 1"; fail=1; }
[ $((end - start)) -lt $((WATCHDOG_S + 30)) ] || { echo "FAIL: (b) took $((end - start)) s"; fail=1; }
for r in 0 1 2 3; do
    grep -Eaq "^trident: \[rank $r[],].*(NCCL error on the tp group \(NCCL rank 1 of 2|world rank 1, host|rank 1 \(host [^,]+, pid [0-9]+\) ended the job: NCCL error)" "$tmp/log4" ||
        { echo "FAIL: (b) rank $r did not name rank 1's NCCL error"; fail=1; }
done
mpi_no_leftovers "$tmp/run4" || { echo "FAIL: (b) processes left"; fail=1; }
[ "$fail" -eq 0 ] || { grep -a 'trident:' "$tmp/log4" | tail -n 8; exit 1; }
grep -a 'trident: \[rank' "$tmp/log4" | cut -c1-240
echo "train_nccl_fault: ok (exit 1 in $((end - start)) s, $((end - last)) s after the last step)"
