#!/usr/bin/env bash
# mpirun_examples.sh: launch lines for the layouts trident supports. N ranks
# must equal tp * cp * pp * dp (parallel.dp = 0 infers dp = N / (tp * cp * pp);
# configs/tiny.ini sets dp = 2, so these lines give it); rank order is
# Megatron's (tp fastest, then cp, then dp, then pp; docs/design.md section 2).
# tests/e2e/slurm.sh checks each line with `trident plan --world-size N`.
# As root, OpenMPI also needs OMPI_ALLOW_RUN_AS_ROOT=1
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores need --oversubscribe.
# Print them with: bash jobs/mpirun_examples.sh. Slurm batch scripts:
# jobs/slurm_train.sbatch (one node), jobs/slurm_multinode.sbatch (GPUs).
cat <<'LINES'
# data parallel on 4 ranks (global batch = micro batch 8 x dp 4 x accumulation)
mpirun -np 4 build/trident train configs/tiny.ini parallel.dp=4 train.global_batch_size=32
# tensor parallel 2 x data parallel 2, ZeRO-1 optimizer state sharding
mpirun -np 4 build/trident train configs/tiny.ini parallel.tp=2 parallel.dp=2 parallel.zero_stage=1
# tensor parallel 2 with sequence parallelism
mpirun -np 2 build/trident train configs/tiny.ini parallel.tp=2 parallel.dp=1 parallel.sequence_parallel=true
# pipeline parallel 2 (1F1B) x data parallel 2
mpirun -np 4 build/trident train configs/tiny.ini parallel.pp=2 parallel.dp=2 train.global_batch_size=32
# context parallel 2 x data parallel 2: each sequence's tokens split over 2 ranks (ring attention)
mpirun -np 4 build/trident train configs/tiny.ini parallel.cp=2 parallel.dp=2
# ZeRO-3 (FSDP) over data parallel 4: parameters, gradients and optimizer state sharded; parameters all-gathered per unit
mpirun -np 4 build/trident train configs/tiny.ini parallel.dp=4 parallel.zero_stage=3 train.global_batch_size=32
# interleaved 1F1B: 2 stages, 2 model chunks each
mpirun -np 2 build/trident train configs/tiny.ini parallel.pp=2 parallel.dp=1 parallel.virtual_stages=2
# the full grid: tp 2 x pp 2 x dp 2 (1F1B needs microbatches >= stages: 32 / (8 x 2) = 2)
mpirun -np 8 build/trident train configs/tiny.ini parallel.tp=2 parallel.pp=2 parallel.dp=2 train.global_batch_size=32
# resume a run's latest checkpoint in another layout (resharding; same global batch)
mpirun -np 4 build/trident train configs/tiny.ini parallel.tp=2 parallel.dp=2 checkpoint.dir=runs/tiny-DATE/checkpoints
# Slurm, one node, 2 ranks (srun needs --mpi=pmix for Debian's OpenMPI; srun --mpi=list names the plugins)
srun --mpi=pmix --ntasks=2 build/trident train configs/tiny.ini parallel.dp=2
# mpirun inside a Slurm allocation: 2 nodes x 8 GPUs, tp 8 inside a node, dp 2 across.
# OpenMPI's mpirun reads the allocation and starts its daemons through Slurm;
# --map-by ppr:8:node fills one node, then the next, so consecutive ranks (one
# TP group, docs/design.md section 2) share a node. For the time limit and
# requeues see jobs/slurm_train.sbatch (TRIDENT_SRUN_MPI=mpirun).
salloc --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=8 --time=1:00:00
# a signalled mpirun SIGKILLs the ranks this many seconds after its SIGTERM (default 1): room to save
export OMPI_MCA_odls_base_sigkill_timeout=60
mpirun -np "$SLURM_NTASKS" --map-by ppr:8:node --bind-to none build/trident train configs/llama-1b.ini \
    system.device=cuda parallel.tp=8 parallel.dp=2 checkpoint.dir=runs/llama-1b/checkpoints
# the same allocation with srun
srun --mpi=pmix --distribution=block:block build/trident train configs/llama-1b.ini \
    system.device=cuda parallel.tp=8 parallel.dp=2 checkpoint.dir=runs/llama-1b/checkpoints
LINES
