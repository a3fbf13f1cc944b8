#!/usr/bin/env bash
# plan_fp8.sh: `trident plan` with precision.fp8 (issue 29, acceptance 6;
# docs/planning.md §7), against the same plan in bf16:
#  a. time: with every FLOP at one efficiency (--efficiency 0.5) the compute
#     term of Llama 3 8B on 8 H100 is the block linears' 6 x params a token at
#     the FP8 peak (1979 TFLOP/s) and the rest at the bf16 peak (989), written
#     out here from the shapes; with the kernel model the fp8 step is shorter
#     than bf16's but more than half of it (attention, the head, norms and
#     the casts stay), and the ratio `vs bf16` is printed;
#  b. memory: the FP8 copies (plan_fp8_bytes = the model's model_fp8_plan_bytes)
#     by hand for the config's layout (tp 2, one slot): weights 1 byte per
#     block-linear element of the rank's 32 layers; no GEMM input kept per
#     slot (the model casts x again for the weight gradient), under recompute
#     none and full alike; work: the two FP8 scratch buffers and the delayed
#     scaling state (12 tensors a layer, history 1: Megatron-LM's default); params and
#     activations grow by exactly those and nothing else changes;
#  c. refusals: FP8 on a GPU without FP8 tensor cores (A100) exits 2 naming
#     precision.fp8 and the GPU; precision.fp8 with precision.dtype fp32 exits
#     2 naming both keys, in the search (--gpus) and the memory plan
#     (--world-size): the trainer's own rule (config_validate);
#  d. precision.fp8_skip_layers = first,last: at one efficiency 30 of the 32
#     blocks' linears at the FP8 peak, by hand.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
need_py
cfg=configs/llama3-8b.ini
# a. time
for f in none hybrid; do
    "$TRIDENT" plan $cfg --gpus 8 --gpu H100-SXM --top 0 --efficiency 0.5 --set precision.fp8=$f --json > "$tmp/c_$f.json"
    "$TRIDENT" plan $cfg --gpus 8 --gpu H100-SXM --top 0 --set precision.fp8=$f --json > "$tmp/k_$f.json"
done
"$TRIDENT" plan $cfg --gpus 8 --gpu H100-SXM --top 0 --set precision.fp8=hybrid > "$tmp/k.txt"
"$PY" - "$tmp" <<'PY' || fail "a: fp8 step time"
import json, sys
d = sys.argv[1]
o = {k: json.load(open(f"{d}/{k}.json"))["config_layout"] for k in ("c_none", "c_hybrid", "k_none", "k_hybrid")}
V, C, L, H, Hkv, F, T, B, N = 128256, 4096, 32, 32, 8, 14336, 8192, 64, 8
D = C // H
lin = L * (C * (H * D + 2 * Hkv * D) + H * D * C + 3 * C * F)  # q, k, v, o, gate, up, down
flops = (6 * (lin + V * C) + 6 * L * C * T) * B * T / N  # a GPU's model FLOPs a step
f8 = 6 * lin * B * T / N
want = (flops - f8) / (989e12 * 0.5) + f8 / (1979e12 * 0.5)
got = o["c_hybrid"]["compute_s"]
assert abs(got / want - 1) < 1e-9, (got, want)
assert abs(o["c_none"]["compute_s"] / (flops / (989e12 * 0.5)) - 1) < 1e-9
assert o["c_hybrid"]["bf16_step_s"] == o["c_none"]["step_s"], (o["c_hybrid"]["bf16_step_s"], o["c_none"]["step_s"])
k8, kb = o["k_hybrid"], o["k_none"]
r = kb["step_s"] / k8["step_s"]
assert kb["compute_s"] / 2 < k8["compute_s"] < kb["compute_s"], (k8["compute_s"], kb["compute_s"])
assert 1.0 < r < 2.0 and abs(k8["bf16_step_s"] - kb["step_s"]) < 1e-12, (r, k8["bf16_step_s"], kb["step_s"])
# the same layout's FLOPs: MFU rises by the step ratio (MFU against the bf16 peak in both)
assert abs(k8["mfu"] / kb["mfu"] - r) < 1e-9
print(f"a: compute at efficiency 0.5: {got:.4f} s = {want:.4f} s by hand (bf16 {o['c_none']['compute_s']:.4f} s); "
      f"kernel model: step {k8['step_s']:.3f} s against {kb['step_s']:.3f} s in bf16 ({r:.2f}x)")
PY
grep -Eq "^fp8 hybrid against bf16, the config's layout: step [0-9.]+ s against [0-9.]+ s \([0-9.]+x, \+[0-9]+% tokens/s\), peak" "$tmp/k.txt" ||
    fail "a: no ratio line: $(cat "$tmp/k.txt")"
echo "a: $(grep '^fp8 hybrid' "$tmp/k.txt")"
# b. memory
for r in none full; do
    for f in none hybrid; do
        "$TRIDENT" plan $cfg --world-size 8 model.recompute=$r --set precision.fp8=$f --json > "$tmp/m_${r}_$f.json"
    done
done
"$PY" - "$tmp" <<'PY' || fail "b: fp8 bytes"
import json, sys
d = sys.argv[1]
C, L, H, Hkv, F, T, tp = 4096, 32, 32, 8, 14336, 8192, 2
D = C // H
HD, KD, Fl, N = H * D // tp, Hkv * D // tp, F // tp, 1 * T
lin = C * (HD + 2 * KD) + HD * C + 3 * C * Fl  # a layer's block linears on one tp rank
a256 = lambda n: (n + 255) // 256 * 256  # every buffer of the model starts 256 bytes apart
for r in ("none", "full"):
    b, f = (json.load(open(f"{d}/m_{r}_{x}.json"))["groups"][0] for x in ("none", "hybrid"))
    assert f["fp8_weight_bytes"] == a256(L * lin), (f["fp8_weight_bytes"], L * lin)
    assert f["fp8_saved_bytes"] == 0, (r, f["fp8_saved_bytes"])
    scratch = a256(N * max(C, HD, Fl)) + a256(N * max(HD + 2 * KD, C, 2 * Fl))  # x8, dy8
    n = 12 * L  # scaling tensors: x, w, dy of 4 sites a layer
    state = 3 * a256(4 * n) + a256(4 * n * 1) + a256(8)  # scale, scale_inv, amax; history; count
    work = scratch + state
    assert f["fp8_work_bytes"] == work, (r, f["fp8_work_bytes"], work)
    assert f["params_bytes"] - b["params_bytes"] == f["fp8_weight_bytes"]
    assert f["activation_bytes"] - b["activation_bytes"] == f["fp8_saved_bytes"] + f["fp8_work_bytes"]
    assert (f["grads_bytes"], f["optimizer_bytes"]) == (b["grads_bytes"], b["optimizer_bytes"])
    assert "fp8_weight_bytes" not in b
    print(f"b: recompute {r}: FP8 weights {f['fp8_weight_bytes'] / 2**30:.2f} GiB, saved inputs "
          f"{f['fp8_saved_bytes'] / 2**30:.2f} GiB, work {f['fp8_work_bytes'] / 2**20:.1f} MiB = by hand")
PY
# c. refusals
rc=0; msg=$("$TRIDENT" plan $cfg --gpus 8 --gpu A100-80G --set precision.fp8=hybrid 2>&1) || rc=$?
[ "$rc" = 2 ] && grep -q "precision.fp8 = hybrid needs FP8 tensor cores: --gpu A100-80G has none" <<<"$msg" ||
    fail "c: fp8 on A100: rc $rc, '$msg'"
echo "c: $msg"
for mode in "--gpus 8" "--world-size 8"; do
    rc=0; msg=$("$TRIDENT" plan $cfg $mode --set precision.fp8=hybrid precision.dtype=fp32 2>&1) || rc=$?
    [ "$rc" = 2 ] && grep -q "precision.fp8 = hybrid" <<<"$msg" && grep -q "precision.dtype = fp32" <<<"$msg" ||
        fail "c: fp8 on fp32 ($mode): rc $rc, '$msg'"
done
echo "c: $msg"
# d. skipped blocks stay bf16 in the time model
"$TRIDENT" plan $cfg --gpus 8 --gpu H100-SXM --top 0 --efficiency 0.5 --set precision.fp8=hybrid \
    precision.fp8_skip_layers=first,last --json > "$tmp/d.json"
"$PY" - "$tmp/d.json" <<'PY' || fail "d: fp8_skip_layers"
import json, sys
c = json.load(open(sys.argv[1]))["config_layout"]
V, C, L, H, Hkv, F, T, B, N = 128256, 4096, 32, 32, 8, 14336, 8192, 64, 8
D = C // H
layer = C * (H * D + 2 * Hkv * D) + H * D * C + 3 * C * F
flops = (6 * (L * layer + V * C) + 6 * L * C * T) * B * T / N
f8 = 6 * (L - 2) * layer * B * T / N  # the first and the last block in bf16
want = (flops - f8) / (989e12 * 0.5) + f8 / (1979e12 * 0.5)
assert abs(c["compute_s"] / want - 1) < 1e-9, (c["compute_s"], want)
print(f"d: fp8_skip_layers = first,last: compute {c['compute_s']:.4f} s = {want:.4f} s by hand (30 FP8 blocks)")
PY
echo "plan_fp8: ok"
