#!/usr/bin/env bash
# kv_decode_mpi.sh: generation with a key/value cache across ranks.
#  (a) tests/mpi/test_kv_decode_mpi.c on 2 ranks: tensor parallel 2 with
#      sequence parallelism, then pipeline parallel 2 with 2 virtual stages:
#      the cached logits at every position equal the same layout's
#      full-window forward within 1e-5 (relative) in FP32 and 1e-2 in BF16
#      (and pp 2 in ZB-V's placement, issue 30: stage 0 holds both ends),
#      and the same layout's full recompute of generation (one step over the
#      whole window) within 1e-5 in both (measured 0), on every rank;
#  (b) the training log's samples under (tp 2, pp 2, 2 virtual stages, sp)
#      and under (pp 2, zbv)
#      (before issue 28: none under pipeline parallelism), and of the
#      mixture-of-experts model of tests/e2e/configs/moe.ini under (ep 2, dp 2)
#      (each sample step's all-to-alls between the two ranks) and (pp 2)
#      (before: no samples for MoE models, no cache in generate), and under
#      cp 2 (before: none; every cp rank decodes the whole sequence): a greedy sample of
#      24 tokens, read from metrics.jsonl's sample record, is what `trident
#      generate --no-kv-cache` (one process, the window recomputed per token)
#      and `trident generate` (the cache) continue from its first token on
#      the run's checkpoint.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
BIN="$PWD/$BUILD/mpi/test_kv_decode_mpi"
need_built "$BIN"
for mode in tp pp zbv; do
    timeout -k 2 60 "${MPIRUN[@]}" -np 2 "$BIN" "$mode" > "$tmp/$mode.log" 2>&1 ||
        { cat "$tmp/$mode.log"; fail "$mode: exit non-zero"; }
    cat "$tmp/$mode.log"
    n=$(grep -c "relative error" "$tmp/$mode.log" || true)
    [ "$n" -eq 4 ] || fail "$mode: $n result lines, expected 4 (2 ranks x fp32, bf16)"
done
echo "(a) cached logits = full window at tp 2 + sp, pp 2 (2 virtual stages) and pp 2 zbv, fp32 and bf16"

need_built "$TRIDENT"
need_py tokenizers
small_dataset "$tmp"
# The (tp 2, pp 2, 2 virtual stages, sp) run, and (tp 1, pp 2) under ZB-V
# (issue 30: the head on stage 0, stage 1's chunks back to back).
dense_ini=$SMALL_INI
# layout: ini tp pp dp cp steps suffix extra keys (the MoE and cp runs short: any weights do)
for layout in "$dense_ini 2 2 1 1 40 - parallel.sequence_parallel=true parallel.virtual_stages=2" \
    "$dense_ini 1 2 1 1 40 -zbv parallel.pp_schedule=zbv parallel.virtual_stages=2" \
    "$dense_ini 1 1 1 2 8 -cp" \
    "tests/e2e/configs/moe.ini 1 1 2 1 8 -moe-ep parallel.ep=2" "tests/e2e/configs/moe.ini 1 2 1 1 8 -moe-pp"; do
    read -r SMALL_INI tp pp dp cp steps sfx extra <<<"$layout"
    [ "$sfx" = - ] && sfx=""
    SMALL_CP=""; [ "$cp" -gt 1 ] && SMALL_CP=$cp
    # shellcheck disable=SC2086
    SMALL_CP=$SMALL_CP small_train "$tmp/run$sfx" "$tmp/ck$sfx" $tp $pp $dp 0 model.n_layers=4 $extra \
        model.tie_embeddings=false train.steps=$steps train.sample_every=$steps train.sample_temperature=0 \
        train.sample_tokens=24 > "$tmp/train.log" 2>&1 || { tail -20 "$tmp/train.log"; fail "(b) $sfx training exited non-zero"; }
    [ "$(jq -s '[.[] | select(.event == "sample")] | length' "$tmp/run$sfx/metrics.jsonl")" -eq 1 ] ||
        fail "(b) $(jq -s '[.[] | select(.event == "sample")] | length' "$tmp/run$sfx/metrics.jsonl") sample records, expected 1"
    sample=$(jq -j 'select(.event == "sample") | .text' "$tmp/run$sfx/metrics.jsonl")
    [ -n "$sample" ] || fail "(b) an empty sample"
    first=$("$PY" - "$tmp/shards/tokenizer.json" "$sample" <<'PY'
import sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
ids = tok.encode(sys.argv[2]).ids
t = tok.decode(ids[:1])
assert tok.encode(t).ids == ids[:1], f"{t!r} does not encode back to {ids[:1]}"
print(t, end="")
PY
    ) || fail "(b) the sample's first token"
    for cache in --no-kv-cache ""; do
        "$TRIDENT" generate "$tmp/ck$sfx" --tokenizer "$tmp/shards" --prompt "$first" --max-new-tokens 23 --json \
            $cache > "$tmp/g.jsonl" 2> "$tmp/g.err" || { cat "$tmp/g.err"; fail "(b) generate $cache exited non-zero"; }
        got=$(jq -j '.prompt + .text + (if .ended then " <|endoftext|>" else "" end)' "$tmp/g.jsonl")
        [ "$got" = "$sample" ] || fail "(b) generate $cache: '$got', the (tp $tp, pp $pp, dp $dp${sfx:+, ${sfx#-}}) training sample: '$sample'"
        grep -q "tokens/s" "$tmp/g.err" || fail "(b) generate $cache printed no tokens/s"
    done
    echo "(b) the (tp $tp, pp $pp, dp $dp${sfx:+, ${sfx#-}}) training sample = generate's continuation, with and without the cache"
done
echo PASS
