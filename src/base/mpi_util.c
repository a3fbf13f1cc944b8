// mpi_util.c: MPI error checks and whole-job exits.
#include "mpi_util.h"

#include <unistd.h>

int mpi_is_running(void) {
    int init = 0, fini = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    return init && !fini;
}

_Noreturn void mpi_fail(int rc, const char *call, const char *file, int line) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    fatal_exit(STATUS_RUNTIME, file, line, "%s failed: %s", call, text);
}

void mpi_abort_on_fatal(int code) {
    if (!mpi_is_running()) return;
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, code);
}

enum status mpi_util_start(int *argc, char ***argv, struct error *err) {
#ifdef TRIDENT_CUDA_EMU
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE)
        return error_set(err, STATUS_RUNTIME, "the emulated CUDA build needs MPI_THREAD_MULTIPLE (its NCCL "
                         "runs MPI on stream threads); this MPI provides level %d", provided);
#else
    (void)err;
    MPI_Init(argc, argv);
#endif
    return STATUS_OK;
}

void mpi_util_init(MPI_Comm world) {
    int rank = 0;
    CHECK_MPI(MPI_Comm_rank(world, &rank));
    g_log_rank = rank;
    // Communicators created from world inherit its handler.
    CHECK_MPI(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
    if (world != MPI_COMM_WORLD) CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    fatal_set_hook(mpi_abort_on_fatal);
}

_Noreturn void mpi_exit_all(int code, const char *msg) {
    if (msg) {
        if (g_log_rank >= 0) fprintf(stderr, "trident: [rank %d] %s\n", g_log_rank, msg);
        else fprintf(stderr, "trident: %s\n", msg);
    }
    fflush(NULL);
    if (mpi_is_running()) {
        int size = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (size == 1) {
            MPI_Finalize();
            exit(code);
        }
        // The reporting rank lets mpirun forward its message before the kill;
        // the silent ones leave it time to abort first.
        if (msg) usleep(100 * 1000);
        else sleep(1);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    exit(code);
}
