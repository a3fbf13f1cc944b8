#!/usr/bin/env bash
# train_moe_pp_emulated.sh: the mixture-of-experts decoder under tp 2 with
# sequence parallelism and pp 2 (issue 31) on the CUDA backend over NCCL,
# run on the CPU by the emulated build (make EMU=1): the pipeline's messages
# are device buffers sent over NCCL, so the routing sums and loss scale
# their tail carries (model_pass.c) go through device memory, under
# TRIDENT_EMU_DELAY (random sleeps before each queued operation of each
# stream: a tail read before its message arrived, or written after it left,
# would give other numbers). tests/e2e/configs/moe.ini with 4 layers (the
# first dense), untied, 4 steps in fp32: every step's loss, grad norm, aux
# and z losses within 1e-5 relative of the CPU backend's single-rank run.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_emu trident
small_dataset "$tmp"
common=(data.path="$tmp/shards" train.global_batch_size=8 train.micro_batch_size=2 train.steps=4
        train.warmup_steps=1 train.lr=2e-3 train.eval_every=0 model.n_layers=4
        model.moe_first_dense_layers=1 model.tie_embeddings=false checkpoint.every=0
        system.threads=1 system.peak_tflops=1)
rc=0
OMP_NUM_THREADS=1 timeout 120 "$TRIDENT" train tests/e2e/configs/moe.ini "${common[@]}" \
    system.device=cpu log.run_dir="$tmp/run-cpu" checkpoint.dir="$tmp/ck-cpu" \
    < /dev/null > "$tmp/cpu.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$tmp/cpu.log"; fail "the CPU run exited $rc"; }
env OMP_NUM_THREADS=1 TRIDENT_EMU_DELAY=200:7 timeout 300 "${MPIRUN[@]}" -np 4 "$PWD/$EMU_BUILD/trident" \
    train tests/e2e/configs/moe.ini "${common[@]}" system.device=cuda parallel.tp=2 parallel.pp=2 \
    parallel.sequence_parallel=true log.run_dir="$tmp/run-cuda" checkpoint.dir="$tmp/ck-cuda" \
    < /dev/null > "$tmp/cuda.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$tmp/cuda.log"; fail "the emulated tp 2 + SP, pp 2 run exited $rc"; }
grep -q "pipeline messages over NCCL" "$tmp/cuda.log" || fail "the banner does not say 'pipeline messages over NCCL'"
jq -n -r --slurpfile a <(metrics "$tmp/run-cpu" '[.step, .loss, .grad_norm, .moe_aux_loss, .moe_z_loss]') \
    --slurpfile b <(metrics "$tmp/run-cuda" '[.step, .loss, .grad_norm, .moe_aux_loss, .moe_z_loss]') '
    if ($a | length) != 4 or ($b | length) != 4 then "FAIL: \($b | length) emulated steps, \($a | length) on the CPU"
    else ([range(4) as $i | (1, 2, 3, 4) as $k | (($a[$i][$k] - ($b[$i][$k] // 1e300)) | fabs) / ($a[$i][$k] | fabs)] | max) as $w
    | if $w <= 1e-5 then "tp 2 + SP, pp 2: emulated CUDA vs 1 CPU rank, 4 steps within 1e-5 (worst rel \($w))"
      else "FAIL: tp 2 + SP, pp 2: emulated CUDA vs 1 CPU rank: worst rel \($w) > 1e-5" end end' | tee "$tmp/verdict"
! grep -q FAIL "$tmp/verdict"
