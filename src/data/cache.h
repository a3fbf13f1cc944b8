// cache.h: the hot tier of a dataset: shards staged from [data] path (the
// cold tier: a parallel file system, an object-store mount) into [data]
// cache_dir (node-local NVMe) ahead of the loader (docs/design.md §6).
//
// Layout: cache_dir/<xxh3 of index.ini>/shard-NNNNN.<ID>.h5, one folder per
// dataset content, so two datasets or two jobs never mix shards, and one name
// per source identity (ID, cache_source_id): the size, mtime and ctime of the
// shard's cold file when it was copied. A copy is served only while the
// source still has the identity it was copied under: cache_acquire stats
// the cold file (one stat(2) per open of a hot copy) and looks up the copy
// of that identity, so a source changed since staging (rewritten in place
// with its size and mtime restored: its ctime, which no user call sets,
// moves) is never served from the cache; its reader goes to the cold tier,
// whose checksum against index.ini refuses it by name or, when the bytes
// still match, the stager restages it under the new identity. Every copy's
// bytes equal index.ini's checksum (checked before publication), so the
// folder name (index.ini's xxh3) and the identity together say that the copy
// is what both the index and the source hold. A copy under an identity that
// no longer matches is never read again; this stager unlinks its own such
// copies (its budget), others' stay until removed by hand.
//
// Publication: a shard is copied into a temporary file of its own,
// .<published name>~HOST~PID~RANDOM.tmp (cache_node_name, getpid, 64 random
// bits; created with O_EXCL), hashed as it is read, fsynced, re-read and
// checked against index.ini's checksum, its source checked unchanged
// (identity before and after the copy, same file under the name), and only
// then renamed to its published name (and the folder fsynced): a name in the
// folder is always a complete, verified shard, whoever wrote it, even with
// many nodes (or containers with one pid) sharing the folder. Two stagers
// staging the same shard at once each rename a verified copy of the same
// bytes; the later rename wins, atomically. A temporary file is removed by
// its writer when the try fails; a stager at cache_open removes only
// provably abandoned ones: HOST is this node, PID is not a live process here
// and the file is older than CACHE_TEMP_ABANDON_S. Others' temporaries and
// any other name are never touched.
//
// Errors name the tier: a staging failure says "the cold tier" (the source
// could not be read, changed during the copy, or does not match index.ini)
// or "the hot tier" (the temporary file could not be created, written,
// fsynced, read back or renamed), with the errno's text.
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

// Seconds without a write after which a temporary file of a dead process of
// this node counts as abandoned (cache_open removes it).
#define CACHE_TEMP_ABANDON_S 600

// Hex digits of a source identity, with its NUL.
#define CACHE_ID_BYTES 17

// Opens (creating it when missing) the hot tier in cache_dir for the dataset
// in cold_dir whose index is ix (index.ini's xxh3 names the subfolder).
// stager: this process stages (node-local rank 0); else it only reads what
// the stager publishes. budget: bytes of published shards the stager keeps
// (>= 1); prefetch: shards staged ahead (>= 0; 0 stages only the shard
// needed now). A stager removes the abandoned temporary files of this node
// (see Publication above). Errors: STATUS_BAD_INPUT naming cache_dir and the
// hot tier when it cannot be created or written.
enum status cache_open(const char *cache_dir, const char *cold_dir, const struct index *ix, int64_t budget,
                       int prefetch, bool stager, struct cache **out, struct error *err);
// Stops and joins the stager thread (a copy in flight is finished or its
// temporary file removed), then frees c. Published shards stay.
void cache_close(struct cache *c);

// True when shard i has a published hot copy under its source's identity
// now (one stat(2) of the cold file, one of the hot copy): path (cap bytes)
// receives its file name and the shard counts as open here (no eviction by
// this process) until cache_release. False (read the cold tier) when the
// cold file cannot be stat'ed or no copy of its current identity exists.
bool cache_acquire(struct cache *c, int i, char *path, size_t cap);
void cache_release(struct cache *c, int i);

// True when shard i has a published hot copy under the source identity this
// process last saw (cache_acquire; one stat(2) of the hot tier, none of the
// cold): a reader that has the shard open on the cold tier switches to it
// (cache_acquire then checks the identity again).
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
//                     succeed: a transient error (unit tests);
//   stage_stall_ms:N  every copy the stager makes stalls N ms halfway, its
//                     temporary file half written (tests of concurrent
//                     stagers).
// Sleeps as set, then returns 0 or EIO for shard i. A bad setting is
// reported once on stderr and ignored (no fault).
int cache_cold_fault(int i);

// This node's name in temporary file names (cap bytes, at most 64
// characters; '~', '/' and blanks become '_'): gethostname, or for tests the
// environment variable TRIDENT_TEST_HOST when set and not empty (two
// processes of one machine pose as two nodes).
void cache_node_name(char *out, size_t cap);

// The identity of the file at path (CACHE_ID_BYTES): 16 hex digits of the
// xxh3 of its size and its mtime and ctime in ns (one stat(2)). Returns 0 or
// the errno of stat.
int cache_source_id(const char *path, char id[CACHE_ID_BYTES]);

// Sleeps ms milliseconds (restarted after a signal).
void cache_sleep_ms(long ms);

#endif
