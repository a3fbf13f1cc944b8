#!/usr/bin/env bash
# train_zb_layouts.sh: the zero-bubble schedules against 1F1B of the same
# layout, bit for bit (every step's loss and gradient norm as logged), 6 steps
# of a 4-layer model, where tests/e2e/train_zb.sh does not go. With data
# parallelism and a tied embedding at (tp, pp, dp) = (1, 2, 2):
#  - zbv (the embedding and the head on stage 0: the head's share of the
#    embedding's gradient apart, summed over dp by grad_sync.c and added in
#    model_finish_grads) at zero_stage 0 (grad_dtype fp32 and bf16) and 1;
#  - zb-h1 at zero_stage 2 and 3 (fsdp.c: the tied embedding's buffer bound
#    at the head's W and reduce-scattered after it).
# And the model's split under the other layouts (model_pass.c: what B
# gathers and stashes): zbv at (2, 2, 1) with sequence parallelism and
# recompute selective (norm outputs all-gathered into the shared buffer:
# stashed); zb-h1 at cp 2, pp 2 with recompute full and packed documents
# (the ring attention's backward in B); zbv at tp 4 (key/value heads
# replicated over TP ranks, n_kv_heads 2) in bf16.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py numpy
small_dataset "$tmp"
common=(data.path="$tmp/shards" train.global_batch_size=16 train.steps=6 train.lr=2e-3 train.min_lr=2e-4
        train.eval_every=0 model.n_layers=4 parallel.pp=2)
run() { # name settings...
    local name=$1 rc=0 np=4
    shift
    [[ " $* " == *" parallel.tp=4 "* ]] && np=8
    timeout 300 "${MPIRUN[@]}" -np $np "$TRIDENT" train "$SMALL_INI" "${common[@]}" "$@" \
        checkpoint.dir="$tmp/ck-$name" log.run_dir="$tmp/run-$name" > "$tmp/log-$name" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$name"; fail "$name run exited $rc"; }
}
pairs=()
for c in zbv:0:fp32 zbv:0:bf16 zbv:1:fp32 zb-h1:2:fp32 zb-h1:3:fp32; do
    IFS=: read -r sched zero gd <<< "$c"
    v=1; [ "$sched" = zbv ] && v=2
    tied=(model.tie_embeddings=true parallel.dp=2 parallel.zero_stage=$zero precision.grad_dtype=$gd)
    run "1f1b-$zero-$gd" "${tied[@]}"
    run "$sched-$zero-$gd" "${tied[@]}" parallel.virtual_stages=$v parallel.pp_schedule=$sched
    pairs+=("$sched-$zero-$gd:1f1b-$zero-$gd")
done
sp=(parallel.tp=2 parallel.sequence_parallel=true model.recompute=selective)
cpx=(parallel.cp=2 model.recompute=full data.packing=concat_reset)
kv=(parallel.tp=4 precision.dtype=bf16)
run sp-1f1b "${sp[@]}"
run sp-zbv "${sp[@]}" parallel.virtual_stages=2 parallel.pp_schedule=zbv
run cp-1f1b "${cpx[@]}"
run cp-zb-h1 "${cpx[@]}" parallel.pp_schedule=zb-h1
run kv-1f1b "${kv[@]}"
run kv-zbv "${kv[@]}" parallel.virtual_stages=2 parallel.pp_schedule=zbv
pairs+=(sp-zbv:sp-1f1b cp-zb-h1:cp-1f1b kv-zbv:kv-1f1b)
"$PY" - "$tmp" "${pairs[@]}" <<'PY'
import json, sys
tmp, names = sys.argv[1], sys.argv[2:]
def steps(name):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{tmp}/run-{name}/metrics.jsonl"))
            if "grad_norm" in r]
ok = True
for pair in names:
    name, ref = pair.split(":")
    a, b = steps(name), steps(ref)
    if a != b or len(a) != 6:
        ok = False
        print(f"FAIL: {name} differs from {ref}: {a} vs {b}")
    else:
        print(f"{name}: 6 steps' loss and grad norm bit-identical to {ref}")
sys.exit(0 if ok else 1)
PY
echo "train_zb_layouts: ok"
