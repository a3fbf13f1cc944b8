#!/usr/bin/env bash
# prep_inputs.sh: `trident prep` does not surprise (issue 14). Counts come from
# the prep_stats line and the shards (h5py, decoded with HF tokenizers), exit
# codes are checked, and stderr is matched only for the messages that are the
# contract (a refused file named with what was seen, the JSON Lines note, the
# validation-split warning):
#  - a folder is read recursively in byte order of its paths (shards identical
#    for a copy of the tree made in another order), hidden files and folders
#    skipped, a symlink loop skipped; --no-recursive and --include GLOB;
#  - *.jsonl / *.json starting with '{' read as JSON Lines in a mixed folder,
#    with a note; --format text reads them as text;
#  - NUL bytes, gzip and zstd magic, mostly-invalid UTF-8 refused (exit 2)
#    naming the file, no output left behind; one stray invalid byte tolerated;
#  - --doc-per-file: one document per file, blank lines inside kept;
#  - --output's parents are created, and removed again when prep fails;
#  - a validation split smaller than one global batch of configs/tiny.ini is
#    reported with a --val-fraction that fits, and that value does fit.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
T=$TRIDENT
need_built "$T"
need_py h5py numpy tokenizers
failures=0
bad() { echo "FAIL $*"; failures=$((failures + 1)); }

"$T" tokenize --train --vocab-size 400 --output "$tmp/tok.json" < tests/reference/fixtures/tokenizer_corpus.txt \
    2> /dev/null || fail "training a tokenizer exited $?"
stat_of() { grep '^prep_stats: ' "$1" | cut -d' ' -f2- | jq -r "$2"; }
# prep_ok NAME OUT ARGS...: prep into $tmp/OUT (tokenizer, no validation
# split unless ARGS say), stdout to $tmp/OUT.out, stderr to $tmp/OUT.err.
prep_ok() {
    local name=$1 out=$2; shift 2
    "$T" prep --output "$tmp/$out" --tokenizer "$tmp/tok.json" --val-fraction 0 --quiet "$@" \
        > "$tmp/$out.out" 2> "$tmp/$out.err" || bad "$name: prep exited $?: $(cat "$tmp/$out.err")"
}
# expect_stat NAME OUT JQ WANT
expect_stat() {
    local got; got=$(stat_of "$tmp/$2.out" "$3") || got="(no prep_stats)"
    if [ "$got" = "$4" ]; then echo "ok   $1: $3 = $got"; else bad "$1: $3 = $got, expected $4"; fi
}
# docs OUT: the documents of $tmp/OUT's train shards, decoded, as a JSON list.
docs() {
    "$PY" - "$tmp/$1" "$tmp/tok.json" <<'EOF'
import configparser, json, sys, h5py
from tokenizers import Tokenizer
d, tok = sys.argv[1:]
hf = Tokenizer.from_file(tok)
eot = hf.token_to_id("<|endoftext|>")
ix = configparser.ConfigParser()
ix.read(f"{d}/index.ini")
out = []
for sec in sorted(s for s in ix.sections() if s.startswith("shard-")):
    if ix[sec]["split"] != "train":
        continue
    with h5py.File(f"{d}/" + ix[sec]["file"], "r") as f:
        toks, offs = f["tokens"][:].tolist(), f["doc_offsets"][:].tolist()
    for i in range(len(offs) - 1):
        ids = toks[offs[i]:offs[i + 1]]
        assert ids[-1] == eot, f"document {i} of {sec} does not end with the end-of-text id"
        out.append(hf.decode(ids[:-1], skip_special_tokens=False))
print(json.dumps(out, separators=(",", ":")))
EOF
}
# expect_docs NAME OUT JSON-LIST
expect_docs() {
    local got; got=$(docs "$2") || { bad "$1: cannot decode $2"; return; }
    if [ "$got" = "$3" ]; then echo "ok   $1: documents $got"; else bad "$1: documents $got, expected $3"; fi
}
# refused NAME WANT... -- PREP-ARGS...: exit 2, stderr holds every WANT, and
# neither the output folder nor its first missing parent is left behind.
refused() {
    local name=$1; shift
    local wants=()
    while [ "$1" != "--" ]; do wants+=("$1"); shift; done
    shift
    local rc=0
    rm -rf "$tmp/fresh"
    "$T" prep --output "$tmp/fresh/a/b" --tokenizer "$tmp/tok.json" --quiet "$@" > /dev/null 2> "$tmp/err" || rc=$?
    [ $rc -eq 2 ] || { bad "$name: exit $rc, expected 2: $(cat "$tmp/err")"; return; }
    local w
    for w in "${wants[@]}"; do
        grep -qF -- "$w" "$tmp/err" || { bad "$name: message lacks '$w': $(cat "$tmp/err")"; return; }
    done
    [ ! -e "$tmp/fresh" ] || { bad "$name: left $(find "$tmp/fresh") behind"; return; }
    echo "ok   $name: $(head -n 1 "$tmp/err" | head -c 220)"
}

# --- a tree: sorted recursive reading, hidden and looping entries skipped
mk_tree() { # mk_tree DIR REVERSE: the same files, created in either order
    local d=$1 names=(b.txt a/z.txt a/b/y.md c.txt a.txt) i
    [ "$2" = 1 ] && names=(a.txt c.txt a/b/y.md a/z.txt b.txt)
    mkdir -p "$d/a/b" "$d/.git"
    for i in "${names[@]}"; do printf 'Text of %s.\n' "$i" > "$d/$i"; done
    printf 'hidden\n' > "$d/.hidden.txt"; printf 'in a hidden folder\n' > "$d/.git/config"
    ln -s .. "$d/a/b/up"          # a loop back to the tree's root
    ln -s missing "$d/dangling"   # skipped: no file behind it
}
mk_tree "$tmp/tree" 0
mk_tree "$tmp/tree2" 1
# Byte order of the paths: a.txt < a/b/y.md < a/z.txt < b.txt < c.txt
want='["Text of a.txt.","Text of a/b/y.md.","Text of a/z.txt.","Text of b.txt.","Text of c.txt."]'
start=$(date +%s)
timeout 60 "$T" prep --input "$tmp/tree" --output "$tmp/rec" --tokenizer "$tmp/tok.json" --val-fraction 0 --quiet \
    > "$tmp/rec.out" 2> "$tmp/rec.err" || bad "recursive prep (symlink loop inside) exited $?: $(cat "$tmp/rec.err")"
echo "recursive prep with a symlink loop took $(( $(date +%s) - start )) s"
expect_stat "recursive" rec .files 5
expect_docs "recursive, path order" rec "$want"
prep_ok "recursive, tree made in reverse" rec2 --input "$tmp/tree2"
for f in "$tmp"/rec/shard-*.h5; do
    cmp -s "$f" "$tmp/rec2/$(basename "$f")" || bad "$(basename "$f") differs for a tree made in another order"
done
cmp -s "$tmp/rec/index.ini" "$tmp/rec2/index.ini" && echo "ok   same shards for a tree made in another order" \
    || bad "index.ini differs for a tree made in another order"
prep_ok "--no-recursive" norec --input "$tmp/tree" --no-recursive
expect_stat "--no-recursive" norec .files 3
expect_docs "--no-recursive" norec '["Text of a.txt.","Text of b.txt.","Text of c.txt."]'
prep_ok "--include" inc --input "$tmp/tree" --include '*.md' --include 'c.*'
expect_stat "--include '*.md' --include 'c.*'" inc '[.files, .left_out] | @tsv' "$(printf '2\t3')"
expect_docs "--include" inc '["Text of a/b/y.md.","Text of c.txt."]'
refused "a folder with nothing to read" "$tmp/tree" "no file to read" "--include '*.csv'" -- \
    --input "$tmp/tree" --include '*.csv'

# --- JSON Lines detected file by file in a mixed folder
mkdir "$tmp/mixed"
printf 'Plain one.\n\nPlain two.\n' > "$tmp/mixed/a.txt"
printf '{"text": "Record one."}\n\n{"text": "Record two."}\n' > "$tmp/mixed/b.jsonl"
printf '  {"text": "Record of c."}\n' > "$tmp/mixed/c.JSON"
printf 'Not JSON, named .json.\n' > "$tmp/mixed/d.json"
prep_ok "mixed folder" mixed-out --input "$tmp/mixed"
expect_stat "mixed folder" mixed-out '[.files, .jsonl_files, .jsonl_detected, .documents] | @tsv' "$(printf '4\t2\t2\t6')"
expect_docs "mixed folder" mixed-out \
    '["Plain one.","Plain two.","Record one.","Record two.","Record of c.","Not JSON, named .json."]'
grep -qF "read as JSON Lines" "$tmp/mixed-out.err" && grep -qF "$tmp/mixed/b.jsonl" "$tmp/mixed-out.err" \
    && echo "ok   the note names the first JSON Lines file" || bad "no JSON Lines note: $(cat "$tmp/mixed-out.err")"
prep_ok "--format text" mixtext --input "$tmp/mixed/b.jsonl" --format text
expect_stat "--format text on a .jsonl" mixtext '[.jsonl_files, .documents] | @tsv' "$(printf '0\t2')"
expect_docs "--format text on a .jsonl" mixtext '["{\"text\": \"Record one.\"}","{\"text\": \"Record two.\"}"]'
printf '[{"text": "an array"}]\n' > "$tmp/array.json"
refused "a JSON array" "$tmp/array.json" "a JSON array, not JSON Lines" -- --input "$tmp/array.json"
refused "--text-key with no JSON Lines" "--text-key needs JSON Lines input" -- --input "$tmp/mixed/a.txt" --text-key body

# --- a UTF-8 byte-order mark starting a file is skipped (detection sees past
# it), one elsewhere is text
printf '\xef\xbb\xbf{"text": "hello world"}\n{"text": "second doc"}\n' > "$tmp/bom.jsonl"
prep_ok "a BOM before JSON Lines" bomj --input "$tmp/bom.jsonl"
expect_stat "a BOM before JSON Lines" bomj '[.jsonl_detected, .documents] | @tsv' "$(printf '1\t2')"
expect_docs "a BOM before JSON Lines" bomj '["hello world","second doc"]'
prep_ok "a BOM before --format jsonl" bomj2 --input "$tmp/bom.jsonl" --format jsonl
expect_docs "a BOM before --format jsonl" bomj2 '["hello world","second doc"]'
printf '\xef\xbb\xbfFirst line.\n\n\xef\xbb\xbfSecond.\n' > "$tmp/bom.txt"
prep_ok "a BOM before text" bomt --input "$tmp/bom.txt"
expect_docs "a BOM before text (the second, inside, kept)" bomt '["First line.","\ufeffSecond."]'

# --- a file named twice (any spelling, or inside a folder given) is read once
prep_ok "a file given twice" twice --input "$tmp/tree/a.txt" --input "$tmp/tree/./a.txt" --input "$tmp/tree"
expect_stat "a file given twice" twice '[.files, .duplicates] | @tsv' "$(printf '5\t2')"
expect_docs "a file given twice, read once" twice "$want"
grep -qF "input $tmp/tree/./a.txt is the same file as $tmp/tree/a.txt and is read once" "$tmp/twice.err" \
    && echo "ok   the note names the duplicate" || bad "no note on the duplicate: $(cat "$tmp/twice.err")"

# --- binary input refused by name, nothing left behind
mkdir "$tmp/bin"
printf 'Some text.\n' | gzip -c > "$tmp/bin/notes.txt.gz"
printf '\x28\xb5\x2f\xfd\x00\x58\x51\x00\x00' > "$tmp/bin/notes.zst"
printf 'Text, then\nbinary \x00\x01\x02 bytes.\n' > "$tmp/bin/nul.txt"
"$PY" -c "import sys; sys.stdout.buffer.write(('Le caf\u00e9 est tr\u00e8s \u00e9l\u00e9gant.\n' * 20).encode('latin-1'))" \
    > "$tmp/bin/latin1.txt"
printf 'A single stray \xe9 byte in UTF-8 text: caf\xc3\xa9.\n' > "$tmp/bin/stray.txt"
refused "gzip input" "$tmp/bin/notes.txt.gz" "gzip-compressed" "decompress it first" -- --input "$tmp/bin/notes.txt.gz"
refused "zstd input" "$tmp/bin/notes.zst" "zstd-compressed" -- --input "$tmp/bin/notes.zst"
refused "NUL bytes" "$tmp/bin/nul.txt" "NUL byte at byte offset 18 (line 2)" -- --input "$tmp/bin/nul.txt"
refused "Latin-1 text" "$tmp/bin/latin1.txt" "not UTF-8 text: 80 of its 520 bytes" -- --input "$tmp/bin/latin1.txt"
refused "a binary file inside a folder" "$tmp/bin/latin1.txt" -- --input "$tmp/mixed" "$tmp/bin"
prep_ok "one stray invalid byte" stray --input "$tmp/bin/stray.txt"
expect_stat "one stray invalid byte" stray .invalid_utf8_bytes 1
prep_ok "--include leaves binary files out" binok --input "$tmp/bin" --include 'stray.*'
expect_stat "--include leaves binary files out" binok '[.files, .left_out] | @tsv' "$(printf '1\t4')"

# --- --doc-per-file
mkdir "$tmp/perfile"
printf '\nChapter one.\n\nIts second paragraph.\r\n\n\n' > "$tmp/perfile/1.txt"
printf 'Chapter two, one line.\n' > "$tmp/perfile/2.txt"
printf '\n  \n' > "$tmp/perfile/3.txt"   # blank: no document
prep_ok "paragraphs" para --input "$tmp/perfile"
expect_stat "paragraphs (default)" para .documents 3
prep_ok "--doc-per-file" perfile-out --input "$tmp/perfile" --doc-per-file
expect_stat "--doc-per-file" perfile-out .documents 2
expect_docs "--doc-per-file" perfile-out '["Chapter one.\n\nIts second paragraph.","Chapter two, one line."]'

# --- --output's parents; a failed prep removes what it wrote
"$T" prep --input "$tmp/tree/a.txt" --output "$tmp/deep/er/out" --tokenizer "$tmp/tok.json" --quiet > /dev/null \
    2> "$tmp/err" || bad "prep to $tmp/deep/er/out exited $?: $(cat "$tmp/err")"
[ -f "$tmp/deep/er/out/index.ini" ] && "$T" data-check "$tmp/deep/er/out" --seq-len 4 > /dev/null 2>&1 \
    && echo "ok   --output a/b/c with a/b missing: created, data-check accepts it" || bad "--output with missing parents"
long=$(printf 'x%.0s' $(seq 300))   # a name longer than NAME_MAX: mkdir fails after $tmp/made/a is made
rc=0; "$T" prep --input "$tmp/tree/a.txt" --output "$tmp/made/a/$long/b" --tokenizer "$tmp/tok.json" --quiet \
    > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -eq 2 ] && grep -qF "cannot create output folder" "$tmp/err" && [ ! -e "$tmp/made" ] \
    && echo "ok   a parent that cannot be made: exit 2, the parents made are removed" \
    || bad "unmakeable parent: exit $rc, left: $(find "$tmp/made" 2>/dev/null | head -3 | tr '\n' ' '), $(cat "$tmp/err")"
printf 'x\n' > "$tmp/plainfile"
rc=0; "$T" prep --input "$tmp/tree/a.txt" --output "$tmp/plainfile/sub" --tokenizer "$tmp/tok.json" --quiet \
    > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -eq 2 ] && grep -qF "$tmp/plainfile exists and is not a folder" "$tmp/err" \
    && echo "ok   a parent that is a file: exit 2, named" || bad "parent is a file: exit $rc, $(cat "$tmp/err")"
# A tokenizer without an end-of-text token fails after tokenizer.json is copied.
"$PY" -c "
import json, sys
t = json.load(open(sys.argv[1]))
for a in t['added_tokens']:
    if a['content'] == '<|endoftext|>': a['content'] = '<|pad|>'
json.dump(t, open(sys.argv[2], 'w'))" "$tmp/tok.json" "$tmp/noeot.json"
rc=0; "$T" prep --input "$tmp/tree/a.txt" --output "$tmp/gone/x/y" --tokenizer "$tmp/noeot.json" --quiet \
    > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -eq 2 ] && grep -qF "no end-of-text token" "$tmp/err" && [ ! -e "$tmp/gone" ] \
    && echo "ok   a prep failing after writing leaves nothing" \
    || bad "failing prep: exit $rc, left: $(find "$tmp/gone" 2>/dev/null | tr '\n' ' '), $(cat "$tmp/err")"
mkdir "$tmp/empty"
rc=0; "$T" prep --input "$tmp/tree/a.txt" --output "$tmp/empty" --tokenizer "$tmp/noeot.json" --quiet \
    > /dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] && [ -d "$tmp/empty" ] && [ -z "$(ls -A "$tmp/empty")" ] \
    && echo "ok   an empty --output folder given stays, emptied" || bad "empty --output: exit $rc, $(ls -A "$tmp/empty")"

# --- a validation split too small for one global batch of the default config
gbs=$(sed -n 's/^global_batch_size *= *\([0-9]*\).*/\1/p' configs/tiny.ini)
seq=$(sed -n 's/^seq_len *= *\([0-9]*\).*/\1/p' configs/tiny.ini)
grep -q "configs/tiny.ini" scripts/run_default.sh || bad "scripts/run_default.sh no longer trains configs/tiny.ini"
"$PY" tests/e2e/lib/gen_corpus.py 0.2 5 > "$tmp/val.txt"
val_seqs() { # sequences of seq_len in the val split, from index.ini (dataset_open's count)
    awk -F' = ' -v s="$seq" '/^split = /{sp = $2} /^tokens = /{if (sp == "val") n += $2}
        END {print (n > 0 ? int((n - 1) / s) : 0)}' "$1/index.ini"
}
"$T" prep --input "$tmp/val.txt" --output "$tmp/small" --tokenizer "$tmp/tok.json" --quiet \
    > "$tmp/small.out" 2> "$tmp/small.err" || bad "prep with the default --val-fraction exited $?"
n=$(val_seqs "$tmp/small")
expect_stat "val split counts" small '[.val_seq_len, .val_sequences_needed, .val_sequences] | @tsv' \
    "$(printf '%s\t%s\t%s' "$seq" "$gbs" "$n")"
[ "$n" -lt "$gbs" ] || bad "the test corpus's default val split has $n >= $gbs sequences: make it smaller"
if grep -qF "the validation split holds $n sequences of seq_len $seq" "$tmp/small.err" \
    && grep -qF "global_batch_size = $gbs) of configs/tiny.ini" "$tmp/small.err"; then
    echo "ok   warned: $(grep warning "$tmp/small.err")"
else
    bad "no warning for $n validation sequences: $(cat "$tmp/small.err")"
fi
f=$(sed -n 's/.*--val-fraction \([0-9.e-]*\) (now.*/\1/p' "$tmp/small.err")
if [ -n "$f" ]; then
    "$T" prep --input "$tmp/val.txt" --output "$tmp/fits" --tokenizer "$tmp/tok.json" --val-fraction "$f" --quiet \
        > "$tmp/fits.out" 2> "$tmp/fits.err" || bad "prep with --val-fraction $f exited $?"
    n2=$(val_seqs "$tmp/fits")
    if [ "$n2" -ge "$gbs" ] && ! grep -q warning "$tmp/fits.err" && [ "$(stat_of "$tmp/fits.out" .val_sequences)" = "$n2" ]; then
        echo "ok   --val-fraction $f gives $n2 validation sequences, no warning"
    else
        bad "--val-fraction $f: $n2 sequences, stderr $(cat "$tmp/fits.err")"
    fi
else
    bad "the warning names no --val-fraction: $(cat "$tmp/small.err")"
fi
# A few validation tokens (< seq_len + 1): no validation sequence fits, so
# the default config trains without validation, with a note saying why and
# how to fix it, as for a split shorter than one batch (eval_every > 0 or not).
for i in $(seq 60); do printf 'Short document %d.\n\n' "$i"; done > "$tmp/short.txt"
"$T" prep --input "$tmp/short.txt" --output "$tmp/short" --tokenizer "$tmp/tok.json" --val-fraction 0.05 --quiet \
    > "$tmp/short.out" 2> "$tmp/short.err" || bad "prep of short documents exited $?"
vt=$(stat_of "$tmp/short.out" .val_tokens)
rc=0; "$T" data-check "$tmp/short" --seq-len "$seq" > "$tmp/dc.out" 2> "$tmp/dc.err" || rc=$?
if grep -qF "would train without validation (no validation sequence fits)" "$tmp/short.err" && [ $rc -eq 0 ] \
    && grep -qF "val: $vt tokens" "$tmp/dc.out" && grep -qF "0 sequences" "$tmp/dc.out" && [ "$vt" -gt 0 ] \
    && [ "$vt" -le "$seq" ]; then
    echo "ok   a val split of $vt < $((seq + 1)) tokens: warned that the default run has no validation; data-check opens it"
else
    bad "tiny val split: data-check exit $rc ($(cat "$tmp/dc.err")), prep stderr $(cat "$tmp/short.err")"
fi
for every in 0 1; do
    rc=0; "$T" train configs/tiny.ini data.path="$tmp/short" model.vocab_size=400 model.n_layers=1 \
        parallel.dp=1 train.global_batch_size=2 train.micro_batch_size=1 train.eval_every=$every train.steps=1 \
        train.warmup_steps=1 train.sample_every=0 log.run_dir="$tmp/run$every" > "$tmp/train$every.out" 2>&1 \
        || rc=$?
    note="note: no validation: the val split of $tmp/short holds $vt tokens, fewer than seq_len + 1 = $((seq + 1))"
    if [ $rc -eq 0 ] && { [ $every = 0 ] || { grep -qF "$note" "$tmp/train$every.out" \
        && grep -qF "re-run trident prep with a larger --val-fraction, or --val-fraction 0" "$tmp/train$every.out"; }; }; then
        echo "ok   trains on it with eval_every = $every$([ $every = 0 ] || echo ", the note says why and the fix")"
    else
        bad "train on a val split of $vt tokens, eval_every = $every: exit $rc: $(grep -v '^step' "$tmp/train$every.out" | head -5)"
    fi
done
# A train split that short is refused, saying how to fix it.
rc=0; "$T" data-check "$tmp/short" --seq-len 100000 > /dev/null 2> "$tmp/dc.err" || rc=$?
[ $rc -eq 2 ] && grep -qF "the train split holds" "$tmp/dc.err" && grep -qF "train with a shorter seq_len" "$tmp/dc.err" \
    && echo "ok   a train split shorter than seq_len + 1: exit 2, $(cat "$tmp/dc.err")" \
    || bad "short train split: exit $rc, $(cat "$tmp/dc.err")"
prep_ok "--val-fraction 0" noval --input "$tmp/val.txt"
grep -q warning "$tmp/noval.err" && bad "--val-fraction 0 (no validation asked) warned" || echo "ok   --val-fraction 0: no warning"

echo "prep_inputs: $failures failures"
[ "$failures" -eq 0 ]
