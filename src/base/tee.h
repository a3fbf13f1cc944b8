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

#include "common.h"

// Opens path for appending (created 0644) and from now on copies to it what
// this process prints through stdout (line-buffered) and stderr (unbuffered).
// What bypasses stdio (a write to fd 1 or 2, a child process) is not copied.
// A second call while a tee is open first closes it.
// Errors: STATUS_RUNTIME naming path when it cannot be opened for appending
// (stdout and stderr are left as they were).
enum status tee_stdio_open(const char *path, struct error *err);

// Flushes, puts the original stdout and stderr back and closes the log.
// Nothing happens when no tee is open.
void tee_stdio_close(void);

#endif
