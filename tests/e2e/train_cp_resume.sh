#!/usr/bin/env bash
# train_cp_resume.sh: a checkpoint saved at cp 2 resumes at cp 1 and at cp 4
# (docs/design.md §4 "Context parallelism": a checkpoint holds no cp state;
# the parameters are replicated over cp and the loader's state is per data
# rank). tests/e2e/configs/cp.ini with packing = concat_reset on single KJV
# verses, 10 steps, checkpoints every 5:
#   1. the cp 2 run's step-5 checkpoint resumed at cp 1 and at cp 4 logs
#      steps 6-10 within 1e-6 relative (beyond metrics.jsonl's 6 decimals) of
#      the cp 2 run that saved it and of the uninterrupted run at cp 1 / cp 4
#      (fp32: the layouts sum attention in other orders, so bitwise is not to
#      be had across them: after 10 steps 3/4 of the parameters of cp 1 and cp
#      2 differ, by at most 1e-6);
#   2. bit-exact in the resumed layout: each of those resumed runs, stopped
#      after step 8 (train.exit_interval = 4) and resumed again from its own
#      step-8 checkpoint, ends with a step-10 checkpoint whose every piece
#      (parameters, moments, loader state) is bitwise that of the same resumed
#      run left uninterrupted, and logs the same steps 9-10.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
command -v bible >/dev/null || fail "bible-kjv not installed: run make deps"
data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
awk 'NF && n < 1500 {print; print ""; n++}' "$tmp/kjv.txt" > "$tmp/verses.txt" # a verse per document
"$TRIDENT" prep --input "$tmp/verses.txt" --output "$tmp/shards" --vocab-size 510 \
    --val-fraction 0.05 >/dev/null 2>&1 || fail "prep of the verse dataset"

# run NAME CP [overrides...]: cp.ini at cp ranks, checkpoints every 5 steps in $tmp/ck-NAME.
run() {
    local name=$1 cp=$2 rc=0; shift 2
    timeout 120 "${MPIRUN[@]}" -np "$cp" "$TRIDENT" train tests/e2e/configs/cp.ini data.path="$tmp/shards" \
        data.packing=concat_reset parallel.cp="$cp" checkpoint.every=5 checkpoint.keep_last=0 checkpoint.dir="$tmp/ck-$name" \
        log.run_dir="$tmp/run-$name" "$@" < /dev/null > "$tmp/log-$name" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$name"; fail "$name exited $rc"; }
}
run cp2 2
for cp in 1 4; do
    run "cp$cp" "$cp"
    run "cp2to$cp" "$cp" checkpoint.resume="$tmp/ck-cp2/step-000005"
    run "cp2to${cp}stop" "$cp" checkpoint.resume="$tmp/ck-cp2/step-000005" train.exit_interval=4
    [ -d "$tmp/ck-cp2to${cp}stop/step-000008" ] || fail "cp2to${cp}stop saved no step-8 checkpoint"
    [ ! -d "$tmp/ck-cp2to${cp}stop/step-000010" ] || fail "cp2to${cp}stop ran past step 8"
    run "cp2to${cp}stop" "$cp" checkpoint.resume="$tmp/ck-cp2to${cp}stop/step-000008"
done

"$PY" - "$tmp" <<'PY'
import glob, json, os, sys
import h5py, numpy as np
tmp = sys.argv[1]
def steps(name):
    rows = [json.loads(l) for l in open(f"{tmp}/run-{name}/metrics.jsonl")]
    return {r["step"]: r for r in rows if "loss" in r}
def close(a, b, what):
    ra, rb = steps(a), steps(b)
    assert all(s in ra and s in rb for s in range(6, 11)), f"{what}: steps {sorted(ra)} / {sorted(rb)}"
    w = max(max(abs(ra[s][k] - rb[s][k]) - 1e-6, 0) / abs(ra[s][k]) for s in range(6, 11)
            for k in ("loss", "grad_norm"))
    print(("" if w <= 1e-6 else "FAIL: ") + f"{what}: steps 6-10 within 1e-6 (worst rel {w:.1e})")
    return w <= 1e-6
def pieces(ck):
    out = {}
    for path in sorted(glob.glob(ck + "/*.h5")):
        with h5py.File(path) as f:
            f.visititems(lambda n, o: out.__setitem__(os.path.basename(path) + ":" + n, o[()])
                         if isinstance(o, h5py.Dataset) else None)
    return out
ok = True
for cp in (1, 4):
    ok &= close("cp2", f"cp2to{cp}", f"cp 2 step 5 resumed at cp {cp}, against the cp 2 run")
    ok &= close(f"cp{cp}", f"cp2to{cp}", f"cp 2 step 5 resumed at cp {cp}, against cp {cp} uninterrupted")
    a, b = pieces(f"{tmp}/ck-cp2to{cp}/step-000010"), pieces(f"{tmp}/ck-cp2to{cp}stop/step-000010")
    same = sorted(a) == sorted(b) and len(a) > 0 and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)
    ra, rb = steps(f"cp2to{cp}"), steps(f"cp2to{cp}stop")
    logs = all(ra[s]["loss"] == rb[s]["loss"] and ra[s]["grad_norm"] == rb[s]["grad_norm"] for s in (9, 10))
    print(("" if same and logs else "FAIL: ") + f"cp {cp} resumed from cp 2, stopped after step 8 and resumed: "
          f"step-10 checkpoint bitwise equal to it uninterrupted ({len(a)} datasets), steps 9-10 the same")
    ok &= same and logs
sys.exit(0 if ok else 1)
PY
