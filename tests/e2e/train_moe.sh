#!/usr/bin/env bash
# train_moe.sh: the mixture-of-experts decoder trains (issue 31).
#  1. tests/e2e/configs/moe.ini (8 experts, top-2, a gated shared expert, aux
#     and z losses) trains 20 steps on one rank in fp32 and in bf16: the mean
#     loss of steps 16-20 is at least 0.5 below that of steps 1-5, every step
#     record has moe_aux_loss (near k = 2 for a balanced router: in [1.9, 3]),
#     moe_z_loss, moe_dropped = 0 (dropless) and per-layer load min <= max.
#  2. Resume: runs stopped every 5 steps (train.exit_interval) and resumed
#     three times log the straight run's loss and lr at every step, and end
#     with byte-identical parameters (trident ckpt export); the bf16 run's
#     losses are not the fp32 run's.
#     dp 2 with ZeRO-1 logs 1 rank's losses and aux losses (steps 1-5, 1e-5;
#     the MoE counts summed over ranks).
#  3. A capacity factor drops assignments (moe_dropped > 0 at cf 0.5).
#  4. Refused with exit 2 naming model.moe_experts: the split (zero-bubble)
#     schedule zb-h1 (tp, cp, pp and ZeRO-2/3: tests/e2e/train_moe_parallel.sh;
#     recompute: train_recompute.sh).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
SMALL_INI=tests/e2e/configs/moe.ini
fail=0
train() { # NAME DTYPE [overrides]: one run into $tmp/run-NAME.K
    local name=$1 dt=$2 k=0 rc=0; shift 2
    while [ -e "$tmp/run-$name.$k" ]; do k=$((k + 1)); done
    mkdir -p "$tmp/run-$name.$k"
    small_train "$tmp/run-$name.$k" "$tmp/ck-$name" 1 1 1 0 precision.dtype="$dt" \
        checkpoint.every=0 checkpoint.keep_last=0 "$@" >> "$tmp/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: run $k of $name exited $rc"; tail -3 "$tmp/$name.log"; }
    return "$rc"
}
for dt in fp32 bf16; do
    train "straight-$dt" $dt || fail=1
    for i in 1 2 3 4; do train "stopped-$dt" $dt train.exit_interval=5 || fail=1; done
    for r in straight stopped; do
        "$TRIDENT" ckpt export "$tmp/ck-$r-$dt" "$tmp/$r-$dt.h5" > /dev/null || { echo "FAIL: export $r-$dt"; fail=1; }
    done
done
# 1 rank against dp 2 with ZeRO-1 (steps 1-5, the warmup): the same losses, aux losses and loads
mkdir -p "$tmp/run-dp2.0"
small_train "$tmp/run-dp2.0" "$tmp/ck-dp2" 1 1 2 1 train.steps=6 checkpoint.every=0 \
    > "$tmp/dp2.log" 2>&1 || { echo "FAIL: dp 2 run"; tail -3 "$tmp/dp2.log"; fail=1; }
train "capacity" fp32 model.moe_capacity_factor=0.5 train.steps=2 train.warmup_steps=1 || fail=1

"$PY" - "$tmp" <<'PY' || fail=1
import glob, json, sys, h5py, numpy as np
tmp = sys.argv[1]
def runs(name):
    dirs = sorted(glob.glob(f"{tmp}/run-{name}.*"), key=lambda d: int(d.rsplit(".", 1)[1]))
    return [[r for r in map(json.loads, open(f"{d}/metrics.jsonl")) if "loss" in r] for d in dirs]
def steps(name):
    out = {}
    for run in runs(name):
        for r in run:
            assert r["step"] not in out, f"{name}: step {r['step']} logged twice"
            out[r["step"]] = r
    return out
ok = True
for dt in ("fp32", "bf16"):
    s, r = steps(f"straight-{dt}"), steps(f"stopped-{dt}")
    if sorted(s) != list(range(1, 21)):
        print(f"FAIL: {dt}: steps {sorted(s)}"); ok = False; continue
    first = np.mean([s[k]["loss"] for k in range(1, 6)]); last = np.mean([s[k]["loss"] for k in range(16, 21)])
    if not last < first - 0.5: ok = False; print(f"FAIL: {dt}: loss {first:.3f} -> {last:.3f}, expected a fall of 0.5")
    else: print(f"{dt}: loss {first:.3f} (steps 1-5) -> {last:.3f} (steps 16-20)")
    for k, x in s.items():
        good = (1.9 <= x.get("moe_aux_loss", -1) <= 3 and x.get("moe_z_loss", -1) > 0 and x.get("moe_dropped") == 0
                and x.get("moe_layers") == [0, 1] and all(a <= b for a, b in zip(x["moe_load_min"], x["moe_load_max"]))
                and sum(x["moe_load_max"]) > 0)
        if not good: ok = False; print(f"FAIL: {dt} step {k}: MoE fields {[(f, x.get(f)) for f in x if f.startswith('moe')]}"); break
    diff = [k for k in range(1, 21) if (s[k]["loss"], s[k]["lr"], s[k]["moe_aux_loss"]) != (r.get(k, {}).get("loss"), r.get(k, {}).get("lr"), r.get(k, {}).get("moe_aux_loss"))]
    if diff: ok = False; print(f"FAIL: {dt}: stopped-and-resumed runs differ from the straight one at steps {diff}")
    fa, fb = h5py.File(f"{tmp}/straight-{dt}.h5"), h5py.File(f"{tmp}/stopped-{dt}.h5")
    bad = [k for k in fa if k not in fb or not np.array_equal(fa[k][()], fb[k][()])]
    if bad or sorted(fa) != sorted(fb): ok = False; print(f"FAIL: {dt}: final parameters differ in {bad[:3]}")
    else: print(f"{dt}: 20 steps straight == 3 resumes (loss, lr, aux loss each step), {len(fa)} tensors byte-identical")
a, b = steps("straight-fp32"), steps("straight-bf16")
if all(a[k]["loss"] == b.get(k, {}).get("loss") for k in a): ok = False; print("FAIL: the bf16 run logged the fp32 run's losses (dtype not applied?)")
d2 = steps("dp2")
bad = [k for k in range(1, 6) if k not in d2 or abs(d2[k]["loss"] - a[k]["loss"]) > 1e-5 * a[k]["loss"]
       or abs(d2[k]["moe_aux_loss"] - a[k]["moe_aux_loss"]) > 1e-5 * a[k]["moe_aux_loss"]]
if bad: ok = False; print(f"FAIL: dp 2 + ZeRO-1 differs from 1 rank at steps {bad}")
else: print("dp 2 + ZeRO-1: steps 1-5 (the warmup: the same lr) give 1 rank's losses and aux losses (1e-5)")
c = steps("capacity")
if not c or not all(x["moe_dropped"] > 0 for x in c.values()): ok = False; print(f"FAIL: capacity 0.5 dropped {[x.get('moe_dropped') for x in c.values()]}")
else: print(f"capacity factor 0.5: dropped {[x['moe_dropped'] for x in c.values()]} assignments")
sys.exit(0 if ok else 1)
PY

for bad in parallel.pp_schedule=zb-h1; do
    rc=0
    out=$(OMPI_MCA_odls_base_sigkill_timeout=0 timeout 60 "${MPIRUN[@]}" -np 2 \
          "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" log.run_dir="$tmp/run-refused" parallel.pp=2 "$bad" 2>&1) || rc=$?
    if [ "$rc" = 2 ] && grep -q "model.moe_experts = 8" <<<"$out" && grep -q "${bad%%=*}" <<<"$out"; then
        echo "refused ($bad): $(grep -m1 moe_experts <<<"$out" | cut -c1-160)"
    else
        echo "FAIL: $bad with MoE: exit $rc"; grep trident: <<<"$out" | head -2 || true; fail=1
    fi
done
exit $fail
