#!/usr/bin/env bash
# pipeline_mpi.sh: the pipeline executor over MPI with the toy affine model
# (tests/mpi/test_pipeline_mpi.c): (p, m, v) = (2,4,1), (4,8,1), (4,4,1),
# (2,4,2), (4,8,2) on 4 ranks (p = 2 as two pp groups of a dp = 2 grid), plus
# (4,12,3) and (2,6,3), each with the default ring of buffers and a ring of 1;
# then (8,16,1) and (8,8,2) on 8 ranks. The zero-bubble schedules: zb-h1 at
# (2,4,1), (4,8,1), (4,5,1) and zbv at (2,4,2), (4,8,2), (4,4,2) on 4 ranks,
# (8,16,1) and (8,12,2) on 8, each also with 2 delay seeds (random 0-2 ms
# sleeps before every send and receive); then (4,8,1) zb-h1 and (4,8,2) zbv
# under 50 delay seeds each (issue 30's acceptance 2 for the executor). Every rank checks its activations,
# gradients, weight gradients and outputs against closed forms; a deadlock
# shows as a run still going after 60 s. No process may be left alive.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
BIN="$PWD/$BUILD/mpi/test_pipeline_mpi"
need_built "$BIN"
fail=0
log="$tmp/log"

# run NAME NP [--schedule K --seeds N] LAYOUTS...: one mpirun of NP ranks over
# the layouts (P M V triples); each must print its "ok" line for both rings,
# once undelayed and once per seed.
run() {
    local name=$1 np=$2; shift 2
    local rc=0 opts=() want=2 tail=""
    if [ "${1:-}" = "--schedule" ]; then
        opts=("$1" "$2" "$3" "$4"); want=$((2 * ($4 + 1))); tail=" \\[$2"; shift 4
    fi
    timeout -k 2 "${limit:-60}" "${MPIRUN[@]}" -np "$np" "$BIN" "${opts[@]}" "$@" >"$log" 2>&1 || rc=$?
    echo "== $name: exit $rc"; cat "$log"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "FAIL $name: still running after ${limit:-60} s (deadlock?)"; fail=1; fi
    if [ "$rc" -ne 0 ]; then echo "FAIL $name: exit $rc"; fail=1; fi
    while [ $# -ge 3 ]; do
        local n
        n=$(grep -cE "^\(p,m,v\)=\($1,$2,$3\) ring=(1|default) dp=[0-9]+: ok .*$tail" "$log" || true)
        [ "$n" -eq "$want" ] || { echo "FAIL $name: ($1,$2,$3) ok for $n of $want runs"; fail=1; }
        shift 3
    done
    mpi_no_leftovers "$BIN" || { echo "FAIL $name: processes left alive"; fail=1; }
}

run "4 ranks" 4 2 4 1  4 8 1  4 4 1  2 4 2  4 8 2  4 12 3  2 6 3
run "8 ranks" 8 8 16 1  8 8 2
run "4 ranks zb-h1" 4 --schedule zb-h1 --seeds 2 2 4 1  4 8 1  4 5 1
run "4 ranks zbv" 4 --schedule zbv --seeds 2 2 4 2  4 8 2  4 4 2
run "8 ranks zb-h1" 8 --schedule zb-h1 --seeds 2 8 16 1
run "8 ranks zbv" 8 --schedule zbv --seeds 2 8 12 2
limit=150 run "zb-h1 50 seeds" 4 --schedule zb-h1 --seeds 50 4 8 1
limit=150 run "zbv 50 seeds" 4 --schedule zbv --seeds 50 4 8 2

if [ "$fail" -eq 0 ]; then echo "pipeline_mpi: all passed"; fi
exit "$fail"
