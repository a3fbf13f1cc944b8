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

from c_text import blank_comments

# The objects that may end the process, and why (docs/design.md §1, §8).
EXITS = {
    'src/base/common.o': 'fatal_exit: CHECK of an invariant, out of host memory',
    'src/base/mpi_util.o': 'mpi_fail (CHECK_MPI) and mpi_exit_all, called by src/cli/ only',
    'src/base/watchdog.o': 'the watchdog thread ends a stuck process',
    'src/ckpt/durable.o': 'TRIDENT_FAULT=kill:... (tests only) raises SIGKILL to simulate a crash',
    'src/cli/cmd_train.o': 'a second SIGINT aborts (its signal handler); a rank whose launcher died exits',
    'src/cli/cmd_prep.o': 'a second SIGINT aborts (its signal handler)',
}
EXIT_SYMBOLS = {'exit', '_exit', '_Exit', 'abort', 'quick_exit', 'MPI_Abort', 'err', 'errx', 'verr',
                'verrx', 'error', 'error_at_line', '__assert_fail', 'raise', 'kill', 'syscall',
                'pthread_exit'}
# #include "x.h" and #include <x.h> (a project header found through -Isrc -I.),
# and a header named in a string macro (#define GENERIC_FILE "x.h", then
# #include GENERIC_FILE), all after comments are stripped.
INCLUDE = re.compile(r'^[ \t]*#[ \t]*(?:include[ \t]*([<"])([^">\n]+)[">]|define[ \t]+\w+[ \t]+"([^"\n]+\.(?:h|cuh))")', re.M)
# fatal_exit's code: only STATUS_RUNTIME (a bug or no memory); an input error
# is a status returned to src/cli/.
FATAL = re.compile(r'\bfatal_exit\s*\(\s*([^,()]+),')
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


def strip_comments(text):
    """text with its comments blanked (newlines kept, so line numbers hold),
    string and character literals left as they are."""
    return blank_comments(text)


def resolve(root, path, name, angle=False):
    here = () if angle else (os.path.join(os.path.dirname(path), name),)
    for cand in here + (os.path.join('src', name), name):
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
        text = strip_comments(open(os.path.join(root, path), encoding='utf-8', errors='replace').read())
        src_folder = folder_of(path)
        for m in FATAL.finditer(text):
            if m.group(1).strip() not in ('STATUS_RUNTIME', 'int code'):
                errors.append('%s:%d: fatal_exit(%s, ...): only STATUS_RUNTIME (a bug, no memory); return '
                              'a status for anything else' % (path, text.count('\n', 0, m.start()) + 1,
                                                               m.group(1).strip()))
        for m in INCLUDE.finditer(text):
            lineno = text.count('\n', 0, m.start()) + 1
            angle, name = m.group(1) == '<', m.group(2) or m.group(3)
            target = resolve(root, path, name, angle)
            if target is None:
                if not angle:  # <stdio.h> and the like are not the tree's
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
    errors += check_map(root)
    for o in objects or ():
        errors += check_calls(root, o, rule)
    return errors


def check_map(root):
    """The module map of docs/design.md §1 names every .c file of each src/
    folder (its last column lists the stems) and no stem that is not there."""
    errors = []
    text = open(os.path.join(root, 'docs', 'design.md'), encoding='utf-8').read()
    rows = dict((m.group(1), m.group(2)) for m in
                re.finditer(r'^\| `src/(\w+)/` \|.*\| ([^|]+) \|$', text, re.M))
    for folder in sorted(os.listdir(os.path.join(root, 'src'))):
        d = os.path.join(root, 'src', folder)
        if not os.path.isdir(d):
            continue
        if folder not in rows:
            errors.append('src/%s/: no row in the module map of docs/design.md §1' % folder)
            continue
        named = set(w.strip() for w in rows[folder].split(','))
        have = set(f[:-2] for f in os.listdir(d) if f.endswith('.c'))
        for stem in sorted(have - named):
            errors.append('src/%s/%s.c: not named in the module map of docs/design.md §1' % (folder, stem))
        for stem in sorted(named - have):
            errors.append('docs/design.md §1 names src/%s/%s.c, which does not exist' % (folder, stem))
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
    ('an angle-bracket include of a project header', {'src/base/common.c': '#include <config/config.h>'},
     'base/ may not include config/'),
    ('an include behind a comment', {'src/base/common.c': '/**/ #include "train/train.h"'},
     'base/ may not include train/'),
    ('a header named in a string macro', {'kernels/ops.c': '#define GENERIC_FILE "train/plan.h"'},
     'kernels/ may not include train/'),
    # The checkpoint layer stores the state of data/ and train/ without
    # including them (docs/design.md §7, issue 27).
    ('ckpt/ including data/', {'src/ckpt/checkpoint.c': '#include "data/dataset.h"'},
     'ckpt/ may not include data/'),
    ('ckpt/ including train/', {'src/ckpt/checkpoint_read.c': '#include "train/trainer.h"'},
     'ckpt/ may not include train/'),
    ('a .c file the module map does not name', {'src/data/stray.c': 'int stray;'},
     'src/data/stray.c: not named in the module map'),
    ('fatal_exit choosing an exit code', {'src/data/index.c': 'void f(void) { fatal_exit(STATUS_BAD_INPUT, 0, 0, ""); }'},
     'fatal_exit(STATUS_BAD_INPUT'),
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
    ap.add_argument('--objects', action='append',
                    help='a build folder whose src/ and kernels/ objects form a call graph (repeatable)')
    ap.add_argument('--self-check', action='store_true')
    a = ap.parse_args()
    root = os.path.normpath(a.root)
    if a.self_check:
        failures = self_check(root)
        for f in failures:
            print('self-check FAILED: ' + f)
        if failures:
            return 1
        print('self-check: all %d planted faults caught (%s)' % (len(PLANTED) + 2, ', '.join(
            [w for w, _, _ in PLANTED] + ['a call cycle', 'a library exit()'])))
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
