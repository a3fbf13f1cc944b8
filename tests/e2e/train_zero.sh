#!/usr/bin/env bash
# train_zero.sh: parallel.zero_stage = 2 and 3 (src/train/fsdp.h) against
# ZeRO-1, 10 steps of the small config.
#  1. fp32, (tp, pp, dp) = (1,1,4) untied with one microbatch per rank (zero
#     2, 3 and 3 with reshard_after_forward = false), (2,1,2) untied with
#     sequence parallelism (zero 3), (1,2,2) 1F1B tied (zero 2, 3: the
#     embedding group's sum of the gradient shards), (1,2,2) interleaved
#     (virtual_stages 2, 4 layers) untied (zero 3), (2,2,2)+SP tied (zero 3),
#     dp 4 with dp_shard 2 (hybrid sharding: slices of 2 ranks, all-reduced
#     over the 2 replicas; the first replica saves; zero 2, 3):
#     every step's loss and grad norm within 2e-6 relative of zero 1's
#     (metrics.jsonl's 6 decimals; the norm's sum runs over other shards, and
#     with several microbatches each unit is reduce-scattered per
#     microbatch), and the final parameters (trident ckpt export of each
#     run's last checkpoint: ZeRO-2/3 ranks save their slice of every unit)
#     within 1e-6 relative per tensor (3e-6 for the hybrid layout, whose
#     two-level sum differs from ZeRO-1's order: 2.0e-6 on an AMD EPYC).
#  2. bf16 with recompute = full in (1,1,4) and fp16 (static loss scale
#     1024) with recompute = selective in (2,1,2)+SP: zero 3's losses within
#     2e-3 relative of zero 1's (a norm summed in another order moves the
#     clip coefficient by ~1e-7, enough to flip a bf16 rounding); zero 3's
#     recompute = full bitwise equal to its recompute = none (the recomputed
#     forward reuses the unit gathered for the backward). grad_dtype
#     = bf16 at dp 2 with one microbatch: zero 3 bitwise equal to zero 1
#     (each unit rounded to bf16 and reduce-scattered: the same pairwise
#     sums; at dp 4 MPI's combining order, which depends on the message
#     size, moves the norm by ~5e-5).
#     An fp16 overflow injected into one rank of the second replica at
#     dp 4 with dp_shard 2 (TRIDENT_FAULT=grad_inf) skips the step on every
#     rank: the same losses and norms as the same fault at dp_shard 4.
#  3. The step record (zero 3, (1,1,4), 4 units: embedding, 2 blocks, head):
#     zero_prefetched > 0 of zero_gathers = 6 (each unit gathered for its
#     forward and again for its backward, but the embedding, whose backward
#     reads no parameter, and the head, kept gathered from its forward to
#     its backward), zero_rs_early == zero_rs = 4; at
#     most 2 units gathered at once (zero_live_max <= prefetch depth + 1)
#     under reshard_after_forward, all 4 without it. With
#     TRIDENT_ZERO_PREFETCH=0 and TRIDENT_ZERO_OVERLAP=0: zero_prefetched = 0
#     and zero_rs_early = 0, and the same losses.
#  4. Checkpoints across stages: the bf16 zero-3 run stopped after step 5
#     (train.exit_interval) and resumed gives steps 6-10 bitwise equal to the
#     straight run (the FP32 master slices saved and read back by each rank;
#     ZeRO-3 reads only its own slices). Zero 3
#     in (2,1,4) and zero 1 in (1,2,2) save at step 5; each checkpoint
#     resumed in the other stage and layout gives steps 6-10 within 2e-6 of
#     the run that saved it and of the uninterrupted run in the resumed
#     layout, and the zero-1 continuation stopped after step 8
#     and resumed is bitwise equal to itself uninterrupted.
#  5. Memory (trident plan == the run's mem_bytes on rank 0) for zero 2 and
#     3 in (1,1,4) is in plan_matches_run.sh. Here, plan arithmetic for
#     configs/gpt2-small.ini at dp 4 in bf16: zero 3's parameter + gradient
#     + optimizer bytes per rank are (P + G + O) / 4 of the unsharded model
#     plus the unit buffers (2 gather buffers of the largest unit in bf16, 2
#     unit gradient buffers in fp32 and their reduce-scatter results), and
#     at most 57% of zero 1's (the shards alone are 45% of zero 1's: at dp 4
#     ZeRO-1 already divides the 12 optimizer bytes per parameter and its
#     gradient shard by 4, so the issue's "at most 30%" cannot hold: (2 + 4 +
#     12) / 4 = 4.5 bytes per parameter against ZeRO-1's 2 + 4 + 16 / 4 = 10).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
fail=0
# train NAME TP DP ZERO [overrides...]: 10 steps, checkpoint at the end in $tmp/ck-NAME.
# Untied unless TIED=true; PP=2: two stages; lr 2e-3 as train_layouts.sh (at
# 3e-3 the tied model's step-9 norm spike is ill-conditioned: zero 0 and 1 differ by 3e-5).
train() {
    local name=$1 tp=$2 dp=$3 z=$4 rc=0; shift 4
    timeout 120 "${MPIRUN[@]}" -np $((tp * dp * ${PP:-1})) "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        model.tie_embeddings=${TIED:-false} train.steps=10 train.eval_every=0 train.lr=2e-3 train.min_lr=2e-4 \
        parallel.tp=$tp parallel.pp=${PP:-1} parallel.dp=$dp \
        parallel.zero_stage=$z checkpoint.dir="$tmp/ck-$name" log.run_dir="$tmp/run-$name" "$@" \
        < /dev/null >> "$tmp/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -5 "$tmp/$name.log"; echo "FAIL: $name exited $rc"; fail=1; }
}
export_final() { "$TRIDENT" ckpt export "$tmp/ck-$1" "$tmp/$1.h5" > /dev/null || { echo "FAIL: export $1"; fail=1; }; }
# compare REF OTHER REL [PARAMS_REL]: losses and norms of every step (and the
# exported final parameters when PARAMS_REL is given).
compare() {
    "$PY" - "$tmp" "$@" <<'PY' || fail=1
import json, sys
tmp, ref, other, rel = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
prel = float(sys.argv[5]) if len(sys.argv) > 5 else None
def steps(name):
    return {r["step"]: r for r in map(json.loads, open(f"{tmp}/run-{name}/metrics.jsonl")) if "loss" in r}
a, b = steps(ref), steps(other)
assert sorted(a) == sorted(b) == list(range(1, 11)), f"{other}: steps {sorted(b)}"
worst = 0
for s in a:
    for k in ("loss", "grad_norm"):
        if a[s][k] is None and b[s][k] is None: continue
        worst = max(worst, abs(a[s][k] - b[s][k]) / abs(a[s][k]))
msg = f"{other} vs {ref}: worst step rel {worst:.1e}"
ok = worst <= rel
if prel is not None:
    import h5py, numpy as np
    fa, fb = h5py.File(f"{tmp}/{ref}.h5"), h5py.File(f"{tmp}/{other}.h5")
    assert sorted(fa) == sorted(fb)
    pw = max(np.linalg.norm(fa[k][()] - fb[k][()]) / np.linalg.norm(fa[k][()]) for k in fa)
    msg += f", final parameters worst rel {pw:.1e}"
    ok = ok and pw <= prel
print(("" if ok else "FAIL: ") + msg)
sys.exit(0 if ok else 1)
PY
}
# 1. fp32: TAG PP TIED TP DP STAGES... [overrides...] (3k: zero 3, reshard_after_forward = false)
while read -r tag pp tied tp dp rest; do
    stages=() extra=()
    for w in $rest; do if [[ $w == *=* ]]; then extra+=("$w"); else stages+=("$w"); fi; done
    for z in "${stages[@]}"; do
        zz=${z%k}; keep=(); [ "$z" = "$zz" ] || keep=(parallel.reshard_after_forward=false)
        PP=$pp TIED=$tied train "f$tag-$z" $tp $dp $zz "${extra[@]}" "${keep[@]}"
        export_final "f$tag-$z"
        # hybrid sharding sums in two levels (a slice's reduce-scatter, then the
        # replicas' all-reduce), ZeRO-1 in one over all 4: measured 2.0e-6 on
        # an AMD EPYC (2026-12-02), under 1e-6 on the Intel Xeons before
        prel=1e-6; [ "$tag" = 114h ] && prel=3e-6
        [ "$z" = 1 ] || compare "f$tag-1" "f$tag-$z" 2e-6 $prel
    done
done <<'LAYOUTS'
114 1 false 1 4 1 2 3 3k
212 1 false 2 2 1 3 parallel.sequence_parallel=true
122 2 true 1 2 1 2 3 train.global_batch_size=16
122v 2 false 1 2 1 3 train.global_batch_size=16 parallel.virtual_stages=2 model.n_layers=4
222 2 true 2 2 1 3 train.global_batch_size=16 parallel.sequence_parallel=true
114h 1 false 1 4 1 2 3 parallel.dp_shard=2 train.global_batch_size=16
LAYOUTS
# 2. bf16 and fp16
for z in 1 3; do
    train "b-$z" 1 4 $z precision.dtype=bf16 model.recompute=full
    train "h-$z" 2 2 $z precision.dtype=fp16 precision.loss_scale=1024 model.recompute=selective \
        parallel.sequence_parallel=true
done
compare b-1 b-3 2e-3
compare h-1 h-3 2e-3
train bn-3 1 4 3 precision.dtype=bf16 model.recompute=none
compare bn-3 b-3 0
for z in 1 3; do train "g-$z" 1 2 $z precision.grad_dtype=bf16 train.global_batch_size=4; done
compare g-1 g-3 0
# fp16 overflow on one rank under hybrid sharding: TRIDENT_FAULT=grad_inf:3@3
# (world rank 3, in the second replica) puts an inf into that rank's
# gradients as its backward would; it reaches both replicas' norms, so every
# rank skips step 3 (not only rank 3's replica, which would then diverge):
# the same curve as the same fault at dp_shard 4 (one shard group).
FP16F=(precision.dtype=fp16 precision.loss_scale_initial=4096)
TRIDENT_FAULT=grad_inf:3@3 train fs4 1 4 3 "${FP16F[@]}"
TRIDENT_FAULT=grad_inf:3@3 train fs2 1 4 3 "${FP16F[@]}" parallel.dp_shard=2
"$PY" - "$tmp" <<'PY' || fail=1
import json, sys
def steps(n): return [r for r in map(json.loads, open(f"{sys.argv[1]}/run-{n}/metrics.jsonl")) if "loss" in r]
a, b = steps("fs4"), steps("fs2")
skipped = [r["step"] for r in b if r["grad_norm"] is None]
same = len(a) == len(b) == 10 and all(
    (x["grad_norm"] is None) == (y["grad_norm"] is None) and abs(x["loss"] - y["loss"]) <= 2e-6 * abs(x["loss"])
    and (x["grad_norm"] is None or abs(x["grad_norm"] - y["grad_norm"]) <= 2e-6 * x["grad_norm"]) for x, y in zip(a, b))
print(("" if skipped == [3] and same else "FAIL: ") +
      f"grad_inf on rank 3 at dp 4, dp_shard 2: skipped steps {skipped} (want [3]), the dp_shard 4 curve within 2e-6: {same}")
sys.exit(0 if skipped == [3] and same else 1)
PY
# 3. the step record
TRIDENT_ZERO_PREFETCH=0 TRIDENT_ZERO_OVERLAP=0 train off 1 4 3
compare f114-3 off 0
"$PY" - "$tmp" <<'PY' || fail=1
import json, sys
tmp = sys.argv[1]
def rec(name):
    return [r for r in map(json.loads, open(f"{tmp}/run-{name}/metrics.jsonl")) if "loss" in r][-1]
on, keep, off, z2 = rec("f114-3"), rec("f114-3k"), rec("off"), rec("f114-2")
ok = (on["zero_gathers"] == 6 and on["zero_prefetched"] > 0 and on["zero_rs"] == 4
      and on["zero_rs_early"] == 4 and on["zero_live_max"] <= 2
      and keep["zero_live_max"] == 4 and keep["zero_gathers"] == 4
      and off["zero_prefetched"] == 0 and off["zero_rs_early"] == 0 and off["zero_gathers"] == 6
      and z2["zero_rs"] == 4 and z2["zero_gathers"] == 0)
for n, r in (("zero 3", on), ("zero 3 keep", keep), ("zero 3 no prefetch/overlap", off), ("zero 2", z2)):
    print(n, {k: v for k, v in r.items() if k.startswith("zero_")})
print("step records ok" if ok else "FAIL: step records")
sys.exit(0 if ok else 1)
PY
# 4. checkpoints across stages
train br 1 4 3 precision.dtype=bf16 model.recompute=full train.exit_interval=5
train br 1 4 3 precision.dtype=bf16 model.recompute=full
compare b-3 br 0
"$PY" - "$tmp" <<'PY' || fail=1
import json, sys
r = [x["step"] for x in map(json.loads, open(f"{sys.argv[1]}/run-br/metrics.jsonl")) if "loss" in x]
assert r == list(range(1, 11)), f"br: steps {r}"
PY
# Across stages and layouts (issue 25's acceptance 5): zero 3 in (2,1,4) and
# zero 1 in (1,2,2), each saving at step 5; each step-5 checkpoint resumed in
# the other layout and stage continues within 2e-6 of the straight run that
# saved it and of the uninterrupted run in the resumed layout (fp32: the two
# layouts sum in other orders, so bitwise is not to be had) and the resumed run, stopped after step 8 and
# resumed again, is bitwise equal to itself uninterrupted (loader included).
PP=1 train x3 2 4 3 train.global_batch_size=16 checkpoint.every=5 checkpoint.keep_last=0
PP=2 train x1 1 2 1 train.global_batch_size=16 checkpoint.every=5 checkpoint.keep_last=0
PP=2 train x3to1 1 2 1 train.global_batch_size=16 checkpoint.resume="$tmp/ck-x3/step-000005"
PP=1 train x1to3 2 4 3 train.global_batch_size=16 checkpoint.resume="$tmp/ck-x1/step-000005"
PP=2 train x3to1s 1 2 1 train.global_batch_size=16 checkpoint.resume="$tmp/ck-x3/step-000005" train.exit_interval=3
PP=2 train x3to1s 1 2 1 train.global_batch_size=16
"$PY" - "$tmp" <<'PY' || fail=1
import json, sys
tmp = sys.argv[1]
def steps(n): return {r["step"]: r for r in map(json.loads, open(f"{tmp}/run-{n}/metrics.jsonl")) if "loss" in r}
ok = True
for ref, res, what in (("x3", "x3to1", "zero-3 (2,1,4) step 5 resumed at zero 1 in (1,2,2), against the run that saved it"),
                       ("x1", "x1to3", "zero-1 (1,2,2) step 5 resumed at zero 3 in (2,1,4), against the run that saved it"),
                       ("x1", "x3to1", "zero-3 (2,1,4) step 5 resumed at zero 1 in (1,2,2), against zero 1 (1,2,2) uninterrupted"),
                       ("x3", "x1to3", "zero-1 (1,2,2) step 5 resumed at zero 3 in (2,1,4), against zero 3 (2,1,4) uninterrupted")):
    a, b = steps(ref), steps(res)
    assert sorted(b) == list(range(6, 11)), f"{res}: steps {sorted(b)}"
    w = max(abs(a[s][k] - b[s][k]) / abs(a[s][k]) for s in b for k in ("loss", "grad_norm"))
    ok = ok and w <= 2e-6
    print(("" if w <= 2e-6 else "FAIL: ") + f"{what}: steps 6-10 within {w:.1e} of the straight run")
a, b = steps("x3to1"), steps("x3to1s")
same = sorted(b) == list(range(6, 11)) and all(a[s]["loss"] == b[s]["loss"] and a[s]["grad_norm"] == b[s]["grad_norm"] for s in a)
ok = ok and same
print(("" if same else "FAIL: ") + "the zero-1 continuation stopped after step 8 and resumed: bitwise equal to it uninterrupted")
sys.exit(0 if ok else 1)
PY
# 5. plan arithmetic, gpt2-small at dp 4
plan_bytes() { # zero -> "params grads optimizer"
    "$TRIDENT" plan configs/gpt2-small.ini parallel.dp=4 parallel.zero_stage=$1 |
        awk '/^0 +[a-z]+ /{getline; print; exit}' |
        sed -n 's/.*params \([0-9]*\), grads \([0-9]*\), optimizer \([0-9]*\),.*/\1 \2 \3/p'
}
"$PY" - "$(plan_bytes 0)" "$(plan_bytes 1)" "$(plan_bytes 3)" <<'PY' || fail=1
import sys
z0, z1, z3 = (sum(map(int, a.split())) for a in sys.argv[1:4])
p0 = [int(x) for x in sys.argv[1].split()]
# configs/gpt2-small.ini: V 4096, C 768, F 2048, bf16, untied; the largest
# unit is a block (2 norm gains, q k v o, gate up down; 4096 x 768 for the
# embedding and the head), padded to 128 x dp = 512 elements.
V, C, F, dp = 4096, 768, 2048, 4
block = 2 * C + 4 * C * C + 3 * C * F
assert block > V * C + C
big = -(-block // 512) * 512
buffers = 2 * big * 2 + 2 * big * 4 + 2 * (big // dp) * 4
# zero 0's P + G + O (unpadded: ZeRO-2/3 pad each of the 14 units by < 512 elements of 18 bytes)
shard = (p0[0] + p0[1] + p0[2]) / dp
ok = abs(z3 - buffers - shard) <= 14 * 512 * 18 / dp and z3 <= 0.57 * z1
print(f"gpt2-small dp 4: persistent bytes per rank zero 0 {z0}, zero 1 {z1}, zero 3 {z3} "
      f"({100 * z3 / z1:.1f}% of zero 1; shards {shard:.0f} = {100 * shard / z1:.1f}%, unit buffers {buffers})")
if not ok: print("FAIL: zero 3's bytes are not the shards plus the unit buffers, or above 57% of zero 1's")
sys.exit(0 if ok else 1)
PY
exit $fail
