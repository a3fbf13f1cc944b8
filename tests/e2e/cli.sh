#!/usr/bin/env bash
# cli.sh: the command line's help (issue 14). `trident --help` lists every
# command, data-check included; `--help` or `-h` anywhere on the line of any
# command prints that command's usage on stdout and exits 0, `trident train`'s
# without MPI (no mpirun, a config that does not exist, under 5 s); `trident
# plan --world-size N` infers dp = N / (tp * pp) and says so, and without it
# dp = 0 means 1.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
fail=0
out=$("$TRIDENT" --help) || { echo "FAIL: trident --help exited non-zero"; fail=1; }
for c in train plan prep data-check ckpt tokenize; do
    grep -q "^  trident $c " <<<"$out" || { echo "FAIL: trident --help does not list $c"; fail=1; }
done
# help COMMAND ARGS...: exit 0, "usage: trident COMMAND" on stdout, within 5 s,
# with MPI made unable to start (a transport that does not exist: MPI_Init
# fails, checked below), so the help cannot have needed it.
NO_MPI=(env OMPI_MCA_pml=nonexistent)
rc=0; timeout 20 "${NO_MPI[@]}" "$TRIDENT" train /nonexistent.ini > /dev/null 2>&1 || rc=$?
[ "$rc" != 0 ] || { echo "FAIL: trident train under OMPI_MCA_pml=nonexistent exited 0: MPI is not broken there"; fail=1; }
help() {
    local cmd=$1 rc=0 out; shift
    out=$(timeout 5 "${NO_MPI[@]}" "$TRIDENT" "$cmd" "$@" 2>/dev/null) || rc=$?
    if [ "$rc" != 0 ] || ! grep -q "usage: trident $cmd" <<<"$out"; then
        echo "FAIL: trident $cmd $*: exit $rc, usage on stdout: $(grep -c "usage: trident $cmd" <<<"$out" || true)"; fail=1
    else
        echo "ok   trident $cmd $*"
    fi
}
for c in train plan prep data-check ckpt tokenize; do
    help "$c" --help
    help "$c" -h
done
help train /nonexistent.ini train.steps=5 --help
help train -h /nonexistent.ini
help plan configs/tiny.ini parallel.tp=2 -h
help prep --input /nonexistent --output /tmp/x --help
help data-check /nonexistent --seq-len 8 --help
help ckpt verify /nonexistent -h
help tokenize --tokenizer /nonexistent --help
# Without --help a bad line still fails (exit 2).
rc=0; "$TRIDENT" ckpt verify > /dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || { echo "FAIL: trident ckpt verify without DIR exited $rc, expected 2"; fail=1; }
# trident plan: dp = 0 inferred from --world-size, else 1.
p4=$("$TRIDENT" plan configs/tiny.ini parallel.dp=0 parallel.tp=2 --world-size 4 | head -n 1)
p1=$("$TRIDENT" plan configs/tiny.ini parallel.dp=0 | head -n 1)
grep -q "tp 2 x cp 1 x ep 1 x dp_shard 2 x dp_replicate 1 x pp 1 = 4 ranks" <<<"$p4" || { echo "FAIL: plan --world-size 4 with tp 2: $p4"; fail=1; }
grep -q "tp 1 x cp 1 x ep 1 x dp_shard 1 x dp_replicate 1 x pp 1 = 1 ranks" <<<"$p1" || { echo "FAIL: plan without --world-size: $p1"; fail=1; }
rc=0; msg=$("$TRIDENT" plan configs/tiny.ini parallel.dp=0 parallel.tp=2 --world-size 3 2>&1) || rc=$?
[ "$rc" = 2 ] && grep -q "run on 2 or 4 ranks" <<<"$msg" || { echo "FAIL: plan --world-size 3, tp 2: exit $rc: $msg"; fail=1; }
echo "plan: $p4"
exit $fail
