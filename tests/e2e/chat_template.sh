#!/usr/bin/env bash
# chat_template.sh: `trident prep --format chat --chat-template llama3 | chatml`
# against transformers' apply_chat_template (issue 28, acceptance 3). The
# fixtures (tests/reference/chat_reference.py, .venv-hf) hold, for 20
# conversations (system prompts, 2 to 6 turns, Unicode), the ids that
# apply_chat_template gives with Llama 3.1 Instruct's template on a Llama 3
# structured tokenizer and with Qwen2.5 Instruct's (ChatML) on a Qwen2
# structured one, and the mask of the assistant contents and their end tokens
# from the tokens' character offsets. Checked here:
#  1. each document of the shards is those ids followed by the end-of-text id,
#     its /loss_mask that mask followed by 0, in input order, for both;
#     index.ini records the template;
#  2. refused with exit 2, naming the cause: --chat-template without --format
#     chat, an unknown template, a template whose special tokens the tokenizer
#     lacks (naming the token), a NUL character in a role, a content, a
#     prompt or a response (plain template too: "user\u0000x" is not "user").
# generate --chat's prompt and the export: tests/e2e/chat_export.sh.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
FIX=tests/reference/fixtures

for t in llama3 chatml; do
    tok=$FIX/chat_llama3_tokenizer.json
    [ $t = chatml ] && tok=$FIX/chat_qwen2_tokenizer.json
    "$TRIDENT" prep --input $FIX/chat_conversations.jsonl --output "$tmp/$t" --format chat --chat-template $t \
        --tokenizer $tok --val-fraction 0 --quiet > /dev/null 2> "$tmp/err" || fail "prep --chat-template $t: $(cat "$tmp/err")"
    grep -qx "chat_template = $t" "$tmp/$t/index.ini" || fail "$t: index.ini does not record the template"
    "$PY" - "$tmp/$t" $FIX/chat_${t}_expected.jsonl <<'PYEOF' || fail "prep --chat-template $t differs from apply_chat_template"
import glob, json, sys
import h5py, numpy as np
d, exp = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(exp)]
docs = []
for path in sorted(glob.glob(d + "/shard-*.h5")):
    with h5py.File(path) as f:
        t, m, off = f["tokens"][:], f["loss_mask"][:], f["doc_offsets"][:]
        eot = int(f.attrs["eot_id"])
    docs += [(t[a:b].tolist(), m[a:b].tolist()) for a, b in zip(off[:-1], off[1:])]
assert len(docs) == len(rows), f"{len(docs)} documents, {len(rows)} conversations"
for i, ((ids, mask), r) in enumerate(zip(docs, rows)):
    assert ids[-1] == eot and mask[-1] == 0, f"conversation {i}: does not end in an untrained end-of-text id"
    if ids[:-1] != r["ids"]:
        k = next((j for j, (a, b) in enumerate(zip(ids, r["ids"])) if a != b), min(len(ids) - 1, len(r["ids"])))
        sys.exit(f"conversation {i}: ids differ at {k}: trident {ids[k:k+6]} HF {r['ids'][k:k+6]}")
    if mask[:-1] != r["mask"]:
        k = next(j for j, (a, b) in enumerate(zip(mask, r["mask"])) if a != b)
        sys.exit(f"conversation {i}: mask differs at token {k} (id {ids[k]}): trident {mask[k]} expected {r['mask'][k]}")
print(f"{len(rows)} conversations, {sum(len(r['ids']) for r in rows)} ids and masks equal")
PYEOF
done

# 2. refusals
expect2() { # NEEDLE ARGS...: prep exits 2 and its stderr holds NEEDLE
    local needle=$1; shift
    local rc=0
    rm -rf "$tmp/bad"
    "$TRIDENT" prep --output "$tmp/bad" --val-fraction 0 --quiet "$@" > /dev/null 2> "$tmp/err" || rc=$?
    [ $rc -eq 2 ] || fail "prep $*: exit $rc, expected 2: $(cat "$tmp/err")"
    grep -qF -- "$needle" "$tmp/err" || fail "prep $*: message lacks '$needle': $(cat "$tmp/err")"
    [ ! -e "$tmp/bad/index.ini" ] || fail "prep $*: wrote a dataset"
}
L3=$FIX/chat_llama3_tokenizer.json
Q2=$FIX/chat_qwen2_tokenizer.json
expect2 "--chat-template needs --format chat" --input $FIX/chat_conversations.jsonl --tokenizer $L3 --chat-template llama3
expect2 "'jinja'" --input $FIX/chat_conversations.jsonl --tokenizer $L3 --format chat --chat-template jinja
expect2 "<|im_start|>" --input $FIX/chat_conversations.jsonl --tokenizer $L3 --format chat --chat-template chatml
expect2 "<|begin_of_text|>" --input $FIX/chat_conversations.jsonl --tokenizer $Q2 --format chat --chat-template llama3
i=0
for line in '{"messages": [{"role": "user\u0000x", "content": "hi"}, {"role": "assistant", "content": "yo"}]}' \
            '{"messages": [{"role": "user", "content": "h\u0000i"}, {"role": "assistant", "content": "yo"}]}' \
            '{"prompt": "a\u0000", "response": "b"}' '{"prompt": "a", "response": "\u0000b"}'; do
    i=$((i + 1))
    printf '%s\n{"prompt": "ok", "response": "fine"}\n' "$line" > "$tmp/nul$i.jsonl"
    for t in plain llama3; do
        expect2 "NUL character" --input "$tmp/nul$i.jsonl" --tokenizer $L3 --format chat --chat-template $t
    done
done
expect2 "messages[0].role holds a NUL" --input "$tmp/nul1.jsonl" --tokenizer $L3 --format chat
echo "chat_template: ok"
