#!/usr/bin/env bash
# cli_docs.sh: each subcommand's flags are rows of a flag table parsed by one
# function (src/cli/cli_flags.h, cli_parse), and the docs come from the rows:
#  (a) docs/cli.md is `trident --help-markdown`, the tables as Markdown
#      (regenerate: build/trident --help-markdown > docs/cli.md);
#  (b) every row of docs/cli.md is in its command's `--help`, with its default;
#  (c) the parser refuses with exit 2, naming the flag, the value found and
#      what it takes: an unknown flag, a flag without its value, an integer out
#      of range, a number that is not one, an enum value that is none of its
#      choices, a missing and an extra positional argument;
#  (d) no source of a table's command compares an argument with a "--flag"
#      by hand (a new flag is a new row).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
"$TRIDENT" --help-markdown > "$tmp/cli.md"
diff -u docs/cli.md "$tmp/cli.md" > "$tmp/diff" ||
    { head -40 "$tmp/diff"; fail "(a) docs/cli.md differs from the flag tables: build/trident --help-markdown > docs/cli.md"; }
echo "(a) docs/cli.md = the flag tables"

# (b) rows of docs/cli.md in `trident COMMAND --help`
python3 - "$TRIDENT" docs/cli.md <<'PY'
import re, subprocess, sys
trident, md = sys.argv[1], open(sys.argv[2]).read()
n = 0
for sec in re.split(r"^## trident ", md, flags=re.M)[1:]:
    name = sec.split("\n", 1)[0]
    out = subprocess.run([trident, *name.split()[:1], "--help"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("usage: trident " + name.split()[0]), f"{name}: {out[:80]!r}"
    for m in re.finditer(r"^\| `([^`]+)` \| [^|]* \| (?:[^|\\]|\\.)* \| ([^|]*) \|", sec, flags=re.M):
        label, default = m.group(1), m.group(2).strip().strip("`")
        line = next((l for l in out.split("\n") if l.startswith("  " + label + " ") or l == "  " + label), None)
        assert line is not None, f"trident {name} --help lacks {label!r}"
        if default and default not in ("on", "off", "(required)", "(optional)"):
            block = out[out.index("  " + label):].split("\n  -")[0].replace("\n", " ")
            assert re.search(r"default\s+" + re.escape(default), block), f"{name} {label}: default {default} not in --help: {block}"
        n += 1
assert n >= 10, f"only {n} rows in docs/cli.md"
print(f"(b) {n} rows of docs/cli.md in the commands' --help")
PY

# (c) refused with exit 2 and a message naming flag, value and expectation
refused() { # refused WHAT PATTERN CMD...
    local what=$1 pat=$2 rc=0; shift 2
    "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "$pat" "$tmp/err" || fail "(c) $what: rc $rc, stderr: $(cat "$tmp/err")"
}
G=("$TRIDENT" generate "$tmp/none")
refused "unknown flag" "unknown option '--frobnicate'" "${G[@]}" --prompt x --frobnicate 1
refused "flag without value" "--top-k needs a value" "${G[@]}" --prompt x --top-k
refused "int out of range" "--max-new-tokens '0': expected an integer in \[1, 1048576\]" "${G[@]}" --prompt x --max-new-tokens 0
refused "int not a number" "--threads '4x': expected an integer in \[0, 4096\]" "${G[@]}" --prompt x --threads 4x
refused "float out of range" "--temperature '-0.5': expected a number >= 0" "${G[@]}" --prompt x --temperature -0.5
refused "float not finite" "--temperature 'nan'" "${G[@]}" --prompt x --temperature nan
refused "unsigned negative" "--seed '-1': expected an unsigned 64-bit integer" "${G[@]}" --prompt x --seed -1
refused "missing positional" "MODEL_DIR is required" "$TRIDENT" generate --prompt x
refused "extra positional" "unexpected argument 'extra'" "${G[@]}" extra --prompt x
refused "enum not a choice" "--format 'xml': expected one of: auto, text, jsonl, chat" \
    "$TRIDENT" prep --input "$tmp/none" --output "$tmp/o" --vocab-size 300 --format xml
refused "paths without one" "--input needs at least one PATH" "$TRIDENT" prep --input --output "$tmp/o"
refused "size not a size" "--reserve '4Q': expected a size in GiB" "$TRIDENT" plan configs/tiny.ini --gpus 8 --reserve 4Q
refused "size out of range" "--max-shard-size '0': expected a size in bytes" "$TRIDENT" ckpt export "$tmp/a" "$tmp/b" --format hf --max-shard-size 0
refused "a hf-only flag of the HDF5 export" "--dtype, --max-shard-size and --tokenizer are options of --format hf" \
    "$TRIDENT" ckpt export "$tmp/a" "$tmp/b" --dtype bf16
refused "train: unknown flag before MPI" "unknown option '--bogus'" "$TRIDENT" train configs/tiny.ini --bogus
echo "(c) bad command lines refused with exit 2 naming flag, value and range"
# The table's defaults and a size's units reach the command: plan's search line
# (no layout searched: --top 0) names its GPUs a node, reserve and time model
# (no --efficiency: the kernel model).
line() { "$TRIDENT" plan configs/tiny.ini --gpus 8 --top 0 "$@" | head -n 1; }
line | grep -q "(8 a node; 80.0 GiB each, 76.0 GiB usable after a 4.0 GiB reserve; .*, kernel model;" ||
    fail "(c) plan's defaults: $(line)"
line --efficiency 0.5 | grep -q "peak, every FLOP at efficiency 0.50;" || fail "(c) plan --efficiency 0.5: $(line --efficiency 0.5)"
for r in 0.5 0.5G 512M 524288K; do
    line --reserve "$r" | grep -q "79.5 GiB usable after a 0.5 GiB reserve" || fail "(c) --reserve $r: $(line --reserve "$r")"
done
echo "(c) defaults from the table; --reserve 0.5 = 0.5G = 512M = 524288K"

# (d) converted commands parse no flag by hand
for f in src/cli/cmd_*.c; do
    if grep -nE 'strn?cmp\((a|arg|argv\[[^]]*\]), *"-' "$f"; then fail "(d) $f compares arguments with flags by hand: make them rows"; fi
done
echo "(d) no hand-parsed flags"
echo PASS
