// tee.h: a copy of this process's stdout and stderr in a log file, as `tee -a`
// would make it, without a second process or thread: stdout and stderr are
// replaced by streams (fopencookie) whose every write goes to the original
// file descriptor (1 or 2) and then to the log. The trainer's rank 0 uses it
// for <run_dir>/train.log (docs/design.md §9), so that the startup lines, the
// step lines and a failing run's error message land there in the order they
// were printed, and a message written just before an abort is not lost
// (nothing waits in a pipe).
#ifndef TRIDENT_TEE_H
#define TRIDENT_TEE_H

#include <stdbool.h>

#include "common.h"

// Opens path for appending (created 0644) and from now on copies to it what
// this process prints through stdout (line-buffered) and stderr (unbuffered).
// What bypasses stdio (a write to fd 1 or 2, a child process) is not copied.
// A second call while a tee is open first closes it.
// Errors: STATUS_RUNTIME naming path when it cannot be opened for appending
// (stdout and stderr are left as they were).
enum status tee_stdio_open(const char *path, struct error *err);

// Async-signal-safe; called by a stop signal's handler. From now on a write
// to the original stdout or stderr that finds no room for 0.2 s is given up
// (the log still gets it): the launcher may have stopped reading (Open MPI's
// mpirun, signalled itself, stops reading its ranks' output about
// odls_base_sigkill_timeout seconds before it SIGKILLs them). Before it,
// a full pipe waits as a plain write would, in 0.2 s polls.
void tee_stdio_best_effort(void);

// True when the tee's stdout gave up on its original descriptor (above):
// a line the user must see (why the run stopped) then goes to stderr too.
bool tee_stdout_given_up(void);

// Flushes, puts the original stdout and stderr back and closes the log.
// Nothing happens when no tee is open.
void tee_stdio_close(void);

#endif
