#!/usr/bin/env python3
"""hf_bench.py: the HF transformers side of arbiter's speed comparison (issue 7).

Runs a Hugging Face checkpoint directory (e.g. one written by `arbiter synth`) with
PyTorch + transformers on a GPU and prints one JSON object with, per execution mode:

  decode_tok_s      batch 1: generate() of N new tokens (greedy, KV cache, min_new_tokens=N so
                    an EOS cannot stop it early) after a short prompt; tok/s = N / wall time,
                    the time including the short prompt's prefill (about one step).
  prefill_tok_s     one forward of P tokens (default 512) with the logits of the last position
                    alone (logits_to_keep=1), as arbiter's and llama-bench's prefills compute
                    them; tok/s = P / time.
  teacher_forced_positions_s
                    one forward of W tokens (default 256; BOS first when the tokenizer has one,
                    like arbiter's trace shape w256), then log-softmax over the vocabulary in
                    float32, the top-8 and the target log-probabilities copied to the host:
                    what one traced chunk costs. positions/s = W / time.

Modes: "eager" (PyTorch eager execution) and "compile": generate() with a static KV cache,
which makes transformers compile its decode step itself (CUDA graphs included), and the full
forwards through torch.compile(model, mode="reduce-overhead"). Attention is sdpa, weights bf16
unless --dtype says otherwise. Every time is taken between torch.cuda.synchronize() calls;
each figure is the median over --reps repetitions after --warmup untimed ones (which also
absorb compilation). Token ids are seeded random ids: speed does not depend on them.

    python3 tools/hf_bench.py -m /tmp/synth/qwen3-0.6b > hf_bench.json

A measurement that fails (e.g. a torch.compile error) is recorded as {"error": "..."} and the
others still run. Exit code 0 when the JSON was printed, 2 on bad arguments or no GPU.
"""

import argparse
import json
import platform
import statistics
import sys
import time
import traceback


def stat(samples):
    return {
        "median": statistics.median(samples),
        "mean": statistics.fmean(samples),
        "sd": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def timed(torch, fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(torch, fn, reps, warmup, work):
    """work / seconds over reps runs of fn after warmup runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return stat([work / timed(torch, fn) for _ in range(reps)])


def guarded(name, thunk, out):
    try:
        out[name] = thunk()
    except Exception as e:  # one failing measurement must not hide the others
        out[name] = {"error": "%s: %s" % (type(e).__name__, e)}
        traceback.print_exc(file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="HF model directory")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (default sdpa)")
    ap.add_argument("--modes", default="eager,compile", help="comma list of eager, compile")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="decode tokens N")
    ap.add_argument("--prompt-tokens", type=int, default=8, help="prompt length before decode")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="prefill tokens P")
    ap.add_argument("--tf-tokens", type=int, default=256, help="teacher-forced forward width W")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if min(args.n_gen, args.prompt_tokens, args.n_prompt, args.tf_tokens, args.topk, args.reps) < 1 or args.warmup < 0:
        ap.error("sizes and --reps must be >= 1, --warmup >= 0")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("eager", "compile"):
            ap.error("unknown mode %r (expected eager, compile)" % m)

    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("hf_bench.py: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cfg = AutoConfig.from_pretrained(args.model)
    tok = AutoTokenizer.from_pretrained(args.model)
    vocab = int(cfg.vocab_size)
    bos = tok.bos_token_id
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0

    ver = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    dtype_kw = {"dtype": dtype} if ver >= (4, 56) else {"torch_dtype": dtype}

    gen = torch.Generator().manual_seed(args.seed)

    def ids(n, with_bos=False):
        x = torch.randint(0, vocab, (1, n), generator=gen)
        if with_bos and bos is not None:
            x = torch.cat([torch.tensor([[bos]]), x], dim=1)
        return x.to(dev)

    prompt = ids(args.prompt_tokens)
    prefill_ids = ids(args.n_prompt)
    tf_ids = ids(args.tf_tokens + 1, with_bos=True)  # inputs + one more token for the last target
    tf_in, tf_tgt = tf_ids[:, :-1], tf_ids[:, 1:]

    result = {
        "tool": "hf_bench",
        "model": args.model,
        "arch": getattr(cfg, "model_type", "?"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
        "dtype": args.dtype,
        "attn_implementation": args.attn,
        "params": {"n_gen": args.n_gen, "prompt_tokens": args.prompt_tokens, "n_prompt": args.n_prompt,
                   "tf_tokens": args.tf_tokens, "topk": args.topk, "reps": args.reps, "warmup": args.warmup},
        "modes": {},
    }

    for mode in modes:
        out = {}
        result["modes"][mode] = out
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation=args.attn, **dtype_kw)
        model.to(dev).eval()
        gen_kw = dict(max_new_tokens=args.n_gen, min_new_tokens=args.n_gen, do_sample=False, pad_token_id=eos)
        fwd = model
        if mode == "compile":
            # Decode: generate() with a static cache compiles its own decode step
            # (transformers' automatic compilation, CUDA graphs included). Compiling
            # model.forward by hand as well breaks that ("output of CUDAGraphs overwritten").
            gen_kw["cache_implementation"] = "static"
            # Full forwards: a separately compiled module, CUDA graphs on.
            fwd = torch.compile(model, mode="reduce-overhead", dynamic=False)
        torch.cuda.reset_peak_memory_stats(dev)
        attn_mask = torch.ones_like(prompt)

        def step_begin():
            if mode == "compile":
                torch.compiler.cudagraph_mark_step_begin()

        with torch.inference_mode():
            def decode():
                model.generate(prompt, attention_mask=attn_mask, **gen_kw)

            def prefill():
                step_begin()
                fwd(input_ids=prefill_ids, use_cache=False, logits_to_keep=1)

            def teacher_forced():
                step_begin()
                logits = fwd(input_ids=tf_in, use_cache=False).logits  # [1, W(+1), V]
                lp = torch.log_softmax(logits[0, -args.tf_tokens:].float(), dim=-1)
                top = torch.topk(lp, args.topk, dim=-1)
                tgt = lp.gather(1, tf_tgt[0, -args.tf_tokens:].unsqueeze(1))
                # a trace writer needs them on the host
                top.values.cpu(), top.indices.cpu(), tgt.cpu()

            guarded("decode_tok_s", lambda: measure(torch, decode, args.reps, args.warmup, args.n_gen), out)
            guarded("prefill_tok_s", lambda: measure(torch, prefill, args.reps, args.warmup, args.n_prompt), out)
            guarded("teacher_forced_positions_s",
                    lambda: measure(torch, teacher_forced, args.reps, args.warmup, args.tf_tokens), out)
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
        del model
        torch.cuda.empty_cache()

    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
