#!/usr/bin/env bash
# train_fail_reason.sh: every failing rank's reason reaches the log
# (comm_agree, src/parallel/comm.h). A dp = 2 run of configs/tiny.ini whose
# rank 1 finds a full disk at its first checkpoint write (TRIDENT_FAULT=
# enospc:1@1, src/ckpt/durable.h) exits 1, and its train.log (both ranks'
# stderr) names rank 1, its host and the cause (No space left on device, the
# rank file's path). A test of messages: reading the log is the contract.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
[ -d data/kjv-shards ] || fail "data/kjv-shards missing (make data, or link /work/main/data/kjv-shards)"
rc=0
TRIDENT_FAULT=enospc:1@1 timeout 120 "${MPIRUN[@]}" -np 2 "$TRIDENT" train configs/tiny.ini \
    train.steps=3 train.warmup_steps=1 train.eval_every=0 train.sample_every=0 log.every=1 \
    system.threads=1 checkpoint.dir="$tmp/ck" checkpoint.every=2 log.run_dir="$tmp/run" \
    > "$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || { tail -20 "$tmp/out"; fail "enospc on rank 1: exit $rc, expected 1"; }
host=$(hostname)
line=$(grep -m1 "rank 1 (host $host): .*rank-00001.h5: .*No space left on device" "$tmp/run/train.log") ||
    { tail -20 "$tmp/run/train.log"; fail "train.log does not name rank 1, its host and its cause"; }
echo "ok: $line"
echo "PASS: train_fail_reason"
