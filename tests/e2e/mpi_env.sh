# mpi_env.sh: sourced (not run) by e2e tests that launch ranks. Defines
# MPIRUN, the launcher line for single-node runs in a container, and helpers.
# run.sh also runs it directly: then it checks that mpirun accepts these
# flags and starts 2 ranks.
#
# Flags (OpenMPI 4.1, checked on this 2-core container):
#   --oversubscribe            more ranks than cores (8 ranks on 2 cores)
#   --bind-to none             oversubscribed ranks must not be pinned
#   --mca pml ob1 --mca btl self,vader
#                              shared memory only: no UCX, openib or TCP
#                              probing (warnings, slow start without a NIC)
#   --mca btl_vader_single_copy_mechanism none
#                              CMA (process_vm_readv) needs ptrace rights a
#                              container may deny; large messages then fail
#   --mca btl_vader_backing_directory $TMPDIR
#                              not /dev/shm, which is 64 MB in default Docker
#   --mca orte_base_help_aggregate 0
#                              fewer "ORTE_ERROR_LOG: Data unpack would read
#                              past end of buffer ... show_help.c" lines after
#                              MPI_Abort (OpenMPI's help-message forwarding,
#                              open-mpi/ompi#8356; harmless, still seen at times)
# Exit codes: after MPI_Abort(MPI_COMM_WORLD, c) on any rank, mpirun kills
# every rank and exits with c (2 for bad input, 1 for a fatal check); checked
# by tests/e2e/comm_mpi.sh.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader \
 --mca btl_vader_single_copy_mechanism none --mca btl_vader_backing_directory ${TMPDIR:-/tmp} \
 --mca orte_base_help_aggregate 0"

# Exits 77 (skipped) when there is no mpirun.
mpi_require() {
    command -v mpirun >/dev/null 2>&1 || { echo "skipped: no mpirun on PATH"; exit 77; }
}

# Prints the live processes (zombies excluded) whose command line holds $1;
# returns 0 when there are none. Waits up to 3 s for mpirun's cleanup.
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

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    mpi_require
    echo "MPIRUN=$MPIRUN"
    out=$(timeout 30 $MPIRUN -np 2 echo rank-up 2>&1); rc=$?
    echo "$out"
    [ "$rc" -eq 0 ] && [ "$(grep -c '^rank-up$' <<<"$out")" -eq 2 ] || { echo "FAIL: mpirun with these flags (exit $rc)"; exit 1; }
fi
