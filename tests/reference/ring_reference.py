#!/usr/bin/env python3
"""ring_reference.py: float64 PyTorch fixtures of full causal grouped-query
attention, with and without packed documents, for the context-parallel ring
attention test (issue 26, acceptance 2).

Writes tests/reference/fixtures/ring.h5, read by
tests/unit/test_ring_reference.c, which splits T into 2 cp load-balanced
chunks, runs the ring schedule of the block ops (backend_attention_block_*)
at cp = 2 and 4 and compares the reassembled result with these arrays. Run it
with a Python that has torch (Debian's python3-torch: `/usr/bin/python3
tests/reference/ring_reference.py`); when that Python has no h5py, the arrays
go through a temporary .npz to the project's .venv Python (h5py), which
writes the file (`--write-h5 NPZ`). The bytes are the same either way.

Math: out = softmax(q k^T / sqrt(D) + mask) v per head, query head h reading
kv head h // (H / Hkv) (k, v repeat_interleave'd), the mask boolean: query i
reads key j iff doc_start[b, i] <= j <= i (plain causal: doc_start = 0),
Megatron-LM's reset_attention_mask; lse the natural-log sum-exp of the
scaled, masked score rows; dq, dk, dv by autograd given dout. torch 1.13 has
no scaled_dot_product_attention, so it is written out (as
docmask_reference.py).

Groups /T<T> (shapes in ops.h's letters), one per size:
  T1024: B 1, T 1024, H 4, Hkv 2, D 2 (the long case, kept small: a few
         hundred KB of float64 outputs); T64: B 1, T 64, H 4, Hkv 2, D 8.
  attrs B, T, H, Hkv, D.
  q (B, T, H, D), k, v (B, T, Hkv, D), dout (B, T, H, D): float32 holding
    BF16-representable values (so FP64, FP32 and BF16 runs see the same
    inputs); doc_start (B, T) int32: documents that cross the chunk
    boundaries of cp = 2 and 4 (a one-token document, one starting at the
    last token).
  causal/, docs/: out (B, T, H, D), lse (B, H, T), dq, dk, dv float64.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "ring.h5")
# name: (B, T, H, Hkv, D, document starts of each row)
CASES = {
    "T1024": (1, 1024, 4, 2, 2, [[0, 100, 101, 333, 640, 641, 900, 1023]]),
    "T64": (1, 64, 4, 2, 8, [[0, 5, 6, 19, 40, 63]]),
}


def write_h5(arrays, attrs, path):
    import h5py
    with h5py.File(path, "w", libver="earliest") as f:
        for name in sorted(arrays):
            f.create_dataset(name, data=np.require(arrays[name], requirements="C"),
                             track_times=False)
        for obj, kv in sorted(attrs.items()):
            for k, v in sorted(kv.items()):
                f[obj].attrs[k] = v


def compute():
    import torch
    gen = torch.Generator().manual_seed(20261202)
    arrays, attrs = {}, {}
    for case, (B, T, H, HKV, D, starts) in CASES.items():
        def rand(*shape, scale=1.0):
            x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
            return x.to(torch.bfloat16).double().requires_grad_(True)

        # q scaled up so that the softmax rows are peaked, not flat
        q, k, v, dout = rand(B, T, H, D, scale=2.0), rand(B, T, HKV, D), rand(B, T, HKV, D), \
            rand(B, T, H, D)
        doc_start = torch.zeros(B, T, dtype=torch.int64)
        for b in range(B):
            for t in range(T):
                doc_start[b, t] = max(s for s in starts[b] if s <= t)
        i = torch.arange(T)
        causal = (i[None, :] <= i[:, None])[None, None]  # (1, 1, T, T): query row, key column
        docs = causal & (i[None, None, :] >= doc_start[:, :, None])[:, None]
        arrays[case + "/q"], arrays[case + "/k"] = q.detach().float().numpy(), k.detach().float().numpy()
        arrays[case + "/v"], arrays[case + "/dout"] = v.detach().float().numpy(), dout.detach().float().numpy()
        arrays[case + "/doc_start"] = doc_start.numpy().astype(np.int32)
        attrs[case] = dict(B=np.int32(B), T=np.int32(T), H=np.int32(H), Hkv=np.int32(HKV),
                           D=np.int32(D))
        rep = H // HKV
        for mname, mask in (("causal", causal), ("docs", docs)):
            qh = q.transpose(1, 2)  # (B, H, T, D)
            kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
            vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
            s = (qh @ kh.transpose(-1, -2) / D**0.5).masked_fill(~mask, float("-inf"))
            out = (torch.softmax(s, dim=-1) @ vh).transpose(1, 2)  # (B, T, H, D)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
            lse = torch.logsumexp(s, dim=-1)  # (B, H, T)
            for name, t in dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv).items():
                arrays["%s/%s/%s" % (case, mname, name)] = t.detach().numpy().astype(np.float64)
    return arrays, attrs


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--write-h5":
        z = np.load(sys.argv[2], allow_pickle=True)
        arrays = {k.replace("|", "/"): z[k] for k in z.files if k != "attrs"}
        write_h5(arrays, z["attrs"][()], PATH)
        return
    arrays, attrs = compute()
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    try:
        import h5py  # noqa: F401
        write_h5(arrays, attrs, PATH)
    except ImportError:
        venv = os.path.join(HERE, "..", "..", ".venv", "bin", "python")
        with tempfile.TemporaryDirectory() as tmp:
            npz = os.path.join(tmp, "ring.npz")
            np.savez(npz, attrs=np.array(attrs, dtype=object),
                     **{k.replace("/", "|"): v for k, v in arrays.items()})
            subprocess.run([venv, os.path.abspath(__file__), "--write-h5", npz], check=True)
    print("wrote", PATH)


if __name__ == "__main__":
    main()
