#!/usr/bin/env bash
# sft_example.sh (`make sft`): the supervised fine-tuning example of README
# "Fine-tuning" end to end, on the model `make run` trained:
#  1. the base model: the latest runs/tiny-*/checkpoints (or SFT_BASE=DIR, or
#     the first argument); none: it says to run `make run` first (exit 2);
#  2. the data, when missing: data/sft-kjv.jsonl (data/make_sft_example.sh,
#     5,000 "Where is it written: <verse>" -> "Ge 1:1" pairs) prepared with
#     `trident prep --format chat` into data/sft-kjv (5% validation split);
#  3. 5 held-out prompts: records of the validation split (decoded from its
#     shards), answered by the base model (`trident generate --chat
#     --temperature 0`), each with its expected answer;
#  4. fine-tuning: configs/sft-tiny.ini on 2 ranks with model.init_from = the
#     base model (loss_on = response: the loss and the validation loss are
#     over response tokens only); its run folder runs/sft-tiny-<date>-<time>/;
#  5. the response-only validation loss before training (step 0, the
#     init_from weights) and at the end, and the same prompts answered by the
#     fine-tuned model.
# Extra arguments after the base model are config overrides (train.steps=20).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TRIDENT=$BUILD/trident
[ -x "$TRIDENT" ] || { echo "sft_example: $TRIDENT not built (make)" >&2; exit 2; }
base=${SFT_BASE:-}
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then base=$1; shift; fi
if [ -z "$base" ]; then
    base=$(ls -d runs/tiny-*/checkpoints 2>/dev/null | sort | tail -1 || true)
    if [ -z "$base" ] || [ ! -e "$base/latest" ]; then
        echo "sft_example: no checkpoint of make run's model (runs/tiny-*/checkpoints/latest):" \
             "run 'make run' first, or give SFT_BASE=CHECKPOINT_DIR" >&2
        exit 2
    fi
elif [ ! -e "$base/latest" ] && [ ! -e "$base/manifest.ini" ] && [ ! -e "$base/config.json" ]; then
    echo "sft_example: SFT_BASE = $base is not a checkpoint folder (no latest or manifest.ini) nor a" \
         "Hugging Face folder (no config.json)" >&2
    exit 2
fi
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
"$py" -c "import h5py, tokenizers" 2>/dev/null ||
    { echo "sft_example: $py lacks h5py or tokenizers: run make deps" >&2; exit 2; }
[ -f data/kjv-shards/tokenizer.json ] ||
    { echo "sft_example: data/kjv-shards/tokenizer.json missing: run 'make run' first" >&2; exit 2; }
[ -f data/sft-kjv.jsonl ] || data/make_sft_example.sh data/sft-kjv.jsonl
if [ ! -f data/sft-kjv/index.ini ]; then
    "$TRIDENT" prep --input data/sft-kjv.jsonl --output data/sft-kjv --format chat \
        --tokenizer data/kjv-shards/tokenizer.json --val-fraction 0.05
fi
run_dir="${TRIDENT_RUNS:-runs}/sft-tiny-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run_dir"
# Held-out prompts: 5 records of the validation split, at an even stride.
"$py" - data/sft-kjv "$run_dir/heldout.jsonl" <<'PY'
import configparser, json, os, sys
import h5py
from tokenizers import Tokenizer
d, out = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
ix = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
ix.read(os.path.join(d, "index.ini"))
docs = []
for sec in ix.sections():
    if sec.startswith("shard-") and ix[sec]["split"] == "val":
        with h5py.File(os.path.join(d, ix[sec]["file"]), "r") as f:
            t, off = f["tokens"][:], f["doc_offsets"][:]
        docs += [tok.decode([int(x) for x in t[off[i]:off[i + 1]]]) for i in range(len(off) - 1)]
assert docs, f"{d}: no validation documents"
with open(out, "w") as f:
    for i in range(5):
        text = docs[i * len(docs) // 5].replace("<|endoftext|>", "")
        user, _, answer = text.partition("\nAssistant: ")
        f.write(json.dumps({"prompt": user.removeprefix("User: "), "response": answer}) + "\n")
print(f"held-out prompts: 5 of the {len(docs)} validation records -> {out}")
PY
gen() { "$TRIDENT" generate "$1" --tokenizer data/kjv-shards --prompts "$run_dir/heldout.jsonl" --chat \
        --temperature 0 --max-new-tokens 12; }
echo "== before fine-tuning: $base (make run's model) answers held-out prompts =="
gen "$base"
source tests/e2e/lib/mpi_env.sh
echo "== fine-tuning: configs/sft-tiny.ini from $base (loss on responses only) -> $run_dir =="
start=$(date +%s)
"${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 "$TRIDENT" train configs/sft-tiny.ini system.threads=1 \
    model.init_from="$base" log.run_dir="$run_dir" checkpoint.dir="$run_dir/checkpoints" "$@"
took=$(( $(date +%s) - start ))
first=$(jq -sr 'map(select(has("val_loss")))[0] | "\(.val_loss) (step \(.step))"' "$run_dir/metrics.jsonl")
last=$(jq -sr 'map(select(has("val_loss")))[-1] | "\(.val_loss) (step \(.step))"' "$run_dir/metrics.jsonl")
echo "== after fine-tuning ($took s): the same prompts =="
gen "$run_dir/checkpoints"
echo "response-only validation loss: $first before fine-tuning -> $last after; fine-tuning took $took s"
echo "run folder: $run_dir (metrics.jsonl, train.log, heldout.jsonl, checkpoints/)"
