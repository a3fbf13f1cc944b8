// watchdog.h: ends a stuck job. A background thread checks that the rank made
// progress (watchdog_kick, watchdog_phase) within the last timeout_s seconds
// (times the phase's allowance); when it did not (a hung peer, a lost
// message, a dead file system), it prints the rank, its host, the phase it
// was in and for how long, and exits the process with code 1, which makes
// mpirun or srun end every other rank ([system] watchdog_s; docs/design.md §8).
//
// The trainer names each phase (watchdog_phase: "step 12: forward, backward
// and gradient sync", "sampling", "evaluation", "checkpoint save of step
// 100", ...) and kicks inside long ones (every sampled token, every
// evaluation batch), so a legitimate long phase is progress. A rank's
// watchdog sees its own rank, and its peers through heartbeat files
// (watchdog_heartbeat, base/heartbeat.h): when it fires in a phase that
// waits on peers (a collective), it reads them and names the peers that are
// stopped or dead (rank, host, pid) and those alive in another phase. A
// process that was itself stopped (its watchdog thread did not tick for
// STOPPED_GAP_MS: SIGSTOP, a debugger) and fires once continued says so
// instead of blaming its peers.
#ifndef TRIDENT_WATCHDOG_H
#define TRIDENT_WATCHDOG_H

#include <stddef.h>

#include "common.h"

struct watchdog;

// Starts the thread; timeout_s <= 0 returns NULL (no watchdog), as do the
// other functions on NULL. rank is only printed. The phase is "start".
struct watchdog *watchdog_start(double timeout_s, int rank);
// Records progress now (the phase stays).
void watchdog_kick(struct watchdog *w);
// Enters a phase and records progress now. phase: what this rank does from
// now on, printed if the watchdog fires (copied, truncated to 127 bytes).
// allowance >= 1: the phase may go without progress for allowance x
// timeout_s (the first step, which allocates and sets up communicators:
// docs/design.md §8); 1 for every other phase. peers: the phase waits on
// other ranks (a collective, a barrier), so the message blames a peer; it
// fires 1 s later than allowance x timeout_s, so that a stuck rank that timed
// out at the same moment names its own phase first.
void watchdog_phase(struct watchdog *w, const char *phase, double allowance, int peers);
// The most checks one watchdog holds (watchdog_add_check).
enum { WATCHDOG_MAX_CHECKS = 8 };

// A check the watchdog runs on its own thread at every tick (every 0.2 s),
// e.g. polling NCCL's asynchronous errors (ncclCommGetAsyncError) while the
// main thread is stuck in a wait. It returns 0 when all is well; non-zero
// ends the job as a timeout does: the watchdog prints "trident: [rank R, host
// H] watchdog: <msg>; ending the job" on stderr and exits the process with 1
// 1.5 s later (_exit: mpirun or srun ends the other ranks; Open MPI does so
// within milliseconds of the first exit, so the wait lets the other ranks
// whose checks fail too print theirs). msg: a NUL-terminated reason
// the check writes, at most cap bytes with the NUL (cap >= 256; text past it
// is cut). The check must be quick, thread-safe against the main thread's
// use of ctx, and must not call the watchdog's functions (the watchdog's lock
// is held while it runs). Checks run in the order added.
// Returns 0, or -1 when w already holds WATCHDOG_MAX_CHECKS checks (nothing
// added). On w == NULL (no watchdog: [system] watchdog_s = 0) it returns 0
// and the check never runs.
int watchdog_add_check(struct watchdog *w, int (*check)(void *ctx, char *msg, size_t cap), void *ctx);
// Starts this rank's heartbeat file DIR/rank-R (DIR created if missing, its
// parent must exist; rewritten every HEARTBEAT_WRITE_MS by a thread of its
// own, removed by watchdog_stop) and lets the watchdog read the files of
// ranks 0 .. world_size - 1 when it fires in a phase that waits on peers.
// Call it once every rank's DIR is this job's (the run folder is locked).
// Returns STATUS_OK (also on w == NULL), or STATUS_RUNTIME with err naming
// the path and errno's text (the watchdog goes on without heartbeats).
enum status watchdog_heartbeat(struct watchdog *w, const char *dir, int world_size, struct error *err);
// Stops and joins the thread (and the heartbeat's: base/heartbeat.h).
void watchdog_stop(struct watchdog *w);

#endif
