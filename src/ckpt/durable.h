// durable.h: the one place trident writes durable files through (checkpoints),
// a thin checked wrapper over POSIX in the manner of SQLite's OS layer. Every
// call counts as one "storage call" and can be made to fail for crash tests.
//
// Errors name the path and the errno text: ENOSPC, EDQUOT and EROFS are
// STATUS_RUNTIME like every other failure of the machine.
//
// Fault injection (tests only): TRIDENT_FAULT="WHAT:N[@RANK]" read once, at
// the first storage call (after MPI is up, so g_log_rank is known).
//   kill:N          the process SIGKILLs itself at its Nth storage call
//                   (1-based, every call of this API counts), before doing it
//   kill:NAME[:K]   at the Kth time (default 1) named point NAME is reached
//                   (durable_point): "h5_create" (a rank file about to be
//                   written by HDF5), "ckpt_between_renames" (step-N.tmp
//                   renamed to step-N, `latest` not yet updated); of an
//                   asynchronous save (checkpoint_save_begin):
//                   "ckpt_async_snapshot" (a piece about to be copied),
//                   "ckpt_async_write" (the background writer starting),
//                   "ckpt_async_join" (the commit about to wait for the
//                   writer: the next save, the end or the boundary that saw
//                   every writer done),
//                   "ckpt_async_written" (this rank's writer done, before
//                   the commit's collectives)
//   stall:NAME[:K]  at the Kth time named point NAME is reached, the caller
//                   sleeps 3 s and goes on: a slow write (e.g. a SIGTERM
//                   arriving during a background write)
//   hang:NAME[:K]   at the Kth time (default 1) read point NAME is reached
//                   (durable_hang_point): "ckpt_read_piece" (a stored tensor
//                   piece about to be read from a checkpoint), the process
//                   sleeps for ever: a stuck file system read (the watchdog's
//                   test); read points are no storage calls (kill:N counts
//                   stay)
//   short_write:N   the Nth durable_write writes half its bytes and fails
//   fsync:N         the Nth fsync (file or directory) fails with EIO
//   enospc:N        the Nth storage call that creates or writes data
//                   (open for writing, write, mkdir, h5 create point) fails
//                   with ENOSPC
//   grad_inf:N      not a storage fault: the trainer's (src/train/train.c: an
//                   inf in the gradients at step N, durable_fault_grad_inf);
//                   no storage call fails
//   nccl:N          not a storage fault: the emulated NCCL's (make EMU=1;
//                   tests/cuda_emu/nccl_fault.h): the Nth NCCL operation of
//                   the process fails asynchronously; no storage call fails
//   pp_delay:SEED   not a storage fault: the pipeline executor's (src/parallel/
//                   pipeline.h, delay_seed): a random 0 to 2 ms sleep before
//                   every pipeline send and receive, drawn from SEED, the
//                   stage and the message; no storage call fails
//   pp_op_ms:N      not a storage fault: each pipeline op sleeps N ms first
//                   (pipeline.h, op_pad_s; equal stages for measuring the
//                   bubble); no storage call fails
//   @RANK           only on world rank RANK (g_log_rank); else every rank
// durable_fault_set replaces the setting at run time (unit tests).
#ifndef TRIDENT_DURABLE_H
#define TRIDENT_DURABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"

// Replaces the fault setting (same syntax as TRIDENT_FAULT; NULL or "" for
// none) and resets every counter. Errors: STATUS_BAD_INPUT on bad syntax.
enum status durable_fault_set(const char *spec, struct error *err);
// TRIDENT_FAULT's grad_inf:N[@RANK] setting, parsed with the storage faults:
// *step = N (1-based, as logged) or 0 when the setting is another kind or
// unset; *rank = RANK or -1 for every rank. Errors: a bad TRIDENT_FAULT
// (STATUS_BAD_INPUT naming it).
enum status durable_fault_grad_inf(long *step, int *rank, struct error *err);
// TRIDENT_FAULT's pp_delay:SEED[@RANK] setting: *seed = SEED (>= 1) or 0 when
// the setting is another kind or unset; *rank as above. Errors: as above.
enum status durable_fault_pp_delay(long *seed, int *rank, struct error *err);
// TRIDENT_FAULT's pp_op_ms:N[@RANK] setting: *ms = N or 0; *rank as above.
enum status durable_fault_pp_op_ms(long *ms, int *rank, struct error *err);
// Storage calls made since start (or the last durable_fault_set).
long durable_calls(void);

// A file open for writing: created or truncated, mode 0644.
struct durable_file {
    int fd;
    char path[4096];
};
enum status durable_open_write(struct durable_file *f, const char *path, struct error *err);
// Writes all n bytes (retrying partial writes) or fails.
enum status durable_write(struct durable_file *f, const void *buf, size_t n, struct error *err);
enum status durable_fsync(struct durable_file *f, struct error *err);
// Closes f; f->fd becomes -1. Safe to call twice.
enum status durable_close(struct durable_file *f, struct error *err);

// Opens path read-only and fsyncs it: for files written by a library (HDF5).
enum status durable_fsync_path(const char *path, struct error *err);
// fsync of a directory, so that entries created or renamed in it are durable.
enum status durable_fsync_dir(const char *path, struct error *err);
// Writes a whole small file: open, write, fsync, close.
enum status durable_write_file(const char *path, const void *buf, size_t n, struct error *err);
enum status durable_mkdir(const char *path, struct error *err); // with parents; ok if it exists
enum status durable_rename(const char *from, const char *to, struct error *err);
// Removes path and everything below it; ok when it does not exist.
enum status durable_remove_tree(const char *path, struct error *err);
// A named point of a protocol, e.g. where a library (HDF5) is about to
// create path: it counts as a storage call and can be killed at; when
// creates, it also counts for enospc:N and fails with ENOSPC there.
enum status durable_point(const char *name, const char *path, bool creates, struct error *err);
// A named point of a read (not a storage call, no counter moves): the
// process hangs there for ever when TRIDENT_FAULT = hang:NAME[:K] names it
// (the Kth time, on its rank). A bad TRIDENT_FAULT is ignored here: the next
// storage call or durable_fault_grad_inf reports it.
void durable_hang_point(const char *name, const char *path);

#endif
