#!/usr/bin/env bash
# data_hot_tier.sh: the hot-tier shard cache (docs/design.md §6, issue 13).
# A dataset of ~16 small shards on a cold tier made slow by fault injection
# (TRIDENT_DATA_FAULT=cold_delay_ms:50: every cold-tier access sleeps 50 ms, ~0.6 s a step):
#  1. without [data] cache_dir the stall shows: mean data_wait_ms >= 100 ms
#     (each step reads 8 sequences, each a cold read);
#  2. with cache_dir and prefetch_shards = 16, once the stager has copied the
#     shards (the second half of 40 steps), mean data_wait_ms < 5% of the
#     mean step time; the run's losses equal run 1's (the tiers serve the
#     same tokens); every file the cache folder holds is byte-identical to its
#     cold copy;
#  3. an EIO on every cold read of shard 3 (TRIDENT_DATA_FAULT=cold_eio:3),
#     two ranks sharing one cache_dir: retries are logged, then the job exits
#     1 within seconds with a message naming shard-00003.h5 and the cold tier;
#     no shard is published partial (every shard-*.h5 in the folder equals
#     the cold copy, shard 3 is absent);
#  4. two jobs at once on one cache_dir, a budget of 3 shards each: they
#     evict and restage, both train the cold run's losses, the folder holds
#     only shards byte-identical to the cold tier; a dead stager's temporary
#     file of this node (dead pid, older than CACHE_TEMP_ABANDON_S = 600 s)
#     planted there first is removed, another node's is kept;
#  5. a staged shard rewritten in place on the cold tier (one byte changed,
#     same size, mtime restored): the next run with the same cache_dir is
#     refused with exit 2 naming that shard and index.ini's checksum, as
#     without the cache (the hot copy, staged under the old identity, is
#     not served: cache.h, "Layout").
# Published copies are named shard-NNNNN.<source identity>.h5 (cache.h);
# cold_of maps one to its cold file.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
data/make_kjv.sh "$tmp/kjv.txt" >/dev/null
awk 'BEGIN{RS=""; ORS="\n\n"} NR <= 150' "$tmp/kjv.txt" > "$tmp/small.txt"
"$TRIDENT" prep --input "$tmp/small.txt" --output "$tmp/shards" --vocab-size 510 --shard-tokens 16000 \
    >/dev/null 2>&1 || fail "prep"
n_shards=$(ls "$tmp/shards"/shard-*.h5 | wc -l)
[ "$n_shards" -ge 12 ] || fail "expected >= 12 shards, prep wrote $n_shards"

run() { # NAME FAULT STEPS [overrides...]
    local name=$1 fault=$2 steps=$3; shift 3
    mkdir -p "$tmp/run-$name"
    TRIDENT_DATA_FAULT=$fault timeout 120 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        train.steps="$steps" train.warmup_steps=2 train.eval_every=0 checkpoint.every=0 log.run_dir="$tmp/run-$name" "$@" \
        > "$tmp/$name.log" 2>&1
}
mean() { jq -s 'add / length'; }
cold_of() { basename "$1" | sed -E 's/\.[0-9a-f]{16}\.h5$/.h5/'; }

# 1. no hot tier: every read is a cold read
run cold cold_delay_ms:50 4 || { tail -5 "$tmp/cold.log"; fail "run without cache_dir"; }
cold_wait=$(metrics "$tmp/run-cold" .data_wait_ms | mean)
echo "no cache: mean data_wait_ms $cold_wait over 4 steps"
jq -e -n "$cold_wait >= 100" >/dev/null || fail "without a hot tier the 50 ms cold reads do not show in data_wait_ms ($cold_wait)"

# 2. hot tier with prefetch
run hot cold_delay_ms:50 40 data.cache_dir="$tmp/cache" data.prefetch_shards=16 \
    || { tail -5 "$tmp/hot.log"; fail "run with cache_dir"; }
hot_wait=$(metrics "$tmp/run-hot" 'select(.step > 20) | .data_wait_ms' | mean)
hot_step=$(metrics "$tmp/run-hot" 'select(.step > 20) | .step_time_s * 1000' | mean)
first_wait=$(metrics "$tmp/run-hot" 'select(.step <= 20) | .data_wait_ms' | mean)
echo "hot tier: mean data_wait_ms $hot_wait, step time $hot_step ms (steps 21-40); steps 1-20: $first_wait ms"
jq -e -n "$hot_wait < 0.05 * $hot_step" >/dev/null || fail "with the hot tier data_wait_ms $hot_wait >= 5% of step time $hot_step ms"
a=$(metrics "$tmp/run-cold" .loss | head -n 4 | tr '\n' ' ')
b=$(metrics "$tmp/run-hot" .loss | head -n 4 | tr '\n' ' ')
[ "$a" = "$b" ] || fail "hot-tier run's losses ($b) differ from the cold run's ($a)"
cdir=$(ls -d "$tmp/cache"/*/)
staged=$(ls "$cdir" | grep -cE '^shard-[0-9]+\.[0-9a-f]{16}\.h5$' || true)
[ "$staged" -ge 1 ] || fail "nothing staged in $cdir"
for f in "$cdir"shard-*.h5; do cmp -s "$f" "$tmp/shards/$(cold_of "$f")" || fail "$f differs from its cold copy"; done
echo "hot tier: $staged shards staged, each byte-identical to the cold tier"

# 3. EIO on shard 3: retries, exit 1 naming it, nothing partial in the cache
rm -rf "$tmp/cache"
mkdir -p "$tmp/run-eio"
rc=0
start=$(date +%s)
TRIDENT_DATA_FAULT=cold_eio:3 timeout 120 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" \
    data.path="$tmp/shards" parallel.dp=2 train.steps=30 train.warmup_steps=2 train.eval_every=0 checkpoint.every=0 \
    data.cache_dir="$tmp/cache" data.prefetch_shards=16 log.run_dir="$tmp/run-eio" > "$tmp/eio.log" 2>&1 || rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" = 1 ] || { tail -5 "$tmp/eio.log"; fail "EIO run exited $rc, expected 1"; }
grep -q "try 1 of" "$tmp/eio.log" || fail "no retry logged: $(tail -3 "$tmp/eio.log")"
grep "shard-00003.h5" "$tmp/eio.log" | grep -q "cold tier" || fail "no message names shard-00003.h5 and the cold tier: $(tail -3 "$tmp/eio.log")"
# A temporary file of a stager killed mid-copy may remain (never under a
# shard's name; the next stager removes it: part 4 checks that).
cdir=$(ls -d "$tmp/cache"/*/)
! ls "$cdir" | grep -q '^shard-00003\.' || fail "shard-00003.h5 was published despite EIO"
for f in "$tmp/cache"/*/shard-*.h5; do [ -e "$f" ] || continue; cmp -s "$f" "$tmp/shards/$(cold_of "$f")" || fail "$f is partial or wrong"; done
echo "EIO on shard 3: exit 1 after ${took} s, $(grep -c 'try [0-9] of' "$tmp/eio.log") retries logged, no partial shard in the cache"
echo "$(grep -m1 'giving up' "$tmp/eio.log")"

# 4. two jobs at once on one cache_dir with a budget of ~3 shards each:
# shards are evicted and restaged under both, neither corrupts the other
# (each job's losses equal the cold run's), the folder holds only complete
# shards, byte-identical to the cold tier.
rm -rf "$tmp/cache"
mkdir -p "$cdir"
stale="$cdir.shard-00001.0123456789abcdef.h5~$(hostname)~999999999~00000000000000aa.tmp" # a dead stager's half copy
other="$cdir.shard-00001.0123456789abcdef.h5~another-node~999999999~00000000000000bb.tmp" # another node's
head -c 1000 "$tmp/shards/shard-00001.h5" > "$stale"
head -c 1000 "$tmp/shards/shard-00001.h5" > "$other"
touch -d '-1 hour' "$stale" "$other"
budget=$(( $(stat -c %s "$tmp/shards/shard-00000.h5") * 3 ))
pids=()
for j in 1 2; do
    run "twin$j" cold_delay_ms:20 12 data.cache_dir="$tmp/cache" data.cache_bytes=$budget data.prefetch_shards=2 &
    pids+=($!)
done
for j in 1 2; do
    wait "${pids[$((j - 1))]}" || { tail -5 "$tmp/twin$j.log"; fail "job $j of two on one cache_dir"; }
done
for j in 1 2; do
    b=$(metrics "$tmp/run-twin$j" .loss | head -n 4 | tr '\n' ' ')
    [ "$a" = "$b" ] || fail "job $j on the shared cache: losses ($b) differ from the cold run's ($a)"
done
# Evictions: at least one job's (which one depends on the race: a job whose
# shards the other job published needs no room, in ~1 of 3 runs even before
# issue 27).
grep -hE "hot tier .* [1-9][0-9]* evicted" "$tmp/twin1.log" "$tmp/twin2.log" > /dev/null ||
    fail "neither job evicted: $(grep -h 'hot tier' "$tmp/twin1.log" "$tmp/twin2.log")"
[ ! -e "$stale" ] || fail "a dead stager's temporary file $stale was not removed"
[ -e "$other" ] || fail "another node's temporary file $other was removed"
rm -f "$other"
[ "$(find "$tmp/cache" -name '*.tmp' | wc -l)" = 0 ] || fail "temporary files left by two jobs"
for f in "$tmp/cache"/*/shard-*.h5; do cmp -s "$f" "$tmp/shards/$(cold_of "$f")" || fail "$f corrupt after two jobs"; done
echo "two jobs on one cache_dir: $(grep -h 'hot tier' "$tmp/twin1.log" "$tmp/twin2.log" | tr '\n' ';') losses match the cold run"

# 5. a staged shard rewritten in place, size and mtime kept: refused by name
f=$(ls "$tmp/cache"/*/shard-*.h5 | head -n 1)
victim="$tmp/shards/$(cold_of "$f")"
touch -r "$victim" "$tmp/victim.times"
off=$(( $(stat -c %s "$victim") / 2 ))
byte=$(od -An -tu1 -j "$off" -N 1 "$victim" | tr -d ' ')
printf "\\$(printf %03o $(( (byte + 1) % 256 )))" | dd of="$victim" bs=1 seek="$off" conv=notrunc status=none
touch -r "$tmp/victim.times" "$victim"
[ "$(stat -c %Y.%y "$victim")" = "$(stat -c %Y.%y "$tmp/victim.times")" ] || fail "could not restore the mtime of $victim"
rc=0
run stale "" 20 data.cache_dir="$tmp/cache" data.prefetch_shards=16 || rc=$?
[ "$rc" = 2 ] || { tail -5 "$tmp/stale.log"; fail "a shard rewritten in place (size and mtime kept) after staging: exit $rc, expected 2 (served stale from the hot tier?)"; }
grep "$(basename "$victim")" "$tmp/stale.log" | grep -q "index.ini" ||
    fail "the refusal names neither $(basename "$victim") nor index.ini: $(tail -3 "$tmp/stale.log")"
echo "shard rewritten in place after staging: $(grep -m1 "$(basename "$victim")" "$tmp/stale.log")"
