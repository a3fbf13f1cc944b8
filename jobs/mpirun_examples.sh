#!/usr/bin/env bash
# mpirun_examples.sh: launch lines for the layouts trident supports. N ranks
# must equal tp * pp * dp; rank order is Megatron's (tp fastest, then dp,
# then pp). As root, OpenMPI also needs OMPI_ALLOW_RUN_AS_ROOT=1
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores need --oversubscribe.
# Print them with: bash jobs/mpirun_examples.sh
cat <<'LINES'
# data parallel on 4 ranks (global batch = micro batch 8 x dp 4 x accumulation)
mpirun -np 4 build/trident train configs/tiny.ini parallel.dp=4 train.global_batch_size=32
# tensor parallel 2 x data parallel 2, ZeRO-1 optimizer state sharding
mpirun -np 4 build/trident train configs/tiny.ini parallel.tp=2 parallel.dp=2 parallel.zero_stage=1
# tensor parallel 2 with sequence parallelism
mpirun -np 2 build/trident train configs/tiny.ini parallel.tp=2 parallel.dp=1 parallel.sequence_parallel=true
# pipeline parallel 2 (1F1B) x data parallel 2
mpirun -np 4 build/trident train configs/tiny.ini parallel.pp=2 parallel.dp=2 train.global_batch_size=32
# interleaved 1F1B: 2 stages, 2 model chunks each
mpirun -np 2 build/trident train configs/tiny.ini parallel.pp=2 parallel.dp=1 parallel.virtual_stages=2
# the full grid: tp 2 x pp 2 x dp 2 (1F1B needs microbatches >= stages: 32 / (8 x 2) = 2)
mpirun -np 8 build/trident train configs/tiny.ini parallel.tp=2 parallel.pp=2 parallel.dp=2 train.global_batch_size=32
# resume a run's latest checkpoint in another layout (resharding; same global batch)
mpirun -np 4 build/trident train configs/tiny.ini parallel.tp=2 parallel.dp=2 checkpoint.dir=runs/tiny-DATE/checkpoints
LINES
