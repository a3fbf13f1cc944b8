#!/usr/bin/env bash
# tensorboard.sh: TensorBoard event files in the run folder (issue 15,
# [log] tensorboard; docs/design.md §9, "TensorBoard and Prometheus").
#  1. A dp=2 fp16 run of 8 steps with validation at steps 4 and 8 and
#     checkpoints at 4 and 8, then a second attempt resumed from a copy of the
#     step-4 checkpoint alone (as after a crash before step 8's save): the run folder holds one
#     event file per attempt.
#  2. TensorBoard's own reader (tensorboard.backend.event_processing.
#     event_accumulator, the folder as one run) reads them: every scalar of
#     every step record of metrics.jsonl (which a resume keeps as one curve)
#     equals TensorBoard's value at that step within float32 rounding plus
#     the JSON's printed rounding, and validation losses likewise; each step
#     appears once (the second attempt's SessionLog START dropped the first
#     attempt's steps 5-8, whose timings differ), under Megatron-LM's tag names.
#  3. [log] tensorboard = false writes no event file.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py tensorboard prometheus_client
small_dataset "$tmp"
run=$tmp/run ck=$tmp/ck
train() {
    timeout 300 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        parallel.dp=2 train.global_batch_size=8 train.eval_every=4 \
        precision.dtype=fp16 precision.loss_scale_initial=4096 checkpoint.dir="$ck" checkpoint.every=4 log.run_dir="$run" "$@" \
        >> "$tmp/train.log" 2>&1 || { tail -20 "$tmp/train.log"; fail "train $* exited non-zero"; }
}
train train.steps=8
sleep 1.1 # the second attempt's file a second later, as a requeue would be
# A crash after step 8's log line and before its checkpoint: only step 4's is left.
mkdir "$tmp/ck2" && cp -r "$ck/step-000004" "$tmp/ck2/" && ck=$tmp/ck2
train train.steps=8 checkpoint.resume="$ck/step-000004"
n=$(ls "$run" | grep -c '^events\.out\.tfevents\.') || true
[ "$n" = 2 ] || fail "$n event files in the run folder, expected 2 (one per attempt)"

"$PY" - "$run" <<'EOF' || fail "TensorBoard's reader disagrees with metrics.jsonl"
import json, math, sys
from tensorboard.backend.event_processing import event_accumulator as ea
run = sys.argv[1]
acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
# metrics.jsonl key -> (TensorBoard tag, scale, half a unit of the JSON's printed rounding)
keys = {"loss": ("lm loss", 1, 5e-7), "lr": ("learning-rate", 1, None),
        "grad_norm": ("grad-norm", 1, 5e-7), "tokens_per_s": ("tokens-per-second", 1, 0.5),
        "mfu": ("mfu", 1, 5e-5), "mem_bytes": ("memory-bytes", 1, 0),
        "step_time_s": ("iteration-time", 1, 5e-5), "data_wait_ms": ("data-wait-ms", 1, 5e-4),
        "skipped": ("skipped", 1, 0), "skipped_steps": ("skipped-steps", 1, 0),
        "loss_scale": ("loss-scale", 1, 0), "val_loss": ("lm loss validation", 1, 5e-5)}
want_tags = {t for t, _, _ in keys.values()}
bad = []
if tags != want_tags:
    bad.append(f"tags {sorted(tags)} != {sorted(want_tags)}")
recs = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
recs = [r for r in recs if "loss" in r or "val_loss" in r]
checked = 0
for key, (tag, scale, half) in keys.items():
    if tag not in tags:
        continue
    events = acc.Scalars(tag)
    steps = [e.step for e in events]
    if len(steps) != len(set(steps)):
        bad.append(f"{tag}: steps {steps} repeat (an earlier attempt's steps were not dropped)")
    tb = {e.step: e.value for e in events}
    js = {r["step"]: r[key] for r in recs if key in r}
    if sorted(tb) != sorted(js):
        bad.append(f"{tag}: TensorBoard steps {sorted(tb)}, metrics.jsonl steps {sorted(js)}")
    for step, v in js.items():
        if step not in tb:
            continue
        if v is None:  # JSON null: a non-finite value
            ok = not math.isfinite(tb[step])
        else:
            tol = (abs(v) * 5e-4 if half is None else half) + abs(v) * 2**-23
            ok = abs(tb[step] - v * scale) <= tol
        checked += 1
        if not ok:
            bad.append(f"{tag} at step {step}: TensorBoard {tb[step]!r}, metrics.jsonl {v!r}")
for b in bad:
    print("FAIL:", b)
print(f"tensorboard: {checked} values of {len(tags)} tags checked against metrics.jsonl; "
      f"steps {sorted({e.step for e in acc.Scalars('lm loss')})}")
sys.exit(1 if bad or checked < 90 else 0)
EOF

# 2b. A mixture-of-experts run: its aux loss, z loss and dropped count
# (metrics.jsonl's moe_aux_loss, moe_z_loss, moe_dropped) under Megatron-Core's
# tags; the dense run above has none of them (its tag set is exact). The same
# three in its Prometheus file (trident_moe_aux_loss, trident_moe_z_loss,
# trident_moe_dropped_tokens) equal the last step record's.
timeout 300 "${MPIRUN[@]}" -np 1 "$TRIDENT" train tests/e2e/configs/moe.ini data.path="$tmp/shards" \
    train.steps=3 train.warmup_steps=1 train.eval_every=0 checkpoint.every=0 \
    log.prometheus_file="$tmp/moe.prom" \
    checkpoint.dir="$tmp/ck-moe" log.run_dir="$tmp/run-moe" >> "$tmp/train.log" 2>&1 ||
    { tail -20 "$tmp/train.log"; fail "the MoE run exited non-zero"; }
"$PY" - "$tmp/run-moe" <<'EOF2' || fail "TensorBoard's MoE scalars disagree with metrics.jsonl"
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
run = sys.argv[1]
acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0})
acc.Reload()
recs = [r for r in map(json.loads, open(f"{run}/metrics.jsonl")) if "loss" in r]
bad = 0
for key, tag in (("moe_aux_loss", "load_balancing_loss"), ("moe_z_loss", "z_loss"),
                 ("moe_dropped", "moe-dropped-tokens")):
    tb = {e.step: e.value for e in acc.Scalars(tag)} if tag in acc.Tags()["scalars"] else {}
    js = {r["step"]: r[key] for r in recs}
    if sorted(tb) != sorted(js) or any(abs(tb[s] - v) > 5e-7 + abs(v) * 2**-23 for s, v in js.items()):
        print(f"FAIL: {tag}: TensorBoard {tb}, metrics.jsonl {js}"); bad = 1
print(f"tensorboard: MoE scalars of {len(recs)} steps checked")
sys.exit(bad)
EOF2
"$PY" - "$tmp/run-moe" "$tmp/moe.prom" <<'EOF3' || fail "the Prometheus file's MoE gauges disagree with metrics.jsonl"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
last = [r for r in map(json.loads, open(f"{sys.argv[1]}/metrics.jsonl")) if "loss" in r][-1]
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[2]).read())}
bad = 0
for key, name in (("moe_aux_loss", "trident_moe_aux_loss"), ("moe_z_loss", "trident_moe_z_loss"),
                  ("moe_dropped", "trident_moe_dropped_tokens")):
    got = fams[name].samples[0].value if name in fams else None
    if got is None or fams[name].type != "gauge" or abs(got - last[key]) > 5e-7 + abs(last[key]) * 1e-12:
        print(f"FAIL: {name} = {got}, metrics.jsonl step {last['step']} {key} = {last[key]}"); bad = 1
print(f"prometheus: MoE gauges of step {last['step']} checked")
sys.exit(bad)
EOF3

rm -rf "$run" "$ck"
train train.steps=5 log.tensorboard=false
! ls "$run" | grep -q tfevents || fail "log.tensorboard=false wrote an event file"
echo "tensorboard: ok"
