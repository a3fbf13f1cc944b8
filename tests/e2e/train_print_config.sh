#!/usr/bin/env bash
# train_print_config.sh: `trident train --print-config CONFIG [overrides]`
# prints the resolved config and exits 0 without training, without mpirun:
# every key of docs/config.md once, each with where its value came from, as
# checked here against the file itself: a key set in configs/tiny.ini names
# that file and the line grep finds it on, an override names its argument,
# a key the file leaves out says default. The printed text loads back (it is
# an INI file whose origins are inline comments) to the same values. A bad
# config exits 2 naming the key; no run folder is made. FP8 keys that
# precision.fp8 = none leaves unread are a warning on stderr, not an error.
# --world-size N validates the layout as a run of N ranks: dp = 0 prints the
# inferred dp (4 ranks / tp 2 = 2); a layout of other size exits 2 naming N
# (and configs/mixtral-8x7b.ini's ep = 8, which needs dp >= 8, prints at 32
# ranks though not without N); without --print-config it is refused.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
ini=configs/tiny.ini
rc=0
out=$(cd "$tmp" && "$TRIDENT" train --print-config "$OLDPWD/$ini" train.lr=1e-3 log.run_dir="$tmp/never" 2>&1) || rc=$?
[ "$rc" -eq 0 ] || { echo "$out"; fail "--print-config exited $rc"; }
[ ! -e "$tmp/never" ] || fail "--print-config made the run folder"
printf '%s\n' "$out" > "$tmp/printed.ini"
# Every key of docs/config.md (its tables' first column) exactly once, per section.
python3 - "$tmp/printed.ini" "$PWD/$ini" docs/config.md <<'PY'
import re, sys
printed, ini, docs = sys.argv[1:]
want = []
section = None
for line in open(docs):
    m = re.match(r"## \[(\w+)\]", line)
    if m: section = m.group(1)
    m = re.match(r"\| `(\w+)` \|", line)
    if m and section: want.append((section, m.group(1)))
got = {}
section = None
for line in open(printed):
    m = re.match(r"\[(\w+)\]$", line)
    if m: section = m.group(1); continue
    m = re.match(r"#? ?(\w+) = (.*?)(?:    |, )# (.+)$", line)
    if m:
        key = (section, m.group(1))
        assert key not in got, f"{key} printed twice"
        got[key] = (m.group(2), m.group(3))
missing = [k for k in want if k not in got]
assert not missing, f"keys not printed with an origin: {missing}"
assert len(got) == len(want), f"{len(got)} keys printed, docs/config.md has {len(want)}"
# The file's own lines, found independently: key -> line number within its section.
lines, section = {}, None
for no, line in enumerate(open(ini), 1):
    m = re.match(r"\[(\w+)\]", line)
    if m: section = m.group(1); continue
    m = re.match(r"(\w+)\s*=", line)
    if m: lines[(section, m.group(1))] = no
for key, (value, origin) in got.items():
    if key == ("train", "lr"):
        assert value == "0.001" and origin == "command line argument 1", (key, value, origin)
    elif key == ("log", "run_dir"):
        assert origin == "command line argument 2", (key, origin)
    elif key in lines:
        assert origin.endswith(f"{ini.split('/')[-1]}:{lines[key]}"), (key, origin, lines[key])
    else:
        assert origin == "default", (key, origin)
print(f"ok: {len(got)} keys, {sum(1 for k in got if k in lines)} from the file, 2 overrides, the rest default")
PY
# Round trip: the printed text is a config that prints the same values.
"$TRIDENT" train --print-config "$tmp/printed.ini" > "$tmp/again.ini" || fail "the printed config does not load back"
diff <(sed -n 's/ *# .*//p; /^\[/p' "$tmp/printed.ini" | grep -v '^#') \
     <(sed -n 's/ *# .*//p; /^\[/p' "$tmp/again.ini" | grep -v '^#') > /dev/null ||
    fail "values differ after a round trip"
# --print-config after the config and overrides prints the same.
"$TRIDENT" train "$ini" train.lr=1e-3 --print-config > "$tmp/late.ini" || fail "--print-config last on the line failed"
diff <("$TRIDENT" train --print-config "$ini" train.lr=1e-3) "$tmp/late.ini" > /dev/null ||
    fail "--print-config last on the line printed something else"
# A bad value: exit 2, the key named, nothing printed on stdout.
rc=0
bad=$("$TRIDENT" train --print-config "$ini" model.init_std=1e300 2>&1 >/dev/null) || rc=$?
[ "$rc" -eq 2 ] && grep -q 'model.init_std = 1e+300' <<<"$bad" || fail "bad config: exit $rc: $bad"
# FP8 keys set while precision.fp8 = none: exit 0, the config printed, a
# warning naming them on stderr (not on stdout, which stays an INI file).
rc=0
"$TRIDENT" train --print-config "$ini" precision.fp8_amax_history_len=16 >"$tmp/fp8.ini" 2>"$tmp/fp8.err" || rc=$?
[ "$rc" -eq 0 ] && grep -q '^fp8_amax_history_len = 16 ' "$tmp/fp8.ini" &&
    grep -q '^trident: warning: precision.fp8_amax_history_len = 16 (command line argument 1): has no effect with precision.fp8 = none' "$tmp/fp8.err" &&
    ! grep -q 'warning' "$tmp/fp8.ini" || fail "fp8 keys with fp8 = none: exit $rc: $(cat "$tmp/fp8.err")"
# --world-size
dp_of() { sed -n '/^\[parallel\]/,/^\[/s/^dp = \([0-9]*\) .*/\1/p'; }
got=$("$TRIDENT" train --print-config "$ini" --world-size 4 parallel.tp=2 parallel.dp=0 | dp_of)
[ "$got" = 2 ] || fail "--world-size 4, tp 2, dp 0: printed dp '$got', want 2"
rc=0; err=$("$TRIDENT" train --print-config "$ini" --world-size 3 2>&1 >/dev/null) || rc=$?
[ "$rc" -eq 2 ] && grep -q 'world size is N = 3 ranks' <<<"$err" || fail "--world-size 3 for 2 ranks: exit $rc: $err"
"$TRIDENT" train --print-config configs/mixtral-8x7b.ini --world-size 32 system.device=cpu > "$tmp/moe.ini" ||
    fail "mixtral at 32 ranks: --print-config --world-size 32 refused it"
[ "$(dp_of < "$tmp/moe.ini")" = 8 ] || fail "mixtral at 32 ranks (pp 4): dp $(dp_of < "$tmp/moe.ini"), want 8"
rc=0; err=$("$TRIDENT" train "$ini" --world-size 2 2>&1) || rc=$?
[ "$rc" -eq 2 ] && grep -q -- '--world-size 2: an option of --print-config' <<<"$err" ||
    fail "train --world-size without --print-config: exit $rc: $err"
echo "PASS: train_print_config"
