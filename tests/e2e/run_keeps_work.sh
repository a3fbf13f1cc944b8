#!/usr/bin/env bash
# run_keeps_work.sh: a run never throws its work away (issue 27):
#  1. The README's by-hand SFT line (configs/sft-tiny.ini, which has no
#     [checkpoint] dir; here on the small dataset's tokenizer and 2 steps)
#     saves into <run_dir>/checkpoints, which `trident generate` and `trident
#     ckpt export` read without further options.
#  2. [checkpoint] dir = none saves nothing.
#  3. SIGINT during `trident prep` (shards already written) exits 130 and
#     leaves nothing behind: the output folder and the parents it made are gone.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
fail=0
data/make_sft_example.sh "$tmp/pairs.jsonl" 400 >/dev/null || fail "make_sft_example.sh"
"$TRIDENT" prep --input "$tmp/pairs.jsonl" --output "$tmp/chat" --format chat \
    --tokenizer "$tmp/shards/tokenizer.json" --val-fraction 0.1 >/dev/null 2>&1 || fail "prep --format chat"

# 1. the by-hand SFT line, without [checkpoint] dir
sft() { # sft RUN_DIR [overrides...]
    local r=$1; shift
    timeout 300 "${MPIRUN[@]}" -np 2 "$TRIDENT" train configs/sft-tiny.ini data.path="$tmp/chat" \
        data.tokenizer="$tmp/shards/tokenizer.json" model.vocab_size=510 train.steps=2 train.warmup_steps=1 \
        train.eval_every=0 log.run_dir="$r" "$@" >"$r.out" 2>&1
}
sft "$tmp/sft" || { tail -5 "$tmp/sft.out"; fail "the SFT run failed"; }
[ "$(cat "$tmp/sft/checkpoints/latest" 2>/dev/null)" = step-000002 ] || { echo "FAIL: no checkpoint of step 2 in the run folder"; fail=1; }
"$TRIDENT" generate "$tmp/sft/checkpoints" --chat --prompt "Where is it written: In the beginning" \
    --max-new-tokens 4 --json >"$tmp/gen.out" 2>&1 && [ "$(jq -r '.ids | length' "$tmp/gen.out" 2>/dev/null)" -ge 1 ] \
    || { cat "$tmp/gen.out"; echo "FAIL: generate does not read the run folder's checkpoint"; fail=1; }
"$TRIDENT" ckpt export "$tmp/sft/checkpoints" "$tmp/sft.h5" >"$tmp/export.out" 2>&1 && [ -s "$tmp/sft.h5" ] \
    || { cat "$tmp/export.out"; echo "FAIL: ckpt export does not read the run folder's checkpoint"; fail=1; }

# 2. dir = none: nothing saved
sft "$tmp/none" checkpoint.dir=none || { tail -5 "$tmp/none.out"; fail "the run with dir = none failed"; }
[ ! -e "$tmp/none/checkpoints" ] || { echo "FAIL: dir = none saved into the run folder"; fail=1; }

# 3. SIGINT during prep, its shards being written
for _ in 1 2 3 4 5 6 7 8; do cat "$tmp/kjv.txt"; done >"$tmp/big.txt"
"$TRIDENT" prep --input "$tmp/big.txt" --output "$tmp/made/prep" --tokenizer "$tmp/shards/tokenizer.json" \
    --shard-tokens 100000 >"$tmp/prep.out" 2>&1 & p=$!
for _ in $(seq 100); do ls "$tmp/made/prep"/shard-00001.h5 >/dev/null 2>&1 && break; sleep 0.05; done
[ -e "$tmp/made/prep/tokenizer.json" ] || echo "note: prep had not written its tokenizer.json yet"
kill -INT $p
rc=0; wait $p || rc=$?
[ "$rc" -eq 130 ] || { cat "$tmp/prep.out"; echo "FAIL: SIGINT during prep: exit $rc, expected 130"; fail=1; }
[ ! -e "$tmp/made" ] || { ls -R "$tmp/made" | head; echo "FAIL: SIGINT during prep left $tmp/made behind"; fail=1; }

[ "$fail" -eq 0 ] || exit 1
echo "run_keeps_work: all passed"
