#!/usr/bin/env python3
"""hf_check.py: checks a folder written by `trident ckpt export --format hf`
with numpy alone (no torch, no trident code), for tests/e2e/hf_export.sh.

  hf_check.py tensors HF_DIR WHOLE.h5 MANIFEST.ini
      Reads every safetensors file of HF_DIR with the parser below (written
      from the format's README: 8-byte little-endian header length, JSON
      header, data offsets), following model.safetensors.index.json when
      there is one; requires the 8-byte alignment of the data, offsets that
      tile the data, the tensor set and shapes of WHOLE.h5 (the HDF5 export
      of the same checkpoint, whole float32 tensors), and values equal to it:
      bit-exact for F32, and equal to the round-to-nearest-even BF16 or F16 of
      the float32 values otherwise. config.json must state the manifest's
      [model] sizes, rope_theta, norm_eps and tie_embeddings; a tied model has
      no lm_head.weight.
  hf_check.py greedy HF_DIR N LOG
      Greedy decoding of N tokens after the eos token with a float64 numpy
      LlamaForCausalLM forward built from config.json and the safetensors
      alone (HF conventions: Linear weights (out, in), rotate_half RoPE with
      pairs (i, i + D/2), query head h reads key/value head h // (H / Hkv)),
      decoded with the folder's tokenizer.json by the tokenizers package;
      the text must equal the last `sample:` of trident's LOG (sampled at
      temperature 0).
  hf_check.py loss HF_DIR SHARDS_DIR SAMPLES_LOG SEQ_LEN GLOBAL_BATCH METRICS
      The mean cross-entropy of the first global batch (the sequences trident's
      loader served, from TRIDENT_LOG_SAMPLES, read from the train split's
      token stream as docs/formats.md says) under the same numpy forward must
      equal the step-1 loss of METRICS (a run started from HF_DIR with
      init_from) within 1e-5 relative: trident's and an independent forward
      agree on every position's logits, RoPE and GQA included.
"""
import configparser
import json
import re
import os
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0, f"{path}: data starts at byte {8 + n}, not 8-aligned"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        spans.append((b, end))
        buf = np.frombuffer(data[b:end], dtype={"F32": "<f4", "BF16": "<u2", "F16": "<f2"}[e["dtype"]])
        out[name] = (e["dtype"], buf.reshape(e["shape"]))
    spans.sort()
    at = 0
    for b, end in spans:
        assert b == at, f"{path}: data offsets do not tile the data (gap or overlap at {at})"
        at = end
    assert at == len(data), f"{path}: {len(data) - at} bytes after the last tensor"
    return out, header.get("__metadata__", {})


def read_folder(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        files = sorted(set(wm.values()))
        assert len(files) > 1, "an index for a single file"
    else:
        wm, files = None, ["model.safetensors"]
    tensors = {}
    for fn in files:
        t, meta = read_safetensors(os.path.join(d, fn))
        assert meta.get("format") == "pt", f"{fn}: __metadata__ format is {meta}"
        for k, v in t.items():
            assert k not in tensors, f"{k} in two files"
            assert wm is None or wm[k] == fn, f"{k}: index says {wm[k]}, found in {fn}"
            tensors[k] = v
    if wm is not None:
        assert set(wm) == set(tensors), "index and files name different tensors"
        total = json.load(open(idx))["metadata"]["total_size"]
        assert total == sum(v[1].nbytes for v in tensors.values()), "index total_size"
    return tensors


def as_f64(dtype, a):
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def bf16_rne(x32):  # float32 array -> bf16 bits, round to nearest even
    u = x32.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def check_tensors(d, h5path, manifest):
    import h5py
    got = read_folder(d)
    want = {}
    with h5py.File(h5path, "r") as f:
        f.visititems(lambda k, v: want.__setitem__(k, v[...]) if isinstance(v, h5py.Dataset) else None)
    assert set(got) == set(want), f"tensor names differ: {sorted(set(got) ^ set(want))}"
    for k, w in want.items():
        dt, g = got[k]
        assert g.shape == w.shape, f"{k}: shape {g.shape}, want {w.shape}"
        w32 = w.astype(np.float32)
        if dt == "F32":
            ok = np.array_equal(g.view(np.uint32), w32.view(np.uint32))
        elif dt == "BF16":
            ok = np.array_equal(g, bf16_rne(w32))
        else:
            ok = np.array_equal(g.view(np.uint16), w32.astype(np.float16).view(np.uint16))
        assert ok, f"{k}: {dt} values differ from the HDF5 export"
    cfg = json.load(open(os.path.join(d, "config.json")))
    m = configparser.ConfigParser()
    m.read(manifest)
    m = m["model"]
    pairs = [("vocab_size", "vocab_size"), ("hidden_size", "d_model"), ("num_hidden_layers", "n_layers"),
             ("num_attention_heads", "n_heads"), ("num_key_value_heads", "n_kv_heads"),
             ("intermediate_size", "ffn_dim"), ("max_position_embeddings", "max_seq_len")]
    for hk, tk in pairs:
        assert cfg[hk] == int(m[tk]), f"config.json {hk} = {cfg[hk]}, manifest {tk} = {m[tk]}"
    assert cfg["rope_theta"] == float(m["rope_theta"]), "rope_theta"
    assert np.float32(cfg["rms_norm_eps"]) == np.float32(float(m["norm_eps"])), "rms_norm_eps"
    tied = bool(int(m["tie_embeddings"]))
    assert cfg["tie_word_embeddings"] == tied, "tie_word_embeddings"
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert ("lm_head.weight" in got) != tied, "lm_head.weight present iff untied"
    dts = {v[0] for v in got.values()}
    assert len(dts) == 1, f"mixed dtypes {dts}"
    want_td = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dts.pop()]
    assert cfg["torch_dtype"] == want_td, f"torch_dtype {cfg['torch_dtype']}, tensors {want_td}"
    print(f"{d}: {len(got)} tensors equal the HDF5 export; config.json matches the manifest")


def forward_last(cfg, W, tokens):
    """Logits (V,) at the last position of tokens (T,), float64."""
    return forward(cfg, W, tokens)[-1]


def forward(cfg, W, tokens):
    """Logits (T, V) of every position of tokens (T,), float64."""
    C, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps, T = C // H, cfg["rms_norm_eps"], len(tokens)

    def rmsnorm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    i = np.arange(D // 2)
    ang = np.arange(T)[:, None] * cfg["rope_theta"] ** (-2.0 * i / D)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):  # (T, Hx, D)
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = W["model.embed_tokens.weight"][tokens]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"])
        q = rope((h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, D))
        k = rope((h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, Hkv, D))
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
        out = np.empty((T, H, D))
        for hh in range(H):
            g = hh // (H // Hkv)
            s = np.where(mask, q[:, hh] @ k[:, g].T / np.sqrt(D), -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (pr / pr.sum(-1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(T, C) @ W[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
        gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
    head = W["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    return rmsnorm(x, W["model.norm.weight"]) @ head.T


def check_loss(d, shards, samples_log, T, G, metrics):
    import h5py
    cfg = json.load(open(os.path.join(d, "config.json")))
    W = {k: as_f64(*v) for k, v in read_folder(d).items()}
    idx = configparser.ConfigParser(inline_comment_prefixes=(";",))
    idx.read(os.path.join(shards, "index.ini"))
    stream = []
    for i in range(int(idx["dataset"]["num_shards"])):
        sec = idx[f"shard-{i:05d}"]
        if sec["split"] == "train":
            with h5py.File(os.path.join(shards, sec["file"]), "r") as f:
                stream.append(f["tokens"][...].astype(np.int64))
    stream = np.concatenate(stream)
    seqs = [int(l.split()[3]) for l in open(samples_log) if l.strip()][:G]
    assert len(seqs) == G, f"{samples_log}: {len(seqs)} samples, want {G}"
    total = 0.0
    for i in seqs:
        x, y = stream[i * T:i * T + T], stream[i * T + 1:i * T + T + 1]
        z = forward(cfg, W, x)
        m = z.max(-1)
        total += (np.log(np.exp(z - m[:, None]).sum(-1)) + m - z[np.arange(T), y]).sum()
    loss = total / (G * T)
    want = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l][0]
    rel = abs(loss - want) / abs(want)
    assert rel < 1e-5, f"numpy loss {loss:.7f}, trident's step-1 loss {want} (rel {rel:.1e})"
    print(f"{d}: numpy loss of the first batch {loss:.7f} = trident's {want} (rel {rel:.1e})")


def check_greedy(d, n, log):
    from tokenizers import Tokenizer
    cfg = json.load(open(os.path.join(d, "config.json")))
    W = {k: as_f64(*v) for k, v in read_folder(d).items()}
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    eos = cfg["eos_token_id"]
    ids, margins, text = [eos], [], b""
    for _ in range(n):
        z = forward_last(cfg, W, np.array(ids))
        top2 = np.sort(z)[-2:]
        margins.append(top2[1] - top2[0])
        nxt = int(np.argmax(z))
        if nxt == eos:
            text += b" <|endoftext|>" if len(ids) > 1 else b"<|endoftext|> (first token)"
            break
        ids.append(nxt)
    # trident decodes a sample at once and prints invalid UTF-8 and control
    # characters other than tab and newline as U+FFFD (docs/design.md §9)
    body = tok.decode(ids[1:], skip_special_tokens=False) if len(ids) > 1 else ""
    body = "".join(ch if ch in "\t\n" or not (ord(ch) < 32 or ord(ch) == 127) else "\ufffd" for ch in body)
    text = body.encode("utf-8") + text
    lines = open(log, "rb").read().split(b"\n")
    samples = [re.split(rb"\| sample \(\d+ tokens, [0-9.]+ s\): ", l, maxsplit=1)[1] for l in lines
               if re.search(rb"\| sample \(\d+ tokens, [0-9.]+ s\): ", l)]
    assert samples, f"{log}: no sample line"
    want = samples[-1]
    assert text == want, f"greedy text differs:\n  numpy: {text!r}\n  trident: {want!r}"
    print(f"{d}: numpy greedy {len(ids) - 1} tokens equal trident's temperature-0 sample "
          f"(smallest top-2 logit margin {min(margins):.2e})")


def check_generate(d, jsonl):
    """Each line of `trident generate --json` (temperature 0) is numpy's greedy
    continuation of its prompt_ids in float64 on the folder d: the same ids,
    stopped at eos exactly when trident says it ended."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    W = {k: as_f64(*v) for k, v in read_folder(d).items()}
    eos, n_lines = cfg["eos_token_id"], 0
    for line in open(jsonl):
        g = json.loads(line)
        ids, margins, ended = list(g["prompt_ids"]), [], False
        for _ in range(len(g["ids"]) + 1):
            z = forward_last(cfg, W, np.array(ids))
            top2 = np.sort(z)[-2:]
            margins.append(top2[1] - top2[0])
            nxt = int(np.argmax(z))
            if nxt == eos:
                ended = True
                break
            ids.append(nxt)
            if len(ids) - len(g["prompt_ids"]) == len(g["ids"]) and not g["ended"]:
                break
        got = ids[len(g["prompt_ids"]):]
        assert got == g["ids"] and ended == g["ended"], \
            f"prompt {g['prompt']!r}: numpy {got} (ended {ended}), trident {g['ids']} (ended {g['ended']})"
        n_lines += 1
        print(f"{d}: prompt {g['prompt'][:30]!r}: numpy greedy {len(got)} ids{' + eos' if ended else ''} "
              f"= trident generate's (smallest top-2 margin {min(margins):.2e})")
    assert n_lines, f"{jsonl}: no lines"


if __name__ == "__main__":
    if sys.argv[1] == "tensors":
        check_tensors(*sys.argv[2:5])
    elif sys.argv[1] == "loss":
        check_loss(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    elif sys.argv[1] == "generate":
        check_generate(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "greedy":
        check_greedy(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit("usage: hf_check.py tensors HF_DIR WHOLE.h5 MANIFEST | greedy HF_DIR N LOG | generate HF_DIR JSONL")
