#!/usr/bin/env python3
"""llama_reference.py: float64 PyTorch reference for trident's LLaMA model.

Writes tests/reference/fixtures/llama_tiny_untied.h5 and llama_tiny_tied.h5,
which the C model tests read (they need HDF5, never torch). Run
`python3 tests/reference/llama_reference.py` from anywhere: it is seeded and
regenerates both files byte-identically (h5py, no compression, no timestamps).

The model is transformers' LlamaForCausalLM (attn_implementation="eager"),
converted with model.double(). Three places of that code compute in float32
even in a float64 model (transformers 5.x modeling_llama.py):
  1. LlamaRotaryEmbedding: inv_freq is built in float32 and forward() does
     position_ids.float() * inv_freq.float(), then cos/sin in float32;
  2. LlamaRMSNorm.forward casts the hidden states to float32;
  3. eager_attention_forward runs softmax(dtype=torch.float32).
patch_llama_float64() replaces those three with the same math in the input
dtype, so every number here is float64; check_float64() proves it with
central finite differences (patched: ~5e-8 of the largest gradient, the
differencing noise; unpatched HF: ~9e-2). check_contract() then recomputes
/forward from the written file alone with plain numpy, following ops.h's
conventions, and requires agreement to 1e-12. The RoPE angle is p * theta^(-2i/D) computed in
double, as trident's rope_table_fill() does.

Mapping to trident's contracts (kernels/ops.h, docs/design.md):
- Weights: /weights/<HF parameter name>, float32, HF shapes, i.e. PyTorch's
  Linear layout W (out, in); q_proj (H*D, C), k_proj/v_proj (Hkv*D, C),
  o_proj (C, H*D), gate/up (F, C), down (C, F), embed (V, C), norms (C,).
  Query head h reads key/value head h // (H / Hkv) (HF repeat_kv). Within a
  projection the D columns of a head are contiguous and RoPE pairs i with
  i + D/2 (rotate_half), as in ops.h. The initial weights are float64 values
  that are exactly representable in float32: the C side loads them losslessly.
- Tied (tie_embeddings=1): there is no lm_head.weight; the logits use
  model.embed_tokens.weight, and its gradient includes the LM head's part.
- /inputs/targets are the targets themselves (no shift inside): position
  (b, t) is scored against targets[b, t]; -100 (ignore_index) is skipped.
- Loss: torch cross_entropy, mean over the non-ignored targets of the batch.
  /forward_ls and /grads_ls use label_smoothing = 0.1 (ops.h's s / V term).
- Train: torch.optim.AdamW, update as in ops.h backend_adamw (decoupled
  decay w *= 1 - lr*wd first); weight decay on every 2-D weight, none on the
  1-D norm gains; clip_grad_norm_ over all parameters, which scales the
  gradients by max_norm / (norm + 1e-6) when that is < 1 (note the 1e-6);
  grad_norms are the pre-clip L2 norms. lr for step s (from 0):
  s < warmup: max_lr*(s+1)/warmup; else min_lr + 0.5*(max_lr-min_lr)*
  (1+cos(pi*(s-warmup)/(steps-warmup))). losses[s] is the loss before the
  update of step s, on batch s.
- Storage: every result (logits, losses, lrs, grad norms, /grads, /grads_ls,
  /train/final) is stored in float64 (~3 MB a file), so that a trident FP64
  model run is checked to ~1e-9, not only to float32 rounding.
- The peak learning rate 3e-3 is a typical one for a model this small; a much
  larger one (1e-2 against weights of std 0.02) makes Adam amplify the last
  bit of fp32 rounding in near-zero gradients into 1e-5 weight differences.
"""
import math
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import transformers.models.llama.modeling_llama as hf_llama
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")

CONFIG = dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
              ffn_dim=176, max_seq_len=64, rope_theta=10000.0, norm_eps=1e-5)
BATCH, SEQ_LEN, IGNORE = 2, 16, -100
N_IGNORED = 3  # targets set to ignore_index per batch
LABEL_SMOOTHING = 0.1
TRAIN = dict(lr=3e-3, min_lr=3e-4, warmup_steps=3, steps=10, beta1=0.9, beta2=0.95,
             adam_eps=1e-8, weight_decay=0.1, label_smoothing=0.0)
# Chosen so that clipping is active on some steps and not on others, each
# norm at least CLIP_MARGIN away from the threshold (checked in train()).
GRAD_CLIP = {"untied": 2.3, "tied": 2.3}
CLIP_MARGIN = 0.02


# ---- float64 patches -------------------------------------------------------

def _rotary_forward_f64(self, x, position_ids):
    dim = self.inv_freq.numel() * 2
    theta = self.config.rope_parameters["rope_theta"]
    i = torch.arange(0, dim, 2, dtype=torch.float64, device=x.device)
    inv_freq = theta ** (-i / dim)  # (D/2,)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (B, T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * self.attention_scaling).to(x.dtype),
            (emb.sin() * self.attention_scaling).to(x.dtype))


def _rmsnorm_forward_f64(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _eager_attention_f64(module, query, key, value, attention_mask, scaling, dropout=0.0,
                         **kwargs):
    key_states = hf_llama.repeat_kv(key, module.num_key_value_groups)
    value_states = hf_llama.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.softmax(attn_weights, dim=-1)  # in the input dtype
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


def patch_llama_float64():
    hf_llama.LlamaRotaryEmbedding.forward = _rotary_forward_f64
    hf_llama.LlamaRMSNorm.forward = _rmsnorm_forward_f64
    hf_llama.eager_attention_forward = _eager_attention_f64


# ---- model -------------------------------------------------------------------

def build_model(tied, seed):
    cfg = LlamaConfig(vocab_size=CONFIG["vocab_size"], hidden_size=CONFIG["d_model"],
                      num_hidden_layers=CONFIG["n_layers"],
                      num_attention_heads=CONFIG["n_heads"],
                      num_key_value_heads=CONFIG["n_kv_heads"],
                      intermediate_size=CONFIG["ffn_dim"],
                      max_position_embeddings=CONFIG["max_seq_len"],
                      rope_theta=CONFIG["rope_theta"], rms_norm_eps=CONFIG["norm_eps"],
                      attention_bias=False, mlp_bias=False, hidden_act="silu",
                      tie_word_embeddings=tied, pad_token_id=None,
                      attention_dropout=0.0)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).double()
    model.config._attn_implementation = "eager"
    assert model.model.embed_tokens.padding_idx is None
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                w = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.02
            else:
                w = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(w.float().double())  # exactly representable in float32
    model.train()  # dropout is 0; train() only matters for HF's bookkeeping
    return model


def params(model):
    # named_parameters() lists a tied weight once, as model.embed_tokens.weight.
    return list(model.named_parameters())


def random_batch(gen, shape):
    V = CONFIG["vocab_size"]
    tokens = torch.randint(0, V, shape, generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, shape, generator=gen, dtype=torch.int64)
    flat = targets.view(-1, shape[-2] * shape[-1])
    for row in flat:  # N_IGNORED distinct positions of each (B, T) batch
        idx = torch.randperm(row.numel(), generator=gen)[:N_IGNORED]
        row[idx] = IGNORE
    return tokens, targets


def loss_fn(model, tokens, targets, smoothing):
    logits = model(input_ids=tokens).logits  # (B, T, V), float64
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                           ignore_index=IGNORE, label_smoothing=smoothing)
    return logits, loss


def grads_of(model, tokens, targets, smoothing):
    model.zero_grad(set_to_none=True)
    logits, loss = loss_fn(model, tokens, targets, smoothing)
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad.detach().clone() for n, p in params(model)}


def check_float64(model, tokens, targets, grads):
    # Central differences on a few entries: with every op in float64 they agree
    # with autograd to ~1e-9 relative; a float32 op inside would show ~1e-4.
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    with torch.no_grad():
        for name, p in params(model):
            flat = p.view(-1)
            for _ in range(2):
                i = int(torch.randint(0, flat.numel(), (1,), generator=gen))
                old = flat[i].item()
                h = 1e-5
                flat[i] = old + h
                lp = loss_fn(model, tokens, targets, 0.0)[1].item()
                flat[i] = old - h
                lm = loss_fn(model, tokens, targets, 0.0)[1].item()
                flat[i] = old
                fd = (lp - lm) / (2 * h)
                g = grads[name].view(-1)[i].item()
                worst = max(worst, abs(fd - g) / grads[name].abs().max().item())
    assert worst < 1e-6, f"finite differences disagree with autograd: {worst:.3e}"
    return worst


def lr_at(step):
    t = TRAIN
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    ratio = (step - t["warmup_steps"]) / (t["steps"] - t["warmup_steps"])
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1.0 + math.cos(math.pi * ratio))


def train(model, batches, grad_clip, label):
    decay = [p for _, p in params(model) if p.dim() == 2]
    no_decay = [p for _, p in params(model) if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]),
                            eps=TRAIN["adam_eps"], foreach=False)
    losses, lrs, norms, clipped = [], [], [], []
    all_params = [p for _, p in params(model)]
    for step, (tokens, targets) in enumerate(batches):
        lr = lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        _, loss = loss_fn(model, tokens, targets, TRAIN["label_smoothing"])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(all_params, max_norm=grad_clip).item()
        opt.step()
        assert abs(norm - grad_clip) > CLIP_MARGIN * grad_clip, \
            f"{label} step {step}: grad norm {norm} too close to grad_clip {grad_clip}"
        losses.append(loss.item())
        lrs.append(lr)
        norms.append(norm)
        clipped.append(norm > grad_clip)
    print(f"{label}: grad_clip {grad_clip}; step: loss, pre-clip norm, clipped")
    for s in range(len(losses)):
        print(f"  {s}: {losses[s]:.10f} {norms[s]:.4f} {'clipped' if clipped[s] else '-'}")
    assert any(clipped) and not all(clipped), f"{label}: clipping must be mixed: {clipped}"
    return losses, lrs, norms


# ---- output --------------------------------------------------------------------

def put(f, name, array, dtype):
    f.create_dataset(name, data=np.require(np.asarray(array, dtype=dtype), requirements="C"),
                     track_times=False)


def generate(tied, seed):
    label = "tied" if tied else "untied"
    torch.manual_seed(seed)
    model = build_model(tied, seed)
    init = {n: p.detach().clone() for n, p in params(model)}
    gen = torch.Generator().manual_seed(seed + 1)
    tokens, targets = random_batch(gen, (BATCH, SEQ_LEN))

    logits, loss, grads = grads_of(model, tokens, targets, 0.0)
    _, loss_ls, grads_ls = grads_of(model, tokens, targets, LABEL_SMOOTHING)
    worst = check_float64(model, tokens, targets, grads)
    print(f"{label}: loss {loss.item():.10f}, smoothed {loss_ls.item():.10f}, "
          f"finite-difference rel err {worst:.2e}")

    batches = [random_batch(gen, (BATCH, SEQ_LEN)) for _ in range(TRAIN["steps"])]
    grad_clip = GRAD_CLIP[label]
    losses, lrs, norms = train(model, batches, grad_clip, label)

    path = os.path.join(FIXTURES, f"llama_tiny_{label}.h5")
    os.makedirs(FIXTURES, exist_ok=True)
    with h5py.File(path, "w", libver="earliest", track_order=False) as f:
        attrs = dict(CONFIG, tie_embeddings=int(tied), batch=BATCH, seq_len=SEQ_LEN,
                     ignore_index=IGNORE)
        for k, v in attrs.items():
            f.attrs[k] = np.float64(v) if isinstance(v, float) else np.int64(v)
        for n, w in init.items():
            put(f, f"weights/{n}", w.numpy(), np.float32)
        put(f, "inputs/tokens", tokens.numpy(), np.int32)
        put(f, "inputs/targets", targets.numpy(), np.int32)
        put(f, "forward/logits", logits.numpy(), np.float64)
        put(f, "forward/loss", loss.item(), np.float64)
        put(f, "forward_ls/loss", loss_ls.item(), np.float64)
        f["forward_ls"].attrs["label_smoothing"] = np.float64(LABEL_SMOOTHING)
        for n, g in grads.items():
            put(f, f"grads/{n}", g.numpy(), np.float64)
        for n, g in grads_ls.items():
            put(f, f"grads_ls/{n}", g.numpy(), np.float64)
        tr = f.create_group("train")
        for k, v in TRAIN.items():
            tr.attrs[k] = np.float64(v) if isinstance(v, float) else np.int64(v)
        tr.attrs["grad_clip"] = np.float64(grad_clip)
        put(f, "train/tokens", torch.stack([b[0] for b in batches]).numpy(), np.int32)
        put(f, "train/targets", torch.stack([b[1] for b in batches]).numpy(), np.int32)
        put(f, "train/losses", losses, np.float64)
        put(f, "train/lrs", lrs, np.float64)
        put(f, "train/grad_norms", norms, np.float64)
        for n, p in params(model):
            put(f, f"train/final/{n}", p.detach().numpy(), np.float64)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    check_contract(path)


def check_contract(path):
    """Recomputes /forward from the file alone with plain numpy, written from
    ops.h's conventions rather than HF's code: proves the stored weights,
    layouts, head grouping and RoPE pairing mean what the header says."""
    with h5py.File(path, "r") as f:
        a = {k: f.attrs[k].item() for k in f.attrs}
        W = {k: f["weights"][k][...].astype(np.float64) for k in f["weights"]}
        tokens, targets = f["inputs/tokens"][...], f["inputs/targets"][...]
        want_logits, want_loss = f["forward/logits"][...], f["forward/loss"][()]
        want_ls = f["forward_ls/loss"][()]
    C, H, Hkv = a["d_model"], a["n_heads"], a["n_kv_heads"]
    D, eps, (B, T) = C // H, a["norm_eps"], tokens.shape

    def rmsnorm(x, w):  # (B, T, C)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    i = np.arange(D // 2)
    ang = np.arange(T)[:, None] * a["rope_theta"] ** (-2.0 * i / D)  # (T, D/2)
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]

    def rope(x):  # (B, T, Hx, D): pairs (i, i + D/2)
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = W["model.embed_tokens.weight"][tokens]  # (B, T, C)
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(a["n_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"])
        q = rope((h @ W[p + "self_attn.q_proj.weight"].T).reshape(B, T, H, D))
        k = rope((h @ W[p + "self_attn.k_proj.weight"].T).reshape(B, T, Hkv, D))
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(B, T, Hkv, D)
        out = np.empty((B, T, H, D))
        for hh in range(H):
            g = hh // (H // Hkv)
            s = np.einsum("btd,bsd->bts", q[:, :, hh], k[:, :, g]) / np.sqrt(D)
            s = np.where(mask, s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            out[:, :, hh] = pr @ v[:, :, g]
        x = x + out.reshape(B, T, C) @ W[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
        gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
    head = W["lm_head.weight" if not a["tie_embeddings"] else "model.embed_tokens.weight"]
    logits = rmsnorm(x, W["model.norm.weight"]) @ head.T  # (B, T, V)
    err = np.abs(logits - want_logits).max() / np.abs(want_logits).max()
    assert err < 1e-12, f"{path}: numpy logits differ from the reference: {err:.3e}"
    z = logits.reshape(-1, logits.shape[-1])
    y = targets.reshape(-1)
    keep = y != a["ignore_index"]
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    for sm, want in ((0.0, want_loss), (LABEL_SMOOTHING, want_ls)):
        rows = lse - (1 - sm) * z[np.arange(len(y)), np.where(keep, y, 0)] - sm * z.mean(-1)
        loss = rows[keep].mean()
        assert abs(loss - want) < 1e-12 * abs(want), f"{path}: numpy loss {loss} != {want}"
    print(f"{path}: numpy forward from the file matches (logits rel err {err:.1e})")


def main():
    torch.set_num_threads(1)  # deterministic reductions
    torch.use_deterministic_algorithms(True)
    patch_llama_float64()
    generate(tied=False, seed=1234)
    generate(tied=True, seed=5678)


if __name__ == "__main__":
    main()
