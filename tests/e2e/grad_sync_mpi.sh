#!/usr/bin/env bash
# grad_sync_mpi.sh: bucketed, overlapped data-parallel gradient all-reduce on
# 2 and 3 ranks (tests/mpi/test_grad_sync.c).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
BIN="$PWD/$BUILD/mpi/test_grad_sync"
need_built "$BIN"
for n in 2 3; do
    timeout 60 "${MPIRUN[@]}" -np $n "$BIN" || fail "$n ranks"
done
