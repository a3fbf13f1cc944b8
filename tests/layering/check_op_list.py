#!/usr/bin/env python3
"""check_op_list.py: an op's signature is written once (docs/design.md §3,
"Adding an op"). For every X(name, ...) of kernels/ops_list.h, the code of
src/, kernels/ and tests/ (comments stripped) names cpu_<name> in exactly one
file, a kernels/cpu/*.c that defines it, and cuda_<name> in exactly one
kernels/cuda/*.cu; no hand-written table sets `.<name> =`. A table entry,
prototype or rename written by hand for an op would be a fourth place to edit
and fails here. --self-check plants a hand-written prototype and table entry
in a copy of the tree and fails unless both are caught.
Exit 0 clean, 1 violations (each printed)."""
import os
import re
import shutil
import sys
import tempfile

COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/', re.S)


def ops(root):
    text = open(os.path.join(root, 'kernels', 'ops_list.h')).read()
    names = re.findall(r'^\s*X\((\w+),', text, re.M)
    if not names:
        sys.exit('check_op_list: no X(name, ...) rows in kernels/ops_list.h')
    return names


def code_files(root):
    for top in ('src', 'kernels', 'tests'):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if re.search(r'\.(c|h|cu|cuh|cpp)$', f):
                    p = os.path.join(d, f)
                    yield os.path.relpath(p, root), COMMENT.sub('', open(p, errors='replace').read())


def check(root):
    errors = []
    files = list(code_files(root))
    for op in ops(root):
        for prefix, folder, ext in (('cpu', 'kernels/cpu/', '.c'), ('cuda', 'kernels/cuda/', '.cu')):
            name = '%s_%s' % (prefix, op)
            sym = re.compile(r'\b%s\b' % name)
            # the substring test first: the same files, the regex only where it can match
            where = [p for p, code in files if name in code and sym.search(code)]
            if len(where) != 1 or not (where[0].startswith(folder) and where[0].endswith(ext)):
                errors.append('%s_%s is named in %s; expected only its definition in one %s*%s'
                              % (prefix, op, where or 'no file', folder, ext))
        entry = re.compile(r'\.%s\s*=' % op)
        for p, code in files:
            if '.' + op in code and entry.search(code):
                errors.append('%s: a hand-written table entry .%s = (tables come from ops_list.h)' % (p, op))
    return errors


def self_check(root):
    tmp = tempfile.mkdtemp(prefix='oplist-')
    try:
        t = os.path.join(tmp, 'tree')
        for top in ('src', 'kernels', 'tests'):
            shutil.copytree(os.path.join(root, top), os.path.join(t, top),
                            ignore=shutil.ignore_patterns('fixtures', '*.h5'))
        op = ops(t)[0]
        with open(os.path.join(t, 'kernels', 'cpu', 'cpu.h'), 'a') as f:
            f.write('\nvoid cpu_%s(void);\n' % op)
        with open(os.path.join(t, 'kernels', 'cpu', 'cpu_table.c'), 'a') as f:
            f.write('\nstatic const struct { void *%s; } extra = { .%s = 0 };\n' % (op, op))
        errs = check(t)
        caught = any('cpu_%s is named in' % op in e for e in errs) and any('.%s =' % op in e for e in errs)
        return [] if caught else ['a hand-written prototype and table entry for %s were not caught: %s' % (op, errs)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    failures = self_check(root) if '--self-check' in sys.argv else []
    for f in failures:
        print('self-check FAILED: ' + f)
    if '--self-check' in sys.argv and not failures:
        print('self-check: a hand-written prototype and table entry are caught')
    errors = check(root)
    for e in errors:
        print(e)
    print('op list: %d ops, %s' % (len(ops(root)), 'each written once' if not errors else '%d violation(s)' % len(errors)))
    return 1 if errors or failures else 0


if __name__ == '__main__':
    sys.exit(main())
