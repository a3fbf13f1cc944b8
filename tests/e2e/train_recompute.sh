#!/usr/bin/env bash
# train_recompute.sh: [model] recompute = selective and full train bit for bit
# like none (docs/design.md §5), in every dtype. Cases (dtype: tp, pp, dp,
# zero_stage, sequence_parallel, virtual_stages): fp32 in (1,1,1,0,0,1),
# (2,2,2,0,0,1) and (2,2,2,1,1,2) (tensor-parallel collectives repeated by
# the full recompute, sequence-sharded norm outputs, interleaved 1F1B with
# several activation slots in flight); bf16 and fp16 (a fixed loss scale, so
# that no step is skipped) in (1,1,1,0,0,1), (2,1,2,0,1,1) (the 16-bit
# tensor-parallel sums through FP32 under sequence parallelism) and
# (1,2,2,0,0,1). 4 steps of a 4-layer model in each mode must log the same
# loss, gradient norm and validation loss records in metrics.jsonl as none,
# and the final parameters (`trident ckpt export` of the last checkpoint: the
# FP32 master weights) must be bit-identical: any difference in any gradient
# of any step would move them. Each run's activation bytes (metrics.jsonl
# mem_bytes) must shrink from none to selective to full.
# Issue 31's mixture-of-experts decoder (tests/e2e/configs/moe.ini at 4 layers,
# the first dense, then 3 MoE blocks; cases moe-DTYPE with a seventh field,
# ep) in fp32 and bf16 at (1,1,1), (1,1,2) with ep 2 (the all-to-alls repeated
# by the full recompute), (2,1,1) with sequence parallelism and (1,2,2) with
# ep 2 (1F1B, several microbatches in flight; in fp32 also interleaved, 2
# virtual stages): the same, and the step records' MoE statistics (aux and z
# losses, dropped tokens, tokens per expert) equal none's: the recomputed
# layer counts nothing twice.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
small_dataset "$tmp"
common=(data.path="$tmp/shards" model.n_layers=4 model.tie_embeddings=false
        train.global_batch_size=16 train.steps=4 train.warmup_steps=2 train.eval_every=2)
cases="fp32:1,1,1,0,0,1 fp32:2,2,2,0,0,1 fp32:2,2,2,1,1,2
       bf16:1,1,1,0,0,1 bf16:2,1,2,0,1,1 bf16:1,2,2,0,0,1
       fp16:1,1,1,0,0,1 fp16:2,1,2,0,1,1 fp16:1,2,2,0,0,1
       moe-fp32:1,1,1,0,0,1 moe-fp32:1,1,2,0,0,1,2 moe-fp32:2,1,1,0,1,1 moe-fp32:1,2,2,0,0,1,2
       moe-fp32:1,2,2,0,0,2,2
       moe-bf16:1,1,1,0,0,1 moe-bf16:1,1,2,0,0,1,2 moe-bf16:2,1,1,0,1,1 moe-bf16:1,2,2,0,0,1,2"
for c in $cases; do
    kind=${c%%:*} dt=${kind#moe-}
    l=${c#*:}
    IFS=, read -r tp pp dp zero sp v ep <<<"$l"
    ini=$SMALL_INI scale=() moe=()
    [ "$dt" = fp16 ] && scale=(precision.loss_scale=1024)
    [ "$kind" = "$dt" ] ||
        ini=tests/e2e/configs/moe.ini moe=(model.moe_first_dense_layers=1 parallel.ep=${ep:-1})
    for mode in none selective full; do
        name="$kind-${l//,/-}-$mode"
        rc=0
        timeout 300 "${MPIRUN[@]}" -np $((tp * pp * dp)) "$TRIDENT" train "$ini" "${common[@]}" \
            precision.dtype=$dt "${scale[@]}" "${moe[@]}" \
            parallel.tp=$tp parallel.pp=$pp parallel.dp=$dp parallel.zero_stage=$zero \
            parallel.sequence_parallel=$sp parallel.virtual_stages=$v model.recompute=$mode \
            checkpoint.dir="$tmp/ck-$name" log.run_dir="$tmp/run-$name" > "$tmp/log-$name" 2>&1 || rc=$?
        [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$name"; fail "$name run exited $rc"; }
        "$TRIDENT" ckpt export "$tmp/ck-$name" "$tmp/final-$name.h5" > /dev/null || fail "$name: ckpt export"
    done
done
"$PY" - "$tmp" "$cases" <<'PY'
import json, sys
import h5py, numpy as np
tmp, cases = sys.argv[1], sys.argv[2].split()
def records(name):
    """The step and validation records of metrics.jsonl, with the numbers that
    must match (timings and memory left out; a MoE model's statistics in), and
    the step records' mem_bytes. No step may be skipped (fp16: the loss scale
    holds)."""
    recs, mem = [], set()
    moe = ("moe_aux_loss", "moe_z_loss", "moe_dropped", "moe_load_min", "moe_load_max", "moe_load_cv")
    for line in open(f"{tmp}/run-{name}/metrics.jsonl"):
        rec = json.loads(line)
        if rec.get("done") or rec.get("event"):  # closing and start records
            continue
        if "loss" in rec:
            assert not rec["skipped"], f"{name}: step {rec['step']} skipped"
            mem.add(rec["mem_bytes"])
            recs.append((rec["step"], rec["loss"], rec["grad_norm"], rec["lr"],
                         json.dumps([rec.get(k) for k in moe])))
            assert name[:4] != "moe-" or rec["moe_aux_loss"] > 0, f"{name}: no MoE statistics {rec}"
        else:
            recs.append((rec["step"], rec["val_loss"]))
    return recs, mem
ok = True
for c in cases:
    dt, l = c.split(":")
    ref = f"{dt}-{l.replace(',', '-')}-none"
    base, base_mem = records(ref)
    assert [r[0] for r in base if len(r) == 5] == [1, 2, 3, 4], f"{ref}: steps {base}"
    assert any(len(r) == 2 for r in base), f"{ref}: no validation record"
    fa = h5py.File(f"{tmp}/final-{ref}.h5")
    mems = [max(base_mem)]
    for mode in ("selective", "full"):
        name = f"{dt}-{l.replace(',', '-')}-{mode}"
        other, mem = records(name)
        mems.append(max(mem))
        if other != base:
            ok = False
            print(f"FAIL: {dt} ({l}) {mode}: metrics {other} differ from none's {base}")
        fb = h5py.File(f"{tmp}/final-{name}.h5")
        assert sorted(fa) == sorted(fb), f"{name}: tensors {sorted(fb)} vs {sorted(fa)}"
        differ = [k for k in fa if not np.array_equal(fa[k][()], fb[k][()])]
        if differ:
            ok = False
            print(f"FAIL: {dt} ({l}) {mode}: final parameters differ from none's: {differ[:5]}")
        else:
            axes = "tp, pp, dp, zero, sp, v" + (", ep" if l.count(",") == 6 else "")
            print(f"{dt} ({axes}) = ({l}) {mode}: {len(base)} records and "
                  f"{len(fa)} final tensors bit-identical to none")
    print(f"{dt} ({l}): rank 0 holds {mems[0]} / {mems[1]} / {mems[2]} bytes (none / selective / full)")
    if not mems[0] > mems[1] > mems[2]:
        ok = False
        print(f"FAIL: {dt} ({l}): memory does not shrink with recompute: {mems}")
sys.exit(0 if ok else 1)
PY
