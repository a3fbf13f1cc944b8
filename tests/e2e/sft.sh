#!/usr/bin/env bash
# sft.sh: supervised fine-tuning data and loss (issue 16, part B).
#  1. `trident prep --format chat` of instruction pairs (data/make_sft_example.sh)
#     writes /loss_mask (uint8, one per token) whose 1-runs decode (HF
#     tokenizers, independent of trident's encoder) to exactly " RESPONSE" and
#     the end-of-text token of each record, and whose 0-runs to
#     "User: PROMPT\nAssistant:"; every record is there once.
#  2. Refused with exit 2, nothing written: a record holding U+0001, a record
#     with neither prompt/response nor messages, --format chat with --vocab-size,
#     data in which no conversation has an assistant turn (nothing to train on;
#     some without one are counted in prep_stats' chat_no_assistant).
#  3. loss_on = response: the losses of 3 steps at dp = 1 and dp = 2 agree
#     within 1e-5 (the masked count is summed over DP ranks and microbatches)
#     and differ from loss_on = all; on a dataset without /loss_mask,
#     response and all give the same losses bit for bit (no mask = all ones),
#     and the run says at start that the data has no /loss_mask.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py h5py numpy tokenizers
small_dataset "$tmp"
data/make_sft_example.sh "$tmp/pairs.jsonl" 400 >/dev/null || fail "make_sft_example.sh"
"$TRIDENT" prep --input "$tmp/pairs.jsonl" --output "$tmp/chat" --format chat \
    --tokenizer "$tmp/shards/tokenizer.json" --val-fraction 0.1 >/dev/null 2>&1 || fail "prep --format chat"

# 1. the mask against the records
"$PY" - "$tmp/chat" "$tmp/pairs.jsonl" <<'PYEOF' || fail "the loss mask does not match the records"
import glob, json, sys
import h5py, numpy as np
from tokenizers import Tokenizer
d, pairs = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(d + "/tokenizer.json")
want = {}
for line in open(pairs):
    r = json.loads(line)
    want[("User: " + r["prompt"] + "\nAssistant:", " " + r["response"])] = 0
eot_text = None
n = 0
for path in sorted(glob.glob(d + "/shard-*.h5")):
    with h5py.File(path) as f:
        t, m, off = f["tokens"][:], f["loss_mask"][:], f["doc_offsets"][:]
        assert f["loss_mask"].dtype == np.uint8 and m.shape == t.shape, (path, f["loss_mask"].dtype, m.shape)
        eot = int(f.attrs["eot_id"])
    for a, b in zip(off[:-1], off[1:]):
        dt, dm = t[a:b], m[a:b]
        assert dt[-1] == eot and dm[-1] == 1, "the end-of-text id ends each record, trained on"
        k = int(np.argmax(dm))  # the first trained token
        assert dm[:k].sum() == 0 and dm[k:].all(), f"record {n}: mask {dm.tolist()} is not prompt zeros then ones"
        prompt = tok.decode(dt[:k].tolist(), skip_special_tokens=False)
        resp = tok.decode(dt[k:-1].tolist(), skip_special_tokens=False)
        key = (prompt, resp)
        assert key in want, f"record {n}: {key!r} is not a pair of the input"
        want[key] += 1
        n += 1
assert n == len(want) and all(v == 1 for v in want.values()), (n, len(want))
print(f"prep --format chat: {n} records, mask = response tokens + end-of-text")
PYEOF

# 2. refusals
bad() { # NAME JSONL_LINE [extra args]
    local name=$1 line=$2; shift 2
    printf '%s\n' "$line" > "$tmp/$name.jsonl"
    local rc=0
    "$TRIDENT" prep --input "$tmp/$name.jsonl" --output "$tmp/out-$name" --format chat "$@" \
        > /dev/null 2> "$tmp/$name.err" || rc=$?
    [ "$rc" -eq 2 ] || fail "$name: exit $rc, expected 2 ($(cat "$tmp/$name.err"))"
    [ ! -e "$tmp/out-$name" ] || fail "$name: wrote $tmp/out-$name"
}
bad sep '{"prompt": "a\u0001b", "response": "c"}' --tokenizer "$tmp/shards/tokenizer.json"
grep -q "U+0001" "$tmp/sep.err" || fail "the U+0001 refusal does not say why: $(cat "$tmp/sep.err")"
bad fields '{"text": "a"}' --tokenizer "$tmp/shards/tokenizer.json"
grep -q "pairs.jsonl\|fields.jsonl:1" "$tmp/fields.err" || fail "no file:line in: $(cat "$tmp/fields.err")"
bad role '{"messages": [{"role": "robot", "content": "x"}]}' --tokenizer "$tmp/shards/tokenizer.json"
bad vocab '{"prompt": "a", "response": "b"}' --vocab-size 300
bad noasst '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}' \
    --tokenizer "$tmp/shards/tokenizer.json"
grep -qF "$tmp/noasst.jsonl: no conversation has an assistant turn" "$tmp/noasst.err" \
    && grep -qF '{"role": "assistant", "content": ...}' "$tmp/noasst.err" \
    || fail "no assistant turn anywhere: the refusal does not name the file and what is expected: $(cat "$tmp/noasst.err")"
# Some conversations without one: prepped, counted, with a note.
{ printf '{"messages": [{"role": "user", "content": "u"}]}\n'; head -n 2 "$tmp/pairs.jsonl"; } > "$tmp/some.jsonl"
"$TRIDENT" prep --input "$tmp/some.jsonl" --output "$tmp/some" --format chat --tokenizer "$tmp/shards/tokenizer.json" \
    --val-fraction 0 --quiet > "$tmp/some.out" 2> "$tmp/some.err" || fail "some conversations without an assistant turn: exit $?"
[ "$(grep '^prep_stats: ' "$tmp/some.out" | cut -d' ' -f2- | jq -r '[.documents, .chat_no_assistant] | @tsv')" = "$(printf '3\t1')" ] \
    && grep -qF "1 of 3 conversations have no assistant turn" "$tmp/some.err" \
    || fail "1 of 3 conversations without an assistant turn: $(cat "$tmp/some.out" "$tmp/some.err")"
echo "refused with exit 2, nothing written: U+0001, missing fields, unknown role, --vocab-size, no assistant turn" \
    "in any conversation (one of three without: counted)"

# 3. the masked loss over DP ranks
run() { # NAME DP DATA [overrides]
    local name=$1 dp=$2 data=$3; shift 3
    timeout 300 "${MPIRUN[@]}" -np "$dp" "$TRIDENT" train "$SMALL_INI" data.path="$data" parallel.dp="$dp" \
        train.steps=3 train.warmup_steps=1 train.global_batch_size=8 train.eval_every=0 checkpoint.every=0 checkpoint.keep_last=0 \
        log.run_dir="$tmp/run-$name" "$@" > "$tmp/$name.log" 2>&1 || fail "$name: $(tail -3 "$tmp/$name.log")"
    metrics "$tmp/run-$name" '.loss' > "$tmp/$name.loss"
}
run resp1 1 "$tmp/chat" train.loss_on=response
run resp2 2 "$tmp/chat" train.loss_on=response
run all1 1 "$tmp/chat" train.loss_on=all
run nomask-resp 1 "$tmp/shards" train.loss_on=response
run nomask-all 1 "$tmp/shards" train.loss_on=all
"$PY" - "$tmp" <<'PYEOF' || fail "masked losses"
import sys
t = sys.argv[1]
r = lambda n: [float(x) for x in open(f"{t}/{n}.loss").read().split()]
r1, r2, a1 = r("resp1"), r("resp2"), r("all1")
assert len(r1) == len(r2) == len(a1) == 3, (r1, r2, a1)
for s, (x, y) in enumerate(zip(r1, r2)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {s + 1}: dp=1 {x} dp=2 {y}"
assert abs(r1[0] - a1[0]) > 1e-3, f"response {r1[0]} and all {a1[0]} agree: the mask had no effect"
assert r("nomask-resp") == r("nomask-all"), (r("nomask-resp"), r("nomask-all"))
print(f"loss_on=response dp=1 {r1} dp=2 {r2}; loss_on=all {a1}; without /loss_mask response == all")
PYEOF
# loss_tokens: every target without a mask (global batch 8 x seq_len 32), fewer with one.
[ "$(metrics "$tmp/run-nomask-resp" .loss_tokens | sort -u)" = 256 ] || fail "loss_tokens without a mask: $(metrics "$tmp/run-nomask-resp" .loss_tokens | paste -sd' ')"
r1tok=$(metrics "$tmp/run-resp1" .loss_tokens | paste -sd' ')
[ "$r1tok" = "$(metrics "$tmp/run-resp2" .loss_tokens | paste -sd' ')" ] && awk -v t="$r1tok" 'BEGIN { n = split(t, a, " "); for (i = 1; i <= n; i++) if (a[i] <= 0 || a[i] >= 256) exit 1; exit n != 3 }' ||
    fail "loss_tokens with loss_on = response: dp=1 $r1tok, dp=2 $(metrics "$tmp/run-resp2" .loss_tokens | paste -sd' ')"
# loss_on = response without a mask says so at start; with one, it does not.
grep -q "note: \[train\] loss_on = response, but $tmp/shards has no /loss_mask" "$tmp/nomask-resp.log" ||
    fail "loss_on = response on a dataset without /loss_mask printed no note"
! grep -q "has no /loss_mask" "$tmp/resp1.log" || fail "loss_on = response on chat data printed the no-mask note"
echo "PASS"
