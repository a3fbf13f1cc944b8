// run_folder.h: what each start of a training run leaves in its run folder
// ([log] run_dir; docs/design.md §9, "The run folder"): train.log (rank 0's
// output, appended), config.ini and config-<step>.ini, and metrics.jsonl kept
// across resumes as one curve. Private to src/train/; rank 0 calls these.
#ifndef TRIDENT_RUN_FOLDER_H
#define TRIDENT_RUN_FOLDER_H

#include <stdbool.h>
#include <stdio.h>

#include "base/common.h"
#include "config/config.h"

// One start of a run (a first start or a resume of a requeued job).
struct run_start {
    int step;           // optimizer steps done before it: the checkpoint's step, 0 fresh
    bool resumed;       // it continues from a checkpoint
    int world_size;
    struct grid_layout layout; // the grid (config_grid): its named sizes are recorded
    const int *threads; // (world_size,) each rank's compute threads, world rank order
    long long time;     // when it started, Unix seconds
    double flops_per_token; // the whole model's training FLOPs a token (model_flops_per_token)
    double peak_flops;      // the job's peak, FLOP/s: the MFU denominator (docs/design.md §9)
    int attempt;        // set by run_folder_open_metrics: 1 + the starts before it
                        // that its metrics.jsonl keeps
};

// Creates dir with its parents and takes an exclusive advisory lock
// (flock) on dir/.trident.lock for the rest of this process, with this
// process's host, pid and start time written in it: two runs writing one run
// folder would interleave train.log and metrics.jsonl, and two runs sharing a
// checkpoint folder would rotate away each other's checkpoints. key names the
// setting ("[log] run_dir", "[checkpoint] dir") in messages. A folder this
// process already locked is fine (run_dir and checkpoint.dir may be one). A
// file system without flock (Lustre mounted without -o flock) gets a warning
// on stderr and no lock. The lock ends when the process exits, killed or not,
// so a requeued job is never refused by its own earlier attempt.
// Errors: STATUS_BAD_INPUT naming key and folder when another process holds
// the lock (its host, pid and start from the file), the folder cannot be
// created or the lock file cannot be opened.
enum status run_folder_lock(const char *dir, const char *key, struct error *err);

// Creates run_dir with its parents, locks it (run_folder_lock) and from now on copies this process's
// stdout and stderr to run_dir/train.log (appended; base/tee.h).
// Errors: STATUS_BAD_INPUT naming [log] run_dir when it cannot be created or
// is not a folder; STATUS_RUNTIME when train.log cannot be appended to.
enum status run_folder_open_log(const char *run_dir, struct error *err);

// The metrics file `path` ([log] metrics_file, else run_dir/metrics.jsonl)
// opened for appending, with this start's record written and flushed; sets
// s->attempt.
// A start that does not resume moves an existing non-empty file aside to
// <stem>-<YYYYmmdd-HHMMSS>[-N].jsonl (said on stdout) and begins a new one.
// A resume from step S keeps the records of steps <= S (step and validation
// records), the start records of starts at steps <= S and the closing records
// of attempts that ended at steps <= S, drops the rest (lines of an attempt
// that ran past S without a checkpoint there, a torn last line), and writes
// the kept part atomically (path.tmp, fsync, rename) before appending.
// Errors: STATUS_BAD_INPUT naming [log] metrics_file when the file cannot be
// read, moved or written.
enum status run_folder_open_metrics(const char *path, struct run_start *s, FILE **out,
                                    struct error *err);

// Writes run_dir/config.ini (replaced: the latest start's resolved config)
// and run_dir/config-<s->step>.ini (config-<step>-2.ini, -3 ... when an
// earlier attempt at that step left one), both with a header of comment
// lines: version, start time, attempt, step, world size and layout; names
// both on stdout.
// Errors: STATUS_RUNTIME naming the file.
enum status run_folder_write_configs(const struct config *c, const struct run_start *s,
                                     struct error *err);

#endif
