#!/usr/bin/env bash
# hf_qwen3moe.sh: Hugging Face Qwen3MoeForCausalLM folders (Qwen3-30B-A3B's and
# Qwen3-235B-A22B's class) in and out of trident, against transformers 4.51.3's
# own results: the fixture tests/reference/fixtures/hf_families/qwen3_moe (made
# once by tests/reference/qwen3moe_reference.py; .venv-hf's 4.46.3 has no
# Qwen3-MoE): q/k norms, head_dim 16 != 32 / 4, no biases, 3 layers with
# mlp_only_layers [0] (a dense first layer), 8 experts of 16, top-2,
# norm_topk_prob true, no shared expert, untied.
#  (a) `trident ckpt logits` of the folder: logits at 72 positions within 1e-5
#      relative of transformers', and every sparse layer's top-2 experts of
#      every token equal to transformers' router choices;
#  (b) config.json variants (rope_theta, norm_topk_prob false, rms_norm_eps):
#      trident's logits equal transformers' for each (24 positions);
#  (c) `trident generate --temperature 0 --json`, with the key/value cache and
#      with --no-kv-cache: transformers' prompt ids and its 32 greedy ids;
#  (d) a generation_config.json eos list [E, greedy[4]] stops generation
#      before greedy[4], of the folder and of its import;
#  (e) import -> `ckpt export --format hf`: config.json names
#      Qwen3MoeForCausalLM / qwen3_moe with the fixture's MoE keys, every
#      tensor of the export equals the folder's (same names: per-expert
#      mlp.experts.E.*, no shared expert) and its logits are (a)'s;
#  (f) `model.init_from` of the folder in ep 2 (each rank reading its experts'
#      rows) trains a step at lr 1e-30 with a finite loss far from ln(V) (the
#      folder's weights, not a fresh init); the run's export is the folder again
#      (tensors equal, Qwen3MoeForCausalLM);
#  (g) refusals, exit 2 naming the config.json key: shared_expert_intermediate_size
#      64 (the class has no shared expert), attention_bias true, an acting
#      sliding window, mlp_only_layers [1] (a dense layer after a sparse one),
#      num_experts_per_tok 9 of 8; and `ckpt export --format hf` of a trident
#      MoE model with q/k norms and a shared expert exits 2 naming
#      Qwen3MoeForCausalLM and the shared expert, writing nothing.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py numpy
FIX=tests/reference/fixtures/hf_families
d=$FIX/qwen3_moe w=$tmp/q
check="$PY tests/e2e/lib/hf_families_check.py"
mkdir "$w"
hf_fixture_logits "$d" "$w" "" # (a), (b)
# (c)
gen=(--prompt "In the beginning" --max-new-tokens 32 --temperature 0 --json)
"$TRIDENT" generate "$d" "${gen[@]}" > "$w/gen.jsonl" 2> "$tmp/err" || fail "(c) generate: $(cat "$tmp/err")"
grep -q "(key/value cache" "$tmp/err" || fail "(c) generate did not use the key/value cache: $(cat "$tmp/err")"
"$TRIDENT" generate "$d" "${gen[@]}" --no-kv-cache > "$w/gen-nokv.jsonl" || fail "(c) generate --no-kv-cache"
# (d)
cp "$d"/config.json "$d"/tokenizer.json "$w/stop/" && ln -s "$PWD/$d/model.safetensors" "$w/stop/"
"$TRIDENT" generate "$w/stop" "${gen[@]}" > "$w/stop.jsonl" || fail "(d) generate"
# (e)
"$TRIDENT" import "$w/stop" "$w/ck" > /dev/null || fail "(e) import"
"$TRIDENT" generate "$w/ck" "${gen[@]}" > "$w/stopck.jsonl" || fail "(d) generate of the import"
"$TRIDENT" ckpt export "$w/ck" "$w/hf" --format hf > /dev/null || fail "(e) export"
"$TRIDENT" ckpt logits "$w/hf" --tokens "$w/tokens.txt" --out "$w/logits-hf.safetensors" > /dev/null ||
    fail "(e) ckpt logits of the export"
$check check "$d" "$w" || fail "see above"
# (f)
awk 'NR <= 400' tests/reference/fixtures/tokenizer_corpus.txt > "$tmp/text.txt"
"$TRIDENT" prep --input "$tmp/text.txt" --output "$tmp/shards" --tokenizer "$FIX/tokenizer.json" \
    --val-fraction 0 > /dev/null 2>&1 || fail "(f) prep with the fixtures' tokenizer"
# shellcheck disable=SC2046
small_train "$w/run" "$w/ckI" 1 1 2 0 $(cat "$w/keys.txt") parallel.ep=2 model.init_from="$PWD/$d" \
    train.steps=1 train.lr=1e-30 train.min_lr=1e-30 train.warmup_steps=0 train.seq_len=32 \
    > "$w/logI" 2>&1 || { grep -m3 trident "$w/logI"; fail "(f) init_from in ep 2"; }
"$TRIDENT" ckpt export "$w/ckI" "$w/hfI" --format hf > /dev/null || fail "(f) export of the run"
# (a) router choices, (e) and (f) tensors and config.json, (f) the loss
$PY - "$d" "$w" <<'EOF' || fail "see above"
import json, math, sys
import numpy as np
d, w = sys.argv[1], sys.argv[2]
exec(open("tests/e2e/lib/hf_families_check.py").read().split("\ncmd = ")[0])  # load_st
bad = []
ref, got = load_st(f"{d}/reference.safetensors"), load_st(f"{w}/logits.safetensors")
want_topk = ref["topk"].astype(np.int32)                 # (layers, tokens, 2)
have_topk = got["moe_topk"][0]                           # (layers, tokens, 2)
if have_topk.shape != want_topk.shape or not np.array_equal(np.sort(have_topk, -1), np.sort(want_topk, -1)):
    bad.append(f"(a) router choices differ from transformers' "
               f"({int((np.sort(have_topk, -1) != np.sort(want_topk, -1)).sum())} of {want_topk.size})")
else:
    print(f"(a) {want_topk.shape[0]} sparse layers x {want_topk.shape[1]} tokens: top-2 experts = transformers'")
lhf = load_st(f"{w}/logits-hf.safetensors")["logits"].astype(np.float64)
want = ref["logits"].astype(np.float64)
rel = np.linalg.norm(lhf - want) / np.linalg.norm(want)
if not (lhf.shape == want.shape and rel < 1e-5):
    bad.append(f"(e) the export's logits differ from transformers' ({rel:.2e})")
else:
    print(f"(e) the export's logits: relative error {rel:.2e}")
orig = load_st(f"{d}/model.safetensors")
cfg = json.load(open(f"{d}/config.json"))
for name in ("hf", "hfI"):
    c = json.load(open(f"{w}/{name}/config.json"))
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
              "mlp_only_layers", "head_dim", "intermediate_size", "tie_word_embeddings"):
        if c.get(k) != cfg[k]:
            bad.append(f"{name}: config.json {k} = {c.get(k)}, the folder's {cfg[k]}")
    if c["architectures"] != ["Qwen3MoeForCausalLM"] or c["model_type"] != "qwen3_moe":
        bad.append(f"{name}: architectures {c['architectures']}, model_type {c['model_type']}")
    if c.get("attention_bias") is not False or "shared_expert_intermediate_size" in c:
        bad.append(f"{name}: attention_bias {c.get('attention_bias')}, shared expert key present")
    e = load_st(f"{w}/{name}/model.safetensors")
    if sorted(e) != sorted(orig):
        bad.append(f"{name}: tensors {sorted(set(e) ^ set(orig))[:4]} not in both")
    diff = [k for k in orig if k in e and not np.array_equal(e[k], orig[k])]
    if diff:
        bad.append(f"{name}: {len(diff)} tensors differ from the folder's, e.g. {diff[:3]}")
    else:
        print(f"{name}: Qwen3MoeForCausalLM, {len(e)} tensors equal to the folder's")
steps = [x for x in map(json.loads, open(f"{w}/run/metrics.jsonl")) if "loss" in x and "event" not in x]
if not (len(steps) == 1 and math.isfinite(steps[0]["loss"]) and abs(steps[0]["loss"] - math.log(264)) > 0.3):
    bad.append(f"(f) init_from's losses {[s['loss'] for s in steps]}, ln(V) {math.log(264):.3f}")
else:
    print(f"(f) init_from in ep 2: loss {steps[0]['loss']:.3f}, ln(V) {math.log(264):.3f}")
r = json.load(open(f"{d}/reference.json"))
g = json.loads(open(f"{w}/gen-nokv.jsonl").readline())
if g["ids"] != r["greedy"]:
    bad.append(f"(c) --no-kv-cache: ids {g['ids']}, transformers' {r['greedy']}")
for b in bad:
    print("FAIL", b)
sys.exit(1 if bad else 0)
EOF
# (g) config.json refusals
for case in "shared_expert_intermediate_size 64" "attention_bias true" "num_experts_per_tok 9" \
    "mlp_only_layers [1]" "sliding_window 16"; do
    set -- $case
    r=$tmp/refuse-$1
    mkdir "$r" && ln -s "$PWD/$d/model.safetensors" "$r/"
    $PY -c 'import json, sys; c = json.load(open(sys.argv[1])); c[sys.argv[2]] = json.loads(sys.argv[3])
if sys.argv[2] == "sliding_window": c.update(use_sliding_window=True, max_window_layers=0)
json.dump(c, open(sys.argv[4], "w"))' "$d/config.json" "$1" "$2" "$r/config.json"
    hf_refused "$r" "$w/tokens24.txt" "$1" "(g) $1 = $2"
done
# (g) export refusal: q/k norms with a shared expert (tests/e2e/configs/moe.ini has one)
SMALL_INI=tests/e2e/configs/moe.ini small_train "$tmp/runS" "$tmp/ckS" 1 1 1 0 model.vocab_size=264 \
    model.qk_norm=true train.steps=1 train.warmup_steps=0 > "$tmp/logS" 2>&1 ||
    { tail -3 "$tmp/logS"; fail "(g) training a MoE model with q/k norms and a shared expert"; }
rc=0
"$TRIDENT" ckpt export "$tmp/ckS" "$tmp/hfS" --format hf > /dev/null 2> "$tmp/errS" || rc=$?
[ $rc -eq 2 ] && grep -q "Qwen3MoeForCausalLM.*shared expert" "$tmp/errS" && [ ! -e "$tmp/hfS" ] ||
    fail "(g) export with q/k norms and a shared expert: exit $rc, '$(cat "$tmp/errS")'"
echo "ok: (g) refused: $(cat "$tmp/errS")"
echo "ok: Qwen3MoeForCausalLM: logits and router choices = transformers 4.51.3's at 72 positions, $HF_VARIANTS config variants too, 32 greedy ids with and without the key/value cache, stop at the second eos id (folder and import), import -> export and init_from (ep 2) -> export give the folder's tensors under Qwen3MoeForCausalLM, 5 config refusals and 1 export refusal"
