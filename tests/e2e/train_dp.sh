#!/usr/bin/env bash
# train_dp.sh: data parallel gives the single-rank numbers. dp = 1, 2 and 4
# runs of 20 steps with the same global batch (8 sequences: 4, 2 and 1
# microbatches of 2 per rank) must log the same loss and gradient norm at
# every step within 1e-5 relative (fp32). Also checks metrics.jsonl: every
# line parses as JSON with step, loss, lr, grad_norm, tokens_per_s, mfu,
# mem_bytes, and its values equal the printed log line's.
set -u
cd "$(dirname "$0")/../.."
source tests/e2e/lib/train_env.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small_dataset "$tmp"
for dp in 1 2 4; do
    timeout 300 $MPIRUN -np $dp "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        parallel.dp=$dp log.run_dir="$tmp/run$dp" > "$tmp/log$dp" 2>&1 \
        || { echo "FAIL: dp=$dp run exited $?"; tail -20 "$tmp/log$dp"; exit 1; }
done
python3 - "$tmp" <<'PY'
import json, re, sys
tmp = sys.argv[1]
def steps(dp):
    out = {}
    for line in open(f"{tmp}/log{dp}"):
        m = re.match(r"step +(\d+)/\d+ \| loss ([\d.]+) \| lr ([\d.e+-]+) \| grad norm ([\d.]+) \| (\d+) tok/s \| MFU ([\d.]+)% \| mem ([\d.]+) MiB", line)
        if m: out[int(m[1])] = m
    return out
ok = True
base = steps(1)
assert len(base) == 20, f"dp=1 logged {len(base)} steps, expected 20"
for dp in (2, 4):
    other = steps(dp)
    assert len(other) == 20, f"dp={dp} logged {len(other)} steps"
    for s in range(1, 21):
        for what, k in (("loss", 2), ("grad norm", 4)):
            a, b = float(base[s][k]), float(other[s][k])
            rel = abs(a - b) / abs(a)
            if rel > 1e-5:
                ok = False
                print(f"FAIL: step {s} {what}: dp=1 {a} dp={dp} {b} (rel {rel:.2e})")
    print(f"dp={dp}: 20 steps match dp=1 (loss {other[20][2]})")
# metrics.jsonl against the printed lines
for dp in (1, 2, 4):
    printed = steps(dp)
    n = 0
    for line in open(f"{tmp}/run{dp}/metrics.jsonl"):
        rec = json.loads(line)
        if "loss" not in rec:
            assert "val_loss" in rec, f"unknown record {rec}"
            continue
        for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_bytes"):
            assert key in rec, f"dp={dp}: {key} missing from {line}"
        m = printed[rec["step"]]
        checks = [("loss", float(m[2])), ("lr", float(m[3])), ("grad_norm", float(m[4])),
                  ("tokens_per_s", float(m[5])), ("mfu", round(float(m[6]) / 100, 4)),
                  ("mem_bytes", round(float(m[7]), 1))]
        for key, val in checks:
            got = rec[key] if key != "mem_bytes" else round(rec[key] / 1048576, 1)
            if key == "mfu": got = round(got, 4)
            if abs(got - val) > 1e-12 * max(1, abs(val)) and not (key == "mfu" and abs(got - val) <= 5e-5):
                ok = False
                print(f"FAIL: dp={dp} step {rec['step']} {key}: json {got} printed {val}")
        n += 1
    assert n == 20, f"dp={dp}: {n} step records in metrics.jsonl"
losses = [float(base[s][2]) for s in (1, 20)]
assert losses[1] < losses[0] - 0.5, f"loss did not fall: {losses}"
sys.exit(0 if ok else 1)
PY
