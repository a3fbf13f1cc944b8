// heartbeat.h: per-rank heartbeat files, so that a rank's watchdog can name
// a peer that stopped (SIGSTOP, a debugger, a dead node) when the job hangs
// in a collective: MPI cannot be used for that (the main thread is stuck
// inside it) and a stopped process cannot answer, but it stops rewriting its
// file. docs/design.md §8.
//
// Each rank's heartbeat thread rewrites DIR/rank-R every HEARTBEAT_WRITE_MS
// (in place, a fixed-size text record padded with spaces, opened and closed
// each time so that NFS's close-to-open consistency shows it to other hosts):
//     trident heartbeat 1
//     rank R
//     host H
//     pid P
//     seq N            (1, 2, ...: one per write)
//     time T           (Unix seconds of the write, by the writer's clock)
//     idle_s S         (the rank's seconds without progress, from its watchdog)
//     stopped_s G      (the last time this process did not run for G >=
//                       HEARTBEAT_STOPPED_GAP_MS: SIGSTOP, a debugger; 0: never)
//     stopped_until U  (Unix time that stop ended, by the writer's clock)
//     phase TEXT       (the rank's watchdog phase)
// heartbeat_survey reads every other rank's file twice, HEARTBEAT_SURVEY_MS
// apart: a file that did not change belongs to a rank that is stopped, dead,
// or whose file writes hang; one that says its process was stopped until
// after the surveying rank's progress ended belongs to a rank stopped and
// continued since (Open MPI continues every rank before it kills the job). The thread does all file I/O, so a hung file
// system stalls it, never the watchdog (the survey waits with a deadline).
#ifndef TRIDENT_HEARTBEAT_H
#define TRIDENT_HEARTBEAT_H

#include <stddef.h>

#include "common.h"

enum {
    HEARTBEAT_WRITE_MS = 400,  // a rank rewrites its file this often
    HEARTBEAT_SURVEY_MS = 1000, // between a survey's two reads (> 2 writes)
    HEARTBEAT_RECORD = 512,     // bytes of a record (phase cut to fit)
    HEARTBEAT_STOPPED_GAP_MS = 2000, // a 50 ms wait of the thread that took this long: a stop
};

struct heartbeat;

// Creates DIR (mode 0755, its parent must exist) if missing, writes this
// rank's first record (DIR/rank-RANK) and starts the thread. rank: this
// rank's world rank in [0, world_size); host: printed in the record.
// Returns STATUS_OK with *out set, or STATUS_RUNTIME with err naming the path
// and errno's text (no thread then, *out NULL).
enum status heartbeat_open(struct heartbeat **out, const char *dir, int rank, int world_size,
                           const char *host, struct error *err);
// What the next record says: the phase (copied, cut to fit) and the seconds
// without progress. Cheap (a copy under a lock); the watchdog calls it every tick.
void heartbeat_set(struct heartbeat *hb, const char *phase, double idle_s);
// Reads every other rank's file twice, HEARTBEAT_SURVEY_MS apart (this
// rank's writes go on meanwhile), and writes into msg (cap bytes, cut
// there) what it found: the ranks stopped (a file that did not change, or
// one whose stop ended less than my_idle_s ago: my_idle_s is the surveying
// rank's seconds without progress), named with rank, host, pid, the age of
// their last write and their last phase ("rank 1 (host h, pid 123) is
// stopped or dead: its heartbeat DIR/rank-1 did not change in 1.0 s (last
// written 4.2 s ago, in phase "...", 0.3 s without progress then)" or "rank
// 1 (host h, pid 123) was stopped for 4.0 s, until 0.2 s ago (...)"), the
// live ranks in a phase other than my_phase, the number of live ranks in
// my_phase and the ranks without a file. Returns the number of ranks found
// stopped, or -1 when the thread did not answer within wait_ms (a hung file
// system; msg says so).
int heartbeat_survey(struct heartbeat *hb, const char *my_phase, double my_idle_s, char *msg, size_t cap,
                     int wait_ms);
// A rank that ends the job for a failure only some ranks can see (an NCCL
// error on a communicator the others are not in: docs/design.md §8) announces
// it: DIR/failure is created, once per run (the first announcement wins;
// link(2) of a per-rank temporary file, so a reader never sees half a
// record), holding "rank R host H pid P" and msg. Every rank's heartbeat
// thread looks for it at each write (HEARTBEAT_WRITE_MS), so the others can
// name the failure before mpirun ends them. Synchronous (one small file);
// safe from any thread. NULL hb: nothing.
void heartbeat_announce(struct heartbeat *hb, const char *msg);
// Whether another rank's announcement was seen; if so writes "rank R (host
// H, pid P) ended the job: MSG" into msg (cap bytes) and returns 1, else 0.
// Cheap (a copy under the lock): the watchdog calls it every tick.
int heartbeat_peer_failure(struct heartbeat *hb, char *msg, size_t cap);
// Stops the thread (waiting up to 2 s for a write in progress; a thread stuck
// in a hung file system is left behind with its memory), removes this rank's
// file and the folder when it is empty then. NULL: nothing.
void heartbeat_close(struct heartbeat *hb);

#endif
