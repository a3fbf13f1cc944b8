#!/usr/bin/env bash
# comm_mpi.sh: topology groups, MPI collectives and blocking and non-blocking
# point-to-point on 8 ranks (one mpirun for five layouts, see
# tests/mpi/test_comm_mpi.c), the same on one rank without mpirun, a send to
# itself on a group of one (refused, exit 1), and whole-job exits: a layout
# with tp*pp*dp != N, an error seen by one rank only, and a fatal check on one
# rank. Each must end every rank with
# the right exit code within 10 s and leave no process alive.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
BIN="$PWD/$BUILD/mpi/test_comm_mpi"
need_built "$BIN"
fail=0
log="$tmp/log"

# run NAME WANT_RC PATTERN CMD...: runs CMD under a LIMIT s timeout (10, the
# error paths' promise; the 8-rank layouts' own run, 9 group kinds each
# since cp, gets 30: it took 11 s on 2 loaded cores); checks its
# exit code, that its output holds a line matching PATTERN (grep -E), and that
# no process of BIN is left alive.
run() {
    local name=$1 want=$2 pattern=$3; shift 3
    local start rc secs limit=${LIMIT:-10}
    start=$(date +%s.%N)
    rc=0; timeout -k 2 "$limit" "$@" >"$log" 2>&1 || rc=$?
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    echo "== $name: exit $rc in ${secs}s"; cat "$log"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "FAIL $name: still running after $limit s"; fail=1; fi
    if [ "$rc" -ne "$want" ]; then echo "FAIL $name: exit $rc, expected $want"; fail=1; fi
    grep -qE -- "$pattern" "$log" || { echo "FAIL $name: output lacks /$pattern/"; fail=1; }
    mpi_no_leftovers "$BIN" || { echo "FAIL $name: processes left alive"; fail=1; }
}

# Needs the line of each layout: a rank that crashed early leaves some out.
LIMIT=30 run "8 ranks, 5 layouts" 0 '^\(tp,pp,dp\)=\(1,8,1\): ok' "${MPIRUN[@]}" -np 8 "$BIN"
for l in 2,2,2 1,2,4 4,1,2 8,1,1; do
    grep -qF "(tp,pp,dp)=($l): ok" "$log" || { echo "FAIL: layout ($l) not ok"; fail=1; }
done
for l in 1,2,4,2 2,1,4,2; do # hybrid sharding: dp_shard 2 of dp 4
    grep -qF "(tp,pp,dp,dp_shard)=($l): ok" "$log" || { echo "FAIL: layout ($l) not ok"; fail=1; }
done
grep -qF '  tp           groups: [0 1] [2 3] [4 5] [6 7]' "$log" || { echo "FAIL: no grid description"; fail=1; }

# One rank, no mpirun (MPI singleton): every group is the rank alone.
run "1 rank without mpirun" 0 '^\(tp,pp,dp\)=\(1,1,1\): ok' "$BIN"

# Every rank detects the bad layout; rank 0 reports it with the sizes and N.
run "tp*pp*dp != N" 2 'rank 0\] \[parallel\] tp=3 \* cp=1 \* ep=1 \* dp_shard=3 \* dp_replicate=1 \* pp=1 = 9 ranks, but the job has N=8 ranks' \
    "${MPIRUN[@]}" -np 8 "$BIN" --layout 3 1 3
[ "$(grep -c 'but the job has' "$log")" -eq 1 ] || { echo "FAIL: the bad layout was reported by more than rank 0"; fail=1; }
run "tp*pp*dp != N, one rank" 2 'tp=2 \* cp=1 \* ep=1 \* dp_shard=1 \* dp_replicate=1 \* pp=1 = 2 ranks, but the job has N=1 ranks' \
    "$BIN" --layout 2 1 1

# Only rank 5 detects bad input while the others block in a barrier.
run "bad input on one rank" 2 'rank 5\] shard-00003.h5: bad magic' "${MPIRUN[@]}" -np 8 "$BIN" --partial-fail 5

# A failed internal check on rank 2: fatal_exit's hook aborts with code 1.
run "fatal check on one rank" 1 'rank 2\] .*test_comm_mpi.c:[0-9]+: check failed: .*injected failure on rank 2' \
    "${MPIRUN[@]}" -np 8 "$BIN" --fatal 2

# A non-blocking send to itself on a group of one is refused by the wrapper.
run "send to self" 1 'check failed: .*comm_send_start: peer 0 in a group of 1 where this rank is 0' \
    "$BIN" --self-send

if [ "$fail" -eq 0 ]; then echo "comm_mpi: all passed"; fi
exit "$fail"
