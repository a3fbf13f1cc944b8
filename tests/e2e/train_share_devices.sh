#!/usr/bin/env bash
# train_share_devices.sh: two ranks of a node on one CUDA device (more ranks
# than devices) are refused unless [system] share_devices = true
# (docs/design.md §2), on the emulated CUDA build ($BUILD-emu, `make EMU=1`;
# TRIDENT_EMU_DEVICES sets the count, the emulated PCI bus id follows
# CUDA_VISIBLE_DEVICES as a real one names the physical GPU):
#   (a) 2 ranks, 1 device: exit 2, one message naming the key
#       system.share_devices, the ranks and the counts (2 ranks, 1 device), no step;
#   (b) the same with system.share_devices=true: trains its 2 steps (exit 0,
#       the round-robin note printed once);
#   (c) 2 ranks that each see 1 device, but different ones (per-rank
#       CUDA_VISIBLE_DEVICES = 0 and 1, as srun --gpus-per-task=1 sets it):
#       not sharing, trains without the key (a check of device counts alone
#       would refuse it).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_emu trident
TRIDENT="$PWD/$EMU_BUILD/trident"
small_dataset "$tmp"
train2() { # RUN_DIR [overrides...]
    local run=$1; shift
    TRIDENT_EMU_DEVICES=1 timeout 120 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        parallel.dp=2 system.device=cuda train.steps=2 train.warmup_steps=1 train.eval_every=0 log.run_dir="$run" "$@"
}

# (a)
rc=0
train2 "$tmp/a" > "$tmp/a.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || { tail -5 "$tmp/a.log"; fail "2 ranks on 1 device exited $rc, expected 2"; }
n=$(grep -ac 'system.share_devices' "$tmp/a.log" || true)
grep -aEq '2 ranks on host [^ ]+ would share one CUDA device \(PCI [0-9a-f:.]+: ranks 0, 1\); the host runs 2 ranks on 1 device .*\[system\] share_devices = true \(system.share_devices=true\)' \
    "$tmp/a.log" && [ "$n" = 1 ] || { cat "$tmp/a.log"; fail "no single message naming the key and the counts ($n)"; }
[ -z "$(metrics "$tmp/a" .step 2>/dev/null)" ] || fail "the refused run trained"
mpi_no_leftovers "$tmp/a" >/dev/null || fail "processes of the refused run left"
echo "ok (a): $(grep -a -m1 'share_devices' "$tmp/a.log" | cut -c1-240)"

# (b)
train2 "$tmp/b" system.share_devices=true > "$tmp/b.log" 2>&1 || { tail -5 "$tmp/b.log"; fail "share_devices=true failed"; }
[ "$(metrics "$tmp/b" .step | tr '\n' ' ')" = "1 2 " ] || fail "share_devices=true did not train steps 1 and 2"
[ "$(grep -ac 'share CUDA devices round-robin' "$tmp/b.log")" = 1 ] || { grep -a note "$tmp/b.log"; fail "no round-robin note"; }
echo "ok (b): $(grep -a -m1 'round-robin' "$tmp/b.log" | cut -c1-200)"

# (c)
args=(train "$SMALL_INI" data.path="$tmp/shards" parallel.dp=2 system.device=cuda train.steps=2 train.warmup_steps=1
      train.eval_every=0 log.run_dir="$tmp/c")
TRIDENT_EMU_DEVICES=1 timeout 120 "${MPIRUN[@]}" -np 1 env CUDA_VISIBLE_DEVICES=0 "$TRIDENT" "${args[@]}" : \
    -np 1 env CUDA_VISIBLE_DEVICES=1 "$TRIDENT" "${args[@]}" > "$tmp/c.log" 2>&1 ||
    { tail -5 "$tmp/c.log"; fail "2 ranks on 2 different devices (1 visible to each) were refused"; }
[ "$(metrics "$tmp/c" .step | tr '\n' ' ')" = "1 2 " ] || fail "run (c) did not train steps 1 and 2"
grep -aq 'round-robin' "$tmp/c.log" && fail "run (c) noted sharing"
echo "ok (c): ranks seeing one different device each train without the key"
