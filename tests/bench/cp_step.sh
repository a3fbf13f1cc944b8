#!/usr/bin/env bash
# cp_step.sh (make bench): the CPU cost of context parallelism ([parallel] cp,
# ring attention, docs/design.md §4) on the same total work: 8 steps of a
# 2-layer model of width 256 (8 heads, 4 key/value heads, seq 1024, one
# sequence a microbatch, global batch 4, fp32, one thread per rank) on the
# KJV shards, as (a) cp 1 on one rank, (b) dp 2 on two ranks and (c) cp 2 on
# two ranks: (b) and (c) hold the same tokens a step on the same ranks, (c)
# splitting each sequence instead of the batch. Prints each run's median
# step time (metrics.jsonl's step_time_s over steps 3-8) and its rank 0
# compute and communication seconds, the ratio cp 2 / dp 2 (the ring's
# overhead against plain data parallelism) and cp 2's rank-seconds against
# cp 1's (2 x its step time / cp 1's: 1.0 is no overhead). Asserts nothing
# about speed; the host's load average is printed too (on a shared machine
# the ratios move with it).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=$PWD/$BUILD/trident
source tests/e2e/lib/mpi_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/trident-bench-cp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
data/make_kjv.sh "$tmp/kjv.txt" > /dev/null
"$T" prep --input "$tmp/kjv.txt" --output "$tmp/shards" --vocab-size 1024 --val-fraction 0.01 > /dev/null 2>&1
for l in "cp1 1 1 1" "dp2 2 1 2" "cp2 2 2 1"; do
    read -r name np cp dp <<<"$l"
    OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np "$np" "$T" train tests/e2e/configs/cp.ini data.path="$tmp/shards" \
        model.vocab_size=1024 model.d_model=256 model.n_layers=2 model.n_heads=8 model.n_kv_heads=4 \
        model.ffn_dim=704 model.max_seq_len=1024 model.tie_embeddings=false train.seq_len=1024 \
        train.steps=8 parallel.cp="$cp" parallel.dp="$dp" system.threads=1 system.peak_tflops=1 \
        checkpoint.every=0 log.run_dir="$tmp/run-$name" checkpoint.dir="$tmp/ck-$name" \
        < /dev/null > "$tmp/log-$name" 2>&1 || { tail -5 "$tmp/log-$name"; exit 1; }
done
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def recs(n): return [r for r in map(json.loads, open(f"{tmp}/run-{n}/metrics.jsonl")) if "loss" in r][2:]
def median(xs): xs = sorted(xs); return xs[len(xs) // 2]
t = {}
for n, what in (("cp1", "cp 1, 1 rank"), ("dp2", "dp 2, 2 ranks"), ("cp2", "cp 2, 2 ranks")):
    r = recs(n)
    t[n] = median([x["step_time_s"] for x in r])
    print(f"{what}: {t[n] * 1e3:.1f} ms/step (rank 0: compute {median([x['compute_s'][0] for x in r]) * 1e3:.1f} ms, "
          f"comm {median([x['comm_s'][0] for x in r]) * 1e3:.1f} ms), loss at step 8 {r[-1]['loss']:.6f}")
print(f"cp 2 / dp 2 (same ranks, same tokens a step): {t['cp2'] / t['dp2']:.3f}; "
      f"cp 2 rank-seconds / cp 1: {2 * t['cp2'] / t['cp1']:.3f} (1.0: no overhead)")
print("load average:", open("/proc/loadavg").read().split()[0:3])
PY
