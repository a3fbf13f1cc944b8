#!/usr/bin/env bash
# hf_export.sh: `trident ckpt export DIR OUT --format hf` writes a Hugging
# Face LlamaForCausalLM folder whose weights and config are right, checked
# with numpy alone by tests/e2e/lib/hf_check.py (an independent forward;
# tests/e2e/hf_transformers.sh loads the exports with transformers itself):
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
#      unknown --dtype, a tokenizer other than the checkpoint's;
#  (d) [model] init_from: 3 steps started from the exported HF folder in a
#      (2, 2, 1) layout log the same losses (1e-5 relative) as 3 steps started
#      from the trident checkpoint itself on one rank, and a first loss far
#      below a fresh run's; a model config that differs from the folder's is
#      refused with exit 2 naming the key and both values, before any step;
#      The first loss of the (2, 2, 1) run equals a numpy forward of the folder
#      on the same sequences (1e-5). And a tied model too: trident's temperature-0 sample of the weights of
#      (a)'s export (init_from the folder, one step at lr 1e-30, which changes
#      no FP32 weight) equals numpy's greedy decoding of that folder, and its
#      first loss numpy's on the same sequences;
#  (e) `trident import` of the exported folder, exported again, gives
#      byte-identical files (safetensors, config, tokenizer), fp32 and bf16;
#      importing into a dir holding a checkpoint and a bad safetensors file
#      are refused with exit 2 naming the file (and tensor);
#  (f) refused with exit 2 naming them, nothing written or trained: a NaN (FP32)
#      or an infinity (BF16 shard) in a tensor for import, generate and
#      init_from (file, tensor, first element); a missing tensor; an index
#      naming the wrong shard; no config.json; a missing init_from folder; a
#      config.json hidden_size other than the run's d_model (and one that also
#      differs in num_hidden_layers: one message names both keys and their
#      count); an HF folder's
#      tokenizer.json other than the run's data's (init_from) or --tokenizer's
#      (generate); without tokenizer.json init_from and generate run with a
#      note; import
#      keeps tokenizer.json, so export (same bytes as the original folder's) and
#      generate need no --tokenizer; an export with no tokenizer at all says so.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy tokenizers
small_dataset "$tmp"
check="$PY tests/e2e/lib/hf_check.py"

# (a)
small_train "$tmp/runA" "$tmp/ckA" 2 2 1 0 model.tie_embeddings=true train.steps=40 > "$tmp/logA" 2>&1 ||
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
# (d)
steps=(train.steps=3 train.warmup_steps=1 model.tie_embeddings=false train.seq_len=64)
TRIDENT_LOG_SAMPLES="$tmp/samplesX" small_train "$tmp/runX" "$tmp/ckX" 2 2 1 0 "${steps[@]}" model.init_from="$tmp/hfB" > "$tmp/logX" 2>&1 ||
    { tail -20 "$tmp/logX"; fail "(d) init_from HF folder exited non-zero"; }
small_train "$tmp/runY" "$tmp/ckY" 1 1 1 0 "${steps[@]}" model.init_from="$tmp/ckB" > "$tmp/logY" 2>&1 ||
    { tail -20 "$tmp/logY"; fail "(d) init_from checkpoint exited non-zero"; }
small_train "$tmp/runZ" "$tmp/ckZ" 1 1 1 0 "${steps[@]}" > "$tmp/logZ" 2>&1 || fail "(d) fresh run"
grep -q "init_from: Hugging Face weights from $tmp/hfB" "$tmp/logX" || fail "(d) no init_from line"
$check loss "$tmp/hfB" "$tmp/shards" "$tmp/samplesX" 64 16 "$tmp/runX/metrics.jsonl" ||
    fail "(d) numpy loss of the untied export vs trident's (2,2,1) init_from run"
paste <(metrics "$tmp/runX" .loss) <(metrics "$tmp/runY" .loss) <(metrics "$tmp/runZ" .loss) |
    awk 'function abs(x) { return x < 0 ? -x : x }
         { n++; if (abs($1 - $2) > 1e-5 * abs($2)) { print "step " n ": hf " $1 " ckpt " $2; bad = 1 }
           if (n == 1 && $3 - $1 < 0.5) { print "first loss " $1 " not below a fresh run'"'"'s " $3; bad = 1 } }
         END { if (n != 3) { print n " steps"; bad = 1 }; exit bad }' || fail "(d) init_from losses"
echo "(d) losses per step: init_from HF (2,2,1) | init_from checkpoint (1,1,1) | fresh:"
paste <(metrics "$tmp/runX" .loss) <(metrics "$tmp/runY" .loss) <(metrics "$tmp/runZ" .loss)
rc=0; small_train "$tmp/runW" "$tmp/ckW" 1 1 1 0 "${steps[@]}" model.n_kv_heads=4 model.init_from="$tmp/hfB" \
    > "$tmp/logW" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "num_key_value_heads = 2, the run's \[model\] n_kv_heads = 4" "$tmp/logW" ||
    { tail -5 "$tmp/logW"; fail "(d) mismatched config: rc $rc"; }
[ ! -e "$tmp/ckW/latest" ] && ! metrics_at_least "$tmp/runW" 1 || fail "(d) a refused init_from trained"
TRIDENT_LOG_SAMPLES="$tmp/samplesT" small_train "$tmp/runT" "$tmp/ckT" 2 1 1 0 model.tie_embeddings=true train.seq_len=64 \
    train.steps=1 train.warmup_steps=0 train.lr=1e-30 train.min_lr=1e-30 train.sample_every=1 \
    train.sample_temperature=0 train.sample_tokens=32 model.init_from="$tmp/hfA" > "$tmp/logT" 2>&1 ||
    { tail -20 "$tmp/logT"; fail "(d) tied sample run exited non-zero"; }
"$TRIDENT" ckpt export "$tmp/ckT" "$tmp/T.h5" > /dev/null || fail "(d) tied sample run export"
$check tensors "$tmp/hfA" "$tmp/T.h5" "$manA" || fail "(d) lr 1e-30 changed the weights"
$check greedy "$tmp/hfA" 32 "$tmp/logT" || fail "(d) greedy decoding of the tied (2,2,1) export"
$check loss "$tmp/hfA" "$tmp/shards" "$tmp/samplesT" 64 16 "$tmp/runT/metrics.jsonl" ||
    fail "(d) numpy loss of the tied export vs trident's"

# (e)
"$TRIDENT" import "$tmp/hfB" "$tmp/ckI" > /dev/null || fail "(e) import"
"$TRIDENT" ckpt export "$tmp/ckI" "$tmp/hfI" --format hf --tokenizer "$tmp/shards" > /dev/null ||
    fail "(e) export of the import"
for f in "$tmp"/hfB/*; do cmp "$f" "$tmp/hfI/$(basename "$f")" || fail "(e) round trip: $(basename "$f") differs"; done
[ "$(ls "$tmp/hfB")" = "$(ls "$tmp/hfI")" ] || fail "(e) round trip: other files"
"$TRIDENT" import "$tmp/hfA16" "$tmp/ckI16" > /dev/null || fail "(e) import of bf16 shards"
"$TRIDENT" ckpt export "$tmp/ckI16" "$tmp/hfI16" --format hf --dtype bf16 --max-shard-size 100K \
    > /dev/null || fail "(e) export of the bf16 import"
for f in "$tmp"/hfA16/*.safetensors "$tmp"/hfA16/*.json; do
    cmp "$f" "$tmp/hfI16/$(basename "$f")" || fail "(e) bf16 round trip: $(basename "$f") differs"
done
rc=0; "$TRIDENT" import "$tmp/hfB" "$tmp/ckI" 2> "$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "holds checkpoints" "$tmp/err" || fail "(e) import over a checkpoint: rc $rc"
cp -r "$tmp/hfB" "$tmp/hfBad"
head -c 4000 "$tmp/hfB/model.safetensors" > "$tmp/hfBad/model.safetensors"
rc=0; "$TRIDENT" import "$tmp/hfBad" "$tmp/ckBad" 2> "$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "hfBad/model.safetensors: tensor .* past the end" "$tmp/err" ||
    fail "(e) truncated safetensors: rc $rc, $(cat "$tmp/err")"
[ ! -e "$tmp/ckBad/latest" ] || fail "(e) a refused import wrote a checkpoint"
rc=0; small_train "$tmp/runV" "$tmp/ckV" 1 1 1 0 "${steps[@]}" model.init_from="$tmp/hfBad" \
    > "$tmp/logV" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "hfBad/model.safetensors: tensor" "$tmp/logV" || fail "(e) init_from a truncated file: rc $rc"

# (f) refusals naming the file, tensor or key, exit 2, nothing written, and the
# tokenizer of an HF folder checked as a checkpoint's (issue 16).
bad="$PY tests/e2e/lib/hf_bad.py"
refused() { # refused WHAT PATTERN CMD...: exit 2 and PATTERN in its output
    local what=$1 pat=$2 rc=0; shift 2
    "$@" > "$tmp/out" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "$pat" "$tmp/out" || fail "(f) $what: rc $rc, $(grep -m2 trident: "$tmp/out"; tail -3 "$tmp/out")"
}
one=(train.steps=1 train.warmup_steps=0 model.tie_embeddings=false train.seq_len=64)
$bad "$tmp/hfB" "$tmp/hfNan" nonfinite model.norm.weight 5
nan_msg="hfNan/model.safetensors: tensor model.norm.weight holds 1 non-finite values .*element 5"
refused "import of a NaN" "$nan_msg" "$TRIDENT" import "$tmp/hfNan" "$tmp/ckNan"
[ ! -e "$tmp/ckNan" ] || fail "(f) a refused import wrote $(ls -R "$tmp/ckNan")"
refused "generate from a NaN" "$nan_msg" "$TRIDENT" generate "$tmp/hfNan" --prompt x --max-new-tokens 2
refused "init_from a NaN" "$nan_msg" small_train "$tmp/runN" "$tmp/ckN" 1 1 1 0 "${one[@]}" model.init_from="$tmp/hfNan"
[ ! -e "$tmp/ckN/latest" ] && ! metrics_at_least "$tmp/runN" 1 || fail "(f) init_from a NaN trained"
# tp = 2: the last row of q_proj (C = 64) is rank 1's alone; it names it, in
# the whole tensor's coordinates, and the job ends (no hang).
$bad "$tmp/hfB" "$tmp/hfNanQ" nonfinite model.layers.0.self_attn.q_proj.weight $((64 * 63 + 3))
refused "init_from a NaN read by one rank" "\[rank 1\] .*hfNanQ/model.safetensors: tensor model.layers.0.self_attn.q_proj.weight holds 1 non-finite values .*element 4035 (row 63, column 3)" \
    small_train "$tmp/runNQ" "$tmp/ckNQ" 2 1 1 0 "${one[@]}" model.init_from="$tmp/hfNanQ"
$bad "$tmp/hfA16" "$tmp/hfInf" nonfinite model.layers.1.mlp.down_proj.weight 7
refused "import of a BF16 inf" "hfInf/model-0000.-of-0000.\.safetensors: tensor model.layers.1.mlp.down_proj.weight holds 1 non-finite values .*element 7" \
    "$TRIDENT" import "$tmp/hfInf" "$tmp/ckInf"
$bad "$tmp/hfB" "$tmp/hfMiss" drop model.layers.0.mlp.up_proj.weight
refused "a missing tensor" "hfMiss: 20 of the 21 tensors .*missing: model.layers.0.mlp.up_proj.weight" \
    "$TRIDENT" import "$tmp/hfMiss" "$tmp/ckMiss"
$bad "$tmp/hfA16" "$tmp/hfShard" reshard model.norm.weight
refused "a wrong shard" "index.json: weight_map puts tensor model.norm.weight in model-00001-of-0000.\.safetensors, which does not hold it; it is in model-0000" \
    "$TRIDENT" import "$tmp/hfShard" "$tmp/ckShard"
$bad "$tmp/hfB" "$tmp/hfNoCfg" rm config.json
refused "no config.json" "hfNoCfg/config.json: no such file" "$TRIDENT" import "$tmp/hfNoCfg" "$tmp/ckNoCfg"
refused "init_from a file" "\[model\] init_from = $tmp/other.json: not a folder" \
    small_train "$tmp/runM" "$tmp/ckM" 1 1 1 0 "${one[@]}" model.init_from="$tmp/other.json"
refused "init_from a missing folder" "\[model\] init_from = $tmp/nope: no such folder.*Hugging Face folder (config.json" \
    small_train "$tmp/runM" "$tmp/ckM" 1 1 1 0 "${one[@]}" model.init_from="$tmp/nope"
$bad "$tmp/hfB" "$tmp/hfHid" config hidden_size 128
refused "init_from another hidden_size" "hfHid/config.json: hidden_size = 128, the run's \[model\] d_model = 64" \
    small_train "$tmp/runH" "$tmp/ckH" 1 1 1 0 "${one[@]}" model.init_from="$tmp/hfHid"
# Several keys differ: one refusal names them all (not one a round trip).
$bad "$tmp/hfHid" "$tmp/hfTwo" config num_hidden_layers 3
refused "init_from with 2 keys other" "hfTwo/config.json: hidden_size = 128, the run's \[model\] d_model = 64; num_hidden_layers = 3, the run's \[model\] n_layers = 2 (2 differences)" \
    small_train "$tmp/runH" "$tmp/ckH" 1 1 1 0 "${one[@]}" model.init_from="$tmp/hfTwo"
# Tokenizer identity: the folder's tokenizer.json against the run's data.
$bad "$tmp/hfB" "$tmp/hfTok" rm tokenizer.json && cp "$tmp/other.json" "$tmp/hfTok/tokenizer.json"
refused "init_from another tokenizer" "hfTok/tokenizer.json: tokenizer = '[0-9a-f]*', but the run's data uses '[0-9a-f]*'" \
    small_train "$tmp/runK" "$tmp/ckK" 1 1 1 0 "${one[@]}" model.init_from="$tmp/hfTok"
refused "generate with another tokenizer" "other.json: tokenizer [0-9a-f]*, the checkpoint $tmp/hfB was trained with" \
    "$TRIDENT" generate "$tmp/hfB" --tokenizer "$tmp/other.json" --prompt x --max-new-tokens 2
$bad "$tmp/hfB" "$tmp/hfNoTok" rm tokenizer.json
small_train "$tmp/runO" "$tmp/ckO" 1 1 1 0 "${one[@]}" model.init_from="$tmp/hfNoTok" > "$tmp/logO" 2>&1 ||
    { tail -5 "$tmp/logO"; fail "(f) init_from a folder without tokenizer.json"; }
grep -q "hfNoTok holds no tokenizer.json; its tokenizer could not be checked" "$tmp/logO" || fail "(f) no note"
"$TRIDENT" generate "$tmp/hfNoTok" --tokenizer "$tmp/other.json" --prompt x --max-new-tokens 2 > /dev/null 2> "$tmp/err" &&
    grep -q "hfNoTok holds no tokenizer.json; .*other.json could not be checked" "$tmp/err" ||
    fail "(f) generate from a folder without tokenizer.json: $(cat "$tmp/err")"
# import keeps the folder's tokenizer.json: export and generate find it.
cmp "$tmp/hfB/tokenizer.json" "$tmp/ckI/tokenizer.json" || fail "(f) import did not keep tokenizer.json"
"$TRIDENT" ckpt export "$tmp/ckI" "$tmp/hfI2" --format hf > /dev/null || fail "(f) export without --tokenizer"
for f in config.json tokenizer.json tokenizer_config.json generation_config.json; do
    cmp "$tmp/hfB/$f" "$tmp/hfI2/$f" || fail "(f) export without --tokenizer: $f differs"
done
"$TRIDENT" generate "$tmp/ckI" --prompt x --max-new-tokens 2 > /dev/null || fail "(f) generate the import without --tokenizer"
"$TRIDENT" ckpt export "$tmp/ckA" "$tmp/hfA2" --format hf > "$tmp/out" && grep -q "note: no tokenizer" "$tmp/out" &&
    [ ! -e "$tmp/hfA2/tokenizer.json" ] || fail "(f) export without any tokenizer: $(cat "$tmp/out")"
echo "(f) NaN/inf, missing tensor, wrong shard, config.json, init_from path and tokenizer refusals: exit 2 naming them"
echo "ok: hf export: tied (2,2,1) fp32/bf16-sharded/fp16 equal the HDF5 export, untied greedy 32 tokens match, bad input refused, init_from HF (2,2,1) = init_from checkpoint (1,1,1), export -> import -> export byte-identical"
