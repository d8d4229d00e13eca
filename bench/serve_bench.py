#!/usr/bin/env python3
"""Serving benchmark: `zaya serve` with continuous batching against transformers' `generate` with static batches,
on the same model, cores, weights and requests; and the KV-cache capacity of CCA against MHA at one KV memory.

The workload: R requests whose prompt and output lengths mix (by default every combination of 16/64/256-token
prompts and 16/64/256-token outputs, equally often, shuffled; random prompt ids; the output length is forced with
ignore_eos / min_new_tokens), C of them in flight at a time. For each model config (random weights from
`zaya init`; a byte-level tokenizer trained here, since only token ids are sent):
  - zaya: `zaya serve --max-batch C`, C closed-loop client threads streaming (greedy); generated tokens/s over the
    run, and the clients' p50/p99 time to first token and gap between streamed chunks (one per decoding step).
  - transformers: ZayaForCausalLM (fp32 or bf16, as zaya's --dtype), the same requests in arrival order, C per
    `generate` call (left-padded, decoding until the batch's longest output is done): requested tokens / time.
  - capacity: `zaya serve --kv-memory M --max-batch 512` for the demo model's CCA and its MHA twin (the attention
    ablation's "mha" variant: 4 heads of 32, q/k/v/o hidden x hidden), each with every --dtypes weights (and so KV
    cache: --kv-dtype auto), flooded with 192-token requests; the peak number running at once (/metrics) is the
    concurrency that fits M.

  - --rsa: Markovian RSA (the "rsa" extension of /v1/chat/completions: N traces, K tails of tau tokens, T rounds,
    each round one batch in the engine) against the same generations sent as sequential single chat requests to the
    same server (the client doing RSA itself: the same template, configs/rsa_aggregate.jinja, tails cut through
    /tokenize and /detokenize); max_tokens per trace forced with ignore_eos; generated tokens/s of each, alternating.

With --shared-prefix N (default configs: bench-medium only) it measures prefix caching instead: R requests whose
prompts are one N-token system prompt followed by a --suffix-token part of their own (random ids), C in flight, each
generating --outputs[0] tokens, sent to `zaya serve` with its prefix cache and with --no-prefix-cache, the two
servers alternating for --rounds; before the R requests one request with the system prompt primes the cache (and is
sent to both servers alike). Per server: the prompt tokens computed (/metrics' zaya_prefill_tokens_total over the R
requests), the tokens taken from the cache, and the median and p99 time to first token; the tables give each
server's median round and the ratios.

Usage: python3 bench/serve_bench.py [--configs configs/demo-model.json configs/bench-medium.json]
           [--concurrency 32] [--requests 96] [--prompts 16 64 256] [--outputs 16 64 256] [--threads 2]
           [--kv-memory 16M] [--dtypes f32 bf16] [--rounds N] [--json out.json] [--device cuda [--gpu-graphs]]
       python3 bench/serve_bench.py --rsa [--population 8 --subset 4 --rsa-rounds 3 --tail 64 --trace-tokens 256]
       python3 bench/serve_bench.py --shared-prefix 1000 --requests 32 [--suffix 24] [--outputs 16]
           [--dtypes bf16] [--rounds 3]
Prints markdown tables (and JSON with --json). One run; say which CPU."""
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


def make_model(cfg_path, work, name, overrides=None, texts=()):
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
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog 0123456789"] * 50 + list(texts) * 50, tr)
    tok.save(os.path.join(mdir, "tokenizer.json"))
    return mdir, cfg


class Server:
    def __init__(self, mdir, threads, *extra, env_extra=None):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(env_extra or {}))
        # the server's log goes to a file (a pipe nobody reads would stall it once full), shown if it fails
        self.log = tempfile.NamedTemporaryFile("w+", prefix="zaya_serve_", suffix=".log", delete=False)
        self.p = subprocess.Popen([ZAYA, "serve", "--model", mdir, "--port", "0", *map(str, extra)],
                                  stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        line = self.p.stdout.readline()
        m = re.search(r":(\d+)\s*$", line)
        if not m:
            raise RuntimeError(f"zaya serve did not start: {line} {self.log_text()}")
        self.port = int(m.group(1))

    def log_text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def metrics(self):
        if self.p.poll() is not None:
            raise RuntimeError(f"zaya serve exited with {self.p.returncode}: {self.log_text()[-2000:]}")
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
        c.close()
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in body.splitlines() if ln and ln[0] != "#")}

    def stop(self):
        self.p.terminate()
        self.p.wait(60)
        os.unlink(self.log.name)


def stream_request(port, body):
    """One streamed completion: (time to first chunk, gaps between chunks, tokens). Chunks are not parsed except the
    usage one: each carries the text of one decoding step (rarely two, when a character spans tokens)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:200]}")
    ttft, gaps, last, n = None, [], None, 0
    for raw in r:
        if not raw.startswith(b"data: {"):
            continue
        if b'"usage"' in raw:
            n = json.loads(raw[6:])["usage"]["completion_tokens"]
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t0
        else:
            gaps.append(now - last)
        last = now
    c.close()
    return ttft, gaps, n


def workload(a, V, seed=0):
    """The requests, in arrival order: prompt and output lengths cycling through the mix, random prompt ids."""
    import random
    rnd = random.Random(seed)
    combos = [(p, o) for p in a.prompts for o in a.outputs]
    reqs = []
    for i in range(a.requests):
        p, o = combos[i % len(combos)]
        reqs.append(([rnd.randrange(3, V) for _ in range(p)], o))
    rnd.shuffle(reqs)
    return reqs


def greedy_body(mdir, prompt, max_tokens):
    """A streamed greedy completion of exactly max_tokens tokens, with the usage chunk."""
    return {"model": os.path.basename(mdir), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def closed_loop(port, bodies, concurrency):
    """Sends the bodies in order from `concurrency` client threads, each sending its next request when its last one
    is done: (stream_request's results in the order they ended, wall seconds). Raises if any failed."""
    results, errors, lock = [], [], threading.Lock()
    queue = list(reversed(bodies))

    def client():
        while True:
            with lock:
                if not queue:
                    return
                body = queue.pop()
            try:
                r = stream_request(port, body)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    return results, time.perf_counter() - t0


def run_zaya(mdir, cfg, a, dtype, graphs=False):
    """graphs: ZAYA_GPU_GRAPHS=1 (with --device cuda: the server's steps replayed as CUDA graphs)."""
    srv = Server(mdir, a.threads, "--max-batch", a.concurrency, "--max-context", max(a.prompts) + max(a.outputs) + 8,
                 "--prefill-chunk", a.prefill_chunk, "--dtype", dtype, "--threads", a.threads, "--device", a.device,
                 env_extra={"ZAYA_GPU_GRAPHS": "1"} if graphs else None)
    reqs = workload(a, min(cfg["vocab_size"], 1000))
    try:
        stream_request(srv.port, {"model": os.path.basename(mdir), "prompt": [5] * 8, "max_tokens": 4,
                                  "ignore_eos": True, "stream": True})  # warm-up
        results, wall = closed_loop(srv.port, [greedy_body(mdir, p, o) for p, o in reqs], a.concurrency)
        mt = srv.metrics()
    finally:
        srv.stop()
    toks = sum(r[2] for r in results)
    assert toks == sum(o for _, o in reqs), (toks, sum(o for _, o in reqs))
    ttft = sorted(r[0] for r in results)
    itl = sorted(g for r in results for g in r[1])
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"tokens_per_s": toks / wall, "requests": len(results), "tokens": toks, "wall_s": wall,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "itl_p50_s": pct(itl, 0.5),
            "itl_p99_s": pct(itl, 0.99), "mean_batch": mt["zaya_step_batch_size_sum"] / mt["zaya_step_batch_size_count"],
            "steps": mt["zaya_steps_total"], "step_s_mean": mt["zaya_step_seconds_sum"] / mt["zaya_steps_total"],
            "in_steps": mt["zaya_step_seconds_sum"] / wall}


def run_shared_prefix(mdir, cfg, a, dtype, cache, seed=0):
    """R requests sharing an N-token system prompt (after one that primes the cache), C in flight: prompt tokens
    computed, tokens from the cache, time to first token."""
    import random
    rnd = random.Random(seed)
    V = min(cfg["vocab_size"], 1000)
    system = [rnd.randrange(3, V) for _ in range(a.shared_prefix)]
    prompts = [system + [rnd.randrange(3, V) for _ in range(a.suffix)] for _ in range(a.requests + 1)]
    out_tokens = a.outputs[0]
    srv = Server(mdir, a.threads, "--max-batch", a.concurrency, "--max-context", a.shared_prefix + a.suffix +
                 out_tokens + 8, "--prefill-chunk", a.prefill_chunk, "--dtype", dtype, "--threads", a.threads,
                 *([] if cache else ["--no-prefix-cache"]))
    try:
        stream_request(srv.port, greedy_body(mdir, prompts[0], out_tokens))  # primes the cache (and warms up either)
        m0 = srv.metrics()
        results, wall = closed_loop(srv.port, [greedy_body(mdir, p, out_tokens) for p in prompts[1:]], a.concurrency)
        m1 = srv.metrics()
    finally:
        srv.stop()
    ttft = sorted(r[0] for r in results)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)  # noqa: E731
    return {"cache": cache, "requests": len(results), "prompt_tokens": d("zaya_prompt_tokens_total"),
            "prefill_tokens": d("zaya_prefill_tokens_total"), "hit_tokens": d("zaya_prefix_cache_hit_tokens_total"),
            "ttft_p50_s": statistics.median(ttft), "ttft_p99_s": pct(ttft, 0.99), "wall_s": wall}


def shared_prefix_main(a, work):
    """The prefix-caching benchmark (--shared-prefix): both servers side by side, alternating, medians."""
    out = {"shared_prefix": a.shared_prefix, "suffix": a.suffix, "requests": a.requests,
           "concurrency": a.concurrency, "output": a.outputs[0], "threads": a.threads, "models": {}}
    for cfg_path in a.configs:
        name = os.path.splitext(os.path.basename(cfg_path))[0]
        mdir, cfg = make_model(os.path.join(ROOT, cfg_path), work, name)
        for dt in a.dtypes:
            runs = {True: [], False: []}
            for k in range(a.rounds):
                for cache in (True, False):
                    r = run_shared_prefix(mdir, cfg, a, dt, cache, seed=k)
                    runs[cache].append(r)
                    print(f"[{name} {dt}] {'cache' if cache else 'no cache'} round {k + 1} {r}", file=sys.stderr,
                          flush=True)
            med = {c: sorted(rs, key=lambda x: x["ttft_p50_s"])[(len(rs) - 1) // 2] for c, rs in runs.items()}
            out["models"][f"{name} {dt}"] = {"cache": med[True], "no_cache": med[False],
                                             "rounds": {str(c): rs for c, rs in runs.items()}}
    print(f"\n{a.requests} requests sharing a {a.shared_prefix}-token system prompt, each with {a.suffix} tokens of "
          f"its own, {a.concurrency} in flight, {a.outputs[0]} tokens out, {a.threads} threads; one request primes the "
          f"cache first; the median of {a.rounds} alternating rounds (by median TTFT)\n")
    print("| model | server | prompt tokens computed | from the cache | TTFT median / p99 | computed, ratio | "
          "TTFT median, ratio |")
    print("|---|---|---|---|---|---|---|")
    for key, r in out["models"].items():
        c, n = r["cache"], r["no_cache"]
        for label, x in (("prefix cache", c), ("--no-prefix-cache", n)):
            ratio = x is c
            print(f"| {key} | {label} | {x['prefill_tokens']:.0f} | {x['hit_tokens']:.0f} | "
                  f"{x['ttft_p50_s'] * 1e3:.0f} / {x['ttft_p99_s'] * 1e3:.0f} ms | "
                  + (f"{n['prefill_tokens'] / max(c['prefill_tokens'], 1):.1f}x fewer | "
                     f"{n['ttft_p50_s'] / c['ttft_p50_s']:.1f}x lower |" if ratio else "1.0x | 1.0x |"))
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


def run_transformers(mdir, a, dtype):
    """A static-batching server: the same requests in arrival order, C at a time; each batch left-pads its prompts
    and decodes until its longest request is done (the others wait, padded); useful tokens are the ones asked for."""
    import torch
    from transformers import ZayaForCausalLM
    torch.set_num_threads(a.threads)
    dev = a.device
    model = ZayaForCausalLM.from_pretrained(mdir, dtype=torch.float32 if dtype == "f32" else torch.bfloat16)
    model = model.to(dev).eval()
    reqs = workload(a, min(model.config.vocab_size, 1000))
    with torch.no_grad():
        w = torch.full((2, 8), 5, device=dev)
        model.generate(w, attention_mask=torch.ones_like(w), max_new_tokens=2, min_new_tokens=2, do_sample=False,
                       pad_token_id=0)  # warm-up
        t0 = time.perf_counter()
        for i in range(0, len(reqs), a.concurrency):
            batch = reqs[i:i + a.concurrency]
            P, O = max(len(p) for p, _ in batch), max(o for _, o in batch)
            ids = torch.zeros((len(batch), P), dtype=torch.long)
            mask = torch.zeros((len(batch), P), dtype=torch.long)
            for k, (p, _) in enumerate(batch):
                ids[k, P - len(p):] = torch.tensor(p)
                mask[k, P - len(p):] = 1
            out = model.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=O, min_new_tokens=O,
                                 do_sample=False, pad_token_id=0, use_cache=True)
            assert out.shape[1] == P + O
        if dev == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    return {"tokens_per_s": sum(o for _, o in reqs) / wall, "wall_s": wall}


def capacity(mdir, a, context, dtype):
    """Peak requests running at once under --kv-memory, each needing `context` tokens of cache (k and v in the
    weights' dtype: zaya serve's --kv-dtype auto)."""
    # (without the prefix cache, whose kept CCA states would share --kv-memory: this measures the KV layouts)
    srv = Server(mdir, a.threads, "--threads", a.threads, "--max-batch", 512, "--max-context", context, "--kv-memory", a.kv_memory,
                 "--max-queue", 4096, "--block-tokens", 16, "--dtype", dtype, "--no-prefix-cache")
    info = srv.log_text()
    for _ in range(100):  # the start-up lines in the server's log; one says the bytes per token
        if "bytes per token" in info:
            break
        time.sleep(0.05)
        info = srv.log_text()
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
    per_tok = int(re.search(r"(\d+) bytes per token", info).group(1))
    return {"peak_running": peak[0], "kv_bytes_per_token": per_tok}


RSA_PROBLEM = ("A train leaves at 9:40 and arrives at 13:05; a second train covers the same 290 km in 40 minutes "
               "less. What is the second train's average speed in km/h? Reason step by step.")
CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status}: {data[:300]}")
    return json.loads(data)


def rsa_sequential(port, model, a, template, seed):
    """The same RSA as the extension, as one client sending one chat request at a time: generated tokens, wall s."""
    import random
    rnd = random.Random(seed)
    chat = lambda text, s: post(port, "/v1/chat/completions", {  # noqa: E731
        "model": model, "messages": [{"role": "user", "content": text}], "max_tokens": a.trace_tokens,
        "ignore_eos": True, "temperature": 1.0, "seed": s})
    t0, tokens, last = time.perf_counter(), 0, []
    for r in range(a.rsa_rounds):
        texts = []
        for i in range(a.population):
            if r == 0:
                prompt = RSA_PROBLEM
            else:
                tails = []
                for j in rnd.sample(range(a.population), a.subset):
                    ids = post(port, "/tokenize", {"prompt": last[j], "add_special_tokens": False})["tokens"]
                    tails.append(post(port, "/detokenize", {"tokens": ids[-a.tail:]})["prompt"])
                prompt = template.render(problem=RSA_PROBLEM, candidates=tails, round=r + 1, population=a.population)
            out = chat(prompt, seed + r * a.population + i)
            texts.append(out["choices"][0]["message"]["content"])
            tokens += out["usage"]["completion_tokens"]
        last = texts
    return tokens, time.perf_counter() - t0


def run_rsa(a):
    """--rsa: the extension against sequential single requests, alternating, on one server per model."""
    import jinja2
    src = open(os.path.join(ROOT, "configs", "rsa_aggregate.jinja")).read()
    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).from_string(src)
    work = tempfile.mkdtemp(prefix="zaya-rsa-bench-")
    out = {"population": a.population, "subset": a.subset, "rounds": a.rsa_rounds, "tail": a.tail,
           "trace_tokens": a.trace_tokens, "threads": a.threads, "models": {}}
    try:
        for cfg_path in a.configs:
            name = os.path.splitext(os.path.basename(cfg_path))[0]
            mdir, cfg = make_model(os.path.join(ROOT, cfg_path), work, name, texts=[src, RSA_PROBLEM])
            tpl = os.path.join(work, "chatml.jinja")
            open(tpl, "w").write(CHATML)
            ctx = min(cfg["max_position_embeddings"], 4096)
            for dt in a.dtypes:
                srv = Server(mdir, a.threads, "--max-batch", a.population, "--max-context", ctx, "--dtype", dt,
                             "--threads", a.threads, "--chat-template", tpl)
                model = os.path.basename(mdir)
                runs = {"rsa": [], "sequential": []}
                try:
                    post(srv.port, "/v1/chat/completions", {"model": model, "max_tokens": 4, "messages": [
                        {"role": "user", "content": "hi"}]})  # warm-up
                    for k in range(a.rounds):
                        t0 = time.perf_counter()
                        r = post(srv.port, "/v1/chat/completions", {
                            "model": model, "messages": [{"role": "user", "content": RSA_PROBLEM}],
                            "max_tokens": a.trace_tokens, "ignore_eos": True, "temperature": 1.0, "seed": 100 + k,
                            "rsa": {"population": a.population, "subset": a.subset, "rounds": a.rsa_rounds,
                                    "tail": a.tail}})
                        wall = time.perf_counter() - t0
                        toks = r["usage"]["completion_tokens"]
                        runs["rsa"].append({"tokens": toks, "wall_s": wall, "tokens_per_s": toks / wall,
                                            "round_reports": r["rsa"]["round_reports"]})
                        toks, wall = rsa_sequential(srv.port, model, a, template, 100 + k)
                        runs["sequential"].append({"tokens": toks, "wall_s": wall, "tokens_per_s": toks / wall})
                        print(f"[{name} {dt}] round {k + 1}: rsa {runs['rsa'][-1]['tokens_per_s']:.0f} tok/s, "
                              f"sequential {runs['sequential'][-1]['tokens_per_s']:.0f} tok/s", file=sys.stderr,
                              flush=True)
                finally:
                    srv.stop()
                med = lambda rs: sorted(rs, key=lambda x: x["tokens_per_s"])[(len(rs) - 1) // 2]  # noqa: E731
                out["models"][f"{name} {dt}"] = {
                    "rsa": med(runs["rsa"]), "sequential": med(runs["sequential"]),
                    "ratio_rounds": [x["tokens_per_s"] / y["tokens_per_s"]
                                     for x, y in zip(runs["rsa"], runs["sequential"])]}
                if a.json:
                    json.dump(out, open(a.json, "w"), indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gens = a.population * a.rsa_rounds
    print(f"\nMarkovian RSA N={a.population} K={a.subset} T={a.rsa_rounds} tail={a.tail} ({gens} generations of "
          f"{a.trace_tokens} tokens, ignore_eos, temperature 1) vs the same {gens} as sequential single chat requests, "
          f"one server, {a.threads} threads" + (f"; medians of {a.rounds} alternating runs" if a.rounds > 1 else "")
          + "\n")
    print("| model | weights | RSA tokens/s | sequential tokens/s | ratio | RSA per round (s) |")
    print("|---|---|---|---|---|---|")
    for key, m in out["models"].items():
        name, dt = key.rsplit(" ", 1)
        rs, sq = m["rsa"], m["sequential"]
        ratios = ", ".join(f"{x:.1f}" for x in m["ratio_rounds"])
        per_round = " / ".join(f"{x['seconds']:.1f}" for x in rs["round_reports"])
        print(f"| {name} | {dt} | {rs['tokens_per_s']:.0f} | {sq['tokens_per_s']:.0f} | "
              f"{rs['tokens_per_s'] / sq['tokens_per_s']:.1f}x (runs {ratios}) | {per_round} |")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=["configs/demo-model.json", "configs/bench-medium.json"])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--prompts", type=int, nargs="+", default=[16, 64, 256], help="prompt lengths, mixed")
    ap.add_argument("--outputs", type=int, nargs="+", default=[16, 64, 256], help="output lengths, mixed")
    ap.add_argument("--prefill-chunk", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="zaya serve --device and transformers' device (cuda: one GPU for both, one at a time)")
    ap.add_argument("--gpu-graphs", action="store_true",
                    help="with --device cuda: also zaya serve with ZAYA_GPU_GRAPHS=1 (steps replayed as CUDA graphs)")
    ap.add_argument("--kv-memory", default="16M")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--dtypes", nargs="+", default=["f32", "bf16"], help="weights: zaya --dtype, torch dtype")
    ap.add_argument("--no-capacity", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each server, alternating zaya and transformers; the tables show medians")
    ap.add_argument("--json")
    ap.add_argument("--rsa", action="store_true", help="Markovian RSA against sequential single requests")
    ap.add_argument("--population", type=int, default=8, help="--rsa: N")
    ap.add_argument("--subset", type=int, default=4, help="--rsa: K")
    ap.add_argument("--rsa-rounds", type=int, default=3, help="--rsa: T")
    ap.add_argument("--tail", type=int, default=64, help="--rsa: tokens of each trace carried")
    ap.add_argument("--trace-tokens", type=int, default=256, help="--rsa: tokens per trace (ignore_eos)")
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="measure prefix caching: requests sharing a system prompt of this many tokens")
    ap.add_argument("--suffix", type=int, default=24, help="with --shared-prefix: each request's own tokens")
    a = ap.parse_args()
    if a.gpu_graphs and a.device != "cuda":
        ap.error("--gpu-graphs needs --device cuda")
    if a.rsa:
        return run_rsa(a)
    work = tempfile.mkdtemp(prefix="zaya-serve-bench-")
    if a.shared_prefix:
        if "--configs" not in sys.argv:
            a.configs = ["configs/bench-medium.json"]
        if "--outputs" not in sys.argv:
            a.outputs = [16]
        try:
            shared_prefix_main(a, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    out = {"concurrency": a.concurrency, "requests": a.requests, "prompts": a.prompts, "outputs": a.outputs,
           "threads": a.threads, "models": {}}
    try:
        for cfg_path in a.configs:
            name = os.path.splitext(os.path.basename(cfg_path))[0]
            mdir, cfg = make_model(os.path.join(ROOT, cfg_path), work, name)
            runs = {}
            for dt in a.dtypes:
                for k in range(a.rounds):  # alternating, so a slow spell of a shared machine hits both sides
                    z = run_zaya(mdir, cfg, a, dt)
                    runs.setdefault("zaya " + dt, []).append(z)
                    print(f"[{name}] zaya {dt} round {k + 1} {z}", file=sys.stderr, flush=True)
                    if a.gpu_graphs:
                        g = run_zaya(mdir, cfg, a, dt, graphs=True)
                        runs.setdefault("zaya graphs " + dt, []).append(g)
                        print(f"[{name}] zaya {dt} CUDA graphs round {k + 1} {g}", file=sys.stderr, flush=True)
                    if not a.no_hf:
                        h = run_transformers(mdir, a, dt)
                        runs.setdefault("transformers " + dt, []).append(h)
                        print(f"[{name}] transformers {dt} round {k + 1} {h}", file=sys.stderr, flush=True)
            # per server: the run with the median throughput (its latencies with it), and every round's throughput
            r = {}
            for key, rs in runs.items():
                med = sorted(rs, key=lambda x: x["tokens_per_s"])[(len(rs) - 1) // 2]
                r[key] = dict(med, rounds=[x["tokens_per_s"] for x in rs])
            for dt in a.dtypes:  # the ratio of medians, and each round's own ratio
                z, h = r["zaya " + dt], r.get("transformers " + dt)
                if h:
                    z["ratio_rounds"] = [x / y for x, y in zip(z["rounds"], h["rounds"])]
            out["models"][name] = r
            if a.json:  # as it goes: a later failure loses nothing measured
                json.dump(out, open(a.json, "w"), indent=1)
        if not a.no_capacity:
            ctx = 192
            demo = os.path.join(ROOT, "configs/demo-model.json")
            cca, _ = make_model(demo, work, "cap-cca")
            mha, _ = make_model(demo, work, "cap-mha", {"zaya_attention": "mha", "num_attention_heads": 4,
                                                        "num_key_value_heads": 4})
            out["capacity"] = {"kv_memory": a.kv_memory, "context": ctx}
            for dt in a.dtypes:
                out["capacity"][dt] = {"cca": capacity(cca, a, ctx, dt), "mha": capacity(mha, a, ctx, dt)}
                print(f"capacity {dt} {out['capacity'][dt]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{a.requests} requests, {a.concurrency} at a time, prompts of {a.prompts} x outputs of {a.outputs} tokens "
          f"(each combination equally often, shuffled), {a.threads} threads" + (", on the GPU" if a.device == "cuda" else "")
          + (f"; medians of {a.rounds} alternating rounds (the run with the median tokens/s)" if a.rounds > 1 else "")
          + "\n")
    print("| model | weights | server | tokens/s | vs transformers | TTFT p50 / p99 | inter-token p50 / p99 | mean batch |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in out["models"].items():
        for dt in a.dtypes:
            z, h = r["zaya " + dt], r.get("transformers " + dt)
            ratio = f"{z['tokens_per_s'] / h['tokens_per_s']:.1f}x" if h else "-"
            if h and a.rounds > 1:
                ratio += " (rounds " + ", ".join(f"{x:.1f}" for x in z["ratio_rounds"]) + ")"
            print(f"| {name} | {dt} | zaya serve | {z['tokens_per_s']:.0f} | {ratio} | {z['ttft_p50_s'] * 1e3:.0f} / "
                  f"{z['ttft_p99_s'] * 1e3:.0f} ms | {z['itl_p50_s'] * 1e3:.1f} / {z['itl_p99_s'] * 1e3:.1f} ms | "
                  f"{z['mean_batch']:.1f} |")
            if h:
                print(f"| {name} | {dt} | transformers generate, static batch {a.concurrency} | {h['tokens_per_s']:.0f} | "
                      f"1.0x | - | - | {a.concurrency} |")
            g = r.get("zaya graphs " + dt)
            if g:
                gr = f"{g['tokens_per_s'] / h['tokens_per_s']:.1f}x" if h else "-"
                print(f"| {name} | {dt} | zaya serve, CUDA graphs | {g['tokens_per_s']:.0f} | {gr} | "
                      f"{g['ttft_p50_s'] * 1e3:.0f} / {g['ttft_p99_s'] * 1e3:.0f} ms | {g['itl_p50_s'] * 1e3:.1f} / "
                      f"{g['itl_p99_s'] * 1e3:.1f} ms | {g['mean_batch']:.1f} |")
    if "capacity" in out:
        c = out["capacity"]
        print(f"\nKV memory {c['kv_memory']}, {c['context']}-token requests:\n")
        print("| attention | weights and KV cache | KV bytes per token | requests running at once |")
        print("|---|---|---|---|")
        for dt in a.dtypes:
            for k in ("cca", "mha"):
                print(f"| {k.upper()} | {dt} | {c[dt][k]['kv_bytes_per_token']} | {c[dt][k]['peak_running']} |")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
