// cache.h: the hot tier of a dataset: shards staged from [data] path (the
// cold tier: a parallel file system, an object-store mount) into [data]
// cache_dir (node-local NVMe) ahead of the loader (docs/design.md §6).
//
// Layout: cache_dir/<xxh3 of index.ini>/shard-NNNNN.h5, one folder per
// dataset content, so two datasets or two jobs never mix shards. A shard is
// copied to .shard-NNNNN.h5.<pid>.tmp, fsynced, checked against index.ini's
// checksum and only then renamed to its name (and the folder fsynced): a
// name in the folder is always a complete, verified shard, whoever wrote it.
// Two jobs staging the same shard at once each rename a verified copy of
// the same bytes; the later rename wins, atomically.
//
// Staging: one process per node (node-local rank 0) runs a stager thread; it
// makes no MPI call. Its loader announces the shards the next global batches
// need, in order of first need (cache_want; they cover every DP rank, so
// the node's other ranks find their shards staged too). The thread copies the
// first prefetch_shards of them that are not yet hot.
//
// Eviction: while the bytes published by this stager plus the next shard
// exceed cache_bytes, the least recently used shard that is neither wanted
// nor open in this process is unlinked. A reader in another process (a local
// rank, another job) that has the file open keeps reading it: POSIX unlink
// removes the name, not the open inode, so no reader ever loses a shard it
// reads (the space returns when it closes it). A reader that looks for an
// evicted shard afterwards reads the cold tier.
#ifndef TRIDENT_CACHE_H
#define TRIDENT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "index.h"

struct cache;

// Tries of a cold-tier read (a shard's open by a reader, a stager's copy)
// before it is reported, and the first backoff, doubled after each try.
#define CACHE_COLD_TRIES 4
#define CACHE_COLD_BACKOFF_MS 100

// Opens (creating it when missing) the hot tier in cache_dir for the dataset
// in cold_dir whose index is ix (index.ini's xxh3 names the subfolder).
// stager: this process stages (node-local rank 0); else it only reads what
// the stager publishes. budget: bytes of published shards the stager keeps
// (>= 1); prefetch: shards staged ahead (>= 0; 0 stages only the shard
// needed now). Leftover temporary files of dead processes are removed.
// Errors: STATUS_BAD_INPUT naming cache_dir when it cannot be created or
// written.
enum status cache_open(const char *cache_dir, const char *cold_dir, const struct index *ix, int64_t budget,
                       int prefetch, bool stager, struct cache **out, struct error *err);
// Stops and joins the stager thread (a copy in flight is finished or its
// temporary file removed), then frees c. Published shards stay.
void cache_close(struct cache *c);

// True when shard i has a published hot copy: path (cap bytes) receives its
// file name and the shard counts as open here (no eviction by this process)
// until cache_release.
bool cache_acquire(struct cache *c, int i, char *path, size_t cap);
void cache_release(struct cache *c, int i);

// True when shard i has a published hot copy now (one stat(2)): a reader
// that has the shard open on the cold tier switches to it.
bool cache_published(const struct cache *c, int i);

// The shards the next reads need, in order of first need (n of them,
// duplicates allowed): replaces the stager's list. No-op when not a stager.
void cache_want(struct cache *c, const int *shards, int n);

// Shards this stager has published, evicted, and failed to stage (cold read
// errors after CACHE_COLD_TRIES): for logs and tests.
void cache_counts(const struct cache *c, int64_t *staged, int64_t *evicted, int64_t *failed);

// Test-only fault injection on the cold tier, read once from the environment
// variable TRIDENT_DATA_FAULT: a comma-separated list of
//   cold_delay_ms:N   every cold-tier access (a shard's open or validation,
//                     each token read from it, each copy the stager makes)
//                     first sleeps N ms, like a slow parallel file system;
//   cold_eio:K        every cold-tier access of shard K fails with EIO;
//   cold_eio_at:K:N:M the cold-tier accesses N .. N+M-1 (1-based, counted
//                     over the process) of shard K fail with EIO, the others
//                     succeed: a transient error (unit tests).
// Sleeps as set, then returns 0 or EIO for shard i. A bad setting is
// reported once on stderr and ignored (no fault).
int cache_cold_fault(int i);

// Sleeps ms milliseconds (restarted after a signal).
void cache_sleep_ms(long ms);

#endif
