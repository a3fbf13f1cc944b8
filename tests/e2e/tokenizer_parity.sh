#!/usr/bin/env bash
# tokenizer_parity.sh: `trident tokenize` against Hugging Face `tokenizers`
# (live, in the .venv) on the KJV tokenizer (data/kjv-shards/tokenizer.json,
# else one trained here) varied one tokenizer.json field at a time: every
# normalizer trident implements (NFC, NFD, NFKC, NFKD through utf8proc, Strip,
# Prepend, Replace, Sequence), the pre-tokenizers (ByteLevel with and without
# add_prefix_space, Split, Sequence), the post-processors that change no id
# under add_special_tokens=False, and the added-token flags (lstrip/rstrip with
# Unicode whitespace, normalized true/false, special with and without
# --allow-special-tokens = HF's encode_special_tokens False/True). Includes
# issue 13's cases ("x\u00a0<mask>" -> [87, 4096], "[R]\u3000y" -> [4097, 88]
# on the KJV tokenizer). Every field value trident does not implement must be
# refused at load (exit 2) with a message naming the field and the value.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py tokenizers

BASE=data/kjv-shards/tokenizer.json
KJV=1
if [ ! -f "$BASE" ]; then # no corpus made: a small tokenizer of the same kind
    KJV=0
    BASE=$tmp/base.json
    "$TRIDENT" tokenize --train --vocab-size 600 --output "$BASE" < tests/reference/fixtures/tokenizer_corpus.txt \
        2> /dev/null || fail "training a base tokenizer exited $?"
fi

"$PY" - "$TRIDENT" "$BASE" "$tmp" "$KJV" <<'EOF'
import copy, json, subprocess, sys
from tokenizers import Tokenizer, AddedToken

trident, base_path, tmp, kjv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
base = json.load(open(base_path, encoding="utf-8"))
eot = next(a["content"] for a in base["added_tokens"] if a["special"])
n_base = max(max(base["model"]["vocab"].values()), max(a["id"] for a in base["added_tokens"])) + 1
failures = 0
n_checks = 0

def trident_ids(path, text, allow_special):
    args = [trident, "tokenize", "--tokenizer", path] + (["--allow-special-tokens"] if allow_special else [])
    p = subprocess.run(args, input=text.encode("utf-8"), capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"trident tokenize exited {p.returncode}: {p.stderr.decode()}")
    return [int(x) for x in p.stdout.split()]

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "caf\u00e9 cafe\u0301 \u212b \u00c5 A\u030a",            # composed / decomposed / singleton
    "\ufb01ne \u2460 \uff21\uff22 x\u00b2 \u2167",           # compatibility forms
    "  padded\u00a0\u3000 text \u2003 ",                      # Unicode whitespace
    "a" + eot + "b " + eot + " c",                          # special-token text
    "tab\there\nnew  line  \r\n end",
    "",
]

def check(name, tj, texts=TEXTS, both_special=True):
    """Encodes texts with HF and trident on tokenizer.json dict tj."""
    global failures, n_checks
    path = f"{tmp}/{name}.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    hf = Tokenizer.from_file(path)
    for allow in ([True, False] if both_special else [True]):
        hf.encode_special_tokens = not allow
        for t in texts:
            want = hf.encode(t, add_special_tokens=False).ids
            got = trident_ids(path, t, allow)
            n_checks += 1
            if got != want:
                failures += 1
                print(f"FAIL {name} allow_special={allow} {t!r}: HF {want} trident {got}")
    print(f"ok   {name}")

def with_field(**kw):
    tj = copy.deepcopy(base)
    tj.update(kw)
    return tj

# --- issue 13's cases: <mask> (lstrip) and [R] (rstrip) added as the next two ids
hf = Tokenizer.from_file(base_path)
hf.add_tokens([AddedToken("<mask>", lstrip=True), AddedToken("[R]", rstrip=True)])
hf.save(f"{tmp}/added.json")
added = json.load(open(f"{tmp}/added.json", encoding="utf-8"))
cases = {"x\u00a0<mask>": [87, n_base], "[R]\u3000y": [n_base + 1, 88]}
for text, want in cases.items():
    hf_ids = hf.encode(text, add_special_tokens=False).ids
    got = trident_ids(f"{tmp}/added.json", text, True)
    n_checks += 1
    if got != hf_ids or (kjv and hf_ids != want):
        failures += 1
        print(f"FAIL added lstrip/rstrip {text!r}: HF {hf_ids} (issue says {want}) trident {got}")
strip_texts = TEXTS + ["x\u00a0<mask>", "[R]\u3000y", "a \u2003\u00a0<mask>[R] \u3000 b", "<mask><mask>  [R][R]\u2028z",
                       "\u3000<mask>", "[R]\u3000"]
check("added_lstrip_rstrip", added, strip_texts)

# --- added-token flags one at a time
for flags in [dict(lstrip=True), dict(rstrip=True), dict(lstrip=True, rstrip=True), dict(normalized=True),
              dict(normalized=False), dict(special=True), dict(special=False)]:
    tj = copy.deepcopy(base)
    for tok, content in ((n_base, "<mask>"), (n_base + 1, "\u00c5x")):
        a = {"id": tok, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": True, "special": False}
        a.update(flags)
        tj["added_tokens"].append(a)
    tj["normalizer"] = {"type": "NFKC"}
    check("added_" + "_".join(f"{k}{int(v)}" for k, v in flags.items()), tj,
          strip_texts + ["A\u030ax \u00c5x \u212bx", " <mask> \u00c5x\u3000"])

# --- normalizers
for nz in [{"type": "NFC"}, {"type": "NFD"}, {"type": "NFKC"}, {"type": "NFKD"},
           {"type": "Strip", "strip_left": True, "strip_right": True},
           {"type": "Strip", "strip_left": False, "strip_right": True},
           {"type": "Prepend", "prepend": "\u2581"},
           {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
           {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Replace", "pattern": {"String": "e"},
                                                                    "content": "E"}, {"type": "NFC"}]}]:
    check("normalizer_" + nz["type"] + ("_" + str(len(json.dumps(nz))) if nz["type"] in ("Strip",) else ""),
          with_field(normalizer=nz))

# --- pre-tokenizers
bl = lambda prefix: {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": True}
check("pretok_bytelevel_prefix", with_field(pre_tokenizer=bl(True)))
check("pretok_bytelevel_noregex", with_field(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False,
                                                            "trim_offsets": True, "use_regex": False}))
check("pretok_split_sequence", with_field(pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}),
    TEXTS + ["12345 678 9", "abc1234def"])

# --- post-processors: none changes an id under add_special_tokens=False
for pp in [{"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
           {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": eot, "type_id": 0}},
                                                     {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {eot: {"id": eot, "ids": [n_base - 1 if kjv else 599], "tokens": [eot]}}},
           {"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                                "use_regex": True}]}]:
    check("post_" + pp["type"], with_field(post_processor=pp), TEXTS[:3], both_special=False)

# --- refused: exit 2 and a message naming the field and the value
def refused(name, tj, *needles):
    global failures, n_checks
    path = f"{tmp}/refused_{name}.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    p = subprocess.run([trident, "tokenize", "--tokenizer", path], input=b"x", capture_output=True)
    err = p.stderr.decode()
    n_checks += 1
    if p.returncode != 2 or not all(n in err for n in needles):
        failures += 1
        print(f"FAIL refused {name}: exit {p.returncode}, want 2 and {needles} in: {err.strip()}")
    else:
        print(f"ok   refused {name}: {err.strip()}")

refused("lowercase", with_field(normalizer={"type": "Lowercase"}), "normalizer", "Lowercase")
refused("seq_bert", with_field(normalizer={"type": "Sequence", "normalizers": [
    {"type": "NFC"}, {"type": "BertNormalizer", "clean_text": True}]}), "normalizer.normalizers[1]", "BertNormalizer")
refused("replace_regex", with_field(normalizer={"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}),
        "normalizer", "Replace", "Regex")
refused("metaspace", with_field(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581"}), "pre_tokenizer",
        "Metaspace")
refused("split_removed", with_field(pre_tokenizer={"type": "Split", "pattern": {"String": " "},
                                                   "behavior": "Removed", "invert": False}), "Split", "Removed")
refused("decoder", with_field(decoder={"type": "WordPiece", "prefix": "##", "cleanup": True}), "decoder", "WordPiece")
refused("post", with_field(post_processor={"type": "Bogus"}), "post_processor", "Bogus")
refused("truncation", with_field(truncation={"max_length": 8, "strategy": "LongestFirst", "stride": 0,
                                             "direction": "Right"}), "truncation")
refused("padding", with_field(padding={"strategy": "BatchLongest"}), "padding")
tj = copy.deepcopy(base)
tj["added_tokens"].append({"id": n_base, "content": "<w>", "single_word": True, "lstrip": False, "rstrip": False,
                           "normalized": False, "special": False})
refused("single_word", tj, "added_tokens[1].single_word", "<w>")
tj = copy.deepcopy(base)
tj["model"]["dropout"] = 0.1
refused("dropout", tj, "model.dropout")
tj = copy.deepcopy(base)
tj["model"]["byte_fallback"] = True
refused("byte_fallback", tj, "model.byte_fallback")

print(f"{n_checks} checks, {failures} failures")
sys.exit(1 if failures else 0)
EOF
echo "tokenizer_parity: ok"
