#!/usr/bin/env bash
# make_sft_example.sh: instruction pairs from the King James Bible for the
# supervised fine-tuning example (configs/sft-tiny.ini, README "Fine-tuning"),
# as JSON Lines for `trident prep --format chat`:
#   {"prompt": "Where is it written: <verse text>", "response": "<Book> <chapter>:<verse>"}
# one per verse of at most 120 characters, N of them (default 5000) taken at
# an even stride over the Bible so every book appears, in Bible order. The
# book names are bible-kjv's short forms (Ge, Ex, ..., Re).
# Usage: data/make_sft_example.sh OUT.jsonl [N]
set -euo pipefail
out=${1:?usage: data/make_sft_example.sh OUT.jsonl [N]}
n=${2:-5000}
if ! command -v bible >/dev/null; then
    echo "make_sft_example: the 'bible' program is missing: install Debian's bible-kjv (scripts/deps.sh)" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
py=python3
[ -x "$here/.venv/bin/python" ] && py=$here/.venv/bin/python
bible -f "Genesis 1:1 - Revelation 22:21" | "$py" -c '
import json, re, sys
n = int(sys.argv[1])
rows = []
for line in sys.stdin:
    ref, _, text = line.rstrip("\n").partition(" ")
    m = re.fullmatch(r"(\d?[A-Za-z]+)(\d+):(\d+)", ref)
    if m and 0 < len(text) <= 120:
        rows.append((m.group(1), m.group(2), m.group(3), text))
if len(rows) < n:
    sys.exit(f"make_sft_example: only {len(rows)} short verses, asked for {n}")
step = len(rows) / n
with open(sys.argv[2], "w") as f:
    for i in range(n):
        b, c, v, text = rows[int(i * step)]
        f.write(json.dumps({"prompt": "Where is it written: " + text, "response": f"{b} {c}:{v}"}) + "\n")
print(f"make_sft_example: {n} pairs of {len(rows)} short verses -> {sys.argv[2]}")
' "$n" "$out"
