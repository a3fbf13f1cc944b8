#!/usr/bin/env bash
# train_zb.sh: the zero-bubble pipeline schedules (parallel.pp_schedule = zb-h1
# and zbv; Qi et al. 2024, src/parallel/pipeline.h) train what 1F1B trains,
# bit for bit, in fp32. Issue 30's acceptance 1, 2 and 3 (measured half):
#  1. 10 steps of an 8-layer model (global batch 16, microbatches of 2) at
#     (tp, pp, dp) = (1,2,1) and (1,4,1), tied and untied embeddings: the zb-h1
#     and zbv runs log every step's loss and gradient norm exactly as the
#     1f1b run of the same layout (the same printed digits), and their final
#     parameters (trident ckpt export of the last checkpoint) are equal to
#     1f1b's bit for bit. The B/W split reorders no sum: each gradient sees
#     its microbatches in the same order (model.h, model_backward_chunk_input),
#     and ZB-V's tied embedding sums its two halves as 1F1B's all-reduce does.
#  2. The same at (2,2,2) (8 ranks, 4-layer model) with ZeRO-1 and with
#     ZeRO-3 (untied: the tied embedding under ZeRO-2/3 takes its own path).
#  3. zb-h1 and zbv at pp 4 under TRIDENT_FAULT=pp_delay:SEED (a random 0-2 ms
#     sleep before every pipeline send and receive) for 2 seeds: the same
#     numbers as without, no hang (tests/mpi/test_pipeline_mpi.c runs the
#     executor under 50 seeds).
#  4. Every step record of a pipeline run carries pp_idle_s (one value per
#     rank). With equal stages (TRIDENT_FAULT=pp_op_ms:100: each F, B and W
#     op first sleeps 100 ms, so compute is the same on every stage and leaves
#     the 2 cores free; unpadded, 4 ranks on 2 cores measure who got a core,
#     not the bubble), 4 steps at pp 4 and m = 8: the zb-h1 run's idle time,
#     summed over ranks in its quietest step of 2..4 (other load only adds
#     waiting), is below 0.7 x the 1f1b run's (the
#     simulator: 3 x 100 ms against 3 x 300 ms a stage; at 30 ms, ~0.39 s
#     against ~0.77 s a step).
#  5. The emulated CUDA build (make EMU=1) at pp 2, zb-h1 and zbv: every
#     step's loss and grad norm within 1e-5 relative of the CPU backend's.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
common=(data.path="$tmp/shards" train.global_batch_size=16 train.lr=2e-3
        train.min_lr=2e-4 train.eval_every=0)
run() { # name np extra-settings...
    local name=$1 np=$2 rc=0
    shift 2
    timeout 300 "${MPIRUN[@]}" -np "$np" "$TRIDENT" train "$SMALL_INI" "${common[@]}" train.steps=10 "$@" \
        checkpoint.dir="$tmp/ck-$name" log.run_dir="$tmp/run-$name" > "$tmp/log-$name" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$name"; fail "$name run exited $rc"; }
    "$TRIDENT" ckpt export "$tmp/ck-$name" "$tmp/final-$name.h5" > /dev/null || fail "$name: ckpt export"
}
names=()
for tied in true false; do
    for pp in 2 4; do
        [ "$tied $pp" = "false 2" ] && continue # pp 2 untied: covered at (2,2,2)
        for sched in 1f1b zb-h1 zbv; do
            v=1; [ "$sched" = zbv ] && v=2
            name="$tied-1-$pp-1-0-$sched"
            run "$name" "$pp" model.n_layers=8 model.tie_embeddings=$tied parallel.pp=$pp \
                parallel.virtual_stages=$v parallel.pp_schedule=$sched
            names+=("$name")
        done
    done
done
for zero in 1 3; do
    for sched in 1f1b zb-h1 zbv; do
        v=1; [ "$sched" = zbv ] && v=2
        name="false-2-2-2-$zero-$sched"
        run "$name" 8 model.n_layers=4 model.tie_embeddings=false parallel.tp=2 parallel.pp=2 \
            parallel.dp=2 parallel.zero_stage=$zero parallel.virtual_stages=$v parallel.pp_schedule=$sched
        names+=("$name")
    done
done
for seed in 3 17; do
    for sched in zb-h1 zbv; do
        v=1; [ "$sched" = zbv ] && v=2
        name="true-1-4-1-0-$sched-delay$seed"
        TRIDENT_FAULT=pp_delay:$seed run "$name" 4 model.n_layers=8 model.tie_embeddings=true \
            parallel.pp=4 parallel.virtual_stages=$v parallel.pp_schedule=$sched
        names+=("$name")
    done
done
for sched in 1f1b zb-h1; do
    TRIDENT_FAULT=pp_op_ms:100 timeout 300 "${MPIRUN[@]}" -np 4 "$TRIDENT" train "$SMALL_INI" "${common[@]}" \
        train.steps=4 train.warmup_steps=1 model.n_layers=4 parallel.pp=4 parallel.pp_schedule=$sched \
        log.run_dir="$tmp/run-pad-$sched" > "$tmp/log-pad-$sched" 2>&1 ||
        { tail -20 "$tmp/log-pad-$sched"; fail "padded $sched run"; }
done
"$PY" - "$tmp" "${names[@]}" <<'PY'
import json, sys
import h5py, numpy as np
tmp, names = sys.argv[1], sys.argv[2:]
def steps(name):
    """Step -> record (training steps only), and the raw loss/grad_norm text."""
    out = {}
    for line in open(f"{tmp}/run-{name}/metrics.jsonl"):
        rec = json.loads(line)
        if "loss" in rec and "grad_norm" in rec:
            out[rec["step"]] = rec
    assert sorted(out) == list(range(1, 11)), f"{name}: steps {sorted(out)}, expected 1..10"
    return out
def params(name):
    with h5py.File(f"{tmp}/final-{name}.h5", "r") as f:
        out = {}
        f.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
    return out
ok = True
for name in names:
    if "-1f1b" in name:
        continue
    ref = name.replace("-zb-h1", "-1f1b").replace("-zbv", "-1f1b").split("-delay")[0]
    a, b = steps(name), steps(ref)
    diff = [s for s in a if (a[s]["loss"], a[s]["grad_norm"]) != (b[s]["loss"], b[s]["grad_norm"])]
    if diff:
        ok = False
        s = diff[0]
        print(f"FAIL: {name}: step {s} loss {a[s]['loss']} grad norm {a[s]['grad_norm']}, "
              f"{ref}: {b[s]['loss']} {b[s]['grad_norm']} ({len(diff)} steps differ)")
    pa, pb = params(name), params(ref)
    if set(pa) != set(pb):
        ok = False
        print(f"FAIL: {name}: tensors {sorted(set(pa) ^ set(pb))} in one export only")
    bad = [k for k in pa if k in pb and not np.array_equal(pa[k], pb[k])]
    if bad:
        ok = False
        k = bad[0]
        print(f"FAIL: {name}: {len(bad)} tensors differ from {ref}, e.g. {k}: max |diff| "
              f"{np.max(np.abs(pa[k].astype(np.float64) - pb[k].astype(np.float64))):.3e}")
    if not diff and not bad:
        print(f"{name}: 10 steps and {len(pa)} final tensors bit-identical to {ref}")
# 4. pp_idle_s: per rank in every pipeline step record; with equal (padded)
# stages zb-h1's below 1f1b's at pp 4.
for name in names:
    for s, rec in steps(name).items():
        v = rec.get("pp_idle_s")
        assert isinstance(v, list) and len(v) == (8 if name.startswith("false-2-2-2") else int(name.split("-")[2])), \
            f"{name} step {s}: pp_idle_s = {v}"
def idle(name):
    run = {r["step"]: r for r in map(json.loads, open(f"{tmp}/run-{name}/metrics.jsonl")) if "grad_norm" in r}
    assert sorted(run) == [1, 2, 3, 4], f"{name}: steps {sorted(run)}"
    # the quietest step: other load only ever adds waiting
    return min(sum(run[s]["pp_idle_s"]) for s in (2, 3, 4))
i1, iz = idle("pad-1f1b"), idle("pad-zb-h1")
print(f"pp 4, m 8, every op padded by 100 ms: idle in the quietest step, summed over the 4 ranks: 1f1b {i1:.3f} s, zb-h1 {iz:.3f} s")
if not iz < 0.7 * i1:
    ok = False
    print(f"FAIL: zb-h1's measured idle {iz:.3f} s is not below 0.7 x 1f1b's {i1:.3f} s")
sys.exit(0 if ok else 1)
PY
# 5. The emulated CUDA build at pp 2 against the CPU backend.
EMU_TRIDENT="$PWD/$BUILD-emu/trident"
need_emu trident
for sched in zb-h1 zbv; do
    v=1; [ "$sched" = zbv ] && v=2
    rc=0
    OMP_NUM_THREADS=1 timeout 300 "${MPIRUN[@]}" -np 2 "$EMU_TRIDENT" train "$SMALL_INI" "${common[@]}" \
        model.n_layers=4 train.steps=5 parallel.pp=2 parallel.virtual_stages=$v parallel.pp_schedule=$sched \
        system.device=cuda log.run_dir="$tmp/run-emu-$sched" > "$tmp/log-emu-$sched" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-emu-$sched"; fail "emulated CUDA $sched run exited $rc"; }
    "$TRIDENT" train "$SMALL_INI" "${common[@]}" model.n_layers=4 train.steps=5 \
        log.run_dir="$tmp/run-cpu-$sched" > "$tmp/log-cpu-$sched" 2>&1 || fail "CPU reference for $sched"
done
"$PY" - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def steps(d):
    return {r["step"]: r for r in map(json.loads, open(f"{tmp}/{d}/metrics.jsonl")) if "grad_norm" in r}
ok = True
for sched in ("zb-h1", "zbv"):
    a, b = steps(f"run-emu-{sched}"), steps(f"run-cpu-{sched}")
    assert sorted(a) == sorted(b) == list(range(1, 6)), (sorted(a), sorted(b))
    paths = {a[s].get("attention") for s in a}
    if paths - {"native", "cudnn", "mixed"}:  # the CUDA backend's kernels, not the CPU's
        ok = False
        print(f"FAIL: {sched}: the emulated run's attention paths {paths}: not the CUDA backend")
    worst = max(abs(a[s][k] - b[s][k]) / abs(b[s][k]) for s in a for k in ("loss", "grad_norm"))
    print(f"emulated CUDA pp 2 {sched} vs CPU, 5 steps: worst relative difference {worst:.1e}")
    if worst > 1e-5:
        ok = False
        print(f"FAIL: {sched}: emulated CUDA differs from the CPU backend by {worst:.1e} > 1e-5")
sys.exit(0 if ok else 1)
PY
echo "train_zb: ok"
