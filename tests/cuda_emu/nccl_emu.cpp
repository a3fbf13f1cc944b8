// nccl_emu.cpp: the emulated NCCL of nccl.h, over MPI on host memory. The
// header's comment describes the semantics and the communicator creation.
#include "nccl.h"

#include <unistd.h>

// The C API only (OpenMPI and MPICH would pull in their deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda_emu.h" // __float2bfloat16_rn, __half: the same conversions as the kernels'
#include "nccl_fault.h"

struct emu_nccl_comm {
    MPI_Comm mpi; // the members in NCCL rank order
    int rank, nranks, device;
    std::atomic<int> async_error{0}; // the first failure of a queued operation (ncclCommGetAsyncError)
    emu_nccl_fault *fault; // TRIDENT_FAULT=nccl:... only (nccl_fault.h)
};

namespace {

constexpr uint32_t ID_MAGIC = 0x4e43454d; // "NCEM"

// The content of an ncclUniqueId.
struct id_content {
    uint32_t magic;
    int32_t root;   // world rank of the ncclGetUniqueId caller
    uint32_t seq;   // its sequence number: tags of the creation handshake
};
static_assert(sizeof(id_content) <= NCCL_UNIQUE_ID_BYTES, "id too large");

uint32_t next_seq = 0;
// Under nccl_lock: last_error, the BF16/FP16 MPI operations, the sends in
// flight (workers of several streams run operations at once). Never destroyed.
std::mutex &nccl_lock = *new std::mutex;
char last_error[512] = "no error";

ncclResult_t failure(ncclResult_t r, const char *fmt, ...) {
    std::lock_guard<std::mutex> lk(nccl_lock);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return r;
}

bool mpi_running() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

// Handshake tags on MPI_COMM_WORLD: 2 * seq (join), 2 * seq + 1 (table), in
// [0, tag_ub]; MPI guarantees tag_ub >= 32767.
int handshake_tag(uint32_t seq, int kind) {
    int *ub = nullptr, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    long period = ((flag && ub ? (long)*ub : 32767L) + 1) & ~1L; // even: kind stays the parity
    return (int)((2L * seq + kind) % period);
}

// ---- reductions -------------------------------------------------------------------

float bf16_to_f32(uint16_t b) {
    __nv_bfloat16 h;
    h.x = b;
    return __bfloat162float(h);
}
uint16_t bf16_from_f32(float f) { return __float2bfloat16_rn(f).x; }
float fp16_to_f32(uint16_t b) {
    __half h;
    h.x = b;
    return __half2float(h);
}
uint16_t fp16_from_f32(float f) { return __float2half_rn(f).x; }

float combine(float a, float b, int op) {
    switch (op) {
    case ncclSum: return a + b;
    case ncclProd: return a * b;
    case ncclMax: return a != a ? a : b != b ? b : a > b ? a : b; // NaN wins
    default: return a != a ? a : b != b ? b : a < b ? a : b;
    }
}

// inout[i] = round16(fp32(in[i]) op fp32(inout[i])): one rounding per combine.
template <float (*to)(uint16_t), uint16_t (*from)(float), int OP>
void half_op(void *in, void *inout, int *len, MPI_Datatype *) {
    const uint16_t *a = (const uint16_t *)in;
    uint16_t *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) b[i] = from(combine(to(a[i]), to(b[i]), OP));
}

// The MPI operations for BF16 and FP16, made on first use (commutative).
MPI_Op half_ops[2][4] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                         {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
MPI_User_function *const half_fns[2][4] = {
    {half_op<bf16_to_f32, bf16_from_f32, ncclSum>, half_op<bf16_to_f32, bf16_from_f32, ncclProd>,
     half_op<bf16_to_f32, bf16_from_f32, ncclMax>, half_op<bf16_to_f32, bf16_from_f32, ncclMin>},
    {half_op<fp16_to_f32, fp16_from_f32, ncclSum>, half_op<fp16_to_f32, fp16_from_f32, ncclProd>,
     half_op<fp16_to_f32, fp16_from_f32, ncclMax>, half_op<fp16_to_f32, fp16_from_f32, ncclMin>},
};

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat16: case ncclBfloat16: return MPI_UINT16_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

ncclResult_t mpi_op(ncclRedOp_t op, ncclDataType_t t, MPI_Op *out) {
    if ((int)op < 0 || op > ncclMin)
        return failure(ncclInvalidArgument, "reduction op %d is not emulated (sum, prod, max, min)", (int)op);
    if (t == ncclFloat16 || t == ncclBfloat16) {
        int k = t == ncclBfloat16 ? 0 : 1;
        std::lock_guard<std::mutex> lk(nccl_lock);
        if (half_ops[k][op] == MPI_OP_NULL && MPI_Op_create(half_fns[k][op], 1, &half_ops[k][op]) != MPI_SUCCESS)
            return ncclSystemError; // (failure() takes nccl_lock)
        *out = half_ops[k][op];
        return ncclSuccess;
    }
    static const MPI_Op builtin[4] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
    *out = builtin[op];
    return ncclSuccess;
}

// MPI counts are int: larger operations go in pieces (elementwise ones only).
constexpr size_t MAX_PIECE = (size_t)1 << 30;

ncclResult_t check_mpi(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return ncclSuccess;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return failure(ncclSystemError, "%s: %s", what, msg);
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        ncclResult_t r_ = (x);                                                                     \
        if (r_ != ncclSuccess) return r_;                                                          \
    } while (0)

ncclResult_t check_args(ncclComm_t comm, ncclDataType_t t) {
    if (!comm) return failure(ncclInvalidArgument, "NULL communicator");
    if (!type_size(t)) return failure(ncclInvalidArgument, "unknown datatype %d", (int)t);
    return ncclSuccess;
}

// ---- the operations, as run at once or at the end of a group -------------------

ncclResult_t do_all_reduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm) {
    MPI_Op mop;
    TRY(mpi_op(op, t, &mop));
    size_t es = type_size(t);
    for (size_t off = 0; off < count; off += MAX_PIECE) {
        int n = (int)std::min(MAX_PIECE, count - off);
        char *r = (char *)recv + off * es;
        const char *s = (const char *)send + off * es;
        TRY(check_mpi(MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, n, mpi_type(t), mop, comm->mpi),
                      "ncclAllReduce (MPI_Allreduce)"));
    }
    return ncclSuccess;
}

ncclResult_t do_reduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                       ncclRedOp_t op, int root, ncclComm_t comm) {
    MPI_Op mop;
    TRY(mpi_op(op, t, &mop));
    size_t es = type_size(t);
    for (size_t off = 0; off < count; off += MAX_PIECE) {
        int n = (int)std::min(MAX_PIECE, count - off);
        char *r = (char *)recv + off * es;
        const char *s = (const char *)send + off * es;
        bool inplace = comm->rank == root && s == r;
        TRY(check_mpi(MPI_Reduce(inplace ? MPI_IN_PLACE : s, r, n, mpi_type(t), mop, root, comm->mpi),
                      "ncclReduce (MPI_Reduce)"));
    }
    return ncclSuccess;
}

ncclResult_t do_reduce_scatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm) {
    MPI_Op mop;
    TRY(mpi_op(op, t, &mop));
    if (count > (size_t)INT32_MAX)
        return failure(ncclInvalidArgument, "ncclReduceScatter: %zu elements per rank (emulation: < 2^31)", count);
    size_t es = type_size(t), bytes = count * es;
    const char *s = (const char *)send;
    char *r = (char *)recv;
    // recv inside send (in place: recv == send + rank * count): reduce into a copy.
    bool overlap = r < s + bytes * comm->nranks && s < r + bytes;
    std::vector<char> tmp(overlap ? bytes : 0);
    TRY(check_mpi(MPI_Reduce_scatter_block(s, overlap ? tmp.data() : r, (int)count, mpi_type(t), mop,
                                           comm->mpi),
                  "ncclReduceScatter (MPI_Reduce_scatter_block)"));
    if (overlap && bytes) memcpy(r, tmp.data(), bytes);
    return ncclSuccess;
}

ncclResult_t do_all_gather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm) {
    if (count > (size_t)INT32_MAX)
        return failure(ncclInvalidArgument, "ncclAllGather: %zu elements per rank (emulation: < 2^31)", count);
    size_t es = type_size(t);
    const char *own = (const char *)recv + (size_t)comm->rank * count * es;
    TRY(check_mpi(MPI_Allgather(send == own ? MPI_IN_PLACE : send, (int)count, mpi_type(t), recv,
                                (int)count, mpi_type(t), comm->mpi),
                  "ncclAllGather (MPI_Allgather)"));
    return ncclSuccess;
}

ncclResult_t do_broadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                          ncclComm_t comm) {
    size_t es = type_size(t);
    if (comm->rank == root && send != recv && count) memmove(recv, send, count * es);
    for (size_t off = 0; off < count; off += MAX_PIECE) {
        int n = (int)std::min(MAX_PIECE, count - off);
        TRY(check_mpi(MPI_Bcast((char *)recv + off * es, n, mpi_type(t), root, comm->mpi),
                      "ncclBroadcast (MPI_Bcast)"));
    }
    return ncclSuccess;
}

// ---- groups -----------------------------------------------------------------------

enum op_kind { OP_ALL_REDUCE, OP_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_SEND, OP_RECV };

struct pending {
    op_kind kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root_or_peer;
    ncclComm_t comm;
    cudaStream_t stream;
    bool inject; // TRIDENT_FAULT=nccl chose it to fail (nccl_fault.h)
};

// The host's open group (the host thread only). Never destroyed.
int group_depth = 0;
std::vector<pending> &group_ops = *new std::vector<pending>;

// Point-to-point messages use this tag on the communicator's own MPI
// communicator: messages between a pair match in call order (MPI does not
// overtake), as NCCL's do.
constexpr int P2P_TAG = 0;

// Sends in flight: the data was copied, so the caller may reuse its buffer
// at once (as the host of a GPU never waits for a send on the stream).
struct send_in_flight {
    MPI_Request req;
    ncclComm_t comm;
    std::vector<char> copy;
};
std::vector<send_in_flight *> &sends = *new std::vector<send_in_flight *>; // under nccl_lock

// Frees the sends that have completed; with comm, waits for all of comm's.
ncclResult_t progress_sends(ncclComm_t comm) {
    std::unique_lock<std::mutex> lk(nccl_lock);
    ncclResult_t r = ncclSuccess;
    for (size_t i = 0; i < sends.size();) {
        send_in_flight *f = sends[i];
        int done = 0;
        int rc = f->comm == comm ? MPI_Wait(&f->req, MPI_STATUS_IGNORE) : MPI_Test(&f->req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) r = ncclSystemError;
        if (f->comm == comm || done || rc != MPI_SUCCESS) {
            delete f;
            sends[i] = sends.back();
            sends.pop_back();
        } else {
            i++;
        }
    }
    return r;
}

// A buffered send larger than MPI's eager limit needs its sender to call MPI
// before the receiver's side completes. The sender's threads may all be
// waiting elsewhere (its host in cudaStreamSynchronize, its workers idle),
// so while sends are in flight a progress thread tests them every
// millisecond (it sleeps on sends_cv when there are none: no spinning).
std::condition_variable &sends_cv = *new std::condition_variable;
bool progress_started = false; // under nccl_lock

void progress_main() {
    std::unique_lock<std::mutex> lk(nccl_lock);
    for (;;) {
        sends_cv.wait(lk, [] { return !sends.empty(); });
        lk.unlock();
        usleep(1000);
        if (mpi_running()) progress_sends(nullptr);
        lk.lock();
    }
}

ncclResult_t run_group(std::vector<pending> &ops) {
    std::vector<MPI_Request> reqs;
    ncclResult_t r = progress_sends(nullptr);
    for (const pending &p : ops) { // every receive and send of the group is posted first
        if (r != ncclSuccess) break;
        if (p.kind != OP_SEND && p.kind != OP_RECV) continue;
        if (p.count > (size_t)INT32_MAX) {
            r = failure(ncclInvalidArgument, "ncclSend/ncclRecv: %zu elements (emulation: < 2^31)", p.count);
            break;
        }
        if (p.kind == OP_SEND) {
            send_in_flight *f = new send_in_flight;
            f->comm = p.comm;
            f->copy.assign((const char *)p.send, (const char *)p.send + p.count * type_size(p.type));
            int rc = MPI_Isend(f->copy.data(), (int)p.count, mpi_type(p.type), p.root_or_peer, P2P_TAG,
                               p.comm->mpi, &f->req);
            if ((r = check_mpi(rc, "ncclSend (MPI_Isend)")) != ncclSuccess) {
                delete f;
                break;
            }
            std::lock_guard<std::mutex> lk(nccl_lock);
            sends.push_back(f);
            if (!progress_started) {
                progress_started = true;
                std::thread(progress_main).detach();
            }
            sends_cv.notify_one();
            continue;
        }
        MPI_Request q;
        int rc = MPI_Irecv(p.recv, (int)p.count, mpi_type(p.type), p.root_or_peer, P2P_TAG, p.comm->mpi, &q);
        if ((r = check_mpi(rc, "ncclRecv (MPI_Irecv)")) != ncclSuccess) break;
        reqs.push_back(q);
    }
    for (const pending &p : ops) {
        if (r != ncclSuccess) break;
        switch (p.kind) {
        case OP_ALL_REDUCE: r = do_all_reduce(p.send, p.recv, p.count, p.type, p.op, p.comm); break;
        case OP_REDUCE: r = do_reduce(p.send, p.recv, p.count, p.type, p.op, p.root_or_peer, p.comm); break;
        case OP_REDUCE_SCATTER: r = do_reduce_scatter(p.send, p.recv, p.count, p.type, p.op, p.comm); break;
        case OP_ALL_GATHER: r = do_all_gather(p.send, p.recv, p.count, p.type, p.comm); break;
        case OP_BROADCAST: r = do_broadcast(p.send, p.recv, p.count, p.type, p.root_or_peer, p.comm); break;
        case OP_SEND: case OP_RECV: break;
        }
    }
    if (!reqs.empty()) {
        ncclResult_t w = check_mpi(MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE),
                                   "ncclGroupEnd (MPI_Waitall)");
        if (r == ncclSuccess) r = w;
    }
    return r;
}

// What run_group would refuse, found at the call (NCCL checks its arguments
// before it queues anything; the failures that remain come from MPI).
ncclResult_t check_queued(const pending &p) {
    if ((int)p.op < 0 || p.op > ncclMin)
        return failure(ncclInvalidArgument, "reduction op %d is not emulated (sum, prod, max, min)", (int)p.op);
    if ((p.kind == OP_SEND || p.kind == OP_RECV) && p.count > (size_t)INT32_MAX)
        return failure(ncclInvalidArgument, "ncclSend/ncclRecv: %zu elements (emulation: < 2^31)", p.count);
    if ((p.kind == OP_REDUCE_SCATTER || p.kind == OP_ALL_GATHER) && p.count > (size_t)INT32_MAX)
        return failure(ncclInvalidArgument, "ncclReduceScatter/ncclAllGather: %zu elements per rank (emulation: < 2^31)",
                       p.count);
    return ncclSuccess;
}

// The description of the operation TRIDENT_FAULT=nccl:N made fail (one per
// process: nccl_fault.h).
char fault_msg[256];

// Queues ops as one unit on the stream of the first (a group on several
// streams: the others wait for it there and it waits for them, through events).
// A failure on the worker is the communicators' asynchronous error
// (ncclCommGetAsyncError), said once on stderr.
void queue_group(std::vector<pending> ops) {
    cudaStream_t first = ops[0].stream;
    std::vector<cudaStream_t> others;
    for (const pending &p : ops)
        if (p.stream != first && std::find(others.begin(), others.end(), p.stream) == others.end())
            others.push_back(p.stream);
    for (cudaStream_t o : others) { // first waits for the others' work so far
        cudaEvent_t e;
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        cudaEventRecord(e, o);
        cudaStreamWaitEvent(first, e, 0);
        cudaEventDestroy(e);
    }
    emu_enqueue(first, [ops = std::move(ops)]() mutable {
        // A communicator that failed stays failed (NCCL's would have to be
        // aborted): its later operations fail too, never reaching MPI, so
        // they cannot be matched with the peers' next ones.
        bool injected = false, broken = false;
        for (const pending &p : ops) injected |= p.inject, broken |= p.comm->async_error.load() != 0;
        ncclResult_t r = injected ? failure(ncclSystemError, "%s", fault_msg)
                         : broken ? ncclInvalidUsage // ncclGetLastError keeps the first failure's message
                                  : run_group(ops);
        if (r == ncclSuccess) return;
        char msg[512];
        {
            std::lock_guard<std::mutex> lk(nccl_lock);
            snprintf(msg, sizeof msg, "%s", last_error);
        }
        if (!broken) // said once per failure, not for each later operation
            fprintf(stderr, "cuda_emu: an NCCL operation failed on its stream: %s (%s)\n", ncclGetErrorString(r), msg);
        for (const pending &p : ops) {
            int expected = 0;
            p.comm->async_error.compare_exchange_strong(expected, (int)r);
            emu_nccl_fault_post(p.comm->fault, msg); // the peers' ncclRemoteError
        }
    });
    for (cudaStream_t o : others) { // and the others wait for the group
        cudaEvent_t e;
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        cudaEventRecord(e, first);
        cudaStreamWaitEvent(o, e, 0);
        cudaEventDestroy(e);
    }
}

// Records op in the open group, or queues it as a group of its own.
ncclResult_t submit(pending p) {
    TRY(check_queued(p));
    emu_count_collective();
    if (emu_count_only()) return ncclSuccess; // nothing moves (cuda_runtime_api.h)
    p.inject = emu_nccl_fault_take(fault_msg, sizeof fault_msg);
    if (group_depth > 0) {
        group_ops.push_back(p);
        return ncclSuccess;
    }
    queue_group(std::vector<pending>(1, p));
    return ncclSuccess;
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL)";
    case ncclSystemError: return "unhandled system error (emulated NCCL: an MPI call failed, or TRIDENT_FAULT=nccl)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated NCCL)";
    case ncclInProgress: return "NCCL operation in progress (emulated NCCL)";
    default: return "unknown result code (emulated NCCL)";
    }
}

const char *ncclGetLastError(ncclComm_t) { return last_error; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!mpi_running()) return failure(ncclInvalidUsage, "ncclGetUniqueId: the emulated NCCL needs MPI initialised");
    id_content c;
    c.magic = ID_MAGIC;
    MPI_Comm_rank(MPI_COMM_WORLD, &c.root);
    c.seq = next_seq++;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &c, sizeof c);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    *out = nullptr;
    if (!mpi_running()) return failure(ncclInvalidUsage, "ncclCommInitRank: the emulated NCCL needs MPI initialised");
    id_content c;
    memcpy(&c, id.internal, sizeof c);
    int world_rank, world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (c.magic != ID_MAGIC || c.root < 0 || c.root >= world_size)
        return failure(ncclInvalidArgument, "ncclCommInitRank: the id does not come from ncclGetUniqueId");
    if (nranks < 1 || nranks > world_size || rank < 0 || rank >= nranks)
        return failure(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d (world size %d)", rank, nranks, world_size);
    int join = handshake_tag(c.seq, 0), table_tag = handshake_tag(c.seq, 1);
    std::vector<int> table(nranks, -1); // NCCL rank -> world rank
    if (world_rank == c.root) {
        table[rank] = world_rank;
        for (int k = 1; k < nranks; k++) {
            int msg[3]; // rank, world rank, nranks
            TRY(check_mpi(MPI_Recv(msg, 3, MPI_INT, MPI_ANY_SOURCE, join, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                          "ncclCommInitRank (MPI_Recv)"));
            if (msg[2] != nranks || msg[0] < 0 || msg[0] >= nranks || table[msg[0]] != -1)
                return failure(ncclInvalidArgument,
                               "ncclCommInitRank: world rank %d joins as rank %d of %d, the root has %d ranks",
                               msg[1], msg[0], msg[2], nranks);
            table[msg[0]] = msg[1];
        }
        for (int k = 0; k < nranks; k++)
            if (k != rank)
                TRY(check_mpi(MPI_Send(table.data(), nranks, MPI_INT, table[k], table_tag, MPI_COMM_WORLD),
                              "ncclCommInitRank (MPI_Send)"));
    } else {
        int msg[3] = {rank, world_rank, nranks};
        TRY(check_mpi(MPI_Send(msg, 3, MPI_INT, c.root, join, MPI_COMM_WORLD), "ncclCommInitRank (MPI_Send)"));
        TRY(check_mpi(MPI_Recv(table.data(), nranks, MPI_INT, c.root, table_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                      "ncclCommInitRank (MPI_Recv)"));
    }
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, table.data(), &group);
    MPI_Comm mpi;
    int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, join, &mpi);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    TRY(check_mpi(rc, "ncclCommInitRank (MPI_Comm_create_group)"));
    int r;
    MPI_Comm_rank(mpi, &r);
    if (r != rank) return failure(ncclInternalError, "ncclCommInitRank: MPI rank %d, NCCL rank %d", r, rank);
    ncclComm_t comm = new emu_nccl_comm;
    comm->mpi = mpi;
    comm->rank = rank;
    comm->nranks = nranks;
    cudaGetDevice(&comm->device);
    comm->fault = emu_nccl_fault_attach(mpi, rank, nranks);
    *out = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (mpi_running()) {
        progress_sends(comm); // its peers receive them, as they must with NCCL
        MPI_Comm_free(&comm->mpi);
    }
    emu_nccl_fault_detach(comm->fault);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }

// As destroy, without waiting for the communicator's sends (their copies are
// left to MPI: the process is expected to end).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    // A communicator that failed (here or at a peer) may still have a worker
    // blocked in its MPI communicator: left to the exit that follows.
    if (emu_nccl_fault_abort(comm->fault) || comm->async_error.load()) return ncclSuccess;
    std::unique_lock<std::mutex> lk(nccl_lock);
    for (size_t i = 0; i < sends.size();) {
        if (sends[i]->comm == comm) {
            sends[i] = sends.back();
            sends.pop_back();
        } else {
            i++;
        }
    }
    lk.unlock();
    if (mpi_running()) MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    TRY(comm ? ncclSuccess : failure(ncclInvalidArgument, "NULL communicator"));
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    TRY(comm ? ncclSuccess : failure(ncclInvalidArgument, "NULL communicator"));
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    TRY(comm ? ncclSuccess : failure(ncclInvalidArgument, "NULL communicator"));
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    TRY(comm ? ncclSuccess : failure(ncclInvalidArgument, "NULL communicator"));
    *async_error = (ncclResult_t)comm->async_error.load();
    if (*async_error == ncclSuccess) { // a peer's failure (TRIDENT_FAULT=nccl only)
        char msg[400];
        *async_error = emu_nccl_fault_remote(comm->fault, msg, sizeof msg);
        if (*async_error != ncclSuccess) failure(*async_error, "%s", msg);
    }
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    TRY(check_args(comm, t));
    return submit({OP_ALL_REDUCE, send, recv, count, t, op, 0, comm, stream, false});
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    TRY(check_args(comm, t));
    if (root < 0 || root >= comm->nranks) return failure(ncclInvalidArgument, "ncclReduce: root %d", root);
    return submit({OP_REDUCE, send, recv, count, t, op, root, comm, stream, false});
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    TRY(check_args(comm, t));
    return submit({OP_REDUCE_SCATTER, send, recv, count, t, op, 0, comm, stream, false});
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t stream) {
    TRY(check_args(comm, t));
    return submit({OP_ALL_GATHER, send, recv, count, t, ncclSum, 0, comm, stream, false});
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    TRY(check_args(comm, t));
    if (root < 0 || root >= comm->nranks) return failure(ncclInvalidArgument, "ncclBroadcast: root %d", root);
    return submit({OP_BROADCAST, send, recv, count, t, ncclSum, root, comm, stream, false});
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    TRY(check_args(comm, t));
    if (peer < 0 || peer >= comm->nranks) return failure(ncclInvalidArgument, "ncclSend: peer %d", peer);
    return submit({OP_SEND, send, nullptr, count, t, ncclSum, peer, comm, stream, false});
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    TRY(check_args(comm, t));
    if (peer < 0 || peer >= comm->nranks) return failure(ncclInvalidArgument, "ncclRecv: peer %d", peer);
    return submit({OP_RECV, nullptr, recv, count, t, ncclSum, peer, comm, stream, false});
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return failure(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    std::vector<pending> ops;
    ops.swap(group_ops);
    if (!ops.empty()) queue_group(std::move(ops));
    return ncclSuccess;
}

} // extern "C"
