#!/usr/bin/env python3
"""hf_transformers_check.py: loads a folder written by `trident ckpt export
--format hf` with Hugging Face transformers itself (LlamaForCausalLM,
AutoTokenizer) and compares it with trident, for tests/e2e/hf_transformers.sh.
Runs in .venv-hf (torch 2.15.0 + transformers 4.46.3 pinned in
tests/requirements-hf.txt, made by scripts/deps.sh); no trident code here.

  hf_transformers_check.py logits HF_DIR IDS.txt TRIDENT_LOGITS.safetensors
      LlamaForCausalLM.from_pretrained(HF_DIR, float32, eager attention)
      (following model.safetensors.index.json when the export is sharded,
      which must then be the case: the test shards it); its logits of each
      line of IDS.txt (token ids, one sequence a line) must equal trident's
      (`trident ckpt logits`, tensor "logits" (N, T, V)): relative error
      ||hf - trident|| / ||trident|| of every sequence below 1e-5, and the
      largest absolute difference printed.
  hf_transformers_check.py same A.safetensors B.safetensors
      The tensors "logits" of two `trident ckpt logits` outputs are
      bit-identical (a checkpoint and its FP32 export read by trident).
  hf_transformers_check.py generate HF_DIR N LOG
      HF's greedy generate(do_sample=False, max_new_tokens=N) after the eos
      token (trident's sampler starts a sample so), decoded by the folder's
      tokenizer (AutoTokenizer), must equal the last temperature-0 `sample:`
      of trident's LOG, text for text (trident prints decoded text, with
      control characters other than tab and newline as U+FFFD, and
      " <|endoftext|>" when it stops at the eos token, as generate does).
  hf_transformers_check.py bf16 HF16_DIR HF32_DIR
      from_pretrained(HF16_DIR, torch_dtype="auto") takes bfloat16 from
      config.json, and every parameter equals the round-to-nearest-even
      bfloat16 of the fp32 export's (torch's .to(bfloat16) rounds so).
  hf_transformers_check.py tokenizer HF_DIR DOCS_PREFIX K
      AutoTokenizer.from_pretrained(HF_DIR) loads tokenizer.json and
      tokenizer_config.json: eos_token_id is config.json's; for i < K,
      DOCS_PREFIX.i.ids holds a document's ids from the dataset's shard (as
      `trident prep` encoded it) and DOCS_PREFIX.i.txt trident's decoding of
      them: HF encodes the text to the same ids and decodes the ids to the
      same text.
  hf_transformers_check.py batch FILE
      Each line of FILE is LABEL, a command above and its arguments, separated
      by tabs: runs them all in this one process (torch and transformers
      imported once: seconds each time), printing "FAIL: LABEL: why" for each
      that fails; exit 1 when one did.
"""
import json
import os
import re
import sys

import torch
import transformers
from safetensors.numpy import load_file
from transformers import AutoTokenizer, LlamaForCausalLM

torch.set_grad_enabled(False)
transformers.logging.set_verbosity_error()  # no progress bars nor advice on stderr
transformers.logging.disable_progress_bar()


def load(d, **kw):
    m = LlamaForCausalLM.from_pretrained(d, attn_implementation="eager", **kw)
    m.eval()
    return m


def check_logits(d, ids_path, trident_path):
    sharded = os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    assert sharded, f"{d}: not sharded (the test exports with a small --max-shard-size)"
    m = load(d, torch_dtype=torch.float32)
    assert m.dtype == torch.float32
    rows = [[int(x) for x in l.split()] for l in open(ids_path) if l.strip()]
    want = load_file(trident_path)["logits"]
    assert want.shape == (len(rows), len(rows[0]), m.config.vocab_size), f"trident logits {want.shape}"
    worst_rel = worst_abs = 0.0
    for i, r in enumerate(rows):
        got = m(torch.tensor([r])).logits[0].numpy().astype("float64")
        w = want[i].astype("float64")
        rel = float(((got - w) ** 2).sum() ** 0.5 / (w ** 2).sum() ** 0.5)
        worst_rel, worst_abs = max(worst_rel, rel), max(worst_abs, float(abs(got - w).max()))
        assert rel < 1e-5, f"sequence {i}: transformers' logits differ from trident's: rel {rel:.2e}"
    print(f"{d}: transformers {transformers.__version__} logits of {len(rows)} x {len(rows[0])} tokens "
          f"= trident's (largest rel {worst_rel:.1e}, largest |diff| {worst_abs:.1e}; sharded, "
          f"{'tied' if m.config.tie_word_embeddings else 'untied'}, "
          f"{m.config.num_attention_heads} heads / {m.config.num_key_value_heads} kv heads)")


def check_same(a, b):
    x, y = load_file(a)["logits"], load_file(b)["logits"]
    assert x.shape == y.shape and (x.view("u4") == y.view("u4")).all(), f"{a} and {b} differ"
    print(f"{a} = {b}: {x.shape} logits bit-identical")


def sanitize(s):  # trident's tokenizer_utf8_sanitize for printing (docs/design.md §9)
    return "".join(c if c in "\t\n" or not (ord(c) < 32 or ord(c) == 127) else "\ufffd" for c in s)


def check_generate(d, n, log):
    m = load(d, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d)
    eos = m.config.eos_token_id
    assert m.generation_config.eos_token_id == eos, "generation_config eos"
    x = torch.tensor([[eos]])
    out = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                     pad_token_id=eos)[0, 1:]
    ids = out.tolist()
    ended = eos in ids
    if ended:
        ids = ids[:ids.index(eos)]
    text = sanitize(tok.decode(ids, skip_special_tokens=False)).encode("utf-8")
    if ended:
        text += b" <|endoftext|>" if ids else b"<|endoftext|> (first token)"
    pat = rb"\| sample \(\d+ tokens, [0-9.]+ s\): "
    samples = [re.split(pat, l, maxsplit=1)[1] for l in open(log, "rb").read().split(b"\n")
               if re.search(pat, l)]
    assert samples, f"{log}: no sample line"
    assert text == samples[-1], f"greedy text differs:\n  transformers: {text!r}\n  trident: {samples[-1]!r}"
    assert ended or len(ids) == n, f"{len(ids)} tokens generated"
    print(f"{d}: transformers generate(do_sample=False) {len(ids)} tokens{' + eos' if ended else ''} "
          f"= trident's temperature-0 sample")


def check_bf16(d16, d32):
    m16, m32 = load(d16, torch_dtype="auto"), load(d32, torch_dtype=torch.float32)
    assert json.load(open(os.path.join(d16, "config.json")))["torch_dtype"] == "bfloat16"
    assert m16.dtype == torch.bfloat16, f"torch_dtype auto gave {m16.dtype}"
    s16, s32 = m16.state_dict(), m32.state_dict()
    assert s16.keys() == s32.keys()
    for k, v in s16.items():
        assert v.dtype == torch.bfloat16, f"{k}: {v.dtype}"
        rne = s32[k].to(torch.bfloat16)
        assert torch.equal(v.view(torch.int16), rne.view(torch.int16)), f"{k}: not the RNE bf16 of fp32"
    print(f"{d16}: from_pretrained(torch_dtype='auto') is bfloat16, {len(s16)} tensors = RNE of the fp32 export")


def check_tokenizer(d, prefix, k):
    tok = AutoTokenizer.from_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert tok.eos_token_id == cfg["eos_token_id"], f"eos {tok.eos_token_id}, config {cfg['eos_token_id']}"
    n = 0
    for i in range(k):
        ids = [int(x) for x in open(f"{prefix}.{i}.ids").read().split()]
        text = open(f"{prefix}.{i}.txt", encoding="utf-8").read()
        got = tok.encode(text, add_special_tokens=False)
        assert got == ids, f"document {i}: transformers encodes {got[:12]}..., the dataset holds {ids[:12]}..."
        assert tok.decode(ids) == text, f"document {i}: decoded text differs"
        n += len(ids)
    print(f"{d}: AutoTokenizer ({type(tok).__name__}) encodes {k} dataset documents ({n} tokens) "
          f"to the shard's ids and decodes them to trident's text")


def run(cmd, a):
    if cmd == "logits":
        check_logits(*a)
    elif cmd == "same":
        check_same(*a)
    elif cmd == "generate":
        check_generate(a[0], int(a[1]), a[2])
    elif cmd == "bf16":
        check_bf16(*a)
    elif cmd == "tokenizer":
        check_tokenizer(a[0], a[1], int(a[2]))
    else:
        sys.exit(__doc__)


def batch(path):
    failed = 0
    for line in open(path, encoding="utf-8"):
        if not line.strip():
            continue
        label, cmd, *a = line.rstrip("\n").split("\t")
        try:
            run(cmd, a)
        except Exception as e:  # AssertionError and the loaders' errors: this check fails, go on
            failed += 1
            print(f"FAIL: {label}: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1] == "batch":
        sys.exit(batch(sys.argv[2]))
    run(sys.argv[1], sys.argv[2:])
