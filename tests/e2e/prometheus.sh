#!/usr/bin/env bash
# prometheus.sh: [log] prometheus_file, node_exporter's textfile-collector
# format (issue 15; docs/design.md §9, "TensorBoard and Prometheus").
#  1. A reader polls the file in a tight loop while a 40-step run (a log line
#     every step, checkpoints every 5) rewrites it: every read must parse
#     with prometheus_client's parser (text_string_to_metric_families), end
#     with a newline and hold every metric with HELP, TYPE and exactly one
#     sample; it must have read many times and seen many steps. The same check
#     applied to every proper prefix of a complete file fails (so a torn read
#     would be caught).
#  2. The last file equals metrics.jsonl's last step record (within the JSON's
#     printed rounding): step, loss, lr, grad norm, tokens/s, MFU, memory,
#     step time, data wait, skipped steps (a counter, trident_..._total), and
#     the checkpoint age is present, >= 0 and below the run's length.
#  3. A prometheus_file in a missing folder is refused (exit 2) naming the key.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py prometheus_client
small_dataset "$tmp"
mkdir "$tmp/textfile"
prom=$tmp/textfile/trident.prom
"$PY" - "$prom" "$tmp/done" "$tmp/last.prom" > "$tmp/reader.out" 2>&1 <<'EOF' &
import os, sys, time
from prometheus_client.parser import text_string_to_metric_families
path, done, keep = sys.argv[1], sys.argv[2], sys.argv[3]
names = {"trident_step": "gauge", "trident_loss": "gauge", "trident_learning_rate": "gauge",
         "trident_grad_norm": "gauge", "trident_tokens_per_second": "gauge",
         "trident_mfu_ratio": "gauge", "trident_memory_bytes": "gauge",
         "trident_step_duration_seconds": "gauge", "trident_data_wait_seconds": "gauge",
         "trident_skipped_steps": "counter", "trident_last_log_timestamp_seconds": "gauge"}
def check(text):
    """The families of a complete file; raises on a parse error or a missing part."""
    if not text.endswith("\n"):
        raise ValueError("no final newline")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for n, t in names.items():
        f = fams.get(n)
        if f is None:
            raise ValueError(f"{n} missing")
        if f.type != t or not f.documentation or len(f.samples) != 1:
            raise ValueError(f"{n}: type {f.type}, help {f.documentation!r}, {len(f.samples)} samples")
    return fams
reads, steps, last = 0, set(), None
deadline = time.time() + 300
while time.time() < deadline:
    finished = os.path.exists(done)
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        if finished: break
        continue
    try:
        fams = check(text)
    except Exception as e:
        print(f"FAIL: read {reads + 1} does not parse as a whole file: {e}\n{text}")
        sys.exit(1)
    reads += 1
    steps.add(fams["trident_step"].samples[0].value)
    last = text
    if finished: break
# The check can fail: every proper prefix of a complete file is refused.
torn = 0
for cut in range(len(last)):
    try:
        check(last[:cut])
    except Exception:
        torn += 1
print(f"reader: {reads} reads, {len(steps)} distinct steps; {torn} of {len(last)} prefixes refused")
ok = reads >= 50 and len(steps) >= 10 and torn == len(last)
open(keep, "w").write(last)
sys.exit(0 if ok else 1)
EOF
reader=$!
start=$(date +%s)
timeout 300 "${MPIRUN[@]}" -np 1 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
    train.steps=40 train.eval_every=0 checkpoint.dir="$tmp/ck" checkpoint.every=5 \
    log.run_dir="$tmp/run" log.prometheus_file="$prom" log.tensorboard=false > "$tmp/train.log" 2>&1 \
    || { tail -20 "$tmp/train.log"; fail "train exited non-zero"; }
elapsed=$(( $(date +%s) - start + 1 ))
touch "$tmp/done"
rc=0; wait $reader || rc=$?
cat "$tmp/reader.out"
[ $rc = 0 ] || fail "the concurrent reader saw a bad file or too few reads"
ls "$tmp/textfile" | grep -vx 'trident\.prom' && fail "a temporary file was left in the textfile folder"

last=$(metrics "$tmp/run" | tail -n 1)
"$PY" - "$tmp/last.prom" "$last" "$elapsed" <<'EOF' || fail "the Prometheus file disagrees with metrics.jsonl"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
text, rec, elapsed = open(sys.argv[1]).read(), json.loads(sys.argv[2]), float(sys.argv[3])
vals = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
labels = {s.name: s.labels for f in text_string_to_metric_families(text) for s in f.samples}
# sample name -> (metrics.jsonl key, scale to the JSON's unit, half a unit of its rounding)
want = {"trident_step": ("step", 1, 0), "trident_loss": ("loss", 1, 5e-7),
        "trident_learning_rate": ("lr", 1, None), "trident_grad_norm": ("grad_norm", 1, 5e-7),
        "trident_tokens_per_second": ("tokens_per_s", 1, 0.5), "trident_mfu_ratio": ("mfu", 1, 5e-5),
        "trident_memory_bytes": ("mem_bytes", 1, 0), "trident_step_duration_seconds": ("step_time_s", 1, 5e-5),
        "trident_data_wait_seconds": ("data_wait_ms", 1e3, 5e-4),
        "trident_skipped_steps_total": ("skipped_steps", 1, 0)}
bad = []
for name, (key, scale, half) in want.items():
    v, j = vals[name] * scale, rec[key]
    tol = (abs(j) * 5e-4 if half is None else half) + abs(j) * 1e-12
    if abs(v - j) > tol:
        bad.append(f"{name} = {vals[name]!r}, metrics.jsonl {key} = {j!r}")
age = vals.get("trident_checkpoint_age_seconds")
if age is None or not 0 <= age < elapsed:
    bad.append(f"trident_checkpoint_age_seconds = {age!r}, expected in [0, {elapsed})")
if any("run_dir" not in l for l in labels.values()):
    bad.append(f"a sample without the run_dir label: {labels}")
for b in bad: print("FAIL:", b)
print(f"prometheus: {len(want) + 1} metrics equal metrics.jsonl's step {rec['step']}")
sys.exit(1 if bad else 0)
EOF

rc=0
"$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" train.steps=5 log.run_dir="$tmp/run2" \
    log.prometheus_file="$tmp/nowhere/x.prom" > "$tmp/bad.log" 2>&1 || rc=$?
[ $rc = 2 ] || fail "a prometheus_file in a missing folder exited $rc, expected 2"
grep -q 'prometheus_file' "$tmp/bad.log" || fail "the refusal does not name [log] prometheus_file"
echo "prometheus: ok"
