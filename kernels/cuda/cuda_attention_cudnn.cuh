// cuda_attention_cudnn.cuh: the cuDNN attention state shared by
// cuda_attention_cudnn.cu (graphs, plans, the choice, whole-sequence
// attention) and cuda_attention_cudnn_block.cu (ring attention blocks as
// cuDNN calls per chunk pair). Internal to the CUDA backend.
#ifndef TRIDENT_CUDA_ATTENTION_CUDNN_CUH
#define TRIDENT_CUDA_ATTENTION_CUDNN_CUH

#include "cuda_internal.cuh"

#include <cudnn.h>
#include <stdio.h>

#define CUDNN_PLANS 32    // cached plans (shape x direction); a run uses 2 to 4, ring attention 4 more
#define GRAPH_DESCS 160   // descriptors of one graph (the backward uses ~110)
#define GRAPH_OPS 40      // operations of one graph (the backward uses ~27)
#define ENGINE_CONFIGS 8  // heuristic answers tried, best first
#define ATTN_ALIGN 16     // byte alignment the plans assume of every tensor pointer

// Unique ids of the tensors the variant pack binds (virtual ones count up
// from UID_VIRTUAL).
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_SCALE, UID_NEG_INF, UID_ONE, UID_DSUM, UID_DQ_ACCUM, UID_VIRTUAL = 100
};

// Ring-attention blocks (cuda_attention_cudnn_block.cu): rows [row, row +
// len) of every batch row hold positions [pos, pos + len); a block's
// readable (query run, key run) pairs; the layouts of recent calls, by their
// position tensors (BLOCK_LAYOUTS, the oldest replaced).
#define BLOCK_RUNS 4     // runs of consecutive positions a side the pair path takes
#define BLOCK_LAYOUTS 32 // remembered (q_pos, k_pos) layouts
struct pos_run {
    int row, pos, len;
};
struct block_pair {
    int qr, kr;  // indexes into block_layout.q, .k
    bool causal; // the same run: top-left causal; else every key readable
};
struct block_layout {
    struct pos_run q[BLOCK_RUNS], k[BLOCK_RUNS];
    int nq, nk;
    struct block_pair pairs[BLOCK_RUNS * BLOCK_RUNS];
    int np;
};
struct block_layout_entry {
    const void *q_pos, *k_pos; // the device tensors read
    int B, Tq, Tk;
    bool pairs_ok;  // whole-run pairs: L holds them; else why
    char why[128];
    struct block_layout L;
};

// One cuDNN attention problem: Tq query rows against Tk key rows of B batch
// rows; the inputs are views of tensors of TQ rows (q; in the backward also
// out, dout and lse) and TK rows (k, v) a batch row, the outputs packed (Tq
// rows: out, lse, dq; Tk rows: dk, dv). causal: query i keeps keys j <= i
// (top-left aligned), else every key. Whole-sequence attention: Tq = Tk = TQ
// = TK = T, causal (sdpa_key_whole). block: the key of a whole
// attention_block call (Tq, Tk its sizes), used only to announce its path;
// no plan has it.
struct sdpa_key {
    int B, Tq, Tk, TQ, TK, H, Hkv, D;
    enum dtype dt;
    bool backward, causal, block;
};
static inline struct sdpa_key sdpa_key_whole(int B, int T, int H, int Hkv, int D, enum dtype dt, bool backward) {
    struct sdpa_key k = {B, T, T, T, T, H, Hkv, D, dt, backward, true, false};
    return k;
}

// One graph's descriptors and, once finalised, its execution plan.
struct sdpa_plan {
    struct sdpa_key key;
    bool used;
    cudnnStatus_t status;   // CUDNN_STATUS_SUCCESS: plan is usable
    char why[256];          // otherwise: the call that failed and cuDNN's message
    cudnnBackendDescriptor_t plan;
    int64_t workspace;      // bytes cuDNN asks for, before the FP32 buffers of the backward
    bool warned_align;      // auto fell back for a misaligned pointer (said once)
    cudnnBackendDescriptor_t descs[GRAPH_DESCS]; // everything the plan was built from
    int n_descs;
};

#define SHAPES_SAID 64 // shapes whose path was announced (later ones are not)

// The cuDNN state of one CUDA backend (struct cuda_backend.cudnn).
struct cudnn_attention {
    cudnnHandle_t handle;
    struct sdpa_plan plans[CUDNN_PLANS];
    int next;         // slot the next new shape takes (round robin once full)
    bool open_failed; // cudnnCreate failed (auto: said once, not retried)
    // Which path each shape took: announced on `log` (backend_set_attention_log;
    // stderr by default, NULL: nowhere) the first time the shape runs, and
    // the paths of the calls since backend_attention_take_path (bits).
    FILE *log;
    struct sdpa_key said[SHAPES_SAID];
    int n_said;
    unsigned paths;
    // attention_block shapes (block keys) cuDNN could not plan a chunk pair
    // of: later calls go native without reading the positions
    struct sdpa_key declined[SHAPES_SAID];
    int n_declined;
    int32_t *pos_host; // the positions of a block call read back (cuda_attention_cudnn_block.cu), grown
    size_t pos_cap;    // its capacity in elements
    struct block_layout_entry layouts[BLOCK_LAYOUTS];
    int n_layouts, next_layout;
};

// be's cuDNN state, allocated on first use (log: stderr).
struct cudnn_attention *cudnn_attn_state(struct cuda_backend *c);
// Whether cuDNN runs problem key with these tensor pointers: *plan_out when
// it does, else why (the reason the native kernels run: the mode native,
// FP32, cuDNN unusable, a shape cuDNN cannot plan with its status, a pointer
// not 16-byte aligned). In cudnn mode the last three are errors
// (STATUS_RUNTIME) naming the key, the shape and cuDNN's status.
enum status cudnn_choose(struct backend *be, const struct sdpa_key *key, void *const *ptrs, int n_ptrs,
                         struct sdpa_plan **plan_out, char *why, size_t why_size, struct error *err);
bool cudnn_key_equal(const struct sdpa_key *a, const struct sdpa_key *b);
// Records the path a call of key took (why NULL: cuDNN) for
// backend_attention_take_path and announces it the first time the key runs.
void cudnn_note_path(struct cuda_backend *c, const struct sdpa_key *key, const char *why);
// Runs plan p with the (uid, pointer) pairs and the workspace; exits 1 with
// cuDNN's message on failure.
void cudnn_execute(struct backend *be, struct sdpa_plan *p, const int64_t *uids, void **ptrs, int n,
                   void *workspace, const char *what);
// The value masked scores take for the loaded cuDNN (-FLT_MAX before 9.10, -inf from 9.10).
float cudnn_mask_value(void);

#endif
