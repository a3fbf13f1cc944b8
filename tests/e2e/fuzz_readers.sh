#!/usr/bin/env bash
# fuzz_readers.sh: issue 18's fuzz test of every reader of outside data
# (checkpoint, dataset, tokenizer.json, config, prep inputs) under the
# AddressSanitizer + UBSan build ($FUZZ_BUILD/trident, default build-asan,
# which `make test` builds): tests/fuzz/gen.py writes a fixed-seed corpus
# (issue 18's cases by name, then FUZZ_N random mutations per reader, default
# 120), tests/fuzz/case.sh runs each with a timeout and fails it on a
# sanitizer report, a signal, a timeout, an exit other than 0 or 2, or exit 0
# for an input marked corrupt. FUZZ_N=5000 for a nightly run.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
FUZZ_BUILD=${FUZZ_BUILD:-build-asan}
need_built "$FUZZ_BUILD/trident"
need_py h5py numpy
command -v timeout >/dev/null || fail "timeout (coreutils) missing"
PY="$PY" bash tests/fuzz/run.sh "$FUZZ_BUILD/trident" "$tmp/fuzz" || fail "fuzz cases failed (see above)"
