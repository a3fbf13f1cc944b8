# rss_plan.sh: sourced after lib/common.sh by tests/e2e/plan_rss.sh and
# tests/bench/rss_plan.sh. Defines
#   rss_vs_plan CONFIG TP PP DP ZERO [section.key=value ...]
#       `trident plan CONFIG --json` of that layout (any zero stage) on the
#       CPU backend, then `trident train` of it under mpirun with a checkpoint
#       save at its end; prints, per world rank, its peak resident set (VmHWM,
#       the closing record's peak_rss_bytes) minus the plan's peak resident
#       bytes (peak_resident_bytes: the largest rank's arenas and MPI's
#       bound, docs/design.md §5). Returns 1 when a rank exceeds
#       RSS_LIMIT_MIB (default 64) or the run fails. A parallel.cp=C among
#       the overrides runs TP * PP * DP * C ranks.
# The runs write into $tmp/rss-TP-PP-DP-ZERO[-cpC].
RSS_LIMIT_MIB=${RSS_LIMIT_MIB:-64}

rss_vs_plan() {
    local cfg=$1 tp=$2 pp=$3 dp=$4 zero=$5 cp=1 a; shift 5
    for a in "$@"; do [[ "$a" != parallel.cp=* ]] || cp=${a#parallel.cp=}; done
    local name="$tp,$pp,$dp,$zero" dir="$tmp/rss-$tp-$pp-$dp-$zero"
    [ "$cp" = 1 ] || name="$name cp $cp" dir="$dir-cp$cp"
    rm -rf "$dir"; mkdir -p "$dir"
    local args=(system.device=cpu parallel.tp="$tp" parallel.pp="$pp" parallel.dp="$dp"
                parallel.zero_stage="$zero" train.eval_every=0 train.sample_every=0
                checkpoint.dir="$dir/ck" log.run_dir="$dir/run" "$@")
    local plan rc=0
    plan=$("$TRIDENT" plan "$cfg" "${args[@]}" --json) || { echo "FAIL: plan ($name) exited $?"; return 1; }
    local want mpi arenas
    read -r want mpi arenas < <(jq -r '"\(.peak_resident_bytes) \([.groups[].mpi_bytes] | max) \(.peak_bytes)"' <<<"$plan")
    timeout "${RSS_TIMEOUT:-600}" "${MPIRUN[@]}" -np $((tp * pp * dp * cp)) "$TRIDENT" train "$cfg" "${args[@]}" \
        > "$dir/log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { tail -5 "$dir/log"; echo "FAIL: train ($name) exited $rc"; return 1; }
    local rss
    rss=$(jq -r 'select(.done) | .peak_rss_bytes | map(tostring) | join(" ")' "$dir/run/metrics.jsonl")
    [ -n "$rss" ] || { echo "FAIL: ($name): no peak_rss_bytes in the closing record"; return 1; }
    local r=0 bad=0 b
    for b in $rss; do
        awk -v r="$r" -v b="$b" -v w="$want" -v m="$mpi" -v a="$arenas" -v l="$name" -v lim="$RSS_LIMIT_MIB" 'BEGIN {
            d = (b - w) / 1048576
            printf "(tp,pp,dp,zero)=(%s) rank %d: VmHWM %.1f MiB, plan %.1f MiB (arenas %.1f + MPI %.1f): VmHWM - plan %+.1f MiB%s\n",
                   l, r, b / 1048576, w / 1048576, a / 1048576, m / 1048576, d, (d > lim ? "  > " lim " MiB" : "")
            exit (d > lim) }' || bad=1
        r=$((r + 1))
    done
    [ "$r" -eq $((tp * pp * dp * cp)) ] || { echo "FAIL: ($name): $r ranks in peak_rss_bytes"; return 1; }
    return $bad
}
