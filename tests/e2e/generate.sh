#!/usr/bin/env bash
# generate.sh: `trident generate` (one process, no mpirun) on the weights of a
# small run trained on 2 ranks (dp = 2, untied) and of its Hugging Face export:
#  (a) greedy: its continuation of the first token of the training log's
#      temperature-0 sample (the sampler starts at end-of-text, as generate's
#      prompts do) spells that sample, 32 tokens;
#  (b) the checkpoint and its HF export give identical --json lines, and so
#      does a second run (deterministic; temperature 0.8, top-k 20, a seed too);
#      --no-kv-cache draws the cache's ids at --top-p 0.01, other ids at 1;
#      (b2) --json lines are valid JSON for a prompt of invalid UTF-8 (exact
#      prompt ids, U+FFFD in "prompt") and for sampled texts of lone bytes;
#  (c) independent: every --json line, with --chat too, is the greedy
#      continuation of a float64 numpy forward of the exported folder
#      (tests/e2e/lib/hf_check.py generate); --chat's prompt ids are HF
#      tokenizers' encoding of "User: P\nAssistant:" after end-of-text;
#  (d) refused with exit 2 naming the file, key or value: a missing folder, a
#      checkpoint outside a run folder without --tokenizer, another tokenizer than the checkpoint's,
#      a tokenizer with more ids than the model's vocab_size, an empty prompt,
#      a prompt + --max-new-tokens beyond max_seq_len, a prompt that leaves no
#      room for one new token (too long by K = ids - (max_seq_len - 1)), a
#      --prompts line without "prompt";
#  (e) `trident import` of the export: a weights-only checkpoint that ckpt
#      verify accepts and ckpt info names so, that generates what the folder
#      does, that a resume refuses (exit 2, naming model.init_from, the
#      checkpoint unchanged) and init_from starts from; such a run first
#      measures the validation loss of the weights it starts from (step 0);
#      generate from its checkpoint takes the tokenizer from its run folder,
#      and so does ckpt export --format hf without --tokenizer.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py numpy tokenizers
small_dataset "$tmp"
small_train "$tmp/run" "$tmp/ck" 1 1 2 0 model.tie_embeddings=false train.steps=40 \
    train.sample_every=40 train.sample_temperature=0 train.sample_tokens=32 > "$tmp/log" 2>&1 ||
    { tail -20 "$tmp/log"; fail "training exited non-zero"; }
"$TRIDENT" ckpt export "$tmp/ck" "$tmp/hf" --format hf --tokenizer "$tmp/shards" > /dev/null ||
    fail "hf export"
gen() { "$TRIDENT" generate "$@"; }

# (a) the sample's first token as the prompt, decoded by HF tokenizers
sample=$(grep -a "| sample (" "$tmp/log" | tail -1 | sed 's/.*| sample ([0-9]* tokens, [0-9.]* s): //')
[ -n "$sample" ] || fail "(a) no sample line in the training log"
first=$("$PY" - "$tmp/hf/tokenizer.json" "$sample" <<'PY'
import sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
ids = tok.encode(sys.argv[2]).ids
t = tok.decode(ids[:1])
assert tok.encode(t).ids == ids[:1], f"{t!r} does not encode back to {ids[:1]}"
print(t, end="")
PY
) || fail "(a) the sample's first token"
gen "$tmp/ck" --tokenizer "$tmp/shards" --prompt "$first" --max-new-tokens 31 --json > "$tmp/a.jsonl" ||
    fail "(a) generate exited non-zero"
got=$(jq -j '.prompt + .text + (if .ended then " <|endoftext|>" else "" end)' "$tmp/a.jsonl")
[ "$got" = "$sample" ] || fail "(a) generate: '$got', the training sampler: '$sample'"
echo "(a) generate's greedy continuation of '$first' equals the training log's temperature-0 sample"

# (b) checkpoint = HF folder (its own tokenizer.json), and a second run
prompts=(--prompt "And God said" --prompt "the LORD" --prompt "Where is it written: In the beginning")
gen "$tmp/ck" --tokenizer "$tmp/shards" "${prompts[@]}" --max-new-tokens 24 --json > "$tmp/ck.jsonl" ||
    fail "(b) generate from the checkpoint"
gen "$tmp/hf" "${prompts[@]}" --max-new-tokens 24 --json > "$tmp/hf.jsonl" || fail "(b) generate from the HF folder"
gen "$tmp/hf" "${prompts[@]}" --max-new-tokens 24 --json > "$tmp/hf2.jsonl" || fail "(b) second run"
cmp "$tmp/ck.jsonl" "$tmp/hf.jsonl" || fail "(b) checkpoint and HF export differ: $(diff "$tmp/ck.jsonl" "$tmp/hf.jsonl")"
cmp "$tmp/hf.jsonl" "$tmp/hf2.jsonl" || fail "(b) two greedy runs differ"
[ "$(wc -l < "$tmp/hf.jsonl")" -eq 3 ] || fail "(b) $(wc -l < "$tmp/hf.jsonl") lines for 3 prompts"
samp=(--temperature 0.8 --top-k 20 --seed 7 --max-new-tokens 16 --json)
gen "$tmp/hf" "${prompts[@]}" "${samp[@]}" > "$tmp/s1.jsonl" && gen "$tmp/ck" --tokenizer "$tmp/shards" \
    "${prompts[@]}" "${samp[@]}" > "$tmp/s2.jsonl" || fail "(b) sampled runs"
cmp "$tmp/s1.jsonl" "$tmp/s2.jsonl" || fail "(b) sampled runs with one seed differ"
gen "$tmp/hf" --prompt "And God said" --max-new-tokens 8 | grep -q "^\[1\] prompt: And God said" ||
    fail "(b) text output"
# --no-kv-cache samples as the cache does, top-p included (it ignored --top-p):
# at temperature 1 with --top-p 0.01 the same ids, and not those of --top-p 1
ids_of() { jq -c .ids "$1"; }
nuc=("${prompts[@]}" --temperature 1 --seed 3 --max-new-tokens 16 --json)
gen "$tmp/hf" "${nuc[@]}" --top-p 0.01 > "$tmp/p1.jsonl" &&
    gen "$tmp/hf" "${nuc[@]}" --top-p 0.01 --no-kv-cache > "$tmp/p2.jsonl" &&
    gen "$tmp/hf" "${nuc[@]}" --top-p 1 --no-kv-cache > "$tmp/p3.jsonl" 2> "$tmp/err" ||
    fail "(b) --top-p runs: $(cat "$tmp/err")"
[ "$(ids_of "$tmp/p1.jsonl")" = "$(ids_of "$tmp/p2.jsonl")" ] ||
    fail "(b) --top-p 0.01: the cache drew $(ids_of "$tmp/p1.jsonl"), --no-kv-cache $(ids_of "$tmp/p2.jsonl")"
[ "$(ids_of "$tmp/p2.jsonl")" != "$(ids_of "$tmp/p3.jsonl")" ] ||
    fail "(b) --no-kv-cache: --top-p 0.01 and 1 drew the same ids"
echo "(b) checkpoint and HF folder: identical greedy and seeded outputs, twice; --top-p without the cache too"

# (b2) --json is valid JSON (UTF-8) for any bytes: a prompt of invalid UTF-8
# (it crashed: jansson refused the string) keeps its exact ids (the byte-level
# tokens of "caf\xe9") and shows U+FFFD; near-uniform draws (temperature 50)
# emit lone bytes >= 0x80, and each line's text is its ids' bytes with each
# invalid byte and control byte but tab and newline as U+FFFD (a check in Python)
gen "$tmp/hf" --prompt $'caf\xe9' --prompt $'x\xff\xfey' --max-new-tokens 4 --json > "$tmp/u.jsonl" 2> "$tmp/err" ||
    fail "(b2) --json with an invalid UTF-8 prompt: exit $?, $(cat "$tmp/err")"
gen "$tmp/hf" "${prompts[@]}" --temperature 50 --seed 1 --max-new-tokens 40 --json >> "$tmp/u.jsonl" ||
    fail "(b2) temperature 50"
"$PY" - "$tmp/hf/tokenizer.json" "$tmp/u.jsonl" <<'PY' || fail "(b2) --json of invalid UTF-8"
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
# byte-level BPE's byte <-> character table (GPT-2's bytes_to_unicode)
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
rest = [b for b in range(256) if b not in bs]
cs = bs + [256 + n for n in range(len(rest))]
bs = bs + rest
byte_of = {chr(c): b for b, c in zip(bs, cs)}
def raw(ids):
    return bytes(byte_of[ch] for i in ids for ch in tok.id_to_token(i))
def clean(b):  # one U+FFFD per invalid byte and per control byte but \t \n
    out, i = [], 0
    while i < len(b):
        for k in (1, 2, 3, 4):
            try:
                ch = b[i:i + k].decode("utf-8")
                break
            except UnicodeDecodeError:
                ch = None
        if ch is None or (k == 1 and (ord(ch) < 0x20 or ord(ch) == 0x7F) and ch not in "\t\n"):
            out.append("\ufffd"); i += 1
        else:
            out.append(ch); i += k
    return "".join(out)
lines = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8", errors="strict")]
assert len(lines) == 5, len(lines)
for g, want in zip(lines, [b"caf\xe9", b"x\xff\xfey"]):
    assert raw(g["prompt_ids"][1:]) == want, (g["prompt_ids"], want)
    assert g["prompt"] == clean(want), g["prompt"]
invalid = 0
for g in lines:
    b = raw(g["ids"])
    assert g["text"] == clean(b), (g["text"], clean(b))
    try: b.decode("utf-8")
    except UnicodeDecodeError: invalid += 1
assert invalid, "no line drew invalid UTF-8: the check is idle"
print(f"(b2) --json: valid UTF-8 prompts and texts for invalid bytes ({invalid} of 5 lines drew some)")
PY

# (c) numpy float64 on the folder; --chat from a --prompts file
printf '%s\n' '{"prompt": "In the beginning", "response": "Genesis 1:1"}' '{"prompt": "And it came to pass"}' > "$tmp/p.jsonl"
gen "$tmp/hf" --prompts "$tmp/p.jsonl" --chat --max-new-tokens 12 --json > "$tmp/chat.jsonl" ||
    fail "(c) --chat --prompts"
jq -se 'map(select(.prompt == "In the beginning"))[0].expected == "Genesis 1:1"' "$tmp/chat.jsonl" > /dev/null ||
    fail "(c) the expected answer of a --prompts line"
"$PY" - "$tmp/hf" "$tmp/chat.jsonl" <<'PY' || fail "(c) --chat prompt ids"
import json, sys
from tokenizers import Tokenizer
d = sys.argv[1]
tok = Tokenizer.from_file(d + "/tokenizer.json")
eos = json.load(open(d + "/config.json"))["eos_token_id"]
for l in open(sys.argv[2]):
    g = json.loads(l)
    want = [eos] + tok.encode("User: " + g["prompt"] + "\nAssistant:").ids
    assert g["prompt_ids"] == want, f"{g['prompt_ids']} != {want}"
print("--chat prompt ids = HF tokenizers' encoding of the template")
PY
cat "$tmp/hf.jsonl" "$tmp/chat.jsonl" > "$tmp/all.jsonl"
"$PY" tests/e2e/lib/hf_check.py generate "$tmp/hf" "$tmp/all.jsonl" || fail "(c) numpy greedy decoding"

# (d) bad inputs
refused() { # refused WHAT PATTERN CMD...
    local what=$1 pat=$2 rc=0; shift 2
    "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "$pat" "$tmp/err" || fail "(d) $what: rc $rc, $(cat "$tmp/err")"
}
refused "missing folder" "$tmp/nope: no such folder" gen "$tmp/nope" --prompt x
refused "checkpoint without --tokenizer" "give --tokenizer" gen "$tmp/ck" --prompt x
"$TRIDENT" tokenize --train --vocab-size 600 --output "$tmp/big.json" < "$tmp/small.txt" > /dev/null 2>&1 ||
    fail "(d) training a 600-id tokenizer"
refused "another tokenizer" "big.json: tokenizer .*trained with" gen "$tmp/ck" --tokenizer "$tmp/big.json" --prompt x
cp -r "$tmp/hf" "$tmp/hfbig" && cp "$tmp/big.json" "$tmp/hfbig/tokenizer.json"
refused "vocab mismatch" "hfbig/tokenizer.json: 600 token ids, more than the model's vocab_size = 510" \
    gen "$tmp/hfbig" --prompt x
refused "empty prompt" "prompt 2 is empty" gen "$tmp/hf" --prompt x --prompt ""
refused "too long" "exceed the model's max_seq_len = 64" gen "$tmp/hf" --prompt "And God said" --max-new-tokens 62
long=$(printf 'And God said, Let there be light. %.0s' $(seq 12))
refused "prompt too long by itself" "the prompt itself is too long by [0-9]* tokens for the window of max_seq_len 64" \
    gen "$tmp/hf" --prompt "$long" --max-new-tokens 1
# K = ids - 63: one new token needs a place in the window
sed -n 's/.*: \([0-9]*\) ids (end-of-text included): the prompt itself is too long by \([0-9]*\) tokens.*/\1 \2/p' "$tmp/err" |
    awk '{ ok = $1 > 64 && $2 == $1 - 63; n++ } END { exit !(n == 1 && ok) }' || fail "(d) prompt too long: $(cat "$tmp/err")"
echo '{"text": "x"}' > "$tmp/bad.jsonl"
refused "--prompts without prompt" "bad.jsonl:1: expected an object with a string \"prompt\"" \
    gen "$tmp/hf" --prompts "$tmp/bad.jsonl"
refused "bad --temperature" "--temperature '-1': expected a number >= 0" gen "$tmp/hf" --prompt x --temperature -1
echo "(d) bad inputs refused with exit 2"

# (e) `trident import` writes a weights-only checkpoint: verify and info say so
# (exit 0), generate from it equals the folder's, a resume from it is refused
# with exit 2 naming model.init_from and leaves it unchanged.
"$TRIDENT" import "$tmp/hf" "$tmp/ckI" > /dev/null || fail "(e) import"
"$TRIDENT" ckpt verify "$tmp/ckI" > "$tmp/out" 2>&1 && grep -q "weights only (use as model.init_from)" "$tmp/out" ||
    fail "(e) ckpt verify of the import: $(cat "$tmp/out")"
"$TRIDENT" ckpt info "$tmp/ckI" | grep -q "weights only (use as model.init_from)" || fail "(e) ckpt info"
gen "$tmp/ckI" --tokenizer "$tmp/shards" "${prompts[@]}" --max-new-tokens 24 --json > "$tmp/imp.jsonl" ||
    fail "(e) generate from the import"
cmp "$tmp/imp.jsonl" "$tmp/hf.jsonl" || fail "(e) the import generates otherwise than its folder"
# (less the run lock, run_folder_lock, which each start takes in its checkpoint folder)
before=$(cd "$tmp/ckI" && find . -type f ! -name .trident.lock -exec md5sum {} + | sort)
rc=0; small_train "$tmp/runI" "$tmp/ckI" 1 1 1 0 model.tie_embeddings=false train.steps=2 train.warmup_steps=1 > "$tmp/logI" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "weights only .*model.init_from = $tmp/ckI/step-000000" "$tmp/logI" ||
    { tail -3 "$tmp/logI"; fail "(e) resume from the import: rc $rc"; }
[ "$(cd "$tmp/ckI" && find . -type f ! -name .trident.lock -exec md5sum {} + | sort)" = "$before" ] || fail "(e) the refused resume changed the import"
# init_from it, one step at lr 1e-30 (no FP32 weight changes): the validation
# loss measured before training (step 0) is that of the weights after step 1,
# and far below a fresh model's (ln 510 = 6.2).
timeout 120 "${MPIRUN[@]}" -np 1 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" train.global_batch_size=16 \
    log.run_dir="$tmp/runJ" checkpoint.dir="$tmp/runJ/checkpoints" model.tie_embeddings=false train.steps=1 train.warmup_steps=0 \
    train.lr=1e-30 train.min_lr=1e-30 train.eval_every=1 train.eval_steps=2 model.init_from="$tmp/ckI" \
    > "$tmp/logJ" 2>&1 || { tail -3 "$tmp/logJ"; fail "(e) init_from the import"; }
jq -se 'map(select(has("val_loss"))) | length == 2 and .[0].step == 0 and .[1].step == 1 and
        .[0].val_loss == .[1].val_loss and .[0].val_loss < 5' "$tmp/runJ/metrics.jsonl" > /dev/null ||
    fail "(e) the step-0 validation of init_from weights: $(jq -c 'select(has("val_loss"))' "$tmp/runJ/metrics.jsonl")"
# Its checkpoint inside its run folder: generate finds the tokenizer in the run's config.ini.
gen "$tmp/runJ/checkpoints" --prompt "And God said" --max-new-tokens 8 --json > "$tmp/j1.jsonl" ||
    fail "(e) generate without --tokenizer from a run folder's checkpoint"
gen "$tmp/runJ/checkpoints" --tokenizer "$tmp/shards" --prompt "And God said" --max-new-tokens 8 --json \
    > "$tmp/j2.jsonl" && cmp "$tmp/j1.jsonl" "$tmp/j2.jsonl" || fail "(e) the run folder's tokenizer differs"
# ckpt export without --tokenizer finds it the same way: the run's tokenizer.json.
"$TRIDENT" ckpt export "$tmp/runJ/checkpoints" "$tmp/hfJ" --format hf > /dev/null || fail "(e) export without --tokenizer"
cmp "$tmp/shards/tokenizer.json" "$tmp/hfJ/tokenizer.json" || fail "(e) export from a run folder: not the run's tokenizer"
jq -e '.eos_token_id != null and .bos_token_id != null' "$tmp/hfJ/config.json" > /dev/null || fail "(e) export: no bos/eos ids"
echo "(e) import: weights only, verified, generates as its folder; resume refused; init_from it: validation loss $(jq -sr 'map(select(has("val_loss")) | "\(.val_loss) at step \(.step)") | join(", ")' "$tmp/runJ/metrics.jsonl")"
echo "PASS"
