#!/usr/bin/env bash
# train_resume_config.sh: what a resume may change (issue 14; docs/design.md
# §7 "What a resume may change"), dp inference and the wall-clock budget.
#  1. A 60-step run, resumed with train.steps = 80 on 2 ranks: refused with
#     exit 2 within 20 s, the message listing train.steps 60 -> 80 and naming
#     train.override_schedule = true; the checkpoint folder byte-identical and
#     the run folder holding nothing but train.log, which has the refusal. A changed seed, a changed
#     train.loss_on (even with override_schedule; the message names model.init_from) and another model are refused too,
#     the model mismatch saying how to start fresh (a new [checkpoint] dir, or
#     without the checkpoint.resume = PATH that named it).
#  2. The same resume with train.override_schedule = true: steps 61-80 run,
#     and their lr (metrics.jsonl) is the continued cosine computed here from
#     the documented formula: within one step's change of step 60's at step
#     61, min_lr at step 80.
#  3. parallel.dp = 0 under mpirun -np 4 with tp = 2: dp = 2 in the run's
#     config.ini and in the layout of the checkpoint it saves.
#  4. train.exit_duration_mins = 0.05 (3 s) on a run of 100000 steps: exit 3
#     at a step < 100000, the closing record says exit_duration, a checkpoint
#     of that step verifies, and resuming it (to 5 more steps, with the
#     override) completes with exit 0.
#  6. The step-60 checkpoint resumed with train.steps = 1 (shrunk below it,
#     with the override): exit 0, the output says "nothing to train: the
#     checkpoint is at step 60, train.steps = 1" and "done: 0 steps" (not
#     -59), prints no LR-schedule continuation to step 1, and the closing
#     record has steps_done 60, steps 0.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py numpy
small_dataset "$tmp"
fail=0
run() { # NP RUN_DIR CK_DIR [overrides...]: small.ini with global batch 16, log every step
    local np=$1 run=$2 ck=$3; shift 3
    timeout 120 "${MPIRUN[@]}" -np "$np" "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        train.global_batch_size=16 train.eval_every=0 log.every=1 checkpoint.dir="$ck" log.run_dir="$run" "$@"
}
# Checkpoint folder contents, less the run lock (run_folder_lock), which each start rewrites.
sums() { (cd "$1" && find . -type f ! -name .trident.lock -exec md5sum {} + | sort); }
# A refused start leaves in its run folder only train.log, holding the refusal
# (pattern from the caller's $pattern).
only_refusal_log() {
    [ "$(cd "$tmp/run-refused" 2>/dev/null && find . -type f ! -name .trident.lock | sort | paste -sd' ')" = "./train.log" ] &&
        grep -Eq -- "$pattern" "$tmp/run-refused/train.log"
}

# 1. refused resumes
run 1 "$tmp/run60" "$tmp/ck" train.steps=60 parallel.dp=1 > "$tmp/run60.log" 2>&1 || fail "the 60-step run failed"
before=$(sums "$tmp/ck")
refuse() { # LABEL PATTERN [overrides...]: exit 2, PATTERN in the output, nothing changed
    local label=$1 pattern=$2 rc=0 out start ms; shift 2
    start=$(date +%s%N)
    rm -rf "$tmp/run-refused"
    # OMPI_MCA_odls_base_sigkill_timeout=0: mpirun's 1 s wait before SIGKILL
    # after the refusal's MPI_Abort (a start-up failure: nothing to save).
    out=$(OMPI_MCA_odls_base_sigkill_timeout=0 run 2 "$tmp/run-refused" "$tmp/ck" parallel.dp=0 "$@" 2>&1) || rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [ "$rc" != 2 ] || ! grep -Eq -- "$pattern" <<<"$out" || [ "$(sums "$tmp/ck")" != "$before" ] ||
        ! only_refusal_log || [ "$ms" -gt 20000 ]; then
        echo "FAIL [$label]: exit $rc in $ms ms, message match $(grep -Ec -- "$pattern" <<<"$out" || true), checkpoint unchanged $([ "$(sums "$tmp/ck")" = "$before" ] && echo yes || echo no), run folder holds only train.log with the refusal $(only_refusal_log && echo yes || echo no)"
        grep trident: <<<"$out" | head -3 || true; fail=1
    else
        echo "ok   [$label] exit 2 in $ms ms: $(grep -m1 -Eo -- "$pattern" <<<"$out" | cut -c1-200)"
    fi
}
refuse "steps 60 -> 80" "train.steps 60 -> 80 .*train.override_schedule = true" train.steps=80
refuse "seed" "train.seed 7 -> 8 .*seed cannot change" train.steps=60 train.seed=8
refuse "loss_on" "train.loss_on all -> response .*model.init_from = .*step-000060" train.steps=60 \
    train.loss_on=response train.override_schedule=true
refuse "model shape" "d_model = 64, but the run has 128.*new \[checkpoint\] dir" model.d_model=128 model.n_heads=4
refuse "model shape, resume = PATH" "d_model = 64, but the run has 128.*drop checkpoint.resume = .*step-000060" \
    model.d_model=128 model.n_heads=4 checkpoint.resume="$tmp/ck/step-000060"
refuse "resume = none on a used dir" "already holds checkpoints" checkpoint.resume=none

# 2. the override: the lr continues
cp -r "$tmp/ck" "$tmp/ck-over"
run 2 "$tmp/run80" "$tmp/ck-over" parallel.dp=0 train.steps=80 train.override_schedule=true > "$tmp/run80.log" 2>&1 ||
    { echo "FAIL: resume with the override failed"; tail -3 "$tmp/run80.log"; fail=1; }
metrics "$tmp/run60" '[.step, .lr]' > "$tmp/lr60.json" || fail=1
metrics "$tmp/run80" '[.step, .lr]' > "$tmp/lr80.json" || fail=1
"$PY" - "$tmp/lr60.json" "$tmp/lr80.json" <<'PY' || fail=1
import json, math, sys
a = dict(json.loads(l) for l in open(sys.argv[1]))
b = dict(json.loads(l) for l in open(sys.argv[2]))
lr, min_lr, warm = 3e-3, 3e-4, 5            # tests/e2e/configs/small.ini
def cosine(pos, steps):                      # optimizer_lr, no continuation (docs/design.md §7)
    if pos < warm: return lr * (pos + 1) / warm
    r = min(max((pos - warm) / (steps - warm), 0), 1)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * r))
lr0 = cosine(59, 60)                         # the lr of step 60 (position 59)
def continued(pos, R=60, steps=80):
    r = min(max((pos - R + 1) / (steps - R), 0), 1)
    return min_lr + 0.5 * (lr0 - min_lr) * (1 + math.cos(math.pi * r))
ok = sorted(b) == list(range(61, 81))
if not ok: print("FAIL: the continued run logged steps", sorted(b))
worst = max(abs(b[s] - continued(s - 1)) / continued(s - 1) for s in b)
if worst > 6e-4: ok = False; print(f"FAIL: continued lr differs from the formula (worst rel {worst:.1e})")
one_step = abs(a[60] - a[59])
if abs(b[61] - a[60]) > one_step + 1e-7:
    ok = False; print(f"FAIL: lr jumps at the resume: {a[60]:.3e} at 60, {b[61]:.3e} at 61 (one step: {one_step:.1e})")
if abs(b[80] - min_lr) > 1e-9: ok = False; print(f"FAIL: lr at step 80 is {b[80]:.3e}, not min_lr")
plain = cosine(60, 80)
print(f"override: lr {a[60]:.3e} at step 60 -> {b[61]:.3e} at 61 (the 80-step schedule as is: {plain:.3e}), "
      f"{b[80]:.3e} at 80; worst rel vs the formula {worst:.1e}")
sys.exit(0 if ok else 1)
PY
grep -q "train.steps 60 -> 80 (schedule: continued" "$tmp/run80.log" || { echo "FAIL: the change is not printed"; fail=1; }

# 3. dp inferred: 4 ranks, tp 2
run 4 "$tmp/run-dp" "$tmp/ck-dp" parallel.tp=2 parallel.dp=0 train.steps=3 train.warmup_steps=1 > "$tmp/dp.log" 2>&1 ||
    { echo "FAIL: 4 ranks, tp 2, dp inferred: exit non-zero"; tail -3 "$tmp/dp.log"; fail=1; }
dp=$(awk '/^\[parallel\]/{p=1} /^\[/{if ($0 != "[parallel]") p=0} p && $1 == "dp" {print $3}' "$tmp/run-dp/config.ini")
mdp=$(awk '$1 == "dp" {print $3}' "$tmp/ck-dp/step-000003/manifest.ini")
if [ "$dp" = 2 ] && [ "$mdp" = 2 ]; then echo "ok   [dp inferred] 4 ranks / tp 2: dp = $dp (config.ini), $mdp (checkpoint)"
else echo "FAIL: dp inferred on 4 ranks with tp 2: config.ini dp = '$dp', checkpoint dp = '$mdp'"; fail=1; fi

# 4. the wall-clock budget
rc=0; run 1 "$tmp/run-time" "$tmp/ck-time" parallel.dp=1 train.steps=100000 train.exit_duration_mins=0.05 \
    > "$tmp/time.log" 2>&1 || rc=$?
k=$(sed -n 's/^step-0*\([0-9]*\)$/\1/p' "$tmp/ck-time/latest" 2>/dev/null || true)
ended=$(jq -r 'select(.done) | "\(.ended) \(.steps_done) \(.saved)"' "$tmp/run-time/metrics.jsonl" 2>/dev/null || true)
if [ "$rc" = 3 ] && [ -n "$k" ] && [ "$k" -lt 100000 ] && [ "$ended" = "exit_duration $k true" ] &&
    "$TRIDENT" ckpt verify "$tmp/ck-time" > /dev/null; then
    echo "ok   [exit_duration_mins] exit 3 after step $k, checkpoint verifies"
else
    echo "FAIL: exit_duration_mins: exit $rc, checkpoint step '$k', closing record '$ended'"; tail -3 "$tmp/time.log"; fail=1
fi
if [ -n "$k" ]; then
    # (5. with model.init_from set: a resume does not read it, and says so)
    rc=0; run 1 "$tmp/run-time2" "$tmp/ck-time" parallel.dp=1 train.steps=$((k + 5)) train.override_schedule=true \
        model.init_from="$tmp/ck-dp" > "$tmp/time2.log" 2>&1 || rc=$?
    last=$(metrics "$tmp/run-time2" .step | tail -n 1)
    if [ "$rc" = 0 ] && [ "$last" = $((k + 5)) ]; then echo "ok   [exit_duration_mins] the resume completes at step $last"
    else echo "FAIL: resume after exit_duration_mins: exit $rc, last step '$last'"; tail -3 "$tmp/time2.log"; fail=1; fi
    if grep -q "note: \[model\] init_from = $tmp/ck-dp is not read: this run resumes from $tmp/ck-time/step-0*$k " "$tmp/time2.log"
    then echo "ok   [init_from on a resume] not read, and the note says so"
    else echo "FAIL: a resume with model.init_from set does not say init_from is not read"; fail=1; fi
fi

# 6. train.steps shrunk below the checkpoint's step: nothing to train, said plainly
cp -r "$tmp/ck" "$tmp/ck-shrink"
rc=0; run 1 "$tmp/run-shrink" "$tmp/ck-shrink" parallel.dp=1 train.steps=1 train.warmup_steps=0 \
    train.override_schedule=true > "$tmp/shrink.log" 2>&1 || rc=$?
closing=$(jq -r 'select(.done) | "\(.steps_done) \(.steps)"' "$tmp/run-shrink/metrics.jsonl" 2>/dev/null || true)
if [ "$rc" = 0 ] && grep -q "^nothing to train: the checkpoint is at step 60, train.steps = 1$" "$tmp/shrink.log" &&
    grep -q "^done: 0 steps," "$tmp/shrink.log" && ! grep -q "LR schedule continues" "$tmp/shrink.log" &&
    [ "$closing" = "60 0" ]; then
    echo "ok   [steps 60 -> 1] exit 0: $(grep '^nothing to train' "$tmp/shrink.log"); $(grep -o '^done: [-0-9]* steps' "$tmp/shrink.log")"
else
    echo "FAIL: resume at 60 with train.steps = 1: exit $rc, closing record '$closing'"
    grep -E "nothing to|^done:|LR schedule" "$tmp/shrink.log" || tail -3 "$tmp/shrink.log"; fail=1
fi
exit $fail
