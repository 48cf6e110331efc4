#!/usr/bin/env python3
"""Writes the libFuzzer seed corpora under fuzz/corpus/ (committed; rerun to refresh them).

Seeds are small valid inputs of each format, cut from the shipped models and fixtures so the
fuzzer starts from the structures arbiter really reads (a seed over -max_len would be cut):
  gguf, gguf_vocab     tiny GGUFs written here (every value type; spm and gpt2 vocabularies
                       reduced from stories260K.gguf and tiny-qwen2's tokenizer.json)
  safetensors          tiny files (each dtype, __metadata__, an empty tensor)
  safetensors_index    sharded-set indexes
  hf_config            every config.json shipped (models/, tests/fixtures/models/)
  tokenizer_json       the TinyStories (SentencePiece-style) and tiny-qwen2 (byte-level)
                       tokenizers reduced to their first few hundred ids
  kld                  a llama.cpp KL-divergence file of 2 chunks of 8 tokens (made by ARBITER)
  trace, logits        an arbiter trace and its full-logits file (made by ARBITER), and a
                       foreign 6-column trace
  matrix_spec          matrix/*.toml
chat_template and server_request are committed as written by hand (the real templates of
tests/fixtures/chat_templates/ and a few hostile ones; request bodies of both endpoints).
Usage: fuzz/make_seeds.py ARBITER   (from the repository root)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(name, data):
    path = os.path.join(OUT, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- GGUF (docs/gguf.md: little-endian, strings are u64 length + bytes) ----------------------
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


SCALAR = {"u8": (0, "<B"), "i8": (1, "<b"), "u16": (2, "<H"), "i16": (3, "<h"), "u32": (4, "<I"),
          "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "u64": (10, "<Q"), "i64": (11, "<q"),
          "f64": (12, "<d")}


def kv(key, kind, value):
    if kind == "str":
        return gstr(key) + struct.pack("<I", 8) + gstr(value)
    if kind.startswith("arr_"):
        et = kind[4:]
        if et == "str":
            body = b"".join(gstr(v) for v in value)
            return gstr(key) + struct.pack("<IIQ", 9, 8, len(value)) + body
        code, fmt = SCALAR[et]
        return gstr(key) + struct.pack("<IIQ", 9, code, len(value)) + b"".join(struct.pack(fmt, v) for v in value)
    code, fmt = SCALAR[kind]
    return gstr(key) + struct.pack("<I", code) + struct.pack(fmt, value)


def gguf(kvs, tensors=(), alignment=32):
    """tensors: (name, ne list, ggml type, data bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    data = b""
    for name, ne, typ, raw in tensors:
        while len(data) % alignment:
            data += b"\0"
        head += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        head += struct.pack("<IQ", typ, len(data))
        data += raw
    while len(head) % alignment:
        head += b"\0"
    return head + data


def read_gguf_tokenizer(path):
    """The tokenizer.ggml.* values of a GGUF (only the kinds stories260K uses)."""
    b = open(path, "rb").read()
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    pos, out = 24, {}

    def s(p):
        n = struct.unpack_from("<Q", b, p)[0]
        return b[p + 8:p + 8 + n].decode(), p + 8 + n

    for _ in range(n_kv):
        key, pos = s(pos)
        t = struct.unpack_from("<I", b, pos)[0]
        pos += 4
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, pos)
            pos += 12
            vals = []
            for _ in range(n):
                if et == 8:
                    v, pos = s(pos)
                else:
                    fmt = {0: "<B", 4: "<I", 5: "<i", 6: "<f"}[et]
                    v = struct.unpack_from(fmt, b, pos)[0]
                    pos += struct.calcsize(fmt)
                vals.append(v)
            out[key] = (et, vals)
        elif t == 8:
            v, pos = s(pos)
            out[key] = (t, v)
        else:
            fmt = {0: "<B", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}[t]
            out[key] = (t, struct.unpack_from(fmt, b, pos)[0])
            pos += struct.calcsize(fmt)
    return out


def spm_vocab_kvs():
    t = read_gguf_tokenizer(os.path.join(ROOT, "models/stories260K/stories260K.gguf"))
    tokens = t["tokenizer.ggml.tokens"][1]
    return [kv("tokenizer.ggml.model", "str", "llama"),
            kv("tokenizer.ggml.tokens", "arr_str", tokens),
            kv("tokenizer.ggml.scores", "arr_f32", t["tokenizer.ggml.scores"][1]),
            kv("tokenizer.ggml.token_type", "arr_i32", t["tokenizer.ggml.token_type"][1]),
            kv("tokenizer.ggml.bos_token_id", "u32", 1), kv("tokenizer.ggml.eos_token_id", "u32", 2),
            kv("tokenizer.ggml.unknown_token_id", "u32", 0), kv("tokenizer.ggml.add_bos_token", "bool", True)]


def gpt2_vocab_kvs(n=300):
    tj = json.load(open(os.path.join(ROOT, "tests/fixtures/models/tiny-qwen2/tokenizer.json")))
    by_id = sorted(tj["model"]["vocab"].items(), key=lambda kv_: kv_[1])[:n]
    keep = {t for t, _ in by_id}
    merges = []
    for m in tj["model"]["merges"]:
        a, b2 = m if isinstance(m, list) else m.split(" ", 1)
        if a in keep and b2 in keep and a + b2 in keep:
            merges.append(a + " " + b2)
    return [kv("tokenizer.ggml.model", "str", "gpt2"), kv("tokenizer.ggml.pre", "str", "qwen2"),
            kv("tokenizer.ggml.tokens", "arr_str", [t for t, _ in by_id]),
            kv("tokenizer.ggml.token_type", "arr_i32", [1] * len(by_id)),
            kv("tokenizer.ggml.merges", "arr_str", merges), kv("tokenizer.ggml.eos_token_id", "u32", 0)]


def tiny_model_gguf(arch="llama", D=8, F=16, V=16, L=1):
    f32 = lambda n: struct.pack("<%df" % n, *[0.01 * (i % 7) for i in range(n)])
    p = arch + "."
    kvs = [kv("general.architecture", "str", arch), kv(p + "embedding_length", "u32", D),
           kv(p + "block_count", "u32", L), kv(p + "attention.head_count", "u32", 2),
           kv(p + "attention.head_count_kv", "u32", 1), kv(p + "feed_forward_length", "u32", F),
           kv(p + "context_length", "u32", 64), kv(p + "attention.layer_norm_rms_epsilon", "f32", 1e-5),
           kv(p + "rope.freq_base", "f32", 10000.0), kv("general.alignment", "u32", 32),
           kv("general.name", "str", "seed"), kv("general.flags", "arr_u8", [1, 2, 3]),
           kv("general.i64", "i64", -5), kv("general.f64", "f64", 0.5), kv("general.b", "bool", False),
           kv("general.u16s", "arr_u16", [7, 8]), kv("general.i16", "i16", -2), kv("general.u64", "u64", 9),
           kv("general.f64s", "arr_f64", [1.5])]
    tensors = [("token_embd.weight", [D, V], 0, f32(D * V)), ("output_norm.weight", [D], 0, f32(D))]
    for l in range(L):
        b = "blk.%d." % l
        tensors += [(b + "attn_norm.weight", [D], 0, f32(D)), (b + "attn_q.weight", [D, D], 0, f32(D * D)),
                    (b + "attn_k.weight", [D, D // 2], 0, f32(D * D // 2)),
                    (b + "attn_v.weight", [D, D // 2], 0, f32(D * D // 2)),
                    (b + "attn_output.weight", [D, D], 0, f32(D * D)), (b + "ffn_norm.weight", [D], 0, f32(D)),
                    (b + "ffn_gate.weight", [D, F], 1, struct.pack("<%dH" % (D * F), *([0x3C00] * (D * F)))),
                    (b + "ffn_up.weight", [D, F], 30, struct.pack("<%dH" % (D * F), *([0x3F80] * (D * F)))),
                    (b + "ffn_down.weight", [32, 4], 8, (struct.pack("<H", 0x2000) + bytes(range(32))) * 4)]
    return gguf(kvs, tensors)


# ---- safetensors ------------------------------------------------------------------------------
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        while len(data) % 8:
            data += b"\0"
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    while len(h) % 8:
        h += b" "
    return struct.pack("<Q", len(h)) + h + data


def reduced_tokenizer(path, n):
    tj = json.load(open(path))
    m = tj["model"]
    m["vocab"] = {t: i for t, i in m["vocab"].items() if i < n}
    keep = set(m["vocab"])
    merges = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in keep and b in keep and a + b in keep:
            merges.append(mg)
    m["merges"] = merges
    tj["added_tokens"] = [a for a in tj.get("added_tokens", []) if a["id"] < n]
    return json.dumps(tj, ensure_ascii=False, indent=1)


def main():
    arbiter = sys.argv[1]
    # gguf
    put("gguf/tiny-llama.gguf", tiny_model_gguf())
    put("gguf/tiny-qwen3.gguf", tiny_model_gguf("qwen3", L=2))
    put("gguf/vocab-spm.gguf", gguf(spm_vocab_kvs()))
    put("gguf/empty.gguf", gguf([]))
    # gguf_vocab
    put("gguf_vocab/spm.gguf", gguf(spm_vocab_kvs()))
    put("gguf_vocab/gpt2.gguf", gguf(gpt2_vocab_kvs()))
    # safetensors
    put("safetensors/dtypes.safetensors", safetensors(
        [("a", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("b", "F16", [3], struct.pack("<3H", 1, 2, 3)),
         ("c", "BF16", [1, 2], struct.pack("<2H", 1, 2)), ("d", "F64", [1], struct.pack("<d", 1.0)),
         ("e", "F32", [0, 4], b"")], {"format": "pt", "lm_head.weight": "a"}))
    put("safetensors/one.safetensors", safetensors([("model.norm.weight", "F32", [4], struct.pack("<4f", 1, 1, 1, 1))]))
    # safetensors_index
    put("safetensors_index/two-shards.json", json.dumps(
        {"metadata": {"total_size": 16}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                        "b": "model-00002-of-00002.safetensors"}}))
    put("safetensors_index/one.json", json.dumps({"weight_map": {"model.norm.weight": "model.safetensors"}}))
    # hf_config
    for d in ["models/TinyStories-656K", "tests/fixtures/models/tiny-llama", "tests/fixtures/models/tiny-mistral",
              "tests/fixtures/models/tiny-qwen2", "tests/fixtures/models/tiny-qwen3"]:
        put("hf_config/%s.json" % os.path.basename(d), open(os.path.join(ROOT, d, "config.json")).read())
    # tokenizer_json
    put("tokenizer_json/spm.json", reduced_tokenizer(os.path.join(ROOT, "models/TinyStories-656K/tokenizer.json"), 320))
    put("tokenizer_json/byte-level.json",
        reduced_tokenizer(os.path.join(ROOT, "tests/fixtures/models/tiny-qwen2/tokenizer.json"), 320))
    # trace, logits: made by arbiter itself, plus a foreign fixture trace
    with tempfile.TemporaryDirectory() as tmp:
        t = os.path.join(tmp, "t.tsv")
        subprocess.run([arbiter, "trace", "-m", os.path.join(ROOT, "models/stories260K/stories260K.gguf"), "--corpus",
                        os.path.join(ROOT, "models/corpus/stories.txt"), "--chunk", "3", "--chunks", "2", "--topk", "3",
                        "--device", "cpu", "--quiet", "-o", t, "--full-logits", t + ".logits"], check=True)
        put("trace/arbiter-v1.tsv", open(t).read())
        put("logits/two-rows.logits", open(t + ".logits", "rb").read())
        k = os.path.join(tmp, "t.kld")
        subprocess.run([arbiter, "trace", "-m", os.path.join(ROOT, "models/stories260K/stories260K.gguf"), "--corpus",
                        os.path.join(ROOT, "models/corpus/stories.txt"), "--kld-ctx", "8", "--chunks", "2",
                        "--device", "ref", "--quiet", "--kld-out", k], check=True)
        put("kld/stories260K-c8.kld", open(k, "rb").read())
    put("trace/foreign.tsv", "# engine: another engine's logit_trace\n# model = tiny\n"
        "chunk\tpos\ttarget\tnll\ttop_ids\ttop_logits\n"
        "0\t0\t5\t1.25\t5,7,9\t3.5,2.25,1\n0\t1\t7\t0.5\t7,5,2\t4,1.5,0.25\n1\t0\t2\tnan\t1,2,0\tinf,1,-inf\n")
    # matrix_spec
    for name in ["default.toml", "h200.toml"]:
        put("matrix_spec/" + name, open(os.path.join(ROOT, "matrix", name)).read())


if __name__ == "__main__":
    main()
