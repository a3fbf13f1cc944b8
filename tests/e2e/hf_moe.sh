#!/usr/bin/env bash
# hf_moe.sh: Hugging Face MixtralForCausalLM and Qwen2MoeForCausalLM folders in
# and out of trident (issue 31 acceptance 2), against transformers 4.46.3
# itself (.venv-hf; tests/e2e/lib/hf_moe_live.py builds tiny random models with
# save_pretrained: Mixtral untied, Qwen2-MoE tied with a dense first layer
# (mlp_only_layers [0]), a gated shared expert, q/k/v biases and norm_topk_prob
# false; 8 experts, top-2, their own router_aux_loss_coef). For each:
#  (a) `trident ckpt logits` of the folder, of `trident import`'s checkpoint
#      and of `trident ckpt export --format hf`'s folder: logits at 64
#      positions within 1e-5 relative of transformers', every sparse layer's
#      top-2 experts of every token equal to transformers', and
#      moe_aux_loss_coeff * aux loss (trident's load-balancing loss over its
#      MoE layers, the coefficient read from router_aux_loss_coef) equal to
#      transformers' router_aux_loss_coef * aux_loss within 1e-6;
#  (b) the export names the class and model_type, loads in transformers with
#      no missing or unexpected key, gives the original folder's logits and
#      carries its router_aux_loss_coef; a BF16 export in 40 KB shards
#      (model.safetensors.index.json over the per-expert names) loads too,
#      every tensor the FP32 export's rounded to BF16, and transformers' logits
#      of it equal `trident ckpt logits` of it (the BF16 experts read back
#      across shards) within 1e-5;
#  (c) `model.init_from` of the folder in 2-rank layouts that split the
#      stacked expert tensors (Mixtral: ep 2, each rank reading its experts'
#      rows; Qwen2-MoE: dp_shard 2, flat ranges across experts) trains a step
#      at lr 1e-30 (the weights unchanged); the run's export is (b)'s again;
#  (d) refusals, exit 2 naming the config.json key: router_jitter_noise 0.1,
#      num_experts_per_tok 9 of 8, an acting sliding_window (both), head_dim
#      16 != 32 / 4, Mixtral rope_scaling, mlp_only_layers [0, 2] and
#      decoder_sparse_step 2 (a dense layer after a sparse one),
#      shared_expert_intermediate_size 0, num_experts 0; init_from with a run
#      of another moe_top_k, naming num_experts_per_tok;
#  (e) `ckpt export --format hf` of trident MoE models neither class holds (a
#      shared expert without q/k/v biases; q/k/v biases without a shared
#      expert) exits 2 naming the class and what it lacks, writing nothing;
#  (f) `trident generate --temperature 0` of the folder, with the key/value
#      cache and with --no-kv-cache, continues its prompt with transformers'
#      greedy `generate` ids (24, or up to eos), ended alike.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
HFPY="$PWD/.venv-hf/bin/python"
[ -x "$HFPY" ] && "$HFPY" -c "import torch, transformers" 2>/dev/null ||
    fail "$HFPY with torch and transformers missing: run make deps"
live=tests/e2e/lib/hf_moe_live.py
"$HFPY" $live build "$tmp" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "building the models"; }
# (c)'s dataset, in the models' byte-level tokenizer
awk 'NR <= 400' tests/reference/fixtures/tokenizer_corpus.txt > "$tmp/text.txt"
"$TRIDENT" prep --input "$tmp/text.txt" --output "$tmp/shards" \
    --tokenizer tests/reference/fixtures/hf_families/tokenizer.json --val-fraction 0 > /dev/null 2>&1 ||
    fail "(c) prep with the fixtures' tokenizer"
for fam in mixtral qwen2moe; do
    w=$tmp/$fam
    logits() { "$TRIDENT" ckpt logits "$1" --tokens "$w/tokens.txt" --out "$2" > /dev/null || fail "$fam: ckpt logits of $1"; }
    logits "$w/hf" "$w/folder.safetensors"
    "$TRIDENT" import "$w/hf" "$w/ck" > /dev/null || fail "$fam: import"
    logits "$w/ck" "$w/import.safetensors"
    "$TRIDENT" ckpt export "$w/ck" "$w/export" --format hf > /dev/null || fail "$fam: export"
    logits "$w/export" "$w/export.safetensors"
    "$TRIDENT" ckpt export "$w/ck" "$w/export-bf16" --format hf --dtype bf16 --max-shard-size 40K > /dev/null ||
        fail "$fam: export in bf16 shards"
    logits "$w/export-bf16" "$w/export-bf16.safetensors"
    # (f) generation with and without the key/value cache
    gen=(--prompt "In the beginning" --max-new-tokens 24 --temperature 0 --json)
    "$TRIDENT" generate "$w/hf" "${gen[@]}" > "$w/gen.jsonl" 2> "$w/gen.err" ||
        { cat "$w/gen.err"; fail "(f) $fam: trident generate"; }
    "$TRIDENT" generate "$w/hf" "${gen[@]}" --no-kv-cache > "$w/gen-nokv.jsonl" 2> "$w/gen.err" ||
        { cat "$w/gen.err"; fail "(f) $fam: trident generate --no-kv-cache"; }
    # (c)
    layout=(parallel.ep=2) && [ $fam = qwen2moe ] && layout=(parallel.dp_shard=2)
    # shellcheck disable=SC2046
    small_train "$w/run" "$w/ckI" 1 1 2 0 $(cat "$w/keys.txt") "${layout[@]}" model.init_from="$w/hf" \
        train.steps=1 train.lr=1e-30 train.min_lr=1e-30 train.warmup_steps=0 train.seq_len=32 \
        > "$w/logI" 2>&1 || { grep -m3 trident "$w/logI"; fail "(c) $fam: init_from in ${layout[*]}"; }
    "$TRIDENT" ckpt export "$w/ckI" "$w/export-init" --format hf > /dev/null || fail "(c) $fam: export of the run"
done
# (a), (b), (c), (f)
"$HFPY" $live check "$tmp" mixtral qwen2moe || fail "see above"
# (d)
for d in "$tmp"/refuse/*; do
    read -r fam key < "$d/KEY"
    ln -s "$tmp/$fam/hf/model.safetensors" "$d/model.safetensors"
    hf_refused "$d" "$tmp/$fam/tokens.txt" "$key" "(d) $fam, $key changed"
done
rc=0
# shellcheck disable=SC2046
small_train "$tmp/runT" "$tmp/ckT" 1 1 1 0 $(sed 's/moe_top_k=2/moe_top_k=1/' "$tmp/mixtral/keys.txt") \
    model.init_from="$tmp/mixtral/hf" train.steps=1 train.warmup_steps=0 > "$tmp/logT" 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "num_experts_per_tok = 2, the run's \[model\] moe_top_k = 1" "$tmp/logT" ||
    { grep -m3 trident "$tmp/logT"; fail "(d) init_from with another moe_top_k: exit $rc"; }
# (e) export refusals: trident MoE models neither class holds (tests/e2e/configs/moe.ini:
# a shared expert without q/k/v biases; q/k/v biases without a shared expert)
for case in "moe_shared_experts=1 Mixtral.*shared expert" "qkv_bias=true Qwen2Moe.*no shared expert"; do
    set -- $case
    k=${1%%=*}
    rc=0
    SMALL_INI=tests/e2e/configs/moe.ini small_train "$tmp/run-$k" "$tmp/ck-$k" 1 1 1 0 model.vocab_size=264 \
        model.moe_shared_experts="$([ "$k" = qkv_bias ] && echo 0 || echo 1)" \
        model.moe_shared_ffn_dim="$([ "$k" = qkv_bias ] && echo 0 || echo 128)" \
        model.qkv_bias="$([ "$k" = qkv_bias ] && echo true || echo false)" \
        train.steps=1 train.warmup_steps=0 > "$tmp/log-$k" 2>&1 || { tail -3 "$tmp/log-$k"; fail "(e) $k: training"; }
    "$TRIDENT" ckpt export "$tmp/ck-$k" "$tmp/hf-$k" --format hf > /dev/null 2> "$tmp/err-$k" || rc=$?
    [ $rc -eq 2 ] && grep -q "$2" "$tmp/err-$k" && [ ! -e "$tmp/hf-$k" ] ||
        fail "(e) export of a MoE model with $1: exit $rc, '$(cat "$tmp/err-$k")' (expected exit 2 matching '$2')"
    echo "ok: (e) refused: $(cat "$tmp/err-$k")"
done
echo "ok: MixtralForCausalLM and Qwen2MoeForCausalLM: logits, router choices and aux loss = transformers' through the folder, import and export; exports load in transformers with no missing or unexpected key; init_from in ep 2 and dp_shard 2; 10 config refusals by key, 2 export refusals; greedy generate = transformers' with and without the key/value cache"
