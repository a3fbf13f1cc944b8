#!/usr/bin/env bash
# rss_plan.sh: peak resident memory of every rank against `trident plan`
# (issue 25, acceptance 3; docs/design.md §5) for configs/gpt2-small.ini (the
# 124M config) on the CPU backend: 2 steps of micro-batch 1 x 256 tokens (the
# plan takes the same settings) and a checkpoint save, in (tp,pp,dp,zero) =
# (1,1,2,0..3), (2,1,2,0) and (2,1,2,1), each line a rank's VmHWM,
# the plan's peak resident bytes and their difference. Fails when a rank
# exceeds the plan by more than 64 MiB (RSS_LIMIT_MIB).
#   tests/bench/rss_plan.sh [TP,PP,DP,ZERO ...]   other layouts (any zero stage)
# Env: RSS_DTYPE (the config's bf16; fp32 also), RSS_CONFIG (configs/gpt2-small.ini).
# About 3 minutes on 2 cores.
set -euo pipefail
source "$(dirname "$0")/../e2e/lib/common.sh"
source tests/e2e/lib/rss_plan.sh
need_built "$TRIDENT"
if [ ! -f data/kjv-shards/index.ini ]; then # as make run prepares it
    data/make_kjv.sh >/dev/null
    "$TRIDENT" prep --input data/kjv.txt --output data/kjv-shards --vocab-size 4096 >/dev/null
fi
cfg=${RSS_CONFIG:-configs/gpt2-small.ini}
args=(train.micro_batch_size=1 train.seq_len=256 train.global_batch_size=2 train.steps=2
      train.warmup_steps=1 precision.dtype="${RSS_DTYPE:-bf16}" data.path=data/kjv-shards)
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=(1,1,2,0 1,1,2,1 1,1,2,2 1,1,2,3 2,1,2,0 2,1,2,1)
fail=0
for l in "${layouts[@]}"; do
    IFS=, read -r tp pp dp z <<<"$l"
    rss_vs_plan "$cfg" "$tp" "$pp" "$dp" "$z" "${args[@]}" || fail=1
done
exit $fail
