#!/usr/bin/env bash
# nccl_emulated.sh: the emulated NCCL (tests/cuda_emu/nccl.h, over MPI) under
# the real comm table src/parallel/comm_nccl.c and the CUDA backend of the
# emulated build (`make EMU=1`, made by cuda_emulated.sh; a no-op here when
# up to date): tests/mpi/test_comm_nccl.c at 2, 3 and 4 ranks (each rank its
# own emulated device). It checks every collective with known values, every
# collective x dtype against comm_mpi's result on the same inputs byte for
# byte (BF16 sums rounded per combine as comm.h specifies), and the NCCL API
# directly: communicators of sub-groups made in different orders, in-place
# reduce-scatter, a group whose receives precede their sends; 200 all-reduces
# in flight on one group before any wait (the old ring of 64 events failed);
# all-to-all-v with uneven, zero and large counts against closed forms and,
# in every dtype, against MPI_Alltoallv.
# Then `test_comm_nccl --streams` at 2 and 3 ranks (orderings of the streams
# per kind of traffic, below) and tests/mpi/test_grad_sync.c at 2 ranks on the
# CUDA backend over NCCL: ~140 gradient buckets of 1 KiB started during one
# backward, in flight at once on the asynchronous emulation. ~20 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_emu mpi/test_comm_nccl mpi/test_grad_sync
need_built "$EMU_BUILD/mpi/test_comm_nccl" "$EMU_BUILD/mpi/test_grad_sync"
BIN="$PWD/$EMU_BUILD/mpi" # absolute: mpi_no_leftovers matches it, not another checkout's run
fail=0
for np in 2 3 4; do
    start=$(date +%s)
    rc=0; timeout 300 "${MPIRUN[@]}" -np "$np" "$BIN/test_comm_nccl" >"$tmp/np$np.log" 2>&1 || rc=$?
    echo "== $np ranks: exit $rc in $(( $(date +%s) - start ))s: $(grep -m1 '^test_comm_nccl' "$tmp/np$np.log" || true)"
    if [ "$rc" -ne 0 ]; then grep -m 20 'FAIL\|rror' "$tmp/np$np.log" || tail -n 20 "$tmp/np$np.log"; fail=1; fi
    grep -q "^test_comm_nccl: $np ranks, ok" "$tmp/np$np.log" || { echo "FAIL: no ok line at $np ranks"; fail=1; }
done
# Streams per kind of traffic (test_comm_nccl.c, streams()): a TP all-reduce
# while a DP one started before it waits for a late peer, and a deferred send
# while later compute waits for a DP all-reduce its receiver joins after the
# message. On one shared communication stream, or with a send ordered after
# all compute enqueued by its flush, each deadlocks: bounded here.
for np in 2 3; do
    rc=0; timeout 60 "${MPIRUN[@]}" -np $np "$BIN/test_comm_nccl" --streams >"$tmp/streams$np.log" 2>&1 || rc=$?
    echo "== --streams, $np ranks: exit $rc"
    if [ "$rc" -ne 0 ] || ! grep -q "^test_comm_nccl: $np ranks, ok" "$tmp/streams$np.log"; then
        grep -m 10 'FAIL\|rror\|^streams' "$tmp/streams$np.log" || true
        [ "$rc" -eq 124 ] && echo "FAIL: --streams at $np ranks timed out: an operation is ordered behind one it must not wait for (shared stream?)"
        fail=1
    fi
done
# A failed collective (test_comm_nccl.c, fault()): world rank 1's second NCCL
# operation fails on its stream (TRIDENT_FAULT=nccl:2@1); comm_nccl's waits
# poll ncclCommGetAsyncError, so rank 1 ends the job naming its failure and
# rank 0, whose stream blocks in that all-reduce, names rank 1 (NCCL's remote
# error). Without the polls rank 0 waits for its stream for ever.
rc=0; TRIDENT_FAULT=nccl:2@1 timeout 60 "${MPIRUN[@]}" -np 2 "$BIN/test_comm_nccl" --fault >"$tmp/fault.log" 2>&1 || rc=$?
echo "== --fault (TRIDENT_FAULT=nccl:2@1), 2 ranks: exit $rc"
if [ "$rc" -ne 1 ] ||
    ! grep -aEq 'NCCL error on the world group \(NCCL rank 1 of 2[^)]*\) in comm_[a-z]+[^:]*: unhandled system error.*TRIDENT_FAULT=nccl:2: NCCL operation 2 of world rank 1' "$tmp/fault.log" ||
    ! grep -aEq 'NCCL error on the world group \(NCCL rank 0 of 2[^)]*\) in comm_[a-z]+[^:]*: remote process exited.*world rank 1, host [^)]+\) failed' "$tmp/fault.log"; then
    grep -a 'NCCL error\|fault:' "$tmp/fault.log" || tail -n 20 "$tmp/fault.log"
    echo "FAIL: --fault: expected exit 1 with rank 1 naming its NCCL error and rank 0 naming rank 1 (exit $rc)"; fail=1
fi
rc=0; timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/test_grad_sync" >"$tmp/grad_sync.log" 2>&1 || rc=$?
echo "== test_grad_sync, 2 ranks: exit $rc: $(grep -m1 '^grad_sync cuda/nccl' "$tmp/grad_sync.log" || true)"
if [ "$rc" -ne 0 ] || ! grep -q '^grad_sync cuda/nccl: ' "$tmp/grad_sync.log"; then
    tail -n 20 "$tmp/grad_sync.log"; echo "FAIL: test_grad_sync on the CUDA backend over NCCL"; fail=1
fi
mpi_no_leftovers "$BIN/test_" >/dev/null || { echo "FAIL: test_comm_nccl processes left"; fail=1; }
[ "$fail" -eq 0 ] && echo "nccl_emulated: ok"
exit "$fail"
