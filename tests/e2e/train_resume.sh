#!/usr/bin/env bash
# train_resume.sh: checkpoints during training (issue 6).
#  1. Bit-exact resume in layouts (tp,pp,dp,zero) = (1,1,1,0), (2,2,2,0),
#     (1,2,4,1): 20 steps straight against runs stopped every 5 steps
#     ([train] exit_interval) and resumed three times (the runs' metrics.jsonl
#     begin at steps 1, 6, 11, 16): the same loss and learning rate at every
#     step, and byte-identical final parameters.
#  2. Resharding: a checkpoint of step 10 saved in one layout resumes in
#     another ((2,2,1) -> (1,1,4), (1,1,1) -> (2,2,2), (1,2,4) ZeRO-1 ->
#     (2,1,2) ZeRO-1) and its steps 11-20 give the losses of the straight run
#     in the original layout within 1e-5 relative.
#  3. SIGTERM to one rank of a 4-rank run: every rank stops after the current
#     step with exit code 3, a checkpoint of that step exists and verifies,
#     and resuming from it is bit-exact against a straight run.
#  4. Refused with exit 2 and a message naming the file, nothing changed: a
#     flipped byte, a truncated or missing rank file, another model, an
#     unknown format version; an automatic resume refused names the newest
#     older checkpoint that passes the same checks, and following its hint
#     (checkpoint.resume = it, checkpoint.branch = true) trains on from it.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
fail=0
# train NAME TP PP DP ZERO [overrides...]: one run; its log appended to
# $tmp/NAME.log, its metrics in $tmp/run-NAME.K/metrics.jsonl, K = 0, 1, ...
# for the runs of NAME in turn (each run's own steps; tests/e2e/run_folder.sh
# checks one run folder across resumes).
train() {
    local name=$1 tp=$2 pp=$3 dp=$4 zero=$5 k=0 rc=0; shift 5
    while [ -e "$tmp/run-$name.$k" ]; do k=$((k + 1)); done
    mkdir -p "$tmp/run-$name.$k"
    small_train "$tmp/run-$name.$k" "$tmp/ck-$name" "$tp" "$pp" "$dp" "$zero" \
        checkpoint.every=0 checkpoint.keep_last=0 "$@" >> "$tmp/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || echo "FAIL: run $k of $name exited $rc"
    return "$rc"
}
export_final() { "$TRIDENT" ckpt export "$tmp/ck-$1" "$tmp/$1.h5" > /dev/null || { echo "FAIL: export of $1"; fail=1; }; }

# 1. bit-exact resume
for l in 1,1,1,0 2,2,2,0 1,2,4,1; do
    IFS=, read -r tp pp dp z <<<"$l"
    train "straight-$l" $tp $pp $dp $z || fail=1
    for i in 1 2 3 4; do
        train "stopped-$l" $tp $pp $dp $z train.exit_interval=5 || fail=1
    done
    export_final "straight-$l"; export_final "stopped-$l"
done

# 2. resharding: step 10 of one layout continued in another. The step-10
# checkpoints of (1,1,1,0) and (1,2,4,1) are those 1.'s stopped runs saved
# (their second run stops after step 10; keep_last = 0 keeps it), which 1.
# checks against the straight runs.
step10() { # FROM TO: TO holds FROM's step-000010 as its latest
    mkdir -p "$2"; cp -r "$1/step-000010" "$2/"; echo step-000010 > "$2/latest"
}
train "src-2,2,1,0" 2 2 1 0 train.exit_interval=10
train "straight-2,2,1,0" 2 2 1 0
cp -r "$tmp/ck-src-2,2,1,0" "$tmp/ck-re-1,1,4,0"; train "re-1,1,4,0" 1 1 4 0
step10 "$tmp/ck-stopped-1,1,1,0" "$tmp/ck-re-2,2,2,0"; train "re-2,2,2,0" 2 2 2 0
step10 "$tmp/ck-stopped-1,2,4,1" "$tmp/ck-re-2,1,2,1"; train "re-2,1,2,1" 2 1 2 1

# 3. SIGTERM to one rank of four, once metrics.jsonl shows step 5
( rc=0; train "term" 1 1 4 0 train.steps=100000 log.every=1 >/dev/null || rc=$?; echo "$rc" > "$tmp/term.rc" ) &
for _ in $(seq 1 300); do metrics_at_least "$tmp/run-term.0" 5 && break; sleep 0.1; done
victim=$(pgrep -f "trident train .*$tmp/ck-term" | tail -n 1 || true)
[ -n "$victim" ] && kill -TERM "$victim"
wait $!
rc=$(cat "$tmp/term.rc")
[ "$rc" = 3 ] || { echo "FAIL: SIGTERM run exited $rc, expected 3"; tail -5 "$tmp/term.log"; fail=1; }
[ -f "$tmp/ck-term/latest" ] || fail "no checkpoint after SIGTERM"
k=$(sed -n 's/^step-0*\([0-9]*\)$/\1/p' "$tmp/ck-term/latest")
last=$(metrics "$tmp/run-term.0" .step | tail -n 1)
[ "$k" = "$last" ] || { echo "FAIL: the checkpoint is of step $k, metrics.jsonl ends at step $last"; fail=1; }
# The closing record says how the run ended, and the line a requeue script
# looks for (README, Checkpoints) is printed.
ended=$(jq -r 'select(.done) | "\(.ended) \(.signal) \(.steps_done) \(.saved)"' "$tmp/run-term.0/metrics.jsonl")
[ "$ended" = "signal 15 $k true" ] || { echo "FAIL: closing record '$ended', expected 'signal 15 $k true'"; fail=1; }
grep -q "stopped by signal 15 after step $k, checkpoint saved" "$tmp/term.log" || { echo "FAIL: no 'stopped by signal' line for step $k"; fail=1; }
"$TRIDENT" ckpt verify "$tmp/ck-term" > /dev/null || { echo "FAIL: ckpt verify after SIGTERM"; fail=1; }
echo "SIGTERM: stopped after step $k with exit $rc"
e=$((k + 5))
train "term" 1 1 4 0 train.steps=100000 train.exit_interval=$e || fail=1
train "termref" 1 1 4 0 train.steps=100000 train.exit_interval=$e || fail=1
export_final term; export_final termref

# 4. A bad checkpoint is refused before training (exit 2, the file named)
#    and nothing in it is overwritten.
refuse() { # LABEL PATTERN [overrides]: resume from $tmp/ck-bad must exit 2
    local label=$1 pattern=$2; shift 2
    local before after out rc=0
    before=$(cd "$tmp/ck-bad" && find . -type f ! -name .trident.lock -exec md5sum {} + | sort)
    # OMPI_MCA_odls_base_sigkill_timeout=0: mpirun's 1 s wait before SIGKILL
    # after the refusal's MPI_Abort (a start-up failure: nothing to save).
    out=$(OMPI_MCA_odls_base_sigkill_timeout=0 timeout 60 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
          parallel.dp=2 train.global_batch_size=16 checkpoint.dir="$tmp/ck-bad" \
          log.run_dir="$tmp/run-bad" "$@" 2>&1) || rc=$?
    after=$(cd "$tmp/ck-bad" && find . -type f ! -name .trident.lock -exec md5sum {} + | sort)
    if [ "$rc" != 2 ] || ! grep -Eq -- "$pattern" <<<"$out" || [ "$before" != "$after" ]; then
        echo "FAIL: bad checkpoint ($label): exit $rc, message match $(grep -Ec -- "$pattern" <<<"$out" || true), files unchanged $([ "$before" = "$after" ] && echo yes || echo no)"
        grep trident: <<<"$out" | head -3 || true; fail=1
    else
        echo "refused ($label): $(grep -m1 -E -- "$pattern" <<<"$out" | cut -c1-160)"
    fi
}
fresh_bad() { rm -rf "$tmp/ck-bad"; cp -r "$tmp/ck-straight-1,1,1,0" "$tmp/ck-bad"; }
fresh_bad; printf '\x55' | dd of="$tmp/ck-bad/step-000020/rank-00000.h5" bs=1 seek=5000 conv=notrunc 2>/dev/null
refuse "flipped byte" "rank-00000.h5.*(checksum|xxh3)"
fresh_bad; truncate -s 3000 "$tmp/ck-bad/step-000020/rank-00000.h5"
refuse "truncated file" "rank-00000.h5"
fresh_bad; rm "$tmp/ck-bad/step-000020/rank-00000.h5"
refuse "missing rank file" "rank-00000.h5"
fresh_bad
refuse "model differs" "d_model" model.d_model=128 model.n_heads=4
fresh_bad; sed -i 's/^format_version = 1/format_version = 7/' "$tmp/ck-bad/step-000020/manifest.ini"
refuse "unknown format version" "format_version.*7"
# An automatic resume refused for its newest checkpoint says which older
# one passes the same checks and how to continue from it (the refusal stays,
# nothing moves): stopped-1,1,1,0 saved steps 5, 10, 15 and 20; 20 and 15
# damaged, the hint names 10; following it trains on from step 10, the
# damaged steps moved aside, kept. With every step damaged: no older one.
stopped_bad() { rm -rf "$tmp/ck-bad"; cp -r "$tmp/ck-stopped-1,1,1,0" "$tmp/ck-bad"; }
stopped_bad; printf '\x55' | dd of="$tmp/ck-bad/step-000020/rank-00000.h5" bs=1 seek=5000 conv=notrunc 2>/dev/null
truncate -s 3000 "$tmp/ck-bad/step-000015/rank-00000.h5"
refuse "an older checkpoint named" "step-000020/rank-00000.h5: checksum .* \(the file is corrupt\); the newest \
older checkpoint that passes these checks is $tmp/ck-bad/step-000010: to continue from it, set checkpoint.resume = \
$tmp/ck-bad/step-000010 and checkpoint.branch = true \(the steps after it, step-000020 among them, then move aside"
rc=0; small_train "$tmp/run-hint" "$tmp/ck-bad" 1 1 2 0 checkpoint.resume="$tmp/ck-bad/step-000010" \
    checkpoint.branch=true > "$tmp/hint.log" 2>&1 || rc=$?
aside=("$tmp/ck-bad"/branched-after-step-000010-*)
[ "$rc" -eq 0 ] && [ "$(metrics "$tmp/run-hint" .step | head -n 1)" = 11 ] && [ -f "${aside[0]}/step-000020/rank-00000.h5" ] &&
    [ -f "${aside[0]}/step-000015/rank-00000.h5" ] && [ "$(cat "$tmp/ck-bad/latest")" = step-000020 ] ||
    { grep trident: "$tmp/hint.log" | head -3 || true; ls "$tmp/ck-bad"; echo "FAIL: following the hint (exit $rc)"; fail=1; }
stopped_bad; for s in 5 10 15 20; do truncate -s 3000 "$tmp/ck-bad/step-0000$(printf %02d $s)/rank-00000.h5"; done
refuse "no older checkpoint passes" "step-000020/rank-00000.h5: 3000 bytes.*; no older checkpoint of $tmp/ck-bad \
passes these checks either"

"$PY" - "$tmp" <<'PY' || fail=1
import glob, json, sys, h5py, numpy as np
tmp = sys.argv[1]
def runs(name):
    """The step records of each run of NAME, in order: one list per run."""
    dirs = sorted(glob.glob(f"{tmp}/run-{name}.*"), key=lambda d: int(d.rsplit(".", 1)[1]))
    return [[r for r in map(json.loads, open(f"{d}/metrics.jsonl")) if "loss" in r] for d in dirs]
def steps(name):
    """Step -> (loss, lr) over all runs of NAME; a step logged twice is an error."""
    out = {}
    for run in runs(name):
        for r in run:
            assert r["step"] not in out, f"{name}: step {r['step']} logged by two runs"
            out[r["step"]] = (r["loss"], r["lr"])
    return out
def same_params(a, b):
    fa, fb = h5py.File(f"{tmp}/{a}.h5"), h5py.File(f"{tmp}/{b}.h5")
    assert sorted(fa) == sorted(fb), f"{a} vs {b}: different tensors"
    return [k for k in fa if not np.array_equal(fa[k][()], fb[k][()])]
ok = True
for l in ("1,1,1,0", "2,2,2,0", "1,2,4,1"):
    starts = [run[0]["step"] if run else None for run in runs(f"stopped-{l}")]
    if starts != [1, 6, 11, 16]:
        ok = False
        print(f"FAIL: {l}: the four stopped runs began at steps {starts}, expected [1, 6, 11, 16]")
    s, r = steps(f"straight-{l}"), steps(f"stopped-{l}")
    if sorted(s) != list(range(1, 21)) or s != r:
        ok = False
        print(f"FAIL: {l}: stopped-and-resumed metrics differ from the straight run at steps",
              [k for k in range(1, 21) if s.get(k) != r.get(k)])
    bad = same_params(f"straight-{l}", f"stopped-{l}")
    if bad: ok = False; print(f"FAIL: {l}: final parameters differ in {bad[:3]}")
    else: print(f"{l}: 20 steps straight == 3 resumes, final parameters byte-identical")
for src, dst in (("straight-2,2,1,0", "re-1,1,4,0"), ("straight-1,1,1,0", "re-2,2,2,0"), ("straight-1,2,4,1", "re-2,1,2,1")):
    s, r = steps(src), steps(dst)
    if sorted(r) != list(range(11, 21)):
        ok = False; print(f"FAIL: {dst}: logged steps {sorted(r)}, expected 11-20"); continue
    worst = max(abs(s[k][0] - r[k][0]) / s[k][0] for k in range(11, 21))
    if worst > 1e-5: ok = False; print(f"FAIL: {dst}: steps 11-20 differ from {src} (worst rel {worst:.1e})")
    else: print(f"resharded {src} -> {dst}: steps 11-20 match (worst rel {worst:.1e})")
bad = same_params("term", "termref")
if bad: ok = False; print(f"FAIL: resume after SIGTERM: parameters differ in {bad[:3]}")
else: print("resume after SIGTERM: parameters byte-identical to the straight run")
sys.exit(0 if ok else 1)
PY
exit $fail
