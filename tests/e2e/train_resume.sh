#!/usr/bin/env bash
# train_resume.sh: checkpoints during training (issue 6).
#  1. Bit-exact resume in layouts (tp,pp,dp,zero) = (1,1,1,0), (2,2,2,0),
#     (1,2,4,1): 20 steps straight against runs stopped every 5 steps
#     ([train] exit_interval) and resumed three times: the same printed loss
#     and learning rate at every step, and byte-identical final parameters.
#  2. Resharding: a checkpoint of step 10 saved in one layout resumes in
#     another ((2,2,1) -> (1,1,4), (1,1,1) -> (2,2,2), (1,2,4) ZeRO-1 ->
#     (2,1,2) ZeRO-1) and its steps 11-20 give the losses of the straight run
#     in the original layout within 1e-5 relative.
#  3. SIGTERM to one rank of a 4-rank run: every rank stops after the current
#     step with exit code 3, a checkpoint of that step exists and verifies,
#     and resuming from it is bit-exact against a straight run.
#  4. Refused with exit 2 and a message naming the file, nothing changed: a
#     flipped byte, a truncated or missing rank file, another model, an
#     unknown format version.
set -u
cd "$(dirname "$0")/../.."
source tests/e2e/lib/train_env.sh
python3 -c "import h5py, numpy" 2>/dev/null || { echo "skipped: python h5py/numpy not installed"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small_dataset "$tmp"
fail=0
# train NAME TP PP DP ZERO [overrides...]: one run, log appended to $tmp/NAME.log
train() {
    local name=$1 tp=$2 pp=$3 dp=$4 zero=$5; shift 5
    timeout 300 $MPIRUN -np $((tp * pp * dp)) "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
        parallel.tp=$tp parallel.pp=$pp parallel.dp=$dp parallel.zero_stage=$zero \
        train.global_batch_size=16 train.eval_every=0 checkpoint.every=0 checkpoint.keep_last=0 \
        checkpoint.dir="$tmp/ck-$name" log.run_dir="$tmp/run-$name" "$@" >> "$tmp/$name.log" 2>&1
}
export_final() { "$TRIDENT" ckpt export "$tmp/ck-$1" "$tmp/$1.h5" > /dev/null || echo "FAIL: export of $1"; }

# 1. bit-exact resume
for l in 1,1,1,0 2,2,2,0 1,2,4,1; do
    IFS=, read -r tp pp dp z <<<"$l"
    train "straight-$l" $tp $pp $dp $z || { echo "FAIL: straight $l exited $?"; fail=1; }
    for i in 1 2 3 4; do
        train "stopped-$l" $tp $pp $dp $z train.exit_interval=5 || { echo "FAIL: stopped $l run $i exited $?"; fail=1; }
    done
    n=$(grep -c '^resumed from' "$tmp/stopped-$l.log")
    [ "$n" = 3 ] || { echo "FAIL: $l resumed $n times, expected 3"; fail=1; }
    export_final "straight-$l"; export_final "stopped-$l"
done

# 2. resharding: step 10 of one layout continued in another
train "src-2,2,1,0" 2 2 1 0 train.exit_interval=10
train "straight-2,2,1,0" 2 2 1 0
cp -r "$tmp/ck-src-2,2,1,0" "$tmp/ck-re-1,1,4,0"; train "re-1,1,4,0" 1 1 4 0
cp -r "$tmp/ck-straight-1,1,1,0" "$tmp/ck-src-1,1,1,0"
train "src2-1,1,1,0" 1 1 1 0 train.exit_interval=10
cp -r "$tmp/ck-src2-1,1,1,0" "$tmp/ck-re-2,2,2,0"; train "re-2,2,2,0" 2 2 2 0
train "src-1,2,4,1" 1 2 4 1 train.exit_interval=10
cp -r "$tmp/ck-src-1,2,4,1" "$tmp/ck-re-2,1,2,1"; train "re-2,1,2,1" 2 1 2 1

# 3. SIGTERM to one rank of four
( train "term" 1 1 4 0 train.steps=100000 log.every=1 ) &
for _ in $(seq 1 100); do grep -q '^step +5/' "$tmp/term.log" 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f "trident train .*ck-term" | tail -n 1)
[ -n "$victim" ] && kill -TERM "$victim"
wait $!; rc=$?
[ "$rc" = 3 ] || { echo "FAIL: SIGTERM run exited $rc, expected 3"; tail -5 "$tmp/term.log"; fail=1; }
k=$(sed -n 's/^step-0*\([0-9]*\)$/\1/p' "$tmp/ck-term/latest")
grep -q "stopped by signal 15 after step $k, checkpoint saved" "$tmp/term.log" || { echo "FAIL: no 'stopped by signal' line for step $k"; fail=1; }
"$TRIDENT" ckpt verify "$tmp/ck-term" > /dev/null || { echo "FAIL: ckpt verify after SIGTERM"; fail=1; }
echo "SIGTERM: stopped after step $k with exit $rc"
e=$((k + 5))
train "term" 1 1 4 0 train.steps=100000 train.exit_interval=$e || { echo "FAIL: resume after SIGTERM exited $?"; fail=1; }
train "termref" 1 1 4 0 train.steps=100000 train.exit_interval=$e || fail=1
export_final term; export_final termref

# 4. A bad checkpoint is refused before training (exit 2, the file named)
#    and nothing in it is overwritten.
refuse() { # LABEL PATTERN [overrides]: resume from $tmp/ck-bad must exit 2
    local label=$1 pattern=$2; shift 2
    local before after out rc
    before=$(cd "$tmp/ck-bad" && find . -type f -exec md5sum {} + | sort)
    out=$(timeout 60 $MPIRUN -np 2 "$TRIDENT" train "$SMALL_INI" data.path="$tmp/shards" \
          parallel.dp=2 train.global_batch_size=16 checkpoint.dir="$tmp/ck-bad" \
          log.run_dir="$tmp/run-bad" "$@" 2>&1); rc=$?
    after=$(cd "$tmp/ck-bad" && find . -type f -exec md5sum {} + | sort)
    if [ "$rc" != 2 ] || ! grep -Eq -- "$pattern" <<<"$out" || [ "$before" != "$after" ]; then
        echo "FAIL: bad checkpoint ($label): exit $rc, message match $(grep -Ec -- "$pattern" <<<"$out"), files unchanged $([ "$before" = "$after" ] && echo yes || echo no)"
        grep trident: <<<"$out" | head -3; fail=1
    else
        echo "refused ($label): $(grep -m1 -E -- "$pattern" <<<"$out" | cut -c1-160)"
    fi
}
fresh_bad() { rm -rf "$tmp/ck-bad"; cp -r "$tmp/ck-straight-1,1,1,0" "$tmp/ck-bad"; }
fresh_bad; printf '\x55' | dd of="$tmp/ck-bad/step-000020/rank-00000.h5" bs=1 seek=5000 conv=notrunc 2>/dev/null
refuse "flipped byte" "rank-00000.h5.*(checksum|xxh3)"
fresh_bad; truncate -s 3000 "$tmp/ck-bad/step-000020/rank-00000.h5"
refuse "truncated file" "rank-00000.h5"
fresh_bad; rm "$tmp/ck-bad/step-000020/rank-00000.h5"
refuse "missing rank file" "rank-00000.h5"
fresh_bad
refuse "model differs" "d_model" model.d_model=128 model.n_heads=4
fresh_bad; sed -i 's/^format_version = 1/format_version = 7/' "$tmp/ck-bad/step-000020/manifest.ini"
refuse "unknown format version" "format_version.*7"

python3 - "$tmp" <<'PY' || fail=1
import re, sys, h5py, numpy as np
tmp = sys.argv[1]
def steps(name):
    out = {}
    for line in open(f"{tmp}/{name}.log"):
        m = re.match(r"step +(\d+)/\d+ \| loss (\S+) \| lr (\S+) \|", line)
        if m: out[int(m[1])] = (m[2], m[3])
    return out
def same_params(a, b):
    fa, fb = h5py.File(f"{tmp}/{a}.h5"), h5py.File(f"{tmp}/{b}.h5")
    assert sorted(fa) == sorted(fb), f"{a} vs {b}: different tensors"
    return [k for k in fa if not np.array_equal(fa[k][()], fb[k][()])]
ok = True
for l in ("1,1,1,0", "2,2,2,0", "1,2,4,1"):
    s, r = steps(f"straight-{l}"), steps(f"stopped-{l}")
    if sorted(s) != list(range(1, 21)) or s != r:
        ok = False
        print(f"FAIL: {l}: stopped-and-resumed log differs from the straight run at steps",
              [k for k in range(1, 21) if s.get(k) != r.get(k)])
    bad = same_params(f"straight-{l}", f"stopped-{l}")
    if bad: ok = False; print(f"FAIL: {l}: final parameters differ in {bad[:3]}")
    else: print(f"{l}: 20 steps straight == 3 resumes, final parameters byte-identical")
for src, dst in (("straight-2,2,1,0", "re-1,1,4,0"), ("straight-1,1,1,0", "re-2,2,2,0"), ("straight-1,2,4,1", "re-2,1,2,1")):
    s, r = steps(src), steps(dst)
    worst = max(abs(float(s[k][0]) - float(r[k][0])) / float(s[k][0]) for k in range(11, 21)) if all(k in r for k in range(11, 21)) else 1
    if worst > 1e-5: ok = False; print(f"FAIL: {dst}: steps 11-20 differ from {src} (worst rel {worst:.1e})")
    else: print(f"resharded {src} -> {dst}: steps 11-20 match (worst rel {worst:.1e})")
bad = same_params("term", "termref")
if bad: ok = False; print(f"FAIL: resume after SIGTERM: parameters differ in {bad[:3]}")
else: print("resume after SIGTERM: parameters byte-identical to the straight run")
sys.exit(0 if ok else 1)
PY
exit $fail
