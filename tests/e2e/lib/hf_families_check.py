#!/usr/bin/env python3
"""hf_families_check.py: numpy checks of tests/e2e/hf_families.sh against the
fixtures of tests/reference/hf_families_reference.py (transformers' logits and
greedy ids). No transformers here (the fixtures hold its results).

  hf_families_check.py prepare REF_DIR WORK
      WORK/tokens.txt (reference.json's 72 tokens), WORK/tokens24.txt (the
      first 24), WORK/vK/config.json for each variant K (its "set" and "drop"
      applied to REF_DIR/config.json; prints the count), WORK/stop/generation_config.json
      (eos_token_id [the fixture's first eos id, greedy[4]]: generation must
      stop before greedy[4]), WORK/keys.txt (the [model] keys of the folder's
      config, for init_from; qwen3_moe's experts with a prefix of dense layers)
  hf_families_check.py check REF_DIR WORK
      trident's logits WORK/logits.safetensors and WORK/vK.safetensors equal
      reference.safetensors' "logits" and "variant_K" within 1e-5 relative
      (||trident - hf|| / ||hf||); WORK/gen.jsonl (`trident generate --json`)
      has transformers' prompt ids and 32 greedy ids, not ended; WORK/stop.jsonl
      and WORK/stopck.jsonl stop before greedy[4], ended; the export
      WORK/hf's config.json and generation_config.json hold the eos list
  hf_families_check.py losses V RUN_DIR...
      each run's metrics.jsonl has 5 finite step losses, the first away from
      ln(V) (a fresh init's): the folder's weights were loaded
"""
import json
import math
import os
import sys

import numpy as np


def load_st(path):
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        # F32 (logits, weights); a MoE model's router choices (I32) and aux loss (F64)
        dt = {"F32": "<f4", "I32": "<i4", "F64": "<f8"}[v["dtype"]]
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt).reshape(v["shape"])
    return out


def prepare(d, w):
    r = json.load(open(f"{d}/reference.json"))
    c = json.load(open(f"{d}/config.json"))
    open(f"{w}/tokens.txt", "w").write(" ".join(map(str, r["tokens"])) + "\n")
    open(f"{w}/tokens24.txt", "w").write(" ".join(map(str, r["tokens"][:r["variant_positions"]])) + "\n")
    for k, var in enumerate(r["variants"]):
        v = dict(c, **var.get("set", {}))
        for key in var.get("drop", []):
            v.pop(key, None)
        os.makedirs(f"{w}/v{k}")
        json.dump(v, open(f"{w}/v{k}/config.json", "w"))
    os.makedirs(f"{w}/stop")
    json.dump({"bos_token_id": 256, "eos_token_id": [r["eos_token_id"][0], r["greedy"][4]]},
              open(f"{w}/stop/generation_config.json", "w"))
    D = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    k = [f"model.vocab_size={c['vocab_size']}", f"model.d_model={c['hidden_size']}",
         f"model.n_layers={c['num_hidden_layers']}", f"model.n_heads={c['num_attention_heads']}",
         f"model.n_kv_heads={c['num_key_value_heads']}", f"model.ffn_dim={c['intermediate_size']}",
         f"model.max_seq_len={c['max_position_embeddings']}", f"model.rope_theta={c['rope_theta']}",
         f"model.norm_eps={c['rms_norm_eps']}",
         f"model.tie_embeddings={str(c.get('tie_word_embeddings', False)).lower()}"]
    if D * c["num_attention_heads"] != c["hidden_size"]:
        k.append(f"model.head_dim={D}")
    if c["model_type"] == "qwen2":
        k.append("model.qkv_bias=true")
    if c["model_type"] in ("qwen3", "qwen3_moe"):
        k.append("model.qk_norm=true")
    if c["model_type"] == "qwen3_moe":  # every layer from len(mlp_only_layers) on sparse
        k += [f"model.moe_experts={c['num_experts']}", f"model.moe_top_k={c['num_experts_per_tok']}",
              f"model.moe_ffn_dim={c['moe_intermediate_size']}", "model.moe_shared_experts=0",
              f"model.moe_norm_topk={str(c['norm_topk_prob']).lower()}",
              f"model.moe_first_dense_layers={len(c['mlp_only_layers'])}",
              f"model.moe_aux_loss_coeff={c['router_aux_loss_coef']}", "model.moe_z_loss_coeff=0"]
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        k += ["model.rope_scaling=llama3", f"model.rope_scaling_factor={rs['factor']}",
              f"model.rope_low_freq_factor={rs['low_freq_factor']}",
              f"model.rope_high_freq_factor={rs['high_freq_factor']}",
              f"model.rope_original_max_pos={rs['original_max_position_embeddings']}"]
    open(f"{w}/keys.txt", "w").write(" ".join(k) + "\n")
    print(len(r["variants"]))


def check(d, w):
    r = json.load(open(f"{d}/reference.json"))
    ref = load_st(f"{d}/reference.safetensors")
    bad = []
    pairs = [("logits", f"{w}/logits.safetensors", "(a)")]
    pairs += [(f"variant_{k}", f"{w}/v{k}.safetensors", f"(b) {json.dumps(v)}") for k, v in enumerate(r["variants"])]
    for key, path, what in pairs:
        got = load_st(path)["logits"].astype(np.float64)
        want = ref[key].astype(np.float64)[:, :got.shape[1]]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        print(f"{r['family']} {what}: {got.shape[1]} positions, relative error {rel:.2e}")
        if not (got.shape == want.shape and rel < 1e-5):
            bad.append(f"{what}: logits differ from transformers' ({rel:.2e})")
    for f, n, ended, what in [("gen", 32, False, "(c)"), ("stop", 4, True, "(d) folder"),
                              ("stopck", 4, True, "(d) import")]:
        g = json.loads(open(f"{w}/{f}.jsonl").readline())
        if g["prompt_ids"] != r["prompt_ids"] or g["ids"] != r["greedy"][:n] or g["ended"] != ended:
            bad.append(f"{what}: trident prompt {g['prompt_ids']} ids {g['ids']} ended {g['ended']}; "
                       f"transformers prompt {r['prompt_ids']} ids {r['greedy'][:n]} ended {ended}")
    want = json.load(open(f"{w}/stop/generation_config.json"))["eos_token_id"]
    for f in ("config.json", "generation_config.json"):
        got = json.load(open(f"{w}/hf/{f}"))["eos_token_id"]
        if got != want:
            bad.append(f"(e) the export's {f}: eos_token_id {got}, the folder's {want}")
    for b in bad:
        print(f"FAIL {r['family']} {b}")
    sys.exit(1 if bad else 0)


def losses(v, runs):
    bad = 0
    for run in runs:
        steps = [x for x in map(json.loads, open(f"{run}/metrics.jsonl")) if "loss" in x and "event" not in x]
        ls = [s["loss"] for s in steps]
        ok = len(ls) == 5 and all(math.isfinite(x) for x in ls) and abs(ls[0] - math.log(v)) > 0.5
        print(f"{run}: losses {['%.3f' % x for x in ls]}, ln(V) = {math.log(v):.3f}")
        bad += not ok
    sys.exit(1 if bad else 0)


cmd = sys.argv[1]
if cmd == "prepare":
    prepare(sys.argv[2], sys.argv[3])
elif cmd == "check":
    check(sys.argv[2], sys.argv[3])
elif cmd == "losses":
    losses(int(sys.argv[2]), sys.argv[3:])
