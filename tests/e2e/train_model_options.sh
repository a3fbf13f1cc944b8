#!/usr/bin/env bash
# train_model_options.sh: issue 28's model options (model.head_dim with
# n_heads x head_dim != d_model, qkv_bias, qk_norm, rope_scaling = llama3 with
# rope_original_max_pos 16 < seq_len 32, so every band of frequencies is
# used) train in every parallel layout to the single-rank numbers, and
# checkpoint, resume and refuse a mismatch. SMALL_INI's model, 6 steps of a
# global batch of 8, fp32; each layout's loss and gradient norm at every
# step (metrics.jsonl) within 1e-5 relative of one rank's:
#   - tp 2 with n_kv_heads 2 (each rank its key/value head and bias rows) and
#     with n_kv_heads 1 (the head, its biases and k_norm copied on both
#     ranks: gradients summed over TP), tp 2 with sequence parallelism and
#     recompute = selective, pp 2, cp 2 (ring attention), dp 2 with ZeRO-3
#     (the biases and norm gains in the block units), recompute = full;
#   - a run stopped at step 3 (train.exit_interval) and resumed logs the
#     uninterrupted run's steps 4 to 6, resumed at tp 2 too (the biases'
#     rows resharded); its manifest holds the options;
#   - resuming with qk_norm = false is refused (exit 2) naming qk_norm;
#   - bf16 trains (losses within 2e-3 of fp32's), and in tp 2 with sequence
#     parallelism within 1e-3 of one bf16 rank's (measured 7e-5, 9e-5).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
opts=(data.path="$tmp/shards" model.head_dim=24 model.qkv_bias=true model.qk_norm=true
      model.rope_scaling=llama3 model.rope_scaling_factor=4 model.rope_low_freq_factor=1
      model.rope_high_freq_factor=4 model.rope_original_max_pos=16 train.steps=6
      train.warmup_steps=2 train.eval_every=0 checkpoint.every=0)
run_opts=("${opts[@]}")
run() { # name ranks overrides... (with run_opts)
    local name=$1 np=$2; shift 2
    local rc=0
    timeout 120 "${MPIRUN[@]}" -np "$np" "$TRIDENT" train "$SMALL_INI" "${run_opts[@]}" \
        checkpoint.dir="$tmp/ck-$name" log.run_dir="$tmp/run-$name" "$@" > "$tmp/log-$name" 2>&1 || rc=$?
    return $rc
}
# name ranks overrides
cases=("ref 1" "ref_kv1 1 model.n_kv_heads=1"
       "tp2 2 parallel.tp=2" "tp2_kv1 2 parallel.tp=2 model.n_kv_heads=1"
       "tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true model.recompute=selective"
       "pp2 2 parallel.pp=2" "cp2 2 parallel.cp=2" "zero3 2 parallel.dp=2 parallel.zero_stage=3"
       "full 1 model.recompute=full" "bf16 1 precision.dtype=bf16"
       "bf16_tp2 2 precision.dtype=bf16 parallel.tp=2 parallel.sequence_parallel=true")
for c in "${cases[@]}"; do
    read -r name np args <<<"$c"
    # shellcheck disable=SC2086
    run "$name" "$np" $args || { tail -20 "$tmp/log-$name"; fail "$name exited non-zero"; }
done
# Stopped at step 3, then resumed to step 6.
run stop 1 train.exit_interval=3 || true
grep -q '^head_dim = 24$' "$tmp/ck-stop/step-000003/manifest.ini" 2>/dev/null ||
    { ls -R "$tmp/ck-stop" | head; fail "no checkpoint of step 3 with head_dim = 24 in its manifest"; }
for k in 'qkv_bias = 1' 'qk_norm = 1' 'rope_scaling = llama3' 'rope_original_max_pos = 16'; do
    grep -q "^$k\$" "$tmp/ck-stop/step-000003/manifest.ini" || fail "manifest lacks '$k'"
done
cp -r "$tmp/ck-stop" "$tmp/ck-bad"
cp -r "$tmp/ck-stop" "$tmp/ck-stop_tp2"
run_opts=("${opts[@]/model.qk_norm=true/model.qk_norm=false}")
rc=0; run bad 1 || rc=$?
run_opts=("${opts[@]}")
[ "$rc" -eq 2 ] && grep -q "qk_norm = 1, but the run has 0" "$tmp/log-bad" ||
    { grep -v "^ *$" "$tmp/log-bad" | head -5; fail "resuming with qk_norm = false: exit $rc, expected 2 naming qk_norm"; }
run stop 1 || { tail -20 "$tmp/log-stop"; fail "resume exited non-zero"; }
run stop_tp2 2 parallel.tp=2 || { tail -20 "$tmp/log-stop_tp2"; fail "resume at tp 2 exited non-zero"; }
"$PY" - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def steps(name):
    out = {}
    for line in open(f"{tmp}/run-{name}/metrics.jsonl"):
        rec = json.loads(line)
        if "loss" in rec and "grad_norm" in rec:
            out[rec["step"]] = rec  # a resumed run's later record of a step wins
    return out
ok = True
def compare(name, ref, want):
    global ok
    base, other = steps(ref), steps(name)
    assert set(want) <= set(base), f"{ref} logged {sorted(base)}"
    if not set(want) <= set(other):
        ok = False
        print(f"FAIL: {name} logged steps {sorted(other)}, expected {want}")
        return
    worst = 0
    for s in want:
        for key in ("loss", "grad_norm"):
            a, b = base[s][key], other[s][key]
            rel = abs(a - b) / abs(a)
            worst = max(worst, rel)
            if rel > 1e-5:
                ok = False
                print(f"FAIL: {name} step {s} {key}: {b} vs {a} in {ref} (rel {rel:.2e})")
    print(f"{name}: steps {want[0]}..{want[-1]} match {ref} (worst rel {worst:.1e})")
six = list(range(1, 7))
for name in ("tp2", "tp2_sp", "pp2", "cp2", "zero3", "full"):
    compare(name, "ref", six)
compare("tp2_kv1", "ref_kv1", six)
compare("stop", "ref", [4, 5, 6])
compare("stop_tp2", "ref", [4, 5, 6])
# bf16: every loss within 2e-3 of fp32's (16-bit activations), and tp 2 + sp
# in bf16 within 1e-3 of one bf16 rank (FP32 TP sums, other rounding orders)
for name, ref, tol in (("bf16", "ref", 2e-3), ("bf16_tp2", "bf16", 1e-3)):
    a, b = steps(ref), steps(name)
    worst = max(abs(a[s]["loss"] - b[s]["loss"]) / a[s]["loss"] for s in six)
    print(f"{name}: losses within {worst:.1e} of {ref}'s")
    if worst > tol:
        ok = False
        print(f"FAIL: {name}'s losses differ from {ref}'s by {worst:.2e} > {tol}")
base = steps("ref")
if not base[6]["loss"] < base[1]["loss"]:
    ok = False
    print(f"FAIL: the loss did not fall: {base[1]['loss']} -> {base[6]['loss']}")
sys.exit(0 if ok else 1)
PY
