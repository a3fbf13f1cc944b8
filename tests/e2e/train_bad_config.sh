#!/usr/bin/env bash
# train_bad_config.sh: bad configs and command lines given to
# `mpirun -np 2 trident train` end the whole job with exit 2 and a message that
# names the file:line or argument, the key, the value found and what was
# expected; no process of the run is left alive 10 s after it started.
# Each row: a label; an edit of a valid config: "set S.K=V" (replace or add
# key K of section S), or "add TEXT" (lines appended, \n for newlines), or
# nothing; command-line arguments after the config; and an extended regex
# the message must match.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT"
small_dataset "$tmp"
# set_key FILE SECTION KEY VALUE: replaces KEY's line in [SECTION], or adds it.
set_key() {
    awk -v sec="[$2]" -v key="$3" -v val="$4" '
        /^\[/ { if (in_sec && !done) { print key " = " val; done = 1 } in_sec = ($0 == sec) }
        in_sec && $1 == key && !done { print key " = " val; done = 1; next }
        { print }
        END { if (!done) { if (!in_sec) print sec; print key " = " val } }' "$1" > "$1.new" && mv "$1.new" "$1"
}
# Each case ends in MPI_Abort; mpirun then SIGTERMs the other rank and waits
# odls_base_sigkill_timeout (1 s) before SIGKILL, a second a case. trident's
# SIGTERM handler only asks for a save at a step boundary, which these
# start-up failures never reach: 0 s ends the same way without the wait.
export OMPI_MCA_odls_base_sigkill_timeout=0
base="$tmp/base.ini"
cp "$SMALL_INI" "$base"
set_key "$base" data path "$tmp/shards"
set_key "$base" parallel dp 2
cases=(
"unknown section|add [trainer]\nsteps = 5||unknown section .?\[?trainer"
"unknown key|set train.stepz=5||stepz.*did you mean.*steps"
"key in wrong section|set model.lr=0.1||lr.*train.lr"
"wrong type int|set train.steps=ten||train.steps.*ten"
"trailing junk|set train.steps=100abc||train.steps.*100abc"
"junk after number|set train.steps=100 total||train.steps.*100 total"
"float for int|set model.d_model=64.5||model.d_model.*64.5"
"out of range|set train.lr=-1||train.lr.*-1"
"negative size|set data.cache_bytes=-4G||data.cache_bytes.*-4G"
"overflow|set train.steps=99999999999999999999||train.steps.*99999999999999999999"
"empty value|set train.seed=||train.seed.*empty"
"duplicate key|add [system]\nthreads = 1||system.threads.*twice"
"malformed line|add [log]\nevery 5||:[0-9]+"
"bad section header|add [log\nevery = 5||:[0-9]+"
"unknown device|set system.device=tpu||system.device.*tpu.*cpu, cuda"
"unknown dtype|set precision.dtype=fp8||precision.dtype.*fp8"
"fp8 without bf16||precision.fp8=hybrid|precision.fp8 = hybrid.*needs precision.dtype = bf16.*precision.dtype = fp32"
"fp8 skipping every block||precision.dtype=bf16 precision.fp8=e4m3 precision.fp8_skip_layers=first,last|fp8_skip_layers = first,last.*model.n_layers = 2.*precision.fp8 = e4m3"
"fp8_skip_layers not a whole count||precision.dtype=bf16 precision.fp8=hybrid precision.fp8_skip_layers=1.5|fp8_skip_layers = 1.5.*whole number"
"bad bool|set model.tie_embeddings=maybe||model.tie_embeddings.*maybe"
"world size|set parallel.dp=3||tp = 1 x cp = 1 x ep = 1 x dp_shard = 3 x dp_replicate = 1 x pp = 1 give 3.*N = 2"
"dp_shard not dividing dp|set parallel.dp_shard=3||dp_shard must divide dp.*parallel.dp_shard = 3.*parallel.dp = 2"
"heads vs kv heads|set model.n_kv_heads=3||n_kv_heads.*3"
"layers < pp|set model.n_layers=1|parallel.pp=2 parallel.dp=1|n_layers.*1.*pp.*2|pp.*2.*n_layers.*1"
"global batch divisibility|set train.global_batch_size=6||global_batch_size.*6"
"inferred dp, world not a multiple of tp * pp|set parallel.dp=0|parallel.tp=4|N = 2 ranks is not a multiple of tp \\* cp \\* pp = 4.*run on 4 ranks"
"inferred dp, global batch|set parallel.dp=0|train.global_batch_size=6|infers dp = 2 ranks.*global_batch_size = 4 or 8.*1 or 3 ranks \\(dp = 1 or 3\\)"
"seq_len > max_seq_len|set train.seq_len=128||seq_len.*128.*max_seq_len"
"seq_len not a multiple of 2 cp||parallel.cp=2 parallel.dp=1 train.seq_len=30|seq_len must be a multiple of 2 \\* cp = 4.*train.seq_len = 30.*parallel.cp = 2"
"vocab vs data|set model.vocab_size=1024||1024.*510|510.*1024"
"missing dataset|set data.path=/nonexistent/shards||/nonexistent/shards"
"override without =||train.steps|train.steps"
"override unknown key||train.stepss=5|stepss.*did you mean"
"Megatron-LM name|set model.moe_router_topk=2||unknown key 'moe_router_topk' in \\[model\\]; Megatron-LM's --moe-router-topk is model.moe_top_k here"
"Megatron-LM name of another section|set model.tensor_model_parallel_size=2||Megatron-LM's --tensor-model-parallel-size is parallel.tp here"
"Megatron-LM flag on the command line||--num-layers 4|Megatron-LM's --num-layers is model.n_layers here"
"override without section||steps=5|steps=5"
"override bad value||train.lr=fast|train.lr.*fast"
"cuda in cpu build||system.device=cuda|no CUDA|cuda"
"fewer microbatches than stages|set model.n_layers=4|parallel.pp=2 parallel.dp=1 train.global_batch_size=2|pp = 2.*1 microbatches.*fewer microbatches"
"heads vs tp|set model.n_heads=1|parallel.tp=2 parallel.dp=1 model.n_kv_heads=1|n_heads.*1.*tp.*2|tp.*2.*n_heads.*1"
"layers < pp * virtual_stages|set parallel.virtual_stages=2|parallel.pp=2 parallel.dp=1|n_layers.*pp \\* virtual_stages = 4"
"interleaved needs m % p == 0|set model.n_layers=4|parallel.pp=2 parallel.dp=1 parallel.virtual_stages=2 train.global_batch_size=6|virtual_stages = 2, pp_schedule = 1f1b with 3 microbatches"
"negative override||train.micro_batch_size=-2|train.micro_batch_size.*-2"
"zero_stage out of range||parallel.zero_stage=4|parallel.zero_stage.*4"
"zero 3 tied with two chunks on one rank|set parallel.virtual_stages=2|parallel.zero_stage=3 model.n_layers=4|parallel.zero_stage = 3.*tie_embeddings = true.*virtual_stages = 1 when pp = 1"
"init_std overflows fp32|set model.init_std=1e300||model.init_std = 1e\\+300.*overflows fp32.*3.40282e\\+38"
"adam_eps underflows fp32||train.adam_eps=1e-50|train.adam_eps = 1e-50.*underflows fp32"
"run_dir is a file|set log.run_dir=/etc/hostname||run_dir = /etc/hostname.*not a folder"
"config is a folder|||FOLDER"
"missing config file|||MISSING"
)
fail=0 n=0
for row in "${cases[@]}"; do
    IFS='|' read -r label ini args want <<<"$row"
    n=$((n + 1))
    cfg="$tmp/case$n.ini"
    cp "$base" "$cfg"
    marker="case$n-$$"
    set_key "$cfg" log run_dir "$tmp/$marker" # each run its own folder (a case may replace it)
    case "$ini" in
        set\ *) kv=${ini#set }; sk=${kv%%=*}; set_key "$cfg" "${sk%%.*}" "${sk#*.}" "${kv#*=}" ;;
        add\ *) printf "\n${ini#add }\n" >> "$cfg" ;;
    esac
    [ "$label" = "missing config file" ] && { cfg="$tmp/nothing-here-$marker.ini"; want="nothing-here"; }
    [ "$label" = "config is a folder" ] && { cfg="$tmp/folder-$marker"; mkdir -p "$cfg"; want="folder-$marker.*[Ii]s a directory"; }
    start=$(date +%s%N)
    # shellcheck disable=SC2086
    rc=0; out=$(timeout 20 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$cfg" $args 2>&1) || rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [ "$rc" -ne 2 ]; then
        echo "FAIL [$label]: exit $rc, expected 2"; head -5 <<<"$out"; fail=1; continue
    fi
    if ! grep -Eq -- "$want" <<<"$out"; then
        echo "FAIL [$label]: message does not match /$want/:"; head -5 <<<"$out"; fail=1; continue
    fi
    if ! mpi_no_leftovers "$cfg" >/dev/null; then
        echo "FAIL [$label]: processes left after exit"; fail=1; continue
    fi
    if [ "$ms" -gt 10000 ]; then
        echo "FAIL [$label]: took $ms ms, expected < 10 s"; fail=1; continue
    fi
    echo "ok   [$label] ($(grep -m1 -E -- "$want" <<<"$out" | cut -c1-150))"
done
# Ranks launched with different configs (an MPMD line, or a config file that
# differs between nodes): every rank compares its resolved config with rank
# 0's at start; exit 2 naming the differing line, no hang.
start=$(date +%s%N)
rc=0; out=$(timeout 20 "${MPIRUN[@]}" -np 1 "$TRIDENT" train "$base" log.run_dir="$tmp/mpmd" train.lr=1e-3 : \
    -np 1 "$TRIDENT" train "$base" log.run_dir="$tmp/mpmd" train.lr=2e-3 2>&1) || rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ "$rc" -ne 2 ] || ! grep -q "differs from rank 0's: rank 0 has \`lr = 0.001\`, this rank \`lr = 0.002\`" <<<"$out" ||
    [ "$ms" -gt 10000 ]; then
    echo "FAIL [ranks with different configs]: exit $rc in $ms ms"; head -5 <<<"$out"; fail=1
else
    echo "ok   [ranks with different configs] ($(grep -m1 "differs" <<<"$out" | cut -c1-150))"
fi
# [precision] fp8 sub-keys set while fp8 = none are read by nothing: the run
# trains (exit 0) and rank 0 alone says so once on stderr, naming the keys.
rc=0; timeout 60 "${MPIRUN[@]}" -np 2 "$TRIDENT" train "$base" log.run_dir="$tmp/fp8-none" checkpoint.dir=none \
    train.steps=1 train.warmup_steps=0 precision.fp8_margin=2 precision.fp8_scaling=current \
    >"$tmp/fp8-none.out" 2>"$tmp/fp8-none.err" || rc=$?
want="trident: warning: precision.fp8_scaling = current \(command line argument 6\), precision.fp8_margin = 2 \(command line argument 5\): have no effect with precision.fp8 = none \(default\)"
if [ "$rc" -ne 0 ] || [ "$(grep -cE -- "$want" "$tmp/fp8-none.err")" -ne 1 ]; then
    echo "FAIL [fp8 keys with fp8 = none]: exit $rc, $(grep -cE -- "$want" "$tmp/fp8-none.err") warnings (want 1):"
    tail -5 "$tmp/fp8-none.err"; fail=1
else
    echo "ok   [fp8 keys with fp8 = none] ($(grep -m1 -E -- "$want" "$tmp/fp8-none.err" | cut -c1-150))"
fi
echo "$n cases"
[ "$n" -ge 25 ] || { echo "FAIL: fewer than 25 cases"; fail=1; }
exit $fail
