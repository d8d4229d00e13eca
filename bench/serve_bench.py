#!/usr/bin/env python3
"""Serving benchmark: `zaya serve` under N concurrent streaming clients against transformers' `generate` with a
static batch of the same size, on the same model, cores and token counts; and the KV-cache capacity of CCA against
MHA at the same KV memory.

For each model config (random weights from `zaya init`; a byte-level tokenizer trained here, since only token ids
are sent):
  - zaya: `zaya serve --max-batch C`, C client threads each sending requests back to back (prompt of P random ids,
    max_tokens O, ignore_eos, greedy, stream). Reports generated tokens/s over the whole run, p50/p99 time to first
    token and inter-token latency as the clients see them.
  - transformers: ZayaForCausalLM (the same weights, fp32 or bf16 as zaya's --dtype), `generate` on a batch of C prompts of P ids with
    min_new_tokens = max_new_tokens = O, greedy, use_cache: tokens/s = C*O / time (best of the runs).
  - capacity: `zaya serve --kv-memory M --max-batch 512` for the demo model's CCA and its MHA twin (the attention
    ablation's "mha" variant: 4 heads of 32, q/k/v/o hidden x hidden), flooded with requests; the peak number running
    at once (/metrics) is the concurrency that fits M.

Usage: python3 bench/serve_bench.py [--configs configs/demo-model.json configs/bench-medium.json]
           [--concurrency 32] [--requests-per-client 2] [--prompt 64] [--output 128] [--threads 2]
           [--kv-memory 16M] [--dtypes f32 bf16] [--json out.json]
Prints a markdown table (and JSON with --json). Timings are medians/percentiles of one run; say the CPU."""
import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZAYA = os.environ.get("ZAYA_BIN", os.path.join(ROOT, "build", "zaya"))


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, **kw)


def make_model(cfg_path, work, name, overrides=None):
    cfg = json.load(open(cfg_path))
    cfg.update(overrides or {})
    p = os.path.join(work, name + ".json")
    json.dump(cfg, open(p, "w"))
    mdir = os.path.join(work, name)
    sh(ZAYA, "init", "--config", p, "--out", mdir, "--seed", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=min(cfg["vocab_size"], 1000), special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog 0123456789"] * 50, tr)
    tok.save(os.path.join(mdir, "tokenizer.json"))
    return mdir, cfg


class Server:
    def __init__(self, mdir, threads, *extra):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.p = subprocess.Popen([ZAYA, "serve", "--model", mdir, "--port", "0", *map(str, extra)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.p.stdout.readline()
        m = re.search(r":(\d+)\s*$", line)
        if not m:
            raise RuntimeError(f"zaya serve did not start: {line} {self.p.stderr.read()}")
        self.port = int(m.group(1))

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
        c.close()
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in body.splitlines() if ln and ln[0] != "#")}

    def stop(self):
        self.p.terminate()
        self.p.wait(60)


def stream_request(port, body):
    """One streamed completion: (time to first token, inter-token gaps, tokens)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:200]}")
    ttft, gaps, last, n = None, [], None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            n = ev["usage"]["completion_tokens"]
        if not ev["choices"] or ev["choices"][0].get("logprobs") is None:
            continue
        now = time.perf_counter()
        k = len(ev["choices"][0]["logprobs"]["tokens"])  # tokens in this chunk: one per step
        if ttft is None:
            ttft = now - t0
        elif k:
            gaps.append((now - last) / k)
        last = now
    c.close()
    return ttft, gaps, n


def run_zaya(mdir, cfg, a, dtype):
    srv = Server(mdir, a.threads, "--max-batch", a.concurrency, "--max-context", a.prompt + a.output + 8,
                 "--prefill-chunk", a.prefill_chunk, "--dtype", dtype, "--threads", a.threads)
    import random
    rnd = random.Random(0)
    V = min(cfg["vocab_size"], 1000)
    results, errors = [], []

    def client(k):
        for i in range(a.requests_per_client):
            body = {"model": os.path.basename(mdir), "prompt": [rnd.randrange(3, V) for _ in range(a.prompt)],
                    "max_tokens": a.output, "temperature": 0, "ignore_eos": True, "stream": True, "logprobs": 0,
                    "stream_options": {"include_usage": True}}
            try:
                results.append(stream_request(srv.port, body))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
    try:
        stream_request(srv.port, {"model": os.path.basename(mdir), "prompt": [5] * 8, "max_tokens": 4,
                                  "ignore_eos": True, "stream": True, "logprobs": 0})  # warm-up
        threads = [threading.Thread(target=client, args=(k,)) for k in range(a.concurrency)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        mt = srv.metrics()
    finally:
        srv.stop()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    toks = sum(r[2] for r in results)
    ttft = sorted(r[0] for r in results)
    itl = sorted(g for r in results for g in r[1])
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"tokens_per_s": toks / wall, "requests": len(results), "tokens": toks, "wall_s": wall,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "itl_p50_s": pct(itl, 0.5),
            "itl_p99_s": pct(itl, 0.99), "mean_batch": mt["zaya_step_batch_size_sum"] / mt["zaya_step_batch_size_count"]}


def run_transformers(mdir, a, dtype):
    import torch
    from transformers import ZayaForCausalLM
    torch.set_num_threads(a.threads)
    model = ZayaForCausalLM.from_pretrained(mdir, dtype=torch.float32 if dtype == "f32" else torch.bfloat16).eval()
    V = min(model.config.vocab_size, 1000)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, V, (a.concurrency, a.prompt), generator=g)
    best = None
    with torch.no_grad():
        model.generate(ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]), max_new_tokens=2, min_new_tokens=2,
                       do_sample=False, pad_token_id=0)
        for _ in range(a.hf_runs):
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.output,
                                 min_new_tokens=a.output, do_sample=False, pad_token_id=0, use_cache=True)
            dt = time.perf_counter() - t0
            assert out.shape[1] == a.prompt + a.output
            best = dt if best is None else min(best, dt)
    return {"tokens_per_s": a.concurrency * a.output / best, "wall_s": best}


def capacity(mdir, a, context):
    """Peak requests running at once under --kv-memory, each needing `context` tokens of cache."""
    srv = Server(mdir, a.threads, "--threads", a.threads, "--max-batch", 512, "--max-context", context, "--kv-memory", a.kv_memory,
                 "--max-queue", 4096, "--block-tokens", 16)
    info = ""
    for _ in range(6):  # the start-up lines on stderr; one says the bytes per token
        info += srv.p.stderr.readline()
        if "bytes per token" in info:
            break
    peak = [0]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            peak[0] = max(peak[0], int(srv.metrics()["zaya_requests_running"]))
            time.sleep(0.05)
    n_req = 600
    body = {"model": os.path.basename(mdir), "prompt": [5] * (context - 8), "max_tokens": 8, "ignore_eos": True,
            "temperature": 0}
    sem = threading.Semaphore(n_req)

    def one():
        with sem:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            c.getresponse().read()
            c.close()
    p = threading.Thread(target=poll)
    p.start()
    ts = [threading.Thread(target=one) for _ in range(n_req)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stop.set()
    p.join()
    srv.stop()
    per_tok = int(re.search(r"\((\d+) bytes per token", info).group(1))
    return {"peak_running": peak[0], "kv_bytes_per_token": per_tok}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=["configs/demo-model.json", "configs/bench-medium.json"])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--prefill-chunk", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hf-runs", type=int, default=2)
    ap.add_argument("--kv-memory", default="16M")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--dtypes", nargs="+", default=["f32", "bf16"], help="weights: zaya --dtype, torch dtype")
    ap.add_argument("--no-capacity", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="zaya-serve-bench-")
    out = {"concurrency": a.concurrency, "prompt": a.prompt, "output": a.output, "threads": a.threads, "models": {}}
    try:
        for cfg_path in a.configs:
            name = os.path.splitext(os.path.basename(cfg_path))[0]
            mdir, cfg = make_model(os.path.join(ROOT, cfg_path), work, name)
            r = {}
            for dt in a.dtypes:
                r["zaya " + dt] = run_zaya(mdir, cfg, a, dt)
                print(f"[{name}] zaya {dt} {r['zaya ' + dt]}", file=sys.stderr, flush=True)
                if not a.no_hf:
                    r["transformers " + dt] = run_transformers(mdir, a, dt)
                    print(f"[{name}] transformers {dt} {r['transformers ' + dt]}", file=sys.stderr, flush=True)
            out["models"][name] = r
        if not a.no_capacity:
            ctx = a.prompt + a.output
            demo = os.path.join(ROOT, "configs/demo-model.json")
            cca, _ = make_model(demo, work, "cap-cca")
            mha, _ = make_model(demo, work, "cap-mha", {"zaya_attention": "mha", "num_attention_heads": 4,
                                                        "num_key_value_heads": 4})
            out["capacity"] = {"kv_memory": a.kv_memory, "context": ctx, "cca": capacity(cca, a, ctx),
                               "mha": capacity(mha, a, ctx)}
            print(f"capacity {out['capacity']}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{a.concurrency} concurrent requests, prompt {a.prompt} + output {a.output} tokens, "
          f"{a.threads} threads\n")
    print("| model | weights | server | tokens/s | vs transformers | TTFT p50 / p99 | inter-token p50 / p99 | mean batch |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in out["models"].items():
        for dt in a.dtypes:
            z, h = r["zaya " + dt], r.get("transformers " + dt)
            ratio = f"{z['tokens_per_s'] / h['tokens_per_s']:.1f}x" if h else "-"
            print(f"| {name} | {dt} | zaya serve | {z['tokens_per_s']:.0f} | {ratio} | {z['ttft_p50_s'] * 1e3:.0f} / "
                  f"{z['ttft_p99_s'] * 1e3:.0f} ms | {z['itl_p50_s'] * 1e3:.1f} / {z['itl_p99_s'] * 1e3:.1f} ms | "
                  f"{z['mean_batch']:.1f} |")
            if h:
                print(f"| {name} | {dt} | transformers generate, static batch {a.concurrency} | {h['tokens_per_s']:.0f} | "
                      f"1.0x | - | - | {a.concurrency} |")
    if "capacity" in out:
        c = out["capacity"]
        print(f"\nKV memory {c['kv_memory']}, {c['context']}-token requests:\n")
        print("| attention | KV bytes per token | requests running at once |")
        print("|---|---|---|")
        for k in ("cca", "mha"):
            print(f"| {k.upper()} | {c[k]['kv_bytes_per_token']} | {c[k]['peak_running']} |")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
