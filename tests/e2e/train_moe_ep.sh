#!/usr/bin/env bash
# train_moe_ep.sh: expert parallelism (issue 31, [parallel] ep): the tiny MoE
# model of tests/e2e/configs/moe.ini (8 routed experts, top-2, one gated
# shared expert, aux and z losses) in fp32 on 4 data ranks.
#  1. ep 2 and ep 4 (each rank 4 or 2 of the 8 experts, tokens sent to them
#     and back by all-to-all) train the ep 1 run's per-step loss, grad norm,
#     aux and z losses within 1e-6 (relative) over 10 steps; the manifest
#     and the start record say ep = 2; with a capacity factor (1.0, dropping
#     before the dispatch) ep 4 logs ep 1's losses and dropped counts.
#  2. The step-5 checkpoint of the ep 2 run resumes at ep 1 and at ep 4:
#     steps 6-10 within 1e-6 of the straight runs in those layouts, final
#     parameters within 1e-4 (relative to each tensor's largest value).
#  3. The resharding is exact: the ep 2 checkpoint loaded at ep 4 and at
#     ep 1 and saved again after a step at lr 1e-30 (Adam moves no weight)
#     exports the same parameters, bit for bit.
#  4. Refused with exit 2, naming the key: ep 3 (does not divide 8 experts),
#     ep 2 with zero_stage 1, ep 2 with a dense model.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
SMALL_INI=tests/e2e/configs/moe.ini
fail=0
train() { # NAME NP [overrides]: one run into $tmp/run-NAME, checkpoints in $tmp/ck-NAME
    # (STEPS, default 10; EVERY: checkpoint.every, default 5)
    local name=$1 np=$2 rc=0; shift 2
    timeout 300 "${MPIRUN[@]}" -np "$np" "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        train.global_batch_size=16 train.warmup_steps=2 train.eval_every=0 train.steps="${STEPS:-10}" \
        checkpoint.every="${EVERY:-5}" checkpoint.dir="$tmp/ck-$name" log.run_dir="$tmp/run-$name" "$@" \
        > "$tmp/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { echo "FAIL: run $name exited $rc"; grep trident: "$tmp/$name.log" | tail -3; }
    return "$rc"
}
for ep in 1 2 4; do train "ep$ep" 4 parallel.dp=4 parallel.ep=$ep || fail=1; done
for ep in 1 4; do
    STEPS=4 EVERY=0 train "cap-ep$ep" 4 parallel.dp=4 parallel.ep=$ep model.moe_capacity_factor=1.0 \
        || fail=1
done
# 2. resume the ep 2 run's step 5 at ep 1 and ep 4
for ep in 1 4; do
    mkdir -p "$tmp/ck-from2-ep$ep"
    cp -r "$tmp/ck-ep2/step-000005" "$tmp/ck-from2-ep$ep/"
    echo step-000005 > "$tmp/ck-from2-ep$ep/latest"
    train "from2-ep$ep" 4 parallel.dp=4 parallel.ep=$ep || fail=1
done
# 3. the same checkpoint loaded and saved again with no weight moved
for ep in 1 4; do
    mkdir -p "$tmp/ck-still-ep$ep"
    cp -r "$tmp/ck-ep2/step-000005" "$tmp/ck-still-ep$ep/"
    echo step-000005 > "$tmp/ck-still-ep$ep/latest"
    STEPS=6 EVERY=1 train "still-ep$ep" 4 parallel.dp=4 parallel.ep=$ep train.min_lr=1e-30 \
        train.override_schedule=true || fail=1
done
"$TRIDENT" ckpt export "$tmp/ck-ep2/step-000005" "$tmp/ep2-5.h5" > /dev/null || fail=1
for ep in 1 4; do
    "$TRIDENT" ckpt export "$tmp/ck-still-ep$ep/step-000006" "$tmp/still-$ep.h5" > /dev/null || fail=1
    "$TRIDENT" ckpt export "$tmp/ck-from2-ep$ep/step-000010" "$tmp/from2-$ep.h5" > /dev/null || fail=1
    "$TRIDENT" ckpt export "$tmp/ck-ep$ep/step-000010" "$tmp/straight-$ep.h5" > /dev/null || fail=1
done
grep -qx "ep = 2" "$tmp/ck-ep2/step-000005/manifest.ini" ||
    { echo "FAIL: the ep 2 manifest has no 'ep = 2' line"; fail=1; }

"$PY" - "$tmp" <<'PY' || fail=1
import json, sys, h5py, numpy as np
tmp = sys.argv[1]
def recs(name):
    return [json.loads(l) for l in open(f"{tmp}/run-{name}/metrics.jsonl")]
def steps(name):
    return {r["step"]: r for r in recs(name) if "loss" in r}
def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)
ok = True
keys = ("loss", "grad_norm", "moe_aux_loss", "moe_z_loss")
def same(name, ref, first, last, what):
    global ok
    a, b = steps(name), steps(ref)
    worst = 0.0
    for s in range(first, last + 1):
        if s not in a or s not in b:
            print(f"FAIL: {what}: step {s} missing"); ok = False; return
        for k in keys:
            worst = max(worst, rel(a[s][k], b[s][k]))
        if a[s]["moe_dropped"] != b[s]["moe_dropped"]:
            print(f"FAIL: {what}: step {s} dropped {a[s]['moe_dropped']} != {b[s]['moe_dropped']}"); ok = False
    print(f"{what}: steps {first}-{last}, worst relative difference {worst:.2e}")
    if worst > 1e-6:
        print(f"FAIL: {what}: {worst:.2e} > 1e-6"); ok = False
same("ep2", "ep1", 1, 10, "ep 2 vs ep 1")
same("ep4", "ep1", 1, 10, "ep 4 vs ep 1")
same("cap-ep4", "cap-ep1", 1, 4, "capacity 1.0: ep 4 vs ep 1")
if sum(r["moe_dropped"] for r in steps("cap-ep1").values()) == 0:
    print("FAIL: capacity 1.0 dropped nothing: the capacity case tests nothing"); ok = False
same("from2-ep1", "ep1", 6, 10, "ep 2's step 5 resumed at ep 1 vs straight ep 1")
same("from2-ep4", "ep4", 6, 10, "ep 2's step 5 resumed at ep 4 vs straight ep 4")
start = next(r for r in recs("ep2") if r.get("event") == "start")
if json.dumps(start).find('"ep": 2') < 0:
    print("FAIL: the ep 2 start record does not say ep 2"); ok = False
def tensors(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
base = tensors(f"{tmp}/ep2-5.h5")
if not any(".experts." in n for n in base):
    print("FAIL: no expert tensors in the export"); ok = False
for ep in (1, 4):
    still = tensors(f"{tmp}/still-{ep}.h5")
    diff = [n for n in base if n not in still or not np.array_equal(base[n], still[n])]
    print(f"ep 2 -> ep {ep} resharding: {len(base) - len(diff)} of {len(base)} tensors bit-identical")
    if diff or set(still) != set(base):
        print(f"FAIL: resharded to ep {ep}: {diff[:3]} differ"); ok = False
    a, b = tensors(f"{tmp}/from2-{ep}.h5"), tensors(f"{tmp}/straight-{ep}.h5")
    worst = max(float(np.abs(a[n] - b[n]).max() / (np.abs(b[n]).max() + 1e-30)) for n in b)
    print(f"resumed at ep {ep} vs straight: final parameters within {worst:.2e}")
    if worst > 1e-4:
        print(f"FAIL: final parameters {worst:.2e} > 1e-4"); ok = False
sys.exit(0 if ok else 1)
PY

# 4. refusals
refused() { # WHAT KEY NP overrides...: exit 2 naming KEY
    local what=$1 key=$2 np=$3 rc=0; shift 3
    timeout 60 "${MPIRUN[@]}" -np "$np" "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        checkpoint.dir="$tmp/ck-bad" log.run_dir="$tmp/run-bad" "$@" > "$tmp/bad.log" 2>&1 || rc=$?
    if [ "$rc" -ne 2 ] || ! grep -q "$key" "$tmp/bad.log"; then
        echo "FAIL: $what: exit $rc, expected 2 naming $key"; grep trident: "$tmp/bad.log" | head -2; fail=1
    fi
}
refused "ep 3 of 8 experts" parallel.ep 3 parallel.dp=3 parallel.ep=3 train.global_batch_size=12
refused "ep 2 with ZeRO-1" parallel.zero_stage 2 parallel.dp=2 parallel.ep=2 parallel.zero_stage=1
refused "ep 2, dense model" model.moe_experts 2 parallel.dp=2 parallel.ep=2 model.moe_experts=0
[ "$fail" -eq 0 ] || exit 1
echo "train_moe_ep: ok"
