// ring_attention.c: context parallelism of the model (ring_attention.h): the
// load-balanced split of each sequence, global positions and document
// starts, and ring attention over the CP group, forward and backward.
// Math: Liu et al. 2023 (Ring Attention), the online-softmax merge of
// Milakov & Gimelshein 2018 and FlashAttention-2's backward (Dao 2023,
// Algorithm 2), blockwise in backend_attention_block_forward / _backward.
#include "ring_attention.h"

#include <string.h>

int cp_global_pos(int Tg, int cp, int me, int t) {
    int c = Tg / (2 * cp); // chunk length
    return t < c ? me * c + t : (2 * cp - 1 - me) * c + (t - c);
}

void cp_split_rows(const struct model *m, int32_t *local, const int32_t *whole) {
    int T = m->T, c = T / 2;
    for (int b = 0; b < m->B; b++) {
        const int32_t *row = whole + (size_t)b * m->Tg;
        int32_t *out = local + (size_t)b * T;
        // the two chunks are contiguous runs of c tokens each
        memcpy(out, row + cp_global_pos(m->Tg, m->cp, m->cp_rank, 0), sizeof *out * (size_t)c);
        memcpy(out + c, row + cp_global_pos(m->Tg, m->cp, m->cp_rank, c), sizeof *out * (size_t)c);
    }
}

int64_t cp_count_targets(const struct model *m, const int32_t *targets, int n_micro) {
    int64_t count = 0;
    for (int k = 0; k < n_micro; k++)
        for (int b = 0; b < m->B; b++) {
            const int32_t *row = targets + ((size_t)k * m->B + b) * m->Tg;
            for (int t = 0; t < m->T; t++)
                count += row[cp_global_pos(m->Tg, m->cp, m->cp_rank, t)] != IGNORE_INDEX;
        }
    return count;
}

void cp_upload_positions(struct model *m) {
    int32_t *pos = xmalloc(sizeof *pos * (size_t)m->cp * m->N);
    for (int j = 0; j < m->cp; j++)
        for (int b = 0; b < m->B; b++)
            for (int t = 0; t < m->T; t++)
                pos[((size_t)j * m->B + b) * m->T + t] = cp_global_pos(m->Tg, m->cp, j, t);
    backend_to_device(m->be, m->cp_pos.data, pos, sizeof *pos * (size_t)m->cp * m->N);
    free(pos);
}

void cp_slot_positions(struct model *m, struct slot *S, const int32_t *tokens) {
    bool docs = m->doc_eot >= 0;
    if (docs) {
        CHECK(tokens, "packed documents under context parallelism but no tokens");
        doc_start_fill(m->host_doc, tokens, m->B, m->Tg, m->doc_eot); // whole sequences
    }
    int32_t *d = m->host_pos + m->N; // (N,) staging of the document starts
    for (int b = 0; b < m->B; b++)
        for (int t = 0; t < m->T; t++) {
            int p = cp_global_pos(m->Tg, m->cp, m->cp_rank, t);
            int start = docs ? m->host_doc[(size_t)b * m->Tg + p] : 0;
            size_t i = (size_t)b * m->T + t;
            m->host_pos[i] = t - (p - start); // rope: p' = t - doc_start = p - start
            d[i] = start;
        }
    backend_to_device(m->be, S->rope_pos.data, m->host_pos, sizeof(int32_t) * (size_t)m->N);
    if (docs) backend_to_device(m->be, S->doc_start.data, d, sizeof(int32_t) * (size_t)m->N);
}

// ---- the ring ----------------------------------------------------------------

// Tags of the ring's messages (MPI; NCCL matches in order, and every wait
// below is of one message in each direction, posted symmetrically, so each
// NCCL group holds one send and its peer's receive).
enum { TAG_KV = 31, TAG_DKV = 32 };

static struct tensor pos_of(const struct model *m, int owner) {
    return tensor_slice(m->cp_pos, (size_t)owner * m->N, m->N);
}

// The query rows' document starts: S->doc_start with packed documents,
// else empty (plain causal).
static struct tensor qdoc_of(const struct model *m, const struct slot *S) {
    return m->doc_eot >= 0 ? S->doc_start : tensor_view(NULL, DTYPE_I32, 0);
}

// Parts of travelling buffer i: 0 k, 1 v, 2 dk, 3 dv; (k, v) and (dk, dv)
// are adjacent, each pair one message.
static struct tensor part(const struct model *m, int i, int k, int count) {
    size_t n = (size_t)m->N * m->Hkvl * m->D;
    return tensor_slice(m->ring[i % 2], (size_t)k * n, (size_t)count * n);
}

// MPI reads backend buffers from the host: the compute must be done.
static void sync_for_ring(struct model *m) {
    comm_order_after_compute(m->groups.cp, m->be);
}

// Starts sending src (one message) to the next rank of the ring and
// receiving dst from the previous one; req: room for 2.
static void ring_shift_start(struct model *m, struct tensor src, struct tensor dst, int tag,
                             struct comm_request *req) {
    struct comm_group *g = m->groups.cp;
    int next = (m->cp_rank + 1) % m->cp, prev = (m->cp_rank + m->cp - 1) % m->cp;
    sync_for_ring(m);
    comm_recv_start(g, dst.data, dst.numel, dst.dtype, prev, tag, &req[0]);
    comm_send_start(g, src.data, src.numel, src.dtype, next, tag, &req[1]);
}

static void ring_shift_wait(struct comm_request *req) {
    comm_wait(&req[0]);
    comm_wait(&req[1]);
}

static void check_ring(const struct model *m) {
    CHECK(m->groups.cp && m->groups.cp->size == m->cp,
          "cp = %d but the CP group has %d ranks (model_set_groups)", m->cp,
          m->groups.cp ? m->groups.cp->size : 0);
}

void ring_attention_forward(struct model *m, struct slot *S, struct block_acts *a) {
    check_ring(m);
    struct backend *be = m->be;
    size_t n = (size_t)m->N * m->Hkvl * m->D;
    // Step 0's block is this rank's own, packed into buffer 0 so that it
    // travels as one message.
    backend_copy(be, tensor_slice(part(m, 0, 0, 1), 0, n), a->k, n);
    backend_copy(be, part(m, 0, 1, 1), a->v, n);
    struct tensor qpos = pos_of(m, m->cp_rank), qdoc = qdoc_of(m, S);
    for (int s = 0; s < m->cp; s++) {
        struct comm_request req[2];
        bool more = s + 1 < m->cp;
        // the next block's transfer first, so that it overlaps this compute
        if (more) ring_shift_start(m, part(m, s, 0, 2), part(m, s + 1, 0, 2), TAG_KV, req);
        int owner = (m->cp_rank - s + m->cp) % m->cp;
        backend_attention_block_forward(be, a->att, a->lse, a->q, part(m, s, 0, 1), part(m, s, 1, 1),
                                        qpos, qdoc, pos_of(m, owner), m->B, m->T, m->T, m->Hl,
                                        m->Hkvl, m->D, s > 0);
        if (more) ring_shift_wait(req);
    }
}

void ring_attention_backward(struct model *m, struct slot *S, struct block_acts *a,
                             struct tensor datt) {
    check_ring(m);
    struct backend *be = m->be;
    size_t n = (size_t)m->N * m->Hkvl * m->D;
    backend_copy(be, part(m, 0, 0, 1), a->k, n);
    backend_copy(be, part(m, 0, 1, 1), a->v, n);
    backend_memset0(be, part(m, 0, 2, 2)); // the own block's dk, dv start at zero
    backend_memset0(be, m->dq);
    struct tensor qpos = pos_of(m, m->cp_rank), qdoc = qdoc_of(m, S);
    for (int s = 0; s < m->cp; s++) {
        struct comm_request req[2];
        bool more = s + 1 < m->cp;
        if (more) ring_shift_start(m, part(m, s, 0, 2), part(m, s + 1, 0, 2), TAG_KV, req);
        int owner = (m->cp_rank - s + m->cp) % m->cp;
        backend_attention_block_backward(be, m->dq, part(m, s, 2, 1), part(m, s, 3, 1), datt, a->q,
                                         part(m, s, 0, 1), part(m, s, 1, 1), a->att, a->lse, qpos,
                                         qdoc, pos_of(m, owner), m->B, m->T, m->T, m->Hl, m->Hkvl,
                                         m->D);
        // The key/value exchange completes before the gradients' starts:
        // each wait then holds one message per direction (NCCL groups).
        if (more) ring_shift_wait(req);
        // This block's dk, dv go on with it; the previous rank's arrive
        // (after the last step: this rank's own, complete).
        ring_shift_start(m, part(m, s, 2, 2), part(m, s + 1, 2, 2), TAG_DKV, req);
        ring_shift_wait(req);
    }
    backend_copy(be, m->dk, part(m, m->cp, 2, 1), n);
    backend_copy(be, m->dv, part(m, m->cp, 3, 1), n);
}
