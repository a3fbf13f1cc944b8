#!/usr/bin/env bash
# train_moe_ep_emulated.sh: expert parallelism ([parallel] ep = 2, issue 31)
# on the CUDA backend over NCCL, run on the CPU by the emulated build (make
# EMU=1: the CUDA MoE kernels, the dispatch and combine all-to-alls as
# grouped NCCL sends and receives on the ep group's stream, against
# tests/cuda_emu), under TRIDENT_EMU_DELAY (random sleeps before each queued
# operation of each stream: rows sent before their permute ran, or combined
# before they arrived, would give other numbers). tests/e2e/configs/moe.ini
# at dp 2, 5 steps, fp32: every step's loss, grad norm and aux loss within
# 1e-5 relative of the CPU backend's ep 2 run; the emulated ep 2 run issues
# more NCCL collectives than its ep 1 twin (the all-to-alls went to NCCL).
# With [model] recompute = full (the backward re-runs each MoE layer, its
# all-to-alls included) the emulated ep 2 run is within 1e-5 of the CPU's
# ep 2 run with recompute full likewise, and issues more NCCL collectives
# than the emulated ep 2 run without (the recomputed all-to-alls on NCCL).
# ZeRO-1 under ep at dp 4, ep 2 (the dense runs of the arena reduce-scattered
# and gathered over the 4 data ranks, the experts' over the 2 of expert_dp,
# each on its own NCCL group and stream): the same 5 steps within 1e-5 of
# the CPU's. Context parallelism at cp 2 (dp 2, ep 2: 4 ranks; the ring
# attention's blocks and the MoE all-to-alls on their own NCCL groups, the
# routing sums over the cp ranks): the same 5 steps within 1e-5 of the CPU's;
# and ZeRO-3 at dp 2, ep 1 (each MoE block's unit gathered and its gradients
# reduce-scattered over NCCL) likewise.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_emu trident
small_dataset "$tmp"
common=(data.path="$tmp/shards" train.global_batch_size=16 train.warmup_steps=2 train.eval_every=0
        train.steps=5 checkpoint.every=0 system.threads=1 system.peak_tflops=1)
run() { # NAME DEVICE EP [overrides]: DP data ranks (default 2) x CP context ranks (default 1)
    local name=$1 dev=$2 ep=$3 bin="$TRIDENT" env=() rc=0 dp=${DP:-2} cp=${CP:-1}
    shift 3
    [ "$dev" = cuda ] && bin="$PWD/$EMU_BUILD/trident" env=(TRIDENT_EMU_DELAY=200:7 TRIDENT_EMU_STATS=1)
    env OMP_NUM_THREADS=1 "${env[@]}" timeout 300 "${MPIRUN[@]}" -np $((dp * cp)) "$bin" train tests/e2e/configs/moe.ini \
        "${common[@]}" parallel.dp=$dp parallel.cp=$cp parallel.ep=$ep system.device=$dev log.run_dir="$tmp/run-$name" \
        checkpoint.dir="$tmp/ck-$name" "$@" < /dev/null > "$tmp/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/$name.log"; fail "$name exited $rc"; }
}
run cpu cpu 2
run cuda cuda 2
run cuda-ep1 cuda 1
run cpu-full cpu 2 model.recompute=full
run cuda-full cuda 2 model.recompute=full
DP=4 run cpu-z1 cpu 2 parallel.zero_stage=1
DP=4 run cuda-z1 cuda 2 parallel.zero_stage=1
CP=2 run cpu-cp cpu 2
CP=2 run cuda-cp cuda 2
run cpu-z3 cpu 1 parallel.zero_stage=3
run cuda-z3 cuda 1 parallel.zero_stage=3
collectives() { sed -n 's/^cuda_emu: .* \([0-9]*\) collectives.*/\1/p' "$tmp/$1.log" | sort -n | head -1; }
c2=$(collectives cuda) c1=$(collectives cuda-ep1) cf=$(collectives cuda-full)
export c1 c2
[ "${c2:-0}" -gt "${c1:-0}" ] || fail "emulated NCCL collectives: ep 2 ${c2:-none}, ep 1 ${c1:-none}: no all-to-all on NCCL"
[ "${cf:-0}" -gt "${c2:-0}" ] ||
    fail "emulated NCCL collectives: ep 2 recompute full ${cf:-none}, none ${c2:-none}: no all-to-all recomputed"
echo "ep 2 emulated NCCL collectives: ${c2} under recompute none, ${cf} under full"
for v in "" -full; do
jq -n -r --arg v "$v" --slurpfile a <(metrics "$tmp/run-cpu$v" '[.step, .loss, .grad_norm, .moe_aux_loss]') \
    --slurpfile b <(metrics "$tmp/run-cuda$v" '[.step, .loss, .grad_norm, .moe_aux_loss]') '
    if ($a | length) != 5 or ($b | length) != 5 then "FAIL: ep 2\($v): \($b | length) emulated steps, \($a | length) on the CPU"
    else ([range(5) as $i | (1, 2, 3) as $k | (($a[$i][$k] - $b[$i][$k]) | fabs) / ($a[$i][$k] | fabs)] | max) as $w
    | if $w <= 1e-5 then "ep 2\(if $v == "" then "" else " recompute full" end): emulated CUDA vs CPU, 5 steps within 1e-5 (worst rel \($w)); NCCL collectives \(env.c1) at ep 1, \(env.c2) at ep 2"
      else "FAIL: ep 2\($v): emulated CUDA vs CPU: worst rel \($w) > 1e-5" end end' | tee -a "$tmp/verdict"
done
for c in "z1:dp 4, ep 2, zero 1" "cp:dp 2, ep 2, cp 2" "z3:dp 2, ep 1, zero 3"; do
jq -n -r --arg what "${c#*:}" --slurpfile a <(metrics "$tmp/run-cpu-${c%%:*}" '[.step, .loss, .grad_norm, .moe_aux_loss]') \
    --slurpfile b <(metrics "$tmp/run-cuda-${c%%:*}" '[.step, .loss, .grad_norm, .moe_aux_loss]') '
    if ($a | length) != 5 or ($b | length) != 5 then "FAIL: \($what): \($b | length) emulated steps, \($a | length) on the CPU"
    else ([range(5) as $i | (1, 2, 3) as $k | (($a[$i][$k] - $b[$i][$k]) | fabs) / ($a[$i][$k] | fabs)] | max) as $w
    | if $w <= 1e-5 then "\($what): emulated CUDA vs CPU, 5 steps within 1e-5 (worst rel \($w))"
      else "FAIL: \($what): emulated CUDA vs CPU: worst rel \($w) > 1e-5" end end' | tee -a "$tmp/verdict"
done
! grep -q FAIL "$tmp/verdict"
