// watchdog.h: ends a stuck job. A background thread checks that the rank made
// progress (watchdog_kick) within the last timeout_s seconds; when it did
// not (a hung peer, a lost message, a dead file system), it prints which rank
// and how long, and exits the process with code 1, which makes mpirun or
// srun end every other rank ([system] watchdog_s).
#ifndef TRIDENT_WATCHDOG_H
#define TRIDENT_WATCHDOG_H

struct watchdog;

// Starts the thread; timeout_s <= 0 returns NULL (no watchdog), as do the
// other functions on NULL. rank is only printed.
struct watchdog *watchdog_start(double timeout_s, int rank);
// Records progress now.
void watchdog_kick(struct watchdog *w);
// Stops and joins the thread.
void watchdog_stop(struct watchdog *w);

#endif
