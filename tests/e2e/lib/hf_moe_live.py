#!/usr/bin/env python3
"""hf_moe_live.py: transformers 4.46.3 (.venv-hf) side of tests/e2e/hf_moe.sh:
tiny random MixtralForCausalLM and Qwen2MoeForCausalLM folders, and the checks
of trident's logits, router choices, auxiliary loss and exports against them.

  hf_moe_live.py build OUT
      OUT/FAMILY/hf       save_pretrained of each model (safetensors, FP32) with
                          the fixtures' byte-level tokenizer.json (vocab 264)
      OUT/FAMILY/tokens.txt   64 random ids (one line)
      OUT/FAMILY/ref.npz  transformers' logits (64, V), each sparse layer's top-k
                          experts (n_moe, 64, k) in descending probability, aux_loss
                          (load_balancing_loss_func over the sparse layers' router
                          logits) and router_aux_loss_coef
      OUT/FAMILY/keys.txt the [model] overrides of a trident run of the same model
      OUT/refuse/NAME/config.json + KEY: config.json variants trident must refuse
                          naming KEY (the weights linked by the shell script)
  hf_moe_live.py check OUT FAMILY...
      for each FAMILY: OUT/FAMILY/{folder,import,export}.safetensors (`trident ckpt
      logits` of the folder, of `trident import`'s checkpoint and of `trident ckpt
      export`'s folder): logits within 1e-5 relative of transformers', moe_topk
      equal to transformers' choices, moe_aux_loss_coeff * moe_aux_loss equal to
      router_aux_loss_coef * aux_loss within 1e-6 relative; the exports
      OUT/FAMILY/export and OUT/FAMILY/export-init (a run started with init_from
      of the folder) name the class, load with no missing or unexpected key, and
      give transformers' logits of the folder within 1e-5 relative;
      OUT/FAMILY/export-bf16 (BF16, 40 KB shards) loads with no missing or
      unexpected key, each tensor the FP32 export's rounded to BF16, and its
      transformers logits equal trident's (OUT/FAMILY/export-bf16.safetensors)
      within 1e-5; OUT/FAMILY/gen.jsonl and gen-nokv.jsonl (`trident generate
      --temperature 0 --json` of the folder, with the key/value cache and with
      --no-kv-cache): the ids transformers' greedy `generate` continues the
      same prompt ids with (24 tokens or up to its eos), ended alike.

Models (weights N(0, 0.2), routers N(0, 0.5) so that no top-k choice is near a
tie, biases N(0, 0.1), norm gains 1 + N(0, 0.1); vocab 264, hidden 32, 4 heads,
2 key/value heads, 8 experts, top-2, max_position_embeddings 128):
  mixtral   2 layers, intermediate_size 48, untied, router_aux_loss_coef 0.02
  qwen2moe  3 layers, mlp_only_layers [0] (a dense first layer of intermediate_size
            40), moe_intermediate_size 24, shared expert 64 with its gate,
            norm_topk_prob false, q/k/v biases, tied, router_aux_loss_coef 0.005
"""
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "../../reference/fixtures/hf_families/tokenizer.json")
V, C, H, HKV, E, K, T = 264, 32, 4, 2, 8, 2, 64
COMMON = dict(vocab_size=V, hidden_size=C, num_attention_heads=H, num_key_value_heads=HKV,
              max_position_embeddings=128, hidden_act="silu", num_experts_per_tok=K,
              bos_token_id=256, eos_token_id=256, rms_norm_eps=1e-5)


def models():
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM
    mix = MixtralConfig(**COMMON, num_hidden_layers=2, intermediate_size=48, num_local_experts=E,
                        router_aux_loss_coef=0.02, tie_word_embeddings=False)
    qwen = Qwen2MoeConfig(**COMMON, num_hidden_layers=3, intermediate_size=40,
                          moe_intermediate_size=24, shared_expert_intermediate_size=64,
                          num_experts=E, norm_topk_prob=False, decoder_sparse_step=1,
                          mlp_only_layers=[0], router_aux_loss_coef=0.005,
                          tie_word_embeddings=True, rope_theta=10000.0)
    return {"mixtral": (MixtralForCausalLM, mix, 1), "qwen2moe": (Qwen2MoeForCausalLM, qwen, 2)}


def keys(cfg, fam):
    """The trident [model] of the folder, as overrides."""
    moe = dict(vocab_size=V, d_model=C, n_layers=cfg.num_hidden_layers, n_heads=H,
               n_kv_heads=HKV, max_seq_len=128, rope_theta=cfg.rope_theta, norm_eps=cfg.rms_norm_eps,
               tie_embeddings=str(cfg.tie_word_embeddings).lower(), moe_experts=E, moe_top_k=K,
               moe_aux_loss_coeff=cfg.router_aux_loss_coef, moe_z_loss_coeff=0)
    if fam == "mixtral":
        moe.update(ffn_dim=cfg.intermediate_size, moe_ffn_dim=cfg.intermediate_size,
                   moe_norm_topk="true", moe_shared_experts=0)
    else:
        moe.update(ffn_dim=cfg.intermediate_size, moe_ffn_dim=cfg.moe_intermediate_size,
                   moe_norm_topk="false", moe_shared_experts=1,
                   moe_shared_ffn_dim=cfg.shared_expert_intermediate_size, moe_shared_gate="true",
                   qkv_bias="true", moe_first_dense_layers=len(cfg.mlp_only_layers))
    return " ".join(f"model.{k}={v}" for k, v in moe.items())


def build(out):
    import torch
    import transformers
    assert transformers.__version__ == "4.46.3", transformers.__version__
    torch.manual_seed(31)
    tokens = torch.randint(0, V, (1, T))
    for fam, (cls, cfg, seed) in models().items():
        m = cls(cfg).eval()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(m.named_parameters()):
                if "norm" in name:
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
                elif name.endswith("bias"):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
                elif name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))
            o = m(tokens, output_router_logits=True)
        d = os.path.join(out, fam)
        m.save_pretrained(os.path.join(d, "hf"), safe_serialization=True)
        shutil.copy(TOKENIZER, os.path.join(d, "hf", "tokenizer.json"))
        topk, margin = [], 1.0
        for rl in o.router_logits:
            p = torch.softmax(rl.float(), dim=-1)
            srt, idx = torch.sort(p, dim=-1, descending=True)
            margin = min(margin, (srt[:, K - 1] - srt[:, K]).min().item())
            topk.append(idx[:, :K].numpy().astype(np.int32))
        np.savez(os.path.join(d, "ref.npz"), logits=o.logits[0].float().numpy(),
                 topk=np.stack(topk), aux_loss=o.aux_loss.item(), coef=cfg.router_aux_loss_coef)
        open(os.path.join(d, "tokens.txt"), "w").write(" ".join(map(str, tokens[0].tolist())) + "\n")
        open(os.path.join(d, "keys.txt"), "w").write(keys(cfg, fam) + "\n")
        print(f"{fam}: {len(o.router_logits)} sparse layers, aux_loss {o.aux_loss.item():.6f}, "
              f"smallest top-{K} margin {margin:.2e}")
    # config.json variants trident cannot honour, each refused naming KEY
    variants = [
        ("mixtral", "router_jitter_noise", {"router_jitter_noise": 0.1}),
        ("mixtral", "num_experts_per_tok", {"num_experts_per_tok": 9}),
        ("mixtral", "sliding_window", {"sliding_window": 16}),
        ("mixtral", "head_dim", {"head_dim": 16}),
        ("mixtral", "rope_scaling", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("qwen2moe", "mlp_only_layers", {"mlp_only_layers": [0, 2]}),
        ("qwen2moe", "decoder_sparse_step", {"decoder_sparse_step": 2, "mlp_only_layers": []}),
        ("qwen2moe", "shared_expert_intermediate_size", {"shared_expert_intermediate_size": 0}),
        ("qwen2moe", "sliding_window", {"use_sliding_window": True, "sliding_window": 16,
                                        "max_window_layers": 0}),
        ("qwen2moe", "num_experts", {"num_experts": 0}),
    ]
    for i, (fam, key, change) in enumerate(variants):
        c = json.load(open(os.path.join(out, fam, "hf", "config.json")))
        c.update(change)
        d = os.path.join(out, "refuse", f"{i}-{fam}")
        os.makedirs(d)
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
        open(os.path.join(d, "KEY"), "w").write(f"{fam} {key}\n")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def check(out, fams):
    import torch
    import transformers
    from safetensors import safe_open
    transformers.logging.set_verbosity_error()
    arch = {"mixtral": ("MixtralForCausalLM", "mixtral"), "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe")}
    bad = 0

    def expect(ok, msg):
        nonlocal bad
        print(("ok: " if ok else "FAIL: ") + msg)
        bad += not ok

    for fam in fams:
        d = os.path.join(out, fam)
        ref = np.load(os.path.join(d, "ref.npz"))
        ids = [int(x) for x in open(os.path.join(d, "tokens.txt")).read().split()]
        term = float(ref["coef"]) * float(ref["aux_loss"])
        for src in ("folder", "import", "export"):
            with safe_open(os.path.join(d, f"{src}.safetensors"), "np") as f:
                meta = f.metadata()
                lg, topk, aux = f.get_tensor("logits")[0], f.get_tensor("moe_topk")[0], f.get_tensor("moe_aux_loss")[0]
            r = rel(lg, ref["logits"])
            expect(r < 1e-5, f"{fam} {src}: trident's logits at {T} positions vs transformers': {r:.2e} relative")
            same = int((topk == ref["topk"]).sum())
            expect(topk.shape == ref["topk"].shape and same == topk.size,
                   f"{fam} {src}: router choices {same} of {ref['topk'].size} equal to transformers' "
                   f"({ref['topk'].shape[0]} sparse layers x {T} tokens x top-{K})")
            mine = float(meta["moe_aux_loss_coeff"]) * float(aux)
            expect(abs(mine - term) <= 1e-6 * abs(term),
                   f"{fam} {src}: aux term moe_aux_loss_coeff * aux = {mine:.9g}, transformers' "
                   f"router_aux_loss_coef * aux_loss = {term:.9g}")
        cls = getattr(transformers, arch[fam][0])
        for exp in ("export", "export-init"):
            e = os.path.join(d, exp)
            c = json.load(open(os.path.join(e, "config.json")))
            expect(c["architectures"] == [arch[fam][0]] and c["model_type"] == arch[fam][1],
                   f"{fam} {exp}: config.json names {c['architectures']} {c['model_type']}")
            m, info = cls.from_pretrained(e, torch_dtype=torch.float32, attn_implementation="eager",
                                          output_loading_info=True)
            expect(not info["missing_keys"] and not info["unexpected_keys"],
                   f"{fam} {exp}: loads with missing {info['missing_keys']}, unexpected {info['unexpected_keys']}")
            with torch.no_grad():
                o = m.eval()(torch.tensor([ids]), output_router_logits=True)
            r = rel(o.logits[0].float().numpy(), ref["logits"])
            expect(r < 1e-5, f"{fam} {exp}: transformers' logits of trident's export vs of the "
                   f"original folder: {r:.2e} relative")
            expect(abs(o.aux_loss.item() * m.config.router_aux_loss_coef - term) <= 1e-6 * abs(term),
                   f"{fam} {exp}: its router_aux_loss_coef * aux_loss is the original's")
            if exp == "export":
                fp32 = m.state_dict()
        # the BF16 export in shards: transformers' reading of it against trident's
        e = os.path.join(d, "export-bf16")
        m, info = cls.from_pretrained(e, torch_dtype=torch.float32, attn_implementation="eager",
                                      output_loading_info=True)
        expect(not info["missing_keys"] and not info["unexpected_keys"] and
               os.path.exists(os.path.join(e, "model.safetensors.index.json")),
               f"{fam} export-bf16: loads from its shards with missing {info['missing_keys']}, "
               f"unexpected {info['unexpected_keys']}")
        sd = m.state_dict()
        same = [k for k in fp32 if torch.equal(sd[k], fp32[k].to(torch.bfloat16).float())]
        expect(len(same) == len(fp32), f"{fam} export-bf16: {len(same)} of {len(fp32)} tensors "
               "are the FP32 export's rounded to BF16")
        with torch.no_grad():
            lg = m.eval()(torch.tensor([ids])).logits[0].float().numpy()
        with safe_open(os.path.join(d, "export-bf16.safetensors"), "np") as f:
            r = rel(f.get_tensor("logits")[0], lg)
        expect(r < 1e-5, f"{fam} export-bf16: trident's logits of it vs transformers': {r:.2e} relative")
        # generation: transformers' greedy continuation of trident's prompt ids
        m = cls.from_pretrained(os.path.join(d, "hf"), torch_dtype=torch.float32, attn_implementation="eager").eval()
        for f in ("gen", "gen-nokv"):
            g = json.loads(open(os.path.join(d, f"{f}.jsonl")).readline())
            p = g["prompt_ids"]
            with torch.no_grad():
                o = m.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               do_sample=False, max_new_tokens=24, eos_token_id=m.config.eos_token_id,
                               pad_token_id=0)[0, len(p):].tolist()
            ended = m.config.eos_token_id in o
            want = o[:o.index(m.config.eos_token_id)] if ended else o
            diff = "" if g["ids"] == want else f": {g['ids']} vs {want}"
            expect(g["ids"] == want and g["ended"] == ended,
                   f"{fam} {f}: trident generate {len(g['ids'])} ids (ended {g['ended']}) vs transformers' "
                   f"greedy {len(want)} (ended {ended}){diff}")
    return bad


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        sys.exit(1 if check(sys.argv[2], sys.argv[3:]) else 0)
