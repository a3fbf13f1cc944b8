#!/usr/bin/env python3
"""gen.py: the fuzz corpus of trident's readers of outside data (issue 18).

    gen.py BASE OUT N SEED

BASE holds what tests/fuzz/run.sh made with the binary under test: ds/ (a
dataset folder: index.ini, shard-00000.h5, tokenizer.json), ck/step-000001/
(a one-rank checkpoint: manifest.ini, rank-00000.h5), fuzz.ini (the config
that trained it), text.txt (prep's input). OUT gets one folder per case:

    OUT/NNNNN-NAME/cmd      the command kind (run.sh: verify, data, tok, decode,
                            prep, plan, train)
    OUT/NNNNN-NAME/expect   corrupt (must exit 2) or any (exit 0 or 2)
    OUT/NNNNN-NAME/...      the inputs, named as in BASE

The named cases are issue 18's list, each a small input; then N random
mutations per reader (checkpoint, dataset, tokenizer, config, prep) from a
fixed seed, so a corpus is the same on every run. A mutation of an HDF5 file
is written through h5py and the file's checksum in index.ini or manifest.ini
is recomputed (XXH3-64 through libxxhash), so that the reader gets past the
checksum to the planted fault, except where a case tests the checksum itself.
"""
import ctypes
import ctypes.util
import json
import os
import random
import re
import shutil
import sys
import warnings

import h5py
import numpy as np

warnings.simplefilter("ignore", DeprecationWarning)  # numpy: out-of-range ints cast on purpose

INTS = [0, 1, -1, 2, 3, 7, 255, 256, 65535, 65536, 2**31 - 2, 2**31 - 1, 2**31, -2**31,
        2**32, 2**32 + 1, 2**53, 2**61, 2**63 - 1, -2**63]

_xxh = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64


def xxh3(path):
    data = open(path, "rb").read()
    return _xxh.XXH3_64bits(data, ctypes.c_size_t(len(data))), len(data)


class Corpus:
    def __init__(self, base, out, seed):
        self.base, self.out, self.n = base, out, 0
        self.rng = random.Random(seed)

    def case(self, name, kind, expect, parts):
        """A new case folder holding copies of BASE's parts (ds, ck, fuzz.ini, text.txt)."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
        d = os.path.join(self.out, f"{self.n:05d}-{name}")
        self.n += 1
        os.makedirs(d)
        for p in parts:
            src = os.path.join(self.base, p)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(d, p), symlinks=True)
            else:
                shutil.copy(src, os.path.join(d, p))
        with open(os.path.join(d, "cmd"), "w") as f:
            f.write(kind + "\n")
        with open(os.path.join(d, "expect"), "w") as f:
            f.write(expect + "\n")
        return d


# ---- checksums kept in step with a mutation ---------------------------------

def fix_index(ds):
    """index.ini's bytes and checksum of every shard section, recomputed."""
    ip = os.path.join(ds, "index.ini")
    ix = open(ip).read()

    def sub(m):
        sec = m.group(0)
        fm = re.search(r"(?m)^file = (.*)$", sec)
        p = os.path.join(ds, fm.group(1)) if fm else None
        if not p or not os.path.isfile(p):
            return sec
        h, n = xxh3(p)
        sec = re.sub(r"(?m)^bytes = .*$", f"bytes = {n}", sec)
        return re.sub(r"(?m)^checksum = .*$", f"checksum = xxh3-64:{h:016x}", sec)
    ix = re.sub(r"\[shard-\d+\][^\[]*", sub, ix)
    open(ip, "w").write(ix)


def fix_manifest(step):
    mp = os.path.join(step, "manifest.ini")
    m = open(mp).read()

    def sub(mm):
        p = os.path.join(step, mm.group(1))
        if not os.path.isfile(p):
            return mm.group(0)
        h, n = xxh3(p)
        return f"{mm.group(1)} = xxh3-64:{h:016x} {n}"
    m = re.sub(r"(?m)^(rank-\d+\.h5) = xxh3-64:\S+ \d+$", sub, m)
    open(mp, "w").write(m)


def set_ini(path, section, key, value):
    """key = value in [section] of an INI file (added when absent)."""
    text = open(path).read()
    pat = re.compile(r"(?ms)^(\[" + re.escape(section) + r"\]\n.*?)(^" + re.escape(key) + r" = .*?$)")
    if pat.search(text):
        text = pat.sub(lambda m: m.group(1) + f"{key} = {value}", text, count=1)
    elif re.search(r"(?m)^\[" + re.escape(section) + r"\]$", text):
        text = re.sub(r"(?m)^\[" + re.escape(section) + r"\]$", f"[{section}]\n{key} = {value}", text, count=1)
    else:
        text += f"\n[{section}]\n{key} = {value}\n"
    open(path, "w").write(text)


def set_attr(obj, name, value):
    if name in obj.attrs:
        del obj.attrs[name]
    obj.attrs[name] = value


# ---- random values of every shape and type ---------------------------------

def rand_value(rng, like=None):
    """A value for an attribute: scalars, arrays, strings of both kinds, floats."""
    k = rng.randrange(11)
    if k == 0:
        return np.int64(rng.choice(INTS) if rng.random() < .8 else rng.randrange(-2**63, 2**63))
    if k == 1:
        return np.array([rng.choice(INTS) for _ in range(rng.randrange(0, 9))] or [0], dtype=np.int64)
    if k == 2:
        return np.zeros((rng.randrange(1, 4), rng.randrange(1, 4)), dtype=np.int64) + rng.choice(INTS[:12])
    if k == 3:
        return np.bytes_(b"x" * rng.choice([0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 300, 4096]))
    if k == 4:
        return np.array([b"fp32", b"bf16"] * rng.randrange(1, 4), dtype="S8")
    if k == 5:
        return np.array(["param/x" * rng.randrange(1, 40)] * rng.randrange(1, 4), dtype=h5py.string_dtype())
    if k == 6:
        return rng.choice([0.5, -1.0, 1e300, float("nan"), float("inf")])
    if k == 7:
        return np.uint64(rng.choice([0, 1, 2**63, 2**64 - 1, 2**32]))
    if k == 8:
        return np.array([rng.choice(INTS) for _ in range(2)]).astype(np.int32)
    if k == 9:
        return "vlen" * rng.randrange(0, 100)
    return np.int8(rng.randrange(-128, 128))


def mutate_int_array(rng, a):
    a = np.array(a).copy()
    if a.size:
        i = rng.randrange(a.size)
        v = rng.choice(INTS)
        if a.dtype.kind == "u":
            v = v % 2**64
        a.flat[i] = np.array(v, dtype=object).astype(np.int64 if v < 2**63 else np.uint64).astype(a.dtype)
    return a


# ---- checkpoint -------------------------------------------------------------

CK = "ck/step-000001"


def ck_case(c, name, expect="corrupt", kind="verify"):
    d = c.case(name, kind, expect, ["ck"] + (["ds", "fuzz.ini"] if kind == "train" else []))
    step = os.path.join(d, CK)
    if kind == "train":  # resume: one more step from ck
        set_ini(os.path.join(d, "fuzz.ini"), "train", "steps", "2")
    return d, step, os.path.join(step, "rank-00000.h5")


def ck_named(c):
    for k, v in [(2, 2**31 - 1), (3, 2**31 - 1), (2, 2**31 - 200), (0, 2**31 - 1)]:
        d, step, h5 = ck_case(c, f"ck-piece-shape{k}-{v}")
        with h5py.File(h5, "r+") as f:
            p = f["pieces/00000"]
            s = p.attrs["shape"].copy()
            s[k] = v
            if k in (2, 3):
                s[4], s[5] = 1, 1
                set_attr(p, "flat_range", np.array([0, 1], dtype=np.uint64))
                data = p[:1]
                del f["pieces/00000"]
                q = f.create_dataset("pieces/00000", data=data)
                for a, b in [("name", b"param/model.embed_tokens.weight"), ("dtype", b"fp32"),
                             ("shape", s), ("flat_range", np.array([0, 1], dtype=np.uint64))]:
                    q.attrs[a] = b
            else:
                set_attr(p, "shape", s)
        fix_manifest(step)
    d, step, h5 = ck_case(c, "ck-piece-rowoff-intmax-resume", kind="train")
    with h5py.File(h5, "r+") as f:
        name = f["pieces/00000"].attrs["name"]
        data = f["pieces/00000"][:1]
        del f["pieces/00000"]
        q = f.create_dataset("pieces/00000", data=data)
        q.attrs["name"], q.attrs["dtype"] = name, b"fp32"
        q.attrs["shape"] = np.array([300, 32, 2**31 - 1, 0, 1, 1])
        q.attrs["flat_range"] = np.array([0, 1], dtype=np.uint64)
    fix_manifest(step)
    for attr in ["name", "dtype"]:
        for label, val in [("fixed-array", np.array([b"param/model.embed_tokens.weight"] * 3, dtype="S64")),
                           ("vlen-array", np.array(["fp32"] * 5, dtype=h5py.string_dtype())),
                           ("int", np.int64(7))]:
            d, step, h5 = ck_case(c, f"ck-piece-{attr}-{label}")
            with h5py.File(h5, "r+") as f:
                set_attr(f["pieces/00000"], attr, val)
            fix_manifest(step)
    for attr, val in [("format_version", np.ones((2, 2), dtype=np.int64)), ("step", np.array([1, 1, 1, 1])),
                      ("rank", np.bytes_(b"0"))]:
        d, step, h5 = ck_case(c, f"ck-file-{attr}-bad-shape")
        with h5py.File(h5, "r+") as f:
            set_attr(f, attr, val)
        fix_manifest(step)
    for label, kv in [("tp-pp-65536", {"tp": 65536, "pp": 65536}), ("tp-pp-neg", {"tp": -1, "pp": -1}),
                      ("zero-stage-7", {"zero_stage": 7}), ("tp-2pow32p1", {"tp": 4294967297}),
                      ("step-2pow31", {"step": 2**31}), ("step-neg", {"step": -5}),
                      ("d-model-0", {"d_model": 0}), ("n-layers-huge", {"n_layers": 2**31 - 1}),
                      ("vocab-huge", {"vocab_size": 2**40}), ("format-2pow32p1", {"format_version": 4294967297})]:
        d, step, h5 = ck_case(c, f"ck-manifest-{label}")
        for k, v in kv.items():
            sec = "model" if k in ("d_model", "n_layers", "vocab_size") else "checkpoint"
            set_ini(os.path.join(step, "manifest.ini"), sec, k, v)
    for label, kv in [("step-2pow31", {"step": np.int64(2**31)}), ("opt-steps-intmax", {"opt_steps": np.int64(2**31 - 1)}),
                      ("opt-steps-neg", {"opt_steps": np.int64(-1)}), ("step-disagrees", {"step": np.int64(5)}),
                      ("lr-step-neg", {"lr_step": np.int64(-3)}), ("step-array", {"step": np.array([1, 2])})]:
        for kind in ("verify", "train"):
            if kind == "train" and label in ("lr-step-neg", "step-array"):
                continue
            d, step, h5 = ck_case(c, f"ck-state-{label}-{kind}", kind=kind)
            with h5py.File(h5, "r+") as f:
                for k, v in kv.items():
                    set_attr(f["state"], k, v)
            fix_manifest(step)
    # Completeness against the manifest's model.
    d, step, h5 = ck_case(c, "ck-piece-deleted")
    with h5py.File(h5, "r+") as f:
        n = len(f["pieces"])
        del f[f"pieces/{n - 1:05d}"]
    fix_manifest(step)
    d, step, h5 = ck_case(c, "ck-piece-renamed-empty")
    with h5py.File(h5, "r+") as f:
        set_attr(f["pieces/00003"], "name", np.bytes_(b""))
    fix_manifest(step)
    d, step, h5 = ck_case(c, "ck-piece-softlink")
    with h5py.File(h5, "r+") as f:
        n = len(f["pieces"])
        del f[f"pieces/{n - 1:05d}"]
        f[f"pieces/{n - 1:05d}"] = h5py.SoftLink("/pieces/00000")
    fix_manifest(step)
    d, step, h5 = ck_case(c, "ck-piece-dtype-tag-vs-stored")
    with h5py.File(h5, "r+") as f:
        set_attr(f["pieces/00000"], "dtype", np.bytes_(b"i64"))
    fix_manifest(step)
    d, step, h5 = ck_case(c, "ck-piece-extra-tensor")
    with h5py.File(h5, "r+") as f:
        q = f.create_dataset(f"pieces/{len(f['pieces']):05d}", data=np.zeros(4, dtype=np.float32))
        q.attrs["name"], q.attrs["dtype"] = b"param/model.bogus", b"fp32"
        q.attrs["shape"] = np.array([2, 2, 0, 0, 2, 2])
        q.attrs["flat_range"] = np.array([0, 4], dtype=np.uint64)
    fix_manifest(step)
    d, step, h5 = ck_case(c, "ck-checksum-stale")
    with open(h5, "r+b") as f:
        f.seek(os.path.getsize(h5) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))


def ck_random(c, n):
    rng = c.rng
    for i in range(n):
        k = rng.randrange(9)
        d, step, h5 = ck_case(c, f"ck-rand-{i}", expect="any")
        mpath = os.path.join(step, "manifest.ini")
        if k == 0:  # manifest integers
            key = rng.choice(["format_version", "step", "world_size", "tp", "pp", "dp", "zero_stage",
                              "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                              "max_seq_len", "tie_embeddings"])
            sec = "checkpoint" if key in ("format_version", "step", "world_size", "tp", "pp", "dp", "zero_stage") else "model"
            set_ini(mpath, sec, key, rng.choice(INTS + ["x", "", "1e3", "0x10", " 1", "99999999999999999999999"]))
            continue
        if k == 1:  # manifest lines
            lines = open(mpath).read().split("\n")
            j = rng.randrange(len(lines))
            op = rng.randrange(4)
            if op == 0:
                del lines[j]
            elif op == 1:
                lines.insert(j, lines[rng.randrange(len(lines))])
            elif op == 2:
                lines[j] = lines[j][:rng.randrange(len(lines[j]) + 1)]
            else:
                lines.insert(j, rng.choice(["[files]", "rank-00001.h5 = xxh3-64:0000000000000000 1",
                                            "rank-99999.h5 = xxh3-64:00 5", "=", "[", "x" * 5000]))
            open(mpath, "w").write("\n".join(lines))
            continue
        if k == 2:  # a byte flipped, checksum left alone: refused
            with open(h5, "r+b") as f:
                f.seek(rng.randrange(os.path.getsize(h5)))
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
            open(os.path.join(d, "expect"), "w").write("corrupt\n")
            continue
        if k == 3:  # bytes flipped, checksum recomputed
            with open(h5, "r+b") as f:
                size = os.path.getsize(h5)
                for _ in range(rng.randrange(1, 6)):
                    f.seek(rng.randrange(min(size, 4096) if rng.random() < .7 else size))
                    f.write(bytes([rng.randrange(256)]))
            fix_manifest(step)
            continue
        with h5py.File(h5, "r+") as f:
            pieces = f["pieces"]
            pn = f"{rng.randrange(len(pieces)):05d}"
            p = pieces[pn]
            if k == 4:  # one piece attribute replaced
                a = rng.choice(["name", "dtype", "shape", "flat_range"])
                if rng.random() < .5 and a in ("shape", "flat_range"):
                    set_attr(p, a, mutate_int_array(rng, p.attrs[a]))
                elif rng.random() < .2:
                    del p.attrs[a]
                else:
                    set_attr(p, a, rand_value(rng))
            elif k == 5:  # a piece's dataset replaced or linked
                op = rng.randrange(6)
                attrs = dict(p.attrs)
                if op == 0:
                    del pieces[pn]
                elif op == 1:
                    del pieces[pn]
                    pieces[pn] = h5py.SoftLink(f"/pieces/{rng.randrange(len(pieces) + 1):05d}")
                elif op == 2:
                    del pieces[pn]
                    pieces[pn] = h5py.ExternalLink("/dev/zero", "/x")
                else:
                    data = p[()]
                    del pieces[pn]
                    if op == 3:
                        data = data.astype(rng.choice([np.float64, np.int16, np.uint8, np.int64]))
                    elif op == 4:
                        data = data[: rng.randrange(len(data) + 1)]
                    else:
                        data = data.reshape(1, -1) if data.size else data
                    q = pieces.create_dataset(pn, data=data)
                    for a, v in attrs.items():
                        q.attrs[a] = v
            elif k == 6:  # file attributes
                a = rng.choice(["format_version", "step", "rank"])
                set_attr(f, a, rand_value(rng))
            elif k == 7:  # /state attributes
                st = f["state"]
                a = rng.choice(list(st.attrs))
                v = st.attrs[a]
                if rng.random() < .6 and np.asarray(v).dtype.kind in "iu":
                    set_attr(st, a, mutate_int_array(rng, np.atleast_1d(v)).reshape(np.shape(v)))
                elif rng.random() < .3:
                    del st.attrs[a]
                else:
                    set_attr(st, a, rand_value(rng))
            else:  # group structure
                op = rng.randrange(3)
                if op == 0:
                    del f["state"]
                elif op == 1:
                    del f["pieces"]
                    f.create_group("pieces")
                else:
                    f["pieces/%05d" % len(pieces)] = h5py.SoftLink("/pieces/00000")
        fix_manifest(step)


# ---- dataset ----------------------------------------------------------------

SHARD = "ds/shard-00000.h5"


def ds_case(c, name, expect="corrupt", kind="data"):
    d = c.case(name, kind, expect, ["ds"])
    return d, os.path.join(d, "ds"), os.path.join(d, SHARD)


def ds_named(c):
    for attr, val in [("tokenizer", np.array([b"98757ee8d788ae220b1ed32cd1bc0053"] * 4, dtype="S40")),
                      ("tokenizer", np.array(["a" * 100] * 4, dtype=h5py.string_dtype())),
                      ("format_version", np.ones((2, 3), dtype=np.int64)),
                      ("vocab_size", np.array([300, 300, 300, 300], dtype=np.int64)),
                      ("eot_id", np.array([299, 7], dtype=np.int64)),
                      ("vocab_size", np.bytes_(b"300"))]:
        d, ds, h5 = ds_case(c, f"ds-attr-{attr}-{np.shape(val)}-{np.asarray(val).dtype.kind}")
        with h5py.File(h5, "r+") as f:
            set_attr(f, attr, val)
        fix_index(ds)
    d, ds, h5 = ds_case(c, "ds-doc-offsets-2pow61-sparse")
    with h5py.File(h5, "r+") as f:
        del f["doc_offsets"]
        f.create_dataset("doc_offsets", shape=(2**61,), dtype="<u8", chunks=(1024,))
    set_ini(os.path.join(ds, "index.ini"), "shard-00000", "documents", 2**61 - 1)
    fix_index(ds)
    d, ds, h5 = ds_case(c, "ds-tokens-2pow40-sparse")
    with h5py.File(h5, "r+") as f:
        del f["tokens"]
        f.create_dataset("tokens", shape=(2**40,), dtype="<u2", chunks=(65536,))
        off = f["doc_offsets"][()]
        off[-1] = 2**40
        f["doc_offsets"][...] = off
    set_ini(os.path.join(ds, "index.ini"), "shard-00000", "tokens", 2**40)
    fix_index(ds)
    d, ds, h5 = ds_case(c, "ds-tokens-external-storage")
    with h5py.File(h5, "r+") as f:
        n = f["tokens"].shape[0]
        del f["tokens"]
        f.create_dataset("tokens", shape=(n,), dtype="<u2", external=[("/dev/zero", 0, 2 * n)])
    fix_index(ds)
    d, ds, h5 = ds_case(c, "ds-tokens-external-link")
    tok = f"{d}/ds/other.h5"
    with h5py.File(h5, "r+") as f:
        data = f["tokens"][()]
        del f["tokens"]
        f["tokens"] = h5py.ExternalLink("other.h5", "/tokens")
    with h5py.File(tok, "w") as g:
        g["tokens"] = data
    fix_index(ds)
    d, ds, h5 = ds_case(c, "ds-tokens-softlink")
    with h5py.File(h5, "r+") as f:
        f["t2"] = f["tokens"]
        del f["tokens"]
        f["tokens"] = h5py.SoftLink("/t2")
    fix_index(ds)
    d, ds, h5 = ds_case(c, "ds-index-shard-twice")
    ip = os.path.join(ds, "index.ini")
    ix = open(ip).read()
    sec = re.search(r"\[shard-00000\][^\[]*", ix).group(0)
    ix = ix.replace("num_shards = 1", "num_shards = 2") + "\n" + sec.replace("shard-00000]", "shard-00001]", 1)
    open(ip, "w").write(ix)
    for label, kv in [("vocab-2pow31", {"vocab_size": 2**31}), ("eot-neg", {"eot_id": -1}),
                      ("num-shards-huge", {"num_shards": 2**40})]:
        d, ds, h5 = ds_case(c, f"ds-index-{label}")
        for k, v in kv.items():
            set_ini(os.path.join(ds, "index.ini"), "dataset", k, v)
    d, ds, h5 = ds_case(c, "ds-index-section-10000000")
    with open(os.path.join(ds, "index.ini"), "a") as f:
        f.write("\n[shard-10000000]\nfile = x.h5\n")


def ds_random(c, n):
    rng = c.rng
    for i in range(n):
        k = rng.randrange(7)
        d, ds, h5 = ds_case(c, f"ds-rand-{i}", expect="any")
        ip = os.path.join(ds, "index.ini")
        if k == 0:
            key = rng.choice(["format_version", "vocab_size", "eot_id", "num_shards", "total_tokens"])
            set_ini(ip, "dataset", key, rng.choice(INTS + ["x", "", "-0", "1.5"]))
            continue
        if k == 1:
            key = rng.choice(["tokens", "documents", "bytes", "file", "split", "checksum"])
            set_ini(ip, "shard-00000", key, rng.choice(INTS + ["", "val", "../x", "shard-00000.h5",
                                                               "xxh3-64:zz", "/dev/zero"]))
            continue
        if k == 2:
            with open(h5, "r+b") as f:
                f.seek(rng.randrange(os.path.getsize(h5)))
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
            open(os.path.join(d, "expect"), "w").write("corrupt\n")
            continue
        if k == 3:
            with open(h5, "r+b") as f:
                size = os.path.getsize(h5)
                for _ in range(rng.randrange(1, 6)):
                    f.seek(rng.randrange(min(size, 4096)))
                    f.write(bytes([rng.randrange(256)]))
            fix_index(ds)
            continue
        with h5py.File(h5, "r+") as f:
            if k == 4:
                a = rng.choice(["vocab_size", "eot_id", "format_version", "tokenizer"])
                if rng.random() < .2:
                    del f.attrs[a]
                else:
                    set_attr(f, a, rand_value(rng))
            elif k == 5:
                name = rng.choice(["tokens", "doc_offsets"])
                data = f[name][()]
                del f[name]
                op = rng.randrange(6)
                if op == 0:
                    data = data.astype(rng.choice([np.int16, np.int32, np.uint8, np.float32, np.uint64, np.int64]))
                elif op == 1:
                    data = data.reshape(1, -1)
                elif op == 2:
                    data = data[: rng.randrange(len(data) + 1)]
                elif op == 3:
                    data = mutate_int_array(rng, data)
                if op == 4:
                    f.create_dataset(name, shape=(rng.choice([2**20, 2**32, 2**50, 2**62]),),
                                     dtype=data.dtype, chunks=(4096,))
                elif op == 5:
                    f.create_dataset(name, data=data, chunks=(min(len(data), rng.choice([1, 7, 4096])) or 1,),
                                     compression=rng.choice([None, "gzip"]))
                else:
                    f.create_dataset(name, data=data)
            else:
                op = rng.randrange(3)
                if op == 0:
                    del f[rng.choice(["tokens", "doc_offsets"])]
                elif op == 1:
                    f.attrs[rng.choice(["vocab_size", "eot_id"])] = np.int64(rng.choice(INTS))
                else:
                    name = rng.choice(["tokens", "doc_offsets"])
                    del f[name]
                    f.create_group(name)
        fix_index(ds)


# ---- tokenizer --------------------------------------------------------------

def tok_case(c, name, tok, expect="corrupt", kind=None, stdin=None):
    kind = kind or c.rng.choice(["tok", "decode"])
    d = c.case(name, kind, expect, [])
    if isinstance(tok, str):
        open(os.path.join(d, "tokenizer.json"), "w").write(tok)
    else:
        json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
    if stdin is None:
        stdin = "In the beginning God created the heaven <|endoftext|> and the earth.\n" if kind == "tok" \
            else " ".join(str(c.rng.choice([0, 1, 65, 66, 298, 299, 300])) for _ in range(20)) + "\n"
    open(os.path.join(d, "stdin.txt"), "w").write(stdin)
    return d


def tok_named(c, base):
    def t():
        return json.loads(json.dumps(base))
    x = t(); x["added_tokens"][0]["id"] = 2**31 - 1
    tok_case(c, "tok-added-id-intmax", x, kind="tok")
    x = t(); x["model"]["vocab"]["!"] = 2**31 - 2
    tok_case(c, "tok-vocab-id-intmax-1", x, kind="tok")
    x = t(); x["model"]["vocab"]["b"] = x["model"]["vocab"]["a"]
    tok_case(c, "tok-duplicate-ids", x, kind="tok", stdin="ab\n")
    x = t(); x["model"]["vocab"]["b"] = x["model"]["vocab"]["a"]
    tok_case(c, "tok-duplicate-ids-decode", x, kind="decode", stdin="65 65\n")
    x = t(); x["model"]["vocab"] = {k: 0 for k in x["model"]["vocab"]}
    tok_case(c, "tok-every-id-0", x, kind="tok")
    x = t(); x["added_tokens"][0]["id"] = x["model"]["vocab"]["a"]
    tok_case(c, "tok-eot-shared", x, kind="tok")
    x = t(); x["model"]["vocab"]["a"] = -1
    tok_case(c, "tok-negative-id", x, kind="tok")
    x = t(); x["model"]["vocab"]["a"] = 1.5
    tok_case(c, "tok-float-id", x, kind="tok")
    x = t(); x["model"]["vocab"]["a"] = 2**40
    tok_case(c, "tok-id-2pow40", x, kind="decode")
    x = t(); x["added_tokens"][0]["id"] = 2**31
    tok_case(c, "tok-added-id-2pow31", x, kind="tok")


def tok_random(c, base, n):
    rng = c.rng
    text = json.dumps(base, indent=1)
    for i in range(n):
        k = rng.randrange(6)
        x = json.loads(text)
        keys = list(x["model"]["vocab"])
        if k == 0:
            x["model"]["vocab"][rng.choice(keys)] = rng.choice(INTS + [x["model"]["vocab"][rng.choice(keys)], "7", None, 1.0])
        elif k == 1:
            x["added_tokens"][0][rng.choice(["id", "content", "special"])] = rng.choice(INTS + ["", "a", None, [1], True])
        elif k == 2:
            m = x["model"]["merges"]
            j = rng.randrange(len(m))
            m[j] = rng.choice([["a"], ["a", "b", "c"], "a b", ["zz", "yy"], [1, 2], m[rng.randrange(len(m))], []])
        elif k == 3:
            obj = rng.choice([x, x["model"], x["pre_tokenizer"], x["decoder"]])
            key = rng.choice(list(obj))
            obj[key] = rng.choice([None, 1, "x", [], {}, rng.choice(INTS)]) if rng.random() < .7 else obj.pop(key) and None
        elif k == 4:
            s = json.dumps(x)
            s = s[: rng.randrange(len(s))] if rng.random() < .5 else s
            b = bytearray(s.encode())
            for _ in range(rng.randrange(1, 5)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            tok_case(c, f"tok-rand-{i}", b.decode("latin-1"), expect="any")
            continue
        else:
            x["added_tokens"].append({"id": rng.choice(INTS + [298, 300, 301]), "content": rng.choice(["<|x|>", "a", "", "<|endoftext|>"]),
                                      "single_word": False, "lstrip": False, "rstrip": False,
                                      "normalized": False, "special": True})
        tok_case(c, f"tok-rand-{i}", x, expect="any")


# ---- config and overrides ---------------------------------------------------

def cfg_case(c, name, expect="corrupt", kind="plan"):
    d = c.case(name, kind, expect, ["fuzz.ini"] + (["ds"] if kind == "train" else []))
    return d, os.path.join(d, "fuzz.ini")


def cfg_named(c):
    for label, kv in [("tp-pp-dp-overflow", {("parallel", "tp"): 65536, ("parallel", "pp"): 65536}),
                      ("vocab-intmax", {("model", "vocab_size"): 2**31 - 1}),
                      ("microbatch-seq-overflow", {("train", "micro_batch_size"): 2**20, ("train", "seq_len"): 2**12,
                                                   ("model", "max_seq_len"): 2**12}),
                      ("n-layers-intmax", {("model", "n_layers"): 2**31 - 1}),
                      ("d-model-huge", {("model", "d_model"): 2**30, ("model", "n_heads"): 2**20}),
                      ("ffn-huge", {("model", "ffn_dim"): 2**31 - 1}),
                      ("global-batch-huge", {("train", "global_batch_size"): 2**31 - 2})]:
        d, ini = cfg_case(c, f"cfg-{label}")
        for (s, k), v in kv.items():
            set_ini(ini, s, k, v)
    d, ini = cfg_case(c, "cfg-dev-zero")
    os.remove(ini)
    os.symlink("/dev/zero", ini)
    d, ini = cfg_case(c, "cfg-long-line")
    with open(ini, "a") as f:
        f.write("[model]\nd_model = " + "9" * 100000 + "\n")


def cfg_random(c, n):
    rng = c.rng
    keys = [("model", k) for k in ["vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                                   "max_seq_len", "rope_theta", "norm_eps", "tie_embeddings", "init_std"]] + \
           [("train", k) for k in ["seq_len", "micro_batch_size", "global_batch_size", "steps", "lr", "warmup_steps",
                                   "eval_every", "eval_steps", "grad_clip"]] + \
           [("parallel", k) for k in ["tp", "pp", "dp", "zero_stage"]] + [("system", "threads"), ("log", "every")]
    for i in range(n):
        kind = "train" if i % 25 == 24 else "plan"
        d, ini = cfg_case(c, f"cfg-rand-{i}", expect="any", kind=kind)
        for _ in range(rng.randrange(1, 4)):
            k = rng.randrange(4)
            if k < 2:
                s, key = rng.choice(keys)
                set_ini(ini, s, key, rng.choice(INTS + ["", "x", "1e40", "-0", "nan", "inf", "0x10", "1 2"]))
            elif k == 2:
                lines = open(ini).read().split("\n")
                j = rng.randrange(len(lines))
                lines.insert(j, rng.choice(["[", "]", "[model", "=", "a=b", "[nosuch]", "x = 1", "\x00",
                                            "\xff\xfe", "model.d_model = 3", "d_model = 1", "k" * 300 + " = 1"]))
                open(ini, "w").write("\n".join(lines))
            else:
                s, key = rng.choice(keys)
                with open(os.path.join(d, "overrides"), "a") as f:
                    f.write(f"{s}.{key}={rng.choice(INTS + ['', 'x', '1e40'])}\n")


# ---- prep inputs ------------------------------------------------------------

def prep_case(c, name, files, expect="any"):
    d = c.case(name, "prep", expect, [])
    os.makedirs(os.path.join(d, "in"))
    for fname, data in files.items():
        open(os.path.join(d, "in", fname), "wb").write(data)
    shutil.copy(os.path.join(c.base, "ds", "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    return d


def prep_all(c, n):
    rng = c.rng
    text = open(os.path.join(c.base, "text.txt"), "rb").read()
    prep_case(c, "prep-jsonl-not-json", {"a.jsonl": b"{\"text\": \"abc\"}\n{not json\n"}, expect="corrupt")
    prep_case(c, "prep-jsonl-text-not-string", {"a.jsonl": b"{\"text\": 5}\n"}, expect="corrupt")
    prep_case(c, "prep-empty", {"a.txt": b""}, expect="corrupt")
    for i in range(n):
        k = rng.randrange(6)
        if k == 0:
            b = bytearray(text)
            for _ in range(rng.randrange(1, 50)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            files = {"a.txt": bytes(b)}
        elif k == 1:
            files = {"a.txt": bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))}
        elif k == 2:
            lines = [json.dumps({"text": text[j * 40:(j + 1) * 40].decode("latin-1")}) for j in range(20)]
            j = rng.randrange(len(lines))
            lines[j] = rng.choice(['{"text": null}', '{"text": ["a"]}', '[1,2]', '{"text": "\\ud800"}', '{"txt": "a"}',
                                   '{"text": "' + "a" * 100000 + '"}', '{"text": "a"', '"text"', '{"text": "\\u0000"}',
                                   '{"text": "<|endoftext|>"}', '{' * 10000])
            files = {"a.jsonl": "\n".join(lines).encode()}
        elif k == 3:
            files = {"a.txt": text[: rng.randrange(len(text))] + b"\x00" * rng.randrange(100) + b"\xc0\x80\xed\xa0\x80"}
        elif k == 4:
            files = {"a.txt": b"a" * rng.choice([1, 4096, 1 << 20]) + b"\n\n" + b"<|endoftext|>" * rng.randrange(5)}
        else:
            files = {f"f{j}.txt": text[rng.randrange(len(text)):][:rng.randrange(500)] for j in range(rng.randrange(1, 5))}
        prep_case(c, f"prep-rand-{i}", files)


def main():
    base, out, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = Corpus(base, out, seed)
    tok = json.load(open(os.path.join(base, "ds", "tokenizer.json")))
    ck_named(c)
    ds_named(c)
    tok_named(c, tok)
    cfg_named(c)
    ck_random(c, n)
    ds_random(c, n)
    tok_random(c, tok, n)
    cfg_random(c, n)
    prep_all(c, n)
    print(f"{c.n} cases in {out}")


if __name__ == "__main__":
    main()
