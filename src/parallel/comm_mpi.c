// comm_mpi.c: the comm_ops table on MPI communicators (host buffers).
#include "comm_mpi.h"

#include <limits.h>
#include <string.h>

#include "base/mpi_util.h"
#include "kernels/cpu/half.h"

struct comm_mpi {
    MPI_Comm comm;
    MPI_Op bf16_sum; // bf16_sum_fn (MPI has no BF16 type); MPI_OP_NULL for a non-member
};

_Static_assert(sizeof(MPI_Request) <= sizeof(((struct comm_request *)0)->storage),
               "MPI_Request does not fit in comm_request.storage");

static MPI_Comm group_comm(const struct comm_group *g) {
    return ((const struct comm_mpi *)g->impl)->comm;
}

// BF16/FP16 move as 16-bit words; BF16 sums go through bf16_sum_fn.
static MPI_Datatype mpi_dtype(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_FP32: return MPI_FLOAT;
    case DTYPE_FP64: return MPI_DOUBLE;
    case DTYPE_I32: return MPI_INT32_T;
    case DTYPE_I64: return MPI_INT64_T;
    case DTYPE_BF16:
    case DTYPE_FP16: return MPI_UINT16_T;
    }
    CHECK(0, "no MPI datatype for dtype %d", (int)dtype);
}

// inout[i] = bf16(fp32(in[i]) + fp32(inout[i])): both operands widened
// exactly, summed in FP32 and rounded once (to nearest, ties to even). The
// exact sum of two BF16 values needs at most 8 + 1 + (exponent gap) bits, so
// the FP32 addition is exact unless the gap exceeds 15, where the smaller
// operand is far below the BF16 rounding unit anyway: the result is the
// correctly rounded sum. Commutative: MPI may combine in any order.
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_from_f32(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static MPI_Op mpi_op(const struct comm_group *g, enum comm_op op, enum dtype dtype) {
    if (dtype == DTYPE_BF16) return ((const struct comm_mpi *)g->impl)->bf16_sum; // sums only
    return op == COMM_MAX ? MPI_MAX : MPI_SUM;
}

// MPI counts are int; larger buffers would need chunking, which nothing needs yet.
static int mpi_count(size_t count) {
    CHECK(count <= INT_MAX, "%zu elements exceed MPI's int count; split the buffer", count);
    return (int)count;
}

static void mpi_all_reduce(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           enum comm_op op) {
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count), mpi_dtype(dtype),
                            mpi_op(g, op, dtype), group_comm(g)));
}

static void mpi_all_reduce_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                                 enum comm_op op, struct comm_request *req) {
    MPI_Request r;
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(count), mpi_dtype(dtype),
                             mpi_op(g, op, dtype), group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_wait(struct comm_request *req) {
    MPI_Request r;
    memcpy(&r, req->storage, sizeof r);
    CHECK_MPI(MPI_Wait(&r, MPI_STATUS_IGNORE));
    memcpy(req->storage, &r, sizeof r);
}

static bool mpi_test(struct comm_request *req) {
    MPI_Request r;
    int done = 0;
    memcpy(&r, req->storage, sizeof r);
    CHECK_MPI(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    memcpy(req->storage, &r, sizeof r);
    return done;
}

static void mpi_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                               enum dtype dtype, enum comm_op op) {
    CHECK_MPI(MPI_Reduce_scatter_block(send, recv, mpi_count(count), mpi_dtype(dtype),
                                       mpi_op(g, op, dtype), group_comm(g)));
}

static void mpi_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                           enum dtype dtype) {
    const char *own = (const char *)recv + (size_t)g->rank * count * dtype_size(dtype);
    mpi_count((size_t)g->size * count); // recv's total must fit an int too
    CHECK_MPI(MPI_Allgather(send == own ? MPI_IN_PLACE : send, mpi_count(count), mpi_dtype(dtype),
                            recv, mpi_count(count), mpi_dtype(dtype), group_comm(g)));
}

static void mpi_reduce_scatter_start(struct comm_group *g, const void *send, void *recv,
                                     size_t count, enum dtype dtype, enum comm_op op,
                                     struct comm_request *req) {
    MPI_Request r;
    CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, mpi_count(count), mpi_dtype(dtype),
                                        mpi_op(g, op, dtype), group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_all_gather_start(struct comm_group *g, const void *send, void *recv, size_t count,
                                 enum dtype dtype, struct comm_request *req) {
    const char *own = (const char *)recv + (size_t)g->rank * count * dtype_size(dtype);
    mpi_count((size_t)g->size * count);
    MPI_Request r;
    CHECK_MPI(MPI_Iallgather(send == own ? MPI_IN_PLACE : send, mpi_count(count), mpi_dtype(dtype),
                             recv, mpi_count(count), mpi_dtype(dtype), group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_broadcast(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                          int root) {
    CHECK_MPI(MPI_Bcast(buf, mpi_count(count), mpi_dtype(dtype), root, group_comm(g)));
}

static void mpi_send(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                     int peer, int tag) {
    CHECK_MPI(MPI_Send(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g)));
}

static void mpi_recv(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                     int tag) {
    CHECK_MPI(MPI_Recv(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g),
                       MPI_STATUS_IGNORE));
}

static void mpi_send_start(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                           int peer, int tag, struct comm_request *req) {
    MPI_Request r;
    CHECK_MPI(MPI_Isend(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_recv_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           int peer, int tag, struct comm_request *req) {
    MPI_Request r;
    CHECK_MPI(MPI_Irecv(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_barrier(struct comm_group *g) { CHECK_MPI(MPI_Barrier(group_comm(g))); }

static void mpi_free(struct comm_group *g) {
    struct comm_mpi *impl = g->impl;
    if (!impl) return;
    if (impl->bf16_sum != MPI_OP_NULL && mpi_is_running()) CHECK_MPI(MPI_Op_free(&impl->bf16_sum));
    if (impl->comm != MPI_COMM_NULL && mpi_is_running()) CHECK_MPI(MPI_Comm_free(&impl->comm));
    free(impl);
    g->impl = NULL;
}

static const struct comm_ops comm_mpi_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_reduce_start = mpi_all_reduce_start,
    .wait = mpi_wait,
    .test = mpi_test,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .reduce_scatter_start = mpi_reduce_scatter_start,
    .all_gather_start = mpi_all_gather_start,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .send_start = mpi_send_start,
    .recv_start = mpi_recv_start,
    .barrier = mpi_barrier,
    .free = mpi_free,
};

void comm_mpi_init(struct comm_group *g, MPI_Comm comm) {
    memset(g, 0, sizeof *g);
    g->ops = &comm_mpi_ops;
    struct comm_mpi *impl = xmalloc(sizeof *impl);
    impl->comm = comm;
    impl->bf16_sum = MPI_OP_NULL;
    g->impl = impl;
    if (comm == MPI_COMM_NULL) return; // size 0: not a member
    CHECK_MPI(MPI_Op_create(bf16_sum_fn, 1, &impl->bf16_sum));
    CHECK_MPI(MPI_Comm_rank(comm, &g->rank));
    CHECK_MPI(MPI_Comm_size(comm, &g->size));
}

MPI_Comm comm_mpi_handle(const struct comm_group *g) {
    CHECK(g && g->ops == &comm_mpi_ops, "comm_mpi_handle: not an MPI group");
    return group_comm(g);
}
