#!/usr/bin/env bash
# train_fp8.sh: FP8 linear layers in the trainer (issue 29; docs/design.md §5 "FP8").
#  1. (acceptance 2, model level) tests/mpi/test_fp8_tp.c on 2 ranks: tp 2
#     with sequence parallelism, delayed and current scaling, 4 steps: every
#     FP8 scale, amax and history value bitwise equal on both ranks (it fails
#     without the TP all-reduce of the amaxes).
#  2. (acceptance 3) configs/tiny.ini, its first 20 steps (exit_interval: the
#     300-step schedule) on its 2 data-parallel ranks: fp8 hybrid with
#     current scaling and with delayed scaling stay within 2% of bf16's loss
#     at every step, and differ from it (FP8 ran); every step record carries
#     fp8_saturated (an integer >= 0), bf16's none. The delayed run takes
#     the defaults (Megatron-LM's: a history of 1, its most recent amax);
#     Transformer Engine's recipe (the max over 1024 steps) was 2.45% off at
#     step 20 of this run (a loss spike: grad norm 4.0 against bf16's 0.9),
#     within 2% before it (docs/design.md §5 "FP8").
#  3. (acceptance 4) resume in fp8 hybrid with delayed scaling is bit-exact:
#     the small config in (2,1,2) with sequence parallelism, 8 steps straight
#     against 4 + resume + 4: the same losses, grad norms and lrs, the same
#     final parameters and FP8 scaling state (read from the rank files); the
#     checkpoint holds the state (fp8_scaling/model.layers.<l>, both blocks).
#     It fails when the resume leaves the FP8 state out, and when the
#     amaxes are not all-reduced over the data-parallel group (the ranks'
#     scales differ; the checkpoint holds rank 0's): all 20 final parameters
#     differ (checked when written);
#     and `trident plan`'s bytes of that layout (the model's FP8 copies and
#     state included) are the run's mem_bytes.
#  4. A bf16 checkpoint resumes into fp8 (scale 1, empty histories: the log
#     says so) and an fp8 one into bf16 (its FP8 tensors ignored; ckpt verify
#     accepts them): both finish, steps 5-8 within 2% of the straight run of
#     the source precision.
#  5. recompute = full in fp8 (delayed) gives the losses of recompute = none
#     bit for bit (the recomputation casts again with the same scales).
#  6. Delayed scaling: a skipped step (TRIDENT_FAULT=grad_inf: a non-finite
#     gradient norm) pushes no amax into the histories: 8 steps, one
#     skipped, leave 7 entries (8 when the rule is taken out).
#  7. fp8 = e4m3 (E4M3 gradients) with current scaling and fp8_skip_layers =
#     first at (1,1,2): 8 steps within 2% of bf16 (and not bf16's); no FP8
#     state in its checkpoint (current scaling carries none); the Prometheus
#     file's trident_fp8_saturated is the last step record's fp8_saturated.
#  8. fp8 delayed under pipeline parallelism (1,2,1) and ZeRO-3 (1,1,2): every
#     step's loss within 1e-3 relative of (1,1,1) and of (1,1,2) ZeRO-0 (the
#     same GEMMs and casts; only sums in another order differ).
#  9. The FP8 state reshards by layer and adapts its history length: the
#     (2,1,2)+sp checkpoint of step 4 (history 4) resumed in (1,2,1) with
#     history 6: after 4 more steps each history holds those 4 amaxes, then
#     the checkpoint's 2 newest.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT" "$PWD/$BUILD/mpi/test_fp8_tp"
need_py h5py numpy
fail=0

# 1. tp 2: scales equal on every rank
timeout -k 2 60 "${MPIRUN[@]}" -np 2 "$PWD/$BUILD/mpi/test_fp8_tp" > "$tmp/tp.log" 2>&1 ||
    { cat "$tmp/tp.log"; fail "(1) test_fp8_tp exited non-zero"; }
n=$(grep -c "0 of .* state values differ" "$tmp/tp.log" || true)
[ "$n" -eq 4 ] || { cat "$tmp/tp.log"; fail "(1) $n result lines of equal scales, expected 4"; }
echo "(1) tp 2 + sp: every rank's FP8 scaling state bitwise equal (delayed, current)"

# 2. tiny.ini, 20 steps: bf16, fp8 hybrid current, fp8 hybrid delayed
data/make_kjv.sh >/dev/null
[ -f data/kjv-shards/index.ini ] ||
    "$TRIDENT" prep --input data/kjv.txt --output data/kjv-shards --vocab-size 4096 >/dev/null
tiny() {
    local name=$1 rc=0; shift
    timeout 300 "${MPIRUN[@]}" -np 2 "$TRIDENT" train configs/tiny.ini system.threads=1 system.peak_tflops=1 \
        train.exit_interval=20 train.eval_every=0 train.sample_every=0 log.every=1 checkpoint.dir=none \
        precision.dtype=bf16 log.run_dir="$tmp/tiny-$name" "$@" > "$tmp/tiny-$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -5 "$tmp/tiny-$name.log"; echo "FAIL: (2) tiny $name exited $rc"; fail=1; }
}
tiny bf16
tiny current precision.fp8=hybrid precision.fp8_scaling=current
tiny delayed precision.fp8=hybrid precision.fp8_scaling=delayed
"$PY" - "$tmp" <<'PY' || fail=1
import json, sys
tmp = sys.argv[1]
def recs(n):
    return {r["step"]: r for r in map(json.loads, open(f"{tmp}/tiny-{n}/metrics.jsonl")) if "loss" in r}
ref = recs("bf16")
assert sorted(ref) == list(range(1, 21)), f"bf16 logged steps {sorted(ref)}"
assert all("fp8_saturated" not in r for r in ref.values()), "bf16 records carry fp8_saturated"
bad = 0
for n in ("current", "delayed"):
    r = recs(n)
    assert sorted(r) == sorted(ref), f"{n}: steps {sorted(r)}"
    worst = max((abs(r[s]["loss"] - ref[s]["loss"]) / ref[s]["loss"], s) for s in ref)
    same = sum(r[s]["loss"] == ref[s]["loss"] for s in ref)
    sat = [r[s].get("fp8_saturated") for s in sorted(r)]
    print(f"(2) tiny.ini fp8 hybrid {n}: largest loss difference from bf16 {100 * worst[0]:.2f}% "
          f"(step {worst[1]}; limit 2%), fp8_saturated per step {sat}")
    if worst[0] > 0.02: print(f"FAIL: (2) {n}: step {worst[1]} is {100 * worst[0]:.2f}% off bf16"); bad = 1
    if same > 2: print(f"FAIL: (2) {n}: {same} of 20 losses are bf16's: did FP8 run?"); bad = 1
    if not all(isinstance(x, int) and x >= 0 for x in sat): print(f"FAIL: (2) {n}: fp8_saturated {sat}"); bad = 1
sys.exit(bad)
PY

# 3-5: the small config
small_dataset "$tmp"
# train NAME TP PP DP [overrides...] into $tmp/run-NAME, checkpoints $tmp/ck-NAME
train() {
    local name=$1 tp=$2 pp=$3 dp=$4 rc=0; shift 4
    small_train "$tmp/run-$name" "$tmp/ck-$name" "$tp" "$pp" "$dp" "${ZERO:-0}" train.steps=8 train.warmup_steps=2 \
        checkpoint.every=0 checkpoint.keep_last=0 precision.dtype=bf16 "$@" > "$tmp/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -5 "$tmp/$name.log"; echo "FAIL: $name exited $rc"; fail=1; }
}
F8=(precision.fp8=hybrid precision.fp8_scaling=delayed precision.fp8_amax_history_len=4)
train straight 2 1 2 parallel.sequence_parallel=true "${F8[@]}"
# plan == run: the plan's bytes of stage 0, tp rank 0 (the model's FP8 copies,
# scratch and scaling state included) are the run's mem_bytes
plan=$("$TRIDENT" plan "$SMALL_INI" data.path="$tmp/shards" parallel.tp=2 parallel.dp=2 \
       parallel.sequence_parallel=true train.global_batch_size=16 precision.dtype=bf16 "${F8[@]}" --json |
       jq '.groups[0].total_bytes, .groups[0].fp8_weight_bytes, .groups[0].fp8_work_bytes' | paste -sd' ')
read -r want w8 work <<<"$plan"
got=$(metrics "$tmp/run-straight" .mem_bytes | sed -n 1p)
[ -n "$want" ] && [ "$want" = "$got" ] && [ "${w8:-0}" -gt 0 ] && [ "${work:-0}" -gt 0 ] ||
    { echo "FAIL: (3) plan says '$plan' (total, FP8 weights, FP8 work), the fp8 run's mem_bytes '$got'"; fail=1; }
echo "(3) plan == run in fp8 at (2,1,2)+sp: $got bytes on rank 0 (FP8 weight copies $w8, scratch + state $work)"
train stop 2 1 2 parallel.sequence_parallel=true "${F8[@]}" train.exit_interval=4
cp -r "$tmp/run-stop" "$tmp/run-stop.0"
train stop 2 1 2 parallel.sequence_parallel=true "${F8[@]}"
grep -q "resumed from .*step-000004" "$tmp/stop.log" || { echo "FAIL: (3) did not resume from step 4"; fail=1; }
for n in straight stop; do
    "$TRIDENT" ckpt export "$tmp/ck-$n" "$tmp/$n.h5" > /dev/null || { echo "FAIL: (3) export of $n"; fail=1; }
done
# 4. bf16 -> fp8 and fp8 -> bf16 from step 4, against the straight runs
train bf16 1 1 2
train bf16-stop 1 1 2 train.exit_interval=4
train to-fp8 1 1 2 "${F8[@]}" checkpoint.resume="$tmp/ck-bf16-stop/step-000004"
train fp8 1 1 2 "${F8[@]}"
train fp8-stop 1 1 2 "${F8[@]}" train.exit_interval=4
train to-bf16 1 1 2 checkpoint.resume="$tmp/ck-fp8-stop/step-000004"
grep -q "FP8 scaling state of 0 of rank 0's 2 FP8 blocks" "$tmp/to-fp8.log" ||
    { echo "FAIL: (4) the bf16 checkpoint's resume into fp8 did not start the FP8 state fresh"; fail=1; }
"$TRIDENT" ckpt verify "$tmp/ck-fp8-stop/step-000004" > "$tmp/verify.log" 2>&1 ||
    { cat "$tmp/verify.log"; echo "FAIL: (4) ckpt verify refuses an fp8 checkpoint"; fail=1; }
# 5. recompute
train re-none 1 1 1 "${F8[@]}"
train re-full 1 1 1 "${F8[@]}" model.recompute=full
# 9. the (2,1,2)+sp checkpoint of step 4 (history 4) resumed in (1,2,1) with history 6
train relayout 1 2 1 precision.fp8=hybrid precision.fp8_scaling=delayed precision.fp8_amax_history_len=6 \
    checkpoint.resume="$tmp/ck-stop/step-000004"
# 8. pipeline (1,2,1) and ZeRO-3 (1,1,2) against (1,1,1) and (1,1,2)
train pp 1 2 1 "${F8[@]}"
ZERO=3 train z3 1 1 2 "${F8[@]}"
# 7. e4m3 with current scaling, the first block in bf16
train e4m3 1 1 2 precision.fp8=e4m3 precision.fp8_scaling=current precision.fp8_skip_layers=first \
    log.prometheus_file="$tmp/e4m3.prom"
last=$(metrics "$tmp/run-e4m3" .fp8_saturated | tail -1)
grep -Eq "^trident_fp8_saturated\{[^}]*\} $last\$" "$tmp/e4m3.prom" ||
    { echo "FAIL: (7) $tmp/e4m3.prom has no trident_fp8_saturated $last: $(grep fp8 "$tmp/e4m3.prom")"; fail=1; }
# 6. a skipped step pushes no amax: an inf in the gradients at step 3 of 8
# (the step skipped); the histories (length 10) hold 7 amaxes, not 8
TRIDENT_FAULT=grad_inf:3 train skip 1 1 1 precision.fp8=hybrid precision.fp8_scaling=delayed \
    precision.fp8_amax_history_len=10
"$PY" - "$tmp" <<'PY' || fail=1
import glob, json, sys, h5py, numpy as np
tmp = sys.argv[1]
def steps(d, keys=("loss", "grad_norm", "lr")):
    return {r["step"]: tuple(r[k] for k in keys) for r in map(json.loads, open(f"{tmp}/{d}/metrics.jsonl"))
            if "loss" in r}
bad = 0
def check(cond, msg):
    global bad
    if not cond: print("FAIL:", msg); bad = 1
s, r = steps("run-straight"), {**steps("run-stop.0"), **steps("run-stop")}
check(sorted(r) == list(range(1, 9)), f"(3) stopped + resumed runs logged steps {sorted(r)}")
check(s == r, f"(3) fp8 delayed resume: losses, grad norms or lrs differ: {s} {r}")
fa, fb = h5py.File(f"{tmp}/straight.h5"), h5py.File(f"{tmp}/stop.h5")
diff = [k for k in fa if not np.array_equal(fa[k][()], fb[k][()])]
check(sorted(fa) == sorted(fb) and not diff, f"(3) final parameters differ: {diff[:3]}")
def fp8_state(ck):  # {name: array} of the fp8_scaling tensors of a checkpoint's rank files
    out = {}
    for f in sorted(glob.glob(f"{ck}/rank-*.h5")):
        with h5py.File(f) as h:
            for d in h["pieces"].values():
                name = d.attrs["name"]
                name = name.decode() if isinstance(name, bytes) else name
                if name.startswith("fp8_scaling/"): out[name] = d[()]
    return out
a, b = fp8_state(f"{tmp}/ck-straight/step-000008"), fp8_state(f"{tmp}/ck-stop/step-000008")
check(sorted(a) == ["fp8_scaling/model.layers.0", "fp8_scaling/model.layers.1"], f"(3) FP8 state tensors {sorted(a)}")
check(sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), "(3) final FP8 state differs")
check(all(v.size == 12 * 6 and (v.reshape(12, 6)[:, 0] != 1).all() for v in a.values()),
      "(3) FP8 state: expected (12, 2 + 4) with every scale moved from 1")
print(f"(3) fp8 delayed resume at (2,1,2)+sp: 8 steps bit-exact, {len(fa)} parameters and {len(a)} FP8 state tensors identical")
for src, dst in (("bf16", "to-fp8"), ("fp8", "to-bf16")):
    ref, got = steps(f"run-{src}"), steps(f"run-{dst}")
    check(sorted(got) == [5, 6, 7, 8], f"(4) {dst}: steps {sorted(got)}")
    worst = max(abs(got[k][0] - ref[k][0]) / ref[k][0] for k in got)
    check(worst <= 0.02, f"(4) {dst}: {100 * worst:.2f}% off the straight {src} run")
    print(f"(4) {src} checkpoint resumed in {dst[3:]}: steps 5-8 within {100 * worst:.4f}% of straight {src}")
check(steps("run-re-none") == steps("run-re-full"), "(5) recompute = full differs from none in fp8")
print("(5) fp8 recompute = full: the losses of none, bit for bit")
sk = [r.get("skipped") for r in map(json.loads, open(f"{tmp}/run-skip/metrics.jsonl")) if "loss" in r]
check(sk == [0, 0, 1, 0, 0, 0, 0, 0], f"(6) skipped per step {sk}, expected step 3 alone")
st = fp8_state(f"{tmp}/ck-skip/step-000008")
pushed = sorted({int((v.reshape(12, 12)[:, 2:] != 0).sum(axis=1).max()) for v in st.values()})
check(len(st) == 2 and pushed == [7], f"(6) amaxes in the histories: {pushed}, expected 7 (8 steps, 1 skipped)")
print(f"(6) a skipped step pushes no amax: {pushed[0] if pushed else '?'} of 8 steps in the histories")
ref, got = steps("run-bf16"), steps("run-e4m3")
worst = max(abs(got[k][0] - ref[k][0]) / ref[k][0] for k in ref) if sorted(got) == sorted(ref) else 1
sat = [r.get("fp8_saturated") for r in map(json.loads, open(f"{tmp}/run-e4m3/metrics.jsonl")) if "loss" in r]
check(worst <= 0.02 and got != ref, f"(7) e4m3: {100 * worst:.2f}% off bf16 (limit 2%), or bf16's losses")
check(all(isinstance(x, int) for x in sat), f"(7) e4m3: fp8_saturated {sat}")
check(fp8_state(f"{tmp}/ck-e4m3/step-000008") == {}, "(7) current scaling saved FP8 state")
print(f"(7) e4m3, current scaling, first block bf16: 8 steps within {100 * worst:.3f}% of bf16; no FP8 state saved")
old, new = fp8_state(f"{tmp}/ck-stop/step-000004"), fp8_state(f"{tmp}/ck-relayout/step-000008")
check(sorted(steps("run-relayout")) == [5, 6, 7, 8], "(9) the relayout resume did not run steps 5-8")
check(sorted(old) == sorted(new) and all(
    np.array_equal(new[k].reshape(12, 8)[:, 6:], old[k].reshape(12, 6)[:, 2:4]) for k in old),
    "(9) the resumed histories do not end with the checkpoint's newest amaxes")
print(f"(9) FP8 state of (2,1,2)+sp, history 4, resumed in (1,2,1) with history 6: each history ends "
      f"with the checkpoint's 2 newest amaxes, after the 4 new steps'")
for ref, got in (("re-none", "pp"), ("fp8", "z3")):
    a, b = steps(f"run-{ref}"), steps(f"run-{got}")
    worst = max(abs(b[k][0] - a[k][0]) / a[k][0] for k in a) if sorted(a) == sorted(b) else 1
    check(worst <= 1e-3, f"(8) {got}: {worst:.2e} off {ref} (limit 1e-3)")
    print(f"(8) fp8 delayed {got} against {ref}: losses within {worst:.1e}")
sys.exit(bad)
PY
exit "$fail"
