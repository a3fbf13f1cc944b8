#!/usr/bin/env bash
# chat_export.sh: a model trained on `prep --format chat --chat-template T`
# data and exported with `trident ckpt export --format hf` is served by
# transformers 4.46.3 in .venv-hf as it is, no patch (issue 28, acceptance 6),
# for T = llama3 (a Llama 3 structured tokenizer) and chatml (a Qwen2 one),
# tokenizers and conversations of tests/reference/chat_reference.py:
#  (a) tokenizer_config.json holds the template (chat_template, chosen from the
#      dataset's index.ini) and model_input_names [input_ids, attention_mask];
#      its eos_token and generation_config.json's eos_token_id are the
#      template's end token (<|eot_id|>, <|im_end|>), where the model's turn ends;
#  (b) AutoTokenizer.from_pretrained(export).apply_chat_template(conversation)
#      gives, for each of the 20 conversations, the ids of trident's prep of it
#      (the shards' documents);
#  (c) tok(prompt, return_tensors="pt") holds no token_type_ids and
#      model.generate(**tok(prompt, return_tensors="pt")) runs (greedy, 8 new
#      tokens), and so does generate on apply_chat_template(...,
#      add_generation_prompt=True, return_dict=True);
#  (d) `trident generate --chat` on the export, the template read from its
#      tokenizer_config.json, encodes a user message as the end-of-text id then
#      apply_chat_template([user], add_generation_prompt=True)'s ids, and so
#      it does when the folder's chat_template is another text writing
#      <|im_start|> (a Qwen model's own template);
#  (e) a tokenizer mismatch says where the run's tokenizer comes from: [data]
#      tokenizer naming another tokenizer than the data's (exit 2, the file
#      and "[data] tokenizer" named), and init_from the chatml model on data
#      of another tokenizer (exit 2, the data folder and its tokenizer.json
#      named).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy
HFPY="$PWD/.venv-hf/bin/python"
[ -x "$HFPY" ] && "$HFPY" -c "import importlib.util as u; assert u.find_spec('torch') and u.find_spec('transformers')" 2>/dev/null ||
    fail "$HFPY with torch and transformers missing: run make deps (it makes .venv-hf with tests/requirements-hf.txt)"
FIX=tests/reference/fixtures

# 8 copies of the 20 conversations: enough tokens for a few batches
for i in 1 2 3 4 5 6 7 8; do cat $FIX/chat_conversations.jsonl; done > "$tmp/convs.jsonl"
for t in llama3 chatml; do
    tok=$FIX/chat_llama3_tokenizer.json
    [ $t = chatml ] && tok=$FIX/chat_qwen2_tokenizer.json
    rm -rf "$tmp/shards"
    "$TRIDENT" prep --input "$tmp/convs.jsonl" --output "$tmp/shards" --format chat --chat-template $t \
        --tokenizer $tok --val-fraction 0 --quiet > /dev/null 2> "$tmp/err" || fail "$t: prep: $(cat "$tmp/err")"
    V=$(sed -n 's/^vocab_size = //p' "$tmp/shards/index.ini")
    small_train "$tmp/run-$t" "$tmp/ck-$t" 1 1 1 0 model.vocab_size="$V" model.max_seq_len=256 train.seq_len=128 \
        train.steps=1 train.warmup_steps=0 > "$tmp/log-$t" 2>&1 || { tail -20 "$tmp/log-$t"; fail "$t: training exited non-zero"; }
    cp -r "$tmp/shards" "$tmp/data-$t"
    "$TRIDENT" ckpt export "$tmp/ck-$t" "$tmp/hf-$t" --format hf --tokenizer "$tmp/data-$t" > /dev/null ||
        fail "$t: export"
    "$TRIDENT" generate "$tmp/hf-$t" --chat --json --max-new-tokens 4 --prompt "Say hi in Korean" \
        > "$tmp/gen-$t.json" 2> "$tmp/err" || fail "$t: trident generate --chat: $(cat "$tmp/err")"
    "$PY" - "$tmp/data-$t" > "$tmp/docs-$t.json" <<'PYEOF'
import glob, json, sys
import h5py
docs = []
for path in sorted(glob.glob(sys.argv[1] + "/shard-*.h5")):
    with h5py.File(path) as f:
        tk, off = f["tokens"][:], f["doc_offsets"][:]
        eot = int(f.attrs["eot_id"])
    docs += [tk[int(a):int(b) - 1].tolist() for a, b in zip(off[:-1], off[1:])]  # without the end-of-text id
print(json.dumps({"eot": eot, "docs": docs}))
PYEOF
done
"$HFPY" - "$tmp" $FIX/chat_conversations.jsonl <<'PYEOF' || fail "transformers on the exports"
import json, sys
import torch, transformers
from transformers import AutoTokenizer, LlamaForCausalLM
transformers.logging.set_verbosity_error()
tmp, convs_path = sys.argv[1:]
convs = [json.loads(l)["messages"] for l in open(convs_path)]
for t in ("llama3", "chatml"):
    hf, data, gen_path = f"{tmp}/hf-{t}", f"{tmp}/docs-{t}.json", f"{tmp}/gen-{t}.json"
    tc = json.load(open(hf + "/tokenizer_config.json"))
    marker = "<|start_header_id|>" if t == "llama3" else "<|im_start|>"
    assert marker in tc.get("chat_template", ""), f"(a) chat_template: {tc.get('chat_template')!r}"
    assert tc.get("model_input_names") == ["input_ids", "attention_mask"], tc.get("model_input_names")
    end = "<|eot_id|>" if t == "llama3" else "<|im_end|>"  # generation stops at the turn's end token
    gc = json.load(open(hf + "/generation_config.json"))
    assert tc.get("eos_token") == end, f"(a) eos_token {tc.get('eos_token')!r}"
    tok = AutoTokenizer.from_pretrained(hf)
    assert gc["eos_token_id"] in (tok.convert_tokens_to_ids(end), [tok.convert_tokens_to_ids(end)]), gc
    d = json.load(open(data))
    docs, eot = d["docs"], d["eot"]
    for i, c in enumerate(convs):  # (b)
        ids = tok.apply_chat_template(c, tokenize=True)
        assert ids == docs[i], f"(b) conversation {i}: apply_chat_template {ids[:12]}... trident {docs[i][:12]}..."
    model = LlamaForCausalLM.from_pretrained(hf)
    model.eval()
    enc = tok("Hello, world! The answer is", return_tensors="pt")  # (c)
    assert "token_type_ids" not in enc, sorted(enc.keys())
    out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1], out
    msg = [{"role": "user", "content": "Say hi in Korean"}]
    chat = tok.apply_chat_template(msg, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    out2 = model.generate(**chat, max_new_tokens=8, do_sample=False)
    want = tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True)  # (d)
    g = json.loads(open(gen_path).read().splitlines()[0])
    assert g["prompt_ids"] == [eot] + want, f"(d) trident generate --chat {g['prompt_ids']} HF [{eot}] + {want}"
    print(f"{t}: 20 conversations equal; generate(**tok(...)) -> {out.shape[1] - enc['input_ids'].shape[1]} new, "
          f"chat prompt {chat['input_ids'].shape[1]} ids -> {out2.shape[1] - chat['input_ids'].shape[1]} new; "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
PYEOF
cp -r "$tmp/hf-chatml" "$tmp/hf-own"
"$PY" -c 'import json, sys; p = sys.argv[1] + "/tokenizer_config.json"; c = json.load(open(p))
c["chat_template"] = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
json.dump(c, open(p, "w"))' "$tmp/hf-own"
"$TRIDENT" generate "$tmp/hf-own" --chat --json --max-new-tokens 4 --prompt "Say hi in Korean" > "$tmp/gen-own.json" ||
    fail "(d) generate --chat with a model's own template"
"$PY" -c 'import json, sys; a, b = (json.loads(open(p).readline())["prompt_ids"] for p in sys.argv[1:]); assert a == b, (a, b)' \
    "$tmp/gen-own.json" "$tmp/gen-chatml.json" || fail "(d) a model's own <|im_start|> template is not read as chatml"

# (e)
mismatch() { # WHAT PATTERN small_train args...: exit 2 and PATTERN in the output
    local what=$1 pat=$2 rc=0; shift 2
    small_train "$@" > "$tmp/out" 2>&1 || rc=$?
    [ $rc -eq 2 ] && grep -qF -- "$pat" "$tmp/out" || fail "(e) $what: exit $rc, $(grep -m1 -i "tokenizer\|error\|trident:" "$tmp/out")"
}
mismatch "[data] tokenizer" "the run's tokenizer is $FIX/chat_llama3_tokenizer.json ([data] tokenizer)" \
    "$tmp/runX" "$tmp/ckX" 1 1 1 0 model.vocab_size="$V" data.tokenizer=$FIX/chat_llama3_tokenizer.json
# the chatml data prepared with a tokenizer of the same vocabulary but no NFC
# normalizer (another identity), then init_from the chatml model
"$PY" -c 'import json, sys; t = json.load(open(sys.argv[1])); t["normalizer"] = None; json.dump(t, open(sys.argv[2], "w"))' \
    $FIX/chat_qwen2_tokenizer.json "$tmp/other.json"
rm -rf "$tmp/shards"
"$TRIDENT" prep --input "$tmp/convs.jsonl" --output "$tmp/shards" --format chat --chat-template chatml \
    --tokenizer "$tmp/other.json" --val-fraction 0 --quiet > /dev/null 2>&1 || fail "(e) prep with other.json"
mismatch "init_from" "the run's data: $tmp/shards, prepared with $tmp/shards/tokenizer.json" \
    "$tmp/runY" "$tmp/ckY" 1 1 1 0 model.vocab_size="$V" model.max_seq_len=256 model.init_from="$tmp/ck-chatml"
echo "chat_export: ok"
