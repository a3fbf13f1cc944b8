#!/usr/bin/env bash
# hf_export.sh: `trident ckpt export DIR OUT --format hf` writes a Hugging
# Face LlamaForCausalLM folder whose weights and config are right, checked
# with numpy alone by tests/e2e/lib/hf_check.py (no torch in make test):
#  (a) tied embeddings, GQA (4 heads, 2 key/value heads), trained in a
#      (tp, pp, dp) = (2, 2, 1) layout: the safetensors (parsed by an
#      independent reader: alignment, offsets tiling the data) hold every
#      tensor of the HDF5 export bit-exact in fp32, and equal its
#      round-to-nearest-even BF16 (sharded at 100 KB, with an index) and FP16;
#      config.json states the manifest's model; no lm_head.weight;
#  (b) untied, trained with tp = 2 and a temperature-0 sample of 32 tokens:
#      a float64 numpy forward built from the exported folder alone (config.json,
#      safetensors, tokenizer.json) decodes greedily the same 32 tokens;
#  (c) refused with exit 2 and nothing written: an existing output folder, an
#      unknown --dtype, a tokenizer other than the checkpoint's.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy tokenizers
small_dataset "$tmp"
check="$PY tests/e2e/lib/hf_check.py"

# (a)
small_train "$tmp/runA" "$tmp/ckA" 2 2 1 0 model.tie_embeddings=true > "$tmp/logA" 2>&1 ||
    { tail -20 "$tmp/logA"; fail "(a) training exited non-zero"; }
"$TRIDENT" ckpt export "$tmp/ckA" "$tmp/A.h5" > /dev/null || fail "(a) HDF5 export"
manA=$(ls -d "$tmp"/ckA/step-*/manifest.ini | tail -1)
"$TRIDENT" ckpt export "$tmp/ckA" "$tmp/hfA" --format hf --tokenizer "$tmp/shards" > /dev/null ||
    fail "(a) hf export"
$check tensors "$tmp/hfA" "$tmp/A.h5" "$manA" || fail "(a) fp32 export"
"$TRIDENT" ckpt export "$tmp/ckA" "$tmp/hfA16" --format hf --dtype bf16 --max-shard-size 100K \
    > /dev/null || fail "(a) bf16 sharded export"
[ -f "$tmp/hfA16/model.safetensors.index.json" ] || fail "(a) 100K shards: no index"
$check tensors "$tmp/hfA16" "$tmp/A.h5" "$manA" || fail "(a) bf16 sharded export"
"$TRIDENT" ckpt export "$tmp/ckA" "$tmp/hfAh" --format hf --dtype fp16 > /dev/null ||
    fail "(a) fp16 export"
$check tensors "$tmp/hfAh" "$tmp/A.h5" "$manA" || fail "(a) fp16 export"

# (b)
small_train "$tmp/runB" "$tmp/ckB" 2 1 1 0 model.tie_embeddings=false train.seq_len=64 \
    train.steps=40 train.sample_every=40 train.sample_temperature=0 train.sample_tokens=32 \
    > "$tmp/logB" 2>&1 || { tail -20 "$tmp/logB"; fail "(b) training exited non-zero"; }
"$TRIDENT" ckpt export "$tmp/ckB" "$tmp/B.h5" > /dev/null || fail "(b) HDF5 export"
"$TRIDENT" ckpt export "$tmp/ckB" "$tmp/hfB" --format hf --tokenizer "$tmp/shards" > /dev/null ||
    fail "(b) hf export"
$check tensors "$tmp/hfB" "$tmp/B.h5" "$(ls -d "$tmp"/ckB/step-*/manifest.ini | tail -1)" ||
    fail "(b) fp32 export"
$check greedy "$tmp/hfB" 32 "$tmp/logB" || fail "(b) greedy decoding of the export"

# (c)
before=$(ls -lR "$tmp/hfB" | md5sum)
rc=0; "$TRIDENT" ckpt export "$tmp/ckB" "$tmp/hfB" --format hf 2> "$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "hfB: exists" "$tmp/err" || fail "(c) existing folder: rc $rc, $(cat "$tmp/err")"
[ "$(ls -lR "$tmp/hfB" | md5sum)" = "$before" ] || fail "(c) the existing folder changed"
rc=0; "$TRIDENT" ckpt export "$tmp/ckB" "$tmp/hfC" --format hf --dtype fp8 2> "$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "fp8" "$tmp/err" || fail "(c) --dtype fp8: rc $rc"
"$TRIDENT" tokenize --train --vocab-size 300 --output "$tmp/other.json" < "$tmp/small.txt" \
    > /dev/null 2>&1 || fail "(c) training another tokenizer"
rc=0; "$TRIDENT" ckpt export "$tmp/ckB" "$tmp/hfC" --format hf --tokenizer "$tmp/other.json" \
    2> "$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "other.json: tokenizer" "$tmp/err" || fail "(c) wrong tokenizer: rc $rc, $(cat "$tmp/err")"
[ ! -e "$tmp/hfC" ] && [ ! -e "$tmp/hfC.tmp" ] || fail "(c) a refused export left a folder"
echo "ok: hf export: tied (2,2,1) fp32/bf16-sharded/fp16 equal the HDF5 export, untied greedy 32 tokens match, bad input refused"
