#!/usr/bin/env python3
"""Fixture for prompt-masked SFT loss (issue 16, acceptance 3): writes
tests/reference/fixtures/sft_mask.h5, read by tests/unit/test_sft_loss.c.

Independent of trident: the logits are the ones PyTorch's LlamaForCausalLM
(float64) produced for llama_tiny_untied.h5's /inputs/tokens (written by
llama_reference.py); the masked cross-entropy and its global-batch
normalisation are computed here in float64 numpy:

  loss = sum_{b,t: keep[b,t]} (lse(z[b,t]) - z[b,t,y[b,t]]) / sum keep,
  keep[b,t] = mask[b,t+1] == 1 and y[b,t] != -100,

with mask (B, T+1) a per-token loss mask of mixed prompt/response lengths
(row 0: two short chats, row 1: one long prompt and a short response), as
`trident prep --format chat` writes it.

The loss and its gradient are then computed a second time by PyTorch:
torch.nn.functional.cross_entropy(reduction="sum", ignore_index=-100) over
the masked targets, divided by the kept count, differentiated by autograd,
in float64. .venv (h5py) has no torch, so that part runs in Debian's
python3-torch (/usr/bin/python3, `make deps`) on a temporary .npz; the two
must agree to 1e-13 and the file stores PyTorch's values. Without
/usr/bin/python3's torch the script stops (the fixture would not be a
PyTorch reference).

Also written: dlogits (B, T, V), the gradient of loss wrt the logits, zero on
rows not kept (prompt-only positions), and the masked targets.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "fixtures", "llama_tiny_untied.h5")
OUT = os.path.join(HERE, "fixtures", "sft_mask.h5")
IGNORE = -100


def make_mask(B, T):
    m = np.zeros((B, T + 1), np.uint8)
    # row 0: prompt [0, 4), response [4, 9), prompt [9, 13), response [13, 17)
    m[0, 4:9] = 1
    m[0, 13:T + 1] = 1
    # row 1: prompt [0, 12), response [12, 17)
    m[1, 12:T + 1] = 1
    return m


TORCH_PART = r"""
import sys
import numpy as np
import torch
a = np.load(sys.argv[1])
z = torch.tensor(a["logits"], dtype=torch.float64, requires_grad=True)
y = torch.tensor(a["masked"], dtype=torch.int64)
count = int((y != -100).sum())
loss = torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1),
                                         ignore_index=-100, reduction="sum") / count
loss.backward()
np.savez(sys.argv[2], loss=loss.detach().numpy(), dlogits=z.grad.numpy(),
         version=np.array(torch.__version__))
"""


def torch_loss(logits, masked):
    """(loss, dlogits, torch version) from PyTorch in /usr/bin/python3."""
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.npz"), os.path.join(d, "out.npz")
        np.savez(inp, logits=logits, masked=masked)
        subprocess.run(["/usr/bin/python3", "-c", TORCH_PART, inp, out], check=True)
        r = np.load(out)
        return float(r["loss"]), r["dlogits"], str(r["version"])


def main():
    import h5py
    with h5py.File(SRC, "r") as f:
        tokens = f["inputs/tokens"][...]
        targets = f["inputs/targets"][...]
        logits = f["forward/logits"][...].astype(np.float64)  # (B, T, V) from torch, float64
    B, T, V = logits.shape
    mask = make_mask(B, T)
    keep = (mask[:, 1:] == 1) & (targets != IGNORE)
    z = logits
    zmax = z.max(axis=-1, keepdims=True)
    lse = (zmax[..., 0] + np.log(np.exp(z - zmax).sum(axis=-1)))
    safe = np.where(targets == IGNORE, 0, targets)
    zy = np.take_along_axis(z, safe[..., None], axis=-1)[..., 0]
    row = np.where(keep, lse - zy, 0.0)
    count = int(keep.sum())
    loss = row.sum() / count
    p = np.exp(z - lse[..., None])
    onehot = np.zeros_like(z)
    np.put_along_axis(onehot, safe[..., None], 1.0, axis=-1)
    dlogits = np.where(keep[..., None], (p - onehot) / count, 0.0)
    masked = np.where(keep, targets, IGNORE).astype(np.int32)
    # The per-microbatch mean averaged over microbatches differs (rows keep
    # different counts): the fixture must tell the two normalisations apart.
    per_micro = np.mean([row[b].sum() / keep[b].sum() for b in range(B)])
    assert abs(per_micro - loss) > 1e-3, (per_micro, loss)
    t_loss, t_dlogits, t_version = torch_loss(logits, masked)
    assert abs(t_loss - loss) <= 1e-13, (t_loss, loss)
    assert np.abs(t_dlogits - dlogits).max() <= 1e-13, np.abs(t_dlogits - dlogits).max()
    loss, dlogits = t_loss, t_dlogits
    with h5py.File(OUT, "w") as f:
        f.attrs["source"] = "llama_tiny_untied.h5 /forward/logits (PyTorch float64)"
        f.attrs["loss_by"] = f"torch {t_version} cross_entropy(reduction=sum, ignore_index=-100) / count, autograd"
        f.attrs["count"] = count
        f.create_dataset("tokens", data=tokens.astype(np.int32))
        f.create_dataset("targets", data=targets.astype(np.int32))
        f.create_dataset("mask", data=mask)
        f.create_dataset("masked_targets", data=masked)
        f.create_dataset("loss", data=np.float64(loss))
        f.create_dataset("loss_per_micro_mean", data=np.float64(per_micro))
        f.create_dataset("dlogits", data=dlogits)
    print(f"numpy and torch {t_version} agree to 1e-13 (loss, dlogits)", file=sys.stderr)
    print(f"{OUT}: B={B} T={T} V={V} kept {count} of {B * T} targets, loss {loss:.12f} "
          f"(per-microbatch mean would be {per_micro:.12f})")


if __name__ == "__main__":
    main()
