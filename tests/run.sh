#!/usr/bin/env bash
# Runs every test: the unit binaries in $BUILD/tests and the shell tests in
# tests/e2e/*.sh (which share tests/e2e/lib/common.sh). Exit 0 = pass, 77 =
# skipped (only for a missing CUDA device or toolkit), anything else = fail.
# Prints one line per test with its seconds, then the summed seconds of the
# tests run, and ends with "N passed, N failed, N skipped".
# TESTS="name ..." runs only those; ASAN=1 runs only the unit binaries.
set -u
BUILD=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
cd "$(dirname "$0")/.."
# The only tests that may skip: they need a CUDA device (test_ops_cuda) or the
# CUDA toolkit, which no Debian package of `make deps` brings (cuda_build), or
# they start Slurm's daemons, which needs root and a machine that lets them run
# (slurm). Under ASAN=1, test_no_alloc too: the sanitizer owns malloc.
MAY_SKIP="test_ops_cuda cuda_build slurm${ASAN:+ test_no_alloc}"
pass=0 fail=0 skip=0 failed=() total=0
tests=()
for t in "$BUILD"/tests/test_*; do [ -x "$t" ] && tests+=("$t"); done
if [ -z "${ASAN:-}" ]; then for t in tests/e2e/*.sh; do [ -f "$t" ] && tests+=("$t"); done; fi
log_dir="$BUILD/test-logs"; mkdir -p "$log_dir"
for t in "${tests[@]}"; do
    name=$(basename "$t" .sh)
    if [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $name "* ]]; then continue; fi
    start=$(date +%s)
    if [[ "$t" == *.sh ]]; then BUILD="$BUILD" bash "$t" >"$log_dir/$name.log" 2>&1; rc=$?
    else "$t" >"$log_dir/$name.log" 2>&1; rc=$?; fi
    secs=$(( $(date +%s) - start )); total=$((total + secs))
    case $rc in
        0)  pass=$((pass+1)); printf 'PASS  %-32s %4ss\n' "$name" "$secs" ;;
        77) if [[ " $MAY_SKIP " == *" $name "* ]]; then
                skip=$((skip+1)); printf 'SKIP  %-32s %4ss  %s\n' "$name" "$secs" "$(grep -m1 '^skipped' "$log_dir/$name.log")"
            else # a missing tool is a failure: make deps installs every tool a test needs
                fail=$((fail+1)); failed+=("$name")
                printf 'FAIL  %-32s %4ss  (skipped, but only %s may skip: %s)\n' "$name" "$secs" "$MAY_SKIP" \
                    "$(grep -m1 '^skipped' "$log_dir/$name.log")"
            fi ;;
        *)  fail=$((fail+1)); failed+=("$name"); printf 'FAIL  %-32s %4ss  (exit %d)\n' "$name" "$secs" "$rc"
            tail -n 20 "$log_dir/$name.log" | sed 's/^/      /' ;;
    esac
done
echo "total: $total s over $((pass + fail + skip)) tests"
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]} (logs in $log_dir)"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
