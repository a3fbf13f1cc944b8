// all_to_all_case.h: the all-to-all-v cases shared by the tests of every
// comm implementation (comm_self: test_topology.c; MPI: tests/mpi/test_comm_mpi.c;
// NCCL: tests/mpi/test_comm_nccl.c). A case is a closed form of the counts
// and of every element, so the expected receive buffer is built here from
// the formulas, never from a collective:
//   count(s, d): elements group rank s sends to group rank d;
//   element k of that chunk encodes (s, d, k) (a2a_put).
// Buffers have gaps: the send chunks lie in reverse destination order with
// 1 to 3 unused elements before each, the receive chunks in source order
// after 2 and with 1 or 3 between them, so displacements are neither contiguous nor
// monotone in the peer; every gap of the receive buffer starts as poison
// (bytes 0xff, which no code equals) and must stay so.
#ifndef TRIDENT_ALL_TO_ALL_CASE_H
#define TRIDENT_ALL_TO_ALL_CASE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"

enum { A2A_MAX_RANKS = 64 };

enum a2a_variant {
    A2A_UNEVEN, // counts 0..5, zeros off the diagonal, never to itself
    A2A_SILENT, // as UNEVEN, but group rank size / 2 sends nothing (not even to
                // itself) and group rank 0 receives nothing
    A2A_LARGE,  // 0, 20011 or 40022 elements (beyond MPI's eager sends; none to
                // itself), I32 only
    A2A_VARIANTS
};

static const char *const a2a_variant_names[A2A_VARIANTS] = {"uneven", "silent", "large"};

static inline size_t a2a_count(enum a2a_variant v, int s, int d, int size) {
    switch (v) {
    case A2A_UNEVEN: return (size_t)((3 * s + 5 * d + 1) % 6);
    case A2A_SILENT:
        if (s == size / 2 || d == 0) return 0;
        return (size_t)((3 * s + 5 * d + 1) % 6);
    case A2A_LARGE: return (size_t)((s + 2 * d) % 3) * 20011;
    case A2A_VARIANTS: break;
    }
    return 0;
}

// Whether variant v is run with dtype dt (LARGE's codes need 32 bits).
static inline bool a2a_takes(enum a2a_variant v, enum dtype dt) {
    return v != A2A_LARGE || dt == DTYPE_I32;
}

// One rank's view of a case: counts and displacements (elements) as
// comm_all_to_all_v takes them, and the lengths of its buffers, gaps included.
struct a2a_layout {
    size_t send_counts[A2A_MAX_RANKS], send_displs[A2A_MAX_RANKS];
    size_t recv_counts[A2A_MAX_RANKS], recv_displs[A2A_MAX_RANKS];
    size_t send_len, recv_len;
};

static inline void a2a_layout(struct a2a_layout *l, enum a2a_variant v, int me, int size) {
    memset(l, 0, sizeof *l);
    size_t pos = 0;
    for (int d = size - 1; d >= 0; d--) {
        pos += (size_t)(d % 3) + 1;
        l->send_displs[d] = pos;
        l->send_counts[d] = a2a_count(v, me, d, size);
        pos += l->send_counts[d];
    }
    l->send_len = pos + 1;
    pos = 2; // not 1: on one rank the chunk to itself then moves (send_displs[0] is 1)
    for (int s = 0; s < size; s++) {
        l->recv_displs[s] = pos;
        l->recv_counts[s] = a2a_count(v, s, me, size);
        pos += l->recv_counts[s] + 1 + (size_t)(s % 2) * 2;
    }
    l->recv_len = pos;
}

// The code of element k from s to d, stored as dt: FP32 (s*64 + d)*4096 + k
// (exact below 2^24), I32 (s*64 + d)*65536 + k, BF16 the 16-bit word
// (s*32 + d)*64 + k (moved as bits: only data movement is tested). Distinct
// over groups of up to 64 ranks (BF16: 32) and k below 4096 (I32: 65536;
// BF16: 63); never all ones (the poison).
static inline void a2a_put(void *buf, enum dtype dt, size_t at, int s, int d, size_t k) {
    switch (dt) {
    case DTYPE_FP32: ((float *)buf)[at] = (float)((s * 64 + d) * 4096 + (int)(k % 4096)); break;
    case DTYPE_I32: ((int32_t *)buf)[at] = (int32_t)((s * 64 + d) * 65536 + (int)(k % 65536));
        break;
    case DTYPE_BF16:
        ((uint16_t *)buf)[at] = (uint16_t)((s % 32 * 32 + d % 32) * 64 + (int)(k % 63));
        break;
    default: memset((char *)buf + at * dtype_size(dt), 0x5a, dtype_size(dt)); break; // unused
    }
}

// send (l->send_len elements of dt): rank me's chunks, poison in the gaps.
static inline void a2a_fill_send(void *send, enum dtype dt, const struct a2a_layout *l, int me,
                                 int size) {
    memset(send, 0xff, l->send_len * dtype_size(dt));
    for (int d = 0; d < size; d++)
        for (size_t k = 0; k < l->send_counts[d]; k++)
            a2a_put(send, dt, l->send_displs[d] + k, me, d, k);
}

// want (l->recv_len elements of dt): what rank me must hold after the
// all-to-all, from the formulas alone: chunk s at recv_displs[s] with the
// codes of (s, me, k), poison elsewhere.
static inline void a2a_expected(void *want, enum dtype dt, const struct a2a_layout *l,
                                enum a2a_variant v, int me, int size) {
    memset(want, 0xff, l->recv_len * dtype_size(dt));
    for (int s = 0; s < size; s++)
        for (size_t k = 0; k < a2a_count(v, s, me, size); k++)
            a2a_put(want, dt, l->recv_displs[s] + k, s, me, k);
}

// Elements of dt that differ between got and want (n each).
static inline size_t a2a_wrong(const void *got, const void *want, size_t n, enum dtype dt) {
    size_t es = dtype_size(dt), bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0;
    return bad;
}

// Runs case v in dtype dt over g on host buffers (comm_self, MPI): the
// elements of the receive buffer that differ from a2a_expected, plus those
// of the send buffer that changed.
static inline size_t a2a_run_host(struct comm_group *g, enum a2a_variant v, enum dtype dt) {
    struct a2a_layout l;
    a2a_layout(&l, v, g->rank, g->size);
    size_t es = dtype_size(dt);
    char *send = xmalloc(l.send_len * es), *sent = xmalloc(l.send_len * es);
    char *recv = xmalloc(l.recv_len * es), *want = xmalloc(l.recv_len * es);
    a2a_fill_send(send, dt, &l, g->rank, g->size);
    memcpy(sent, send, l.send_len * es);
    memset(recv, 0xff, l.recv_len * es);
    comm_all_to_all_v(g, send, l.send_counts, l.send_displs, recv, l.recv_counts, l.recv_displs,
                      dt);
    a2a_expected(want, dt, &l, v, g->rank, g->size);
    size_t bad = a2a_wrong(recv, want, l.recv_len, dt) + a2a_wrong(send, sent, l.send_len, dt);
    free(send), free(sent), free(recv), free(want);
    return bad;
}

#endif
