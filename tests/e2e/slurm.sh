#!/usr/bin/env bash
# slurm.sh: trident under a real Slurm (issue 14), on a one-node cluster this
# script makes on localhost: munged, slurmctld and slurmd (Debian's packages,
# installed by `make deps`) started as root in the foreground, with a
# slurm.conf, a munge key, spool, state and logs in $tmp and two free ports;
# every daemon it started is stopped by its PID when the script exits.
#  0. First, without daemons (also where the rest skips): dry runs of the job
#     scripts with srun and scontrol stubbed (srun prints its arguments), and
#     what they would launch checked with `trident plan --world-size N`, which
#     applies trident's own layout rule:
#     - jobs/slurm_multinode.sbatch on 2 nodes x 8 (configs/llama-1b.ini on
#       the CPU device) launches a valid 16-rank layout with parallel.cp=2
#       (tp 8 x cp 2 = 16) and without it (dp 2); with pp 2 and cp 2 (32
#       ranks) it stops with exit 2 naming the 16 ranks, before srun;
#     - jobs/slurm_train.sbatch keeps the config's [checkpoint] dir under a
#       header with an inline comment (`[checkpoint]   # ...`) and a value with
#       one, and dir = none (no checkpoint.dir= added), and adds its default
#       folder to a config without one;
#     - every mpirun/srun line of jobs/mpirun_examples.sh is a valid layout
#       of its -np / --ntasks (the salloc's ranks for those inside it).
#  a. `srun --mpi=pmix --ntasks=2` of a 20-step run: exit 0, steps 1..20 in
#     metrics.jsonl with two ranks' time split each, and 1 OpenMP thread per
#     rank (2 ranks on 2 CPUs: the start record's `threads`, or the banner's
#     "threads per rank" line before the run folder keeps a start record).
#  b. `sbatch jobs/slurm_train.sbatch`, submitted from another folder, with a
#     1-minute limit and --signal=USR1@50 (Slurm checks limits every 30 s: the
#     signal comes 10-40 s after the start), on a run of at least 45 s of
#     compute (steps: 45 s / (a)'s fastest step, so still running at 40 s
#     even were every step that fast; the steps left after the signal all
#     run before the job completes, so more is only waiting): the time-limit signal
#     reaches the ranks, they save and exit 3, the script requeues the job,
#     the next start resumes.
#  c. then, on the resumed job (its limit raised so no time-limit signal comes
#     again), `scancel --signal=USR1 --batch`: the batch shell forwards it to
#     the step, which saves and exits 3, and the job requeues again (not FAILED).
#  The job ends COMPLETED with Restarts >= 2 (scontrol show job; no slurmdbd),
#  its checkpoint folder (the script's default, per job name) verifies and
#  holds the last step, and log.run_dir/metrics.jsonl holds every step
#  1..last exactly once (appended across starts).
#  d. a plain `scancel` of a running job: the ranks save on its SIGTERM, and
#     the script does not requeue (the job ends CANCELLED, Restarts=0).
# Skips (exit 77, the reason printed) when the daemons cannot run here: not
# root, fewer than 2 CPUs, or a daemon that does not come up (its log shown).
# Every wait is bounded; the whole test takes about 2-3 minutes.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"

# ---- 0. dry runs of the job scripts ------------------------------------------------
stub=$tmp/stub
mkdir -p "$stub" "$tmp/submit"
printf '#!/bin/sh\necho "SRUN: $*"\n' > "$stub/srun"
printf '#!/bin/sh\n' > "$stub/scontrol" # no job: the scripts fall back to their own paths
chmod +x "$stub/srun" "$stub/scontrol"
# dry NODES PER_NODE SCRIPT ARGS...: the job script with the stubs, from
# $tmp/submit; its output in $tmp/dry.out, the `trident train` arguments it
# would launch (none: empty) in $tmp/dry.args; returns its exit status.
dry() {
    local nodes=$1 per=$2 script=$PWD/$3 rc=0; shift 3
    (cd "$tmp/submit" && env PATH="$stub:$PATH" TRIDENT="$TRIDENT" TRIDENT_JOBS_DIR="$OLDPWD/jobs" \
        SLURM_SUBMIT_DIR="$tmp/submit" SLURM_JOB_NAME=dry SLURM_JOB_NUM_NODES="$nodes" \
        SLURM_NTASKS_PER_NODE="$per" SLURM_NTASKS=$((nodes * per)) bash "$script" "$@") > "$tmp/dry.out" 2>&1 ||
        rc=$?
    sed -n 's/^SRUN: .* train //p' "$tmp/dry.out" > "$tmp/dry.args"
    return $rc
}
# plan_ok N ARGS...: trident's layout rule accepts ARGS (a config and its
# overrides) on N ranks; the plan's first line in $tmp/plan.out.
plan_ok() {
    local n=$1; shift
    "$TRIDENT" plan "$@" --world-size "$n" > "$tmp/plan.out" 2>&1
}
ini1b=$PWD/configs/llama-1b.ini
for extra in "parallel.cp=2" ""; do
    dry 2 8 jobs/slurm_multinode.sbatch "$ini1b" system.device=cpu $extra ||
        { cat "$tmp/dry.out"; fail "0. multinode 2 x 8 ${extra:-(no cp)}: exit non-zero"; }
    [ -s "$tmp/dry.args" ] || { cat "$tmp/dry.out"; fail "0. multinode ${extra:-(no cp)}: nothing launched"; }
    plan_ok 16 $(cat "$tmp/dry.args") || { cat "$tmp/dry.out" "$tmp/plan.out"; fail "0. multinode 2 x 8 ${extra:-(no cp)} launches a layout that is not 16 ranks"; }
    cp=1; [ -z "$extra" ] || cp=2
    head -n 1 "$tmp/plan.out" | grep -q "tp 8 x cp $cp x .* = 16 ranks" ||
        fail "0. multinode ${extra:-(no cp)}: $(head -n 1 "$tmp/plan.out")"
    echo "0. slurm_multinode.sbatch 2 x 8 ${extra:-(no cp)}: $(head -n 1 "$tmp/plan.out" | cut -d, -f2)"
done
rc=0; dry 2 8 jobs/slurm_multinode.sbatch "$ini1b" system.device=cpu parallel.cp=2 parallel.pp=2 || rc=$?
[ "$rc" -eq 2 ] && [ ! -s "$tmp/dry.args" ] && grep -q "16 ranks" "$tmp/dry.out" ||
    { cat "$tmp/dry.out"; fail "0. multinode 2 x 8 with tp 8 x cp 2 x pp 2: exit $rc, want 2 before srun naming 16 ranks"; }
echo "0. slurm_multinode.sbatch 2 x 8, tp 8 x cp 2 x pp 2: exit 2 before srun: $(grep -m1 -o 'world size is .*ranks' "$tmp/dry.out" || grep -m1 trident: "$tmp/dry.out" | cut -c1-120)"
# [checkpoint] dir as trident reads it (a header with an inline comment).
sed 's/^\[log\]$/[checkpoint]   # where checkpoints go\ndir = MINE  # inline comment\n\n[log]/' \
    "$SMALL_INI" > "$tmp/ckdir.ini"
grep -q '^\[checkpoint\]   # where' "$tmp/ckdir.ini" || fail "0. could not make the [checkpoint] config"
for v in "$tmp/mine" none; do
    sed "s|MINE|$v|" "$tmp/ckdir.ini" > "$tmp/ck-$(basename "$v").ini"
    "$TRIDENT" train --print-config "$tmp/ck-$(basename "$v").ini" > "$tmp/printed.ini" &&
        grep -Eq "^# dir = \\(unset\\), # $tmp/ck-$(basename "$v").ini:|^dir = $v    # " "$tmp/printed.ini" ||
        fail "0. trident does not read [checkpoint] dir = $v of $tmp/ck-$(basename "$v").ini"
    dry 1 1 jobs/slurm_train.sbatch "$tmp/ck-$(basename "$v").ini" data.path="$tmp/none" ||
        { cat "$tmp/dry.out"; fail "0. slurm_train.sbatch, [checkpoint] dir = $v: exit non-zero"; }
    [ -s "$tmp/dry.args" ] && ! grep -q "checkpoint.dir=" "$tmp/dry.args" ||
        { cat "$tmp/dry.out"; fail "0. slurm_train.sbatch overrode the config's [checkpoint] dir = $v: $(cat "$tmp/dry.args")"; }
done
dry 1 1 jobs/slurm_train.sbatch "$PWD/$SMALL_INI" data.path="$tmp/none" ||
    { cat "$tmp/dry.out"; fail "0. slurm_train.sbatch of small.ini: exit non-zero"; }
grep -q "checkpoint.dir=$tmp/submit/runs/dry/checkpoints " "$tmp/dry.args" ||
    { cat "$tmp/dry.out"; fail "0. slurm_train.sbatch did not add its checkpoint folder: $(cat "$tmp/dry.args")"; }
echo "0. slurm_train.sbatch: [checkpoint] dir of the config kept (a header with a comment; none), added where unset"
# Every launch line of mpirun_examples.sh (continuations joined).
alloc=$(bash jobs/mpirun_examples.sh | sed -n 's/^salloc .*--nodes=\([0-9]*\) --ntasks-per-node=\([0-9]*\).*/\1 \2/p')
alloc=$(( ${alloc% *} * ${alloc#* } ))
n_lines=0
while read -r line; do
    n=$(grep -oE '(-np |--ntasks=)[0-9]+' <<<"$line" | grep -oE '[0-9]+$' || true)
    plan_ok "${n:-$alloc}" ${line#* build/trident train } ||
        { cat "$tmp/plan.out"; fail "0. mpirun_examples.sh: not a layout of ${n:-$alloc} ranks: $line"; }
    n_lines=$((n_lines + 1))
done < <(bash jobs/mpirun_examples.sh | sed -e ':a' -e '/\\$/{N; s/\\\n *//; ba}' | grep -E '^(mpirun|srun) ')
[ "$n_lines" -ge 12 ] || fail "0. mpirun_examples.sh: only $n_lines launch lines found"
grep -q "parallel.cp=2" <(bash jobs/mpirun_examples.sh) && grep -q "parallel.zero_stage=3" <(bash jobs/mpirun_examples.sh) ||
    fail "0. mpirun_examples.sh has no cp or no ZeRO-3 example"
echo "0. mpirun_examples.sh: $n_lines launch lines, each a valid layout of its ranks (salloc's: $alloc)"

[ "$(id -u)" -eq 0 ] || skip "not root: slurmd and a private munged need root here"
PATH=$PATH:/usr/sbin:/sbin # the daemons' folder, not on every PATH
for c in munged mungekey slurmctld slurmd srun sbatch scontrol scancel squeue; do
    command -v "$c" >/dev/null || fail "$c not installed: run make deps (slurmctld slurmd slurm-client munge)"
done
ncpu=$(nproc)
t0=$(date +%s)
[ "$ncpu" -ge 2 ] || skip "$ncpu CPU: the cases run 2 tasks on one node"
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
       OMPI_MCA_btl_vader_backing_directory="${TMPDIR:-/tmp}"

# ---- the cluster ---------------------------------------------------------------
sl=$tmp/slurm
mkdir -p "$sl/state" "$sl/spool" "$sl/log" "$sl/munge" "$tmp/submit"
chmod 755 "$tmp" "$sl" "$sl/munge"
pids=()
stop_cluster() {
    local p
    if [ -n "${SLURM_CONF:-}" ] && [ ${#pids[@]} -gt 0 ]; then
        scancel --quiet --full --signal=KILL --user=root >/dev/null 2>&1 || true
        for _ in $(seq 1 20); do
            [ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 1 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap stop_cluster EXIT

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
ctld_port=$(free_port) d_port=$(free_port)
[ "$ctld_port" != "$d_port" ] || d_port=$(free_port)
export SLURM_CONF=$sl/slurm.conf
write_conf() { # TASK_PLUGIN
    cat > "$SLURM_CONF" <<EOF
ClusterName=trident-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sl/munge/socket,cred_expire=5
MailProg=/bin/true
StateSaveLocation=$sl/state
SlurmdSpoolDir=$sl/spool
SlurmctldPidFile=$sl/slurmctld.pid
SlurmdPidFile=$sl/slurmd.pid
SlurmctldLogFile=$sl/log/slurmctld.log
SlurmdLogFile=$sl/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=$1
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
MinJobAge=300
KillWait=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$ncpu RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}
# wait_for SECONDS WHAT CMD...: polls CMD every 0.5 s; false after SECONDS.
wait_for() {
    local secs=$1 end; shift 2
    end=$(( $(date +%s) + secs ))
    while [ "$(date +%s)" -lt "$end" ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    return 1
}
node_idle() { sinfo -h -N -o %t | grep -qx idle; }
log_tail() { local f; for f in "$sl"/log/*; do echo "--- $f"; tail -n 8 "$f"; done; }

mungekey -c -k "$sl/munge/munge.key" || skip "mungekey cannot make a key"
munged -F --force --socket="$sl/munge/socket" --key-file="$sl/munge/munge.key" --pid-file="$sl/munged.pid" \
    --seed-file="$sl/munge/seed" --log-file="$sl/log/munged.log" >"$sl/log/munged.out" 2>&1 &
pids+=($!)
wait_for 10 munge sh -c "munge -S '$sl/munge/socket' -n | unmunge -S '$sl/munge/socket'" ||
    { log_tail; skip "munged refuses to run here (log above)"; }
up=
for plugin in task/affinity task/none; do
    write_conf "$plugin"
    slurmctld -D -i -f "$SLURM_CONF" >"$sl/log/slurmctld.out" 2>&1 &
    ctld=$!
    slurmd -D -f "$SLURM_CONF" >"$sl/log/slurmd.out" 2>&1 &
    d=$!
    pids+=("$ctld" "$d")
    # the node idle, or a daemon gone (no use waiting)
    idle_or_dead() { node_idle || ! kill -0 "$ctld" 2>/dev/null || ! kill -0 "$d" 2>/dev/null; }
    if wait_for 30 "node idle" idle_or_dead && node_idle; then up=$plugin; break; fi
    log_tail
    echo "slurm: the daemons did not come up with TaskPlugin=$plugin"
    kill -TERM "$d" "$ctld" 2>/dev/null || true
    wait "$d" "$ctld" 2>/dev/null || true
done
[ -n "$up" ] || skip "slurmctld/slurmd do not come up on this machine (ports $ctld_port, $d_port; logs above)"
srun --mpi=list 2>&1 | grep -q pmix || fail "this Slurm has no pmix MPI plugin (srun --mpi=list)"
echo "slurm: one node $host, $ncpu CPUs, TaskPlugin=$up, ports $ctld_port/$d_port"

small_dataset "$tmp"
common=(data.path="$tmp/shards" parallel.dp=2 train.global_batch_size=64 train.eval_every=0
        system.threads=0 log.every=1 checkpoint.every=0)

# ---- a. srun ------------------------------------------------------------------
rc=0
timeout 120 srun --mpi=pmix --ntasks=2 --label "$TRIDENT" train "$SMALL_INI" "${common[@]}" train.steps=20 \
    log.run_dir="$tmp/run-a" > "$tmp/a.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -n 30 "$tmp/a.log"; fail "a: srun --mpi=pmix --ntasks=2 exited $rc"; }
[ "$(metrics "$tmp/run-a" .step | tr '\n' ' ')" = "$(seq -s ' ' 1 20) " ] || fail "a: metrics steps are not 1..20"
[ "$(metrics "$tmp/run-a" '.compute_s | length' | sort -u)" = 2 ] || fail "a: a step without two ranks' split"
threads=$(jq -c 'select(.event == "start") | .threads' "$tmp/run-a/metrics.jsonl" | tail -n 1)
if [ -n "$threads" ]; then
    [ "$threads" = "[1,1]" ] || fail "a: threads per rank $threads, want [1,1] (2 ranks on 2 CPUs)"
else # before the run folder's start record: rank 0's banner
    grep -q '^0: threads per rank: 1 (' "$tmp/a.log" ||
        fail "a: rank 0 does not print 'threads per rank: 1': $(grep 'threads per rank' "$tmp/a.log")"
    threads="[1,1] (banner: $(grep -o 'threads per rank: .*' "$tmp/a.log"))"
fi
# The fastest step: the job's steps take at least that long.
step_s=$(metrics "$tmp/run-a" .step_time_s | sort -g | head -n 1)
echo "a: srun --mpi=pmix --ntasks=2: 20 steps, 2 ranks, threads $threads, fastest step $step_s s"

# ---- b, c. sbatch: the time limit, then a signal to the batch shell --------------
steps=$(awk -v s="$step_s" 'BEGIN { n = int(45 / s); print n < 300 ? 300 : n }')
[ "$BUILD" = build ] || export TRIDENT # the script finds build/trident by its own path
cd "$tmp/submit"
job=$(sbatch --parsable --job-name=trident-b --time=1 --signal=USR1@50 --output="$tmp/job.out" \
    "$OLDPWD/jobs/slurm_train.sbatch" "$OLDPWD/$SMALL_INI" "${common[@]}" train.steps="$steps" \
    log.run_dir="$tmp/run-b") || fail "b: sbatch refused the job"
cd "$OLDPWD"
ck=$tmp/submit/runs/trident-b/checkpoints out=$tmp/job.out
start=$(date +%s)
field() { scontrol show job "$job" -o 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
restarts_at_least() { # true when Restarts >= $1; fails the test when the job ended before
    [ "$(field Restarts)" -ge "$1" ] 2>/dev/null && return 0
    case $(field JobState) in COMPLETED|FAILED|CANCELLED|TIMEOUT) echo ended > "$tmp/ended"; return 0 ;; esac
    return 1
}
running_past() { # running again with metrics past step $1
    [ "$(field JobState)" = RUNNING ] && metrics_at_least "$tmp/run-b" $(( $1 + 3 ))
}
saved_step() { sed -n 's/^step-0*//p' "$ck/latest" 2>/dev/null; } # latest: "step-000100"
show() {
    echo "--- scontrol show job $job"; scontrol show job "$job"
    echo "--- job output"; grep -v '^step ' "$out" | tail -n 40
    echo "--- slurmctld log"; tail -n 20 "$sl/log/slurmctld.log"
}
echo "b: job $job: $steps steps (>= 45 s at $step_s s/step), --time=1 --signal=USR1@50"

wait_for 150 "the time-limit requeue" restarts_at_least 1 && [ ! -e "$tmp/ended" ] ||
    { show; fail "b: no requeue after the time-limit signal (job $(field JobState) after $(( $(date +%s) - start )) s)"; }
first=$(saved_step)
[ -n "$first" ] && [ "$first" -lt "$steps" ] || { show; fail "b: no checkpoint saved before the first requeue"; }
echo "b: requeued after $(( $(date +%s) - start )) s, checkpoint of step $first"
# No second time-limit signal: c's requeue must come from scancel alone.
scontrol update JobId="$job" TimeLimit=15 || fail "c: scontrol update TimeLimit"
wait_for 90 "the resumed run" running_past "$first" || { show; fail "b: the requeued job did not resume"; }
scancel --signal=USR1 --batch "$job" || fail "c: scancel --signal=USR1 --batch"
wait_for 60 "the signalled requeue" restarts_at_least 2 && [ ! -e "$tmp/ended" ] ||
    { show; fail "c: no requeue after scancel --signal=USR1 --batch (job $(field JobState))"; }
second=$(saved_step)
[ -n "$second" ] && [ "$second" -gt "$first" ] || { show; fail "c: no new checkpoint after step $first"; }
echo "c: scancel --signal=USR1 --batch: saved at step $second, requeued after $(( $(date +%s) - start )) s"
done_job() { case $(field JobState) in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) true ;; *) false ;; esac; }
wait_for 360 "the end of the job" done_job || { show; fail "b: job $job still $(field JobState) after 6 minutes"; }
state=$(field JobState) restarts=$(field Restarts)
echo "b: job $job $state, Restarts=$restarts, $(( $(date +%s) - start )) s"
[ "$state" = COMPLETED ] || { show; fail "b: job ended $state, want COMPLETED"; }
[ "$restarts" -ge 2 ] || fail "b: Restarts=$restarts, want >= 2"
grep -q 'forwarded to the job step' "$tmp/job.out" || fail "c: the batch shell did not forward SIGUSR1"
"$TRIDENT" ckpt verify "$ck" > "$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log"; fail "b: ckpt verify $ck"; }
[ "$(saved_step)" = "$steps" ] || fail "b: the last checkpoint is step $(saved_step), want $steps"
got=$(metrics "$tmp/run-b" .step | sort -n | uniq -c | awk '$1 != 1 { print "step " $2 " x" $1 }' | head -n 5)
[ -z "$got" ] || fail "b: metrics.jsonl repeats steps: $got"
[ "$(metrics "$tmp/run-b" .step | sort -n | tr '\n' ' ')" = "$(seq -s ' ' 1 "$steps") " ] ||
    fail "b: metrics.jsonl does not hold steps 1..$steps once each ($(metrics "$tmp/run-b" .step | wc -l) step lines, first $(metrics "$tmp/run-b" .step | head -n 1))"
# ---- d. a plain scancel ends the job: the ranks save (SIGTERM), no requeue ----
cd "$tmp/submit"
job=$(sbatch --parsable --job-name=trident-d --output="$tmp/job-d.out" "$OLDPWD/jobs/slurm_train.sbatch" \
    "$OLDPWD/$SMALL_INI" "${common[@]}" train.steps=100000 log.run_dir="$tmp/run-d") || fail "d: sbatch refused the job"
cd "$OLDPWD"
ck=$tmp/submit/runs/trident-d/checkpoints out=$tmp/job-d.out
wait_for 60 "job d running" metrics_at_least "$tmp/run-d" 3 || { show; fail "d: job $job did not start"; }
scancel "$job" || fail "d: scancel"
wait_for 60 "job d ended" done_job || { show; fail "d: job $job still $(field JobState) a minute after scancel"; }
sleep 2 # a requeue, were there one, would show by now
state=$(field JobState) restarts=$(field Restarts)
[ "$state" = CANCELLED ] && [ "$restarts" = 0 ] || { show; fail "d: after scancel job $job is $state, Restarts=$restarts"; }
[ -n "$(saved_step)" ] || fail "d: no checkpoint saved on scancel's SIGTERM"
echo "d: scancel: job $job CANCELLED, Restarts=0, checkpoint of step $(saved_step)"
echo "slurm: ok, $(( $(date +%s) - t0 )) s"
