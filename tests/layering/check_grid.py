#!/usr/bin/env python3
"""check_grid.py: the grid's axes are written once (docs/design.md §2,
"Adding an axis"): src/parallel/axes_list.h lists them, and only the grid
module (src/parallel/topology.c, topology.h, axes_list.h) turns sizes into
ranks. In every other file of src/ and kernels/ (comments and string
literals stripped, so messages and docs may name the keys) this fails on
  - a product of three or more of the axes' sizes (`tp * pp * dp`,
    `(long long)p->tp * p->pp * p->dp`, in any order): the world size,
    topology_world_size's;
  - Megatron's rank formula written out (`t + tp * (d + dp * p)`: an
    addition followed by a size times a parenthesis);
  - a coordinate taken from a rank by hand (`rank % tp`, `rank / (tp * dp)`,
    `(rank / tp) % dp`): topology_coord_of's.
A size is any name ending in an axis or data-group name (tp, pp, dp,
dp_shard, dp_replicate, cp, ep), as a variable or a member (`l->tp`,
`c.parallel.dp`). --self-check plants one of each in a copy of the tree
and fails unless all three are caught.
Exit 0 clean, 1 violations (each printed with file:line)."""
import os
import re
import shutil
import sys
import tempfile

from c_text import blank_comments

GRID_MODULE = {'src/parallel/topology.c', 'src/parallel/topology.h', 'src/parallel/axes_list.h'}
AXES = r'(?:tp|pp|dp|dp_shard|dp_replicate|cp|ep)'
# a size: optional cast, then a name or member chain ending in an axis name
SIZE = r'(?:\(\s*(?:long long|long|int64_t|int|size_t|double|unsigned)\s*\)\s*)?' \
       r'(?:[A-Za-z_]\w*(?:\[[^\]]*\])?\s*(?:\.|->)\s*)*' + AXES + r'\b'
SIZE_NAME = re.compile(r'(' + AXES + r')\b\s*$')
PRODUCT = re.compile(r'(?<![\w.>])' + SIZE + r'(?:\s*\*\s*' + SIZE + r'){2,}')
RANK_FORMULA = re.compile(r'\+\s*' + SIZE + r'\s*\*\s*\(')
RANK = r'\b(?:rank|world_rank|global_rank|r)\b'
COORD_OF_RANK = re.compile(RANK + r'\s*[%/]\s*\(?\s*' + SIZE + '|' +
                           r'\(\s*' + RANK + r'\s*/[^()]*\)\s*%\s*' + SIZE)


def strip(text):
    """text with comments and string/char literals blanked (newlines kept)."""
    return blank_comments(text, blank_strings=True)


def code_files(root):
    for top in ('src', 'kernels'):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if re.search(r'\.(c|h|cu|cuh|cpp)$', f):
                    p = os.path.join(d, f)
                    yield os.path.relpath(p, root), strip(open(p, errors='replace').read())


def distinct_sizes(expr):
    names = set()
    for part in expr.split('*'):
        m = SIZE_NAME.search(part.strip())
        if m:
            names.add(m.group(1))
    return names


def check(root):
    errors = []
    for path, code in code_files(root):
        if path in GRID_MODULE:
            continue
        for lineno, line in enumerate(code.split('\n'), 1):
            where = '%s:%d: ' % (path, lineno)
            for m in PRODUCT.finditer(line):
                if len(distinct_sizes(m.group(0))) >= 3:
                    errors.append(where + 'the axes\' product by hand: `%s` (topology_world_size)' % m.group(0))
            for m in RANK_FORMULA.finditer(line):
                errors.append(where + 'a rank formula by hand: `%s...` (topology_rank_of)' % m.group(0))
            for m in COORD_OF_RANK.finditer(line):
                errors.append(where + 'a coordinate of a rank by hand: `%s` (topology_coord_of)' % m.group(0))
    return errors


PLANTED = {
    'product': 'static int planted_world(const struct config *c) { return (long long)c->parallel.tp * c->parallel.dp * c->parallel.pp; }\n',
    'rank formula': 'static int planted_rank(int t, int d, int p, int tp, int dp) { return t + tp * (d + dp * p); }\n',
    'coordinate': 'static int planted_coord(int rank, int tp, int dp) { return (rank / tp) % dp; }\n',
}


def self_check(root):
    tmp = tempfile.mkdtemp(prefix='grid-')
    try:
        t = os.path.join(tmp, 'tree')
        for top in ('src', 'kernels'):
            shutil.copytree(os.path.join(root, top), os.path.join(t, top))
        with open(os.path.join(t, 'src', 'train', 'plan.c'), 'a') as f:
            f.write('\n' + ''.join(PLANTED.values()))
        errs = check(t)
        missed = [k for k, want in (('product', "product by hand"), ('rank formula', 'rank formula by hand'),
                                    ('coordinate', 'coordinate of a rank by hand'))
                  if not any(e.startswith('src/train/plan.c') and want in e for e in errs)]
        return ['planted %s not caught: %s' % (k, errs) for k in missed]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    failures = self_check(root) if '--self-check' in sys.argv else []
    for f in failures:
        print('self-check FAILED: ' + f)
    if '--self-check' in sys.argv and not failures:
        print('self-check: a hand-written axes product, rank formula and coordinate are caught')
    errors = check(root)
    for e in errors:
        print(e)
    print('grid: %s' % ('no axis maths outside the grid module' if not errors else '%d violation(s)' % len(errors)))
    return 1 if errors or failures else 0


if __name__ == '__main__':
    sys.exit(main())
