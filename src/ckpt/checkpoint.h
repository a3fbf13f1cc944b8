// checkpoint.h: save and load training state as pieces of global tensors
// (docs/design.md §7, docs/formats.md "Checkpoints"). Independent of the model
// code: a caller describes each tensor it holds as a piece (a block of a
// global 2-D tensor, or a flat sub-range of that block under ZeRO), and a
// loader in any other (tp, pp, dp) layout asks for the pieces it needs; they
// are reassembled from whichever rank files hold them (resharding).
//
//   dir/step-000100/rank-00000.h5 ... rank-NNNNN.h5   one per world rank
//   dir/step-000100/manifest.ini                      step, layout, model, checksums
//   dir/latest                                        "step-000100\n"
//
// Commit protocol (checkpoint_save): rank 0 creates step-N.tmp/ (removing
// stale *.tmp of crashed saves); every rank writes and fsyncs its file; an
// all-reduce agrees on success; rank 0 writes and fsyncs manifest.ini and the
// directory, checks the pieces cover every tensor, renames step-N.tmp ->
// step-N, fsyncs dir, then writes latest.tmp, fsyncs, renames it to latest,
// fsyncs dir, and rotates. A kill at any moment leaves `latest` naming a
// complete checkpoint.
//
// The trainer's use (src/train/train_ckpt.c): on resume, world rank 0 opens
// the folder checkpoint_resolve names with checkpoint_open (checksums), the
// others with checkpoint_open_trusted once rank 0 agreed; each rank describes
// what it holds as pieces (checkpoint_pieces_from_params over its parameter
// arena, its ZeRO range of the AdamW moments) and reads them with
// checkpoint_read_pieces, then its owners' named entries with
// checkpoint_read_entries. On save every rank calls checkpoint_save with the
// pieces it alone must write (parameters and, without ZeRO, moments from DP
// rank 0 only) and the entries of the state's owners; the commit checks the
// pieces cover every tensor. The layer knows no entry: each is its owner's.
#ifndef TRIDENT_CHECKPOINT_H
#define TRIDENT_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "base/state_entry.h"
#include "base/watchdog.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "parallel/topology.h" // struct grid_layout

#define CKPT_FORMAT_VERSION 1

// [checkpoint] resume: auto (dir/latest when there is one), none, or a path.
enum resume_mode { RESUME_AUTO, RESUME_NONE, RESUME_PATH };
#define CKPT_NAME_MAX 128
#define CKPT_PATH_MAX 4096

// One stored or wanted piece of a global (grows, gcols) tensor. The block
// (rows, cols) sits at (row_offset, col_offset); of the block's row-major
// flattening this piece holds elements [flat_begin, flat_end) (the whole
// block: 0, rows * cols). Vectors have gcols = cols = 1.
struct ckpt_piece {
    char name[CKPT_NAME_MAX]; // "param/<hf name>", or "<state>/<hf name>" of an optimizer state
                              // tensor named by its owner (optimizer_state_names: "adam_m", "adam_v")
    int grows, gcols;
    int row_offset, col_offset, rows, cols;
    size_t flat_begin, flat_end;
    enum dtype dtype;
    void *data; // (flat_end - flat_begin,) host
};

struct ckpt_save_args {
    const char *dir;     // [checkpoint] dir
    int64_t step;        // names the folder step-%06lld
    struct grid_layout layout; // the run's grid (parallel/topology.h)
    int zero_stage;
    int rank;            // world rank whose file this call writes
    const struct llama_config *model;
    const char *tokenizer_id; // "" when none
    const struct ckpt_piece *pieces;
    int n_pieces;
    int keep_last;       // rotation after commit; 0 keeps all
    bool weights_only;   // parameters alone, no moments (trident import): the
                         // manifest says so; for model.init_from, never resumed
    // The training state: named entries of their owners (base/state_entry.h;
    // the trainer gathers them, src/train/train_state.c), written into the
    // rank file's /state beside `step` (the layer's own), each under its name
    // (a clash is a CHECK; read_only ones are not written). NULL, 0: none.
    const struct state_entry *entries;
    int n_entries;
};

// What a rank file turned out as, for the manifest.
struct ckpt_file_sum {
    uint64_t xxh3;
    uint64_t bytes;
};

// The whole collective save. Every rank of world (world rank == a->rank,
// size == the layout's world) calls it with its pieces and state. Returns STATUS_OK
// on every rank or an error on every rank (a rank whose own step succeeded
// says which rank failed, with that rank's message); on error the previous
// checkpoint and `latest` are untouched and nothing is rotated. A piece
// holding a NaN or an infinity is refused (STATUS_RUNTIME naming the tensor):
// a checkpoint is never written with non-finite values.
enum status checkpoint_save(const struct ckpt_save_args *a, struct comm_group *world,
                            struct error *err);

// An asynchronous save (docs/design.md §7 "Asynchronous saves"): the same
// files and the same commit as checkpoint_save, with this rank's write on a
// background thread.
//   checkpoint_save_begin: collective (rank 0 creates step-N.tmp/, agreed as
//     checkpoint_save does; an error there is every rank's and no save is in
//     flight). Then, with copy, this rank copies its pieces' bytes into host
//     memory of its own (sum over pieces of (flat_end - flat_begin) x dtype
//     bytes; a named point "ckpt_async_snapshot" per piece); without copy the
//     caller keeps every piece's data unchanged until finish or abandon. a's
//     strings, model and entries (values and all) are copied. Starts the writer
//     (checkpoint_write_rank; named point "ckpt_async_write" first) and returns
//     STATUS_OK with *out set; a failure of this rank's snapshot or thread is
//     kept in *out as the writer's result and reported by finish.
//   checkpoint_save_writer_state: this rank's thread of the current phase
//     (the writer; then rank 0's commit), 0 still running, 1 done, 2 failed (no collective: the caller all-reduces it to learn that every
//     rank's writer is done).
//   checkpoint_save_advance: collective, every rank at the same point (the
//     caller all-reduces writer_state first, so that it rarely waits). Phase
//     1: waits for this rank's writer (named point "ckpt_async_join" first),
//     "ckpt_async_written", the checksums' all-gather and the agreement; on
//     success rank 0 starts the commit (manifest, the reader's checks,
//     renames, latest, rotation: checkpoint_commit) on a thread of its own,
//     writer_state then says whether it is done, and *hp stays. Phase 2:
//     waits for rank 0's commit and agrees on it; *hp becomes NULL (h freed).
//     Returns STATUS_OK on every rank or an error on every rank naming the
//     failing rank(s) and their reasons (h freed, *hp NULL; the previous
//     `latest` untouched). *wait_s (when not NULL): the seconds it waited.
//   checkpoint_save_finish: advances until committed (both phases).
//   checkpoint_save_abandon: joins the writer and frees h without a commit
//     (an error path; the step-N.tmp left is removed by the next save).
struct ckpt_async;
enum status checkpoint_save_begin(const struct ckpt_save_args *a, bool copy, struct comm_group *world,
                                  struct ckpt_async **out, struct error *err);
int checkpoint_save_writer_state(const struct ckpt_async *h);
int64_t checkpoint_save_step(const struct ckpt_async *h);
enum status checkpoint_save_advance(struct ckpt_async **hp, struct comm_group *world, double *wait_s,
                                    struct error *err);
enum status checkpoint_save_finish(struct ckpt_async *h, struct comm_group *world, double *wait_s,
                                   struct error *err);
void checkpoint_save_abandon(struct ckpt_async *h);

// The three steps of checkpoint_save, callable one by one so that a test can
// play several ranks in one process: prepare (rank 0: fresh step-N.tmp/),
// write_rank (each rank: its file, fsynced, and its checksum; refused with
// STATUS_RUNTIME naming the tensor, before anything is written, when a
// floating-point piece holds a NaN or an infinity), commit (rank 0:
// manifest, the reader's checks of the .tmp folder (metadata only: a caller
// whose pieces leave a hole gets an error, never a `latest` naming it),
// renames, latest, rotation; sums has tp * pp * dp entries).
enum status checkpoint_prepare(const struct ckpt_save_args *a, struct error *err);
enum status checkpoint_write_rank(const struct ckpt_save_args *a, struct ckpt_file_sum *sum,
                                  struct error *err);
enum status checkpoint_commit(const struct ckpt_save_args *a, const struct ckpt_file_sum *sums,
                              struct error *err);

// The steps of dir's complete checkpoint folders (step-N, nothing after: not
// a .tmp), ascending, into *steps (malloc'd, the caller frees; NULL when
// none). Returns how many, or -1 (errno set) when dir cannot be listed.
int checkpoint_list_steps(const char *dir, int64_t **steps);

// Deletes complete checkpoints of dir beyond the newest keep_last (0: none),
// never the one `latest` names. Errors: STATUS_RUNTIME from storage.
enum status checkpoint_rotate(const char *dir, int keep_last, struct error *err);

// The step dir/latest names; -1 when there is none or it is not step-NNNNNN.
int64_t checkpoint_latest_step(const char *dir);

// A branch (a run resuming from step into dir, whose latest is beyond it;
// checkpoint.branch = true): moves every step-N folder of dir with N > step,
// and `latest`, into aside = dir/branched-after-step-NNNNNN-<unix time>/
// (out of the step-N namespace: rotation and resume no longer see them),
// then points dir/latest at the newest step <= step left, if any. Rank 0
// only. Errors: STATUS_RUNTIME from storage (the errno's text).
enum status checkpoint_branch(const char *dir, int64_t step, char aside[CKPT_PATH_MAX],
                              struct error *err);

// The checkpoint folder to resume from: RESUME_NONE, or RESUME_AUTO without
// dir/latest, gives out = "" (start fresh); RESUME_AUTO gives dir/<latest>;
// RESUME_PATH gives path (a checkpoint folder, or a dir with a `latest`).
// Errors: STATUS_BAD_INPUT when latest is malformed or names a missing folder.
enum status checkpoint_resolve(const char *dir, enum resume_mode mode, const char *path,
                               char out[CKPT_PATH_MAX], struct error *err);

struct ckpt_reader;

// Opens a checkpoint folder (or a dir holding `latest`): reads manifest.ini,
// checks the format version, every listed file's presence, size and xxh3
// checksum, every piece's tags, and that the pieces of each tensor cover it.
// Errors: STATUS_BAD_INPUT with a message naming the file.
enum status checkpoint_open(const char *path, struct ckpt_reader **out, struct error *err);
// As checkpoint_open without the checksums (sizes, tags and coverage are
// still checked): for the ranks of a job other than the one that ran
// checkpoint_open on the same folder and shared its verdict, so that the
// checkpoint is read in full once, not once per rank.
enum status checkpoint_open_trusted(const char *path, struct ckpt_reader **out,
                                    struct error *err);
void checkpoint_close(struct ckpt_reader *r);

// The manifest's header.
struct ckpt_info {
    int format_version;
    int64_t step;
    int world_size, zero_stage;
    // The writer's grid: its layout lines (one per named size of
    // topology_layout_sizes); a manifest from before dp_shard (tp, pp, dp
    // only) is one shard group of every data rank.
    struct grid_layout layout;
    struct llama_config model; // shape fields only
    char tokenizer_id[128];
    char path[CKPT_PATH_MAX];  // the checkpoint folder
    bool weights_only;         // [checkpoint] weights_only = 1: param/ tensors only
};
const struct ckpt_info *checkpoint_info(const struct ckpt_reader *r);

// The manifest alone of a checkpoint folder (or a dir holding `latest`),
// with checkpoint_open's checks of it (format version, every value's range,
// the required keys, the layout lines) and none of the rank files: what
// `ckpt info` still prints of a checkpoint checkpoint_open refuses. *out:
// filled (path: the folder). Errors: STATUS_BAD_INPUT naming manifest.ini.
enum status checkpoint_read_manifest(const char *path, struct ckpt_info *out, struct error *err);

// Checks the manifest's layout lines against what the rank files hold (the
// reader reassembles every tensor from its pieces' tags alone, so a
// hand-edited tp, ep or pp read the same data and passed `ckpt verify`). A
// rank file's coordinates along each axis are those of its world rank in
// the manifest's layout (topology_coord_of), and:
//   - the folder holds no rank-NNNNN.h5 beyond world_size;
//   - each piece of a layer's q_proj (its rows, the heads, split over tp) is
//     the block of grows / tp rows at its file's tp coordinate;
//   - each piece of a routed-expert tensor (param_info.expert: rows split
//     over ep) is the block of grows / ep rows at its file's ep coordinate,
//     so the files hold ep expert shards (ep divides dp_shard: the manifest's
//     own check, checkpoint_open);
//   - every tensor of a layer (any prefix, the FP8 state too) lies in files
//     of one pipeline stage, and the layers on all pp stages.
// Axis by axis, tp first, so that the refusal names the key that was changed
// (a key moves the coordinates of its axis and the slower ones). Metadata
// only: no tensor is read. `ckpt verify`, `ckpt info` and a resume call it.
// Errors: STATUS_BAD_INPUT naming manifest.ini, the key and its value, the
// rank file, the block it holds and the one the key gives it.
enum status checkpoint_check_layout(const struct ckpt_reader *r, struct error *err);

// Refuses weights trained with another tokenizer than the run's data: where
// names the weights (a checkpoint's manifest, a Hugging Face folder's
// tokenizer.json), have is their tokenizer identity (tokenizer_identity), want
// the run's data's; "" is unknown and matches anything. Used for checkpoints
// (checkpoint_check_model) and Hugging Face folders alike. Errors:
// STATUS_BAD_INPUT "WHERE: tokenizer = 'HAVE', but the run's data uses 'WANT'".
enum status checkpoint_check_tokenizer(const char *where, const char *have, const char *want,
                                       struct error *err);

// The manifest's name of a RoPE scaling: "none", "linear", "llama3" (the
// config's [model] rope_scaling values).
const char *ckpt_rope_scaling_name(enum rope_scaling_type type);

// Refuses a checkpoint of another model: vocab_size, d_model, n_layers,
// n_heads, n_kv_heads, ffn_dim, tie_embeddings, rope_theta, norm_eps, the
// head size, qkv_bias, qk_norm, rope_scaling and its parameters, and the
// tokenizer id (when both are non-empty) must match. Errors: STATUS_BAD_INPUT
// naming the key, the checkpoint's value and the run's.
enum status checkpoint_check_model(const struct ckpt_reader *r, const struct llama_config *model,
                                   const char *tokenizer_id, struct error *err);

// Checks that the checkpoint holds exactly the tensors of the model its
// manifest describes (model_param_table): param/ and each of the n_state
// optimizer state prefixes (state_names: its owner's names,
// optimizer_state_names) of every parameter (param/ alone for a weights_only
// one), each of its global shape and fp32 or fp64, and nothing else
// (coverage of each tensor's elements is checkpoint_open's). `ckpt verify`
// and a resume call it (issue 18: a deleted or extra tensor passed verify).
// Tensors named "<p>/..." for one of the n_optional prefixes in optional
// (their owner's: the FP8 scaling state, model.h MODEL_FP8_STATE_PREFIX) may
// be present or not, of any shape, fp32 or fp64: their owner judges them.
// Errors: STATUS_BAD_INPUT naming the manifest and the tensor.
enum status checkpoint_check_tensors(const struct ckpt_reader *r, const char *const *state_names, int n_state,
                                     const char *const *optional, int n_optional, struct error *err);

// Fills want->data (caller's buffer, flat_end - flat_begin elements of
// want->dtype) with the requested range of the requested block, gathered from
// every stored piece of want->name. fp32 and fp64 convert into each other;
// other dtypes must match. The last tensor assembled is cached, so asking for
// several blocks of one name reads the files once; only stored pieces that
// meet the wanted range and are not yet in the cache are read (a replicated
// tensor is read from one file, not from every rank's copy).
// Errors: STATUS_BAD_INPUT when the name is absent, the global shape differs
// or an element is in no stored piece.
enum status checkpoint_read_piece(struct ckpt_reader *r, struct ckpt_piece *want,
                                  struct error *err);

// Reads n named entries (base/state_entry.h) from world rank `rank`'s file
// (-1: rank 0's) into their values: each present one must be of its type and
// count; an absent one takes its dflt (every element), or is refused when
// required; *found (when set) says which. The checkpoint layer does not judge
// the values: their owners do (the trainer's trainer_state_read).
// Errors: STATUS_BAD_INPUT naming the file, the entry and what it holds.
enum status checkpoint_read_entries(struct ckpt_reader *r, int rank, const struct state_entry *entries, int n,
                                    struct error *err);

// The pieces of a range of an arena laid out by a parameter table (model.h),
// for saving and for loading: one piece per parameter whose arena elements
// [offset, offset + numel) meet [begin, end), cut to that range and to its
// valid rows (vocab padding is not saved). prefix: "param" or an optimizer
// state's name (optimizer_state_names); arena: host memory of dtype holding arena elements [begin, end)
// from its start: a ZeRO shard of moments passes its own array and range, a
// whole arena (0, SIZE_MAX). The pieces point into arena: for saving, or as
// the destinations of checkpoint_read_pieces. out: room for n pieces.
// Returns the number of pieces filled.
int checkpoint_pieces_from_params(const struct param_info *params, int n, const char *prefix,
                                  void *arena, enum dtype dtype, size_t begin, size_t end,
                                  struct ckpt_piece *out);

// checkpoint_read_piece of each of n pieces; stops at the first error. wd
// (may be NULL): kicked after each piece (the trainer's watchdog: a large
// checkpoint's load is progress piece by piece).
enum status checkpoint_read_pieces(struct ckpt_reader *r, struct ckpt_piece *pieces, int n,
                                   struct watchdog *wd, struct error *err);

// Stored pieces, for `trident ckpt info`: i in [0, n).
int checkpoint_n_pieces(const struct ckpt_reader *r);
const struct ckpt_piece *checkpoint_piece_at(const struct ckpt_reader *r, int i, int *file_rank);

// Non-finite values (NaN, +-inf) of one stored piece: how many, and the first
// one's global (row, col) and value. Integer pieces have none.
struct ckpt_nonfinite {
    size_t count;
    int row, col;  // of the first, in the global (grows, gcols) tensor
    double value;  // the first: NaN, inf or -inf
};
// Reads stored piece i (checkpoint_piece_at) and fills *out (`trident ckpt
// verify`). Errors: STATUS_BAD_INPUT when the read fails.
enum status checkpoint_piece_nonfinite(struct ckpt_reader *r, int i, struct ckpt_nonfinite *out,
                                       struct error *err);

#endif
