#!/usr/bin/env bash
# train_attention_path.sh: which attention path a run took is on record
# (issue 24; docs/design.md §9, docs/cuda.md "Attention kernels"):
#  1. emulated CUDA build, bf16, attention = auto, tp 2 (two ranks, so the
#     "rank 0 only" rule is tested), 3 steps with an evaluation: the
#     emulated cuDNN has no engine, so every step record of metrics.jsonl
#     says "attention": "native"; the printed log holds one line
#     "attention: forward|backward B= T= H= Hkv= D= bf16 -> native (REASON)"
#     per distinct shape, each once (rank 0 only: rank 1's would repeat them);
#  2. the same with attention = native: "native", the reason the key;
#  3. the CPU build: every step record says "attention": "cpu", and no
#     attention line is printed.
# Needs $BUILD-emu (make EMU=1; a no-op when current). ~20 s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
EMU_BUILD="$BUILD-emu"
need_built "$TRIDENT"
need_emu trident
small_dataset "$tmp"

# run NAME BINARY NP [overrides...]: 3 steps of the small config into $tmp/NAME.
run() {
    local name=$1 bin=$2 np=$3 rc=0; shift 3
    timeout 120 "${MPIRUN[@]}" -np "$np" "$bin" train "$SMALL_INI" data.path="$tmp/shards" \
        log.run_dir="$tmp/$name" train.steps=3 train.warmup_steps=1 train.eval_every=2 train.eval_steps=1 \
        parallel.tp="$np" "$@" >"$tmp/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -n 30 "$tmp/$name.log"; fail "$name: exit $rc"; }
}
# paths NAME: the step records' attention values, counted ("3 native").
paths() { metrics "$tmp/$1" '.attention // "missing"' | tr -d '"' | sort | uniq -c | awk '{print $1, $2}' | paste -sd, -; }

run emu_auto "$PWD/$EMU_BUILD/trident" 2 system.device=cuda precision.dtype=bf16 system.attention=auto
got=$(paths emu_auto)
[ "$got" = "3 native" ] || fail "emulated auto: step records' attention '$got', expected '3 native'"
grep "^attention: " "$tmp/emu_auto.log" >"$tmp/lines" || fail "emulated auto: no 'attention: ' line printed"
sed 's/^/    /' "$tmp/lines"
dups=$(sort "$tmp/lines" | uniq -d)
[ -z "$dups" ] || fail "a shape's line printed more than once (every rank, not rank 0 only?): $dups"
for dir in forward backward; do
    grep -qE "^attention: $dir B=[0-9]+ T=32 H=2 Hkv=1 D=16 bf16 -> native \(cuDNN 9\.[0-9]+ cannot run it: " \
        "$tmp/lines" || fail "emulated auto: no $dir line for the tp-2 shard's shape (H=2 Hkv=1 D=16) with cuDNN's reason"
done

run emu_native "$PWD/$EMU_BUILD/trident" 1 system.device=cuda precision.dtype=bf16 system.attention=native
got=$(paths emu_native)
[ "$got" = "3 native" ] || fail "emulated native: step records' attention '$got', expected '3 native'"
grep -q "^attention: forward .* -> native (system.attention = native)" "$tmp/emu_native.log" ||
    fail "emulated native: the line does not name system.attention = native"

run cpu "$TRIDENT" 1 precision.dtype=bf16
got=$(paths cpu)
[ "$got" = "3 cpu" ] || fail "cpu: step records' attention '$got', expected '3 cpu'"
! grep -q "^attention: " "$tmp/cpu.log" || fail "cpu: printed an attention line"
echo "train_attention_path: ok"
