#!/usr/bin/env python3
"""check_layering.py: the layering rule of docs/design.md §1, checked.

Reads the rule table between the `layering:begin` and `layering:end` markers
of docs/design.md (each row: a folder, then the folders it may include), then
every `#include "..."` of src/, kernels/ and their subfolders, and fails on:
  - a source file directly in src/ (every file belongs to a subsystem folder),
  - a folder of src/ that the rule does not name,
  - an include that the rule does not allow (folder A including folder B),
  - an include that resolves to no file of the tree,
  - a cycle in the rule itself, or between files that include each other
    through any chain,
  - with --objects DIR: a call cycle between object files, from `nm` (an
    object that defines a symbol another one uses is called by it), and a
    process exit outside src/cli/: only the objects of EXITS may call
    exit, _exit, abort or MPI_Abort, and only src/cli/ may call
    mpi_exit_all (the whole-job exit), so library code returns a status.
--self-check runs the checks on copies of the tree with one bad include, one
include cycle and one call cycle added, and fails unless each is caught.
Exit 0 clean, 1 violations (each printed), 2 usage or a bad rule table.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The objects that may end the process, and why (docs/design.md §1, §8).
EXITS = {
    'src/base/common.o': 'fatal_exit: CHECK of an invariant, out of host memory',
    'src/base/mpi_util.o': 'mpi_fail (CHECK_MPI) and mpi_exit_all, called by src/cli/ only',
    'src/base/watchdog.o': 'the watchdog thread ends a stuck process',
}
EXIT_SYMBOLS = {'exit', '_exit', '_Exit', 'abort', 'quick_exit', 'MPI_Abort'}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = re.compile(r'\.(c|h|cu|cuh|cpp)$')


def read_rule(design):
    text = open(design, encoding='utf-8').read()
    m = re.search(r'layering:begin.*?\n(.*?)\n[^\n]*layering:end', text, re.S)
    if not m:
        sys.exit('check_layering: %s has no layering:begin/end table' % design)
    rule = {}
    for line in m.group(1).splitlines():
        words = line.replace(',', ' ').split()
        if not words or words[0].startswith(('folder', '#', '`', '-', '<')):
            continue
        rule[words[0]] = set(w for w in words[1:] if w not in ('(nothing)', '-'))
    for f, allowed in rule.items():
        unknown = allowed - set(rule)
        if unknown:
            sys.exit('check_layering: rule row %s names unknown folders %s' % (f, sorted(unknown)))
    return rule


def folder_of(path):
    parts = path.split('/')
    if parts[0] == 'src' and len(parts) > 2:
        return parts[1]
    if parts[0] == 'kernels':
        return 'kernels'
    return None


def sources(root):
    out = []
    for top in ('src', 'kernels'):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if SOURCE.search(f):
                    out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def resolve(root, path, name):
    for cand in (os.path.join(os.path.dirname(path), name), os.path.join('src', name), name):
        cand = os.path.normpath(cand)
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def cycles(graph):
    """The strongly connected components of graph (node -> set of nodes) that
    hold more than one node, each as a sorted list: every cycle lies in one."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(n):  # Tarjan 1972, iterative over the successors
        index[n] = low[n] = len(index)
        stack.append(n)
        on.add(n)
        for m in sorted(graph.get(n, ())):
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in on:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            comp = []
            while True:
                m = stack.pop()
                on.discard(m)
                comp.append(m)
                if m == n:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for n in sorted(graph):
        if n not in index:
            visit(n)
    return out


def check(root, objects=None):
    errors = []
    rule = read_rule(os.path.join(root, 'docs', 'design.md'))
    for c in cycles(rule):
        errors.append('the rule itself has a cycle among: %s' % ', '.join(c))
    for f in sorted(os.listdir(os.path.join(root, 'src'))):
        p = os.path.join(root, 'src', f)
        if os.path.isfile(p) and SOURCE.search(f):
            errors.append('src/%s: a file directly in src/; put it in its subsystem folder' % f)
        elif os.path.isdir(p) and f not in rule:
            errors.append('src/%s/: a folder the rule in docs/design.md does not name' % f)
    includes = {}
    for path in sources(root):
        text = open(os.path.join(root, path), encoding='utf-8', errors='replace').read()
        src_folder = folder_of(path)
        for lineno, name in ((text.count('\n', 0, m.start()) + 1, m.group(1)) for m in INCLUDE.finditer(text)):
            target = resolve(root, path, name)
            if target is None:
                errors.append('%s:%d: #include "%s" is no file of the tree' % (path, lineno, name))
                continue
            dst_folder = folder_of(target)
            if dst_folder is None:
                errors.append('%s:%d: #include "%s" reaches outside src/ and kernels/' % (path, lineno, name))
            elif dst_folder != src_folder and dst_folder not in rule.get(src_folder, ()):
                errors.append('%s:%d: #include "%s": %s/ may not include %s/ (docs/design.md §1)'
                              % (path, lineno, name, src_folder, dst_folder))
            if target != path:
                includes.setdefault(path, set()).add(target)
    for c in cycles(includes):
        errors.append('include cycle among files: %s' % ', '.join(c))
    if objects:
        errors += check_calls(root, objects, rule)
    return errors


def check_calls(root, objects, rule):
    """Call graph between object files from nm: U symbol -> the object with T."""
    defs, uses = {}, {}
    objs = []
    for top in ('src', 'kernels'):
        for d, _, files in os.walk(os.path.join(objects, top)):
            for f in files:
                rel = os.path.relpath(os.path.join(d, f[:-2]), objects).replace('cpu-serial', 'cpu')
                # Only objects of sources that still exist: a stale object of
                # a removed or renamed file would add edges the code lacks.
                if f.endswith('.o') and any(os.path.isfile(os.path.join(root, rel + e)) for e in ('.c', '.cu')):
                    objs.append(os.path.join(d, f))
    if not objs:
        return ['%s: no object files (build first)' % objects]
    for o in sorted(objs):
        out = subprocess.run(['nm', o], capture_output=True, text=True, check=True).stdout
        name = os.path.relpath(o, objects)
        for line in out.splitlines():
            w = line.split()
            if len(w) == 3 and w[1] in 'TDBR':
                defs.setdefault(w[2], name)
            elif len(w) == 2 and w[0] == 'U':
                uses.setdefault(name, set()).add(w[1])
    errors = []
    for o, syms in sorted(uses.items()):
        for sym in sorted(syms & EXIT_SYMBOLS):
            if o not in EXITS:
                errors.append('%s calls %s: library code returns a status; only src/cli/ ends the job' % (o, sym))
        if 'mpi_exit_all' in syms and not o.startswith('src/cli/'):
            errors.append('%s calls mpi_exit_all: only src/cli/ decides how the job ends' % o)
    graph = {}
    for o, syms in uses.items():
        for s in syms:
            d = defs.get(s)
            if d and d != o:
                graph.setdefault(o, set()).add(d)
    return errors + ['call cycle among object files: %s' % ', '.join(c) for c in cycles(graph)]


# Faults planted by --self-check: (what, {path: text appended}, the message
# that must appear). The second is the test-only include against the rule.
PLANTED = [
    ('a kernels/ -> config/ include', {'kernels/ops.c': '#include "config/config.h"'},
     'kernels/ may not include config/'),
    ('a base/ -> model/ include', {'src/base/common.c': '#include "model/model.h"'},
     'base/ may not include model/'),
    ('an include cycle rng.h <-> watchdog.h',
     {'src/base/rng.h': '#include "watchdog.h"', 'src/base/watchdog.h': '#include "rng.h"'},
     'include cycle'),
    ('a file directly in src/', {'src/stray.c': 'int stray;'}, 'src/stray.c'),
]


def self_check(root):
    """The checks must catch every planted fault."""
    failures = []
    tmp = tempfile.mkdtemp(prefix='layering-')
    try:
        for what, plant, expect in PLANTED:
            t = os.path.join(tmp, 'tree')
            shutil.rmtree(t, ignore_errors=True)
            for top in ('src', 'kernels', 'docs'):
                shutil.copytree(os.path.join(root, top), os.path.join(t, top))
            for path, text in plant.items():
                with open(os.path.join(t, path), 'a') as f:
                    f.write('\n%s\n' % text)
            errs = check(t)
            if not any(expect in e for e in errs):
                failures.append('%s was not caught: %s' % (what, errs))
        # 5. A call cycle between two objects.
        cc = shutil.which('cc') or shutil.which('gcc')
        if cc is None:
            failures.append('no C compiler for the call-cycle self-check')
        else:
            od = os.path.join(tmp, 'objs')
            sd = os.path.join(od, 'src')
            os.makedirs(sd)
            open(os.path.join(sd, 'a.c'), 'w').write('int b(int);\nint a(int x) { return x ? b(x - 1) : 0; }\n')
            open(os.path.join(sd, 'b.c'), 'w').write('int a(int);\nint b(int x) { return x ? a(x - 1) : 1; }\n')
            open(os.path.join(sd, 'c.c'), 'w').write('#include <stdlib.h>\nvoid c(void) { exit(1); }\n')
            for n in ('a', 'b', 'c'):
                subprocess.run([cc, '-c', os.path.join(sd, n + '.c'), '-o', os.path.join(sd, n + '.o')], check=True)
            errs = check_calls(od, od, {})
            if not any('call cycle' in e for e in errs):
                failures.append('a call cycle a.o <-> b.o was not caught: %s' % errs)
            if not any('src/c.o calls exit' in e for e in errs):
                failures.append('a library exit() in c.o was not caught: %s' % errs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--root', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    ap.add_argument('--objects', help='build folder whose src/ and kernels/ objects form the call graph')
    ap.add_argument('--self-check', action='store_true')
    a = ap.parse_args()
    root = os.path.normpath(a.root)
    if a.self_check:
        failures = self_check(root)
        for f in failures:
            print('self-check FAILED: ' + f)
        if failures:
            return 1
        print('self-check: a bad include, an include cycle, a file in src/, a call cycle and a library exit are each caught')
    errors = check(root, a.objects)
    for e in errors:
        print(e)
    if errors:
        print('%d layering violation(s)' % len(errors))
        return 1
    print('layering: clean (%d files)' % len(sources(root)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
