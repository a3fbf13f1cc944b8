#!/usr/bin/env python3
"""moe_model_reference.py: whole transformers mixture-of-experts models as a
fixture for trident's MoE decoder (src/model/model_pass.c with moe.h; issue 31).
Run with .venv-hf (torch 2.x + transformers 4.46.3, CPU):

    .venv-hf/bin/python tests/reference/moe_model_reference.py

Writes tests/reference/fixtures/moe_model.h5, read by tests/unit/test_moe_hf.c.
.venv-hf has no h5py: the arrays go through a temporary .npz to the project's
.venv Python (`--write-h5 NPZ`, as moe_reference.py).

Two tiny random models, FP32, fixed seeds, 8 experts, top-2, vocab 96, C 32,
2 layers, 4 heads of 8, 2 key/value heads, untied:
  /mixtral   MixtralForCausalLM (F 48, router_jitter_noise 0, renormalised top-k)
  /qwen2moe  Qwen2MoeForCausalLM (moe_intermediate_size 48, norm_topk_prob false,
             shared_expert_intermediate_size 64 with its sigmoid gate, q/k/v
             biases, decoder_sparse_step 1, mlp_only_layers [])
Weights N(0, 0.2) (routers N(0, 0.5): routing far from uniform), biases N(0, 0.1),
norm gains 1 + N(0, 0.1). One batch of 64 tokens (B 1, T 64). Per group:
  param/NAME   every parameter in trident's layout and names (model.h: Qwen2-MoE
               names, the experts stacked: mlp.experts.gate_proj.weight (E F, C)
               holds expert e's HF matrix at rows e F..; Mixtral's
               block_sparse_moe.gate / experts.e.w1, w3, w2 mapped to them)
  tokens (64,) int32, logits (64, V) transformers' output (float32)
  topk_idx/L (64, k) int32: each layer's top-k experts, descending probability
  attrs: the config (vocab_size d_model n_layers n_heads n_kv_heads ffn_dim
  max_seq_len rope_theta norm_eps moe_experts moe_top_k moe_ffn_dim
  moe_shared_ffn_dim moe_norm_topk qkv_bias), aux_loss (transformers' aux_loss:
  load_balancing_loss_func over both layers' router logits, no mask) and
  margin (the smallest gap between the k-th and (k+1)-th probability).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "moe_model.h5")
V, C, L, H, HKV, F, SF, E, K, T = 96, 32, 2, 4, 2, 48, 64, 8, 2, 64
CFG = dict(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
           num_key_value_heads=HKV, max_position_embeddings=128, rope_theta=10000.0,
           rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
           num_experts_per_tok=K, output_router_logits=True)


def write_h5(arrays, attrs, path):
    import h5py
    with h5py.File(path, "w", libver="earliest") as f:
        for name in sorted(arrays):
            a = np.require(arrays[name], requirements="C")
            f.create_dataset(name, data=a, track_times=False,
                             **(dict(shuffle=True, compression="gzip", compression_opts=9) if a.size >= 1024 else {}))
        for key, value in sorted(attrs.items()):
            group, attr = key.split(":")
            f[group].attrs[attr] = value


def compute():
    import torch
    import transformers
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM
    assert transformers.__version__ == "4.46.3", transformers.__version__
    torch.manual_seed(31)
    tokens = torch.randint(0, V, (1, T))
    arrays, attrs = {}, {}

    def init(model, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters()):
                if "norm" in name:
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
                elif name.endswith("bias"):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
                elif name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))

    def run(group, model, cfg, to_trident):
        model.eval()
        with torch.no_grad():
            out = model(tokens, output_router_logits=True)
        sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
        for name, a in to_trident(sd).items():
            arrays[group + "/param/" + name] = np.ascontiguousarray(a, dtype=np.float32)
        arrays[group + "/tokens"] = tokens[0].numpy().astype(np.int32)
        arrays[group + "/logits"] = out.logits[0].float().numpy()
        margin = 1.0
        for l, rl in enumerate(out.router_logits):
            p = torch.softmax(rl.float(), dim=-1)
            srt, idx = torch.sort(p, dim=-1, descending=True)
            margin = min(margin, (srt[:, K - 1] - srt[:, K]).min().item())
            arrays[group + "/topk_idx/%d" % l] = idx[:, :K].numpy().astype(np.int32)
        print("%s: aux_loss %.6f, smallest top-%d margin %.3e" % (group, out.aux_loss.item(), K, margin))
        for key, value in dict(cfg, aux_loss=out.aux_loss.item(), margin=margin).items():
            attrs[group + ":" + key] = np.float64(value) if isinstance(value, float) else np.int64(value)

    base = dict(vocab_size=V, d_model=C, n_layers=L, n_heads=H, n_kv_heads=HKV, max_seq_len=128,
                rope_theta=10000.0, norm_eps=1e-5, moe_experts=E, moe_top_k=K, moe_ffn_dim=F)

    def common(sd, out):
        for k, v in sd.items():
            if ".mlp." not in k and ".block_sparse_moe." not in k:
                out[k] = v
        return out

    mix = MixtralForCausalLM(MixtralConfig(**CFG, intermediate_size=F, num_local_experts=E,
                                           router_jitter_noise=0.0, sliding_window=None))
    init(mix, 1)

    def mix_names(sd):
        out = common(sd, {})
        for l in range(L):
            p = "model.layers.%d." % l
            out[p + "mlp.gate.weight"] = sd[p + "block_sparse_moe.gate.weight"]
            for ours, hf in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
                out[p + "mlp.experts.%s.weight" % ours] = np.concatenate(
                    [sd[p + "block_sparse_moe.experts.%d.%s.weight" % (e, hf)] for e in range(E)])
        return out

    run("mixtral", mix, dict(base, ffn_dim=F, moe_shared_ffn_dim=0, moe_norm_topk=1, qkv_bias=0), mix_names)

    qwen = Qwen2MoeForCausalLM(Qwen2MoeConfig(**CFG, intermediate_size=F, moe_intermediate_size=F,
                                              shared_expert_intermediate_size=SF, num_experts=E,
                                              norm_topk_prob=False, decoder_sparse_step=1,
                                              mlp_only_layers=[], use_sliding_window=False))
    init(qwen, 2)

    def qwen_names(sd):
        out = common(sd, {})
        for l in range(L):
            p = "model.layers.%d.mlp." % l
            for k in ("gate.weight", "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight",
                      "shared_expert.down_proj.weight", "shared_expert_gate.weight"):
                out[p + k] = sd[p + k]
            for ours in ("gate_proj", "up_proj", "down_proj"):
                out[p + "experts.%s.weight" % ours] = np.concatenate(
                    [sd[p + "experts.%d.%s.weight" % (e, ours)] for e in range(E)])
        return out

    run("qwen2moe", qwen, dict(base, ffn_dim=F, moe_shared_ffn_dim=SF, moe_norm_topk=0, qkv_bias=1), qwen_names)
    return arrays, attrs


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--write-h5":
        z = np.load(sys.argv[2])
        arrays = {k: z[k] for k in z.files if not k.startswith("attr_")}
        attrs = {k[5:]: z[k][()] for k in z.files if k.startswith("attr_")}
        write_h5(arrays, attrs, PATH)
        return
    arrays, attrs = compute()
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        npz = os.path.join(d, "moe_model.npz")
        np.savez(npz, **arrays, **{"attr_" + k: v for k, v in attrs.items()})
        venv = os.path.join(HERE, "..", "..", ".venv", "bin", "python")
        subprocess.run([venv, os.path.abspath(__file__), "--write-h5", npz], check=True)
    print("wrote", PATH, os.path.getsize(PATH), "bytes")


if __name__ == "__main__":
    main()
