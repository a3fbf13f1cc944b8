#!/usr/bin/env bash
# `make run`: the default job on a fresh machine. Prepares the King James Bible
# corpus (data/make_kjv.sh, then trident prep with a 4096-id BPE trained on
# it), then trains configs/tiny.ini on 2 MPI ranks (data parallel). The log
# shows the loss and the validation loss falling and text samples; the run's
# folder runs/tiny-<date>-<time>/ gets metrics.jsonl, config.ini, train.log
# and checkpoints/, then `trident plot` draws its curves.png and the last
# line prints its path. Extra arguments are config overrides, e.g.
#   make run ARGS="train.steps=100"
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data/make_kjv.sh
if [ ! -f data/kjv-shards/index.ini ]; then
    "$BUILD/trident" prep --input data/kjv.txt --output data/kjv-shards --vocab-size 4096
fi
source tests/e2e/lib/mpi_env.sh
# Each `make run` is a fresh run in its own folder (metrics.jsonl,
# config.ini, train.log, checkpoints/); resume one with
#   mpirun -np 2 build/trident train configs/tiny.ini log.run_dir=DIR checkpoint.dir=DIR/checkpoints
# (its metrics.jsonl and train.log are appended to: docs/design.md §9)
# (TRIDENT_RUNS=DIR: the folder goes under DIR instead of runs/; tests/e2e/plot.sh.)
run_dir="${TRIDENT_RUNS:-runs}/tiny-$(date +%Y%m%d-%H%M%S)"
# One OpenMP thread per rank: 2 ranks fill the 2 cores of a small machine.
"${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 "$BUILD/trident" train configs/tiny.ini system.threads=1 \
    log.run_dir="$run_dir" checkpoint.dir="$run_dir/checkpoints" "$@"
echo "run folder: $run_dir (metrics.jsonl, config.ini, train.log, checkpoints/)"
# The curves (loss and validation loss against tokens, lr, grad norm, tokens/s).
"$BUILD/trident" plot "$run_dir" --out "$run_dir/curves.png" >/dev/null
echo "curves: $run_dir/curves.png"
