#!/usr/bin/env bash
# train_emulated.sh: `trident train ... system.device=cuda` on one rank through
# the emulated CUDA build (`make EMU=1` into $BUILD-emu, made by
# cuda_emulated.sh; a no-op here when up to date): the real CUDA backend,
# cuBLASLt calls (emulated on the host) and trainer, on CPUs. Against the CPU
# backend's run of the CPU build ($BUILD/trident) on the same data and config:
#  1. fp32, 5 steps of the small config, 2 microbatches per step: every
#     step's loss and grad norm within 1e-5 relative (the two backends sum
#     in other orders: measured 3e-7), and kernels really ran
#     (TRIDENT_EMU_STATS counts the emulated launches) on streams that ran
#     behind the host (more than one operation queued on a stream at once).
#  2. the same for 2 steps with TRIDENT_EMU_CUBLASLT=0: matmul through the
#     backend's fallback GEMM kernel instead of cuBLASLt.
#  3. bf16 (precision.dtype), 3 steps: loss and grad norm within 3e-3
#     relative of the CPU backend's bf16 run. Both round activations to bf16,
#     after sums in other orders (oneDNN's GEMM against the emulated
#     cuBLASLt's FP32 loop), so an element can round to a neighbouring bf16
#     value (2^-8 = 4e-3 apart); the loss and the norm average ~10^5 of them
#     (measured 8e-4 at 5 steps). A missing or wrong bf16 rounding moves
#     them by far more.
#  4. [data] packing = concat_reset (document-masked attention and RoPE
#     positions, the native attention kernels' document path), fp32, 3 steps
#     on a dataset of one KJV verse per document (most 32-token sequences
#     hold a boundary): loss and grad norm within 1e-5 relative of the CPU
#     backend's concat_reset run, whose losses differ from its concat run's
#     (by more than 1e-4 relative at some step: the mode is on).
#  5. run 1 again under TRIDENT_EMU_DELAY=300:11 (random sleeps before each
#     queued operation of each stream): loss and grad norm bitwise equal to
#     run 1's.
#  6. issue 28's model options (head_dim 24: n_heads x head_dim != d_model,
#     qkv_bias, qk_norm, rope_scaling = llama3 with rope_original_max_pos 16
#     < seq_len), fp32, 2 steps: loss and grad norm within 1e-5 relative of
#     the CPU backend's run (the bias GEMMs of depth 1, the per-head norms and
#     the scaled RoPE tables on the CUDA backend).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py numpy
need_emu trident
small_dataset "$tmp"
fail=0
# train NAME BINARY DEVICE [overrides...]: a single-rank run of STEPS steps
# (default 5) on DATA (default the small dataset) into $tmp/run-NAME.
train() {
    local name=$1 bin=$2 dev=$3 rc=0; shift 3
    rm -rf "$tmp/run-$name" "$tmp/ck-$name"
    local start=$(date +%s)
    TRIDENT_EMU_STATS=1 timeout 300 "$bin" train "$SMALL_INI" data.path="${DATA:-$tmp/shards}" system.device="$dev" \
        train.steps="${STEPS:-5}" train.warmup_steps=2 train.global_batch_size=4 train.eval_every=0 \
        checkpoint.every=0 checkpoint.keep_last=0 checkpoint.dir="$tmp/ck-$name" \
        log.run_dir="$tmp/run-$name" "$@" > "$tmp/$name.log" 2>&1 || rc=$?
    echo "== $name ($dev): exit $rc in $(( $(date +%s) - start ))s"
    [ "$rc" -eq 0 ] || { echo "FAIL: $name exited $rc"; tail -5 "$tmp/$name.log"; fail=1; }
    return 0
}
# close A B REL: run B's loss and grad_norm at every step of A within REL relative.
close() {
    "$PY" - "$tmp" "$@" <<'PY' || fail=1
import json, sys
tmp, a, b, rel = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def steps(name):
    with open(f"{tmp}/run-{name}/metrics.jsonl") as f:
        return {r["step"]: r for r in map(json.loads, f) if "loss" in r}
ra, rb = steps(a), steps(b)
bad, worst = 0, 0.0
if not ra or sorted(ra) != sorted(rb):
    print(f"FAIL: {a} has steps {sorted(ra)}, {b} has {sorted(rb)}"); sys.exit(1)
for s in sorted(ra):
    for key in ("loss", "grad_norm"):
        x, y = ra[s][key], rb[s][key]
        d = abs(x - y) / abs(y)
        worst = max(worst, d)
        if d > rel:
            bad += 1
            print(f"FAIL: step {s} {key}: {a} {x} vs {b} {y} (rel {d:.2e} > {rel:.0e})")
print(f"{a} vs {b}: {len(ra)} steps, worst relative difference {worst:.2e} (bound {rel:.0e})")
sys.exit(1 if bad else 0)
PY
}
# launched NAME: the emulated run reports kernel launches (the CUDA backend ran).
launched() {
    local n
    n=$(sed -n 's/^cuda_emu: \([0-9]*\) launches.*/\1/p' "$tmp/$1.log" | tail -1)
    [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "FAIL: $1 reports no emulated kernel launch"; fail=1; return 0; }
    # The host runs ahead of the device: some stream had several operations queued.
    q=$(sed -n 's/^cuda_emu: .* at most \([0-9]*\) operations queued.*/\1/p' "$tmp/$1.log" | tail -1)
    [ -n "$q" ] && [ "$q" -gt 1 ] || { echo "FAIL: $1: at most ${q:-?} operations queued on a stream: the streams did not run behind the host"; fail=1; return 0; }
    echo "$1: $n emulated kernel launches, up to $q operations queued on a stream"
}

train cpu "$TRIDENT" cpu
train emu "$EMU_BUILD/trident" cuda
launched emu
close emu cpu 1e-5
# The same run with every stream worker sleeping a random 0..300 us before
# each operation: the streams reach their work at other times, the numbers
# must not move at all (the emulation is deterministic; only ordering bugs
# could change them).
TRIDENT_EMU_DELAY=300:11 train emu-delay "$EMU_BUILD/trident" cuda
close emu-delay emu 0

STEPS=2 train cpu2 "$TRIDENT" cpu
STEPS=2 TRIDENT_EMU_CUBLASLT=0 train emu-fallback "$EMU_BUILD/trident" cuda
launched emu-fallback
close emu-fallback cpu2 1e-5

STEPS=3 train cpu-bf16 "$TRIDENT" cpu precision.dtype=bf16
STEPS=3 train emu-bf16 "$EMU_BUILD/trident" cuda precision.dtype=bf16
launched emu-bf16
close emu-bf16 cpu-bf16 3e-3

opts=(model.head_dim=24 model.qkv_bias=true model.qk_norm=true model.rope_scaling=llama3
      model.rope_scaling_factor=4 model.rope_original_max_pos=16)
STEPS=2 train cpu-opts "$TRIDENT" cpu "${opts[@]}"
STEPS=2 train emu-opts "$EMU_BUILD/trident" cuda "${opts[@]}"
launched emu-opts
close emu-opts cpu-opts 1e-5

awk 'NF && n < 3000 {print; print ""; n++}' "$tmp/kjv.txt" > "$tmp/verses.txt"
"$TRIDENT" prep --input "$tmp/verses.txt" --output "$tmp/verse-shards" --vocab-size 510 \
    --val-fraction 0.05 >/dev/null 2>&1 || fail "prep of the verse dataset"
export DATA="$tmp/verse-shards"
STEPS=3 train cpu-concat "$TRIDENT" cpu data.packing=concat
STEPS=3 train cpu-reset "$TRIDENT" cpu data.packing=concat_reset
STEPS=3 train emu-reset "$EMU_BUILD/trident" cuda data.packing=concat_reset
unset DATA
launched emu-reset
close emu-reset cpu-reset 1e-5
# concat and concat_reset: the same steps, some loss more than 1e-4 apart
"$PY" - "$tmp" <<'PY' || fail=1
import json, sys
def losses(name):
    with open(f"{sys.argv[1]}/run-{name}/metrics.jsonl") as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}
a, b = losses("cpu-concat"), losses("cpu-reset")
assert a and sorted(a) == sorted(b), f"steps {sorted(a)} vs {sorted(b)}"
d = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"cpu concat vs concat_reset: largest loss difference {d:.2e} relative")
if d <= 1e-4:
    print("FAIL: concat_reset logs the losses of concat: the mode is off"); sys.exit(1)
PY
[ "$fail" -eq 0 ] && echo "train_emulated: ok"
exit "$fail"
