# mpi_env.sh: the mpirun launcher line for single-node runs in a container,
# sourced by tests/e2e/lib/common.sh and scripts/run_default.sh. Defines the
# array MPIRUN (use "${MPIRUN[@]}" -np N PROGRAM ...) and OpenMPI's root
# variables.
#
# Flags (OpenMPI 4.1, checked on a 2-core container):
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
MPIRUN=(mpirun --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader
        --mca btl_vader_single_copy_mechanism none --mca btl_vader_backing_directory "${TMPDIR:-/tmp}"
        --mca orte_base_help_aggregate 0)
