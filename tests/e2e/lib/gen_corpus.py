#!/usr/bin/env python3
import random, sys
# gen_corpus.py MB SEED: deterministic pseudo-English documents (blank-line separated) of about MB megabytes on stdout
mb, seed = float(sys.argv[1]), int(sys.argv[2])
r = random.Random(seed)
syl = "ba be bi bo bu da de di do ka ke ki ko la le li lo ma me mi mo na ne ni no ra re ri ro sa se si so ta te ti to va ve vi and the of unto".split()
words = ["".join(r.choice(syl) for _ in range(r.randint(1, 3))) for _ in range(20000)]
out, n, target = sys.stdout, 0, int(mb * 1e6)
while n < target:
    lines = []
    for _ in range(r.randint(1, 8)):
        s = " ".join(r.choice(words) for _ in range(r.randint(4, 20)))
        lines.append(s.capitalize() + r.choice(".,;:!?") + (" " + str(r.randint(0, 9999)) if r.random() < 0.2 else ""))
    doc = "\n".join(lines) + "\n\n"
    out.write(doc)
    n += len(doc)
