#!/usr/bin/env bash
# ckpt_crash.sh: real processes killed (SIGKILL, TRIDENT_FAULT=kill:...) at
# 28 points of three checkpoint saves on 4 MPI ranks (tests/mpi/ckpt_driver.c)
# and 9 points of three asynchronous ones (checkpoint.async: the snapshot, the
# background writer, a save arriving while one is in flight, the commit):
# every storage call of the second save on rank 0, calls of the first and
# third on rank 0, three calls of rank 1, a call on all ranks at once, and the
# named point between the two renames, one inside rotation (about 1 s a point). After each kill: `trident ckpt verify` on the dir passes (when some
# save got as far as `latest`), and a one-rank load in another layout
# (resharding) returns the last committed step with that step's values.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
DRV="$PWD/$BUILD/mpi/ckpt_driver"
need_built "$DRV" "$TRIDENT"
root=$tmp
fail=0
# mpirun ends the other ranks of an aborted job with SIGTERM, then waits
# odls_base_sigkill_timeout (1 s) before SIGKILL: a second a kill point.
# The driver's ranks have no SIGTERM handler (SIGTERM ends them), so 0 s
# changes nothing here but the wait.
export OMPI_MCA_odls_base_sigkill_timeout=0

# A clean run: 3 committed steps, and rank 0's storage calls per save, which
# the kill points below are chosen from (19 per save, +1 for rotation at 3).
timeout 60 "${MPIRUN[@]}" -np 4 "$DRV" save "$root/clean" >"$root/out" 2>&1 || { cat "$root/out"; echo "FAIL: clean save"; exit 1; }
grep -q '^committed step 3$' "$root/out" || { cat "$root/out"; echo "FAIL: clean save did not commit 3"; exit 1; }
c1=$(sed -n 's/^calls rank 0 after step 1: //p' "$root/out")
c2=$(sed -n 's/^calls rank 0 after step 2: //p' "$root/out")
c3=$(sed -n 's/^calls rank 0 after step 3: //p' "$root/out")
r1=$(sed -n 's/^calls rank 1 after step 3: //p' "$root/out")
echo "rank 0 storage calls after each save: $c1 $c2 $c3; rank 1 after 3 saves: $r1"
[ "${c1:-0}" -ge 10 ] && [ "${r1:-0}" -eq 6 ] || fail "unexpected call counts"

# crash SPEC: saves under TRIDENT_FAULT=SPEC (must die), then checks the dir.
# after_latest=1: the kill came after `latest` was renamed in the save that
# was running, so the load may return that save's step too.
points=0
crash() {
    local spec=$1 after_latest=${2:-0} dir="$root/k$points" rc=0 out committed got
    points=$((points + 1))
    TRIDENT_FAULT=$spec timeout -k 2 30 "${MPIRUN[@]}" -np 4 "$DRV" "${MODE:-save}" "$dir" >"$root/out" 2>&1 || rc=$?
    committed=$(sed -n 's/^committed step //p' "$root/out" | tail -n 1); committed=${committed:-0}
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -q 'TRIDENT_FAULT: killed at storage call' "$root/out"; then
        cat "$root/out"; echo "FAIL $spec: not killed, or hung (exit $rc)"; fail=1; return
    fi
    mpi_no_leftovers "$DRV" >/dev/null || { echo "FAIL $spec: processes left alive"; fail=1; }
    rc=0; out=$("$DRV" load "$dir" 2>&1) || rc=$?
    got=$(sed -n 's/^loaded step //p; s/^loaded none/0/p' <<<"$out")
    if [ "$rc" -ne 0 ] || [ -z "$got" ]; then
        echo "$out"; echo "FAIL $spec: load exit $rc"; fail=1; return
    fi
    if [ "$got" -ne "$committed" ] && ! { [ "$after_latest" -eq 1 ] && [ "$got" -eq $((committed + 1)) ]; }; then
        echo "FAIL $spec: loaded step $got, last committed $committed"; fail=1
    fi
    if [ "$got" -gt 0 ]; then
        "$TRIDENT" ckpt verify "$dir" >"$root/verify" 2>&1 || { cat "$root/verify"; echo "FAIL $spec: verify of latest"; fail=1; }
    else
        [ ! -e "$dir/latest" ] || { echo "FAIL $spec: latest exists but nothing loaded"; fail=1; }
    fi
    printf '  %-30s committed %s, loaded %s\n' "${MODE:-save} $spec" "$committed" "$got"
}

# Every storage call of the second save on rank 0. The last call of a save
# (the directory fsync after `latest` was renamed) and the rotation after the
# third are after `latest`.
for n in $(seq $((c1 + 1)) "$c2"); do crash "kill:$n@0" $([ "$n" -eq "$c2" ] && echo 1 || echo 0); done
for n in 3 $((c2 + 11)) $((c3 - 1)); do crash "kill:$n@0" $([ "$n" -ge $((c3 - 1)) ] && echo 1 || echo 0); done
# Rank 1: h5 create of the first save, fsync of its file in the second, third.
for n in 1 4 "$r1"; do crash "kill:$n@1"; done
# All ranks at once (each at its own nth call).
crash "kill:4"
# Between renaming step-000002.tmp and updating latest: step-000002 complete
# on disk, latest still step-000001.
crash "kill:ckpt_between_renames:2"
"$TRIDENT" ckpt verify "$root/k$((points - 1))/step-000002" >/dev/null 2>&1 || { echo "FAIL: step-000002 incomplete after the kill between renames"; fail=1; }
[ "$(cat "$root/k$((points - 1))/latest")" = step-000001 ] || { echo "FAIL: latest moved before the kill between renames"; fail=1; }

# Inside rotation's removal of step-000001 (third save), one file of it
# already gone: rotation renames a folder out of the step-N namespace before
# deleting it, so no step-N folder is left that `ckpt verify` refuses.
crash "kill:remove_partial:1" 1
for d in "$root/k$((points - 1))"/step-*; do
    "$TRIDENT" ckpt verify "$d" >/dev/null 2>&1 || { echo "FAIL: $d refused after a kill during rotation"; fail=1; }
done

# A failed fsync on rank 2 only, in the second save: every rank returns the
# error, the same on every rank (comm_agree: rank 2 named with its host and
# its own reason), rank 0 removes the .tmp, and step 1 stays the latest.
dir="$root/fsync"
rc=0; TRIDENT_FAULT=fsync:2@2 timeout -k 2 30 "${MPIRUN[@]}" -np 4 "$DRV" save "$dir" >"$root/out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && [ "$(grep -c 'save failed: checkpoint step 2: writing the rank file failed on 1 of 4 ranks: rank 2 (host [^)]*): .*step-000002.tmp/rank-00002.h5: fsync failed' "$root/out")" -eq 4 ] &&
    [ ! -e "$dir/step-000002.tmp" ] && [ "$("$DRV" load "$dir" 2>&1)" = "loaded step 1" ] ||
    { cat "$root/out"; ls "$dir"; echo "FAIL: fsync fault on one rank (exit $rc)"; fail=1; }

# Asynchronous saves (checkpoint_save_begin, `ckpt_driver asave`): kill
# points inside the snapshot, the background writer and the commit. Rank 1's
# storage calls per save: its 4 pieces' snapshot points, the writer's start,
# h5_create and the fsync of its file (on the writer thread), then the
# commit's join and written points; in save 1 the main thread only polls
# while the writer runs, so the numbering there is exact.
aout=$(timeout 60 "${MPIRUN[@]}" -np 4 "$DRV" asave "$root/aclean" 2>&1) || { echo "$aout"; fail "clean async save"; }
grep -q '^committed step 3$' <<<"$aout" && [ "$(sed -n 's/^calls rank 1 after step 1: //p' <<<"$aout")" -eq 9 ] ||
    { echo "$aout"; echo "FAIL: async clean save (rank 1: 9 calls per save)"; fail=1; }
for f in manifest.ini rank-00000.h5 rank-00001.h5 rank-00002.h5 rank-00003.h5; do
    cmp -s "$root/clean/step-000003/$f" "$root/aclean/step-000003/$f" || { echo "FAIL: async step 3 $f differs from the synchronous one"; fail=1; }
done
MODE=asave
crash "kill:ckpt_async_snapshot:2@0"   # mid-snapshot of save 1, rank 0
crash "kill:ckpt_async_snapshot:6@1"   # mid-snapshot of save 2, rank 1
crash "kill:7@1"                       # rank 1's writer: the fsync of its file in save 1 (mid-write on one rank)
crash "kill:h5_create:2@1"             # rank 1's writer about to write its file in save 2
crash "kill:ckpt_async_write:3"        # every rank's writer of save 3 starting
crash "kill:ckpt_async_written:2"      # every rank after all writes of save 2, before its commit
crash "kill:ckpt_async_join:2@0"       # save 3 arriving while save 2 is in flight: rank 0 before the join
crash "kill:ckpt_async_join:2@3"       # the same on rank 3
crash "kill:ckpt_between_renames:3"    # save 3's commit between its renames
MODE=save
# A failed fsync of rank 1's file in its background write of save 2: every
# rank returns rank 1's reason, step 1 stays the latest.
dir="$root/afsync"
rc=0; TRIDENT_FAULT=fsync:2@1 timeout -k 2 30 "${MPIRUN[@]}" -np 4 "$DRV" asave "$dir" >"$root/out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && [ "$(grep -c 'save failed: checkpoint step 2: writing the rank file failed on 1 of 4 ranks: rank 1 (host [^)]*): .*step-000002.tmp/rank-00001.h5: fsync failed' "$root/out")" -eq 4 ] &&
    [ ! -e "$dir/step-000002.tmp" ] && [ "$("$DRV" load "$dir" 2>&1)" = "loaded step 1" ] ||
    { cat "$root/out"; ls "$dir"; echo "FAIL: fsync fault in rank 1's background write (exit $rc)"; fail=1; }

# info: the layout (in the words of the trainer's start line) and every
# tensor with its global shape, pieces and bytes (W = q_proj, (8, 8) fp32: 4
# pieces of 64 bytes each for the moments, ZeRO halves of two TP blocks;
# param/W twice per block, once per DP rank).
out=$("$TRIDENT" ckpt info "$root/clean" 2>&1) || fail "ckpt info: $out"
grep -q '^  layout world 4 = tp 2 x cp 1 x ep 1 x dp_shard 2 x dp_replicate 1 x pp 1, zero_stage 1$' <<<"$out" &&
    grep -Eq '^  adam_m/model.layers.0.self_attn.q_proj.weight +\(8, 8\) +fp32 +4 +256$' <<<"$out" &&
    grep -Eq '^  param/model.layers.0.self_attn.q_proj.weight +\(8, 8\) +fp32 +4 +512$' <<<"$out" ||
    { echo "$out"; echo "FAIL: ckpt info"; fail=1; }

# The manifest's layout against the rank files: a copy relabelled tp 1 x dp
# 4 (the same world, so it opens and reads the same values; it passed verify
# before the check) and one with a fifth rank file: verify, and info after
# its listing, exit 2 naming manifest.ini, the key, a file and its block.
relabel() { # NAME CMD: $root/NAME, a copy of clean's step 3 changed by CMD (run in it)
    rm -rf "$root/$1"; cp -r "$root/clean/step-000003" "$root/$1"; (cd "$root/$1" && eval "$2")
}
refused() { # LABEL CMD PATTERN: `trident CMD` exits 2, PATTERN in its output as one line ('|' ends a line)
    local rc=0 out; out=$("$TRIDENT" $2 2>&1) || rc=$?
    [ "$rc" -eq 2 ] && tr '\n' '|' <<<"$out" | grep -Eq -- "$3" || { echo "$out"; echo "FAIL: $1: exit $rc"; fail=1; }
}
relabel tp1 "sed -i 's/^tp = 2$/tp = 1/; s/^dp = 2$/dp = 4/; s/^dp_shard = 2$/dp_shard = 4/' manifest.ini"
pat='tp1/manifest.ini: tp = 1, but .*/tp1/rank-0000[0-3].h5 holds rows \[[04], [48]\) of [a-z_]+/model.layers.0.self_attn.q_proj.weight \(8, 8\) \(blocks of 4 rows: 2 tp shards\); tp = 1 \(world 4 = tp 1 x cp 1 x ep 1 x dp_shard 4 x dp_replicate 1 x pp 1\) gives that file \(tp rank 0\) rows \[0, 8\)'
refused "verify, tp relabelled" "ckpt verify $root/tp1" "$pat"
refused "info, tp relabelled" "ckpt info $root/tp1" "total stored [0-9.]+ MB in [0-9]+ pieces\|trident: ckpt info: .*$pat"
relabel rank5 "cp rank-00003.h5 rank-00004.h5"
refused "verify, a fifth rank file" "ckpt verify $root/rank5" \
    'rank5/manifest.ini: world_size = 4 \(world 4 = tp 2 x .*\), but the folder also holds rank-00004.h5'
# A truncated rank file: info prints the manifest's step, layout and model,
# then names the file and what is wrong (exit 2).
relabel cut "truncate -s 3000 rank-00001.h5"
refused "info, a truncated rank file" "ckpt info $root/cut" "\|  format_version 1, step 3\|  layout world 4 = \
tp 2 x cp 1 x ep 1 x dp_shard 2 x dp_replicate 1 x pp 1, zero_stage 1\|  model vocab_size=64 d_model=8 n_layers=1 \
.*\|trident: ckpt info: .*/cut/rank-00001.h5: 3000 bytes, manifest.ini says [0-9]+ \(truncated or replaced\)\|$"

# A bad checkpoint: verify exits 2 and names the file.
printf 'x' | dd of="$root/clean/step-000003/rank-00001.h5" bs=1 seek=4000 conv=notrunc status=none
rc=0; out=$("$TRIDENT" ckpt verify "$root/clean" 2>&1) || rc=$?
[ "$rc" -eq 2 ] && grep -q 'rank-00001.h5: checksum' <<<"$out" || { echo "$out"; echo "FAIL: flipped byte: exit $rc"; fail=1; }

# A bad TRIDENT_FAULT is an error returned by the first storage call (the
# library exits nothing): the save fails on every rank, nothing is killed,
# no checkpoint is left, no process hangs.
rc=0; TRIDENT_FAULT=bogus:1 timeout -k 2 30 "${MPIRUN[@]}" -np 4 "$DRV" save "$root/badspec" >"$root/out" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || grep -q 'killed at storage call' "$root/out" ||
    ! grep -q "save failed: .*: rank 0 (host [^)]*): TRIDENT_FAULT='bogus:1': expected kill:N" "$root/out" || [ -e "$root/badspec/latest" ]; then
    cat "$root/out"; echo "FAIL: bad TRIDENT_FAULT: exit $rc"; fail=1
fi
mpi_no_leftovers "$DRV" >/dev/null || { echo "FAIL: bad TRIDENT_FAULT: processes left alive"; fail=1; }

echo "$points kill points"
[ "$points" -ge 37 ] || { echo "FAIL: only $points kill points"; fail=1; }
if [ "$fail" -eq 0 ]; then echo "ckpt_crash: all passed"; fi
exit "$fail"
