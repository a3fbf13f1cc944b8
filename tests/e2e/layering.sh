#!/usr/bin/env bash
# layering.sh: the layering rule of docs/design.md §1 holds: every #include of
# src/ and kernels/ is one the rule allows, no file sits directly in src/, and
# no files form an include cycle or (from nm over the build) a call cycle,
# and no library object ends the process (only src/cli/ chooses exit codes).
# The self-check first plants each kind of fault in a copy of the tree and
# fails unless the checker catches it. Then the op list: a compute op is
# written once in kernels/ops_list.h, never in a hand-written table. And the
# grid: no file outside src/parallel/topology.* and axes_list.h multiplies the
# axes' sizes or computes a rank or coordinate by hand (check_grid.py).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
# The CUDA build's objects too (comm_nccl.o, kernels/cuda/*.o) where there is
# a CUDA toolkit: cuda_build.sh made $BUILD-cuda just before this test in
# `make test`; the make here only brings a stale one up to date.
objects=(--objects "$BUILD")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ -x "$CUDA_HOME/bin/nvcc" ]; then
    make -s -j2 CUDA=1 CUDA_HOME="$CUDA_HOME" BUILD="$BUILD-cuda" "$BUILD-cuda/libtrident.a" >/dev/null
    objects+=(--objects "$BUILD-cuda")
fi
python3 tests/layering/check_layering.py --self-check "${objects[@]}"
# One op list: each compute op's signature written once (docs/design.md §3).
python3 tests/layering/check_op_list.py --self-check
# One axis list: no axis maths outside the grid module (docs/design.md §2).
python3 tests/layering/check_grid.py --self-check
