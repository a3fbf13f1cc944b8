// nccl_fault.cpp: the emulated NCCL's fault hook (nccl_fault.h).
#include "nccl_fault.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

enum member_state { MEMBER_OK = 0, MEMBER_FAILED = 1, MEMBER_ABORTED = 2 };

// One member's slot on the board.
struct member {
    std::atomic<int> state;
    int world_rank;
    char host[64];
    char why[256];
};

struct fault_setting {
    bool loaded, enabled;
    long n;    // the Nth operation fails
    int rank;  // -1: every rank
    long issued;
} setting;

void load() {
    if (setting.loaded) return;
    setting.loaded = true;
    setting.rank = -1;
    const char *s = getenv("TRIDENT_FAULT");
    if (!s || strncmp(s, "nccl:", 5)) return;
    char *end;
    setting.n = strtol(s + 5, &end, 10);
    if (end == s + 5 || setting.n < 1) return;
    if (*end == '@') {
        char *r = end + 1;
        setting.rank = (int)strtol(r, &end, 10);
        if (end == r || setting.rank < 0) return;
    }
    if (*end) return;
    setting.enabled = true;
}

int world_rank() {
    int r = -1, init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

} // namespace

struct emu_nccl_fault {
    member *board; // (nranks,) shared
    int rank, nranks;
    size_t bytes;
};

bool emu_nccl_fault_take(char *msg, size_t cap) {
    load();
    if (!setting.enabled) return false;
    long k = ++setting.issued;
    int me = world_rank();
    if (k != setting.n || (setting.rank >= 0 && setting.rank != me)) return false;
    snprintf(msg, cap, "TRIDENT_FAULT=nccl:%ld: NCCL operation %ld of world rank %d failed on its stream "
             "(an injected fault)", setting.n, k, me);
    return true;
}

emu_nccl_fault *emu_nccl_fault_attach(MPI_Comm mpi, int rank, int nranks) {
    load();
    if (!setting.enabled) return nullptr;
    static unsigned made = 0;
    char name[64] = {0};
    if (rank == 0) snprintf(name, sizeof name, "/trident-nccl-emu-%d-%u", (int)getpid(), made++);
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, mpi);
    size_t bytes = sizeof(member) * (size_t)nranks;
    int fd = shm_open(name, rank == 0 ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
    if (fd >= 0 && rank == 0 && ftruncate(fd, (off_t)bytes)) close(fd), fd = -1;
    MPI_Barrier(mpi); // the segment exists at its size before the others open it
    if (rank != 0) fd = shm_open(name, O_RDWR, 0600);
    void *p = fd >= 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd);
    MPI_Barrier(mpi); // every member has mapped it
    if (rank == 0) shm_unlink(name);
    if (p == MAP_FAILED) {
        fprintf(stderr, "nccl_emu: TRIDENT_FAULT=nccl: no shared memory board %s\n", name);
        abort();
    }
    emu_nccl_fault *f = new emu_nccl_fault{(member *)p, rank, nranks, bytes};
    member *me = &f->board[rank];
    me->world_rank = world_rank();
    if (gethostname(me->host, sizeof me->host - 1)) snprintf(me->host, sizeof me->host, "?");
    MPI_Barrier(mpi); // every member's slot is filled in
    return f;
}

void emu_nccl_fault_post(emu_nccl_fault *f, const char *why) {
    if (!f) return;
    member *me = &f->board[f->rank];
    if (me->state.load() != MEMBER_OK) return;
    snprintf(me->why, sizeof me->why, "%s", why);
    me->state.store(MEMBER_FAILED);
}

ncclResult_t emu_nccl_fault_remote(emu_nccl_fault *f, char *msg, size_t cap) {
    if (!f) return ncclSuccess;
    for (int r = 0; r < f->nranks; r++) {
        const member *m = &f->board[r];
        int st = m->state.load();
        if (r == f->rank || st == MEMBER_OK) continue;
        snprintf(msg, cap, "rank %d of the communicator (world rank %d, host %s) %s%s", r,
                 m->world_rank, m->host, st == MEMBER_FAILED ? "failed: " : "aborted its communicator",
                 st == MEMBER_FAILED ? m->why : "");
        return ncclRemoteError;
    }
    return ncclSuccess;
}

bool emu_nccl_fault_abort(emu_nccl_fault *f) {
    if (!f) return false;
    char msg[512];
    bool failed = f->board[f->rank].state.load() == MEMBER_FAILED ||
                  emu_nccl_fault_remote(f, msg, sizeof msg) != ncclSuccess;
    int expected = MEMBER_OK;
    f->board[f->rank].state.compare_exchange_strong(expected, MEMBER_ABORTED);
    return failed;
}

void emu_nccl_fault_detach(emu_nccl_fault *f) {
    if (!f) return;
    munmap(f->board, f->bytes);
    delete f;
}
