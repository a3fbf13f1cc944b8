# common.sh: the preamble of every tests/e2e/*.sh, sourced right after the
# script's `set -euo pipefail`:
#     set -euo pipefail
#     source "$(dirname "$0")/lib/common.sh"
# It cds to the repo root and defines
#   BUILD, TRIDENT      the build folder (env BUILD, default build) and $PWD/$BUILD/trident
#   MPIRUN              the mpirun line as an array (lib/mpi_env.sh), OpenMPI's root variables
#   tmp                 a fresh folder, removed when the script exits
#   PY                  .venv/bin/python, the project's venv (made by `make deps`)
#   fail MSG            print "FAIL: MSG" and exit 1
#   skip MSG            print "skipped: MSG" and exit 77 (only for a missing CUDA device,
#                       or Slurm daemons that cannot run here: tests/run.sh MAY_SKIP)
#   need_built FILE...  fail unless each FILE is an executable (run make)
#   need_py MODULE...   fail unless the venv's python imports each MODULE (run make deps)
#   mpi_no_leftovers PATTERN
#                       prints the live processes whose command line holds PATTERN;
#                       true when there are none (waits up to 3 s for mpirun's cleanup)
#   metrics RUN_DIR [JQ-EXPR]
#                       the step records (those with "loss") of RUN_DIR/metrics.jsonl,
#                       one compact JSON line each, or JQ-EXPR applied to each
#   metrics_at_least RUN_DIR STEP
#                       true when RUN_DIR/metrics.jsonl has a step record >= STEP
#   small_dataset DIR   DIR/shards: a 510-id dataset (not a multiple of 4: tp = 4
#                       pads the vocabulary) of the first chapters of the King
#                       James Bible (bible-kjv); SMALL_INI: the config it goes with
#   small_train RUN_DIR CK_DIR TP PP DP ZERO [overrides...]
#                       `trident train` of SMALL_INI on $tmp/shards (small_dataset "$tmp")
#                       with TP * PP * DP ranks (times SMALL_CP, which sets
#                       parallel.cp, when given), global batch 16, no evaluation,
#                       checkpoints (if any) in CK_DIR, metrics in RUN_DIR (a key
#                       given twice is refused: these are not overridable);
#                       killed after ${SMALL_TRAIN_TIMEOUT:-300} s (exit 124); output to
#                       the caller's stdout/stderr; the ranks inherit the environment
# Numbers and progress of `trident train` come from metrics.jsonl and the run's
# files, never from its printed log (whose wording is for people); a message
# on stderr for bad input is the contract being tested and may be matched.
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
BUILD=${BUILD:-build}
TRIDENT="$PWD/$BUILD/trident"
PY="$PWD/.venv/bin/python"
SMALL_INI=tests/e2e/configs/small.ini
source tests/e2e/lib/mpi_env.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/trident-$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "skipped: $*"; exit 77; }

need_built() {
    local f
    for f in "$@"; do [ -x "$f" ] || fail "$f not built (make)"; done
}

# need_emu TARGET...: builds TARGETs (paths under the emulated build, e.g.
# trident, tests/check_host_work, or the make goal all) with make EMU=1 into
# EMU_BUILD ($BUILD-emu, set here), a no-op when current; fails with make's
# last lines.
need_emu() {
    EMU_BUILD="$BUILD-emu"
    local t targets=() files=()
    for t in "$@"; do
        if [ "$t" = all ]; then targets+=(all); else targets+=("$EMU_BUILD/$t"); files+=("$EMU_BUILD/$t"); fi
    done
    make -j2 EMU=1 BUILD="$EMU_BUILD" "${targets[@]}" >"$tmp/make.log" 2>&1 ||
        { tail -n 40 "$tmp/make.log"; fail "make EMU=1"; }
    [ ${#files[@]} -eq 0 ] || need_built "${files[@]}"
}

need_py() {
    [ -x "$PY" ] || fail "$PY missing: run make deps (it makes .venv with tests/requirements.txt)"
    local m
    for m in "$@"; do
        "$PY" -c "import $m" 2>/dev/null || fail "python module $m missing from .venv: run make deps"
    done
}

mpi_no_leftovers() {
    local left
    for _ in 1 2 3 4 5 6; do
        left=$(ps -eo pid=,stat=,args= | awk -v p="$1" '$2 !~ /^Z/ && index($0, p) && !/awk/')
        [ -z "$left" ] && return 0
        sleep 0.5
    done
    echo "$left"
    return 1
}

command -v jq >/dev/null || fail "jq not installed: run make deps"
command -v mpirun >/dev/null || fail "mpirun not installed: run make deps"

metrics() {
    [ -f "$1/metrics.jsonl" ] || { echo "FAIL: $1/metrics.jsonl missing" >&2; return 1; }
    jq -c "select(has(\"loss\")) | ${2:-.}" "$1/metrics.jsonl"
}

# metrics_at_least RUN_DIR STEP: RUN_DIR/metrics.jsonl has a step record of
# STEP or later. Read line by line (fromjson?), so a line the live run is
# still writing is skipped, not a parse error that reads as "no"; and not
# by jq -e, whose status in jq 1.6 is that of the LAST input's output (no
# output for a trailing non-step record, such as a checkpoint record, reads
# as "no").
metrics_at_least() {
    [ -f "$1/metrics.jsonl" ] && jq -R --argjson s "$2" \
        'fromjson? | select(type == "object" and has("loss") and .step >= $s) | .step' \
        "$1/metrics.jsonl" 2>/dev/null | grep -q .
}

small_dataset() {
    local dir=$1
    command -v bible >/dev/null || fail "bible-kjv not installed: run make deps"
    data/make_kjv.sh "$dir/kjv.txt" >/dev/null
    awk 'BEGIN{RS=""; ORS="\n\n"} NR <= 150' "$dir/kjv.txt" > "$dir/small.txt"
    "$TRIDENT" prep --input "$dir/small.txt" --output "$dir/shards" --vocab-size 510 \
        --val-fraction 0.05 >/dev/null 2>&1 || fail "prep of the small dataset"
}

small_train() {
    local run=$1 ck=$2 tp=$3 pp=$4 dp=$5 zero=$6 cp=${SMALL_CP:-1}; shift 6
    timeout "${SMALL_TRAIN_TIMEOUT:-300}" "${MPIRUN[@]}" -np $((tp * cp * pp * dp)) "$TRIDENT" train "$SMALL_INI" \
        data.path="$tmp/shards" parallel.tp="$tp" parallel.pp="$pp" parallel.dp="$dp" parallel.zero_stage="$zero" \
        ${SMALL_CP:+parallel.cp=$SMALL_CP} \
        train.global_batch_size=16 train.eval_every="${SMALL_EVAL_EVERY:-0}" checkpoint.dir="$ck" log.run_dir="$run" "$@"
}

# hf_fixture_logits FIXTURE_DIR WORK_DIR LABEL: a Hugging Face fixture folder's
# checks (a) and (b) of tests/e2e/hf_families.sh: hf_families_check.py prepare
# into WORK_DIR, `trident ckpt logits` of the folder, and of each config.json
# variant (WORK_DIR/vK, the folder's weights linked in; HF_VARIANTS: how
# many); the comparison with transformers' numbers is hf_families_check.py's.
hf_fixture_logits() {
    local d=$1 w=$2 label=$3 k
    HF_VARIANTS=$($PY tests/e2e/lib/hf_families_check.py prepare "$d" "$w")
    "$TRIDENT" ckpt logits "$d" --tokens "$w/tokens.txt" --out "$w/logits.safetensors" > /dev/null ||
        fail "(a) ${label}trident ckpt logits"
    for k in $(seq 0 $((HF_VARIANTS - 1))); do
        ln -s "$PWD/$d/model.safetensors" "$w/v$k/model.safetensors"
        "$TRIDENT" ckpt logits "$w/v$k" --tokens "$w/tokens24.txt" --out "$w/v$k.safetensors" > /dev/null \
            2> "$tmp/err" || fail "(b) ${label}variant $k ($(cat "$w/v$k/config.json")): $(cat "$tmp/err")"
    done
}

# hf_refused DIR TOKENS KEY WHAT: `trident ckpt logits` of Hugging Face folder
# DIR (a changed config.json) exits 2 naming config.json's KEY.
hf_refused() {
    local r=$1 tokens=$2 key=$3 what=$4 rc=0
    "$TRIDENT" ckpt logits "$r" --tokens "$tokens" --out "$r/l.safetensors" > /dev/null 2> "$r/err" || rc=$?
    [ $rc -eq 2 ] && grep -q "config.json: .*\b$key\b" "$r/err" ||
        fail "$what: exit $rc, '$(cat "$r/err")' (expected exit 2 naming $key)"
    echo "ok: $what refused: $(head -c 200 "$r/err")"
}
