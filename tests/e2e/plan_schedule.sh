#!/usr/bin/env bash
# plan_schedule.sh: the planner's side of the pipeline schedules (issue 30;
# docs/planning.md §3, "Pipeline schedules"), read from --json, checked
# against expectations written out here:
#  a. --show-schedule --unit-costs at p = 4, m = 8 (F = B = W = 1, free
#     messages): the bubble fraction of the step is the closed form, 1F1B
#     (p - 1) / (m + p - 1) = 3/11 (Narayanan et al. 2021 §2.2.1), the
#     interleaved 1F1B at v = 2 (p - 1) / (v m + p - 1) = 3/19 (§2.2.2),
#     ZB-H1 (p - 1) / (3 m + p - 1) = 3/27 (Qi et al. 2024: a third of
#     1F1B's idle time); every stage idles (p - 1)(F + B + W) = 9 units
#     under 1F1B and (p - 1)(F + B - W) = 3 under ZB-H1; ZB-V's bubble is
#     below ZB-H1's; the text output prints
#     the same timeline as the JSON's, one line a stage;
#  b. the planner's op costs (--efficiency 0.5, every FLOP at half the peak):
#     F = a third of the compute, W = 2 x matmul params FLOPs a token, both
#     written out here from the shapes; B + W + F over the step's ops =
#     compute + recompute; --show-schedule's costs are the search's
#     config_layout op_seconds (two paths);
#  c. the search's 1F1B / interleaved layouts: bubble_s equals the closed
#     form (p - 1) / (v m) x (compute + recompute) (the simulator against
#     Narayanan et al. 2021 §2.2), and the parts still add up to the step;
#  d. --gpus on a cluster where the fastest layouts pipeline (Llama 2 7B on
#     16 H100, one a node: tensor parallelism cannot leave a node and the
#     data-parallel traffic crosses the network): the search tries the
#     zero-bubble schedules, ranks a zero-bubble layout among the 5 it
#     prints (the first here), faster than the same layout under 1F1B /
#     interleaved 1F1B, and every zero-bubble
#     layout that is faster than its twin ranks above it; ZB-H1's simulated
#     bubble_s is (p - 1)(F + B - W) of its op costs (Qi et al. 2024, the
#     handcrafted schedules) with messages free;
#  e. refusals: --schedule foo exits 2 naming 'foo' and the choices;
#     --schedule zb-h1 with virtual_stages 2 exits 2 with config_validate's
#     message naming both keys.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py
# a 4-stage layout of tiny.ini with 8 microbatches (8 layers: one per chunk at v = 2)
small=(configs/tiny.ini model.n_layers=8 parallel.pp=4 parallel.dp=1 train.global_batch_size=8
       train.micro_batch_size=1)
scheds="1f1b interleaved zb-h1 zbv"
for s in $scheds; do
    v=1; case $s in interleaved|zbv) v=2 ;; esac
    "$TRIDENT" plan "${small[@]}" parallel.virtual_stages=$v --schedule $s --show-schedule --unit-costs --json \
        > "$tmp/u_$s.json"
    "$TRIDENT" plan "${small[@]}" parallel.virtual_stages=$v --schedule $s --show-schedule --unit-costs \
        > "$tmp/u_$s.txt"
done
"$PY" - "$tmp" "$scheds" <<'PY' || fail "a: unit-cost schedules"
import json, sys
d, scheds = sys.argv[1], sys.argv[2].split()
p, m = 4, 8
want = {"1f1b": (p - 1) / (m + p - 1), "interleaved": (p - 1) / (2 * m + p - 1), "zb-h1": (p - 1) / (3 * m + p - 1)}
got = {}
for s in scheds:
    o = json.load(open(f"{d}/u_{s}.json"))
    g = o["schedule"]
    assert o["pp_schedule"] == s == g["pp_schedule"], (o["pp_schedule"], g["pp_schedule"])
    assert (g["pp"], g["microbatches"], g["costs"], g["f"], g["b"], g["w"], g["comm"]) == (p, m, "unit", 1, 1, 1, 0), g
    got[s] = g["bubble"]
    if s in want:
        assert abs(g["bubble"] - want[s]) < 1e-12, (s, g["bubble"], want[s])
    # the printed text is the JSON's timeline: one line a stage with its idle time
    txt = open(f"{d}/u_{s}.txt").read()
    assert g["timeline"] in txt, (s, g["timeline"], txt[-2000:])
    lines = [l for l in g["timeline"].split("\n") if l.startswith("stage ")]
    assert len(lines) == p, lines
    # F, B, W one unit each (a whole backward two): 3 units of every (microbatch, chunk)
    ops = sum(sum(c in "FBWfbw" for c in l.split()[2]) for l in lines)
    assert ops == p * m * g["virtual_stages"] * 3, (s, ops)
    print(f"a: {s} at p {p}, m {m}, v {g['virtual_stages']}, unit costs: bubble {g['bubble']:.4f}"
          + (f" = {want[s]:.4f} by the closed form" if s in want else ""))
o = json.load(open(f"{d}/u_1f1b.json"))["schedule"]
assert o["idle"] == [(p - 1) * 3] * p and o["makespan"] == 3 * m + 3 * (p - 1), o
o = json.load(open(f"{d}/u_zb-h1.json"))["schedule"]
assert o["idle"] == [(p - 1) * 1] * p and o["makespan"] == 3 * m + (p - 1), o
assert got["zbv"] < got["zb-h1"] < got["1f1b"], got
print(f"a: ZB-V {got['zbv']:.4f} < ZB-H1 {got['zb-h1']:.4f} < 1F1B {got['1f1b']:.4f}")
PY

# b. op costs by hand (every FLOP at efficiency 0.5 on H100: 989e12 x 0.5)
cfg=configs/llama3-70b.ini
"$TRIDENT" plan $cfg --gpus 64 --top 0 --efficiency 0.5 --json > "$tmp/b_search.json"
"$TRIDENT" plan $cfg --gpus 64 --efficiency 0.5 --show-schedule --top 0 --json > "$tmp/b_show.json"
"$TRIDENT" plan $cfg --world-size 64 --efficiency 0.5 --show-schedule --json > "$tmp/b_plan.json"
"$PY" - "$tmp" <<'PY' || fail "b: op costs"
import json, sys
d = sys.argv[1]
c = json.load(open(f"{d}/b_search.json"))["config_layout"]
show = json.load(open(f"{d}/b_show.json"))["schedule"]
plan = json.load(open(f"{d}/b_plan.json"))
assert c["fits"], c
V, C, L, H, Hkv, F, T = 128256, 8192, 80, 64, 8, 28672, 8192
D = C // H
tp, pp, v, dp, mb, B = c["tp"], c["pp"], c["virtual_stages"], c["dp"], c["micro_batch_size"], c["global_batch_size"]
N, m = tp * pp * dp, B // (mb * dp)
matmul = L * (2 * C * C + 2 * C * Hkv * D + 3 * C * F) + V * C
rate = 989e12 * 0.5
chunk = -(-L // (pp * v))
imb = chunk * pp * v / L  # the slowest stage's share
ops = m * v
f = (6 * matmul + 6 * L * C * T) * B * T / N / 3 / rate * imb / ops
w = 2 * matmul * B * T / N / rate * imb / ops
op = c["op_seconds"]
assert abs(op["f"] / f - 1) < 1e-9 and abs(op["w"] / w - 1) < 1e-9, (op, f, w)
assert abs((op["f"] + op["b"] + op["w"]) * ops / (c["compute_s"] + c["recompute_s"]) - 1) < 1e-9, op
for k in ("f", "b", "w", "comm"):  # --show-schedule: the same costs, from --gpus and from --world-size
    assert show[k] == op[k], (k, show[k], op[k])
    assert abs(plan["schedule"][k] / op[k] - 1) < 1e-12, (k, plan["schedule"][k], op[k])
assert plan["pp_schedule"] == show["pp_schedule"] == c["pp_schedule"]
print(f"b: llama3-70b tp {tp} pp {pp} v {v} on 64 H100 at efficiency 0.5: F {1e3 * op['f']:.2f} ms, "
      f"W {1e3 * op['w']:.2f} ms by hand, B {1e3 * op['b']:.2f} ms; simulated bubble {show['bubble']:.4f}")
PY

# c. the simulated bubble of 1F1B and interleaved layouts = Narayanan's closed form
"$TRIDENT" plan configs/published/megatron-145b.ini --gpus 1536 --gpu A100-80G --top 400 --json > "$tmp/c.json"
"$PY" - "$tmp/c.json" <<'PY' || fail "c: 1F1B's bubble"
import json, sys
o = json.load(open(sys.argv[1]))
n = 0
for l in o["layouts"]:
    parts = sum(l[k] for k in ("compute_s", "recompute_s", "bubble_s", "tp_comm_s", "cp_comm_s", "pp_comm_s",
                               "dp_exposed_s"))
    assert abs(parts / l["step_s"] - 1) < 1e-9, l
    if l["pp"] == 1 or l["pp_schedule"] not in ("1f1b", "interleaved"):
        continue
    m = l["global_batch_size"] // (l["micro_batch_size"] * l["dp"])
    want = (l["pp"] - 1) / (l["virtual_stages"] * m) * (l["compute_s"] + l["recompute_s"])
    assert abs(l["bubble_s"] / want - 1) < 1e-9, (l["bubble_s"], want, l)
    n += 1
assert n >= 50, n
print(f"c: megatron-145b on 1536 A100: {n} 1F1B / interleaved layouts, bubble_s = (p - 1) / (v m) x compute")
PY

# d. a cluster where pipelines win: Llama 2 7B on 16 H100, one a node
"$TRIDENT" plan configs/llama2-7b.ini --gpus 16 --gpus-per-node 1 --top 100000 --json > "$tmp/d.json"
"$PY" - "$tmp/d.json" <<'PY' || fail "d: zero-bubble layouts in the search"
import json, sys
lay = json.load(open(sys.argv[1]))["layouts"]
kinds = {l["pp_schedule"] for l in lay}
assert {"zb-h1", "zbv"} <= kinds <= {"1f1b", "interleaved", "zb-h1", "zbv"}, kinds
key = lambda l: (l["tp"], l["pp"], l["virtual_stages"], l["dp"], l["micro_batch_size"], l["recompute"],
                 l["zero_stage"], l["dp_shard"], l["reshard_after_forward"])
place = {(key(l), l["pp_schedule"]): i for i, l in enumerate(lay)}
twin = {"zb-h1": "1f1b", "zbv": "interleaved"}
assert lay[0]["pp"] >= 2, lay[0]
# the fastest zero-bubble layout is among those --top 5 prints (here the first), faster than its twin
best = next(l for l in lay if l["pp_schedule"] in twin)
assert lay.index(best) < 5, lay.index(best)
pair = place.get((key(best), twin[best["pp_schedule"]]))
assert pair is not None and lay[pair]["step_s"] > best["step_s"], (best, pair)
faster = n_zb = 0
for i, l in enumerate(lay):
    if l["pp_schedule"] not in twin:
        continue
    n_zb += 1
    j = place.get((key(l), twin[l["pp_schedule"]]))
    if j is not None and lay[j]["step_s"] > l["step_s"]:
        assert j > i, (l, lay[j])
        faster += 1
    if l["pp_schedule"] == "zb-h1":
        op = l["op_seconds"]
        want = (l["pp"] - 1) * (op["f"] + op["b"] - op["w"])
        assert abs(l["bubble_s"] / want - 1) < 1e-9, (l["bubble_s"], want, op)
t = lay[pair]
print(f"d: llama2-7b on 16 H100 one a node: place {lay.index(best) + 1} {best['pp_schedule']} pp {best['pp']} v {best['virtual_stages']} "
      f"mb {best['micro_batch_size']} ({best['step_s']:.3f} s, bubble {best['bubble_s']:.3f} s) against "
      f"{t['pp_schedule']} at place {pair + 1} ({t['step_s']:.3f} s, bubble {t['bubble_s']:.3f} s); {faster} of "
      f"{n_zb} zero-bubble layouts faster than their twin, each ranked above it")
PY

# e. refusals
rc=0; msg=$("$TRIDENT" plan "${small[@]}" --schedule foo 2>&1) || rc=$?
[ "$rc" = 2 ] && grep -qF -- "--schedule 'foo': expected one of: 1f1b, interleaved, zb-h1, zbv" <<<"$msg" ||
    fail "e: --schedule foo: rc $rc, '$msg'"
rc=0; msg=$("$TRIDENT" plan "${small[@]}" parallel.virtual_stages=2 --schedule zb-h1 2>&1) || rc=$?
[ "$rc" = 2 ] && grep -q "pp_schedule = zb-h1 needs virtual_stages = 1" <<<"$msg" && grep -q "virtual_stages = 2" <<<"$msg" ||
    fail "e: zb-h1 at v 2: rc $rc, '$msg'"
rc=0; msg=$("$TRIDENT" plan "${small[@]}" --schedule foo --gpus 4 2>&1) || rc=$?
[ "$rc" = 2 ] && grep -qF "'foo'" <<<"$msg" || fail "e: --gpus --schedule foo: rc $rc, '$msg'"
echo "e: $(head -1 <<<"$msg")"
echo "plan_schedule: ok"
