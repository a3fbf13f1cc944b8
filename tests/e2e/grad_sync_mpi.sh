#!/usr/bin/env bash
# grad_sync_mpi.sh: bucketed, overlapped data-parallel gradient all-reduce on
# 2 and 3 ranks (tests/mpi/test_grad_sync.c).
set -u
cd "$(dirname "$0")/../.."
. tests/e2e/mpi_env.sh
mpi_require
BIN="$PWD/${BUILD:-build}/mpi/test_grad_sync"
[ -x "$BIN" ] || { echo "FAIL: $BIN not built (make)"; exit 1; }
for n in 2 3; do
    timeout 60 $MPIRUN -np $n "$BIN" || { echo "FAIL: $n ranks"; exit 1; }
done
