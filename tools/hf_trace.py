#!/usr/bin/env python3
"""hf_trace.py: write an arbiter teacher-forced logit trace (format v1) with HF transformers.

Purpose: an independent reference for arbiter's `trace` output. It runs a Hugging Face
checkpoint directory with PyTorch + transformers and writes exactly the trace format of
docs DESIGN.md section 3, so `arbiter compare` can judge arbiter's tiers against it.

    python3 tools/hf_trace.py -m models/TinyStories-656K --corpus models/corpus/stories.txt \
        --shape w8 --dtype float64 --device cpu -o out/TinyStories-656K.w8.f64.tsv

Definitions (the same as arbiter's trace writer):

* Corpus: the whole file is read as UTF-8 and tokenized as ONE string with the model's
  tokenizer.json (HF `tokenizers`, add_special_tokens=False). Call the ids corpus[0..N-1].
* BOS: the tokenizer's BOS (tokenizer_config.json "bos_token", resolved through
  tokenizer.json); none when it is null or absent (Qwen2/Qwen3 have none). `--bos` overrides.
* Chunk c (0 <= c < C) feeds the W input tokens corpus[b .. b+W-1] with
  b = max(S, P) + c*W, so every chunk has its full P tokens of context (shape w8 has
  start 0 and prefill 512: its first chunk begins at token 512). Same rule as arbiter's
  runner (src/verify/trace/trace_run.cpp, docs/traces.md).
  The logits at input token corpus[i] predict target corpus[i+1]; the row's abs_pos is
  i+1, the corpus index of the target. So row (c, pos) has i = b+pos,
  target = corpus[i+1], abs_pos = i+1. A chunk whose last target would lie past the
  corpus end does not fit; asking for more chunks than fit is an error.
* Context of chunk c: BOS (if any) followed by the P corpus tokens immediately before
  the chunk start, corpus[b-P .. b-1]. BOS alone when P = 0; nothing at all when the
  tokenizer has no BOS and P = 0.
* Per chunk: a fresh KV cache (transformers' DynamicCache via past_key_values), one
  untraced forward over the context, then ONE traced forward of exactly W tokens using
  that cache. `--check-full` also runs context+chunk as one forward and reports the
  largest |logit difference| of the last W positions on stderr.
* Row: chunk pos abs_pos target nll target_logit lse top_ids top_logits.
  lse = log-sum-exp over the full vocabulary; nll = lse - target_logit (nats);
  top-k = the K largest raw logits, descending, ties broken by the lower id.
  Floats are printed with %.9g. For --dtype float64 that is %.9g of the float64
  value; for float32/bfloat16 the logits are rounded to float32 first, lse is computed
  in float64 from those and rounded to float32, and nll = lse - target_logit in float32.
* NaN/Inf logits are written as such (nan, inf) and counted; the trace is still
  completed, and the program exits 1.

float64 fidelity: transformers' "float64" is not float64 throughout. Its RMSNorm casts
the activations to float32, the eager attention softmax runs with dtype=float32, and
RoPE's cos/sin are computed in float32 (inv_freq too). With --dtype float64 this script
therefore patches those three places (RMSNorm classes of llama/mistral/qwen2/qwen3, the
softmax dtype, the rotary embedding, also per layer type as in Gemma 3) and, during the
model's forward, keeps every other float64 -> float32/bf16/f16 cast (Tensor.float/.to/.type,
softmax dtype=) in float64 (Gemma's 1+w RMSNorm, Mamba2 mixers and their gated RMSNorm, MoE
routers), so the whole forward is float64; `--hf-f64-as-is` turns the patches off. The
patch call counts are recorded in the `# providers` line as
`f64_fixups=rmsnorm:N+softmax:N+rope:N+downcast:N`.

Hybrid Mamba2 models (FULL_FORWARD_ARCHS): transformers' cache cannot continue a chunk of
more than one token, so each chunk's logits are the last W rows of one uncached forward
over context + chunk; --check-full has nothing to compare there.

Header: model path exactly as given; sha256 over the concatenation of the directory's
*.safetensors files in sorted name order; arch = config model_type; params = number of
distinct parameters (tied embeddings counted once). tokenizer sha256 = of tokenizer.json.
corpus sha256 = of the file bytes, tokens = N. shape name = the named shape when every
parameter equals it, otherwise `custom` (or --shape-name). device `hf-cpu`/`hf-cuda`,
compute f64/f32/bf16, weights = dtype of the checkpoint tensors (f32/bf16/f16/mixed).

Output goes to a temporary file beside -o and is renamed at the end; progress goes to
stderr. Exit codes: 0 ok, 1 non-finite logits, 2 bad arguments or inputs.
To add a named shape, add a row to SHAPES (the same table as DESIGN.md section 3).
"""

import argparse
import hashlib
import json
import math
import os
import platform
import struct
import sys
import time
import types

TRACE_VERSION = 1

# name: (W chunk_tokens, C max_chunks, P prefill, S start_token)
SHAPES = {
    "w1": (1, 128, 0, 0),
    "w1ctx512": (1, 128, 512, 512),
    "w8": (8, 80, 512, 0),
    "w256": (256, 2, 0, 0),
    "w8ctx1536": (8, 40, 1536, 1536),
}

COMPUTE_NAMES = {"float64": "f64", "float32": "f32", "bfloat16": "bf16"}
ST_DTYPE_NAMES = {"F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16"}

# RMSNorm classes whose forward is `w * normalize(x.float()).to(x.dtype)` (HF llama form);
# only these are replaced in float64 mode. Others (Gemma's 1+w form, Mamba2's gated norm) keep
# their own forward, whose float32 casts the downcast guard keeps in float64.
F64_RMSNORM_CLASSES = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}

# model_type -> why its cache cannot continue a multi-token chunk. transformers' Mamba2 mixers
# (torch_forward) use the cached conv/SSM state only for a single new token; a longer forward
# behind a cache restarts the state from zero. For these the traced logits of a chunk are the
# last W rows of ONE uncached forward over context + chunk (the same numbers by definition).
FULL_FORWARD_ARCHS = {
    "granitemoehybrid": "Mamba2 layers: cached state is used for 1-token steps only",
    "nemotron_h": "Mamba2 layers: cached state is used for 1-token steps only",
}


class TraceError(Exception):
    """An input or argument problem; printed as one line, exit code 2."""


def log(msg):
    print("[hf_trace] " + msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- files


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weight_files(model_dir):
    names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not names:
        raise TraceError(f"{model_dir}: no *.safetensors files")
    return [os.path.join(model_dir, n) for n in names]


def weights_sha256(model_dir):
    """sha256 over the concatenated bytes of *.safetensors in sorted name order."""
    h = hashlib.sha256()
    for path in weight_files(model_dir):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def safetensors_header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise TraceError(f"{path}: too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        return json.loads(f.read(n).decode("utf-8"))


def checkpoint_dtype(model_dir):
    """Short dtype name of the checkpoint tensors: f32, bf16, f16, f64 or mixed(a+b)."""
    seen = set()
    for path in weight_files(model_dir):
        for key, meta in safetensors_header(path).items():
            if key != "__metadata__":
                seen.add(ST_DTYPE_NAMES.get(meta["dtype"], meta["dtype"].lower()))
    if len(seen) == 1:
        return seen.pop()
    return "mixed(" + "+".join(sorted(seen)) + ")"


def read_json(path):
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


# ------------------------------------------------------------------------- tokenizer


def load_tokenizer(model_dir, bos_override=None):
    """Returns (tokenizers.Tokenizer, bos_id or None, tokenizer.json path)."""
    from tokenizers import Tokenizer

    tj = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(tj):
        raise TraceError(f"{model_dir}: no tokenizer.json")
    tok = Tokenizer.from_file(tj)
    if bos_override is not None:
        if bos_override == "none":
            return tok, None, tj
        return tok, int(bos_override), tj
    bos = None
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(tc_path):
        b = read_json(tc_path).get("bos_token")
        if isinstance(b, dict):
            b = b.get("content")
        if b:
            bos = tok.token_to_id(b)
            if bos is None:
                raise TraceError(f"{tc_path}: bos_token {b!r} is not in tokenizer.json")
    return tok, bos, tj


def tokenize_text(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


# ------------------------------------------------------------------------------ plan


def resolve_shape(args):
    """Returns (name, W, C, P, S)."""
    if args.shape is not None:
        if args.shape not in SHAPES:
            raise TraceError(f"unknown shape {args.shape!r} (known: {', '.join(SHAPES)})")
        w, c, p, s = SHAPES[args.shape]
    else:
        if args.chunk is None or args.chunks is None:
            raise TraceError("give --shape NAME or --chunk W --chunks C [--prefill P --start S]")
        w, c, p, s = None, None, 0, 0
    if args.chunk is not None:
        w = args.chunk
    if args.chunks is not None:
        c = args.chunks
    if args.prefill is not None:
        p = args.prefill
    if args.start is not None:
        s = args.start
    if w < 1 or c < 1 or p < 0 or s < 0:
        raise TraceError(f"bad shape: chunk {w} chunks {c} prefill {p} start {s}")
    name = args.shape_name
    if name is None:
        name = "custom"
        for n, v in SHAPES.items():
            if v == (w, c, p, s):
                name = n
                break
    return name, w, c, p, s


def plan_chunks(n_tokens, w, c, p, s):
    """List of (chunk_start, context_start) for each chunk; raises when they do not fit."""
    b0 = max(s, p)  # first chunk start: full context for every chunk
    fit = 0
    if n_tokens >= 1:
        fit = max(0, (n_tokens - 1 - b0) // w)  # need b0 + (k+1)*w <= n_tokens - 1
    if fit < c:
        raise TraceError(
            f"corpus has {n_tokens} tokens: only {fit} chunks of {w} fit from token {b0} "
            f"(the last target must be a corpus token), {c} asked")
    return [(b0 + k * w, b0 + k * w - p) for k in range(c)]


# ---------------------------------------------------------------------------- model


_SOFTMAX_STATE = {"enabled": False, "calls": 0, "orig": None}


def _install_softmax_f64(torch):
    """torch.nn.functional.softmax that keeps float64 inputs in float64 when a lower dtype is asked.

    HF eager attention calls nn.functional.softmax(w, dim=-1, dtype=torch.float32).
    """
    if _SOFTMAX_STATE["orig"] is None:
        orig = torch.nn.functional.softmax
        _SOFTMAX_STATE["orig"] = orig

        def softmax(input, dim=None, _stacklevel=3, dtype=None):
            if (_SOFTMAX_STATE["enabled"] and dtype is not None and input.dtype == torch.float64
                    and dtype != torch.float64):
                _SOFTMAX_STATE["calls"] += 1
                dtype = torch.float64
            return orig(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

        torch.nn.functional.softmax = softmax
    _SOFTMAX_STATE["enabled"] = True


def set_softmax_f64(enabled):
    _SOFTMAX_STATE["enabled"] = bool(enabled) and _SOFTMAX_STATE["orig"] is not None


_DOWNCAST_STATE = {"depth": 0, "calls": 0, "installed": False}


def _install_downcast_guard(torch):
    """Tensor.float/.to/.type and torch.softmax/Tensor.softmax that keep float64 tensors in float64,
    but only while a guarded model forward runs (depth > 0).

    transformers writes float32 casts all over its "float64" path, not only in the three places
    patched by name: Gemma's (1 + w) RMSNorm (`x.float()`), the Mamba2 torch_forward (A_log, x, B, C
    `.float()`, `.to(dtype=torch.float32)`), the gated RMSNorm of Mamba2 layers, routers
    (`.float()`, `.type(torch.float32)`). Catching the cast itself finds every one of them, also
    those a later transformers adds; each caught cast is counted (f64_fixups downcast:N).
    """
    if _DOWNCAST_STATE["installed"]:
        return
    low = {torch.float32, torch.float16, torch.bfloat16}
    st = _DOWNCAST_STATE
    T = torch.Tensor
    orig_float, orig_to, orig_type, orig_tsoftmax = T.float, T.to, T.type, T.softmax
    orig_softmax = torch.softmax

    def active(t):
        return st["depth"] > 0 and isinstance(t, T) and t.dtype == torch.float64

    def keep(dtype):
        if isinstance(dtype, torch.dtype) and dtype in low:
            st["calls"] += 1
            return torch.float64
        return dtype

    def t_float(self, *a, **kw):
        if active(self):
            st["calls"] += 1
            return self
        return orig_float(self, *a, **kw)

    def t_to(self, *a, **kw):
        if active(self):
            a = tuple(keep(x) for x in a)
            if "dtype" in kw:
                kw["dtype"] = keep(kw["dtype"])
        return orig_to(self, *a, **kw)

    def t_type(self, dtype=None, *a, **kw):
        if dtype is not None and active(self):
            dtype = keep(dtype)
        return orig_type(self, dtype, *a, **kw) if dtype is not None else orig_type(self, *a, **kw)

    def t_softmax(self, *a, dtype=None, **kw):
        if active(self):
            dtype = keep(dtype)
        return orig_tsoftmax(self, *a, dtype=dtype, **kw)

    def softmax(input, *a, dtype=None, **kw):
        if active(input):
            dtype = keep(dtype)
        return orig_softmax(input, *a, dtype=dtype, **kw)

    T.float, T.to, T.type, T.softmax = t_float, t_to, t_type, t_softmax
    torch.softmax = softmax
    st["installed"] = True


def _guard_model_forward(model):
    """Route model.forward through the downcast guard (a depth counter, so nested calls nest)."""
    orig = model.forward

    def forward(*a, **kw):
        _DOWNCAST_STATE["depth"] += 1
        try:
            return orig(*a, **kw)
        finally:
            _DOWNCAST_STATE["depth"] -= 1

    model.forward = forward


def rope_params(config, layer_type=None):
    """(rope_type, params dict with rope_theta, rotary dim) from a v5 or v4 style config.

    layer_type: Gemma 2/3 style configs keep one rope_parameters dict per layer type
    ("sliding_attention", "full_attention"); None reads the flat form."""
    rp = getattr(config, "rope_parameters", None)
    if layer_type is not None and isinstance(rp, dict) and isinstance(rp.get(layer_type), dict):
        rp = rp[layer_type]
    if isinstance(rp, dict) and "rope_theta" in rp:
        params = dict(rp)
    else:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    return rope_type, params, int(head_dim * partial)


def rope_inv_freq_f64(torch, config, layer_type=None):
    """inv_freq in float64 for rope types default, linear and llama3 (HF modeling_rope_utils formulas)."""
    rope_type, params, dim = rope_params(config, layer_type)
    theta = float(params["rope_theta"])
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rope_type == "default":
        return inv
    if rope_type == "linear":
        return inv / float(params["factor"])
    if rope_type == "llama3":
        factor = float(params["factor"])
        low = float(params["low_freq_factor"])
        high = float(params["high_freq_factor"])
        old_ctx = float(params["original_max_position_embeddings"])
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, inv_l)
    return None


def apply_f64_patches(torch, model):
    """Make an HF float64 model compute in float64 throughout.

    Returns (counts {rmsnorm, rope}, softmax_calls(), downcast_calls(), notes)."""
    counts = {"rmsnorm": 0, "rope": 0}
    _install_softmax_f64(torch)
    _install_downcast_guard(torch)
    softmax_base = _SOFTMAX_STATE["calls"]
    downcast_base = _DOWNCAST_STATE["calls"]

    def rmsnorm_f64(self, hidden_states):
        dt = hidden_states.dtype
        h = hidden_states.to(torch.float64)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.variance_epsilon)
        counts["rmsnorm"] += 1
        return self.weight * h.to(dt)

    def rope_f64(self, x, position_ids, layer_type=None):
        inv = self._arb_inv_freq64[layer_type].to(x.device)
        freqs = position_ids.to(torch.float64)[:, :, None] * inv[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = float(self._arb_scale[layer_type])
        counts["rope"] += 1
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    notes = []
    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls.endswith("RMSNorm") or cls.endswith("RMSNormGated"):
            if cls in F64_RMSNORM_CLASSES and hasattr(m, "variance_epsilon"):
                m.forward = types.MethodType(rmsnorm_f64, m)
            else:
                notes.append(f"{name}: {cls} kept, its float32 casts go through the downcast guard")
        elif cls.endswith("RotaryEmbedding"):
            # one inv_freq buffer, or one per layer type (Gemma 3: sliding_attention_inv_freq, ...)
            bufs = {None if b == "inv_freq" else b[:-len("_inv_freq")]: t for b, t in m.named_buffers(recurse=False)
                    if b == "inv_freq" or (b.endswith("_inv_freq") and not b.endswith("original_inv_freq"))}
            if not bufs:
                notes.append(f"{name}: {cls} has no inv_freq buffer, left as is")
                continue
            m._arb_inv_freq64, m._arb_scale = {}, {}
            for lt, buf in bufs.items():
                hf_inv = buf.detach().to("cpu", torch.float64)
                # a module built from its own config copy (older Gemma 3 local rope) has its own theta
                inv = rope_inv_freq_f64(torch, getattr(m, "config", None) or model.config, lt)
                if inv is None or inv.shape != hf_inv.shape or not torch.allclose(inv, hf_inv, rtol=1e-5, atol=0):
                    notes.append(f"{name}[{lt}]: own float64 inv_freq unavailable or differs; using HF's inv_freq")
                    inv = hf_inv
                m._arb_inv_freq64[lt] = inv
                m._arb_scale[lt] = getattr(m, f"{lt}_attention_scaling" if lt else "attention_scaling", 1.0)
            if None not in bufs:  # called without a layer type: HF uses the first one
                m._arb_inv_freq64[None] = m._arb_inv_freq64[next(iter(bufs))]
                m._arb_scale[None] = m._arb_scale[next(iter(bufs))]
            m.forward = types.MethodType(rope_f64, m)
    for n in notes:
        log("f64 patch note: " + n)
    _guard_model_forward(model)

    def softmax_calls():
        return _SOFTMAX_STATE["calls"] - softmax_base

    def downcast_calls():
        return _DOWNCAST_STATE["calls"] - downcast_base

    return counts, softmax_calls, downcast_calls, notes


def verify_loaded_weights(torch, model, model_dir):
    """Check every checkpoint tensor (and __metadata__ alias) landed in the model; fix aliases.

    TinyStories-656K/fp32 stores the tied embedding only as lm_head.weight, with
    __metadata__ {"model.embed_tokens.weight": "lm_head.weight"}. Whatever transformers
    does with that, afterwards every model tensor must equal its checkpoint tensor.
    Returns a list of fixes; raises TraceError when a model parameter has no source.
    """
    from safetensors import safe_open

    sd = model.state_dict()
    pairs = []  # (model key, file path, file key)
    for path in weight_files(model_dir):
        with safe_open(path, framework="pt") as h:
            keys = set(h.keys())
            for k in keys:
                pairs.append((k, path, k))
            for alias, target in (h.metadata() or {}).items():
                if target in keys and alias not in keys:
                    pairs.append((alias, path, target))
    fixes, covered = [], set()
    for _pass in range(2):
        bad = []
        for mk, path, fk in pairs:
            if mk not in sd:
                continue
            with safe_open(path, framework="pt") as h:
                t = h.get_tensor(fk)
            p = sd[mk]
            t = t.to(device=p.device, dtype=p.dtype)
            covered.add(p.data_ptr())
            if t.shape != p.shape or not torch.equal(t, p):
                bad.append(mk)
                if _pass == 0 and t.shape == p.shape:
                    with torch.no_grad():
                        p.copy_(t)
                    fixes.append(f"{mk} <- {fk}")
        if not bad:
            break
        if _pass == 1:
            raise TraceError(f"{model_dir}: model tensors differ from the checkpoint: {bad[:5]}")
    missing = [k for k, v in model.named_parameters() if v.data_ptr() not in covered]
    if missing:
        # transformers 5 fuses some checkpoint tensors on load (MoE experts -> one 3-D tensor) and
        # splits them again on save, so these have no 1:1 source. Check them through that inverse.
        bad = roundtrip_mismatches(torch, model, model_dir)
        if bad:
            raise TraceError(f"{model_dir}: model tensors with no checkpoint source: {missing[:5]}; "
                             f"save round trip differs: {bad[:5]}")
        fixes.append(f"checked through a save_pretrained round trip: {len(missing)} fused tensors "
                     f"(e.g. {missing[0]})")
    return fixes


def roundtrip_mismatches(torch, model, model_dir):
    """Names where model.save_pretrained's tensors differ from the checkpoint's (values in float64)."""
    import tempfile
    from safetensors import safe_open

    def load_all(d):
        out = {}
        for path in weight_files(d):
            with safe_open(path, framework="pt") as h:
                for k in h.keys():
                    out[k] = h.get_tensor(k).to(torch.float64)
        return out

    want = load_all(model_dir)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        got = load_all(d)
    bad = sorted(set(want) ^ set(got))
    bad += [k for k in sorted(set(want) & set(got))
            if want[k].shape != got[k].shape or not torch.equal(want[k], got[k].to(want[k].device))]
    return bad


def load_model(model_dir, dtype="float64", device="cpu", attn="eager", f64_exact=True):
    """Load an HF causal LM for tracing. Returns (model, info dict)."""
    import torch
    from transformers import AutoModelForCausalLM

    tdt = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    # MoE experts: the plain per-expert loop; grouped-matmul kernels need not exist for float64 on CPU
    kw = dict(attn_implementation=attn, experts_implementation="eager")
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=tdt, **kw)
    except Exception:  # a transformers without experts_implementation; a real problem shows again below
        kw.pop("experts_implementation")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=tdt, **kw)
    model = model.to(device=device, dtype=tdt).eval()
    info = {"weight_fixes": verify_loaded_weights(torch, model, model_dir)}
    for f in info["weight_fixes"]:
        log(f"weight check after load: {f}")
    info["f64_patches"] = None
    if dtype == "float64" and f64_exact:
        info["f64_patches"] = apply_f64_patches(torch, model)
    else:
        set_softmax_f64(False)
    return model, info


def fixups_field(info):
    p = info.get("f64_patches")
    if not p:
        return ""
    counts, softmax_calls, downcast_calls, _notes = p
    return ",f64_fixups=rmsnorm:%d+softmax:%d+rope:%d+downcast:%d" % (
        counts["rmsnorm"], softmax_calls(), counts["rope"], downcast_calls())


def count_params(model):
    seen, n = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel()
    return n


def forward_chunk(torch, model, ctx_ids, chunk_ids, device):
    """Logits [W, V] of the traced W-token forward behind a cached context."""
    chunk = torch.tensor([chunk_ids], dtype=torch.long, device=device)
    if ctx_ids:
        ctx = torch.tensor([ctx_ids], dtype=torch.long, device=device)
        out = model(input_ids=ctx, use_cache=True)
        out = model(input_ids=chunk, past_key_values=out.past_key_values, use_cache=True)
    else:
        out = model(input_ids=chunk, use_cache=True)
    return out.logits[0]


def forward_full(torch, model, ids, w, device):
    x = torch.tensor([ids], dtype=torch.long, device=device)
    return model(input_ids=x, use_cache=False).logits[0, -w:]


# ------------------------------------------------------------------------------ rows


def fmt(x):
    return "%.9g" % x


def rows_for_chunk(torch, logits, chunk_index, chunk_start, targets, topk, compute):
    """Trace rows for one chunk. logits: [W, V] tensor. Returns (lines, n_nonfinite)."""
    if compute == "float64":
        lg = logits.detach().to("cpu", torch.float64)
        lse = torch.logsumexp(lg, dim=-1)
        out_dtype = None
    else:
        lg32 = logits.detach().to("cpu", torch.float32)
        lg = lg32.to(torch.float64)
        lse = torch.logsumexp(lg, dim=-1)
        out_dtype = torch.float32
    nonfinite = int((~torch.isfinite(lg)).sum().item())
    order = torch.sort(lg, dim=-1, descending=True, stable=True)
    top_ids = order.indices[:, :topk]
    top_vals = order.values[:, :topk]
    tgt = torch.tensor(targets, dtype=torch.long)
    tl = lg.gather(1, tgt[:, None])[:, 0]
    nll = lse - tl
    if out_dtype is not None:
        # round to float32 as an f32 engine would hold them; nll = lse - target_logit in float32
        lse, tl, top_vals = (t.to(out_dtype) for t in (lse, tl, top_vals))
        nll = lse - tl
        lse, tl, nll, top_vals = (t.to(torch.float64) for t in (lse, tl, nll, top_vals))
    lines = []
    for pos in range(lg.shape[0]):
        i = chunk_start + pos
        lines.append("\t".join([
            str(chunk_index), str(pos), str(i + 1), str(targets[pos]),
            fmt(nll[pos].item()), fmt(tl[pos].item()), fmt(lse[pos].item()),
            ",".join(str(v) for v in top_ids[pos].tolist()),
            ",".join(fmt(v) for v in top_vals[pos].tolist()),
        ]))
    return lines, nonfinite


# ------------------------------------------------------------------------------ main


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="HF model directory (config.json, *.safetensors, tokenizer.json)")
    ap.add_argument("--corpus", required=True, help="UTF-8 text file, tokenized as one string")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="named shape (DESIGN.md section 3)")
    ap.add_argument("--chunk", type=int, help="W: tokens per traced forward")
    ap.add_argument("--chunks", type=int, help="C: number of chunks")
    ap.add_argument("--prefill", type=int, help="P: corpus tokens of context before each chunk")
    ap.add_argument("--start", type=int, help="S: corpus index of the first chunk's first input token")
    ap.add_argument("--shape-name", help="name written in the # shape line (default: named shape or 'custom')")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--dtype", choices=["float64", "float32", "bfloat16"], default="float64")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--attn", default="eager", help="attn_implementation (default eager)")
    ap.add_argument("--bos", help="override the BOS id (an integer or 'none')")
    ap.add_argument("--hf-f64-as-is", action="store_true",
                    help="do not patch transformers' float32 casts in float64 mode")
    ap.add_argument("--check-full", action="store_true",
                    help="also run context+chunk as one forward and report the largest difference")
    ap.add_argument("-o", "--out", required=True, help="output trace path")
    return ap.parse_args(argv)


def run(args):
    name, w, c, p, s = resolve_shape(args)
    if args.topk < 1:
        raise TraceError("--topk must be >= 1")
    if not os.path.isdir(args.model):
        raise TraceError(f"{args.model}: not a directory")
    if not os.path.isfile(args.corpus):
        raise TraceError(f"{args.corpus}: no such file")

    import torch
    import transformers

    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    cfg = read_json(os.path.join(args.model, "config.json"))
    tok, bos, tj = load_tokenizer(args.model, args.bos)
    with open(args.corpus, "rb") as f:
        corpus_bytes = f.read()
    try:
        text = corpus_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{args.corpus}: not UTF-8 at byte {e.start}")
    corpus = tokenize_text(tok, text)
    plan = plan_chunks(len(corpus), w, c, p, s)
    log(f"corpus {args.corpus}: {len(corpus)} tokens; shape {name} W={w} C={c} P={p} S={s}; bos={bos}")

    model, info = load_model(args.model, args.dtype, args.device, args.attn, not args.hf_f64_as_is)
    vocab = model.config.vocab_size
    if args.topk > vocab:
        raise TraceError(f"--topk {args.topk} exceeds the vocabulary ({vocab})")

    full_only = FULL_FORWARD_ARCHS.get(cfg.get("model_type"))
    if full_only:
        log(f"{cfg.get('model_type')}: each chunk is one uncached forward over context + chunk ({full_only})")
    rows, nonfinite, max_full_diff = [], 0, 0.0
    t0 = time.time()
    with torch.inference_mode():
        for ci, (cs, ctx_start) in enumerate(plan):
            ctx = ([bos] if bos is not None else []) + corpus[ctx_start:cs]
            chunk = corpus[cs:cs + w]
            targets = corpus[cs + 1:cs + w + 1]
            if full_only:
                logits = forward_full(torch, model, ctx + chunk, w, args.device)
            else:
                logits = forward_chunk(torch, model, ctx, chunk, args.device)
            if args.check_full and not full_only:
                full = forward_full(torch, model, ctx + chunk, w, args.device)
                d = (full.double() - logits.double()).abs().max().item()
                max_full_diff = max(max_full_diff, d)
            lines, nf = rows_for_chunk(torch, logits, ci, cs, targets, args.topk, args.dtype)
            rows.extend(lines)
            nonfinite += nf
    if args.device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.time() - t0
    if args.check_full and not full_only:
        log(f"check-full: max |cached - full| logit difference {max_full_diff:.3e}")

    env = sorted(k for k in os.environ if k.startswith("ARBITER_"))
    header = [
        ("arbiter-trace", str(TRACE_VERSION)),
        ("model", args.model, "sha256", weights_sha256(args.model), "arch", str(cfg.get("model_type")),
         "params", str(count_params(model))),
        ("tokenizer", "sha256", sha256_file(tj), "bos", "none" if bos is None else str(bos)),
        ("corpus", args.corpus, "sha256", hashlib.sha256(corpus_bytes).hexdigest(), "tokens", str(len(corpus))),
        ("shape", name, "chunk_tokens", str(w), "max_chunks", str(c), "topk", str(args.topk),
         "prefill", str(p), "start_token", str(s)),
        ("device", "hf-" + args.device, "compute", COMPUTE_NAMES[args.dtype],
         "weights", checkpoint_dtype(args.model)),
        ("providers", "transformers=" + transformers.__version__ + fixups_field(info), "fallbacks", "0"),
        ("inject", "none"),
        ("build", "hf_trace", "none", "python " + platform.python_version(), "torch " + torch.__version__),
        ("env", ",".join(f"{k}={os.environ[k]}" for k in env) if env else "none"),
        ("columns", "chunk", "pos", "abs_pos", "target", "nll", "target_logit", "lse", "top_ids", "top_logits"),
    ]
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, ".%s.tmp.%d" % (os.path.basename(args.out), os.getpid()))
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for fields in header:
            f.write("# " + "\t".join(fields) + "\n")
        for line in rows:
            f.write(line + "\n")
        f.write("# end\trows\t%d\telapsed_s\t%.3f\n" % (len(rows), elapsed))
    os.replace(tmp, args.out)
    log(f"wrote {args.out}: {len(rows)} rows in {elapsed:.3f} s")
    stats = {"rows": len(rows), "elapsed_s": elapsed, "nonfinite": nonfinite,
             "max_full_diff": max_full_diff if args.check_full and not full_only else None,
             "full_forward_only": full_only,
             "f64_fixups": fixups_field(info).lstrip(",").replace("f64_fixups=", ""), "weight_fixes": info["weight_fixes"]}
    if nonfinite:
        log(f"ERROR: {nonfinite} non-finite logits")
        return 1, stats
    return 0, stats


def run_cli(argv):
    """(exit code, stats dict or None) for the given command-line arguments."""
    args = parse_args(argv)
    try:
        return run(args)
    except TraceError as e:
        print(f"[hf_trace] error: {e}", file=sys.stderr)
        return 2, None


def main(argv=None):
    return run_cli(argv)[0]


if __name__ == "__main__":
    sys.exit(main())
