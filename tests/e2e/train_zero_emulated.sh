#!/usr/bin/env bash
# train_zero_emulated.sh: parallel.zero_stage = 3 (src/train/fsdp.h) on the
# CUDA backend over NCCL, run on the CPU by the emulated build (make EMU=1:
# the real CUDA backend and comm_nccl.c's reduce_scatter_start and
# all_gather_start on the groups' communication streams, ordered by events,
# against tests/cuda_emu). (tp, pp, dp) = (1,1,4) and (2,1,2) with sequence
# parallelism, untied, 6 steps of a width-32 model with 2 microbatches per
# rank: every step's loss and grad norm within 1e-5 relative of the CPU
# backend's zero-3 run of the same layout, the banner says NCCL, and the step
# record shows the prefetches and the overlapped reduce-scatters. (2,1,2)
# runs under TRIDENT_EMU_DELAY (random sleeps before each queued operation of
# each stream): a gather or reduce-scatter not ordered after its producer, or
# a use not ordered after it, would read or give other numbers. ~30 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py numpy
need_emu trident
small_dataset "$tmp"
fail=0
common=(data.path="$tmp/shards" model.d_model=32 model.n_heads=2 model.n_kv_heads=2 model.ffn_dim=64
        model.max_seq_len=16 train.seq_len=16 train.micro_batch_size=1 train.steps=6 train.warmup_steps=2
        train.eval_every=0 system.threads=1 system.peak_tflops=1 model.tie_embeddings=false
        train.global_batch_size=8 parallel.zero_stage=3)
for l in "1 4" "2 2 parallel.sequence_parallel=true"; do
    read -r tp dp extra <<<"$l"
    for dev in cpu cuda; do
        bin="$TRIDENT" env=()
        [ "$dev" = cuda ] && bin="$PWD/$EMU_BUILD/trident"
        [ "$dev" = cuda ] && [ "$tp" = 2 ] && env=(TRIDENT_EMU_DELAY=200:7)
        name="$tp-$dp-$dev" rc=0 start=$(date +%s)
        env OMP_NUM_THREADS=1 "${env[@]}" timeout 200 "${MPIRUN[@]}" -np 4 "$bin" train "$SMALL_INI" "${common[@]}" \
            parallel.tp=$tp parallel.dp=$dp $extra system.device=$dev log.run_dir="$tmp/run-$name" \
            < /dev/null > "$tmp/$name.log" 2>&1 || rc=$?
        echo "== $name: exit $rc in $(( $(date +%s) - start )) s"
        [ "$rc" -eq 0 ] || { tail -5 "$tmp/$name.log"; echo "FAIL: $name exited $rc"; fail=1; continue; }
        [ "$dev" = cpu ] || grep -q "communication: NCCL" "$tmp/$name.log" || { echo "FAIL: $name: no NCCL"; fail=1; }
    done
    "$PY" - "$tmp" "$tp-$dp" <<'PY' || fail=1
import json, sys
tmp, l = sys.argv[1], sys.argv[2]
def steps(n): return {r["step"]: r for r in map(json.loads, open(f"{tmp}/run-{n}/metrics.jsonl")) if "loss" in r}
a, b = steps(f"{l}-cpu"), steps(f"{l}-cuda")
assert sorted(a) == sorted(b) == list(range(1, 7))
w = max(abs(a[s][k] - b[s][k]) / abs(a[s][k]) for s in a for k in ("loss", "grad_norm"))
z = b[6]
ok = w <= 1e-5 and z["zero_prefetched"] > 0 and z["zero_rs_early"] == z["zero_rs"] > 0 and z["zero_live_max"] <= 2
print(("" if ok else "FAIL: ") + f"(tp, dp) = ({l.replace('-', ', ')}): emulated CUDA zero 3 vs CPU: worst rel {w:.1e}; "
      + str({k: v for k, v in z.items() if k.startswith("zero_")}))
sys.exit(0 if ok else 1)
PY
done
exit $fail
