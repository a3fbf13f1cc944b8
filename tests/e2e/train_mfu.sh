#!/usr/bin/env bash
# train_mfu.sh: MFU has one definition in every layout (docs/design.md §9).
# The configs/tiny.ini model (on the KJV shards, microbatches of 2 so that
# pp = 2 fills) runs 1 step in (tp, pp, dp) = (1,1,1), (1,1,2), (2,1,1),
# (1,2,1), (2,2,2); the start record of each metrics.jsonl must carry the
# same `flops_per_token`, equal to the whole model's 6 N_matmul + 6 L C T
# computed here in Python from tiny.ini alone (Kaplan et al. 2020 §2.1; PaLM
# Appendix B, the attention term halved for the causal mask), and
# `peak_flops` = system.peak_tflops x world size; each step record's `mfu`
# must be flops_per_token x tokens_per_s / peak_flops (the whole job's rate
# over the whole job's peak).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
[ -f data/kjv-shards/manifest.json ] || [ -d data/kjv-shards ] ||
    fail "data/kjv-shards missing (make data, or link /work/main/data/kjv-shards)"
layouts="1,1,1 1,1,2 2,1,1 1,2,1 2,2,2"
for l in $layouts; do
    IFS=, read -r tp pp dp <<<"$l"
    rc=0
    timeout 120 "${MPIRUN[@]}" -np $((tp * pp * dp)) "$TRIDENT" train configs/tiny.ini \
        parallel.tp=$tp parallel.pp=$pp parallel.dp=$dp train.steps=1 train.warmup_steps=1 \
        train.micro_batch_size=2 train.eval_every=0 train.sample_every=0 log.every=1 \
        system.threads=1 system.peak_tflops=0.0001 log.run_dir="$tmp/run-$tp$pp$dp" \
        > "$tmp/log-$tp$pp$dp" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$tmp/log-$tp$pp$dp"; fail "($tp,$pp,$dp) exited $rc"; }
done
python3 - "$tmp" "$layouts" <<'PY'
import configparser, json, sys
tmp, layouts = sys.argv[1], sys.argv[2].split()
ini = configparser.ConfigParser(inline_comment_prefixes=("#",))
ini.read("configs/tiny.ini")
m, tr = ini["model"], ini["train"]
V, C, L = int(m["vocab_size"]), int(m["d_model"]), int(m["n_layers"])
H, Hkv, F, T = int(m["n_heads"]), int(m["n_kv_heads"]), int(m["ffn_dim"]), int(tr["seq_len"])
D = C // H
# q (C x C), k and v (Hkv D x C each), o (C x C), gate, up (F x C), down (C x F); LM head V x C
n_matmul = L * (C * C + 2 * Hkv * D * C + C * C + 3 * F * C) + V * C
want = 6 * n_matmul + 6 * L * C * T
print(f"expected FLOPs per token {want} (N_matmul {n_matmul})")
for lay in layouts:
    tp, pp, dp = map(int, lay.split(","))
    recs = [json.loads(x) for x in open(f"{tmp}/run-{tp}{pp}{dp}/metrics.jsonl")]
    start = [r for r in recs if r.get("event") == "start"][0]
    steps = [r for r in recs if "loss" in r]
    got, peak = start["flops_per_token"], start["peak_flops"]
    print(f"({tp},{pp},{dp}): flops_per_token {got}, peak {peak:g}, mfu {steps[0]['mfu']}")
    assert got == want, f"({tp},{pp},{dp}): flops_per_token {got} != {want}"
    W = tp * pp * dp
    assert abs(peak - 1e8 * W) <= 1e-9 * peak, f"({tp},{pp},{dp}): peak_flops {peak} != 1e8 x {W}"
    for s in steps:
        mfu = got * s["tokens_per_s"] / peak
        # tokens_per_s is printed to the unit (%.0f) and mfu to 4 decimals:
        # the rounding bounds the difference (a slow, loaded step has few tokens/s)
        assert abs(s["mfu"] - mfu) <= 1e-4 + got * 0.5 / peak + 1e-6 * mfu, f"({tp},{pp},{dp}) step {s['step']}: mfu {s['mfu']} != {mfu}"
print("ok: one FLOPs figure in every layout")
PY
echo "PASS: train_mfu"
