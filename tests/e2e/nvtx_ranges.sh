#!/usr/bin/env bash
# nvtx_ranges.sh: the NVTX ranges of the CUDA build (src/base/nvtx.h) as a
# profiler sees them. NVTX hands its calls to the tool library named by
# NVTX_INJECTION64_PATH (what `nsys profile -t nvtx` sets); here that is
# tests/nvtx/nvtx_record.c, which writes every push and pop with its thread
# to a file per process. The emulated CUDA build (make EMU=1: the real CUDA
# backend, comm_nccl.c and trainer on CPUs, tests/cuda_emu) trains 2 steps
# at tp = 2, pp = 2 (4 ranks, 2 microbatches of one sequence per step) with
# it; then, per rank:
#  - the library was loaded (its init line), pushes and pops balance on every
#    thread (depth never below 0, 0 at the end);
#  - "optimizer" opens exactly once per step (2), "microbatch M chunk 0
#    forward" and "... backward" once per step for M = 0, 1 (the schedule's
#    microbatches, counted from the config, not from trident's output);
#  - "forward" opens inside each "microbatch ... forward", "backward" inside
#    each "microbatch ... backward" (nesting from the recorded stack);
#  - a tensor-parallel all-reduce ("comm_all_reduce ...") opens inside a
#    "forward" (the row-parallel sum) on every rank, and the pipeline's
#    messages ("comm_send_start"/"comm_recv_start") appear.
# And the CPU build ($BUILD/trident) has no NVTX: no nvtx symbol, and the
# same library loaded into a CPU run records nothing.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
EMU_BUILD="$BUILD-emu"
EMU_TRIDENT="$PWD/$EMU_BUILD/trident"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
need_built "$TRIDENT"
[ -f "$CUDA_HOME/include/nvtx3/nvToolsExt.h" ] || fail "no nvtx3 headers in $CUDA_HOME/include"
need_emu trident
need_built "$EMU_TRIDENT"
nm "$EMU_TRIDENT" > "$tmp/nm-emu"  # (a file: grep -q would SIGPIPE nm under pipefail)
grep -q ' T nvtx_range_push$' "$tmp/nm-emu" || fail "the EMU build has no nvtx_range_push (TRIDENT_NVTX unset?)"
cc -Wall -Wextra -Werror -shared -fPIC -I"$CUDA_HOME/include" tests/nvtx/nvtx_record.c \
    -o "$tmp/libnvtx_record.so" || fail "building tests/nvtx/nvtx_record.c"
small_dataset "$tmp"
common=(data.path="$tmp/shards" model.d_model=32 model.n_heads=2 model.n_kv_heads=2 model.ffn_dim=64
        model.n_layers=2 model.max_seq_len=16 train.seq_len=16 train.micro_batch_size=1
        train.global_batch_size=2 train.steps=2 train.warmup_steps=1 train.eval_every=0
        checkpoint.every=0 system.threads=1 system.peak_tflops=1)
mkdir "$tmp/rec" "$tmp/rec-cpu"
rc=0
OMP_NUM_THREADS=1 NVTX_INJECTION64_PATH="$tmp/libnvtx_record.so" TRIDENT_NVTX_RECORD="$tmp/rec" \
    timeout 180 "${MPIRUN[@]}" -np 4 -x NVTX_INJECTION64_PATH -x TRIDENT_NVTX_RECORD "$EMU_TRIDENT" train \
    "$SMALL_INI" "${common[@]}" system.device=cuda parallel.tp=2 parallel.pp=2 parallel.dp=1 \
    checkpoint.dir="$tmp/ck" log.run_dir="$tmp/run" > "$tmp/log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$tmp/log"; fail "the emulated tp=2 pp=2 run exited $rc"; }
[ "$(metrics "$tmp/run" | wc -l)" -eq 2 ] || fail "the run did not log 2 steps"

"$PY" - "$tmp/rec" <<'PY' || fail "the NVTX ranges of the emulated run"
import collections, glob, sys
files = sorted(glob.glob(sys.argv[1] + "/nvtx-*.txt"))
if len(files) != 4:
    print(f"FAIL: {len(files)} record files, want one per rank (4): the injection library was not loaded")
    sys.exit(1)
bad = 0
def want(cond, msg):
    global bad
    if not cond:
        print(f"FAIL: {msg}"); bad += 1
for path in files:
    name = path.rsplit("/", 1)[1]
    lines = open(path).read().splitlines()
    want(lines and lines[0].split(" ", 1)[1] == "init", f"{name}: no init line first")
    stacks = collections.defaultdict(list)
    opened = collections.Counter()   # range name -> pushes
    parent = collections.defaultdict(collections.Counter)  # name -> Counter(parent name)
    inside = collections.defaultdict(set)                  # name -> every ancestor's name
    for ln in lines[1:]:
        tid, rest = ln.split(" ", 1)
        if rest == "pop":
            if not stacks[tid]:
                want(False, f"{name}: thread {tid} pops with no open range"); continue
            stacks[tid].pop()
            continue
        what, rng = rest.split(" ", 1)
        assert what == "push", ln
        opened[rng] += 1
        parent[rng][stacks[tid][-1] if stacks[tid] else None] += 1
        for a in stacks[tid]: inside[rng].add(a)
        stacks[tid].append(rng)
    for tid, st in stacks.items():
        want(not st, f"{name}: thread {tid} ends with open ranges {st}")
    want(opened["optimizer"] == 2, f"{name}: 'optimizer' opened {opened['optimizer']} times, want 2 (steps)")
    for m in (0, 1):
        for d in ("forward", "backward"):
            r = f"microbatch {m} chunk 0 {d}"
            want(opened[r] == 2, f"{name}: '{r}' opened {opened[r]} times, want 2 (one per step)")
    for d in ("forward", "backward"):
        want(opened[d] >= 4, f"{name}: '{d}' opened {opened[d]} times, want >= 4")
        mb = sum(c for p, c in parent[d].items() if p and p.startswith("microbatch ") and p.endswith(d))
        want(mb == 4, f"{name}: '{d}' inside a microbatch {d} range {mb} times, want 4; parents {dict(parent[d])}")
    tp_sum = [r for r in opened if r.startswith("comm_all_reduce ") and "forward" in inside[r]]
    want(tp_sum, f"{name}: no comm_all_reduce inside a forward range (the TP sum)")
    p2p = [r for r in opened if r.startswith(("comm_send_start ", "comm_recv_start "))]
    want(p2p, f"{name}: no pipeline message range (comm_send_start / comm_recv_start)")
    print(f"{name}: {len(lines) - 1} events, {sum(opened.values())} ranges; "
          f"e.g. {sorted(tp_sum)[:1]} in forward, {sorted(p2p)[:2]}")
sys.exit(1 if bad else 0)
PY

# The CPU build: no NVTX at all.
nm "$TRIDENT" > "$tmp/nm-cpu"
if grep -qi nvtx "$tmp/nm-cpu"; then fail "the CPU build references NVTX symbols"; fi
NVTX_INJECTION64_PATH="$tmp/libnvtx_record.so" TRIDENT_NVTX_RECORD="$tmp/rec-cpu" OMP_NUM_THREADS=1 \
    timeout 120 "$TRIDENT" train "$SMALL_INI" "${common[@]}" system.device=cpu \
    checkpoint.dir="$tmp/ck-cpu" log.run_dir="$tmp/run-cpu" > "$tmp/log-cpu" 2>&1 ||
    { tail -5 "$tmp/log-cpu"; fail "the CPU run"; }
[ -z "$(ls -A "$tmp/rec-cpu")" ] || fail "the CPU build loaded the NVTX tool: $(ls "$tmp/rec-cpu")"
echo "nvtx_ranges: all checks passed"
