#!/usr/bin/env bash
# tokenizer_hf.sh: `trident tokenize --train` writes a tokenizer.json that
# Hugging Face tokenizers loads and encodes to the same ids as
# `trident tokenize`; --decode inverts encode; bad arguments exit 2.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py tokenizers
FIX=tests/reference/fixtures

"$TRIDENT" tokenize --train --vocab-size 512 --output "$tmp/tok.json" < $FIX/tokenizer_corpus.txt \
    || fail "training exited $?"
"$TRIDENT" tokenize --tokenizer "$tmp/tok.json" --allow-special-tokens < $FIX/tokenizer_test_text.txt > "$tmp/ids.txt" \
    || fail "encode exited $?"
[ "$(wc -w < "$tmp/ids.txt")" -gt 100 ] || fail "encode gave too few ids: $(wc -w < "$tmp/ids.txt")"

"$PY" - "$tmp/tok.json" $FIX/tokenizer_test_text.txt "$tmp/ids.txt" <<'EOF' || fail "HF check failed"
import sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8", newline="").read()
ours = [int(x) for x in open(sys.argv[3]).read().split()]
hf = tok.encode(text).ids
assert tok.get_vocab_size() == 512, tok.get_vocab_size()
assert tok.token_to_id("<|endoftext|>") == 511, tok.token_to_id("<|endoftext|>")
assert 511 in hf, "special token not matched"
if hf != ours:
    i = next((k for k, (a, b) in enumerate(zip(hf, ours)) if a != b), min(len(hf), len(ours)))
    sys.exit(f"ids differ at {i}: HF {hf[i:i+5]} trident {ours[i:i+5]} ({len(hf)} vs {len(ours)} ids)")
assert tok.decode(hf, skip_special_tokens=False) == text
print(f"HF and trident agree on {len(hf)} ids")
EOF

"$TRIDENT" tokenize --tokenizer "$tmp/tok.json" --decode < "$tmp/ids.txt" > "$tmp/back.txt" || fail "decode exited $?"
cmp -s "$tmp/back.txt" $FIX/tokenizer_test_text.txt || fail "decode(encode(text)) != text"
printf 'a\x80b \xff\xfe  x\xe6\x97' > "$tmp/bad_utf8"
"$TRIDENT" tokenize --tokenizer "$tmp/tok.json" < "$tmp/bad_utf8" \
    | "$TRIDENT" tokenize --tokenizer "$tmp/tok.json" --decode > "$tmp/bad_back" || fail "invalid UTF-8 pipeline"
cmp -s "$tmp/bad_utf8" "$tmp/bad_back" || fail "invalid UTF-8 does not round-trip"

expect_exit2() { # expect_exit2 NEEDLE ARGS...: exit 2 and a message containing NEEDLE
    local needle=$1; shift
    local rc=0
    "$TRIDENT" tokenize "$@" < /dev/null > /dev/null 2> "$tmp/err" || rc=$?
    [ $rc -eq 2 ] || fail "tokenize $* exited $rc, expected 2"
    grep -qF -- "$needle" "$tmp/err" || fail "tokenize $*: message lacks '$needle': $(cat "$tmp/err")"
}
expect_exit2 /nonexistent.json --tokenizer /nonexistent.json
echo '{"model": ' > "$tmp/garbled.json"
expect_exit2 "$tmp/garbled.json" --tokenizer "$tmp/garbled.json"
expect_exit2 --bogus --bogus
expect_exit2 "'12x'" --train --vocab-size 12x --output "$tmp/x.json"
expect_exit2 --tokenizer
rc=0; echo "5 99999" | "$TRIDENT" tokenize --tokenizer "$tmp/tok.json" --decode > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -eq 2 ] && grep -q 99999 "$tmp/err" || fail "decode of id 99999: $(cat "$tmp/err")"
rc=0; echo "5 abc" | "$TRIDENT" tokenize --tokenizer "$tmp/tok.json" --decode > /dev/null 2> "$tmp/err" || rc=$?
[ $rc -eq 2 ] && grep -q "'abc'" "$tmp/err" || fail "decode of 'abc': $(cat "$tmp/err")"
echo "tokenizer_hf: ok"
