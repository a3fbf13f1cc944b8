// version.c: the release and commit compiled in (version.h). The Makefile
// passes TRIDENT_RELEASE and TRIDENT_GIT to this file alone.
#include "version.h"

#ifndef TRIDENT_RELEASE
#define TRIDENT_RELEASE "unknown"
#endif
#ifndef TRIDENT_GIT
#define TRIDENT_GIT "unknown"
#endif

const char *version_release(void) { return TRIDENT_RELEASE; }

const char *version_git(void) { return TRIDENT_GIT; }

const char *version_string(void) { return "trident " TRIDENT_RELEASE " (git " TRIDENT_GIT ")"; }
