#!/usr/bin/env python3
"""hf_families_check.py: numpy checks of tests/e2e/hf_families.sh against the
fixtures of tests/reference/hf_families_reference.py (transformers' logits and
greedy ids). No transformers here (the fixtures hold its results).

  hf_families_check.py tokens REF_DIR N OUT.txt
      the first N of reference.json's tokens, one line, for `trident ckpt logits`
  hf_families_check.py logits REF_DIR KEY TRIDENT.safetensors
      trident's "logits" (1, T, V) equal reference.safetensors' KEY (its first T
      positions): ||trident - hf|| / ||hf|| below 1e-5
  hf_families_check.py variant REF_DIR K CONFIG_OUT
      writes config.json with variant K's edits ("set", "drop") applied
  hf_families_check.py nvariants REF_DIR
  hf_families_check.py generate REF_DIR GEN.jsonl N [ENDED]
      `trident generate --json` gave reference.json's prompt_ids and the first N
      greedy ids; ENDED (true or false) what "ended" must be
  hf_families_check.py stopfile REF_DIR K OUT.json
      generation_config.json whose eos_token_id is [the fixture's first eos id,
      greedy[K]]: generation must stop after greedy[:K]
"""
import json
import sys

import numpy as np


def load_st(path):
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(v["shape"])
    return out


def ref(d):
    return json.load(open(f"{d}/reference.json"))


def main():
    cmd, d = sys.argv[1], sys.argv[2]
    if cmd == "tokens":
        n = int(sys.argv[3])
        open(sys.argv[4], "w").write(" ".join(map(str, ref(d)["tokens"][:n])) + "\n")
    elif cmd == "logits":
        key, got = sys.argv[3], load_st(sys.argv[4])["logits"].astype(np.float64)
        want = load_st(f"{d}/reference.safetensors")[key].astype(np.float64)[:, :got.shape[1]]
        assert got.shape == want.shape, (got.shape, want.shape)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        print(f"{d} {key}: {got.shape[1]} positions, relative error {rel:.2e}, max abs {np.abs(got - want).max():.2e}")
        sys.exit(0 if rel < 1e-5 else 1)
    elif cmd == "variant":
        r, k = ref(d), int(sys.argv[3])
        c = json.load(open(f"{d}/config.json"))
        c.update(r["variants"][k].get("set", {}))
        for key in r["variants"][k].get("drop", []):
            c.pop(key, None)
        json.dump(c, open(sys.argv[4], "w"))
        print(json.dumps(r["variants"][k]))
    elif cmd == "nvariants":
        print(len(ref(d)["variants"]))
    elif cmd == "generate":
        r, n = ref(d), int(sys.argv[4])
        g = json.loads(open(sys.argv[3]).readline())
        ok = g["prompt_ids"] == r["prompt_ids"] and g["ids"] == r["greedy"][:n]
        if len(sys.argv) > 5:
            ok = ok and g["ended"] == (sys.argv[5] == "true")
        if not ok:
            print(f"{d}: trident prompt {g['prompt_ids']} ids {g['ids']} ended {g['ended']}\n"
                  f"   transformers prompt {r['prompt_ids']} greedy {r['greedy'][:n]}")
        sys.exit(0 if ok else 1)
    elif cmd == "stopfile":
        r, k = ref(d), int(sys.argv[3])
        json.dump({"bos_token_id": 256, "eos_token_id": [r["eos_token_id"][0], r["greedy"][k]]},
                  open(sys.argv[4], "w"))
        # trident stops at the first occurrence of greedy[k]
        print(r["greedy"].index(r["greedy"][k]))


main()
