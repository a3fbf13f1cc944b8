#!/usr/bin/env bash
# prep_bad_data.sh: bad command lines and bad datasets are refused with exit 2
# and a message naming the file and the problem: `trident prep` arguments and
# inputs, and `trident data-check` (which opens a dataset exactly as training
# does) on a good dataset broken one way at a time, with no HDF5 error stack
# printed before the message; `trident tokenize --train` refuses what prep
# refuses.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
T=$TRIDENT
need_built "$T"
need_py h5py numpy
failures=0

# expect2 NAME WANT... -- CMD...: CMD exits 2 and stderr holds every WANT.
expect2() {
    local name=$1; shift
    local wants=()
    while [ "$1" != "--" ]; do wants+=("$1"); shift; done
    shift
    local rc=0
    "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
    if [ $rc -ne 2 ]; then
        echo "FAIL $name: exit $rc, expected 2; stderr: $(cat "$tmp/err")"; failures=$((failures + 1)); return
    fi
    for w in "${wants[@]}"; do
        if ! grep -qF -- "$w" "$tmp/err"; then
            echo "FAIL $name: message lacks '$w': $(cat "$tmp/err")"; failures=$((failures + 1)); return
        fi
    done
    # The message alone: no HDF5 error stack before it (a handle closed twice, or never opened).
    if grep -q "HDF5-DIAG" "$tmp/err"; then
        echo "FAIL $name: an HDF5 error stack on stderr: $(head -n 3 "$tmp/err")"; failures=$((failures + 1)); return
    fi
    echo "ok   $name: $(head -c 200 "$tmp/err" | head -n 1)"
}

# A corpus from data/kjv.txt's first chapters when present, else generated.
if [ -s data/kjv.txt ]; then
    head -n 1500 data/kjv.txt > "$tmp/corpus.txt"
else
    for i in $(seq 1 200); do printf 'Line %d of the test corpus, with words and more words: %d.\nSecond line %d.\n\n' $i $((i * 7)) $i; done > "$tmp/corpus.txt"
fi

# --- prep: command line and inputs
expect2 "prep without --output" "--input and --output are required" -- "$T" prep --input "$tmp/corpus.txt" --vocab-size 300
expect2 "prep bad --vocab-size" "--vocab-size 'abc'" -- "$T" prep --input "$tmp/corpus.txt" --output "$tmp/x" --vocab-size abc
expect2 "prep both tokenizer flags" "exactly one of --tokenizer" -- \
    "$T" prep --input "$tmp/corpus.txt" --output "$tmp/x" --vocab-size 300 --tokenizer "$tmp/t.json"
expect2 "prep --val-fraction 1.5" "--val-fraction '1.5'" -- \
    "$T" prep --input "$tmp/corpus.txt" --output "$tmp/x" --vocab-size 300 --val-fraction 1.5
expect2 "prep unknown option" "unknown option '--frobnicate'" -- \
    "$T" prep --input "$tmp/corpus.txt" --output "$tmp/x" --vocab-size 300 --frobnicate 1
expect2 "prep missing input" "$tmp/nope.txt" "not found" -- "$T" prep --input "$tmp/nope.txt" --output "$tmp/x" --vocab-size 300
printf '{"text": "fine"}\n{"text": 3}\n' > "$tmp/bad.jsonl"
expect2 "prep bad jsonl" "$tmp/bad.jsonl:2" "\"text\"" -- \
    "$T" prep --input "$tmp/bad.jsonl" --format jsonl --output "$tmp/x" --vocab-size 300
expect2 "prep missing tokenizer" "$tmp/none.json" -- "$T" prep --input "$tmp/corpus.txt" --output "$tmp/x" --tokenizer "$tmp/none.json"

# --- tokenize --train: stdin checked as prep checks an input file
expect2 "tokenize --train on empty stdin" "stdin: no input text (0 bytes)" -- \
    sh -c '"$1" tokenize --train --vocab-size 300 --output "$2" < /dev/null' sh "$T" "$tmp/t.json"
expect2 "tokenize --train on blank stdin" "stdin: no input text (4 bytes, all blank)" -- \
    sh -c 'printf "\n \n\n" | "$1" tokenize --train --vocab-size 300 --output "$2"' sh "$T" "$tmp/t.json"
printf 'Text, then\nbinary \x00\x01\x02 bytes.\n' > "$tmp/nul.txt"
expect2 "tokenize --train on NUL bytes" "stdin: not text: a NUL byte at byte offset 18 (line 2)" -- \
    sh -c '"$1" tokenize --train --vocab-size 300 --output "$2" < "$3"' sh "$T" "$tmp/t.json" "$tmp/nul.txt"
expect2 "prep of the same file" "$tmp/nul.txt: not text: a NUL byte at byte offset 18 (line 2)" -- \
    "$T" prep --input "$tmp/nul.txt" --output "$tmp/x" --vocab-size 300
printf 'Some text.\n' | gzip -c > "$tmp/text.gz"
expect2 "tokenize --train on gzip" "stdin: not text: gzip-compressed" -- \
    sh -c '"$1" tokenize --train --vocab-size 300 --output "$2" < "$3"' sh "$T" "$tmp/t.json" "$tmp/text.gz"
[ ! -e "$tmp/t.json" ] || { echo "FAIL: a refused tokenize --train wrote $tmp/t.json"; failures=$((failures + 1)); }

# --- a good dataset: 512 ids, several train shards and a val shard
"$T" prep --input "$tmp/corpus.txt" --output "$tmp/good" --vocab-size 512 --val-fraction 0.2 --shard-tokens 5000 \
    2> "$tmp/prep.err" > /dev/null || { echo "FAIL: prep of the good dataset: $(cat "$tmp/prep.err")"; exit 1; }
"$T" data-check "$tmp/good" --seq-len 32 --vocab-size 512 --tokenizer "$tmp/good/tokenizer.json" > /dev/null \
    || { echo "FAIL: data-check refuses the good dataset"; exit 1; }
expect2 "prep over an existing dataset" "$tmp/good/index.ini" "already holds a dataset" -- \
    "$T" prep --input "$tmp/corpus.txt" --output "$tmp/good" --vocab-size 300
expect2 "data-check without --seq-len" "--seq-len are required" -- "$T" data-check "$tmp/good"

fresh() { rm -rf "$tmp/d"; cp -r "$tmp/good" "$tmp/d"; }
D="$tmp/d"
check() { "$T" data-check "$D" --seq-len "${SEQ:-32}" "$@"; }

fresh; rm "$D/shard-00001.h5"
expect2 "missing shard" "$D/shard-00001.h5" "missing" -- check
fresh; truncate -s 3000 "$D/shard-00001.h5"
expect2 "truncated shard" "$D/shard-00001.h5" "truncated" -- check
fresh; n=$(stat -c %s "$D/shard-00000.h5"); printf '\377\376' | dd of="$D/shard-00000.h5" bs=1 seek=$((n - 100)) conv=notrunc status=none
expect2 "corrupt bytes" "$D/shard-00000.h5" "checksum" -- check
fresh
expect2 "vocab mismatch" "$D/index.ini" "vocab_size 512 but the model expects 1000" -- check --vocab-size 1000
"$T" prep --input "$tmp/corpus.txt" --output "$tmp/other" --vocab-size 300 --shard-tokens 100000 >/dev/null 2>&1
expect2 "tokenizer mismatch" "$D/index.ini" "another tokenizer" -- check --tokenizer "$tmp/other/tokenizer.json"
expect2 "tokenizer id mismatch" "$D/index.ini" "tokenizer '" -- check --tokenizer-id 0123abcd
SEQ=100000 expect2 "seq_len longer than the data" "$D/index.ini" "fewer than seq_len + 1 = 100001" -- check
fresh; sed -i 's/^num_shards = \([0-9]*\)/num_shards = 99/' "$D/index.ini"
n=$(ls "$D"/shard-*.h5 | wc -l)
sed -i "s/^num_shards = 99/num_shards = $((n + 1))/" "$D/index.ini"
printf '\n[shard-%05d]\nfile = shard-00077.h5\nsplit = train\ntokens = 10\ndocuments = 1\nbytes = 4000\nchecksum = xxh3-64:0000000000000000\n' $n >> "$D/index.ini"
expect2 "index lists a shard not on disk" "$D/shard-00077.h5" "missing" -- check
fresh; rm "$D"/shard-*.h5
printf '[dataset]\nformat_version = 1\ntokenizer = %s\nvocab_size = 512\neot_id = 511\nnum_shards = 0\ntotal_tokens = 0\nsplits = train val\n' \
    "$(sed -n 's/^tokenizer = //p' "$tmp/good/index.ini")" > "$D/index.ini"
expect2 "empty dataset" "$D/index.ini" "empty dataset" -- check

# Shards rewritten with h5py, then index.ini given the new size and checksum
# (XXH3-64 through ctypes from libxxhash), so only the planted fault remains.
forge() { # forge SHARD PYTHON-STATEMENTS (f: the open h5py file)
    "$PY" - "$D" "$1" "$2" <<'PY'
import ctypes, ctypes.util, os, re, sys, h5py, numpy as np
d, shard, code = sys.argv[1:]
path = f"{d}/{shard}"
with h5py.File(path, "r+") as f:
    exec(code)
lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
lib.XXH3_64bits.restype = ctypes.c_uint64
data = open(path, "rb").read()
h = lib.XXH3_64bits(data, ctypes.c_size_t(len(data)))
ix = open(f"{d}/index.ini").read()
sec = re.search(r"\[shard-\d+\]\nfile = " + re.escape(shard) + r"\n(?:.*\n)*?checksum = .*\n", ix)
new = re.sub(r"bytes = \d+", f"bytes = {len(data)}", sec.group(0))
new = re.sub(r"checksum = .*", f"checksum = xxh3-64:{h:016x}", new)
ix = ix.replace(sec.group(0), new)
if os.environ.get("INDEX_VOCAB"):
    ix = re.sub(r"(?m)^vocab_size = \d+", "vocab_size = " + os.environ["INDEX_VOCAB"], ix)
open(f"{d}/index.ini", "w").write(ix)
PY
}
fresh; forge shard-00001.h5 't = f["tokens"]; t[123] = 512'
expect2 "token id >= vocab" "$D/shard-00001.h5" "token id 512 at offset 123" -- check
fresh; INDEX_VOCAB=70000 forge shard-00000.h5 'f.attrs["vocab_size"] = np.int64(70000)'
expect2 "uint16 storage with vocab > 65536" "$D/shard-00000.h5" "uint16 but vocab_size is 70000" -- check
fresh; forge shard-00000.h5 'f.attrs["format_version"] = np.int64(2)'
expect2 "shard format version" "$D/shard-00000.h5" "format_version 2" -- check
fresh; forge shard-00000.h5 'o = f["doc_offsets"]; o[-1] = o[-1] - 1'
expect2 "doc_offsets end" "$D/shard-00000.h5" "/doc_offsets ends at" -- check

echo "prep_bad_data: $failures failures"
[ "$failures" -eq 0 ]
