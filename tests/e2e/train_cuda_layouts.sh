#!/usr/bin/env bash
# train_cuda_layouts.sh: multi-GPU training (system.device = cuda over NCCL
# groups, docs/design.md §2) in every kind of layout, run on the CPU by the
# emulated build (make EMU=1: the real CUDA backend, the real comm_nccl.c and
# the real trainer against tests/cuda_emu, NCCL emulated over MPI). Layouts
# (tp, pp, dp) = (1,1,2), (2,1,1), (1,2,1), (2,2,2) with ZeRO-1, (2,1,2)
# with sequence parallelism and (1,3,1) with 2 virtual stages (pipeline
# messages over NCCL across the ring's wrap) train 10 steps of a tiny model
# (2 layers, 6 for (1,3,1), of width 32, tied embeddings, 16 tokens,
# microbatches of 1 sequence, global batches of 2, 4 for (2,2,2) and 3 for
# (1,3,1)); each step's loss and gradient norm
# (metrics.jsonl) must equal the CPU backend's single-rank run
# (build/trident, system.device = cpu, same config) within 1e-5 relative.
# The CUDA runs compute in FP32 with other kernels and summation orders than
# the CPU backend: an independent reference, not the same code twice.
# Needs $BUILD/trident; makes $BUILD-emu/trident (make EMU=1, a no-op after
# cuda_emulated.sh built it). system.peak_tflops is set: the MFU probe's
# 1024^3 matmul is slow under emulation.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
EMU_BUILD="$BUILD-emu"
EMU_TRIDENT="$PWD/$EMU_BUILD/trident"
need_built "$TRIDENT"
need_emu trident
need_built "$EMU_TRIDENT"
small_dataset "$tmp"
common=(data.path="$tmp/shards" model.d_model=32 model.n_heads=2
        model.n_kv_heads=2 model.ffn_dim=64 model.max_seq_len=16 train.seq_len=16
        train.micro_batch_size=1 train.steps=10 train.warmup_steps=2
        train.eval_every=0 system.threads=1 system.peak_tflops=1)
# The CPU references, (global batch, layers) = (2, 2), (4, 2), (3, 6): the
# fewest microbatches each layout can take (a pipeline needs one per stage
# per DP rank).
for GL in 2-2 4-2 3-6; do
    "$TRIDENT" train "$SMALL_INI" "${common[@]}" train.global_batch_size=${GL%-*} \
        model.n_layers=${GL#*-} system.device=cpu log.run_dir="$tmp/run-cpu-$GL" \
        > "$tmp/log-cpu-$GL" 2>&1 || { tail -20 "$tmp/log-cpu-$GL"; fail "CPU reference run $GL"; }
done
# tp,pp,dp,zero,sp,virtual_stages,global_batch_size,n_layers
layouts="1,1,2,0,0,1,2,2 2,1,1,0,0,1,2,2 1,2,1,0,0,1,2,2 2,2,2,1,0,1,4,2 2,1,2,0,1,1,2,2
 1,3,1,0,0,2,3,6"
for l in $layouts; do
    IFS=, read -r tp pp dp zero sp v G L <<<"$l"
    name="$tp-$pp-$dp-$zero-$sp-$v-$G-$L"
    start=$(date +%s.%N)
    rc=0
    OMP_NUM_THREADS=1 timeout 120 "${MPIRUN[@]}" -np $((tp * pp * dp)) "$EMU_TRIDENT" train \
        "$SMALL_INI" "${common[@]}" train.global_batch_size=$G model.n_layers=$L \
        parallel.virtual_stages=$v system.device=cuda \
        parallel.tp=$tp parallel.pp=$pp \
        parallel.dp=$dp parallel.zero_stage=$zero parallel.sequence_parallel=$sp \
        log.run_dir="$tmp/run-$name" > "$tmp/log-$name" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$name"; fail "(tp, pp, dp, zero, sp, v, G, L) = ($l): exit $rc"; }
    grep -q "device cuda" "$tmp/log-$name" || fail "($l): the banner does not say device cuda"
    # Which path ran (the banner's words; the numbers come from metrics.jsonl).
    want="communication: NCCL"
    [ "$pp" -gt 1 ] && want="pipeline messages over NCCL"
    grep -q "$want" "$tmp/log-$name" || fail "($l): the banner does not say '$want'"
    printf '(tp, pp, dp, zero, sp, v, G, L) = (%s): %.1f s\n' "$l" "$(echo "$(date +%s.%N) - $start" | bc)"
done
"$PY" - "$tmp" "$layouts" <<'PY'
import json, sys
tmp, layouts = sys.argv[1], sys.argv[2].split()
def steps(run):
    out = {}
    for line in open(f"{tmp}/{run}/metrics.jsonl"):
        rec = json.loads(line)
        if "loss" in rec:
            assert rec["step"] not in out, f"{run}: step {rec['step']} twice"
            out[rec["step"]] = rec
    assert sorted(out) == list(range(1, 11)), f"{run}: steps {sorted(out)}, expected 1..10"
    return out
refs = {GL: steps(f"run-cpu-{GL}") for GL in ("2-2", "4-2", "3-6")}
ok = True
for l in layouts:
    run = "run-" + l.replace(",", "-")
    got, ref = steps(run), refs["-".join(l.split(",")[-2:])]
    worst = 0
    for s in range(1, 11):
        for key in ("loss", "grad_norm"):
            a, b = ref[s][key], got[s][key]
            assert a is not None and b is not None, f"{run} step {s}: {key} not finite"
            rel = abs(a - b) / abs(a)
            worst = max(worst, rel)
            if rel > 1e-5:
                ok = False
                print(f"FAIL: {l} step {s} {key}: {b} (cuda) vs {a} (cpu), rel {rel:.2e}")
    print(f"(tp, pp, dp, zero, sp, v, G, L) = ({l}), device cuda: 10 steps match the CPU run "
          f"(worst rel {worst:.1e}, loss {got[1]['loss']} -> {got[10]['loss']})")
for GL, ref in refs.items():
    if not ref[10]["loss"] < ref[1]["loss"]:
        ok = False
        print(f"FAIL: CPU run {GL}: the loss did not fall: {ref[1]['loss']} -> {ref[10]['loss']}")
sys.exit(0 if ok else 1)
PY
