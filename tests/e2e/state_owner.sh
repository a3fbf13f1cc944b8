#!/usr/bin/env bash
# state_owner.sh: a new saved scalar touches only its owner (issue 27,
# acceptance 9; docs/design.md §7 "Who owns what a checkpoint holds"). In a
# copy of src/ one int64 is planted in the loss scaler's files alone
# (src/train/train_step.h and .c: a field of struct loss_scaler and of its
# saved form, one entry "loss_scaler_planted", its copy out and back); the
# copy differs from the tree in those two files only. tests/unit/
# test_state_owners.c, built with -DPLANTED against the copy (the two planted
# files and train_state.c compiled from it, the rest of $BUILD/libtrident.a
# as built), must save it through the trainer's gathering and the checkpoint
# layer and get it back, and find it in /state. Then the control: the same
# plant with a checkpoint layer that writes only the names it knows (as
# write_state did before the owners held their state) must fail that test.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
[ -f "$BUILD/libtrident.a" ] || fail "$BUILD/libtrident.a not built (make)"
tree=$tmp/tree
mkdir -p "$tree"
cp -r src kernels "$tree/"

python3 - "$tree" <<'EOF'
import re, sys
tree = sys.argv[1]
def edit(path, subs):
    p = f"{tree}/{path}"
    s = open(p).read()
    for pat, new in subs:
        s, k = re.subn(pat, new, s, count=1, flags=re.S)
        if k != 1:
            sys.exit(f"plant: {path}: no match for {pat!r}")
    open(p, "w").write(s)
edit("src/train/train_step.h", [
    (r"(struct loss_scaler \{\n)", r"\1    int64_t planted; // tests/e2e/state_owner.sh\n"),
    (r"(struct loss_scaler_saved \{\n)", r"\1    int64_t planted;\n"),
])
edit("src/train/train_step.c", [
    (r'(\n[ \t]*\{"loss_scale_good_steps"[^\n]*\n)', r'\1        {"loss_scaler_planted", STATE_I64, 1, &s->planted},\n'),
    (r"(void loss_scaler_saved_of\([^)]*\) \{\n.*?)(\n\}\n)", r"\1\n    out->planted = s ? s->planted : 0;\2"),
    (r"(void loss_scaler_saved_restore\([^)]*\) \{\n.*?)(\n\}\n)", r"\1\n    if (s) s->planted = saved->planted;\2"),
])
EOF
changed=$({ diff -rq src "$tree/src" || true; } | sort | tr "\n" " ")
want="Files src/train/train_step.c and $tree/src/train/train_step.c differ Files src/train/train_step.h and $tree/src/train/train_step.h differ "
[ "$changed" = "$want" ] || fail "the plant changed more than the loss scaler's files: $changed"

PKGS=$(sed -n 's/^PKGS *:= *//p' Makefile)
# build TREE OUT EXTRA.c...: the test against TREE's headers and the planted
# owner's objects, the rest from the library as built.
build() {
    local t=$1 out=$2
    shift 2
    # shellcheck disable=SC2046
    "${CC:-cc}" -O1 -std=gnu11 -fopenmp -w -DPLANTED -I"$t/src" -I"$t" -Itests/unit $(pkg-config --cflags $PKGS) \
        tests/unit/test_state_owners.c "$t/src/train/train_step.c" "$t/src/train/train_state.c" "$@" \
        "$BUILD/libtrident.a" -o "$out" $(pkg-config --libs $PKGS) -ldnnl -lm -lpthread ||
        fail "building the planted test against $t"
}
build "$tree" "$tmp/planted"
"$tmp/planted" >"$tmp/planted.log" 2>&1 || { cat "$tmp/planted.log"; fail "the scalar planted in the loss scaler alone did not round-trip"; }
echo "planted in the loss scaler alone: $(tail -n1 "$tmp/planted.log")"

# The control: a checkpoint layer that knows its names drops the new one.
cp -r "$tree" "$tmp/knows"
python3 - "$tmp/knows/src/ckpt/checkpoint.c" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = "        if (e[i].read_only) continue;\n"
known = ("lr_step opt_steps loader_samples loader_weights rng_seed rng_state loss_scale loss_scale_good_steps "
         "skipped_steps consecutive_skips train_steps lr min_lr warmup_steps lr_schedule lr_rebase_step "
         "lr_rebase_lr loss_on").split()
new = ("        static const char *const known = \" %s \";\n        char key[80];\n"
       "        snprintf(key, sizeof key, \" %%s \", e[i].name);\n"
       "        if (e[i].read_only || !strstr(known, key)) continue;\n") % " ".join(known)
if s.count(old) != 1:
    sys.exit("control: write_state's loop not found")
open(p, "w").write(s.replace(old, new))
EOF
build "$tmp/knows" "$tmp/knows.bin" "$tmp/knows/src/ckpt/checkpoint.c"
if "$tmp/knows.bin" >"$tmp/knows.log" 2>&1; then
    fail "control: a checkpoint layer that writes only the names it knows passed the planted test"
fi
grep -q "planted scalar came back as 0" "$tmp/knows.log" || { cat "$tmp/knows.log"; fail "control failed for another reason"; }
echo "control: a checkpoint layer that knows its names loses it (as it must)"
