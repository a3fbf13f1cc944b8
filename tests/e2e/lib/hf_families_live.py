#!/usr/bin/env python3
"""hf_families_live.py: transformers itself (.venv-hf) loads trident's exports
of the four families, for tests/e2e/hf_families.sh.

  hf_families_live.py FAMILY EXPORT_DIR TOKENS.txt TRIDENT_LOGITS.safetensors [...]
      (groups of four) for each: config.json names the family's class and
      model_type; the folder loads with no missing or unexpected key (llama,
      qwen2, mistral: from_pretrained of transformers' class; qwen3: the
      Qwen3 port of tests/reference/hf_families_reference.py, transformers
      4.46.3 having no Qwen3), and its logits of TOKENS.txt equal trident's
      within 1e-5 relative (||hf - trident|| / ||trident||).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../reference"))
import hf_families_reference as R  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

transformers.logging.set_verbosity_error()
CLASS = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
         "qwen3": ("Qwen3ForCausalLM", "qwen3"), "mistral": ("MistralForCausalLM", "mistral")}
bad = 0
args = sys.argv[1:]
for i in range(0, len(args), 4):
    fam, d, toks, tl = args[i:i + 4]
    c = json.load(open(f"{d}/config.json"))
    want = CLASS[fam]
    if (c["architectures"] != [want[0]]) or c["model_type"] != want[1]:
        print(f"{fam}: {d}/config.json says {c['architectures']} {c['model_type']}, expected {want}")
        bad += 1
        continue
    m = R.load(fam, d)  # asserts no missing / unexpected keys
    ids = [int(x) for x in open(toks).read().split()]
    hf = R.logits(m, ids).astype(np.float64)
    tr = load_file(tl)["logits"].astype(np.float64)
    rel = np.linalg.norm(hf - tr) / np.linalg.norm(tr)
    print(f"{fam}: {d} loads as {want[0]}, logits relative error {rel:.2e}")
    bad += rel >= 1e-5
sys.exit(1 if bad else 0)
