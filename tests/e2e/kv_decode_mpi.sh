#!/usr/bin/env bash
# kv_decode_mpi.sh: generation with a key/value cache across ranks
# (tests/mpi/test_kv_decode_mpi.c): on 2 ranks, tensor parallel 2 with
# sequence parallelism, then pipeline parallel 2 with 2 virtual stages, the
# cached logits at every position equal the whole model's full-window forward
# within 1e-5 (relative) in FP32 and 1e-2 in BF16, on every rank.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
BIN="$PWD/$BUILD/mpi/test_kv_decode_mpi"
need_built "$BIN"
for mode in tp pp; do
    timeout -k 2 60 "${MPIRUN[@]}" -np 2 "$BIN" "$mode" > "$tmp/$mode.log" 2>&1 ||
        { cat "$tmp/$mode.log"; fail "$mode: exit non-zero"; }
    cat "$tmp/$mode.log"
    n=$(grep -c "relative error" "$tmp/$mode.log" || true)
    [ "$n" -eq 4 ] || fail "$mode: $n result lines, expected 4 (2 ranks x fp32, bf16)"
done
echo PASS
