#!/usr/bin/env bash
# cuda_host_work.sh: the host's work per training step on the CUDA backend,
# through the emulated build ($BUILD-emu, `make EMU=1`): runs
# tests/cuda_emu/check_host_work.cpp, which counts with the emulation's
# counters what each train_step of a small fp32 model costs the host (steps
# of 4 and 1 microbatches) and compares the losses with the CPU backend's:
#  1. the loss summed on the device and read once a step: device-to-host
#     copies and host waits per step independent of the microbatch count;
#  2. tokens and targets staged in pinned memory: no pageable H2D copy;
#  3. cuBLASLt descriptors, layouts, preferences and algorithms cached per
#     problem: none made after the first step;
#  4. the kernels' scratch sized at model_init: no cudaMalloc/cudaFree in any
#     step;
# every step's loss and grad norm within 1e-5 of the CPU backend's; the same
# counts (1-4) in bf16 and in bf16 with FP8 linear layers (issue 29: the FP8
# GEMMs' cuBLASLt plans cached, their transposed operands' scratch
# reserved by model_fp8_init). Twice:
# as the asynchronous emulation runs by default, and with random delays in
# the stream workers (TRIDENT_EMU_DELAY), so the host runs further ahead of
# the device accumulator it reads once a step. ~5 s (the two at once).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_emu tests/check_host_work
need_built "$EMU_BUILD/tests/check_host_work"
# The two runs are independent (~4 s of one core each): at once, the output
# of each shown after both ended.
( rc=0; OMP_NUM_THREADS=1 "$EMU_BUILD/tests/check_host_work" > "$tmp/plain.out" 2>&1 || rc=$?
  echo "$rc" > "$tmp/plain.rc" ) &
( rc=0; TRIDENT_EMU_DELAY=200:3 OMP_NUM_THREADS=1 "$EMU_BUILD/tests/check_host_work" > "$tmp/delay.out" 2>&1 || rc=$?
  echo "$rc" > "$tmp/delay.rc" ) &
wait
cat "$tmp/plain.out"; [ "$(cat "$tmp/plain.rc")" = 0 ] || fail "check_host_work"
cat "$tmp/delay.out"; [ "$(cat "$tmp/delay.rc")" = 0 ] || fail "check_host_work with TRIDENT_EMU_DELAY=200:3"
echo "cuda_host_work: ok"
