#!/usr/bin/env bash
# layering.sh: the layering rule of docs/design.md §1 holds: every #include of
# src/ and kernels/ is one the rule allows, no file sits directly in src/, and
# no files form an include cycle or (from nm over the build) a call cycle.
# The self-check first plants each kind of fault in a copy of the tree and
# fails unless the checker catches it.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
python3 tests/layering/check_layering.py --self-check --objects "$BUILD"
