#!/usr/bin/env bash
# pipeline_mpi.sh: the pipeline executor over MPI with the toy affine model
# (tests/mpi/test_pipeline_mpi.c): (p, m, v) = (2,4,1), (4,8,1), (4,4,1),
# (2,4,2), (4,8,2) on 4 ranks (p = 2 as two pp groups of a dp = 2 grid), plus
# (4,12,3) and (2,6,3), each with the default ring of buffers and a ring of 1;
# then (8,16,1) and (8,8,2) on 8 ranks. Every rank checks its activations,
# gradients and outputs against closed forms; a deadlock shows as a run still
# going after 60 s. No process may be left alive.
set -u
cd "$(dirname "$0")/../.."
. tests/e2e/mpi_env.sh
mpi_require
BIN="$PWD/${BUILD:-build}/mpi/test_pipeline_mpi"
[ -x "$BIN" ] || { echo "FAIL: $BIN not built (make)"; exit 1; }
fail=0
log=$(mktemp); trap 'rm -f "$log"' EXIT

# run NAME NP LAYOUTS...: one mpirun of NP ranks over the layouts (P M V
# triples); each must print its "ok" line for both rings.
run() {
    local name=$1 np=$2; shift 2
    local rc
    timeout -k 2 60 $MPIRUN -np "$np" "$BIN" "$@" >"$log" 2>&1; rc=$?
    echo "== $name: exit $rc"; cat "$log"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && { echo "FAIL $name: still running after 60 s (deadlock?)"; fail=1; }
    [ "$rc" -ne 0 ] && { echo "FAIL $name: exit $rc"; fail=1; }
    while [ $# -ge 3 ]; do
        local n
        n=$(grep -cE "^\(p,m,v\)=\($1,$2,$3\) ring=(1|default) dp=[0-9]+: ok" "$log")
        [ "$n" -eq 2 ] || { echo "FAIL $name: ($1,$2,$3) ok for $n of 2 rings"; fail=1; }
        shift 3
    done
    mpi_no_leftovers "$BIN" || { echo "FAIL $name: processes left alive"; fail=1; }
}

run "4 ranks" 4 2 4 1  4 8 1  4 4 1  2 4 2  4 8 2  4 12 3  2 6 3
run "8 ranks" 8 8 16 1  8 8 2

[ "$fail" -eq 0 ] && echo "pipeline_mpi: all passed"
exit "$fail"
