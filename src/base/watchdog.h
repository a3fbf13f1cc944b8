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
// watchdog sees only its own rank: when it fires in a phase that waits on
// peers (a collective), the message says so: a peer did not reach it.
#ifndef TRIDENT_WATCHDOG_H
#define TRIDENT_WATCHDOG_H

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
// Stops and joins the thread.
void watchdog_stop(struct watchdog *w);

#endif
