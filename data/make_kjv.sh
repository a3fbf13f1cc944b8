#!/usr/bin/env bash
# make_kjv.sh: the default corpus, the King James Bible from Debian's bible-kjv
# package, as data/kjv.txt: one document per chapter (1189 of them), its verses
# one per line without their references, documents separated by a blank line.
# Idempotent: does nothing when data/kjv.txt is already complete.
# Usage: data/make_kjv.sh [OUT]   (default: data/kjv.txt next to this script)
set -euo pipefail
out=${1:-"$(cd "$(dirname "$0")" && pwd)/kjv.txt"}
if [ -s "$out" ] && [ "$(tail -n 1 "$out")" = "The grace of our Lord Jesus Christ be with you all. Amen." ]; then
    echo "make_kjv: $out exists"
    exit 0
fi
if ! command -v bible >/dev/null; then
    echo "make_kjv: the 'bible' program is missing: install Debian's bible-kjv (scripts/deps.sh)" >&2
    exit 2
fi
# bible -f prints one verse per line as "<Book><chapter>:<verse> <text>", e.g.
# "Ge1:1 In the beginning ..." or "1Sm3:4 That the LORD called Samuel ...".
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
bible -f "Genesis 1:1 - Revelation 22:21" | awk '
    {
        ref = $1
        chapter = ref; sub(/:[0-9]+$/, "", chapter)
        if (chapter != last) { if (NR > 1) print ""; last = chapter; n++ }
        sub(/^[^ ]+ /, "")
        print
    }
    END { if (n != 1189) { print "make_kjv: found " n " chapters, expected 1189" > "/dev/stderr"; exit 1 } }
' > "$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "make_kjv: wrote $out ($(wc -c < "$out") bytes, 1189 chapters)"
