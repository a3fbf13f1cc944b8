#!/usr/bin/env bash
# train_dp_shard.sh: parallel.dp_shard, the data axes split into dp_shard x
# dp_replicate (docs/design.md §2, the grid's axis list). On 4 data-parallel
# ranks, dp_shard = 2 (two replicas of 2-rank shard groups: the MPI groups
# dp_shard and dp_replicate are built and checked against the layout by
# topology_init) trains bit-identically to the default dp_shard = dp over 3
# steps (the split renumbers no rank and, at zero_stage 0 and 1, changes no
# collective); metrics.jsonl's start record carries every named size of the
# grid (tp, dp, dp_shard, dp_replicate = dp / dp_shard, derived, pp), the
# checkpoint's manifest the same layout lines, and `trident train
# --print-config` the derived axes. Then the emulated CUDA build (make EMU=1:
# the real comm_nccl.c over the emulated NCCL) in the same layout, whose
# topology_init_device makes an NCCL communicator for each kind with two or
# more ranks (dp, dp_shard, dp_replicate): 3 steps of a tiny model within
# 1e-5 relative of the CPU build's.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
for shard in 0 2; do
    rc=0
    small_train "$tmp/run-$shard" "$tmp/ck-$shard" 1 1 4 1 parallel.dp_shard=$shard train.steps=3 train.warmup_steps=1 \
        model.n_layers=2 > "$tmp/log-$shard" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$shard"; fail "dp_shard=$shard run exited $rc"; }
done
# The start record: the layout's named sizes, dp_replicate derived.
for shard in 0 2; do
    want=$([ $shard = 0 ] && echo '1 4 4 1 1' || echo '1 4 2 2 1')
    got=$(jq -r 'select(.event == "start") | "\(.tp) \(.dp) \(.dp_shard) \(.dp_replicate) \(.pp)"' \
        "$tmp/run-$shard/metrics.jsonl")
    [ "$got" = "$want" ] || fail "dp_shard=$shard: start record's tp dp dp_shard dp_replicate pp = '$got', expected '$want'"
done
# The same losses and gradient norms, bit for bit.
a=$(metrics "$tmp/run-0" '[.step, .loss, .grad_norm]'); b=$(metrics "$tmp/run-2" '[.step, .loss, .grad_norm]')
[ "$(wc -l <<<"$a")" -eq 3 ] || fail "dp_shard=0 logged $(wc -l <<<"$a") steps, expected 3"
[ "$a" = "$b" ] || fail "dp_shard=2 differs from dp_shard=dp: $a vs $b"
# The manifest's layout lines.
manifest=$(cat "$tmp/ck-2"/step-*/manifest.ini)
for line in "tp = 1" "dp = 4" "dp_shard = 2" "dp_replicate = 2" "pp = 1"; do
    grep -qx "$line" <<<"$manifest" || fail "manifest lacks '$line': $manifest"
done
# --print-config names the derived axis.
"$TRIDENT" train --print-config "$SMALL_INI" parallel.dp=4 parallel.dp_shard=2 train.global_batch_size=16 |
    grep -q '^# derived: the grid.s axes tp = 1, cp = 1, ep = 1, dp_shard = 2, dp_replicate = 2, pp = 1 (4 ranks)$' ||
    fail "--print-config does not give the derived dp_replicate"
# The emulated CUDA build, NCCL groups of every kind, against the CPU build.
need_emu trident
EMU_TRIDENT="$PWD/$BUILD-emu/trident"
need_built "$EMU_TRIDENT"
tiny=(data.path="$tmp/shards" model.d_model=32 model.n_heads=2 model.n_kv_heads=2 model.ffn_dim=64
      model.max_seq_len=16 model.n_layers=2 train.seq_len=16 train.micro_batch_size=1
      train.global_batch_size=4 train.steps=3 train.warmup_steps=1 train.eval_every=0
      system.threads=1 system.peak_tflops=1 parallel.dp=4 parallel.dp_shard=2)
for b in cpu cuda; do
    bin=$TRIDENT; [ $b = cuda ] && bin=$EMU_TRIDENT
    rc=0
    OMP_NUM_THREADS=1 timeout 120 "${MPIRUN[@]}" -np 4 "$bin" train "$SMALL_INI" "${tiny[@]}" \
        system.device=$b log.run_dir="$tmp/tiny-$b" > "$tmp/log-tiny-$b" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-tiny-$b"; fail "tiny $b run with dp_shard 2 exited $rc"; }
done
grep -q "communication: NCCL" "$tmp/log-tiny-cuda" || fail "the emulated run did not use NCCL"
"$PY" - "$tmp/tiny-cpu/metrics.jsonl" "$tmp/tiny-cuda/metrics.jsonl" <<'PY'
import json, sys
def steps(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(a) == sorted(b) == [1, 2, 3], (sorted(a), sorted(b))
for s in a:
    for k in ("loss", "grad_norm"):
        rel = abs(a[s][k] - b[s][k]) / abs(a[s][k])
        assert rel <= 1e-5, f"step {s} {k}: cpu {a[s][k]} cuda {b[s][k]} ({rel:.2e})"
print("emulated CUDA, dp_shard 2 of dp 4: within 1e-5 of the CPU build over 3 steps")
PY
echo "train_dp_shard: dp_shard 2 of dp 4 trains as dp_shard = dp; records and manifest carry the axes"
