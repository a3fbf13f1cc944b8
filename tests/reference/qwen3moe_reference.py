#!/usr/bin/env python3
"""Reference fixture for trident's Hugging Face Qwen3MoeForCausalLM (Qwen3-30B-A3B's and
Qwen3-235B-A22B's class; src/ckpt/hf_config.c, hf.c, hf_export.c), made by transformers'
own Qwen3MoeForCausalLM. The repository's .venv-hf pins transformers 4.46.3, which has no
Qwen3-MoE (it came in 4.51), so this ran once with transformers 4.51.3 in a throwaway copy
of .venv-hf (same torch):

    cp -a .venv-hf /tmp/venv-q3
    /tmp/venv-q3/bin/pip install --no-deps 'transformers==4.51.3' 'tokenizers>=0.21,<0.22' \
        'huggingface_hub>=0.30,<1.0'
    /tmp/venv-q3/bin/python tests/reference/qwen3moe_reference.py

Writes tests/reference/fixtures/hf_families/qwen3_moe/ in the layout of
hf_families_reference.py's families (tests/e2e/lib/hf_families_check.py reads it):
config.json, generation_config.json, model.safetensors (save_pretrained, FP32),
tokenizer.json (the fixtures' byte-level one, V = 264), reference.safetensors ("logits"
(1, 72, V) for reference.json's `tokens`, "topk" (2 sparse layers, 72, 2: the
experts each token's router chose, as float32), "variant_K" (1, 24, V) for each config.json
variant) and reference.json (`tokens`, `prompt_ids`, `greedy`: the 32 ids of
generate(do_sample=False, max_new_tokens=32) with the key/value cache, `eos_token_id`,
`variants`, `transformers`, `topk_margin`: the smallest gap between the top-2nd and
3rd router logits over every sparse layer and token of the logits, the greedy
sequence and the variants, so routing is not decided by rounding). Also sets
config_keys.json's "qwen3_moe": Qwen3MoeConfig().to_dict() (tests/unit/test_hf_keys.c).

The model (tiny): hidden 32, 4 heads over 2 key/value heads, head_dim 16 != 32 / 4,
q_norm / k_norm, no biases, 3 layers with mlp_only_layers [0] (a dense first layer of
intermediate_size 48), then 8 experts of moe_intermediate_size 16, top-2,
norm_topk_prob true (the released models'), no shared expert (the class has none),
untied, rope_theta 1e6; weights N(0, 0.2), router weights N(0, 0.5), norms
1 + N(0, 0.1); the first seed from 6 on whose top-2 margins (router logits) exceed 5e-3
on the logits' tokens and the greedy sequence.
"""
import copy
import json
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "hf_families")
OUT = os.path.join(FIX, "qwen3_moe")
V, T, TV, K = 264, 72, 24, 2
PROMPT = "In the beginning"

CONFIG = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=128, rope_theta=1e6, rms_norm_eps=1e-6,
              tie_word_embeddings=False, num_experts=8, num_experts_per_tok=K,
              moe_intermediate_size=16, norm_topk_prob=True, decoder_sparse_step=1,
              mlp_only_layers=[0], router_aux_loss_coef=0.001, use_sliding_window=False,
              max_window_layers=3)
VARIANTS = [
    {"set": {"rope_theta": 10000.0}},
    {"set": {"norm_topk_prob": False}},
    {"set": {"rms_norm_eps": 0.5}},
]


def load(folder):
    m, info = Qwen3MoeForCausalLM.from_pretrained(folder, torch_dtype=torch.float32,
                                                  attn_implementation="eager",
                                                  output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return m.eval()


def run(m, ids):
    """Logits, the smallest top-K router margin over ids and the sparse layers' top-K
    experts of each token, (layers, tokens, K) in torch.topk's order."""
    # The routers' outputs by hooks: 4.51.3's output_router_logits fails on a model with a
    # dense layer (load_balancing_loss_func gets the dense layer's None).
    rls = []
    hooks = [mod.register_forward_hook(lambda mod, i, out: rls.append(out.detach()))
             for name, mod in m.named_modules() if name.endswith("mlp.gate")]
    with torch.no_grad():
        o = m(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    assert len(rls) == 2, len(rls)
    margin = 1.0
    for rl in rls:  # in logits: the softmax keeps their order
        srt = torch.sort(rl.float(), dim=-1, descending=True).values
        margin = min(margin, (srt[:, K - 1] - srt[:, K]).min().item())
    topk = np.stack([torch.topk(torch.softmax(rl.float(), dim=-1), K, dim=-1).indices.numpy()
                     for rl in rls])
    return o.logits.float().numpy(), margin, topk


def greedy(m, ids, eos):
    with torch.no_grad():
        out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=32, eos_token_id=eos, pad_token_id=0,
                         use_cache=True)
    return out[0, len(ids):].tolist()


def main():
    assert transformers.__version__ == "4.51.3", transformers.__version__
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(FIX, "tokenizer.json"))
    prompt_ids = [256] + tok.encode(PROMPT).ids
    rng = np.random.default_rng(15)
    tokens = rng.integers(0, V, T).tolist()
    for seed in range(6, 60):
        torch.manual_seed(seed)
        m = Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG, attn_implementation="eager")).eval()
        with torch.no_grad():
            for name, p in sorted(m.named_parameters()):
                if "norm" in name:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
                elif name.endswith("mlp.gate.weight"):
                    p.copy_(0.5 * torch.randn_like(p))
                else:
                    p.copy_(0.2 * torch.randn_like(p))
        g0 = greedy(m, prompt_ids, None)
        _, m1, _ = run(m, tokens)
        _, m2, _ = run(m, prompt_ids + g0)
        if min(m1, m2) > 5e-3:
            break
    print(f"seed {seed}: margins {m1:.2e} (tokens), {m2:.2e} (greedy)")
    free = [i for i in range(V - 1, 0, -1) if i not in g0 and i != 256]
    eos = [free[0], free[1]]  # stop ids the continuation never reaches: all 32 ids compared
    shutil.rmtree(OUT, ignore_errors=True)
    m.config.bos_token_id, m.config.eos_token_id = 256, eos
    m.generation_config = GenerationConfig(bos_token_id=256, eos_token_id=eos)
    m.save_pretrained(OUT, safe_serialization=True)
    shutil.copy(os.path.join(FIX, "tokenizer.json"), os.path.join(OUT, "tokenizer.json"))
    # From here on, what transformers reads back from the folder.
    m = load(OUT)
    lg, margin, topk = run(m, tokens)
    g = greedy(m, prompt_ids, eos)
    assert g == g0 and len(g) == 32, (g, g0)
    margin = min(margin, run(m, prompt_ids + g)[1])
    tensors = {"logits": lg, "topk": topk}
    base = json.load(open(os.path.join(OUT, "config.json")))
    out_variants = []
    for k, var in enumerate(VARIANTS):
        with tempfile.TemporaryDirectory() as tmp:
            d = copy.deepcopy(base)
            d.update(var["set"])
            json.dump(d, open(os.path.join(tmp, "config.json"), "w"))
            os.symlink(os.path.join(OUT, "model.safetensors"), os.path.join(tmp, "model.safetensors"))
            lv, mv, _ = run(load(tmp), tokens[:TV])
        margin = min(margin, mv)
        diff = float(np.abs(lv - lg[:, :TV]).max())
        tensors[f"variant_{k}"] = lv
        out_variants.append(dict(var, changes=diff > 1e-4))
    assert margin > 1e-3, margin
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              os.path.join(OUT, "reference.safetensors"))
    json.dump({"family": "qwen3_moe", "transformers": transformers.__version__, "tokens": tokens,
               "prompt": PROMPT, "prompt_ids": prompt_ids, "greedy": g, "eos_token_id": eos,
               "variant_positions": TV, "variants": out_variants, "topk_margin": margin},
              open(os.path.join(OUT, "reference.json"), "w"), indent=1)
    keys_path = os.path.join(FIX, "config_keys.json")
    keys = json.load(open(keys_path))
    d = Qwen3MoeConfig().to_dict()
    keys["qwen3_moe"] = {k: d[k] for k in sorted(d)}
    keys["qwen3_moe_transformers"] = transformers.__version__
    json.dump(keys, open(keys_path, "w"), indent=0)
    print(f"qwen3_moe: greedy {g[:8]}..., margin {margin:.2e}, "
          f"{sum(v['changes'] for v in out_variants)} of {len(out_variants)} variants change the logits")


if __name__ == "__main__":
    main()
