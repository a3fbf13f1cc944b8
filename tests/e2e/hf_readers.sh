#!/usr/bin/env bash
# hf_readers.sh: issue 28's fuzz findings in the Hugging Face readers
# (src/ckpt/hf_config.c, hf.c, safetensors.c), each a case: a copy of the
# mistral fixture folder (tests/reference/fixtures/hf_families/mistral) with
# one bad input. `trident import` must exit 2 with a message naming the file,
# the key and the value (each case's pattern), in under 1 s and 64 MiB of
# resident memory, with the plain build and with the AddressSanitizer + UBSan
# build (build-asan/trident, which `make test` builds; any sanitizer report
# fails the case; ASan allocations above 64 MiB fail too). A FIFO in place of
# a file (config.json, generation_config.json, model.safetensors,
# tokenizer.json, a shard the index names) is refused, not waited on (a 5 s
# timeout would catch a hang).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
need_built "$TRIDENT" build-asan/trident
need_py numpy
FIX=tests/reference/fixtures/hf_families/mistral
C="$tmp/cases"
mkdir -p "$C"
# One folder per case, and its expected message in CASE/expect.
$PY - "$FIX" "$C" <<'EOF'
import json, os, shutil, sys
fix, out = sys.argv[1:]
base = json.load(open(f"{fix}/config.json"))
cases = {}
def config(name, expect, **kw):
    drop = kw.pop("_drop", [])
    c = dict(base, **kw)
    for k in drop: c.pop(k)
    cases[name] = ({"config.json": c}, expect)
config("head_dim_2_62", r"config.json: head_dim = 4611686018427387904, must be in \[1, ", head_dim=2**62)
config("head_dim_2_63m1", r"config.json: head_dim = 9223372036854775807, must be in", head_dim=2**63 - 1)
config("head_dim_negative", r"config.json: head_dim = -8, must be in", head_dim=-8)
config("kv_heads_2_32p1", r"config.json: num_key_value_heads = 4294967297, must be in", num_key_value_heads=2**32 + 1)
config("eos_2_32p5", r"config.json: eos_token_id = 4294967301: token ids are integers in \[0, vocab_size = 264\)", eos_token_id=2**32 + 5)
config("eos_list_bad", r'config.json: eos_token_id = \[3,"4"\]: token ids', eos_token_id=[3, "4"])
config("eos_list_empty", r"config.json: eos_token_id = \[\]: a list of 1 to 16 ids", eos_token_id=[])
config("bos_real", r"config.json: bos_token_id = 1.0 is not a token id", bos_token_id=1.0)
config("eps_zero", r"config.json: rms_norm_eps = 0, must be > 0", rms_norm_eps=0)
config("eps_negative", r"config.json: rms_norm_eps = -1e-0?5, must be > 0", rms_norm_eps=-1e-5)
config("theta_zero", r"config.json: rope_theta = 0.0, must be > 0", rope_theta=0.0)
config("theta_negative", r"config.json: rope_theta = -10000, must be > 0", rope_theta=-10000)
config("theta_string", r'config.json: rope_theta = "10000" is not a number', rope_theta="10000")
config("hidden_string", r'config.json: hidden_size = "32" is not an integer', hidden_size="32")
config("heads_real", r"config.json: num_attention_heads = 4.0 is not an integer", num_attention_heads=4.0)
config("layers_bool", r"config.json: num_hidden_layers = true is not an integer", num_hidden_layers=True)
config("tie_string", r'config.json: tie_word_embeddings = "false" is not a boolean', tie_word_embeddings="false")
config("tie_zero", r"config.json: tie_word_embeddings = 0 is not a boolean", tie_word_embeddings=0)
config("layers_1e6", r"config.json: num_hidden_layers = 1000000, must be in \[1, 4096\]", num_hidden_layers=10**6)
config("layers_2_31m1", r"config.json: num_hidden_layers = 2147483647, must be in \[1, 4096\]", num_hidden_layers=2**31 - 1)
config("vocab_2_40", r"config.json: vocab_size = 1099511627776, must be in", vocab_size=2**40)
config("max_pos_string", r'config.json: max_position_embeddings = "128" is not an integer', max_position_embeddings="128")
config("rope_yarn", r'config.json: rope_scaling rope_type = "yarn": trident implements default, linear and llama3',
       architectures=["LlamaForCausalLM"], model_type="llama", _drop=["sliding_window"],
       rope_scaling={"rope_type": "yarn", "factor": 4.0})
config("mistral_window", r"config.json: sliding_window = 16 \(below max_position_embeddings = 128\): trident has no sliding-window attention", sliding_window=16)
config("mistral_window_default", r"config.json: sliding_window = 4096 \(below max_position_embeddings = 1000000", _drop=["sliding_window"], max_position_embeddings=10**6)
config("llama_attention_bias", r"config.json: attention_bias = true: trident implements only attention_bias = false for LlamaForCausalLM",
       architectures=["LlamaForCausalLM"], model_type="llama", _drop=["sliding_window"], attention_bias=True)
config("dropout", r"config.json: attention_dropout = 0.1: trident implements only attention_dropout = 0", attention_dropout=0.1)
config("act", r'config.json: hidden_act = "gelu", trident computes silu', hidden_act="gelu")
config("arch", r'config.json: architectures = \["GPT2LMHeadModel"\]; trident reads', architectures=["GPT2LMHeadModel"])
config("model_type", r'config.json: model_type = "llama", MistralForCausalLM', model_type="llama")
cases["gen_eos_string"] = ({"generation_config.json": {"eos_token_id": "2"}},
                           r'generation_config.json: eos_token_id = "2" is not a token id')
cases["gen_eos_range"] = ({"generation_config.json": {"eos_token_id": [2, 264]}},
                          r"generation_config.json: eos_token_id = \[2,264\]: token ids are integers in \[0, vocab_size = 264\)")
cases["gen_pad_bool"] = ({"generation_config.json": {"pad_token_id": False}},
                         r"generation_config.json: pad_token_id = false is not a token id")
for bad, why in [("..", '".."'), (".", '"."'), ("", '""'), ("config.json", '"config.json"'),
                 ("../mistral/model.safetensors", '"../mistral/model.safetensors"')]:
    name = "weight_map_" + {"..": "dotdot", ".": "dot", "": "empty", "config.json": "config",
                            "../mistral/model.safetensors": "outside"}[bad]
    cases[name] = ({"model.safetensors.index.json": {"metadata": {}, "weight_map": {"model.norm.weight": bad}}},
                   r'model.safetensors.index.json: weight_map\["model.norm.weight"\] = ' + why.replace(".", r"\.") +
                   r" is not the name of a safetensors file in the folder")
for name, (files, expect) in cases.items():
    d = f"{out}/{name}"
    os.makedirs(d)
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(f"{fix}/{f}", d)
    for f, j in files.items():
        json.dump(j, open(f"{d}/{f}", "w"))
    open(f"{d}/expect", "w").write(expect)
EOF
# FIFOs: config.json, generation_config.json, model.safetensors, tokenizer.json, a shard.
for f in config.json generation_config.json model.safetensors tokenizer.json; do
    d="$C/fifo_${f%%.*}"
    mkdir "$d" && cp "$FIX"/config.json "$FIX"/generation_config.json "$FIX"/model.safetensors "$FIX"/tokenizer.json "$d/"
    rm "$d/$f" && mkfifo "$d/$f"
    echo "$f: not a regular file" > "$d/expect"
done
d="$C/fifo_shard"
mkdir "$d" && cp "$FIX"/config.json "$d/" && mkfifo "$d/model-00001-of-00001.safetensors"
echo '{"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors"}}' \
    > "$d/model.safetensors.index.json"
echo "model-00001-of-00001.safetensors: not a regular file" > "$d/expect"

n=0
for T in "$TRIDENT" "$PWD/build-asan/trident"; do
    for d in "$C"/*/; do
        d=${d%/} name=$(basename "$d")
        rm -rf "$tmp/out"
        rc=0
        ASAN_OPTIONS=detect_leaks=0:max_allocation_size_mb=64:allocator_may_return_null=0 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
            /usr/bin/time -f "%e %M" -o "$tmp/time" timeout -k 2 5 "$T" import "$d" "$tmp/out" \
            > /dev/null 2> "$tmp/err" || rc=$?
        grep -q -E 'Sanitizer|runtime error:' "$tmp/err" && fail "$name ($T): $(grep -m1 -E 'Sanitizer|runtime error:' "$tmp/err")"
        [ "$rc" -eq 2 ] || fail "$name ($T): exit $rc, $(head -c 300 "$tmp/err")"
        grep -q -E -- "$(cat "$d/expect")" "$tmp/err" || fail "$name ($T): message $(cat "$tmp/err"), expected /$(cat "$d/expect")/"
        [ ! -e "$tmp/out" ] || fail "$name ($T): refused but $tmp/out written"
        read -r secs kb < <(tail -n1 "$tmp/time")
        awk -v s="$secs" 'BEGIN { exit !(s < 1.0) }' || fail "$name ($T): $secs s, more than 1 s"
        # ASan's shadow memory and quarantine count in its resident set; the
        # plain build's is the reader's.
        if [ "$T" = "$TRIDENT" ]; then
            [ "$kb" -le 65536 ] || fail "$name: $kb KiB resident, more than 64 MiB"
        fi
        n=$((n + 1))
    done
done
echo "ok: $n refusals (plain and ASan + UBSan builds), each exit 2 naming file, key and value, under 1 s (plain build also under 64 MiB)"
