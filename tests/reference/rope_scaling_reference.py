#!/usr/bin/env python3
"""rope_scaling_reference.py: Hugging Face's RoPE frequencies with rope_scaling.

Writes tests/reference/fixtures/rope_scaling_inv_freq.txt, which
tests/unit/test_ops_cpu.c (test_rope_scaling_reference) reads to check
rope_inv_freq() (kernels/rope_table.c) and the tables of
rope_table_fill_scaled(). Run with the transformers environment:
`.venv-hf/bin/python tests/reference/rope_scaling_reference.py`.

Each case builds a LlamaConfig and calls transformers' own
ROPE_INIT_FUNCTIONS[rope_type] (modeling_rope_utils.py:
_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
_compute_llama3_parameters), the functions LlamaRotaryEmbedding uses. They
compute in float32, so the file's values carry float32 rounding (~1e-7
relative); trident computes in double. Lines:
  TYPE D THETA FACTOR LOW HIGH ORIGINAL_MAX_POS I INV_FREQ
with TYPE none | linear | llama3 and INV_FREQ to 9 significant digits.
The cases: Llama 3.1/3.2's published values (D 64 and 128, theta 500000,
factor 8 (3.2: 32), low 1, high 4, original 8192), and the small ones of
trident's tests (D 24 and 16, original 16 and 4), chosen so that every band
(kept, divided, smoothed) holds some frequencies.
"""
import os

import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "rope_scaling_inv_freq.txt")

CASES = [  # type, D, theta, factor, low, high, original_max_pos
    ("none", 64, 500000.0, 1.0, 1.0, 4.0, 8192),
    ("llama3", 64, 500000.0, 8.0, 1.0, 4.0, 8192),
    ("llama3", 128, 500000.0, 8.0, 1.0, 4.0, 8192),
    ("llama3", 64, 500000.0, 32.0, 1.0, 4.0, 8192),
    ("llama3", 24, 10000.0, 4.0, 1.0, 4.0, 16),
    ("llama3", 12, 10000.0, 4.0, 1.0, 4.0, 4),
    ("llama3", 16, 10000.0, 2.0, 0.5, 2.0, 32),
    ("linear", 32, 10000.0, 2.0, 1.0, 4.0, 8192),
    ("linear", 16, 10000.0, 4.0, 1.0, 4.0, 8192),
]


def inv_freq(kind, D, theta, factor, low, high, orig):
    H = 2
    cfg = LlamaConfig(hidden_size=D * H, num_attention_heads=H, num_key_value_heads=H,
                      head_dim=D, rope_theta=theta, max_position_embeddings=4 * orig)
    if kind == "linear":
        cfg.rope_scaling = {"rope_type": "linear", "factor": factor}
    elif kind == "llama3":
        cfg.rope_scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": orig}
    fn = ROPE_INIT_FUNCTIONS["default" if kind == "none" else kind]
    freq, scale = fn(cfg, torch.device("cpu"))
    assert scale == 1.0, scale
    assert freq.numel() == D // 2
    return freq.tolist()


def main():
    lines = []
    for c in CASES:
        for i, f in enumerate(inv_freq(*c)):
            kind, D, theta, factor, low, high, orig = c
            lines.append(f"{kind} {D} {theta:.17g} {factor:.17g} {low:.17g} {high:.17g} {orig} {i} {f:.9e}")
    with open(OUT, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} frequencies to {OUT}")


if __name__ == "__main__":
    main()
