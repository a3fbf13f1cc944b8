#!/usr/bin/env bash
# plot.sh: `trident plot RUN_DIR [--out PNG]` (src/cli/cmd_plot.c, gnuplot's
# pngcairo) on the folder of a tiny real run (one rank, 8 steps, validation
# every 4):
#  1. it writes RUN_DIR/curves.png and prints its path; the file is a PNG
#     checked by an independent reader (Python's zlib and struct, not
#     gnuplot): the signature, every chunk's CRC-32, IHDR 1200 x 900 (the
#     size documented in docs/design.md §9), IDAT inflating to exactly the
#     bytes that size and colour type need, IEND last;
#  2. the same data twice gives the same bytes (measured: pngcairo writes no
#     time stamp), --out writes elsewhere;
#  3. the picture follows the data: a copy of the folder with one step's loss
#     changed, or one validation loss, or the lr of one step, gives a
#     different PNG; a copy with only a field trident plot does not draw
#     (mfu) changed gives the same bytes;
#  4. --data FILE holds the columns drawn: every step record's loss, lr,
#     grad norm and tokens/s as metrics.jsonl has them, each validation
#     loss, and tokens = step x 8 x 32 (small.ini's global_batch_size and
#     seq_len); a requeue chain whose resume at step 4 doubled
#     global_batch_size (a start record at 4, config-4.ini, and
#     config-4-2.ini, the later attempt, which wins) has tokens 256 s up to
#     step 4, then 1024 + 512 (s - 4);
#  5. `make run`'s script (scripts/run_default.sh, 2 steps of configs/tiny.ini
#     on 2 ranks, its folder under TRIDENT_RUNS=$tmp/runs) ends by printing
#     "curves: <run folder>/curves.png", and that file is the PNG of that
#     folder (the same bytes as trident plot of it);
#  6. bad inputs exit 2 naming what is wrong: no such folder (named as
#     RUN_DIR, not as the default --out in it), no
#     metrics.jsonl, no config.ini, no step records, a broken line that is
#     not the last (a torn last line is skipped: exit 0), no gnuplot on PATH
#     (the message says `make deps`), an unknown option, an --out or --data
#     that cannot be written (under /proc, or a folder), named with its flag
#     before gnuplot runs (no gnuplot error on stderr, no file left).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py numpy
command -v gnuplot >/dev/null || fail "gnuplot not installed: run make deps"
small_dataset "$tmp"
run="$tmp/run"
timeout 300 "${MPIRUN[@]}" -np 1 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
    train.steps=8 train.warmup_steps=2 train.eval_every=4 train.eval_steps=1 checkpoint.every=0 \
    checkpoint.dir="$tmp/ck" log.run_dir="$run" > "$tmp/train.log" 2>&1 ||
    { tail -5 "$tmp/train.log"; fail "the tiny run"; }
[ "$(metrics "$run" | wc -l)" -eq 8 ] || fail "the tiny run has $(metrics "$run" | wc -l) step records, not 8"
[ "$(jq -c 'select(has("val_loss"))' "$run/metrics.jsonl" | wc -l)" -eq 2 ] || fail "the tiny run has no 2 val records"

# 1. default output and the PNG check
out=$("$TRIDENT" plot "$run") || fail "trident plot exited $?"
[ "$out" = "$run/curves.png" ] || fail "trident plot printed '$out', not $run/curves.png"
"$PY" - "$run/curves.png" <<'PY' || fail "curves.png is not a valid 1200x900 PNG"
import struct, sys, zlib
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", "signature"
pos, chunks, idat = 8, [], b""
while pos < len(b):
    n, = struct.unpack(">I", b[pos:pos + 4]); kind = b[pos + 4:pos + 8]; data = b[pos + 8:pos + 8 + n]
    crc, = struct.unpack(">I", b[pos + 8 + n:pos + 12 + n])
    assert zlib.crc32(kind + data) == crc, f"CRC of {kind}"
    chunks.append(kind); pos += 12 + n
    if kind == b"IDAT": idat += data
    if kind == b"IHDR": w, h, depth, ctype = struct.unpack(">IIBB", data[:10])
assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and pos == len(b), chunks
assert (w, h) == (1200, 900), (w, h)
channels = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
raw = zlib.decompress(idat)
assert len(raw) == h * (1 + w * channels * depth // 8), (len(raw), w, h, ctype, depth)
print(f"PNG ok: {w}x{h}, colour type {ctype}, depth {depth}, {len(b)} bytes, chunks {[c.decode() for c in chunks]}")
PY

# 2. determinism, --out
"$TRIDENT" plot "$run" --out "$tmp/again.png" > /dev/null || fail "trident plot --out exited $?"
cmp -s "$run/curves.png" "$tmp/again.png" || fail "the same data gave two different PNGs"
[ ! -e "$tmp/again.png.tmp" ] || fail "plot left its .tmp file"

# 3. the picture follows the data. variant NAME JQ-FILTER: a copy of the run
# folder with metrics.jsonl passed through JQ-FILTER, plotted to $tmp/NAME.png.
# The copy's folder is also called run: the title names the folder.
variant() {
    local d="$tmp/v-$1/run"
    mkdir -p "$d"; cp "$run/config.ini" "$d/"
    jq -c "$2" "$run/metrics.jsonl" > "$d/metrics.jsonl"
    cmp -s "$run/metrics.jsonl" "$d/metrics.jsonl" && fail "variant $1 changed nothing"
    "$TRIDENT" plot "$d" --out "$tmp/$1.png" > /dev/null || fail "plot of variant $1 exited $?"
}
variant loss 'if .step == 5 and has("loss") then .loss *= 0.9 else . end'
variant val 'if has("val_loss") and .step == 4 then .val_loss += 0.5 else . end'
variant lr 'if .step == 6 and has("lr") then .lr *= 0.5 else . end'
variant mfu 'if has("mfu") then .mfu += 0.1 else . end'
for v in loss val lr; do
    cmp -s "$run/curves.png" "$tmp/$v.png" && fail "variant $v (one value changed) gave the same PNG"
done
cmp -s "$tmp/mfu.png" "$run/curves.png" || fail "changing mfu (not drawn) changed the PNG"
echo "the PNG changes with loss, val_loss, lr; not with mfu"

# 4. --data. check_data FILE METRICS TOKENS-EXPR: the columns against the
# records of METRICS, tokens against the Python expression of step s.
check_data() {
    "$PY" - "$@" <<'PY'
import json, math, sys
data, metrics, expr = sys.argv[1:]
blocks = open(data).read().split("\n\n\n")
rows = [[[float(x) for x in l.split()] for l in b.splitlines() if l and not l.startswith("#")] for b in blocks]
recs = [json.loads(l) for l in open(metrics)]
steps = [r for r in recs if "loss" in r]
vals = [r for r in recs if "val_loss" in r]
tok = lambda s: eval(expr)
bad = 0
if len(rows[0]) != len(steps) or len(rows[1]) != len(vals):
    print(f"FAIL: {len(rows[0])} step rows, {len(rows[1])} val rows; metrics has {len(steps)}, {len(vals)}"); sys.exit(1)
for row, r in zip(rows[0], steps):
    want = [tok(r["step"]), r["step"], r["loss"], r["lr"], r["grad_norm"], r["tokens_per_s"]]
    if row != want: print(f"FAIL: step {r['step']}: row {row}, want {want}"); bad += 1
for row, r in zip(rows[1], vals):
    want = [tok(r["step"]), r["step"], r["val_loss"]]
    if row != want: print(f"FAIL: val at {r['step']}: row {row}, want {want}"); bad += 1
print(f"{data}: {len(steps)} step rows and {len(vals)} val rows as metrics.jsonl has them, tokens = {expr}")
sys.exit(1 if bad else 0)
PY
}
"$TRIDENT" plot "$run" --out "$tmp/d.png" --data "$tmp/d.dat" > /dev/null || fail "plot --data exited $?"
cmp -s "$tmp/d.png" "$run/curves.png" || fail "--data changed the picture"
check_data "$tmp/d.dat" "$run/metrics.jsonl" "256 * s" || fail "--data columns"
chain="$tmp/chain/run"; mkdir -p "$chain"
cp "$run"/config*.ini "$chain/"
sed 's/^global_batch_size = .*/global_batch_size = 32/' "$run/config.ini" > "$chain/config-4.ini"
sed 's/^global_batch_size = .*/global_batch_size = 16/' "$run/config.ini" > "$chain/config-4-2.ini"
grep -q '^global_batch_size = 8$' "$run/config.ini" || fail "config.ini's global_batch_size is not 8"
jq -c 'if .event == "start" then ., (.step = 4 | .attempt = 2) else . end' "$run/metrics.jsonl" |
    jq -sc 'sort_by([.step // 1e9, (if .event then 1 else 0 end)]) | .[]' > "$chain/metrics.jsonl"
"$TRIDENT" plot "$chain" --out "$tmp/chain.png" --data "$tmp/chain.dat" > /dev/null || fail "plot of the chain exited $?"
check_data "$tmp/chain.dat" "$chain/metrics.jsonl" "256 * s if s <= 4 else 1024 + 512 * (s - 4)" ||
    fail "--data columns of the requeue chain"

# 5. make run's last line. Its corpus is the repo's data/kjv.txt and
# data/kjv-shards, made once as `make run` makes them.
rc=0
TRIDENT_RUNS="$tmp/runs" BUILD="$BUILD" OMP_NUM_THREADS=1 timeout 300 scripts/run_default.sh train.steps=2 \
    train.warmup_steps=1 train.eval_every=0 train.sample_every=0 checkpoint.every=0 system.peak_tflops=1 \
    > "$tmp/make-run.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$tmp/make-run.log"; fail "scripts/run_default.sh exited $rc"; }
last=$(tail -n 1 "$tmp/make-run.log")
png=${last#curves: }
case "$last" in "curves: $tmp/runs/tiny-"*/curves.png) ;; *) fail "make run's last line is '$last'";; esac
[ "$(metrics "${png%/curves.png}" | wc -l)" -eq 2 ] || fail "make run's folder has no 2 step records"
"$TRIDENT" plot "${png%/curves.png}" --out "$tmp/make-run.png" > /dev/null || fail "plot of make run's folder"
cmp -s "$png" "$tmp/make-run.png" || fail "$png is not the plot of its folder"
echo "make run: $last"

# 6. bad inputs: bad NAME WANT_IN_STDERR CMD...: exit 2 with WANT on stderr.
bad() {
    local name=$1 want=$2 rc=0; shift 2
    "$@" > /dev/null 2> "$tmp/err" || rc=$?
    [ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "$name: exit $rc, not 2"; }
    grep -qF -- "$want" "$tmp/err" || { cat "$tmp/err"; fail "$name: stderr does not say '$want'"; }
    echo "bad input $name: exit 2: $(head -1 "$tmp/err")"
}
bad no-dir "RUN_DIR $tmp/nope: No such file" "$TRIDENT" plot "$tmp/nope"
! grep -q -- "--out" "$tmp/err" || fail "no-dir: the message names --out, which was not given: $(cat "$tmp/err")"
mkdir "$tmp/empty"
bad no-metrics "$tmp/empty/metrics.jsonl" "$TRIDENT" plot "$tmp/empty"
mkdir "$tmp/nocfg"; cp "$run/metrics.jsonl" "$tmp/nocfg/"
bad no-config "$tmp/nocfg/config.ini" "$TRIDENT" plot "$tmp/nocfg"
mkdir "$tmp/nosteps"; cp "$run/config.ini" "$tmp/nosteps/"
jq -c 'select(has("loss") | not)' "$run/metrics.jsonl" > "$tmp/nosteps/metrics.jsonl"
bad no-steps "$tmp/nosteps/metrics.jsonl" "$TRIDENT" plot "$tmp/nosteps"
mkdir "$tmp/broken"; cp "$run/config.ini" "$tmp/broken/"
{ head -3 "$run/metrics.jsonl"; echo '{"step": 3, "loss": 5.'; tail -n +4 "$run/metrics.jsonl"; } > "$tmp/broken/metrics.jsonl"
bad broken-line "$tmp/broken/metrics.jsonl:4" "$TRIDENT" plot "$tmp/broken"
mkdir "$tmp/torn"; cp "$run/config.ini" "$tmp/torn/"
{ cat "$run/metrics.jsonl"; printf '{"step": 9, "lo'; } > "$tmp/torn/metrics.jsonl"
"$TRIDENT" plot "$tmp/torn" > /dev/null 2> "$tmp/err" || { cat "$tmp/err"; fail "a torn last line: exit $?"; }
grep -q "torn last line" "$tmp/err" || fail "a torn last line was skipped silently"
bad no-gnuplot "make deps" env PATH=/nonexistent "$TRIDENT" plot "$run" --out "$tmp/x.png"
bad unknown-option "--colour" "$TRIDENT" plot "$run" --colour
bad no-out-folder "the folder $tmp/nowhere does not exist" "$TRIDENT" plot "$run" --out "$tmp/nowhere/x.png"
bad no-run-dir "RUN_DIR is required" "$TRIDENT" plot
bad out-unwritable "--out /proc/trident-plot.png: cannot write" "$TRIDENT" plot "$run" --out /proc/trident-plot.png
! grep -qi gnuplot "$tmp/err" || fail "an unwritable --out reached gnuplot: $(cat "$tmp/err")"
mkdir "$tmp/outdir"
bad out-folder "--out $tmp/outdir: is a folder" "$TRIDENT" plot "$run" --out "$tmp/outdir"
bad data-unwritable "--data /proc/trident-plot.dat: cannot write" \
    "$TRIDENT" plot "$run" --out "$tmp/y.png" --data /proc/trident-plot.dat
! grep -qi gnuplot "$tmp/err" || fail "an unwritable --data reached gnuplot: $(cat "$tmp/err")"
[ -z "$(ls "$tmp/outdir")" ] && [ ! -e "$tmp/y.png" ] && [ ! -e "$tmp/y.png.tmp" ] && [ ! -e "$tmp/outdir.tmp" ] ||
    fail "a refused plot left files: $(ls "$tmp/outdir" "$tmp"/y.png* "$tmp/outdir.tmp" 2>&1)"
echo "plot: all checks passed"
