#!/usr/bin/env python3
"""make_fixtures.py: build arbiter's Hugging Face reference fixtures (corpus, tiny models, logits, traces).

Run from anywhere; paths are relative to the repository root. Needs PyTorch, transformers,
tokenizers and safetensors (the GPU machine has them; a CPU works too, only slower).

Steps (each skips what already exists unless --force; `all` runs 2..6 in order):

  copy-models  copy the shipped models from ../shared/models into models/ (run where
               ../shared exists, i.e. on the development machine, before the others)
  sample       sample TinyStories-656K (temperature 0.8, top-k 40, from BOS + a seed
               phrase, until EOS) into models/corpus/stories.txt (~80 KB, committed) and
               .carry/fixtures-work/train.txt (~2 MB, not committed)
  tokenizer    train the byte-level BPE (Qwen2 split regex, 1023 tokens + <|endoftext|>), or copy
               tests/fixtures/models/tiny-qwen2/tokenizer.json when it exists
  train        train every FIXTURES model that has no model.safetensors yet (or --only NAMES)
               in parallel (one process each, --seconds of wall time each) into tests/fixtures/models/
  references   float64 logits (CPU, eager attention) -> reference_logits.json files
  traces       float64 hf_trace.py traces (w8: --chunk 8 --chunks 8 --prefill 64 --start 0,
               w1: --chunk 1 --chunks 16 --prefill 0 --start 0) -> tests/fixtures/traces/
  probes       transformers behaviour checks (sliding-window semantics, AutoTokenizer
               agreement, fp32-vs-bf16 TinyStories) -> the report
  sums         write models/SHA256SUMS and tests/fixtures/SHA256SUMS

    python3 tools/make_fixtures.py copy-models            # development machine
    python3 tools/make_fixtures.py all --report out.json  # GPU machine
    python3 tools/make_fixtures.py sums                   # after copying the results back

To add a fixture model, add an entry to FIXTURES (config builder + tokenizer + dtype);
`train`, `references` and `traces` pick it up.
"""

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import hf_trace  # noqa: E402  (same folder)

TS_DIR = "models/TinyStories-656K"
TS_FP32_DIR = "models/TinyStories-656K/fp32"
CORPUS = "models/corpus/stories.txt"
WORK = ".carry/fixtures-work"
TRAIN_TEXT = WORK + "/train.txt"
BYTELEVEL_TOK = WORK + "/bytelevel-1024.json"
FIX_MODELS = "tests/fixtures/models"
FIX_REF = "tests/fixtures/reference"
FIX_TRACES = "tests/fixtures/traces"

SEEDS = [
    "Once upon a time,", "One day,", "Tom and Sue", "Lily", "There was a", "The little dog",
    "Ben had a", "Mom said,", "In the park,", "Sara and her friend", "The sun was", "Max wanted to",
]
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOPK = 40
SAMPLE_BATCH = 320
SAMPLE_MAX_LEN = 500          # TinyStories-656K has max_position_embeddings 512
CORPUS_BYTES = 80_000
TRAIN_BYTES = 2_000_000

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
EOT = "<|endoftext|>"

TRAIN_SEQ = 128
TRAIN_BATCH = 32
TRAIN_LR = 3e-3
TRAIN_WARMUP = 200

# name -> how to build it. tokenizer "tinystories" = TinyStories-656K's tokenizer.json (BOS 1,
# EOS 2); "bytelevel" = the byte-level BPE trained by step `tokenizer` (no BOS, EOS <|endoftext|>).
FIXTURES = {
    "tiny-llama": dict(
        model_class="LlamaForCausalLM", config_class="LlamaConfig", tokenizer="tinystories",
        save_dtype="bfloat16", seed=101,
        config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5,
                    tie_word_embeddings=True),
        rope=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                  high_freq_factor=4.0, original_max_position_embeddings=64)),
    "tiny-mistral": dict(
        model_class="MistralForCausalLM", config_class="MistralConfig", tokenizer="tinystories",
        save_dtype="float32", seed=102, legacy_config="rope",
        config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, sliding_window=32, max_position_embeddings=2048,
                    rms_norm_eps=1e-5, tie_word_embeddings=False),
        rope=dict(rope_type="default", rope_theta=10000.0)),
    "tiny-qwen2": dict(
        model_class="Qwen2ForCausalLM", config_class="Qwen2Config", tokenizer="bytelevel",
        save_dtype="float32", seed=103,
        config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, use_sliding_window=False),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    "tiny-qwen3": dict(
        model_class="Qwen3ForCausalLM", config_class="Qwen3Config", tokenizer="bytelevel",
        save_dtype="float32", seed=104,
        config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, attention_bias=False, use_sliding_window=False),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    # issue 23: Gemma 2/3, MoE. Values are chosen so that every code path an implementation needs
    # is taken: windows smaller than the trace context (w8 has 64 tokens of it), sliding and full
    # layers mixed, scalars that differ from their usual derived values.
    "tiny-gemma3": dict(
        model_class="Gemma3ForCausalLM", config_class="Gemma3TextConfig", tokenizer="tinystories",
        save_dtype="bfloat16", seed=105,
        config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                    final_logit_softcapping=15.0, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                    max_position_embeddings=2048, tie_word_embeddings=True),
        rope={"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
              "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=4.0)},
        rope_legacy=dict(rope_theta=1000000.0, rope_local_base_freq=10000.0,
                         rope_scaling=dict(rope_type="linear", factor=4.0))),
    "tiny-gemma2": dict(
        model_class="Gemma2ForCausalLM", config_class="Gemma2Config", tokenizer="bytelevel",
        save_dtype="float32", seed=106,
        config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=32, sliding_window=24,
                    layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=20.0,
                    final_logit_softcapping=15.0, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                    max_position_embeddings=2048, tie_word_embeddings=True),
        rope=dict(rope_type="default", rope_theta=10000.0)),
    "tiny-qwen3-moe": dict(
        model_class="Qwen3MoeForCausalLM", config_class="Qwen3MoeConfig", tokenizer="bytelevel",
        save_dtype="float32", seed=107,
        config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                    max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    use_sliding_window=False),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    "tiny-mixtral": dict(
        model_class="MixtralForCausalLM", config_class="MixtralConfig", tokenizer="tinystories",
        save_dtype="bfloat16", seed=108,
        config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                    max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    "tiny-qwen2-moe": dict(
        model_class="Qwen2MoeForCausalLM", config_class="Qwen2MoeConfig", tokenizer="bytelevel",
        save_dtype="float32", seed=109,
        config=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                    shared_expert_intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                    decoder_sparse_step=2, mlp_only_layers=[], max_position_embeddings=2048, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, use_sliding_window=False),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    # issue 24: Mamba2 hybrids. mamba heads 8 x head dim 16 = expand 2 x hidden 64; 2 groups, so
    # the gated RMSNorm normalizes each half of the 128 channels on its own.
    "tiny-granite-h": dict(
        model_class="GraniteMoeHybridForCausalLM", config_class="GraniteMoeHybridConfig", tokenizer="tinystories",
        save_dtype="bfloat16", seed=110,
        config=dict(hidden_size=64, intermediate_size=128, shared_intermediate_size=128, num_local_experts=0,
                    num_experts_per_tok=0, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    layer_types=["mamba", "attention", "mamba", "attention"], position_embedding_type="nope",
                    mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
                    mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
                    embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
                    logits_scaling=4.0, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True),
        rope=None, key_aliases={"layer_types": "layers_block_type"}, legacy_config="granite_layer_types"),
    "tiny-granite-h-moe": dict(
        model_class="GraniteMoeHybridForCausalLM", config_class="GraniteMoeHybridConfig", tokenizer="bytelevel",
        save_dtype="float32", seed=111,
        config=dict(hidden_size=64, intermediate_size=32, shared_intermediate_size=64, num_local_experts=4,
                    num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    layer_types=["attention", "mamba", "mamba", "attention"], position_embedding_type="rope",
                    mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
                    mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
                    embedding_multiplier=8.0, residual_multiplier=0.5, attention_multiplier=0.125,
                    logits_scaling=2.0, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False),
        rope=dict(rope_type="default", rope_theta=10000.0), key_aliases={"layer_types": "layers_block_type"}),
    "tiny-nemotron-h": dict(
        model_class="NemotronHForCausalLM", config_class="NemotronHConfig", tokenizer="tinystories",
        save_dtype="bfloat16", seed=112,
        config=dict(hidden_size=64, hybrid_override_pattern="ME*-", num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=128, mlp_hidden_act="relu2",
                    mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4,
                    expand=2, chunk_size=16, use_conv_bias=True, n_routed_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_shared_experts=1,
                    routed_scaling_factor=2.0, norm_topk_prob=True, use_mamba_kernels=False,
                    layer_norm_epsilon=1e-5, max_position_embeddings=2048, tie_word_embeddings=False),
        rope=None, optional_keys=("num_hidden_layers",), legacy_config="nemotron_pattern"),
}

TRACE_SHAPES = {
    "w8": ["--chunk", "8", "--chunks", "8", "--prefill", "64", "--start", "0"],
    "w1": ["--chunk", "1", "--chunks", "16", "--prefill", "0", "--start", "0"],
}


def log(msg):
    print("[make_fixtures] " + msg, flush=True)


def rel(path):
    return os.path.relpath(path, ROOT)


def sha256_file(path):
    return hf_trace.sha256_file(path)


def write_text(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


class Report:
    """A JSON file that each step adds its findings to."""

    def __init__(self, path):
        self.path = path
        self.data = {}
        if path and os.path.exists(path):
            with open(path) as f:
                self.data = json.load(f)

    def set(self, key, value):
        self.data[key] = value
        if self.path:
            write_json(self.path, self.data)


def device_name(args):
    import torch
    if args.device != "auto":
        return args.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def tokenizer_paths(kind):
    """(tokenizer.json path, bos id or None, eos id) of a fixture tokenizer kind."""
    from tokenizers import Tokenizer
    if kind == "tinystories":
        return os.path.join(TS_DIR, "tokenizer.json"), 1, 2
    tok = Tokenizer.from_file(BYTELEVEL_TOK)
    return BYTELEVEL_TOK, None, tok.token_to_id(EOT)


# ------------------------------------------------------------------------ copy-models


def step_copy_models(args, rep):
    src = args.shared_models
    sums = {}
    with open(os.path.join(src, "SHA256SUMS")) as f:
        for line in f:
            h, p = line.split()
            sums[os.path.normpath(p)] = h
    wanted = [p for p in sums if p.startswith("TinyStories-656K" + os.sep)]
    wanted += [os.path.join("stories260K", "stories260K.gguf"), os.path.join("stories260K", "greedy_reference.json")]
    for p in sorted(wanted):
        dst = os.path.join("models", p)
        if os.path.exists(dst) and sha256_file(dst) == sums[p] and not args.force:
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(src, p), dst)
        if sha256_file(dst) != sums[p]:
            raise RuntimeError(f"{dst}: sha256 differs from {src}/SHA256SUMS")
        log(f"copied {p}")
    rep.set("copy_models", sorted(wanted))


# ----------------------------------------------------------------------------- sample


def clean_story(text):
    """Plain ASCII story text, or None. TinyStories-656K sometimes writes its own markers
    ('end_story|>' before EOS, '<|start_story|>' inside merged tokens) as text."""
    t = text.replace("<|start_story|>", " ").replace("<|end_story|>", " ")
    t = re.sub(r"<?\|?\s*(?:start|end)_story\s*\|?>?", " ", t)
    lines = [re.sub(r"[ \t]+", " ", ln).strip() for ln in t.split("\n")]
    t = "\n".join(ln for ln in lines if ln)
    if len(t) < 200 or len(t) > 4000:
        return None
    if any(ch in t for ch in "<>|_\\{}[]#@*~^`=+"):
        return None
    if not all(32 <= ord(ch) < 127 or ch == "\n" for ch in t):
        return None
    return t


def sample_batch(torch, model, prompt, batch, max_len, eos, gen, device):
    """Sample `batch` continuations of `prompt` (temperature, top-k) until EOS.
    Returns a list of generated id lists (EOS excluded), None where EOS never came."""
    x = torch.tensor([prompt] * batch, dtype=torch.long, device=device)
    toks = []
    with torch.inference_mode():
        out = model(input_ids=x, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1, :]
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        for step in range(max_len - len(prompt)):
            v, ix = torch.topk(logits.float() / SAMPLE_TEMPERATURE, SAMPLE_TOPK, dim=-1)
            pick = torch.multinomial(torch.softmax(v, dim=-1), 1, generator=gen)
            nxt = ix.gather(1, pick)[:, 0]
            nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
            toks.append(nxt)
            done = done | (nxt == eos)
            if step % 32 == 31 and bool(done.all()):
                break
            out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
    rows = torch.stack(toks, 1).cpu().tolist()
    return [r[:r.index(eos)] if eos in r else None for r in rows]


def step_sample(args, rep):
    if os.path.exists(CORPUS) and os.path.exists(TRAIN_TEXT) and not args.force:
        log("sample: corpus and training text exist, skipped")
        return
    if os.path.exists(CORPUS) and not args.force:
        log("sample: corpus exists and is kept; sampling the training text only")
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    dev = device_name(args)
    torch.manual_seed(1234)
    tok = Tokenizer.from_file(os.path.join(TS_DIR, "tokenizer.json"))
    cfg = hf_trace.read_json(os.path.join(TS_DIR, "config.json"))
    bos, eos = cfg["bos_token_id"], cfg["eos_token_id"]
    model = AutoModelForCausalLM.from_pretrained(TS_DIR, dtype=torch.float32).to(dev).eval()
    gen = torch.Generator(device=dev).manual_seed(1234)
    t0 = time.time()
    per_seed, stats = [], {"sampled": 0, "no_eos": 0, "rejected": 0}
    for seed in SEEDS:
        prompt = [bos] + tok.encode(seed, add_special_tokens=False).ids
        outs = sample_batch(torch, model, prompt, args.sample_batch, SAMPLE_MAX_LEN, eos, gen, dev)
        texts = []
        for ids in outs:
            stats["sampled"] += 1
            if ids is None:
                stats["no_eos"] += 1
                continue
            t = clean_story(tok.decode(prompt[1:] + ids, skip_special_tokens=True))
            if t is None:
                stats["rejected"] += 1
            else:
                texts.append(t)
        per_seed.append(texts)
        log(f"sample: seed {seed!r}: {len(texts)} stories ({time.time() - t0:.1f} s)")
    order, seen = [], set()
    for k in range(max(len(s) for s in per_seed)):
        for s in per_seed:
            if k < len(s) and s[k] not in seen:
                seen.add(s[k])
                order.append(s[k])
    corpus, n = [], 0
    while order and n < CORPUS_BYTES:
        corpus.append(order.pop(0))
        n += len(corpus[-1]) + 2
    train, n = [], 0
    while order and n < TRAIN_BYTES:
        train.append(order.pop(0))
        n += len(train[-1]) + 2
    corpus_text = "\n\n".join(corpus) + "\n"
    if os.path.exists(CORPUS) and not args.force:
        # keep the committed corpus (sampling need not reproduce it on another GPU or torch);
        # drop any training story that is in it, so the corpus stays held out
        with open(CORPUS, encoding="utf-8") as f:
            kept = f.read()
        held = set(kept.rstrip("\n").split("\n\n"))
        stats.update(corpus_kept=True, corpus_reproduced=kept == corpus_text,
                     train_dropped_as_in_corpus=sum(t in held for t in train))
        train = [t for t in train if t not in held]
    else:
        write_text(CORPUS, corpus_text)
    write_text(TRAIN_TEXT, "\n\n".join(train) + "\n")
    stats.update(corpus_stories=len(corpus), corpus_bytes=os.path.getsize(CORPUS),
                 train_stories=len(train), train_bytes=os.path.getsize(TRAIN_TEXT),
                 unused_stories=len(order), seconds=round(time.time() - t0, 1), device=dev,
                 seeds=SEEDS, temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOPK)
    log(f"sample: {stats}")
    rep.set("sample", stats)


# -------------------------------------------------------------------------- tokenizer


def step_tokenizer(args, rep):
    if os.path.exists(BYTELEVEL_TOK) and not args.force:
        log("tokenizer: exists, skipped")
        return
    committed = os.path.join(FIX_MODELS, "tiny-qwen2", "tokenizer.json")
    if os.path.exists(committed) and not args.force:
        # later fixtures share the committed vocabulary; retraining on new text would not give it
        os.makedirs(WORK, exist_ok=True)
        shutil.copyfile(committed, BYTELEVEL_TOK)
        log(f"tokenizer: copied {committed}")
        rep.set("tokenizer", {"copied_from": committed, "sha256": sha256_file(BYTELEVEL_TOK)})
        return
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=1023, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    with open(TRAIN_TEXT, encoding="utf-8") as f:
        stories = f.read().split("\n\n")
    tok.train_from_iterator(stories, trainer=trainer)
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    os.makedirs(WORK, exist_ok=True)
    tok.save(BYTELEVEL_TOK)
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    ids = tok.encode(text, add_special_tokens=False).ids
    info = {"vocab": tok.get_vocab_size(), "eot_id": tok.token_to_id(EOT),
            "corpus_tokens": len(ids), "roundtrip": tok.decode(ids) == text}
    log(f"tokenizer: {info}")
    rep.set("tokenizer", info)


def bytelevel_tokenizer_config(eot_id):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(eot_id): {
            "content": EOT, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}},
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOT,
        "errors": "replace",
        "model_max_length": 2048,
        "pad_token": EOT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# ------------------------------------------------------------------------------ train


def make_config(cls, kw, spec):
    """cls(**kw), retrying with a key renamed (spec key_aliases) or dropped (spec optional_keys)
    when this transformers rejects it. Returns (config, {given key: key used or None})."""
    kw, used = dict(kw), {k: k for k in kw}
    for _ in range(len(kw) + 1):
        try:
            return cls(**kw), used
        except (TypeError, ValueError) as e:
            culprit = next((k for k in kw if repr(k) in str(e) or f"`{k}`" in str(e)), None)
            alias = spec.get("key_aliases", {}).get(culprit)
            if alias and alias not in kw:
                kw[alias] = kw.pop(culprit)
                used = {k: (alias if v == culprit else v) for k, v in used.items()}
            elif culprit in spec.get("optional_keys", ()):
                kw.pop(culprit)
                used = {k: (None if v == culprit else v) for k, v in used.items()}
            else:
                raise
            log(f"config: {e}; retrying with {culprit} -> {alias or 'dropped'}")
    return cls(**kw), used


def config_readback(cfg, spec, used):
    """Given config keys whose value the built config does not hold (silently ignored keys)."""
    bad = {}
    for k, v in spec["config"].items():
        key = used.get(k)
        got = getattr(cfg, key, "<missing>") if key else "<dropped>"
        if isinstance(got, tuple):
            got = list(got)
        if got != v and not (isinstance(v, float) and isinstance(got, (int, float)) and float(got) == v):
            bad[k] = {"given": v, "got": repr(got)}
    return bad


def build_config(transformers, spec, vocab, bos, eos):
    """The transformers config of a fixture and how rope was given. rope: None (the family has no
    rope keys, or they are in `config`), one dict (v5 `rope_parameters`, falling back to the v4
    `rope_theta`/`rope_scaling` keys), or one dict per layer type (Gemma 3; fallback `rope_legacy`)."""
    cls = getattr(transformers, spec["config_class"])
    kw = dict(spec["config"], vocab_size=vocab, bos_token_id=bos, eos_token_id=eos)
    rope = spec["rope"]
    if rope is None:
        cfg, used = make_config(cls, kw, spec)
        return cfg, "none", used
    per_type = all(isinstance(v, dict) for v in rope.values())

    def rope_ok(cfg):
        for lt, want in (rope.items() if per_type else [(None, rope)]):
            rtype, params, _dim = hf_trace.rope_params(cfg, lt)
            if rtype != want["rope_type"] or not all(
                    float(params.get(k, float("nan"))) == float(v) for k, v in want.items() if k != "rope_type"):
                return False
        return True

    forms = [("rope_parameters", dict(kw, rope_parameters=dict(rope)))]
    if per_type:
        forms.append(("rope_legacy", dict(kw, **spec["rope_legacy"])))
    else:
        legacy = dict(kw, rope_theta=rope["rope_theta"])
        if rope["rope_type"] != "default":
            legacy["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        forms.append(("rope_theta/rope_scaling", legacy))
    for form, args in forms:
        try:
            cfg, used = make_config(cls, args, spec)
            if rope_ok(cfg):
                return cfg, form, used
            log(f"config: {form} built but the rope check failed: {cfg.rope_parameters}")
        except (TypeError, ValueError) as e:
            log(f"config: {form} not taken ({e})")
    cfg, used = make_config(cls, forms[0][1], spec)
    log(f"config: WARNING rope check failed; using rope_parameters as given: {cfg.rope_parameters}")
    return cfg, "rope_parameters (check failed)", used


def token_stream(tok, path, group=32):
    with open(path, encoding="utf-8") as f:
        stories = f.read().split("\n\n")
    groups = ["\n\n".join(stories[i:i + group]) + "\n\n" for i in range(0, len(stories), group)]
    ids = []
    for enc in tok.encode_batch(groups, add_special_tokens=False):
        ids.extend(enc.ids)
    return ids


def eval_loss(torch, model, ids, bos, device, max_windows=64):
    """Mean next-token cross-entropy on non-overlapping windows (BOS + 128 tokens)."""
    n_in = TRAIN_SEQ + 1 - (1 if bos is not None else 0)
    wins = [ids[i:i + n_in] for i in range(0, len(ids) - n_in, n_in)][:max_windows]
    x = torch.tensor(wins, dtype=torch.long, device=device)
    if bos is not None:
        x = torch.cat([torch.full((x.shape[0], 1), bos, dtype=torch.long, device=device), x], 1)
    with torch.no_grad():
        logits = model(input_ids=x[:, :-1], use_cache=False).logits.float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()


def legacy_rope(cfg):
    """v5 `rope_parameters` -> the older top-level `rope_theta` (+ `rope_scaling`) form."""
    if "rope_parameters" not in cfg:
        return "config.json had no rope_parameters"
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.get("rope_theta", 10000.0)
    extra = {k: v for k, v in rp.items() if k not in ("rope_theta", "rope_type")}
    if rp.get("rope_type", "default") != "default" or extra:
        cfg["rope_scaling"] = dict(extra, rope_type=rp.get("rope_type", "default"))
    return None


def legacy_granite_layer_types(cfg):
    """5.17 writes layer_types linear_attention/full_attention; Hub Granite 4.0-H checkpoints say
    mamba/attention."""
    names = {"linear_attention": "mamba", "full_attention": "attention"}
    if not all(t in names for t in cfg.get("layer_types", [None])):
        return f"unexpected layer_types {cfg.get('layer_types')}"
    cfg["layer_types"] = [names[t] for t in cfg["layer_types"]]
    return None


def legacy_nemotron_pattern(cfg):
    """5.17 writes the layers_block_type list; Hub Nemotron-H checkpoints carry the
    hybrid_override_pattern string (M mamba, E moe, * attention, - mlp) and num_hidden_layers."""
    chars = {"linear_attention": "M", "mamba": "M", "moe": "E", "full_attention": "*", "attention": "*", "mlp": "-"}
    types = cfg.get("layers_block_type")
    if not types or not all(t in chars for t in types):
        return f"unexpected layers_block_type {types}"
    cfg.pop("layers_block_type")
    cfg["hybrid_override_pattern"] = "".join(chars[t] for t in types)
    cfg["num_hidden_layers"] = len(types)
    return None


# spec legacy_config -> rewrite of config.json into the form older/Hub checkpoints use; returns
# None when done, else why not. train_one keeps a rewrite only if it reloads to identical logits.
LEGACY_CONFIG = {"rope": legacy_rope, "granite_layer_types": legacy_granite_layer_types,
                 "nemotron_pattern": legacy_nemotron_pattern}


def train_one(name, args):
    """Train one fixture model and save it; runs in its own process. Writes WORK/train-NAME.json."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    spec = FIXTURES[name]
    dev = device_name(args)
    torch.set_num_threads(4)
    torch.manual_seed(spec["seed"])
    tok_path, bos, eos = tokenizer_paths(spec["tokenizer"])
    tok = Tokenizer.from_file(tok_path)
    vocab = tok.get_vocab_size()
    cfg, rope_form, used = build_config(transformers, spec, vocab, bos, eos)
    readback = config_readback(cfg, spec, used)
    if readback:
        log(f"{name}: WARNING config keys not held as given: {readback}")
    model = getattr(transformers, spec["model_class"])(cfg).to(dev)
    stream = token_stream(tok, TRAIN_TEXT)
    with open(CORPUS, encoding="utf-8") as f:
        heldout = tok.encode(f.read(), add_special_tokens=False).ids
    data = torch.tensor(stream, dtype=torch.long, device=dev)
    n_in = TRAIN_SEQ + 1 - (1 if bos is not None else 0)
    ar = torch.arange(n_in, device=dev)
    gen = torch.Generator(device=dev).manual_seed(spec["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, betas=(0.9, 0.95), weight_decay=0.01,
                            **({"fused": True} if dev == "cuda" else {}))
    amp = dev == "cuda"
    log(f"{name}: {sum(p.numel() for p in model.parameters())} params, vocab {vocab}, "
        f"{len(stream)} training tokens, device {dev}, {args.seconds} s")
    model.train()
    losses, step, t0 = [], 0, time.time()
    while True:
        elapsed = time.time() - t0
        if elapsed >= args.seconds:
            break
        frac = elapsed / args.seconds
        lr = TRAIN_LR * min(1.0, (step + 1) / TRAIN_WARMUP) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        st = torch.randint(0, len(stream) - n_in, (TRAIN_BATCH,), device=dev, generator=gen)
        x = data[st[:, None] + ar]
        if bos is not None:
            x = torch.cat([torch.full((TRAIN_BATCH, 1), bos, dtype=torch.long, device=dev), x], 1)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach())
        step += 1
        if step % 500 == 0:
            log(f"{name}: step {step} loss {loss.item():.4f} lr {lr:.2e} {elapsed:.1f} s")
    if dev == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.time() - t0
    first = torch.stack(losses[:20]).mean().item()
    final = torch.stack(losses[-100:]).mean().item()
    model.eval()
    held = eval_loss(torch, model, heldout, bos, dev)

    # save: a fresh directory, then swap it in
    out_dir = os.path.join(FIX_MODELS, name)
    tmp_dir = out_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    save_dtype = getattr(torch, spec["save_dtype"])
    model = model.to("cpu", save_dtype)
    model.save_pretrained(tmp_dir)
    if not os.path.exists(os.path.join(tmp_dir, "generation_config.json")):
        gc = transformers.GenerationConfig(bos_token_id=bos, eos_token_id=eos)
        gc.save_pretrained(tmp_dir)
    if spec["tokenizer"] == "tinystories":
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(TS_DIR, f), os.path.join(tmp_dir, f))
    else:
        shutil.copyfile(BYTELEVEL_TOK, os.path.join(tmp_dir, "tokenizer.json"))
        write_json(os.path.join(tmp_dir, "tokenizer_config.json"), bytelevel_tokenizer_config(eos))
    cfg_path = os.path.join(tmp_dir, "config.json")
    written_cfg = hf_trace.read_json(cfg_path)

    # reload checks: the saved directory holds exactly the trained (save-dtype) weights, and the
    # legacy-form config (tiny-mistral, tiny-granite-h, tiny-nemotron-h) gives the same logits as the
    # config transformers wrote.
    # (Logits are not compared with the in-memory model: model.to(bf16) also rounds the
    # non-persistent rope inv_freq buffer, which a reload recomputes in float32.)
    probe = torch.tensor([heldout[:64]], dtype=torch.long)
    if bos is not None:
        probe = torch.cat([torch.tensor([[bos]]), probe], 1)
    saved = {k: v.detach().float() for k, v in model.state_dict().items()}

    def reload():
        m = transformers.AutoModelForCausalLM.from_pretrained(tmp_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            return m, m(input_ids=probe, use_cache=False).logits
    m2, base_logits = reload()
    diff = max((p.detach() - saved[k]).abs().max().item() for k, p in m2.named_parameters())
    legacy = None
    if spec.get("legacy_config"):
        cfg_json = hf_trace.read_json(cfg_path)
        why_not = LEGACY_CONFIG[spec["legacy_config"]](cfg_json)
        if why_not is None:
            write_text(cfg_path, json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
            _m3, logits3 = reload()
            diff2 = (logits3 - base_logits).abs().max().item()
            legacy = {"form": spec["legacy_config"], "rewritten": True, "reload_logits_max_abs_diff": diff2,
                      "config_keys": sorted(cfg_json)}
            if diff2 != 0.0:
                log(f"{name}: legacy {spec['legacy_config']} config does not reproduce the model "
                    f"(diff {diff2}); reverted")
                write_text(cfg_path, json.dumps(written_cfg, indent=2, sort_keys=True) + "\n")
                legacy["reverted"] = True
        else:
            legacy = {"form": spec["legacy_config"], "rewritten": False, "reason": why_not}
    attn = next(m for _n, m in m2.named_modules() if hasattr(m, "q_proj"))  # hybrids: not layer 0
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)
    files = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    header = hf_trace.safetensors_header(os.path.join(out_dir, "model.safetensors"))
    tensors = {k: [v["shape"], v["dtype"]] for k, v in sorted(header.items()) if k != "__metadata__"}
    result = {
        "name": name, "steps": step, "train_seconds": round(train_seconds, 1), "device": dev,
        "loss_first20": round(first, 4), "loss_final100": round(final, 4), "heldout_loss": round(held, 4),
        "ln_vocab": round(math.log(vocab), 4), "vocab": vocab, "params": hf_trace.count_params(m2),
        "rope_form_given": rope_form, "config_keys_used": used, "config_readback_mismatch": readback,
        "config_written": written_cfg, "reload_param_max_abs_diff": diff,
        "legacy_config": legacy, "files": files, "tensors": tensors,
        "q_proj_shape": list(attn.q_proj.weight.shape), "k_proj_shape": list(attn.k_proj.weight.shape),
        "q_proj_bias": attn.q_proj.bias is not None,
        "has_q_norm": hasattr(attn, "q_norm"),
    }
    write_json(os.path.join(WORK, f"train-{name}.json"), result)
    log(f"{name}: steps {step}, loss {first:.3f} -> {final:.3f}, held-out {held:.3f} "
        f"(ln V = {math.log(vocab):.3f}), reload diff {diff}, files {files}")


def step_train(args, rep):
    todo = [n for n in (args.only or list(FIXTURES))
            if args.force or not os.path.exists(os.path.join(FIX_MODELS, n, "model.safetensors"))]
    os.makedirs(WORK, exist_ok=True)
    procs = []
    for name in todo:
        cmd = [sys.executable, os.path.abspath(__file__), "train-one", name, "--seconds", str(args.seconds),
               "--device", args.device]
        logf = open(os.path.join(WORK, f"train-{name}.log"), "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        procs.append((name, subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, env=env), logf))
        if not args.parallel:
            procs[-1][1].wait()
    results = {}
    for name, p, logf in procs:
        rc = p.wait()
        logf.close()
        with open(os.path.join(WORK, f"train-{name}.log")) as f:
            lines = f.read().splitlines()
        for ln in lines[-6:]:
            print(f"  [{name}] {ln}", flush=True)
        res_path = os.path.join(WORK, f"train-{name}.json")
        if rc == 0 and os.path.exists(res_path):
            results[name] = hf_trace.read_json(res_path)
        else:
            results[name] = {"error": f"exit {rc}", "log_tail": lines[-30:]}
            log(f"train: {name} FAILED (exit {rc})")
    for n in FIXTURES:
        if n not in results and os.path.exists(os.path.join(WORK, f"train-{n}.json")):
            results[n] = hf_trace.read_json(os.path.join(WORK, f"train-{n}.json"))
    rep.set("train", results)


# ------------------------------------------------------------------------- references


def reference_targets():
    out = [("TinyStories-656K", TS_DIR, os.path.join(FIX_REF, "TinyStories-656K.json")),
           ("TinyStories-656K-fp32", TS_FP32_DIR, os.path.join(FIX_REF, "TinyStories-656K-fp32.json"))]
    for n in FIXTURES:
        d = os.path.join(FIX_MODELS, n)
        out.append((n, d, os.path.join(d, "reference_logits.json")))
    return out


def write_reference_json(path, meta, logits):
    parts = ["{"]
    for k, v in meta.items():
        parts.append(f" {json.dumps(k)}: {json.dumps(v)},")
    parts.append(' "logits": [')
    for i, row in enumerate(logits):
        parts.append("  [" + ", ".join(repr(float(x)) for x in row) + "]" + ("," if i + 1 < len(logits) else ""))
    parts.append(" ]")
    parts.append("}")
    write_text(path, "\n".join(parts) + "\n")


def step_references(args, rep):
    import torch
    import transformers

    with open(CORPUS, encoding="utf-8") as f:
        corpus_text = f.read()
    results = {}
    for name, mdir, out in reference_targets():
        if not os.path.exists(os.path.join(mdir, "config.json")):
            results[name] = {"skipped": "no model"}
            continue
        if os.path.exists(out) and not args.force:
            results[name] = {"skipped": "exists"}
            continue
        tok, bos, tj = hf_trace.load_tokenizer(mdir)
        ids = hf_trace.tokenize_text(tok, corpus_text)[:48]
        prompt = ([bos] if bos is not None else []) + ids
        n = len(prompt)
        positions = sorted({round(k * (n - 1) / 7) for k in range(8)})
        model, info = hf_trace.load_model(mdir, "float64", "cpu", "eager", f64_exact=False)
        x = torch.tensor([prompt], dtype=torch.long)
        with torch.no_grad():
            as_is = model(input_ids=x, use_cache=False).logits[0]
            info["f64_patches"] = hf_trace.apply_f64_patches(torch, model)
            exact = model(input_ids=x, use_cache=False).logits[0]
        fix = hf_trace.fixups_field(info).lstrip(",").replace("f64_fixups=", "")
        diff = (exact - as_is).abs().max().item()
        meta = {
            "model": name, "dtype": "float64", "transformers": transformers.__version__,
            "torch": torch.__version__, "device": "cpu", "attn_implementation": "eager",
            "model_dir": mdir, "weights_sha256": hf_trace.weights_sha256(mdir),
            "weights_dtype": hf_trace.checkpoint_dtype(mdir), "tokenizer_sha256": hf_trace.sha256_file(tj),
            "corpus": CORPUS, "corpus_sha256": sha256_file(CORPUS),
            "note": ("prompt_ids = BOS (if any) + the first 48 tokens of the corpus (tokenized as one string, "
                     "no special tokens); one forward over the whole prompt; logits[i] are the full-vocabulary "
                     "logits at prompt position positions[i]. float64 throughout: transformers' float32 casts "
                     "(RMSNorm, eager softmax, RoPE cos/sin, every other float64->float32 cast in the forward) "
                     "patched, see f64_fixups; "
                     "hf_as_is_max_abs_diff = largest |difference| to unpatched transformers float64."),
            "f64_fixups": fix, "hf_as_is_max_abs_diff": diff,
            "weight_fixes": info["weight_fixes"],
            "prompt_ids": prompt, "positions": positions,
        }
        write_reference_json(out, meta, [exact[p].tolist() for p in positions])
        results[name] = {"file": out, "prompt_len": n, "positions": positions, "f64_fixups": fix,
                         "hf_as_is_max_abs_diff": diff, "weight_fixes": info["weight_fixes"],
                         "top1_at_positions": [int(exact[p].argmax()) for p in positions]}
        log(f"references: {name}: {out}, hf as-is vs float64 max diff {diff:.3e}, {fix}, "
            f"weight fixes {info['weight_fixes']}")
    a, b = (os.path.join(FIX_REF, f) for f in ("TinyStories-656K.json", "TinyStories-656K-fp32.json"))
    if os.path.exists(a) and os.path.exists(b):
        la, lb = hf_trace.read_json(a)["logits"], hf_trace.read_json(b)["logits"]
        d = max(abs(x - y) for ra, rb in zip(la, lb) for x, y in zip(ra, rb))
        results["bf16_vs_fp32_TinyStories_max_abs_diff"] = d
        log(f"references: TinyStories bf16 vs fp32 checkpoint logits max diff {d:.3e} (expect 0)")
    rep.set("references", results)


# ----------------------------------------------------------------------------- traces


def trace_models():
    return [("TinyStories-656K", TS_DIR)] + [(n, os.path.join(FIX_MODELS, n)) for n in FIXTURES]


def trace_command(mdir, shape, out):
    return (["-m", mdir, "--corpus", CORPUS] + TRACE_SHAPES[shape] +
            ["--topk", "8", "--dtype", "float64", "--device", "cpu", "--check-full", "-o", out])


def step_traces(args, rep):
    results = {}
    for name, mdir in trace_models():
        for shape in TRACE_SHAPES:
            out = os.path.join(FIX_TRACES, f"{name}.{shape}.f64.tsv")
            key = f"{name}.{shape}"
            if not os.path.exists(os.path.join(mdir, "config.json")):
                results[key] = {"skipped": "no model"}
                continue
            if os.path.exists(out) and not args.force:
                results[key] = {"skipped": "exists"}
                continue
            argv = trace_command(mdir, shape, out)
            log("traces: python3 tools/hf_trace.py " + " ".join(argv))
            rc, stats = hf_trace.run_cli(argv)
            results[key] = {"rc": rc, "stats": stats, "file": out}
    rep.set("traces", results)


# ----------------------------------------------------------------------------- probes


def probe_sliding_window(torch, transformers):
    """Which keys does a query at position i see in transformers' Mistral with sliding_window=4?
    One layer, so position 11's logits depend on token j only if key j is visible."""
    import tempfile
    cfg = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, sliding_window=4,
                                     max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    m = transformers.MistralForCausalLM(cfg)
    res = {}
    with tempfile.TemporaryDirectory() as d:
        m.save_pretrained(d)
        for attn in ("eager", "sdpa"):
            mm = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64,
                                                                   attn_implementation=attn).eval()
            ids = torch.tensor([[5, 9, 13, 2, 40, 33, 7, 21, 11, 50, 3, 17]])
            with torch.no_grad():
                full = mm(input_ids=ids, use_cache=False).logits[0]
                base = full[11]
                visible = []
                for j in range(12):
                    x = ids.clone()
                    x[0, j] = (x[0, j] + 7) % 64
                    if (mm(input_ids=x, use_cache=False).logits[0, 11] - base).abs().max().item() > 1e-12:
                        visible.append(j)
                out = mm(input_ids=ids[:, :8], use_cache=True)
                chunk = mm(input_ids=ids[:, 8:], past_key_values=out.past_key_values, use_cache=True).logits[0]
                cached_diff = (chunk - full[8:]).abs().max().item()
                out = mm(input_ids=ids[:, :6], use_cache=True)
                past, dec = out.past_key_values, 0.0
                for p in range(6, 12):
                    o = mm(input_ids=ids[:, p:p + 1], past_key_values=past, use_cache=True)
                    past = o.past_key_values
                    dec = max(dec, (o.logits[0, -1] - full[p]).abs().max().item())
            res[attn] = {"keys_visible_to_query_11": visible, "chunk4_after_prefill8_max_diff": cached_diff,
                         "decode_steps_after_prefill6_max_diff": dec}
    res["window"] = 4
    res["meaning"] = ("query i sees keys j with i - window < j <= i (window counts the current token)"
                      if res["eager"]["keys_visible_to_query_11"] == [8, 9, 10, 11] else "see keys_visible")
    return res


def step_probes(args, rep):
    import torch
    import transformers
    res = {"transformers": transformers.__version__, "torch": torch.__version__}
    try:
        res["mistral_sliding_window"] = probe_sliding_window(torch, transformers)
    except Exception as e:  # a probe must not stop the others
        res["mistral_sliding_window"] = {"error": repr(e)}
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    agree = {}
    for name, mdir in trace_models() + [("TinyStories-656K-fp32", TS_FP32_DIR)]:
        if not os.path.exists(os.path.join(mdir, "tokenizer.json")):
            continue
        try:
            tok, bos, _ = hf_trace.load_tokenizer(mdir)
            want = hf_trace.tokenize_text(tok, text)
            at = transformers.AutoTokenizer.from_pretrained(mdir)
            got = at(text, add_special_tokens=False)["input_ids"]
            first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
            with_special = at("Once upon a time,")["input_ids"]
            agree[name] = {"auto_tokenizer_class": type(at).__name__, "same_ids": want == got,
                           "n_tokenizers": len(want), "n_auto": len(got), "first_mismatch": first,
                           "bos_from_tokenizer_config": bos, "auto_bos_token_id": at.bos_token_id,
                           "auto_eos_token_id": at.eos_token_id,
                           "auto_ids_with_special_tokens('Once upon a time,')": with_special}
        except Exception as e:
            agree[name] = {"error": repr(e)}
    res["auto_tokenizer_vs_tokenizer_json"] = agree
    log(f"probes: {json.dumps(res)[:3000]}")
    rep.set("probes", res)


# ------------------------------------------------------------------------------- sums


def write_sums(folder, skip=("SHA256SUMS",)):
    lines = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "*"), recursive=True)):
        if os.path.isfile(path) and os.path.basename(path) not in skip and ".tmp" not in path:
            lines.append(f"{sha256_file(path)}  ./{os.path.relpath(path, folder)}")
    write_text(os.path.join(folder, "SHA256SUMS"), "\n".join(lines) + "\n")
    log(f"sums: {folder}/SHA256SUMS ({len(lines)} files)")


def step_sums(args, rep):
    write_sums("models")
    write_sums("tests/fixtures")


# ------------------------------------------------------------------------------- main


STEPS = {
    "copy-models": step_copy_models, "sample": step_sample, "tokenizer": step_tokenizer,
    "train": step_train, "references": step_references, "traces": step_traces,
    "probes": step_probes, "sums": step_sums,
}
ALL = ["sample", "tokenizer", "train", "references", "traces", "probes"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("step", choices=list(STEPS) + ["all", "train-one"])
    ap.add_argument("name", nargs="?", help="fixture name (train-one)")
    ap.add_argument("--force", action="store_true", help="redo what exists")
    ap.add_argument("--only", nargs="*", choices=list(FIXTURES), help="train only these fixtures")
    ap.add_argument("--seconds", type=float, default=45.0, help="training wall time per model")
    ap.add_argument("--no-parallel", dest="parallel", action="store_false", help="train one model at a time")
    ap.add_argument("--sample-batch", type=int, default=SAMPLE_BATCH, help="sequences per seed phrase")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--shared-models", default=os.path.join(os.path.dirname(ROOT), "shared", "models"))
    ap.add_argument("--report", default=os.path.join(WORK, "report.json"), help="JSON report path")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    if args.step == "train-one":
        train_one(args.name, args)
        return 0
    rep = Report(args.report)
    steps = ALL if args.step == "all" else [args.step]
    failed = []
    for s in steps:
        t0 = time.time()
        log(f"== {s}")
        try:
            STEPS[s](args, rep)
        except Exception as e:
            import traceback
            traceback.print_exc()
            failed.append(s)
            rep.set(f"error_{s}", repr(e))
        log(f"== {s} done in {time.time() - t0:.1f} s")
    if failed:
        log(f"FAILED steps: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
