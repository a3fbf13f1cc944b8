#!/usr/bin/env bash
# train_loss_scale.sh: the fp16 dynamic loss scale (issue 11; docs/design.md §5).
# fp16 runs of 20 steps with loss_scale_initial = 4096 and
# loss_scale_growth_interval = 5 (small enough that no step overflows by
# itself: checked), in layouts (tp,pp,dp,zero) = (1,2,2,0) and (2,2,2,1):
#  1. TRIDENT_FAULT=grad_inf:8@RANK puts an inf into one rank's gradients at
#     step 8 (a rank that is neither world rank 0 nor on DP rank 0): step 8 is
#     skipped, the scale of step 9 is half that of step 8, the run ends
#     (bounded by timeout: no rank hangs), the lr of every later step k equals
#     the uninterrupted run's lr of step k - 1 (the schedule held one step),
#     and every rank's checkpoint file holds the same state (opt_steps 19,
#     lr_step 19, skipped_steps 1, the same scale and growth counter): every
#     rank skipped.
#  2. Resume after the backoff: stopped at step 10 (exit_interval) and resumed
#     against the straight faulted run: the same losses, lrs, scales and skip
#     counts at every step and byte-identical final parameters; the growth
#     counter is restored (with interval 5 the scale grows after step 13 in
#     both, not after step 15).
#  3. An overflow at loss_scale_min counts toward max_skipped_steps: exit 1.
#  4. A malformed TRIDENT_FAULT (grad_inf:x) is bad input: exit 2 naming it, no step.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
fail=0
FP16=(precision.dtype=fp16 precision.loss_scale_initial=4096 precision.loss_scale_growth_interval=5)
# train NAME TP PP DP ZERO [overrides...]: one run into $tmp/run-NAME; TRIDENT_FAULT from the caller.
train() {
    local name=$1 tp=$2 pp=$3 dp=$4 zero=$5 rc=0; shift 5
    rm -rf "$tmp/run-$name"; mkdir -p "$tmp/run-$name"
    SMALL_TRAIN_TIMEOUT=120 small_train "$tmp/run-$name" "$tmp/ck-$name" "$tp" "$pp" "$dp" "$zero" \
        checkpoint.every=0 checkpoint.keep_last=0 "${FP16[@]}" "$@" \
        > "$tmp/$name.log" 2>&1 || rc=$?
    return "$rc"
}
export TRIDENT_FAULT=
for l in 1,2,2,0,3 2,2,2,1,7; do
    IFS=, read -r tp pp dp z victim <<<"$l"
    TRIDENT_FAULT= train "ref-$l" $tp $pp $dp $z || { echo "FAIL: ref $l exited $?"; fail=1; }
    TRIDENT_FAULT=grad_inf:8@$victim train "inf-$l" $tp $pp $dp $z || { echo "FAIL: faulted $l exited $?"; tail -3 "$tmp/inf-$l.log"; fail=1; }
    TRIDENT_FAULT=grad_inf:8@$victim train "stop-$l" $tp $pp $dp $z train.exit_interval=10 || { echo "FAIL: stopped $l"; fail=1; }
    cp -r "$tmp/run-stop-$l" "$tmp/run-stop-$l.0"
    TRIDENT_FAULT=grad_inf:8@$victim train "stop-$l" $tp $pp $dp $z || { echo "FAIL: resumed $l"; fail=1; }
    grep -q "resumed from .*step-000010" "$tmp/stop-$l.log" || { echo "FAIL: $l did not resume from step 10"; fail=1; }
    for n in "inf-$l" "stop-$l"; do
        "$TRIDENT" ckpt export "$tmp/ck-$n" "$tmp/$n.h5" > /dev/null || { echo "FAIL: export $n"; fail=1; }
    done
done

# 3. at the minimum scale an overflow is a skip like any non-finite step
rc=0; TRIDENT_FAULT=grad_inf:3 train floor 1 1 1 0 precision.loss_scale_min=4096 train.max_skipped_steps=1 || rc=$?
[ "$rc" = 1 ] || { echo "FAIL: an overflow at loss_scale_min with max_skipped_steps = 1 exited $rc, expected 1"; fail=1; }
grep -q "max_skipped_steps" "$tmp/floor.log" || { echo "FAIL: no max_skipped_steps message"; fail=1; }

# 4. a malformed fault setting is bad input, refused before the first step
rc=0; TRIDENT_FAULT=grad_inf:x train badfault 1 1 1 0 || rc=$?
[ "$rc" = 2 ] && grep -q "TRIDENT_FAULT='grad_inf:x'" "$tmp/badfault.log" &&
    ! metrics_at_least "$tmp/run-badfault" 1 || { echo "FAIL: TRIDENT_FAULT=grad_inf:x exited $rc"; fail=1; }

"$PY" - "$tmp" <<'PY' || fail=1
import glob, json, sys, h5py, numpy as np
tmp = sys.argv[1]
def recs(d):
    return [r for r in map(json.loads, open(f"{tmp}/{d}/metrics.jsonl")) if "loss" in r]
ok = True
def check(cond, msg):
    global ok
    if not cond:
        ok = False
        print("FAIL:", msg)
for l in ("1,2,2,0,3", "2,2,2,1,7"):
    ref = {r["step"]: r for r in recs(f"run-ref-{l}")}
    inf = {r["step"]: r for r in recs(f"run-inf-{l}")}
    check(sorted(ref) == list(range(1, 21)) and sorted(inf) == list(range(1, 21)), f"{l}: steps logged")
    check(not any(r["skipped"] for r in ref.values()), f"{l}: the run without a fault skipped a step")
    check([s for s in inf if inf[s]["skipped"]] == [8], f"{l}: skipped steps {[s for s in inf if inf[s]['skipped']]}, expected [8]")
    check(inf[9]["loss_scale"] == inf[8]["loss_scale"] / 2, f"{l}: scale {inf[8]['loss_scale']} -> {inf[9]['loss_scale']}, expected halved")
    check(inf[8]["grad_norm"] is None, f"{l}: step 8 grad norm {inf[8]['grad_norm']}, expected null")
    check(all(inf[s]["lr"] == ref[s]["lr"] for s in range(1, 9)) and
          all(inf[s]["lr"] == ref[s - 1]["lr"] for s in range(9, 21)), f"{l}: lr after the skip is not the held schedule's")
    check(inf[20]["skipped_steps"] == 1, f"{l}: skipped_steps {inf[20]['skipped_steps']}")
    # every rank's file: the same state
    states = []
    for f in sorted(glob.glob(f"{tmp}/ck-inf-{l}/step-000020/rank-*.h5")):
        a = h5py.File(f)["state"].attrs
        states.append(tuple(int(np.ravel(a[k])[0]) if k != "loss_scale" else float(np.ravel(a[k])[0])
                            for k in ("opt_steps", "lr_step", "skipped_steps", "loss_scale", "loss_scale_good_steps")))
    check(len(states) == (4 if l.startswith("1,") else 8) and len(set(states)) == 1 and states[0][:3] == (19, 19, 1),
          f"{l}: rank states (opt_steps, lr_step, skipped, scale, good) {sorted(set(states))}")
    # resume after the backoff: bit-exact
    a = {r["step"]: r for r in recs(f"run-stop-{l}.0")}
    b = {r["step"]: r for r in recs(f"run-stop-{l}")}
    check(sorted(a) == list(range(1, 11)) and sorted(b) == list(range(11, 21)), f"{l}: stopped/resumed steps")
    keys = ("loss", "lr", "grad_norm", "skipped", "skipped_steps", "loss_scale")
    both = {**a, **b}
    diff = [s for s in inf if any(inf[s][k] != both.get(s, {}).get(k) for k in keys)]
    check(not diff, f"{l}: resumed run differs from the straight one at steps {diff}")
    fa, fb = h5py.File(f"{tmp}/inf-{l}.h5"), h5py.File(f"{tmp}/stop-{l}.h5")
    bad = [k for k in fa if not np.array_equal(fa[k][()], fb[k][()])]
    check(sorted(fa) == sorted(fb) and not bad, f"{l}: final parameters differ: {bad[:3]}")
    grew = [s for s in range(10, 21) if inf[s]["loss_scale"] > inf[s - 1]["loss_scale"]]
    if ok:
        print(f"{l}: step 8 skipped on every rank, scale {inf[8]['loss_scale']:g} -> {inf[9]['loss_scale']:g}, "
              f"grew at steps {grew}; resume at 10 bit-exact")
sys.exit(0 if ok else 1)
PY
exit $fail
