#!/usr/bin/env python3
"""Makes the logprobs-dump fixtures of tests/verify/logprobs_jsonl_test.cpp from real replies of
`arbiter serve` (TinyStories-656K on the ref tier), for the chunks of `arbiter trace --chunk 4
--chunks 3 --prefill 4` on models/corpus/stories.txt, each prompt laid out as `trace --endpoint`
sends it: BOS, the 4 context tokens, the chunk's input token and its 4 targets' inputs.

  openai-ids.jsonl   echo + logprobs 5 + return_tokens_as_token_ids: the server's replies as sent
  openai-text.jsonl  the same without return_tokens_as_token_ids (tokens named by text)
  vllm.jsonl         vLLM's prompt_logprobs shape, rebuilt from the server's next-token replies
                     over the whole vocabulary (so every rank is known): per prompt token
                     {"<id>": {logprob, rank, decoded_token}}, the prompt token first, then the
                     top 5; the other fields from the echo reply

usage: make_fixtures.py ARBITER   (run from the repository root; writes next to this script)
"""
import json, os, re, subprocess, sys, time, urllib.request

arbiter = sys.argv[1]
model, corpus = "models/TinyStories-656K", "models/corpus/stories.txt"
out_dir = os.path.dirname(os.path.abspath(__file__))
W, C, P, BOS = 4, 3, 4, 1

ids = [int(x) for x in subprocess.check_output(
    [arbiter, "tokenize", "-m", model, "--no-bos", "--file", corpus], text=True).split()]
srv = subprocess.Popen([arbiter, "serve", "-m", model, "--device", "ref", "--port", "0",
                        "--max-logprobs", "2048"],
                       stderr=subprocess.PIPE, text=True)
try:
    port = None
    for line in srv.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    url = f"http://127.0.0.1:{port}/v1/completions"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
            break
        except Exception:
            time.sleep(0.1)

    def post(body):
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req).read())

    prompts = []
    for c in range(C):
        b = P + c * W  # chunk_begin: max(start, prefill) + c * W
        prompts.append([BOS] + ids[b - P:b + W + 1])
    base = {"model": "TinyStories-656K", "max_tokens": 1, "temperature": 0, "echo": True}
    with open(os.path.join(out_dir, "openai-ids.jsonl"), "w") as f:
        for p in prompts:
            f.write(json.dumps(post({**base, "prompt": p, "logprobs": 5, "return_tokens_as_token_ids": True})) + "\n")
    with open(os.path.join(out_dir, "openai-text.jsonl"), "w") as f:
        for p in prompts:
            f.write(json.dumps(post({**base, "prompt": p, "logprobs": 5})) + "\n")
    with open(os.path.join(out_dir, "vllm.jsonl"), "w") as f:
        for p in prompts:
            r = post({**base, "prompt": p, "logprobs": 5, "return_tokens_as_token_ids": True})
            plp = [None]
            for i in range(1, len(p)):
                # The whole distribution after p[:i] (echo caps a prompt token's list below the
                # vocabulary; a completion's next-token list does not), for the exact rank.
                nxt = post({"model": base["model"], "prompt": p[:i], "max_tokens": 1, "temperature": 0,
                            "logprobs": 2048, "return_tokens_as_token_ids": True})
                dist = nxt["choices"][0]["logprobs"]["top_logprobs"][0]
                top = sorted(((int(k[9:]), v) for k, v in dist.items()), key=lambda e: (-e[1], e[0]))
                rank = [t for t, _ in top].index(p[i]) + 1
                d = {str(p[i]): {"logprob": dict(top)[p[i]], "rank": rank, "decoded_token": f"token_id:{p[i]}"}}
                for j, (t, v) in enumerate(top[:5]):
                    d.setdefault(str(t), {"logprob": v, "rank": j + 1, "decoded_token": f"token_id:{t}"})
                plp.append(d)
            choice = {"index": 0, "text": r["choices"][0]["text"], "logprobs": None,
                      "finish_reason": "length", "stop_reason": None, "prompt_logprobs": plp}
            f.write(json.dumps({"id": r["id"], "object": "text_completion", "created": r["created"],
                                "model": r["model"], "choices": [choice], "usage": r["usage"]}) + "\n")
finally:
    srv.terminate()
    srv.wait()
