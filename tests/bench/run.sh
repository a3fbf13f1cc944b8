#!/usr/bin/env bash
# Runs every benchmark binary in $BUILD/bench and every tests/bench/*.sh other
# than this one. Prints; asserts nothing about speed (ratios are in the output).
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.."
data/make_kjv.sh >/dev/null
for b in "$BUILD"/bench/bench_*; do
    [ -x "$b" ] || continue
    echo "== $(basename "$b")"
    "$b"
done
for s in tests/bench/*.sh; do
    [ "$(basename "$s")" = run.sh ] && continue
    echo "== $(basename "$s" .sh)"
    BUILD="$BUILD" bash "$s"
done
