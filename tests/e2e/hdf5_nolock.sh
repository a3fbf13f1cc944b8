#!/usr/bin/env bash
# hdf5_nolock.sh: shard and checkpoint files work on a file system without
# POSIX locks (NFS without lockd, Lustre -o noflock, object-store mounts;
# docs/design.md §6). Under tests/shim/nolock.c, which makes every flock,
# lockf and fcntl lock call fail with ENOLCK: prep, train with checkpoints,
# resume, `ckpt info`, `ckpt verify`, `ckpt export` all succeed, and the
# stopped-and-resumed run ends at the same loss as a straight run made
# without the shim (the independent reference). The shim is first shown to
# be live (flock(1) under it fails).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
cc -shared -fPIC -O2 -o "$tmp/nolock.so" tests/shim/nolock.c -ldl || fail "cannot build the shim"
NOLOCK="$tmp/nolock.so"
touch "$tmp/lockme"
if LD_PRELOAD=$NOLOCK flock -n "$tmp/lockme" true 2>/dev/null; then fail "shim not live: flock succeeded under it"; fi

data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
awk 'BEGIN{RS=""; ORS="\n\n"} NR <= 150' "$tmp/kjv.txt" > "$tmp/small.txt"
LD_PRELOAD=$NOLOCK "$TRIDENT" prep --input "$tmp/small.txt" --output "$tmp/shards" --vocab-size 510 \
    --val-fraction 0.05 > "$tmp/prep.log" 2>&1 || { cat "$tmp/prep.log"; fail "prep under the no-lock shim"; }

run() { # NAME PRELOAD [overrides...]
    local name=$1 pre=$2; shift 2
    mkdir -p "$tmp/run-$name"
    LD_PRELOAD=$pre timeout 120 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" train.steps=8 \
        train.eval_every=4 checkpoint.every=4 checkpoint.keep_last=0 checkpoint.dir="$tmp/ck-$name" \
        log.run_dir="$tmp/run-$name" "$@" >> "$tmp/$name.log" 2>&1
}
run straight "" || { tail -5 "$tmp/straight.log"; fail "straight run without the shim"; }
run nolock "$NOLOCK" train.exit_interval=4 || { tail -5 "$tmp/nolock.log"; fail "train under the shim"; }
run nolock "$NOLOCK" || { tail -5 "$tmp/nolock.log"; fail "resume under the shim"; }
grep -q "resum" "$tmp/nolock.log" || fail "the second run did not resume: $(tail -3 "$tmp/nolock.log")"
want=$(metrics "$tmp/run-straight" .loss | tail -n 1)
got=$(metrics "$tmp/run-nolock" .loss | tail -n 1)
[ -n "$want" ] && [ "$want" = "$got" ] || fail "final loss under the shim $got, straight run $want"
for cmd in info verify; do
    LD_PRELOAD=$NOLOCK "$TRIDENT" ckpt $cmd "$tmp/ck-nolock" > "$tmp/$cmd.log" 2>&1 \
        || { cat "$tmp/$cmd.log"; fail "ckpt $cmd under the shim"; }
done
LD_PRELOAD=$NOLOCK "$TRIDENT" ckpt export "$tmp/ck-nolock" "$tmp/final.h5" > "$tmp/export.log" 2>&1 \
    || { cat "$tmp/export.log"; fail "ckpt export under the shim"; }
[ -s "$tmp/final.h5" ] || fail "ckpt export wrote nothing"
echo "ok: prep, train, resume, ckpt info/verify/export under ENOLCK locks; final loss $got = straight run"
