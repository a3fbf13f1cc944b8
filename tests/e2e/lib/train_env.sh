# train_env.sh: sourced by e2e tests of `trident train`. Provides MPIRUN (from
# mpi_env.sh), TRIDENT, SMALL_INI and small_dataset DIR, which prepares a
# 510-id dataset (not a multiple of 4: tp = 4 pads the vocabulary) from the first chapters of the King James Bible (bible-kjv).
source "$(dirname "${BASH_SOURCE[0]}")/../mpi_env.sh"
mpi_require
BUILD=${BUILD:-build}
TRIDENT="$BUILD/trident"
SMALL_INI=tests/e2e/configs/small.ini
[ -x "$TRIDENT" ] || { echo "FAIL: $TRIDENT not built"; exit 1; }

small_dataset() {
    local dir=$1
    command -v bible >/dev/null || { echo "skipped: bible-kjv not installed"; exit 77; }
    data/make_kjv.sh "$dir/kjv.txt" >/dev/null
    awk 'BEGIN{RS=""; ORS="\n\n"} NR <= 150' "$dir/kjv.txt" > "$dir/small.txt"
    "$TRIDENT" prep --input "$dir/small.txt" --output "$dir/shards" --vocab-size 510 \
        --val-fraction 0.05 >/dev/null 2>&1 || { echo "FAIL: prep of the small dataset"; exit 1; }
}
