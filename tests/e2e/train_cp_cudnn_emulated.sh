#!/usr/bin/env bash
# train_cp_cudnn_emulated.sh: the ring's attention blocks through the CUDA
# backend's cuDNN-per-chunk-pair path (kernels/cuda/cuda_attention_cudnn_block.cu)
# inside training, on the emulated build. The emulation's cuDNN has no
# engines, so TRIDENT_EMU_SDPA=1 stands its naive SDPA kernel in for each
# pair's cuDNN call (docs/cuda.md, "Ring-attention blocks"): what runs is the
# path's own work on the ring's buffers (positions read back and split into
# runs, each readable (query run, key run) pair on strided views, the
# online-softmax merges, the dq/dk/dv adds). tests/e2e/configs/cp.ini at
# cp = 2 (T 256, chunks of 64), bf16, plain causal (documents go native),
# 2 steps: every step's loss and grad norm within 2e-3 relative of the CPU
# backend's cp 2 run (bf16: the path rounds out once per pair merged, the
# CPU once per call; measured 6e-5) and every record's "attention" is
# "cudnn" (without TRIDENT_EMU_SDPA it is "native": cuDNN declines). Fails
# with the merge's old-row weight dropped or with the dq/dk/dv adds writing
# instead of adding. ~12 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_emu trident
command -v bible >/dev/null || fail "bible-kjv not installed: run make deps"
data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
"$TRIDENT" prep --input "$tmp/kjv.txt" --output "$tmp/shards" --vocab-size 510 \
    --val-fraction 0.05 >/dev/null 2>&1 || fail "prep of the KJV dataset"
common=(data.path="$tmp/shards" parallel.cp=2 train.steps=2 train.warmup_steps=1 system.threads=1 system.peak_tflops=1
        precision.dtype=bf16)
for run in cpu pairs; do
    bin="$TRIDENT" dev=cpu env=()
    [ "$run" = pairs ] && bin="$PWD/$EMU_BUILD/trident" dev=cuda env=(TRIDENT_EMU_SDPA=1)
    rc=0 start=$(date +%s)
    env OMP_NUM_THREADS=1 "${env[@]}" timeout 300 "${MPIRUN[@]}" -np 2 "$bin" train tests/e2e/configs/cp.ini \
        "${common[@]}" system.device=$dev log.run_dir="$tmp/run-$run" checkpoint.dir="$tmp/ck-$run" \
        < /dev/null > "$tmp/$run.log" 2>&1 || rc=$?
    echo "== cp 2 bf16 $run: exit $rc in $(( $(date +%s) - start )) s"
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/$run.log"; fail "cp 2 $run exited $rc"; }
done
grep "attention: block" "$tmp/pairs.log" | sed 's/^/    /'
jq -n -r --slurpfile a <(metrics "$tmp/run-cpu" '[.step, .loss, .grad_norm]') \
    --slurpfile b <(metrics "$tmp/run-pairs" '[.step, .loss, .grad_norm, .attention]') '
    if ($a | length) != 2 or ($b | length) != 2 then "FAIL: \($b | length) emulated steps, \($a | length) on the CPU"
    elif ([$b[] | .[3]] | unique) != ["cudnn"] then "FAIL: the pair path did not run every block: \([$b[] | .[3]])"
    else ([range(2) as $i | (1, 2) as $k | (($a[$i][$k] - $b[$i][$k]) | fabs) / ($a[$i][$k] | fabs)] | max) as $w
    | if $w <= 2e-3 then "cp 2 bf16: emulated cuDNN-pair path vs CPU, 2 steps within 2e-3 (worst rel \($w))"
      else "FAIL: cp 2 bf16: emulated cuDNN-pair path vs CPU: worst rel \($w) > 2e-3" end end' | tee "$tmp/verdict"
! grep -q FAIL "$tmp/verdict"
