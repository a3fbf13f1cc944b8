"""hf_bad.py: a copy of a Hugging Face folder with one defect, for the
refusal rows of tests/e2e/hf_export.sh. Reads and writes safetensors with
struct and json alone (the format: an 8-byte little-endian header length,
a JSON header of dtype/shape/data_offsets, then the data).

  hf_bad.py SRC DST nonfinite TENSOR ELEMENT   element ELEMENT (row-major) of
                                               TENSOR := NaN (F32) or +inf (BF16/F16)
  hf_bad.py SRC DST drop TENSOR                TENSOR removed from its file's header
  hf_bad.py SRC DST config KEY JSON_VALUE      config.json's KEY := the value
  hf_bad.py SRC DST reshard TENSOR             the index names another shard for TENSOR
  hf_bad.py SRC DST rm FILE                    FILE removed
"""
import json, os, shutil, struct, sys

src, dst, what = sys.argv[1:4]
args = sys.argv[4:]
shutil.copytree(src, dst)


def shard_of(name):
    idx = os.path.join(dst, "model.safetensors.index.json")
    if os.path.exists(idx):
        return os.path.join(dst, json.load(open(idx))["weight_map"][name])
    return os.path.join(dst, "model.safetensors")


def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), bytearray(b[8 + n:])


def save(path, header, data):
    s = json.dumps(header).encode()
    s += b" " * ((8 - len(s) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(s)) + s + bytes(data))


if what == "nonfinite":
    name, k = args[0], int(args[1])
    path = shard_of(name)
    h, data = load(path)
    t = h[name]
    o = t["data_offsets"][0]
    if t["dtype"] == "F32":
        data[o + 4 * k:o + 4 * k + 4] = struct.pack("<f", float("nan"))
    else:
        word = 0x7F80 if t["dtype"] == "BF16" else 0x7C00
        data[o + 2 * k:o + 2 * k + 2] = struct.pack("<H", word)
    save(path, h, data)
elif what == "drop":
    path = shard_of(args[0])
    h, data = load(path)
    del h[args[0]]
    save(path, h, data)
elif what == "config":
    p = os.path.join(dst, "config.json")
    c = json.load(open(p))
    c[args[0]] = json.loads(args[1])
    json.dump(c, open(p, "w"))
elif what == "reshard":
    p = os.path.join(dst, "model.safetensors.index.json")
    j = json.load(open(p))
    wm = j["weight_map"]
    other = sorted(set(wm.values()) - {wm[args[0]]})[0]
    wm[args[0]] = other
    json.dump(j, open(p, "w"))
elif what == "rm":
    os.remove(os.path.join(dst, args[0]))
else:
    sys.exit(f"hf_bad.py: unknown defect {what}")
