#!/usr/bin/env bash
# train_watchdog_named.sh: a rank stopped with SIGSTOP mid-training is named
# (docs/design.md §8, heartbeats): every other rank's watchdog ends the job
# (exit 1 within a bound) with a message that names "rank K" and its host
# (read from K's heartbeat file in <run_dir>/heartbeat, which a stopped
# process stops rewriting), and the stopped rank, once Open MPI continues it
# (SIGCONT before its kill), blames itself, not its peers.
#   (a) the CPU build ($BUILD/trident), dp = 3 on 3 ranks, rank 1 stopped;
#   (b) the emulated CUDA build ($BUILD-emu/trident, made here by `make EMU=1`
#       as cuda_emulated.sh does; system.device = cuda), dp = 2, rank 1 stopped.
# ONLY_CPU=1 runs (a) alone (to repeat it when checking for races).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
host=$(hostname)

# stop_one NAME TRIDENT NP VICTIM [overrides...]: trains on NP ranks, SIGSTOPs
# world rank VICTIM once step 2 is logged, checks the exit, the time and
# every rank's message. Returns 0 when all held.
stop_one() {
    local name=$1 bin=$2 np=$3 victim_rank=$4; shift 4
    local run="$tmp/$name" log="$tmp/$name.log" rc=0 bad=0
    ( rc=0
      timeout 90 "${MPIRUN[@]}" -np "$np" "$bin" train "$SMALL_INI" data.path="$tmp/shards" parallel.dp="$np" \
          train.global_batch_size=$((4 * np)) train.steps=1000000 train.eval_every=0 system.watchdog_s=2 \
          log.run_dir="$run" "$@" > "$log" 2>&1 || rc=$?
      echo "$rc" > "$run.rc" ) &
    for _ in $(seq 1 300); do metrics_at_least "$run" 2 && break; sleep 0.1; done
    metrics_at_least "$run" 2 || { wait; tail -5 "$log"; echo "FAIL ($name): training did not start"; return 1; }
    # The process of world rank VICTIM: its environment holds Open MPI's rank.
    local pid victim=""
    for pid in $(pgrep -f "train .*$run" || true); do
        if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim_rank"; then
            victim=$pid
        fi
    done
    [ -n "$victim" ] || { wait; echo "FAIL ($name): no process of rank $victim_rank"; return 1; }
    local start; start=$(date +%s%N)
    kill -STOP "$victim"
    wait
    local secs; secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b - a) / 1e9}')
    [ "$(cat "$run.rc")" = 1 ] || { echo "FAIL ($name): exit $(cat "$run.rc"), expected 1"; bad=1; }
    # watchdog_s = 2, the first step's allowance is long past: a peer fires
    # about 3 s after the stop (1 s of peer grace), reads the heartbeats for
    # ~1 s and lingers 1.5 s after its message: ~6 s seen.
    awk -v s="$secs" 'BEGIN{exit !(s <= 12)}' || { echo "FAIL ($name): ended $secs s after the stop"; bad=1; }
    local r
    for r in $(seq 0 $((np - 1))); do
        [ "$r" = "$victim_rank" ] && continue
        grep -aEq "^trident: \[rank $r, host [^]]+\] watchdog: .*rank $victim_rank \(host $host, pid $victim\) .*stopped" "$log" ||
            { echo "FAIL ($name): rank $r printed no watchdog message naming rank $victim_rank, host $host, pid $victim as stopped"; bad=1; }
    done
    # The stopped rank, continued, does not blame its peers; if it printed
    # anything, it names its own stop.
    if grep -aq "^trident: \[rank $victim_rank, host [^]]*\] watchdog:" "$log"; then
        grep -aEq "^trident: \[rank $victim_rank, host [^]]+\] watchdog: this process was stopped" "$log" &&
            ! grep -aq "^trident: \[rank $victim_rank, host .*waiting on peer" "$log" ||
            { echo "FAIL ($name): the stopped rank's message does not name its own stop"; bad=1; }
        stopped_said="the stopped rank said so"
    else
        stopped_said="the stopped rank was killed before printing"
    fi
    mpi_no_leftovers "$run" || { echo "FAIL ($name): processes left"; bad=1; }
    grep -a "watchdog:" "$log" || true
    [ "$bad" = 0 ] && echo "ok ($name): ended $secs s after the stop; $stopped_said"
    [ "$bad" = 0 ] || { echo "--- the run's last lines:"; tail -n 25 "$log"
                        echo "--- rank 0's train.log, last lines:"; tail -n 3 "$run/train.log"; }
    return "$bad"
}

fail=0
if [ -n "${ONLY_CPU:-}" ]; then stop_one cpu "$TRIDENT" 3 1; exit; fi
stop_one cpu "$TRIDENT" 3 1 || fail=1
need_emu trident
stop_one emu "$PWD/$EMU_BUILD/trident" 2 1 system.device=cuda || fail=1
exit $fail
