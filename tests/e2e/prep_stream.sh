#!/usr/bin/env bash
# prep_stream.sh: `trident prep` streams its input and encodes in parallel:
#  - a 100 MB generated corpus (ten copies of one 10 MB file) preps with peak
#    RSS (prep_stats.peak_rss_bytes, getrusage) far below the corpus size;
#  - the shards are byte-identical with 1 and 2 encoder threads, and identical
#    to HF tokenizers' ids for sampled documents (h5py); the validation split
#    is the seeded Fisher-Yates choice (recomputed in Python);
#  - special-token text in a document is ordinary text by default (2 end-of-text
#    ids for 2 documents, the ids HF gives with encode_special_tokens=True) and
#    an end-of-text id with --allow-special-tokens (3 ids, HF's default);
#  - a JSON Lines string holding \u0000 is encoded (decodes back with the NUL),
#    --text-key picks the field, a line without it is refused naming file:line;
#  - progress lines on a non-terminal stderr name MB read and tokens/s.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
T=$TRIDENT
need_built "$T"
need_py h5py numpy tokenizers
FIX=tests/reference/fixtures

"$T" tokenize --train --vocab-size 512 --output "$tmp/tok.json" < $FIX/tokenizer_corpus.txt 2> /dev/null \
    || fail "training a tokenizer exited $?"
stats() { grep '^prep_stats: ' "$1" | cut -d' ' -f2- | jq -r "$2"; }

# --- special-token text inside a document
printf 'In the beginning <|endoftext|> was the word.\n\nThe second document.\n' > "$tmp/special.txt"
for mode in plain special; do
    extra=(); [ $mode = special ] && extra=(--allow-special-tokens)
    "$T" prep --input "$tmp/special.txt" --output "$tmp/sp-$mode" --tokenizer "$tmp/tok.json" --val-fraction 0 \
        "${extra[@]}" > /dev/null 2> "$tmp/err" || fail "prep ($mode) exited $?: $(cat "$tmp/err")"
done
"$PY" - "$tmp" <<'EOF' || fail "special-token text check"
import sys, h5py
from tokenizers import Tokenizer
tmp = sys.argv[1]
hf = Tokenizer.from_file(f"{tmp}/tok.json")
eot = hf.token_to_id("<|endoftext|>")
docs = ["In the beginning <|endoftext|> was the word.", "The second document."]
for mode, parse in (("plain", False), ("special", True)):
    with h5py.File(f"{tmp}/sp-{mode}/shard-00000.h5", "r") as f:
        toks, offs = f["tokens"][:].tolist(), f["doc_offsets"][:].tolist()
    hf.encode_special_tokens = not parse
    want = []
    for d in docs:
        want += hf.encode(d, add_special_tokens=False).ids + [eot]
    n_eot = toks.count(eot)
    print(f"{mode}: {n_eot} end-of-text ids, doc_offsets {offs}")
    assert n_eot == (3 if parse else 2), (mode, n_eot)
    assert toks == want, (mode, toks, want)
    assert len(offs) == 3 and offs[2] == len(toks), offs
EOF

# --- \u0000 inside a JSON string, --text-key
printf '{"body": "nul\\u0000inside", "text": 1}\n\n{"body": "second \\u00e9"}\n' > "$tmp/nul.jsonl"
"$T" prep --input "$tmp/nul.jsonl" --format jsonl --text-key body --output "$tmp/nul" --tokenizer "$tmp/tok.json" \
    --val-fraction 0 > /dev/null 2> "$tmp/err" || fail "prep of a \\u0000 string exited $?: $(cat "$tmp/err")"
"$PY" - "$tmp" <<'EOF' || fail "\\u0000 check"
import sys, h5py
from tokenizers import Tokenizer
tmp = sys.argv[1]
hf = Tokenizer.from_file(f"{tmp}/tok.json")
with h5py.File(f"{tmp}/nul/shard-00000.h5", "r") as f:
    toks, offs = f["tokens"][:].tolist(), f["doc_offsets"][:].tolist()
texts = [hf.decode(toks[offs[i]:offs[i + 1] - 1], skip_special_tokens=False) for i in range(len(offs) - 1)]
assert texts == ["nul\x00inside", "second \u00e9"], texts
print("decoded:", texts)
EOF
rc=0; "$T" prep --input "$tmp/nul.jsonl" --format jsonl --output "$tmp/nul2" --tokenizer "$tmp/tok.json" \
    > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -eq 2 ] && grep -qF "$tmp/nul.jsonl:1" "$tmp/err" && grep -qF '"text"' "$tmp/err" \
    || fail "a record whose \"text\" is not a string: exit $rc, $(cat "$tmp/err")"
[ ! -e "$tmp/nul2" ] || fail "a refused prep left $tmp/nul2 behind"
rc=0; "$T" prep --input "$tmp/special.txt" --text-key body --output "$tmp/x" --tokenizer "$tmp/tok.json" \
    > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -eq 2 ] && grep -qF -- "--text-key needs JSON Lines input" "$tmp/err" || fail "--text-key without jsonl: $rc"

# --- 100 MB in bounded memory; same bytes with 1 and 2 threads
"$PY" tests/e2e/lib/gen_corpus.py 10 7 > "$tmp/c10.txt"
# Ten copies: a file named ten times is read once.
inputs=(); for i in $(seq 10); do cp "$tmp/c10.txt" "$tmp/c10-$i.txt"; inputs+=("$tmp/c10-$i.txt"); done
corpus=$(( $(stat -c %s "$tmp/c10.txt") * 10 ))
for th in 2 1; do
    OMP_NUM_THREADS=$th "$T" prep --input "${inputs[@]}" --output "$tmp/big$th" --tokenizer "$tmp/tok.json" \
        --shard-tokens 2000000 --val-fraction 0.01 > "$tmp/out$th" 2> "$tmp/err$th" \
        || fail "prep of $corpus bytes with $th threads exited $?: $(cat "$tmp/err$th")"
done
cat "$tmp/err2"
grep -q "MB read" "$tmp/err2" && grep -q "tokens/s" "$tmp/err2" || fail "no progress line: $(cat "$tmp/err2")"
rss=$(stats "$tmp/out2" .peak_rss_bytes)
echo "corpus $corpus bytes; peak RSS $rss bytes (2 threads), $(stats "$tmp/out1" .peak_rss_bytes) (1 thread);" \
    "$(stats "$tmp/out2" .mb_per_s) MB/s with 2 threads, $(stats "$tmp/out1" .mb_per_s) MB/s with 1"
[ "$(stats "$tmp/out2" .bytes)" -ge $(( corpus * 9 / 10 )) ] || fail "prep_stats.bytes $(stats "$tmp/out2" .bytes)"
# The old prep held the whole corpus and its ids (> 1.4x the corpus); a
# streaming one holds a block and two pending shards.
[ "$rss" -lt $(( corpus * 6 / 10 )) ] || fail "peak RSS $rss is not far below the corpus size $corpus"
[ "$rss" -lt $(( 96 * 1024 * 1024 )) ] || fail "peak RSS $rss above 96 MiB"
cmp "$tmp/big1/index.ini" "$tmp/big2/index.ini" || fail "index.ini depends on the thread count"
n=0; for f in "$tmp"/big1/shard-*.h5; do cmp -s "$f" "$tmp/big2/$(basename "$f")" || fail "$f differs"; n=$((n + 1)); done
[ $n -ge 10 ] || fail "expected many shards, got $n"
docs=$(awk -F' = ' '/^documents = /{s += $2} END {print s}' "$tmp/big1/index.ini")
"$PY" - "$tmp" "$docs" <<'EOF' || fail "shard contents against HF"
import sys, h5py, random
from tokenizers import Tokenizer
tmp, n_docs = sys.argv[1], int(sys.argv[2])
hf = Tokenizer.from_file(f"{tmp}/tok.json")
hf.encode_special_tokens = True
src = open(f"{tmp}/c10.txt", encoding="utf-8").read().split("\n\n")
src = set(d.strip("\n") for d in src if d.strip())
with h5py.File(f"{tmp}/big1/shard-00003.h5", "r") as f:
    toks, offs = f["tokens"][:], f["doc_offsets"][:]
r = random.Random(3)
for i in r.sample(range(len(offs) - 1), 50):
    ids = toks[offs[i]:offs[i + 1]].tolist()
    text = hf.decode(ids[:-1])
    assert text in src, f"document {i} of shard 3 is no corpus document: {text[:80]!r}"
    assert hf.encode(text, add_special_tokens=False).ids == ids[:-1], f"document {i}: ids differ from HF"
print(f"{n_docs} documents; 50 sampled documents of shard 3 match HF ids")

# The validation split: the first k of a seeded Fisher-Yates shuffle of the
# documents (SplitMix64 draws), written here in Python as a plain array
# shuffle: the validation shards hold exactly those documents, in order.
M = (1 << 64) - 1
state = 1234  # prep's default --seed
def splitmix64():
    global state
    state = (state + 0x9E3779B97F4A7C15) & M
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
docs = [d.strip("\n") for d in open(f"{tmp}/c10.txt", encoding="utf-8").read().split("\n\n") if d.strip()]
n = len(docs) * 10
assert n == n_docs, (n, n_docs)
k = int(0.01 * n + 0.5)
perm = list(range(n))
for i in range(k):
    j = i + splitmix64() % (n - i)
    perm[i], perm[j] = perm[j], perm[i]
chosen = sorted(perm[:k])
import configparser
ix = configparser.ConfigParser()
ix.read(f"{tmp}/big1/index.ini")
val = []
for sec in ix.sections():
    if ix[sec].get("split") == "val":
        with h5py.File(f"{tmp}/big1/" + ix[sec]["file"], "r") as f:
            toks, offs = f["tokens"][:], f["doc_offsets"][:].tolist()
        val += [toks[offs[i]:offs[i + 1] - 1].tolist() for i in range(len(offs) - 1)]
assert len(val) == k, (len(val), k)
for q in range(0, k, max(1, k // 200)):
    want = hf.encode(docs[chosen[q] % len(docs)], add_special_tokens=False).ids
    assert val[q] == want, f"validation document {q} is not corpus document {chosen[q]}"
print(f"validation split: the {k} documents of the seeded Fisher-Yates choice")
EOF
echo "prep_stream: ok"
