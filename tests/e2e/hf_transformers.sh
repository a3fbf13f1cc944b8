#!/usr/bin/env bash
# hf_transformers.sh: a `trident ckpt export --format hf` folder is what
# Hugging Face transformers (4.46.3 on torch 2.15.0, .venv-hf
# made by `make deps`) loads and runs like trident (issue 16, acceptance 1's
# export direction and 2), checked live by tests/e2e/lib/hf_transformers_check.py:
# for an untied and a tied model with grouped-query attention (4 heads, 2
# key/value heads), each trained 30 steps in a (tp, pp, dp) = (2, 2, 1) layout
# and exported in FP32 sharded at 40 KB (model.safetensors.index.json),
#  (a) LlamaForCausalLM.from_pretrained(fp32, eager attention) gives the
#      logits `trident ckpt logits` computes from the checkpoint, for three
#      sequences of 64 tokens (two of the dataset, one random), within 1e-5
#      relative; `trident ckpt logits` of the export itself (an HF folder)
#      gives bit-identical logits; bad token files are refused with exit 2;
#  (b) generate(do_sample=False, max_new_tokens=32) after the eos token gives
#      the text of trident's sampler at temperature 0 (32 tokens), sampled by
#      a run started from the checkpoint with init_from and one step at lr
#      1e-30 (sampling runs on a single pipeline stage), whose weights are
#      checked unchanged (its export is byte-identical);
#  (c) the BF16 export loads with torch_dtype="auto" as bfloat16, each tensor
#      the round-to-nearest-even of the FP32 export's;
#  (d) AutoTokenizer.from_pretrained of the export encodes three documents of
#      the dataset (decoded by `trident tokenize --decode`) to the shard's ids.
# The numpy checks of the same exports are tests/e2e/hf_export.sh.
# The transformers checks run at the end, in one process (check: importing
# torch and transformers takes seconds each time), each named on failure.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
HFPY="$PWD/.venv-hf/bin/python"
[ -x "$HFPY" ] && "$HFPY" -c "import importlib.util as u; assert u.find_spec('torch') and u.find_spec('transformers')" 2>/dev/null ||
    fail "$HFPY with torch and transformers missing: run make deps (it makes .venv-hf with tests/requirements-hf.txt)"
# check LABEL CMD ARGS...: queues hf_transformers_check.py CMD ARGS, run by check_all
check() { local IFS=$'\t'; echo "$*" >> "$tmp/checks"; }
check_all() {
    "$HFPY" tests/e2e/lib/hf_transformers_check.py batch "$tmp/checks" || fail "transformers checks (above)"
}
small_dataset "$tmp"

# Three sequences of 64 ids: two from the train split's token stream, one random.
$PY - "$tmp/shards" "$tmp/seqs.txt" "$tmp/doc" <<'EOF'
import configparser, sys
import h5py, numpy as np
shards, out, doc = sys.argv[1:]
idx = configparser.ConfigParser(inline_comment_prefixes=(";",))
idx.read(f"{shards}/index.ini")
sec = idx["shard-00000"]
with h5py.File(f"{shards}/{sec['file']}", "r") as f:
    tokens, offsets = f["tokens"][...].astype(np.int64), f["doc_offsets"][...].astype(np.int64)
V = int(idx["dataset"]["vocab_size"])
rows = [tokens[0:64], tokens[500:564], np.random.default_rng(16).integers(0, V, 64)]
open(out, "w").write("".join(" ".join(map(str, r)) + "\n" for r in rows))
for i in range(3):  # the documents' ids without their end-of-text id
    open(f"{doc}.{i}.ids", "w").write(" ".join(map(str, tokens[offsets[i]:offsets[i + 1] - 1])) + "\n")
EOF
for i in 0 1 2; do
    "$TRIDENT" tokenize --tokenizer "$tmp/shards/tokenizer.json" --decode < "$tmp/doc.$i.ids" \
        > "$tmp/doc.$i.txt" || fail "(d) trident tokenize --decode"
done

for kind in untied tied; do
    tie=$([ $kind = tied ] && echo true || echo false)
    ck="$tmp/ck-$kind" hf="$tmp/hf-$kind"
    small_train "$tmp/run-$kind" "$ck" 2 2 1 0 model.tie_embeddings=$tie train.steps=30 \
        > "$tmp/log-$kind" 2>&1 || { tail -20 "$tmp/log-$kind"; fail "$kind: training exited non-zero"; }
    "$TRIDENT" ckpt export "$ck" "$hf" --format hf --tokenizer "$tmp/shards" --max-shard-size 40K \
        > /dev/null || fail "$kind: hf export"
    [ -f "$hf/model.safetensors.index.json" ] || fail "$kind: 40K shards but no index"
    # (a)
    "$TRIDENT" ckpt logits "$ck" --tokens "$tmp/seqs.txt" --out "$tmp/logits-$kind.safetensors" \
        > /dev/null || fail "$kind: trident ckpt logits"
    check "(a) $kind: logits" logits "$hf" "$tmp/seqs.txt" "$tmp/logits-$kind.safetensors"
    "$TRIDENT" ckpt logits "$hf" --tokens "$tmp/seqs.txt" --out "$tmp/logitsH-$kind.safetensors" \
        > /dev/null || fail "$kind: trident ckpt logits of the HF folder"
    check "(a) $kind: trident's logits of the checkpoint and of its export" \
        same "$tmp/logits-$kind.safetensors" "$tmp/logitsH-$kind.safetensors"
    # (b)
    small_train "$tmp/runS-$kind" "$tmp/ckS-$kind" 1 1 1 0 model.tie_embeddings=$tie train.seq_len=64 \
        train.steps=1 train.warmup_steps=0 train.lr=1e-30 train.min_lr=1e-30 train.sample_every=1 \
        train.sample_temperature=0 train.sample_tokens=32 model.init_from="$ck" > "$tmp/logS-$kind" 2>&1 ||
        { tail -20 "$tmp/logS-$kind"; fail "(b) $kind: sample run exited non-zero"; }
    "$TRIDENT" ckpt export "$tmp/ckS-$kind" "$tmp/hfS-$kind" --format hf --tokenizer "$tmp/shards" \
        --max-shard-size 40K > /dev/null || fail "(b) $kind: export of the sample run"
    for f in "$hf"/*.safetensors; do
        cmp -s "$f" "$tmp/hfS-$kind/$(basename "$f")" || fail "(b) $kind: lr 1e-30 changed $(basename "$f")"
    done
    check "(b) $kind: greedy generation" generate "$hf" 32 "$tmp/logS-$kind"
done

# (a) refused token files: exit 2 naming the file and line, nothing written
printf '1 2 3\n4 5\n' > "$tmp/bad1.txt"
printf '1 2 510\n' > "$tmp/bad2.txt"
seq -s ' ' 1 65 > "$tmp/bad3.txt"
for b in "bad1.txt:2: 2 ids, the first line has 3" "bad2.txt:1: '510' is not a token id in \[0, 510)" \
         "bad3.txt:1: 65 ids, more than the model's max_seq_len 64"; do
    f=${b%%:*} rc=0
    "$TRIDENT" ckpt logits "$tmp/ck-tied" --tokens "$tmp/$f" --out "$tmp/bad.safetensors" 2> "$tmp/err" || rc=$?
    [ "$rc" -eq 2 ] && grep -q "$b" "$tmp/err" || fail "(a) $f: rc $rc, $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.safetensors" ] || fail "(a) $f: refused but written"
done
rc=0; "$TRIDENT" ckpt logits "$tmp/ck-tied" --tokens "$tmp/seqs.txt" --out "$tmp/logits-tied.safetensors" \
    2> "$tmp/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "logits-tied.safetensors: exists" "$tmp/err" || fail "(a) existing output: rc $rc"

# (c)
"$TRIDENT" ckpt export "$tmp/ck-untied" "$tmp/hf16" --format hf --dtype bf16 > /dev/null ||
    fail "(c) bf16 export"
check "(c) bf16 export" bf16 "$tmp/hf16" "$tmp/hf-untied"
# (d)
check "(d) tokenizer" tokenizer "$tmp/hf-tied" "$tmp/doc" 3
check_all
echo "ok: transformers $("$HFPY" -c 'import importlib.metadata as m; print(m.version("transformers"))'): from_pretrained logits = trident's (untied, tied, GQA, trained in (2,2,1), sharded), greedy generate = trident's temperature-0 sample for 32 tokens, bf16 export loads as bfloat16 = RNE, AutoTokenizer encodes the dataset's documents to its ids"
