#!/usr/bin/env bash
# run.sh TRIDENT WORK: the fuzz test of trident's readers of outside data
# (issue 18). TRIDENT should be the AddressSanitizer + UBSan build
# (build-asan/trident, `make build-asan/trident` via the test target). In
# WORK: base/ (a dataset, tokenizer and one-step checkpoint made by TRIDENT),
# corpus/ (gen.py's cases), results.txt (one line per case). Exit 0 when
# every case passes (tests/fuzz/case.sh says what fails one).
#   FUZZ_N=N     random mutations per reader (default 120; 5 readers)
#   FUZZ_SEED=S  the corpus seed (default 18)
#   FUZZ_JOBS=J  cases run at once (default 2)
set -euo pipefail
T=$(realpath "$1") W=$2
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-$here/../../.venv/bin/python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Leaks on a refusal path are not this test's business; an allocation above
# 1 GiB is (every input here is a few KiB: issue 18 acceptance 3).
export ASAN_OPTIONS=detect_leaks=0:exitcode=99:max_allocation_size_mb=1024:allocator_may_return_null=0
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1
mkdir -p "$W/base"
B=$W/base
# The base inputs: 90 short documents, a 300-id BPE, one training step.
for i in $(seq 1 30); do
    printf 'In the beginning God created the heaven and the earth.\n\n'
    printf 'And the earth was without form, and void; and darkness was upon the face of the deep.\n\n'
    printf 'And God said, Let there be light: and there was light.\n\n'
done > "$B/text.txt"
rm -rf "$B/ds" "$B/ck" "$B/run"
"$T" prep --input "$B/text.txt" --output "$B/ds" --vocab-size 300 --val-fraction 0 --quiet >/dev/null
cp "$here/fuzz.ini" "$B/fuzz.ini"
(cd "$B" && "$T" train fuzz.ini >train.log 2>&1) || { cat "$B/train.log"; echo "FAIL: base checkpoint"; exit 1; }
[ -f "$B/ck/step-000001/manifest.ini" ] || { echo "FAIL: no base checkpoint"; exit 1; }
rm -rf "$B/run" "$W/corpus"; mkdir -p "$W/corpus"
"$PY" "$here/gen.py" "$B" "$W/corpus" "${FUZZ_N:-120}" "${FUZZ_SEED:-18}"
ls -d "$W/corpus"/*/ | xargs -d "\n" -P "${FUZZ_JOBS:-2}" -n 1 bash "$here/case.sh" "$T" > "$W/results.txt"
total=$(wc -l < "$W/results.txt")
bad=$(grep -c '^FAIL' "$W/results.txt" || true)
awk '{print $3}' "$W/results.txt" | sort | uniq -c | awk '{printf "%s %s cases; ", $2, $1} END {print ""}'
echo "exit 2: $(awk '$1=="ok" && $4==2' "$W/results.txt" | wc -l), exit 0: $(awk '$1=="ok" && $4==0' "$W/results.txt" | wc -l)"
if [ "$bad" -gt 0 ]; then
    grep '^FAIL' "$W/results.txt" | sort
    echo "FAIL: $bad of $total fuzz cases (inputs and output in $W/corpus)"
    exit 1
fi
echo "ok: $total fuzz cases"
