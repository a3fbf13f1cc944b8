#!/usr/bin/env bash
# plan_search.sh: `trident plan CONFIG --gpus N` (src/train/plan_search.c,
# docs/planning.md), checked against references outside the search:
#  a. --json keeps its schema (the keys a tool reads, by name);
#  b. every configs/*.ini and configs/published/*.ini with a "# plan:" line
#     fits on the cluster that line states, with a step time and an MFU in
#     (0, 1), and the grouped plan of its layout (plan --world-size --json,
#     another path) has the same peak bytes;
#  c. the compute term equals FLOPs / (peak x efficiency) with the FLOPs per
#     token written out here from the shapes (6 x matmul params + 6 L C T);
#  d. a layout that cannot fit is explained with numbers (needs X GiB, Y over
#     Z usable, X = the plan's peak), and tp beyond a node or beyond
#     n_kv_heads is named as the reason;
#  e. the published runs (docs/planning.md's table): the published (tp, pp)
#     fits and its predicted hardware TFLOP/s per GPU is within 25% of the
#     published figure; Llama 3 405B's tp 8 x pp 16 ranks in the top 5.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py
n=0
# a. schema
"$TRIDENT" plan configs/llama3-8b.ini --gpus 8 --json > "$tmp/s.json"
"$PY" - "$tmp/s.json" <<'PY' || fail "a: --json schema changed"
import json, sys
o = json.load(open(sys.argv[1]))
top = ["schema", "config", "gpus", "gpus_per_node", "gpu", "mem_bytes", "reserve_bytes", "efficiency",
       "tried", "fit", "layouts", "rejected", "config_layout"]
lay = ["tp", "pp", "virtual_stages", "dp", "micro_batch_size", "recompute", "zero_stage", "dp_shard",
       "reshard_after_forward", "peak_bytes",
       "step_s", "compute_s", "recompute_s", "bubble_s", "tp_comm_s", "pp_comm_s", "dp_exposed_s",
       "tokens_per_s", "tflops_per_gpu", "mfu", "hw_tflops_per_gpu"]
assert o["schema"] == "trident.plan_search.v1", o["schema"]
assert list(o) == top, list(o)
assert 1 <= len(o["layouts"]) <= 5 and all(list(l) == lay for l in o["layouts"]), o["layouts"][0]
s = [l["step_s"] for l in o["layouts"]]
assert s == sorted(s), s
for l in o["layouts"]:
    parts = sum(l[k] for k in lay if k.endswith("_s") and k not in ("step_s", "tokens_per_s"))
    assert abs(parts - l["step_s"]) < 1e-9 * l["step_s"], (parts, l["step_s"])
assert all(list(r) == ["tp", "pp", "why"] for r in o["rejected"])
PY
echo "a: --json schema ok"
# b. every config with a stated cluster fits on it
for f in configs/*.ini configs/published/*.ini; do
    args=$(sed -n 's/^# plan: *\(--[^(]*\).*/\1/p' "$f")
    [ -n "$args" ] || continue
    # shellcheck disable=SC2086
    "$TRIDENT" plan "$f" $args --json > "$tmp/c.json" || fail "b: $f: plan $args exited $?"
    gpus=$(sed -n 's/.*--gpus \([0-9]*\).*/\1/p' <<<"$args")
    "$TRIDENT" plan "$f" --world-size "$gpus" --json > "$tmp/g.json" || fail "b: $f: plan --world-size $gpus"
    line=$("$PY" - "$tmp/c.json" "$tmp/g.json" <<'PY'
import json, sys
o, g = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
c = o["config_layout"]
assert c["fits"], c
assert c["step_s"] > 0 and 0 < c["mfu"] < 1, c
assert c["peak_bytes"] == g["peak_bytes"], (c["peak_bytes"], g["peak_bytes"])
assert c["peak_bytes"] + o["reserve_bytes"] <= o["mem_bytes"]
print(f'{c["peak_bytes"] / 2**30:.1f} GiB of {o["mem_bytes"] / 2**30:.0f}, step {c["step_s"]:.2f} s, '
      f'MFU {100 * c["mfu"]:.1f}%, rank {c["rank"] or ">5"}')
PY
) || fail "b: $f does not fit on its stated cluster ($args)"
    echo "b: $f on $args: fits, $line"; n=$((n + 1))
done
[ "$n" -ge 7 ] || fail "b: only $n configs state a cluster"
# c. compute = FLOPs / (peak x efficiency), FLOPs from the shapes
"$TRIDENT" plan configs/llama3-8b.ini --gpus 8 --efficiency 0.4 --json > "$tmp/e.json"
"$PY" - "$tmp/e.json" <<'PY' || fail "c: compute term"
import json, sys
o = json.load(open(sys.argv[1])); c = o["config_layout"]
V, C, L, H, Hkv, F, T, B = 128256, 4096, 32, 32, 8, 14336, 8192, 64
D = C // H
matmul = L * (2 * C * C + 2 * C * Hkv * D + 3 * C * F) + V * C
flops = (6 * matmul + 6 * L * C * T) * B * T / 8
want = flops / (989e12 * 0.4)
assert abs(c["compute_s"] / want - 1) < 1e-9, (c["compute_s"], want)
print(f"c: compute {c['compute_s']:.4f} s = {want:.4f} s by hand")
PY
# d. what cannot fit, with numbers
out=$("$TRIDENT" plan configs/llama3-8b.ini --gpus 8 --gpu-mem 40G)
peak=$("$TRIDENT" plan configs/llama3-8b.ini --world-size 8 --json | "$PY" -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["peak_bytes"] / 2**30))')
grep -q "^config's layout .* does not fit: needs $peak GiB, [0-9.]* GiB over the 36.0 GiB usable" <<<"$out" ||
    fail "d: the 8B layout on 40 GiB is not explained with its $peak GiB: $(grep "^config" <<<"$out")"
echo "d: $(grep "^config's" <<<"$out")"
out=$("$TRIDENT" plan configs/llama3-8b.ini --gpus 16 --gpus-per-node 16 train.global_batch_size=64)
grep -q "tp 16 x pp 1: tp 16 > n_kv_heads 8" <<<"$out" || fail "d: tp 16 > n_kv_heads not named"
# (on 80 GB every tp 8 family of 405B fits with ZeRO-3; on 20 GB none does)
out=$("$TRIDENT" plan configs/llama3-405b.ini --gpus 1024 --gpu-mem 20G)
grep -q "tp 16 x pp 1: tp 16 crosses a node of 8 GPUs" <<<"$out" || fail "d: tp 16 across nodes not named"
grep -Eq "tp 8 x pp 4: out of memory at best .*: needs [0-9.]+ GiB, [0-9.]+ GiB over the 16.0 GiB usable" <<<"$out" ||
    fail "d: 405B on tp 8 x pp 4 not explained: $(grep 'tp 8 x pp 4' <<<"$out")"
echo "d: $(grep 'tp 8 x pp 4:' <<<"$out" | sed 's/^ *//')"
for bad in "--gpu Foo:unknown preset 'Foo'" "--gpu H200,bogus=1:unknown key 'bogus'" "--gpus 0:--gpus needs a number"; do
    IFS=: read -r a want <<<"$bad"
    rc=0; msg=$("$TRIDENT" plan configs/llama3-8b.ini --gpus 8 $a 2>&1) || rc=$?
    [ "$rc" = 2 ] && grep -qF -- "$want" <<<"$msg" || fail "d: plan $a: rc $rc, '$msg'"
done
# e. published runs: hardware TFLOP/s per GPU of the published layout within 25%
for case in megatron-145b:1536:148 megatron-1t:3072:163 gpt3-175b:1024:140; do
    IFS=: read -r name gpus pub <<<"$case"
    "$TRIDENT" plan configs/published/$name.ini --gpus "$gpus" --gpu A100-80G --json > "$tmp/p.json"
    "$PY" - "$tmp/p.json" "$pub" "$name" <<'PY' || fail "e: $name"
import json, sys
o, pub = json.load(open(sys.argv[1])), float(sys.argv[2])
c = o["config_layout"]
assert c["fits"], c
err = c["hw_tflops_per_gpu"] / pub - 1
print(f"e: {sys.argv[3]}: predicted {c['hw_tflops_per_gpu']:.1f} TFLOP/s a GPU, published {pub:.0f} ({100 * err:+.1f}%)")
assert abs(err) <= 0.25
PY
done
"$TRIDENT" plan configs/llama3-405b.ini --gpus 16384 train.global_batch_size=2048 --json > "$tmp/l.json"
"$PY" - "$tmp/l.json" <<'PY' || fail "e: Llama 3 405B"
import json, sys
o = json.load(open(sys.argv[1]))
tops = [(l["tp"], l["pp"]) for l in o["layouts"]]
assert (8, 16) in tops, tops
best = next(l for l in o["layouts"] if (l["tp"], l["pp"]) == (8, 16))
err = best["tflops_per_gpu"] / 400 - 1
print(f"e: llama3-405b on 16384 H100: tp 8 x pp 16 at place {tops.index((8, 16)) + 1}, "
      f"{best['tflops_per_gpu']:.0f} TFLOP/s a GPU, published ~400 ({100 * err:+.1f}%)")
assert abs(err) <= 0.25
PY
echo "plan_search: ok"
