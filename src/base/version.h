// version.h: which trident this is: the release in the VERSION file and the
// git commit it was built from (`git describe --always --dirty` at build
// time; "unknown" in a build without .git). Both are compiled into
// src/base/version.c by the Makefile, which recompiles that one file when
// either changes.
#ifndef TRIDENT_VERSION_H
#define TRIDENT_VERSION_H

// The release, e.g. "0.1.0" (the VERSION file). Never NULL.
const char *version_release(void);
// The commit, e.g. "99b54b3" or "99b54b3-dirty" (tracked files changed), or
// "unknown". Never NULL.
const char *version_git(void);
// "trident 0.1.0 (git 99b54b3)": what `trident --version` prints, the first
// line of `trident train`'s log, config.ini's header and metrics.jsonl's
// start records. Never NULL.
const char *version_string(void);

#endif
