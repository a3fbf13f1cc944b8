#!/usr/bin/env python3
"""Reference fixtures for trident's Hugging Face import of the four families
(src/ckpt/hf.c, hf_config.c; issue 28 acceptance 1, 2 and 7), made by
transformers itself. Run with .venv-hf (torch 2.15.0 + transformers 4.46.3):

    .venv-hf/bin/python tests/reference/hf_families_reference.py

Writes tests/reference/fixtures/hf_families/:
  tokenizer.json        a byte-level BPE of the 256 bytes, <|endoftext|> (id 256) and
                        reserved special tokens up to V = 264 ids, no merges (`tokenizers`)
  FAMILY/               for llama, qwen2, qwen3, mistral: the folder save_pretrained
                        writes (config.json, generation_config.json, model.safetensors,
                        FP32), tokenizer.json, and reference.safetensors + reference.json:
                        transformers' logits (1, 72, V) for reference.json's `tokens`
                        (72 positions, past llama's original_max_position_embeddings 16),
                        `prompt_ids` (<|endoftext|> + the bytes of PROMPT) and `greedy`:
                        the 32 ids of generate(do_sample=False, max_new_tokens=32), and
                        `variants`: config.json edits ("set", "drop") with their logits
                        (variant_K in reference.safetensors, 24 positions): each value
                        changes the model as transformers reads it.
  config_keys.json      each family's default config's to_dict() (also MixtralConfig and
                        Qwen2MoeConfig, tests/e2e/hf_moe.sh's families) and GenerationConfig's
                        (key: default; qwen3_moe's, from transformers 4.51.3, is
                        tests/reference/qwen3moe_reference.py's and kept), for
                        tests/unit/test_hf_keys.c (the table of
                        src/ckpt/hf_config.c and docs/formats.md against it); `keys` as the
                        only argument writes just this file

The families (tiny: hidden 32, 2 layers, 4 heads over 2 key/value heads, ffn 48,
vocab 264, random N(0, 0.5) weights so that logits are far from uniform):
  llama    LlamaForCausalLM, rope_scaling llama3 (factor 8, low 1, high 4,
           original_max_position_embeddings 16), untied, no tie_word_embeddings key
           (the class default, false), eos_token_id a list of two ids
  qwen2    Qwen2ForCausalLM (q/k/v biases), tied, rope_theta 1e6
  qwen3    Qwen3ForCausalLM: q_norm/k_norm per head, head_dim 16 != 32 / 4, tied.
           transformers 4.46.3 has no Qwen3 (it came in 4.51): the model is 4.46.3's
           LlamaForCausalLM with head_dim 16 and the Qwen3 RMSNorm of each head's q and k
           before RoPE (a forward hook on q_proj / k_proj, transformers 4.51's
           Qwen3Attention order), saved under Qwen3's names and config keys; its
           config_keys come from 4.51.3's Qwen3Config (configuration_qwen3.py, given as
           QWEN3_CONFIG=path, read without the rest of 4.51).
  mistral  MistralForCausalLM, GQA, sliding_window null, untied
"""
import copy
import importlib.util
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "hf_families")
V, T, TV = 264, 72, 24
PROMPT = "In the beginning"


def byte_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: ord(c))
    # GPT-2's order: the byte values in order of their unicode stand-ins
    vocab = {c: i for i, c in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # <|endoftext|> = 256, then unused ids up to V: the tokenizer's vocabulary is
    # the model's (a dataset prepared with it trains the model: init_from)
    tok.add_special_tokens(["<|endoftext|>"] + [f"<|reserved_{i}|>" for i in range(V - 257)])
    tok.save(path)
    return tok


def qwen3_attach(model):
    """q_norm / k_norm (RMSNorm over head_dim) on every layer of a LlamaForCausalLM."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    cfg = model.config
    D = cfg.head_dim
    for layer in model.model.layers:
        att = layer.self_attn
        att.q_norm = LlamaRMSNorm(D, eps=cfg.rms_norm_eps)
        att.k_norm = LlamaRMSNorm(D, eps=cfg.rms_norm_eps)

        def hook(norm):
            return lambda mod, inp, out: norm(out.view(*out.shape[:-1], -1, D)).view(out.shape)
        att.q_proj.register_forward_hook(hook(att.q_norm))
        att.k_proj.register_forward_hook(hook(att.k_norm))
    return model


QWEN3_LLAMA_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                    "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
                    "tie_word_embeddings", "attention_bias", "bos_token_id", "eos_token_id",
                    "pad_token_id"]


def load(family, folder):
    """The model of a folder as transformers reads it (Qwen3: transformers' own class when
    it has one (>= 4.51), else the port above)."""
    if family == "qwen3" and not hasattr(transformers, "Qwen3ForCausalLM"):
        d = json.load(open(os.path.join(folder, "config.json")))
        assert d["architectures"] == ["Qwen3ForCausalLM"]
        # Qwen3Config's defaults for what the folder leaves out
        q3 = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
              "tie_word_embeddings": False, "attention_bias": False}
        q3.update({k: d[k] for k in QWEN3_LLAMA_KEYS if k in d})
        cfg = LlamaConfig(**q3, mlp_bias=False, attn_implementation="eager")
        m = qwen3_attach(LlamaForCausalLM(cfg))
        from safetensors.torch import load_file
        sd = load_file(os.path.join(folder, "model.safetensors"))
        missing, unexpected = m.load_state_dict(sd, strict=False)
        tied = cfg.tie_word_embeddings
        assert not unexpected and set(missing) <= ({"lm_head.weight"} if tied else set()), (missing, unexpected)
        if tied:
            m.tie_weights()
        return m.eval()
    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "mistral": MistralForCausalLM,
           "qwen3": getattr(transformers, "Qwen3ForCausalLM", None)}[family]
    m, info = cls.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager",
                                  output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return m.eval()


def logits(m, ids):
    with torch.no_grad():
        return m(torch.tensor([ids])).logits.float().numpy()


def greedy(m, ids, eos):
    with torch.no_grad():
        out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=32, eos_token_id=eos, pad_token_id=0)
    return out[0, len(ids):].tolist()


BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False), [
        {"set": {"rope_theta": 500.0}},
        {"set": {"rms_norm_eps": 0.5}},
        {"set": {"rope_scaling": None}},
        {"set": {"rope_scaling": {"rope_type": "default"}}},
        {"set": {"rope_scaling": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}},
        {"set": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                                  "high_freq_factor": 8.0, "original_max_position_embeddings": 16}}},
        {"set": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 4}}},
        {"set": {"rope_scaling": {"type": "linear", "factor": 4.0}}},
    ]),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(rope_theta=1e6, rms_norm_eps=1e-6,
                                                 tie_word_embeddings=True), [
        {"set": {"rope_theta": 10000.0}},
        {"set": {"rms_norm_eps": 0.5}},
        {"set": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}},
        {"set": {"use_sliding_window": True, "sliding_window": 128}},
    ]),
    "qwen3": (None, None, dict(head_dim=16, rope_theta=1e6, rms_norm_eps=1e-6,
                               tie_word_embeddings=True), [
        {"set": {"rope_theta": 10000.0}},
        {"set": {"rms_norm_eps": 0.5}},
        {"set": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}},
    ]),
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=None, rope_theta=10000.0,
                                                       rms_norm_eps=1e-5, tie_word_embeddings=False), [
        {"set": {"rope_theta": 100.0}},
        {"set": {"rms_norm_eps": 0.5}},
        {"set": {"sliding_window": 4096}},
    ]),
}


def qwen3_config_json(kw):
    d = dict(BASE, **kw)
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
            "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02,
            "max_window_layers": 2, "rope_scaling": None, "sliding_window": None,
            "use_sliding_window": False, "use_cache": True, "torch_dtype": "float32",
            "transformers_version": "4.51.3", **d}


def build(family, folder, tok):
    ccls, mcls, kw, variants = FAMILIES[family]
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 5, "mistral": 4}[family])
    if family == "qwen3":
        d = qwen3_config_json(kw)
        cfg = LlamaConfig(**{k: d[k] for k in QWEN3_LLAMA_KEYS if k in d}, attn_implementation="eager")
        m = qwen3_attach(LlamaForCausalLM(cfg))
    else:
        cfg = ccls(**BASE, **kw, attn_implementation="eager")
        m = mcls(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.5 * torch.randn_like(p))
    m.eval()
    prompt_ids = [256] + tok.encode(PROMPT).ids
    g0 = greedy(m, prompt_ids, None)
    # Two stop ids the greedy continuation never reaches: all 32 tokens are compared.
    free = [i for i in range(V - 1, 0, -1) if i not in g0 and i != 256]
    eos = [free[0], free[1]]
    os.makedirs(folder, exist_ok=True)
    if family == "qwen3":
        from safetensors.torch import save_file as save_t
        sd = {k: v.contiguous() for k, v in m.state_dict().items()
              if not (kw["tie_word_embeddings"] and k == "lm_head.weight")}
        save_t(sd, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        d = qwen3_config_json(kw)
        d.update(bos_token_id=256, eos_token_id=eos)
        json.dump(d, open(os.path.join(folder, "config.json"), "w"), indent=2)
        json.dump({"bos_token_id": 256, "eos_token_id": eos, "transformers_version": "4.51.3"},
                  open(os.path.join(folder, "generation_config.json"), "w"), indent=2)
    else:
        m.config.bos_token_id, m.config.eos_token_id = 256, eos
        m.generation_config = GenerationConfig(bos_token_id=256, eos_token_id=eos)
        m.save_pretrained(folder, safe_serialization=True)
        cpath = os.path.join(folder, "config.json")
        d = json.load(open(cpath))
        if family == "llama":
            del d["tie_word_embeddings"]  # a missing key means the class default: false
        json.dump(d, open(cpath, "w"), indent=2)
    shutil.copy(os.path.join(OUT, "tokenizer.json"), os.path.join(folder, "tokenizer.json"))
    # From here on, everything is what transformers reads back from the folder.
    m = load(family, folder)
    rng = np.random.default_rng({"llama": 11, "qwen2": 12, "qwen3": 13, "mistral": 14}[family])
    tokens = rng.integers(0, V, T).tolist()
    tensors = {"logits": logits(m, tokens)}
    g = greedy(m, prompt_ids, eos)
    assert g == g0 and len(g) == 32, (g, g0)
    base = json.load(open(os.path.join(folder, "config.json")))
    out_variants = []
    for k, var in enumerate(variants):
        with tempfile.TemporaryDirectory() as tmp:
            d = copy.deepcopy(base)
            d.update(var.get("set", {}))
            for key in var.get("drop", []):
                d.pop(key, None)
            json.dump(d, open(os.path.join(tmp, "config.json"), "w"))
            os.symlink(os.path.abspath(os.path.join(folder, "model.safetensors")),
                       os.path.join(tmp, "model.safetensors"))
            lv = logits(load(family, tmp), tokens[:TV])
        diff = float(np.abs(lv - tensors["logits"][:, :TV]).max())
        tensors[f"variant_{k}"] = lv
        out_variants.append(dict(var, changes=diff > 1e-4))
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"))
    json.dump({"family": family, "tokens": tokens, "prompt": PROMPT, "prompt_ids": prompt_ids,
               "greedy": g, "eos_token_id": eos, "variant_positions": TV, "variants": out_variants},
              open(os.path.join(folder, "reference.json"), "w"), indent=1)
    print(f"{family}: greedy {g[:8]}..., {len(out_variants)} variants "
          f"({sum(v['changes'] for v in out_variants)} change the logits)")


def config_keys():
    """Each class's default to_dict(): key -> default (JSON), sorted by key."""
    def keys(d):
        return {k: d[k] for k in sorted(d)}
    out = {"transformers": transformers.__version__,
           "llama": keys(LlamaConfig().to_dict()), "qwen2": keys(Qwen2Config().to_dict()),
           "mistral": keys(MistralConfig().to_dict()),
           "mixtral": keys(transformers.MixtralConfig().to_dict()),
           "qwen2_moe": keys(transformers.Qwen2MoeConfig().to_dict()),
           "generation_config": keys(GenerationConfig().to_dict())}
    q3 = os.environ.get("QWEN3_CONFIG")
    if q3:
        spec = importlib.util.spec_from_file_location("transformers.models.qwen3.configuration_qwen3", q3)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out["qwen3"] = keys(mod.Qwen3Config().to_dict())
    else:
        out["qwen3"] = json.load(open(os.path.join(OUT, "config_keys.json")))["qwen3"]
    # Qwen3MoeConfig's: written by qwen3moe_reference.py (transformers 4.51.3), kept
    old = json.load(open(os.path.join(OUT, "config_keys.json")))
    out.update({k: old[k] for k in ("qwen3_moe", "qwen3_moe_transformers") if k in old})
    json.dump(out, open(os.path.join(OUT, "config_keys.json"), "w"), indent=0)


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = byte_tokenizer(os.path.join(OUT, "tokenizer.json"))
    config_keys()
    for family in [f for f in sys.argv[1:] if f != "keys"] if sys.argv[1:] else FAMILIES:
        folder = os.path.join(OUT, family)
        shutil.rmtree(folder, ignore_errors=True)
        build(family, folder, tok)


if __name__ == "__main__":
    main()
