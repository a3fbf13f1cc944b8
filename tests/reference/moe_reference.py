#!/usr/bin/env python3
"""moe_reference.py: transformers' own mixture-of-experts blocks as fixtures for
trident's MoE layer (src/model/moe.h; issue 31). Run with .venv-hf (torch 2.x +
transformers 4.46.3, CPU):

    .venv-hf/bin/python tests/reference/moe_reference.py

Writes tests/reference/fixtures/moe.h5, read by tests/unit/test_moe.c. .venv-hf
has no h5py: the arrays go through a temporary .npz to the project's .venv
Python (h5py), which writes the file (`--write-h5 NPZ`, as docmask_reference.py).

Two tiny random blocks, FP32, with fixed seeds, on one x (N 64 rows, C 32):
  /mixtral  transformers.models.mixtral MixtralSparseMoeBlock: E 8, k 2, F 48,
            router_jitter_noise 0, top-k weights renormalised
  /qwen2moe transformers.models.qwen2_moe Qwen2MoeSparseMoeBlock: E 8, k 2,
            moe_intermediate_size F 48, norm_topk_prob false, one shared expert of
            width shared_F 64 scaled by sigmoid(shared_expert_gate(x))
Weights are N(0, 0.3) (router N(0, 0.5), so that routing is far from uniform),
x and dy N(0, 1), each rounded to a BF16 value (stored as FP32: exact, and the
BF16 test in test_moe.c loads the same numbers). Per group (shapes in moe.h's
letters; weights in trident's stacked layout, expert e's HF matrices at [e]):
  router (E, C), gate (E, F, C) (Mixtral w1 / gate_proj), up (E, F, C) (w3 /
  up_proj), down (E, C, F) (w2 / down_proj); qwen2moe also sh_gate, sh_up
  (shared_F, C), sh_down (C, shared_F), sh_router (1, C) (shared_expert_gate)
  x, dy (N, C)
  out (N, C)            the block's output (the forward of transformers)
  topk_idx (N, k) int32 torch.topk(softmax(router_logits), k) indices, descending
  topk_w (N, k)         the routing weights the block multiplies by
  attrs: N C E k F shared_F norm_topk aux_coeff z_coeff, aux_loss (transformers'
  load_balancing_loss_func((router_logits,), E, k)), z_loss (ST-MoE eq. 5:
  mean over tokens of logsumexp(router_logits)^2)
  grad/NAME             autograd gradients of sum(out * dy) + aux_coeff aux_loss +
                        z_coeff z_loss for x and every weight
  grad_aux/x, grad_aux/router  of aux_loss alone (coefficient 1, no dy)
  grad_z/x, grad_z/router      of z_loss alone
Sizes: every gradient is needed at FP32; with these shapes the file is about
half a megabyte (weights compress: their low 16 bits are zero).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "moe.h5")
N, C, E, K, F, SHARED_F = 64, 32, 8, 2, 48, 64
AUX_COEFF, Z_COEFF = 0.02, 0.001


def write_h5(arrays, attrs, path):
    import h5py
    with h5py.File(path, "w", libver="earliest") as f:
        for name in sorted(arrays):
            a = np.require(arrays[name], requirements="C")
            big = a.size >= 1024
            f.create_dataset(name, data=a, track_times=False,
                             **(dict(shuffle=True, compression="gzip", compression_opts=9) if big else {}))
        for key, value in sorted(attrs.items()):
            group, attr = key.split(":")
            f[group].attrs[attr] = value


def bf16_exact(t):
    import torch
    return t.to(torch.bfloat16).to(torch.float32)


def compute():
    import torch
    import transformers
    from transformers.models.mixtral.configuration_mixtral import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import (MixtralSparseMoeBlock,
                                                              load_balancing_loss_func)
    from transformers.models.qwen2_moe.configuration_qwen2_moe import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    assert transformers.__version__ == "4.46.3", transformers.__version__
    torch.manual_seed(20261202)
    x0 = bf16_exact(torch.randn(1, N, C))
    dy = bf16_exact(torch.randn(1, N, C))
    arrays, attrs = {}, {}

    def init(block, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(block.named_parameters()):
                std = 0.5 if name in ("gate.weight",) else 0.3
                p.copy_(bf16_exact(torch.randn(p.shape, generator=g) * std))

    def run(group, block, weights, shared_F, norm_topk):
        x = x0.clone().requires_grad_(True)
        out, logits = block(x)
        probs = torch.softmax(logits.float(), dim=-1)
        topk_w, topk_idx = torch.topk(probs, K, dim=-1)
        if norm_topk:
            topk_w = topk_w / topk_w.sum(-1, keepdim=True)
        aux = load_balancing_loss_func((logits,), E, K)
        z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
        params = [x] + [p for _, p in weights]
        loss = (out * dy).sum() + AUX_COEFF * aux + Z_COEFF * z
        grads = torch.autograd.grad(loss, params, retain_graph=True)
        gaux = torch.autograd.grad(aux, [x, block.gate.weight], retain_graph=True)
        gz = torch.autograd.grad(z, [x, block.gate.weight])
        srt = torch.sort(probs, dim=-1, descending=True).values
        margin = (srt[:, K - 1] - srt[:, K]).min().item()
        print("%s: aux %.6f z %.6f, smallest top-%d margin %.3e" % (group, aux.item(), z.item(), K, margin))
        d = lambda t: t.detach().reshape(t.shape).numpy().astype(np.float32)
        arrays[group + "/x"] = d(x0[0])
        arrays[group + "/dy"] = d(dy[0])
        arrays[group + "/out"] = d(out[0])
        arrays[group + "/topk_idx"] = topk_idx.numpy().astype(np.int32)
        arrays[group + "/topk_w"] = d(topk_w)
        for (name, p), g in zip(weights, grads[1:]):
            arrays[group + "/" + name] = d(p)
            arrays[group + "/grad/" + name] = d(g)
        arrays[group + "/grad/x"] = d(grads[0][0])
        arrays[group + "/grad_aux/x"] = d(gaux[0][0])
        arrays[group + "/grad_aux/router"] = d(gaux[1])
        arrays[group + "/grad_z/x"] = d(gz[0][0])
        arrays[group + "/grad_z/router"] = d(gz[1])
        for key, value in dict(N=N, C=C, E=E, k=K, F=F, shared_F=shared_F, norm_topk=int(norm_topk),
                               aux_coeff=AUX_COEFF, z_coeff=Z_COEFF, aux_loss=aux.item(),
                               z_loss=z.item()).items():
            attrs[group + ":" + key] = np.float64(value) if isinstance(value, float) else np.int64(value)

    mcfg = MixtralConfig(hidden_size=C, intermediate_size=F, num_local_experts=E,
                         num_experts_per_tok=K, router_jitter_noise=0.0, hidden_act="silu")
    mix = MixtralSparseMoeBlock(mcfg)
    init(mix, 1)
    run_stacked("mixtral", mix, run, [("router", [mix.gate]),
                                      ("gate", [ex.w1 for ex in mix.experts]),
                                      ("up", [ex.w3 for ex in mix.experts]),
                                      ("down", [ex.w2 for ex in mix.experts])], 0, True)

    qcfg = Qwen2MoeConfig(hidden_size=C, moe_intermediate_size=F, shared_expert_intermediate_size=SHARED_F,
                          num_experts=E, num_experts_per_tok=K, norm_topk_prob=False, hidden_act="silu")
    qwen = Qwen2MoeSparseMoeBlock(qcfg)
    init(qwen, 2)
    run_stacked("qwen2moe", qwen, run, [("router", [qwen.gate]),
                                        ("gate", [ex.gate_proj for ex in qwen.experts]),
                                        ("up", [ex.up_proj for ex in qwen.experts]),
                                        ("down", [ex.down_proj for ex in qwen.experts]),
                                        ("sh_gate", [qwen.shared_expert.gate_proj]),
                                        ("sh_up", [qwen.shared_expert.up_proj]),
                                        ("sh_down", [qwen.shared_expert.down_proj]),
                                        ("sh_router", [qwen.shared_expert_gate])], SHARED_F, False)
    return arrays, attrs


def run_stacked(group, block, run, groups, shared_F, norm_topk):
    """Runs the block with its HF Linear weights named NAME.i (expert i);
    stack_arrays then stacks them under trident's names."""
    weights = [("%s.%d" % (name, i), m.weight) for name, mods in groups for i, m in enumerate(mods)]
    run(group, block, weights, shared_F, norm_topk)


def stack_arrays(arrays, groups_by_model):
    for group, names in groups_by_model.items():
        for prefix in ("", "grad/"):
            for name, count in names:
                parts = [arrays.pop("%s/%s%s.%d" % (group, prefix, name, i)) for i in range(count)]
                a = np.stack(parts)
                if count == 1:
                    a = a[0]
                arrays["%s/%s%s" % (group, prefix, name)] = a


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--write-h5":
        z = np.load(sys.argv[2])
        arrays = {k: z[k] for k in z.files if not k.startswith("attr_")}
        attrs = {k[5:]: z[k][()] for k in z.files if k.startswith("attr_")}
        write_h5(arrays, attrs, PATH)
        return
    arrays, attrs = compute()
    stack_arrays(arrays, {
        "mixtral": [("router", 1), ("gate", E), ("up", E), ("down", E)],
        "qwen2moe": [("router", 1), ("gate", E), ("up", E), ("down", E), ("sh_gate", 1), ("sh_up", 1),
                     ("sh_down", 1), ("sh_router", 1)],
    })
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    try:
        import h5py  # noqa: F401
        write_h5(arrays, attrs, PATH)
    except ImportError:
        venv = os.path.join(HERE, "..", "..", ".venv", "bin", "python")
        with tempfile.TemporaryDirectory() as tmp:
            npz = os.path.join(tmp, "moe.npz")
            np.savez(npz, **arrays, **{"attr_" + k: v for k, v in attrs.items()})
            subprocess.run([venv, os.path.abspath(__file__), "--write-h5", npz], check=True)
    print("wrote", PATH, os.path.getsize(PATH), "bytes")


if __name__ == "__main__":
    main()
