#!/usr/bin/env bash
# prep_kjv.sh: `trident prep` end to end on a small generated corpus: trains a
# 512-id tokenizer, writes shards and index.ini; checks the index, that
# data-check accepts it, h5dump's types, that the output does not depend on the
# thread count, that --tokenizer and --format jsonl give the same shards, and
# (Python h5py + tokenizers) that each shard's documents decode back to
# corpus documents, each followed by the end-of-text id.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
T=$TRIDENT
need_built "$T"
need_py h5py numpy tokenizers

# 300 documents of 1-6 lines of pseudo-words (1-3 syllables each),
# deterministic (awk srand).
awk 'BEGIN {
    srand(17); ns = split("ba be bi bo bu da de di do ka ke ki ko la le li lo ma me mi mo na ne ni no ra re ri ro sa se si so ta te ti to va ve vi", y, " ")
    for (d = 0; d < 300; d++) {
        if (d) print ""
        lines = 1 + int(rand() * 6)
        for (l = 0; l < lines; l++) {
            n = 4 + int(rand() * 12); s = ""
            for (i = 0; i < n; i++) {
                k = 1 + int(rand() * 3); wd = ""
                for (j = 0; j < k; j++) wd = wd y[1 + int(rand() * ns)]
                s = s (i ? " " : "") wd
            }
            print toupper(substr(s, 1, 1)) substr(s, 2) "."
        }
    }
}' > "$tmp/corpus.txt"

args=(--val-fraction 0.1 --shard-tokens 4000 --seed 7)
OMP_NUM_THREADS=2 "$T" prep --input "$tmp/corpus.txt" --output "$tmp/ds" --vocab-size 512 "${args[@]}" \
    2> "$tmp/prep.err" || fail "prep exited $?: $(cat "$tmp/prep.err")"
grep -q "tokens/s" "$tmp/prep.err" || fail "no progress line with tokens/s on stderr"
ix="$tmp/ds/index.ini"
[ -f "$tmp/ds/tokenizer.json" ] || fail "no tokenizer.json in the dataset folder"
for kv in "format_version = 1" "vocab_size = 512" "eot_id = 511" "splits = train val"; do
    grep -qx "$kv" "$ix" || fail "index.ini lacks '$kv'"
done
n_files=$(ls "$tmp/ds"/shard-*.h5 | wc -l)
grep -qx "num_shards = $n_files" "$ix" || fail "num_shards does not match $n_files shard files"
[ "$n_files" -ge 3 ] || fail "expected several shards at --shard-tokens 4000, got $n_files"
[ "$(grep -c '^split = val' "$ix")" -ge 1 ] || fail "no validation shard"
[ "$(grep -c '^checksum = xxh3-64:[0-9a-f]\{16\}$' "$ix")" -eq "$n_files" ] || fail "checksum lines"
sum=$(awk -F' = ' '/^tokens = /{s += $2} END {print s}' "$ix")
grep -qx "total_tokens = $sum" "$ix" || fail "total_tokens is not the sum of shard tokens ($sum)"
docs=$(awk -F' = ' '/^documents = /{s += $2} END {print s}' "$ix")
[ "$docs" -eq 300 ] || fail "index lists $docs documents, corpus has 300"

"$T" data-check "$tmp/ds" --seq-len 64 --vocab-size 512 --tokenizer "$tmp/ds/tokenizer.json" > "$tmp/check.out" \
    || fail "data-check refused the fresh dataset"
grep -q '^ok$' "$tmp/check.out" || fail "data-check summary: $(cat "$tmp/check.out")"

h5dump -H "$tmp/ds/shard-00000.h5" > "$tmp/h5dump.txt"
grep -A1 'DATASET "tokens"' "$tmp/h5dump.txt" | grep -q H5T_STD_U16LE || fail "/tokens is not uint16"
grep -A1 'DATASET "doc_offsets"' "$tmp/h5dump.txt" | grep -q H5T_STD_U64LE || fail "/doc_offsets is not uint64"
for a in vocab_size eot_id tokenizer format_version; do
    grep -q "ATTRIBUTE \"$a\"" "$tmp/h5dump.txt" || fail "attribute $a missing"
done

# Same shards with one thread, and with the trained tokenizer given back.
OMP_NUM_THREADS=1 "$T" prep --input "$tmp/corpus.txt" --output "$tmp/ds1" --vocab-size 512 "${args[@]}" 2>/dev/null
cmp "$ix" "$tmp/ds1/index.ini" || fail "output depends on the thread count"
"$T" prep --input "$tmp/corpus.txt" --output "$tmp/ds2" --tokenizer "$tmp/ds/tokenizer.json" "${args[@]}" 2>/dev/null
cmp "$ix" "$tmp/ds2/index.ini" || fail "--tokenizer with the trained file gives other shards"
# JSON Lines holding the same documents, in two files of a folder.
mkdir "$tmp/jl"
"$PY" - "$tmp/corpus.txt" "$tmp/jl" <<'PY'
import json, sys
docs = open(sys.argv[1]).read().split("\n\n")
for k, part in enumerate([docs[:120], docs[120:]]):
    with open(f"{sys.argv[2]}/part{k}.jsonl", "w") as f:
        for d in part:
            f.write(json.dumps({"id": k, "text": d.strip("\n")}) + "\n")
PY
"$T" prep --input "$tmp/jl" --format jsonl --output "$tmp/ds3" --tokenizer "$tmp/ds/tokenizer.json" "${args[@]}" \
    2>/dev/null || fail "jsonl prep failed"
cmp "$ix" "$tmp/ds3/index.ini" || fail "--format jsonl gives other shards than the same documents as text"

"$PY" - "$tmp/ds" "$tmp/corpus.txt" <<'PY'
import configparser, sys, h5py, numpy as np
from tokenizers import Tokenizer
ds, corpus = sys.argv[1], sys.argv[2]
docs = set(d.strip("\n") for d in open(corpus).read().split("\n\n"))
tok = Tokenizer.from_file(f"{ds}/tokenizer.json")
ix = configparser.ConfigParser(); ix.read(f"{ds}/index.ini")
seen = 0
for sec in [s for s in ix.sections() if s.startswith("shard-")]:
    with h5py.File(f"{ds}/{ix[sec]['file']}", "r") as f:
        t, off = f["tokens"][:], f["doc_offsets"][:]
        assert t.dtype == np.uint16 and off.dtype == np.uint64, (t.dtype, off.dtype)
        off = off.astype(np.int64)  # uint64 - int is float64 in numpy 1.x: no index
        assert f["tokens"].chunks is not None, "tokens not chunked"
        assert int(f.attrs["vocab_size"]) == 512 and int(f.attrs["format_version"]) == 1
        eot = int(f.attrs["eot_id"])
        assert len(t) == int(ix[sec]["tokens"]) and off[0] == 0 and off[-1] == len(t)
        assert t.max() < 512
        for a, b in zip(off[:-1], off[1:]):
            assert t[b - 1] == eot, "document not ended by eot"
            text = tok.decode(t[a:b - 1].tolist(), skip_special_tokens=False)
            assert text in docs, f"decoded document not in corpus: {text[:60]!r}"
            seen += 1
assert seen == 300, seen
print(f"h5py + tokenizers: {seen} documents decode to corpus documents")
PY
echo "prep_kjv: ok"
