#!/usr/bin/env bash
# fsdp_split_mpi.sh: ZeRO-2/3 under the zero-bubble schedules' backward split,
# bit for bit against the fused backward, on 2 ranks (tests/mpi/test_fsdp_split.c).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
BIN="$PWD/$BUILD/mpi/test_fsdp_split"
need_built "$BIN"
timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" || fail "2 ranks"
echo "fsdp_split_mpi: ok"
