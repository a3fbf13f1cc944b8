#!/usr/bin/env python3
"""ops_reference.py: float64 PyTorch autograd fixtures for each CPU op.

Writes tests/reference/fixtures/ops.h5, read by tests/unit/test_ops_reference.c.
`python3 tests/reference/ops_reference.py` regenerates it byte-identically.

Every input is random, rounded to float32 and stored as float32 (so the FP32
and FP64 C runs see the same values); every output is computed by torch in
float64 and stored as float64. Scalar hyperparameters that trident passes as
C float (eps, label smoothing, lr, betas, ...) are float32-representable here
and stored as attributes, so an FP64 C run can match to ~1e-15.

Groups (shapes in ops.h's letters):
  /rmsnorm    x (N, C), w (C,), dy (N, C) -> y (N, C), rstd (N,), dx (N, C),
              dw (C,); attr eps. torch: x * rsqrt(mean(x^2) + eps) * w.
  /rope       x (B, T, Hx, D), dy (same); attrs theta, D; for p0 in {0, 4088}:
              out_p<p0> (forward at positions p0..p0+T-1), dx_p<p0> (gradient
              given dy). HF rotate_half / apply_rotary_pos_emb with cos/sin of
              p * theta^(-2i/D) computed in float64.
  /attention  q (B, T, H, D), k, v (B, T, Hkv, D), dout (B, T, H, D) -> out
              (B, T, H, D), lse (B, H, T) natural-log sum-exp of the scaled,
              masked score rows, dq, dk, dv. torch scaled_dot_product_attention
              (is_causal=True) with k, v repeat_interleave'd over the H/Hkv
              query heads of each group (query head h reads kv head h // (H/Hkv)).
  /swiglu     gate, up, dout (n,) -> out, dgate, dup. silu(gate) * up.
  /ce         logits (N, V), targets (N,) int32 with one -100; attr smoothing
              (0.1 in float32), ignore_index -> loss_rows (N,) (0 on ignored
              rows), loss (mean over non-ignored), dlogits (N, V) of the mean;
              loss_s0, loss_rows_s0, dlogits_s0 without smoothing.
  /embedding  wte (V, C), tokens (N,) int32 with repeats, dout (N, C) -> out
              (N, C), dwte (V, C).
  /adamw      p0 (n,), g1, g2 (n,); attrs lr, beta1, beta2, eps, weight_decay
              -> p1, p2 (params after torch.optim.AdamW steps 1 and 2), m2, v2
              (its exp_avg and exp_avg_sq after step 2).
"""
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "ops.h5")
GEN = torch.Generator().manual_seed(20261129)


def f32(x):
    return float(np.float32(x))


def rand(*shape, scale=1.0, offset=0.0):
    """float64 tensor with float32-representable values, requires grad."""
    x = torch.randn(shape, generator=GEN, dtype=torch.float64) * scale + offset
    x = x.float().double()
    return x.requires_grad_(True)


def put(f, name, x, dtype=np.float64):
    if isinstance(x, torch.Tensor):
        x = x.detach().numpy()
    f.create_dataset(name, data=np.require(np.asarray(x, dtype=dtype), requirements="C"),
                     track_times=False)


def rmsnorm(f):
    N, C, eps = 6, 10, f32(1e-5)
    x, w, dy = rand(N, C), rand(C, scale=0.1, offset=1.0), rand(N, C)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    y = x * rstd[:, None] * w
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    g = f.create_group("rmsnorm")
    g.attrs["eps"] = np.float64(eps)
    for k, v in dict(x=x, w=w, dy=dy).items():
        put(g, k, v, np.float32)
    for k, v in dict(y=y, rstd=rstd, dx=dx, dw=dw).items():
        put(g, k, v)


def rope(f):
    B, T, Hx, D, theta = 2, 8, 3, 16, 10000.0
    x, dy = rand(B, T, Hx, D), rand(B, T, Hx, D)
    g = f.create_group("rope")
    g.attrs["theta"] = np.float64(theta)
    g.attrs["D"] = np.int64(D)
    put(g, "x", x, np.float32)
    put(g, "dy", dy, np.float32)
    i = torch.arange(0, D, 2, dtype=torch.float64)
    inv_freq = theta ** (-i / D)  # (D/2,)
    for p0 in (0, 4088):
        pos = torch.arange(p0, p0 + T, dtype=torch.float64)
        freqs = pos[:, None] * inv_freq  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)[None].expand(B, T, D)  # (B, T, D)
        # unsqueeze_dim=2: x is (B, T, Hx, D). Rotate x as "q" (k unused).
        out, _ = apply_rotary_pos_emb(x, x, emb.cos(), emb.sin(), unsqueeze_dim=2)
        (dx,) = torch.autograd.grad(out, x, dy)
        put(g, f"out_p{p0}", out)
        put(g, f"dx_p{p0}", dx)


def attention(f):
    B, T, H, Hkv, D = 2, 7, 4, 2, 8
    q, k, v = rand(B, T, H, D), rand(B, T, Hkv, D), rand(B, T, Hkv, D)
    dout = rand(B, T, H, D)
    rep = H // Hkv
    qh = q.transpose(1, 2)  # (B, H, T, D)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(1, 2)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    with torch.no_grad():
        s = qh @ kh.transpose(-1, -2) / D**0.5  # (B, H, T, T)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        lse = torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)  # (B, H, T)
    g = f.create_group("attention")
    for kk, vv in dict(q=q, k=k, v=v, dout=dout).items():
        put(g, kk, vv, np.float32)
    for kk, vv in dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv).items():
        put(g, kk, vv)


def swiglu(f):
    n = 37
    gate, up, dout = rand(n, scale=3.0), rand(n), rand(n)
    out = F.silu(gate) * up
    dgate, dup = torch.autograd.grad(out, (gate, up), dout)
    g = f.create_group("swiglu")
    for k, v in dict(gate=gate, up=up, dout=dout).items():
        put(g, k, v, np.float32)
    for k, v in dict(out=out, dgate=dgate, dup=dup).items():
        put(g, k, v)


def cross_entropy(f):
    N, V, s, ignore = 5, 11, f32(0.1), -100
    logits = rand(N, V, scale=2.0)
    targets = torch.randint(0, V, (N,), generator=GEN)
    targets[2] = ignore
    g = f.create_group("ce")
    g.attrs["smoothing"] = np.float64(s)
    g.attrs["ignore_index"] = np.int64(ignore)
    put(g, "logits", logits, np.float32)
    put(g, "targets", targets, np.int32)
    for suffix, sm in (("", s), ("_s0", 0.0)):
        rows = F.cross_entropy(logits, targets, ignore_index=ignore, label_smoothing=sm,
                               reduction="none")
        loss = F.cross_entropy(logits, targets, ignore_index=ignore, label_smoothing=sm)
        assert abs(loss.item() - rows.sum().item() / (targets != ignore).sum().item()) < 1e-14
        (dlogits,) = torch.autograd.grad(loss, logits)
        put(g, "loss_rows" + suffix, rows)
        put(g, "loss" + suffix, loss)
        put(g, "dlogits" + suffix, dlogits)


def embedding(f):
    V, C = 9, 5
    tokens = torch.tensor([3, 0, 8, 3, 5, 3, 0, 7], dtype=torch.int64)  # repeats: 3 x3, 0 x2
    wte, dout = rand(V, C), rand(len(tokens), C)
    out = F.embedding(tokens, wte)
    (dwte,) = torch.autograd.grad(out, wte, dout)
    g = f.create_group("embedding")
    put(g, "wte", wte, np.float32)
    put(g, "tokens", tokens, np.int32)
    put(g, "dout", dout, np.float32)
    put(g, "out", out)
    put(g, "dwte", dwte)


def adamw(f):
    n = 7
    hp = dict(lr=f32(1e-2), beta1=f32(0.9), beta2=f32(0.95), eps=f32(1e-8),
              weight_decay=f32(0.1))
    p = rand(n).detach()
    g1, g2 = rand(n, scale=0.5).detach(), rand(n, scale=0.5).detach()
    g1[3] = 0.0  # a zero gradient: only decay moves it at step 1
    g = f.create_group("adamw")
    for k, v in hp.items():
        g.attrs[k] = np.float64(v)
    put(g, "p0", p, np.float32)
    put(g, "g1", g1, np.float32)
    put(g, "g2", g2, np.float32)
    param = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([param], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                            eps=hp["eps"], weight_decay=hp["weight_decay"], foreach=False)
    for step, grad in ((1, g1), (2, g2)):
        param.grad = grad.clone()
        opt.step()
        put(g, f"p{step}", param.detach())
    state = opt.state[param]
    put(g, "m2", state["exp_avg"])
    put(g, "v2", state["exp_avg_sq"])


def main():
    torch.set_num_threads(1)
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with h5py.File(PATH, "w", libver="earliest") as f:
        f.attrs["ignore_index"] = np.int64(-100)
        for fn in (rmsnorm, rope, attention, swiglu, cross_entropy, embedding, adamw):
            fn(f)
    print(f"wrote {PATH} ({os.path.getsize(PATH)} bytes)")


if __name__ == "__main__":
    main()
