#!/usr/bin/env python3
"""docmask_reference.py: float64 PyTorch fixtures for document-masked attention
and RoPE at per-token positions ([data] packing = concat_reset).

Writes tests/reference/fixtures/docmask.h5, read by
tests/unit/test_ops_reference.c (test_docmask). Run it with a Python that has
torch (Debian's python3-torch: `/usr/bin/python3 tests/reference/docmask_reference.py`);
when that Python has no h5py, the arrays go through a temporary .npz to the
project's .venv Python (h5py), which writes the file (`--write-h5 NPZ`). The
bytes are the same either way.

Semantics (Megatron-LM's get_ltor_masks_and_position_ids with
reset_position_ids and reset_attention_mask, megatron/core/datasets/gpt_dataset.py):
in row b a document starts at t = 0 and at every t whose previous input token
tokens[b, t-1] is the end-of-text id; doc_start[b, t] is the start of t's
document. Query i attends to keys j with doc_start[b, i] <= j <= i; RoPE
rotates token t by position t - doc_start[b, t].

torch 1.13 has no scaled_dot_product_attention: softmax(q k^T / sqrt(D) + mask) v
is written out, mask a boolean (B, 1, T, T) block-diagonal causal matrix, GQA
by repeat_interleave of k, v over the H / Hkv query heads of a group, and the
gradients by autograd.

/docmask (shapes in ops.h's letters; B 3, T 80, H 2, Hkv 1, D 8; eot attr):
  tokens (B, T) int32, doc_start (B, T) int32; rows: documents of lengths 1
  (an end-of-text at t = 0), 17, 1, 40 and an unfinished 21; one row with no
  end-of-text; one with a 70-token document, then 9 tokens and an
  end-of-text at t = T - 1 (which starts nothing in the row).
  q (B, T, H, D), k, v (B, T, Hkv, D), dout (B, T, H, D) float32 -> out,
  lse (B, H, T), dq, dk, dv float64.
  rope_x (B, T, H, D), rope_dy float32; attr theta -> rope_out (forward at
  positions t - doc_start), rope_dx (its gradient given rope_dy) float64.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "docmask.h5")
B, T, H, HKV, D, EOT, VOCAB, THETA = 3, 80, 2, 1, 8, 0, 50, 10000.0


def write_h5(arrays, attrs, path):
    import h5py
    with h5py.File(path, "w", libver="earliest") as f:
        g = f.create_group("docmask")
        for k, v in attrs.items():
            g.attrs[k] = v
        for k in sorted(arrays):
            g.create_dataset(k, data=np.require(arrays[k], requirements="C"), track_times=False)


def compute():
    import torch
    gen = torch.Generator().manual_seed(20261130)

    def rand(*shape):
        x = torch.randn(shape, generator=gen, dtype=torch.float64).float().double()
        return x.requires_grad_(True)

    # tokens: documents end with EOT; other ids in [1, VOCAB)
    def row(lengths, close_last):
        toks = []
        for n, L in enumerate(lengths):
            body = torch.randint(1, VOCAB, (L,), generator=gen).tolist()
            if n < len(lengths) - 1 or close_last:
                body[-1] = EOT
            toks += body
        assert len(toks) == T, len(toks)
        return toks
    tokens = torch.tensor([row([1, 17, 1, 40, 21], False), row([T], False), row([70, 10], True)],
                          dtype=torch.int32)
    doc_start = torch.zeros(B, T, dtype=torch.int32)
    for b in range(B):
        start = 0
        for t in range(T):
            if t > 0 and tokens[b, t - 1] == EOT:
                start = t
            doc_start[b, t] = start
    i = torch.arange(T)
    mask = (i[None, None, :] <= i[None, :, None]) & (i[None, None, :] >= doc_start[:, :, None].long())
    mask = mask[:, None]  # (B, 1, T, T): query row, key column

    q, k, v, dout = rand(B, T, H, D), rand(B, T, HKV, D), rand(B, T, HKV, D), rand(B, T, H, D)
    rep = H // HKV
    qh = q.transpose(1, 2)  # (B, H, T, D)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = (qh @ kh.transpose(-1, -2) / D**0.5).masked_fill(~mask, float("-inf"))
    out = (torch.softmax(s, dim=-1) @ vh).transpose(1, 2)  # (B, T, H, D)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    lse = torch.logsumexp(s, dim=-1).detach()  # (B, H, T)

    x, dy = rand(B, T, H, D), rand(B, T, H, D)
    pos = (i[None, :] - doc_start.long()).double()  # (B, T)
    inv_freq = THETA ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos[:, :, None] * inv_freq  # (B, T, D/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, :, None, :]  # HF layout, (B, T, 1, D)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, :, None, :]

    def rotate_half(t):
        return torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1)
    rope_out = x * cos + rotate_half(x) * sin
    (rope_dx,) = torch.autograd.grad(rope_out, (x,), dy)

    d = lambda t: t.detach().numpy()
    arrays = dict(tokens=tokens.numpy().astype(np.int32), doc_start=doc_start.numpy().astype(np.int32))
    for name, t in dict(q=q, k=k, v=v, dout=dout, rope_x=x, rope_dy=dy).items():
        arrays[name] = d(t).astype(np.float32)
    for name, t in dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv, rope_out=rope_out,
                        rope_dx=rope_dx).items():
        arrays[name] = d(t).astype(np.float64)
    return arrays, dict(eot=np.int32(EOT), theta=np.float64(THETA))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--write-h5":
        z = np.load(sys.argv[2])
        arrays = {k: z[k] for k in z.files if not k.startswith("attr_")}
        attrs = {k[5:]: z[k][()] for k in z.files if k.startswith("attr_")}
        write_h5(arrays, attrs, PATH)
        return
    arrays, attrs = compute()
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    try:
        import h5py  # noqa: F401
        write_h5(arrays, attrs, PATH)
    except ImportError:
        venv = os.path.join(HERE, "..", "..", ".venv", "bin", "python")
        with tempfile.TemporaryDirectory() as tmp:
            npz = os.path.join(tmp, "docmask.npz")
            np.savez(npz, **arrays, **{"attr_" + k: v for k, v in attrs.items()})
            subprocess.run([venv, os.path.abspath(__file__), "--write-h5", npz], check=True)
    print("wrote", PATH)


if __name__ == "__main__":
    main()
