#!/usr/bin/env bash
# plan_matches_run.sh: `trident plan` prints what a run allocates (docs/design.md
# §5): for layouts (tp,pp,dp,zero) = (1,1,1,0), (2,2,2,1), (1,2,1,0) with
# sequence parallelism off and (2,1,1,0) with it on, each in [model]
# recompute = none, selective and full in fp32, and none and full in bf16
# (FP32 master weights in the optimizer's bytes, ZeRO-1 sharded; FP32
# scratch for the TP sums of bf16 activations), and with [precision]
# grad_dtype = bf16 in (1,1,2,0) (the BF16 copy of the gradient arena the
# buckets all-reduce) and (2,2,2,1) (ZeRO-1's BF16 reduce-scatter buffers,
# counted with the optimizer), and ZeRO-2/3 (src/train/fsdp.h: parameter
# and gradient shards, gather buffers, unit gradient buffers and their
# reduce-scatter results, a tied embedding's own buffer) in (1,1,4,2),
# (1,1,4,3), (1,1,4,3) with reshard_after_forward = false, (1,1,4,3) with
# dp_shard 2, (2,2,2,3)+SP, (1,2,2,2) and (1,2,2,3) 1F1B and (1,2,2,3)
# interleaved (2 virtual stages) in fp32, (1,1,4,3) and (2,1,2,2)+SP in bf16 with recompute full, (1,1,4,2)
# and (1,1,4,3) with grad_dtype bf16, and context parallelism (issue 26: the
# rank's B T / cp tokens, the ring's two travelling buffers and position
# table; ZeRO over dp x cp) at cp 2 and cp 4 alone, (tp 2, cp 2, dp 2)+SP,
# (cp 2, pp 2), (cp 2, dp 2) with ZeRO-1 and ZeRO-3 in fp32, cp 4 with
# recompute selective and cp 2 with full in bf16, the plan's bytes for stage
# 0, tp rank 0 (params + grads + optimizer + activations) equal the
# mem_bytes that world rank 0 writes to metrics.jsonl when the layout runs.
# The grouped rows cover every rank once (their "ranks" add up to
# tp*cp*pp*dp) and `plan --json` gives the same bytes for stage 0 and the
# same peak. Issue 30's zero-bubble schedules (the tenth field:
# pp_schedule; slots held from F to W, each with its W stash, and ZB-V's stage
# 0 holding the embedding and the head with the head's own gradient of a tied
# embedding): zb-h1 at (1,2,1), (1,4,1), (2,2,2)+ZeRO-1 and (1,2,2)+ZeRO-3 and
# zbv at (1,2,1) in fp32, zb-h1 with recompute selective, zbv with recompute
# full in bf16. Issue 31's MoE decoder (tests/e2e/configs/moe.ini) at (1,1,1)
# and (1,1,2)+ZeRO-1 in fp32 and (1,1,1) in bf16, (2,1,1) with sequence
# parallelism and (1,2,1) in fp32 (the experts unsplit over TP), and at
# (1,1,4) with ep 4 in fp32 (the twelfth field: each rank's 2 of the 8
# experts, its expert buffers sized for the ep N k rows it may receive), and
# (1,1,4) with ep 2 and ZeRO-1 (the dense tensors' optimizer state over dp,
# the experts' over the 2 ranks of expert_dp), and (1,1,6) with ep 2 and
# ZeRO-1 (global batch 24), whose groups of 6 and 3 ranks do not divide
# every run of the arena (rank 0 holds len / S of each run: the plan sums
# them per run, optimizer_zero1_numel); under recompute (MoE blocks
# recompute their norms and q, k; full also the MoE layer, whose routing and
# expert activations then live once in the recompute buffer, not per block
# and slot): selective at (1,1,1) and (1,2,1), full at (1,1,1), (2,1,1)+SP,
# (1,2,2) with ep 2 and (1,1,4) with ep 4 in fp32, full at (1,1,1) in bf16.
# Acceptance 3 of issue 26: at cp 4 a rank's activation bytes
# (plan == run) are at most 30% of cp 1's at the same T.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
fail=0
for case in none,fp32,fp32 selective,fp32,fp32 full,fp32,fp32 none,bf16,fp32 full,bf16,fp32 none,fp32,bf16; do
IFS=, read -r mode dtype grad <<<"$case"
layouts="1,1,1,0,0 2,2,2,1,0 1,2,1,0,0 2,1,1,0,1"
[ "$grad" = fp32 ] || layouts="1,1,2,0,0 2,2,2,1,0 1,1,4,2,0 1,1,4,3,0"
# ZeRO-2/3 (the tied embedding's own buffers included: small.ini ties them)
[ "$mode $dtype $grad" = "none fp32 fp32" ] && layouts="$layouts 1,1,4,2,0 1,1,4,3,0 1,1,4,3,0,false 2,2,2,3,1 1,1,4,3,0,true,2 1,2,2,2,0 1,2,2,3,0 1,2,2,3,0,true,0,2"
# context parallelism (the ninth field: cp)
[ "$mode $dtype $grad" = "none fp32 fp32" ] && layouts="$layouts 1,1,1,0,0,true,0,1,2 1,1,1,0,0,true,0,1,4 2,1,2,0,1,true,0,1,2 1,2,1,0,0,true,0,1,2 1,1,2,1,0,true,0,1,2 1,1,2,3,0,true,0,1,2"
[ "$mode $dtype $grad" = "selective fp32 fp32" ] && layouts="$layouts 1,1,1,0,0,true,0,1,4"
# zero-bubble schedules (the tenth field: pp_schedule)
[ "$mode $dtype $grad" = "none fp32 fp32" ] && layouts="$layouts 1,2,1,0,0,true,0,1,1,zb-h1 1,4,1,0,0,true,0,1,1,zb-h1 2,2,2,1,0,true,0,1,1,zb-h1 1,2,2,3,0,true,0,1,1,zb-h1 1,2,1,0,0,true,0,2,1,zbv"
[ "$mode $dtype $grad" = "selective fp32 fp32" ] && layouts="$layouts 1,2,1,0,0,true,0,1,1,zb-h1"
[ "$mode $dtype $grad" = "full bf16 fp32" ] && layouts="$layouts 1,2,1,0,0,true,0,2,1,zbv"
[ "$mode $dtype $grad" = "full bf16 fp32" ] && layouts="$layouts 1,1,4,3,0 2,1,2,2,1 1,1,1,0,0,true,0,1,2"
# Issue 31's mixture-of-experts decoder (the eleventh field: moe runs
# tests/e2e/configs/moe.ini: each MoE block's routing and expert activations
# per slot, one shared scratch): (1,1,1) and (1,1,2)+ZeRO-1 in fp32, (1,1,1) in bf16;
# (2,1,1) with sequence parallelism and (1,2,1) in fp32 (every TP rank holds the
# whole MoE layer and its activations for all N rows); expert parallelism (the
# twelfth field: ep) at (1,1,4), ep 4, in fp32, and ep 2 with ZeRO-1 at dp 4 and dp 6;
# under context parallelism at (1,1,2), cp 2, ep 2 (each cp rank routes its own rows);
# ZeRO-3 at (1,1,2) and ZeRO-2 at (2,1,2) with sequence parallelism (ep 1: the experts
# sharded as any block tensor).
[ "$mode $dtype $grad" = "none fp32 fp32" ] && layouts="$layouts 1,1,1,0,0,true,0,1,1,1f1b,moe 1,1,2,1,0,true,0,1,1,1f1b,moe 2,1,1,0,1,true,0,1,1,1f1b,moe 1,2,1,0,0,true,0,1,1,1f1b,moe 1,1,4,0,0,true,0,1,1,1f1b,moe,4 1,1,4,1,0,true,0,1,1,1f1b,moe,2 1,1,6,1,0,true,0,1,1,1f1b,moe,2 1,1,2,0,0,true,0,1,2,1f1b,moe,2 1,1,2,3,0,true,0,1,1,1f1b,moe 2,1,2,2,1,true,0,1,1,1f1b,moe"
[ "$mode $dtype $grad" = "none bf16 fp32" ] && layouts="$layouts 1,1,1,0,0,true,0,1,1,1f1b,moe"
[ "$mode $dtype $grad" = "selective fp32 fp32" ] && layouts="$layouts 1,1,1,0,0,true,0,1,1,1f1b,moe 1,2,1,0,0,true,0,1,1,1f1b,moe"
[ "$mode $dtype $grad" = "full fp32 fp32" ] && layouts="$layouts 1,1,1,0,0,true,0,1,1,1f1b,moe 2,1,1,0,1,true,0,1,1,1f1b,moe 1,2,2,0,0,true,0,1,1,1f1b,moe,2 1,1,4,0,0,true,0,1,1,1f1b,moe,4"
[ "$mode $dtype $grad" = "full bf16 fp32" ] && layouts="$layouts 1,1,1,0,0,true,0,1,1,1f1b,moe"
for l in $layouts; do
    IFS=, read -r tp pp dp z sp keep shard v cp sched moe ep <<<"$l"
    keep=${keep:-true} shard=${shard:-0} v=${v:-1} cp=${cp:-1} sched=${sched:-1f1b} ep=${ep:-1} # reshard_after_forward, dp_shard, virtual_stages
    ini=$SMALL_INI; [ "${moe:-}" = moe ] && ini=tests/e2e/configs/moe.ini
    run_dir="$tmp/run-$tp-$pp-$dp-$z-$sp-$keep-$shard-$v-$cp-$sched-${moe:-dense}-$ep-$mode-$dtype-$grad"
    l="$l $mode $dtype grad $grad"
    gbs=16; [ $((gbs % (2 * dp))) = 0 ] || gbs=$((4 * dp)) # micro_batch_size 2 x dp divides it
    args=(data.path="$tmp/shards" model.recompute=$mode precision.dtype=$dtype precision.grad_dtype=$grad parallel.tp=$tp parallel.pp=$pp parallel.dp=$dp
          parallel.zero_stage=$z parallel.sequence_parallel=$sp parallel.reshard_after_forward=$keep parallel.dp_shard=$shard parallel.virtual_stages=$v train.global_batch_size=$gbs
          parallel.cp=$cp parallel.pp_schedule=$sched parallel.ep=$ep train.steps=1 train.warmup_steps=1 log.run_dir="$run_dir")
    [ "$v" = 1 ] && [ "$pp" -le 2 ] || args+=(model.n_layers=$((2 * pp * v))) # a layer or more per virtual stage
    rc=0; plan=$("$TRIDENT" plan "$ini" "${args[@]}") || rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: plan $l exited $rc"; fail=1; continue; }
    # The row "0 ROLE ..." (stage 0), then its "bytes: params P, grads G, optimizer O, activations A".
    want=$(awk '/^0 +[a-z]+ /{getline; print; exit}' <<<"$plan" |
           sed -n 's/.*params \([0-9]*\), grads \([0-9]*\), optimizer \([0-9]*\), activations \([0-9]*\).*/\1 + \2 + \3 + \4/p')
    covered=$(awk '/^[0-9]+(-[0-9]+)? +[a-z]+ /{n += $3} END{print n + 0}' <<<"$plan")
    [ "$covered" = $((tp * cp * pp * dp)) ] || { echo "FAIL: $l: grouped rows cover $covered ranks, not $((tp * cp * pp * dp))"; fail=1; }
    js=$("$TRIDENT" plan "$ini" "${args[@]}" --json |
         "$PY" -c 'import json,sys; o=json.load(sys.stdin); print(o["groups"][0]["total_bytes"], o["peak_bytes"] == max(g["total_bytes"] for g in o["groups"]), sum(g["ranks"] for g in o["groups"]) == o["ranks"], o["cp"], o["groups"][0]["activation_bytes"])')
    read -r js_total js_peak js_ranks js_cp js_act <<<"$js"
    [ "$js_total $js_peak $js_ranks $js_cp" = "$((want)) True True $cp" ] ||
        { echo "FAIL: $l: --json says '$js', text plan $((want)), cp $cp"; fail=1; }
    [ "$tp,$pp,$dp,$z $mode $dtype $grad" = "1,1,1,0 none fp32 fp32" ] && act[$cp]=$js_act # acceptance 3
    rc=0; timeout 120 "${MPIRUN[@]}" -np $((tp * cp * pp * dp)) "$TRIDENT" train "$ini" "${args[@]}" \
        > "$tmp/log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -5 "$tmp/log"; echo "FAIL: run $l exited $rc"; fail=1; continue; }
    got=$(metrics "$run_dir" .mem_bytes | sed -n 1p)
    if [ -z "$want" ] || [ -z "$got" ] || [ "$((want))" != "$got" ]; then
        echo "FAIL: $l: plan says $want bytes, metrics.jsonl of the run '$got'"; fail=1
    else
        echo "$l: plan == run ($want = $got bytes on rank 0)"
    fi
done
done
# Acceptance 3 (issue 26): (1,1,1) fp32 at the same T, cp 4 against cp 1
"$PY" -c 'import sys; a1, a4 = int(sys.argv[1]), int(sys.argv[2]); print(f"cp 4 activations {a4} bytes = {100 * a4 / a1:.1f}% of cp 1 ({a1})"); sys.exit(a4 > 0.30 * a1)' \
    "${act[1]:-0}" "${act[4]:-0}" || { echo "FAIL: cp 4's activation bytes over 30% of cp 1's"; fail=1; }
exit $fail
