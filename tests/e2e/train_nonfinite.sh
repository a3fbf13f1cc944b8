#!/usr/bin/env bash
# train_nonfinite.sh: steps with a NaN or infinite loss or gradient norm
# (issue 11, acceptance 3). With train.lr=3e4, no warmup, the small model's
# loss turns NaN after a few steps and stays NaN on the parameters it has.
#  1. One rank, checkpoint.every=1 keep_last=1, max_skipped_steps=2 (the
#     issue's case): the first non-finite step k and step k+1 are skipped
#     (metrics.jsonl: "skipped": 1, skipped_steps 1 then 2, loss null), the
#     run exits 1 after step k+1 with a message naming the last good
#     checkpoint, step k-1, which is `latest`, the only one kept, and
#     verifies (`trident ckpt verify` also checks that every value is finite).
#  2. One rank, linear LR decay, keep_last=0, 8 steps, no limit reached: every
#     step from k on is skipped; the final checkpoint (step 8) holds exactly
#     the parameters and AdamW moments of step k-1 (no update applied) and
#     lr_step = opt_steps = k-1, skipped_steps = consecutive_skips = 9-k; the
#     logged lr stays at the schedule's position k-1 while steps are skipped.
#     Resumed for a 9th step (train.override_schedule = true: steps 8 -> 9 is
#     a schedule change): the counters go on from the checkpoint's
#     (skipped_steps 10-k) and the lr is the continued schedule's at position
#     k-1 (docs/design.md §7).
#     A validation of those NaN weights is logged as "val_loss": null.
#  3. tp=2 x dp=2 and pp=2 x dp=2 with ZeRO-1 (world 4, oversubscribed): as 1,
#     within a bounded time: every rank skips together, none waits on a
#     collective the others skipped.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
fail=0

# train NAME CK NP TP PP DP ZERO [overrides...]: one run with the divergent
# lr (give train.lr_schedule); its log in $tmp/NAME.log, metrics in $tmp/run-NAME, checkpoints in
# $tmp/ck-CK; its exit code in rc (124: timed out, a hang).
train() {
    local name=$1 ck=$2 np=$3 tp=$4 pp=$5 dp=$6 zero=$7; shift 7
    [ "$np" -eq $((tp * pp * dp)) ] || fail "train $name: np $np is not tp * pp * dp"
    rc=0
    SMALL_TRAIN_TIMEOUT=120 small_train "$tmp/run-$name" "$tmp/ck-$ck" "$tp" "$pp" "$dp" "$zero" \
        train.lr=3e4 train.warmup_steps=0 "$@" > "$tmp/$name.log" 2>&1 || rc=$?
}

# first_skip NAME: the first step metrics.jsonl marks skipped ("" if none).
first_skip() { metrics "$tmp/run-$1" 'select(.skipped == 1) | .step' | head -n 1; }

# check_stopped NAME: run NAME (checkpoint.every=1 keep_last=1
# max_skipped_steps=2) stopped as in case 1.
check_stopped() {
    local name=$1 ck="$tmp/ck-$1" k good msg was=$fail
    fail=0
    if [ "$rc" -ne 1 ]; then
        echo "FAIL: $name exited $rc, expected 1 (124: hung)"; tail -n 5 "$tmp/$name.log"; fail=1; return
    fi
    k=$(first_skip "$name")
    if [ -z "$k" ] || [ "$k" -lt 2 ]; then
        echo "FAIL: $name: first skipped step '$k' (expected a skip after an applied step)"; fail=1; return
    fi
    good=$(printf 'step-%06d' $((k - 1)))
    [ "$(metrics "$tmp/run-$name" 'select(.skipped == 1) | [.step, .skipped_steps, .loss]' | tr '\n' ' ')" \
        = "[$k,1,null] [$((k + 1)),2,null] " ] &&
        [ "$(metrics "$tmp/run-$name" .step | tail -n 1)" = $((k + 1)) ] &&
        [ -z "$(metrics "$tmp/run-$name" "select(.step < $k and .skipped != 0) | .step")" ] ||
        { echo "FAIL: $name: expected steps $k and $((k + 1)) skipped (skipped_steps 1, 2, loss null) and the last"; metrics "$tmp/run-$name" '[.step, .loss, .grad_norm, .skipped, .skipped_steps]'; fail=1; }
    [ "$(cat "$ck/latest")" = "$good" ] && [ "$(cd "$ck" && echo step-*)" = "$good" ] ||
        { echo "FAIL: $name: latest is $(cat "$ck/latest"), folders $(cd "$ck" && echo step-*); expected only $good"; fail=1; }
    "$TRIDENT" ckpt verify "$ck" > "$tmp/$name.verify" 2>&1 ||
        { echo "FAIL: $name: ckpt verify of latest:"; cat "$tmp/$name.verify"; fail=1; }
    msg=$(grep -m1 'steps in a row' "$tmp/$name.log" || true)
    grep -qF "step $((k + 1)): 2 steps in a row" <<<"$msg" && grep -qF "last good checkpoint is $ck/$good" <<<"$msg" ||
        { echo "FAIL: $name: no message naming step $((k + 1)) and $ck/$good:"; grep trident: "$tmp/$name.log" | head -n 3; fail=1; }
    [ "$fail" -ne 0 ] || echo "$name: steps $k, $((k + 1)) skipped, exit 1, latest $good kept and verified; ${msg#*] }"
    [ "$was" -eq 0 ] || fail=$was
}

# 1. the issue's case on one rank
train one one 1 1 1 1 0 train.lr_schedule=constant train.steps=20 train.max_skipped_steps=2 checkpoint.every=1 checkpoint.keep_last=1
check_stopped one

# 2. no update from the first skip on; the schedule held; counters resumed
#    (with 9 steps instead of 8: train.override_schedule, the lr continued)
#    The evaluation after step 8 sees the weights of step k-1, whose loss is
#    NaN: its record must say "val_loss": null (JSON has no NaN) and the
#    whole file must parse.
SMALL_EVAL_EVERY=8 train held held 1 1 1 1 0 train.steps=8 train.lr_schedule=linear train.max_skipped_steps=100 \
    checkpoint.every=1 checkpoint.keep_last=0
[ "$rc" -eq 0 ] || { echo "FAIL: held exited $rc"; tail -n 5 "$tmp/held.log"; fail=1; }
# (Strict JSON: Python's parser with NaN/Infinity refused; jq reads "nan" as null.)
"$PY" - "$tmp/run-held/metrics.jsonl" <<'PY' || { grep -n val_loss "$tmp/run-held/metrics.jsonl"; fail=1; }
import json, sys
def refuse(c): raise ValueError(f"{c} is not JSON")
vals = []
for n, line in enumerate(open(sys.argv[1]), 1):
    try: r = json.loads(line, parse_constant=refuse)
    except ValueError as e: sys.exit(f"FAIL: held: metrics.jsonl:{n} is not strict JSON: {e}")
    if "val_loss" in r: vals.append([r["step"], r["val_loss"]])
if vals != [[8, None]]: sys.exit(f"FAIL: held: validation records {vals}, want [[8, None]] (NaN as null)")
PY
train held-resumed held 1 1 1 1 0 train.steps=9 train.lr_schedule=linear train.max_skipped_steps=100 \
    checkpoint.every=1 checkpoint.keep_last=0 train.override_schedule=true
[ "$rc" -eq 0 ] || { echo "FAIL: held-resumed exited $rc"; tail -n 5 "$tmp/held-resumed.log"; fail=1; }
"$PY" - "$tmp" <<'PY' || fail=1
import json, sys, h5py, numpy as np
tmp = sys.argv[1]
lr, min_lr = 3e4, 3e-4  # train.lr and small.ini's min_lr
def records(name):
    return [r for r in map(json.loads, open(f"{tmp}/run-{name}/metrics.jsonl")) if "loss" in r]
def linear(pos, steps):  # optimizer_lr: linear decay, no warmup, as logged (%.3e)
    return float(f"{lr - (lr - min_lr) * pos / steps:.3e}")
def rank_file(step):
    return h5py.File(f"{tmp}/ck-held/step-{step:06d}/rank-00000.h5", "r")
ok = True
def check(cond, what):
    global ok
    if not cond: ok = False; print("FAIL: held:", what)
recs = records("held")
skipped = [r["step"] for r in recs if r["skipped"]]
k = skipped[0] if skipped else None
check(k is not None and 2 <= k <= 8 and skipped == list(range(k, 9)),
      f"skipped steps {skipped}: expected every step from the first skip (after step 1) to 8")
if k is None: sys.exit(1)
for r in recs:
    pos = min(r["step"] - 1, k - 1)  # applied steps before this one
    check(r["lr"] == linear(pos, 8), f"step {r['step']}: lr {r['lr']}, schedule position {pos} gives {linear(pos, 8)}")
    check(r["skipped_steps"] == max(0, r["step"] - k + 1), f"step {r['step']}: skipped_steps {r['skipped_steps']}")
    check((r["loss"] is None or r["grad_norm"] is None) == bool(r["skipped"]), f"step {r['step']}: skipped with finite numbers or applied with non-finite ones")
good, last = rank_file(k - 1), rank_file(8)
names = lambda f: {f["pieces"][d].attrs["name"].decode() if isinstance(f["pieces"][d].attrs["name"], bytes) else f["pieces"][d].attrs["name"]: d for d in f["pieces"]}
ng, nl = names(good), names(last)
check(sorted(ng) == sorted(nl) and any(n.startswith("adam_m/") for n in ng), "tensors differ between the two checkpoints")
changed = [n for n in ng if n in nl and not np.array_equal(good["pieces"][ng[n]][()], last["pieces"][nl[n]][()])]
check(not changed, f"step 8 differs from step {k - 1} (an update was applied) in {changed[:3]}")
st = dict(last["state"].attrs)
check((st["step"], st["lr_step"], st["opt_steps"], st["skipped_steps"], st["consecutive_skips"]) == (8, k - 1, k - 1, 9 - k, 9 - k),
      f"state of step 8: { {key: int(st[key]) for key in ('step', 'lr_step', 'opt_steps', 'skipped_steps', 'consecutive_skips')} }")
res = records("held-resumed")
# steps 8 -> 9 with train.override_schedule: the decay restarts at position
# R = k - 1 from the lr of position R - 1 (docs/design.md §7), in optimizer_lr's order
R = k - 1
lr0 = lr - (lr - min_lr) * ((R - 1) / 8)
cont = float(f"{lr0 - (lr0 - min_lr) * ((k - 1 - R + 1) / (9 - R)):.3e}")
check([(r["step"], r["skipped"], r["skipped_steps"], r["lr"]) for r in res] == [(9, 1, 10 - k, cont)],
      f"resumed run: {[(r['step'], r['skipped'], r['skipped_steps'], r['lr']) for r in res]}, expected step 9 skipped, skipped_steps {10 - k}, lr {cont}")
st = dict(rank_file(9)["state"].attrs)
check((st["lr_step"], st["skipped_steps"], st["consecutive_skips"]) == (k - 1, 10 - k, 10 - k), "state of step 9 after the resume")
if ok: print(f"held: steps {k}-8 skipped, step 8's checkpoint == step {k - 1}'s (parameters and moments), lr held at position {k - 1}; resumed: counters and lr continue")
sys.exit(0 if ok else 1)
PY

# 3. every rank of a 4-rank layout skips together
for l in 2,1,2,0 1,2,2,1; do
    IFS=, read -r tp pp dp z <<<"$l"
    train "layout-$l" "layout-$l" 4 $tp $pp $dp $z train.lr_schedule=constant train.steps=20 train.max_skipped_steps=2 \
        checkpoint.every=1 checkpoint.keep_last=1
    check_stopped "layout-$l"
    mpi_no_leftovers "$TRIDENT train" >/dev/null || { echo "FAIL: layout-$l: processes left alive"; fail=1; }
done
exit $fail
