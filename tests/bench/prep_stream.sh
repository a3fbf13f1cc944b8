#!/usr/bin/env bash
# prep_stream.sh (make bench): `trident prep` on a generated corpus of
# PREP_BENCH_MB megabytes (default 1000: ten copies of one 100 MB file) with
# 1 encoder thread and with all cores; prints MB/s of text per core and with
# all cores (wall clock, and per CPU-second, which a busy
# machine does not distort) and the peak RSS, which must stay far below the
# corpus (issue 13, acceptance 3). Exits non-zero if prep fails or the peak
# RSS reaches 1 GiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=$PWD/$BUILD/trident
PY=$PWD/.venv/bin/python
MB=${PREP_BENCH_MB:-1000}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/trident-bench-prep.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
part=$(( MB < 100 ? MB : 100 ))
"$PY" tests/e2e/lib/gen_corpus.py "$part" 11 > "$tmp/part.txt"
# Copies: a file named twice is read once.
inputs=(); for i in $(seq $(( MB / part ))); do cp "$tmp/part.txt" "$tmp/part-$i.txt"; inputs+=("$tmp/part-$i.txt"); done
bytes=$(( $(stat -c %s "$tmp/part.txt") * ${#inputs[@]} ))
tok=data/kjv-shards/tokenizer.json
if [ ! -f "$tok" ]; then
    tok=$tmp/tok.json
    "$T" tokenize --train --vocab-size 4096 --output "$tok" < "$tmp/part.txt" 2> /dev/null
fi
cores=$(nproc)
for th in 1 "$cores"; do
    TIMEFORMAT="%R %U %S"
    { time OMP_NUM_THREADS=$th "$T" prep --input "${inputs[@]}" --output "$tmp/out$th" --tokenizer "$tok" \
        --quiet > "$tmp/stats$th" ; } 2> "$tmp/time$th"
    read -r real user sys < "$tmp/time$th"
    s=$(grep '^prep_stats: ' "$tmp/stats$th" | cut -d' ' -f2-)
    rss=$(jq -r .peak_rss_bytes <<< "$s")
    awk -v b="$bytes" -v th="$th" -v r="$real" -v u="$user" -v sy="$sys" -v rss="$rss" -v tk="$(jq -r .tokens <<< "$s")" \
        'BEGIN { printf "prep %.0f MB, %d thread(s): %.1f s wall, %.1f MB/s (%.1f MB/s per thread), %.1f MB/s per CPU-second, %.2fM tokens/s, peak RSS %.0f MB (%.1f%% of the corpus)\n",
                 b / 1e6, th, r, b / 1e6 / r, b / 1e6 / r / th, b / 1e6 / (u + sy), tk / r / 1e6, rss / 1e6, 100 * rss / b }'
    [ "$rss" -lt $(( 1 << 30 )) ] || { echo "FAIL: peak RSS $rss >= 1 GiB"; exit 1; }
    rm -rf "$tmp/out$th"
done
