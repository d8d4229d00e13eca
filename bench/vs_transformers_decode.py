#!/usr/bin/env python3
"""Decode speed and peak memory of transformers' ZayaForCausalLM on a model directory, on the CPU, to set beside
`zaya bench decode` on the same weights and threads (README: Using Zyphra's released models).

    python3 bench/vs_transformers_decode.py --model DIR [--threads 2 --context 128 --tokens 32 --min-free-gb 2]

Loads the model in bf16 (dtype=torch.bfloat16, as the release is stored), prefills `context` random tokens (seed 3)
and decodes `tokens` more greedily from the KV cache, timing each step. A watchdog thread ends the process (exit 3,
a line saying so) if the machine's MemAvailable falls below --min-free-gb, so an 8B load on a 24 GB machine fails
cleanly instead of waking the OOM killer among other people's processes. Prints one JSON line.
"""
import argparse
import json
import os
import sys
import threading
import time


def status_kb(key, path="/proc/self/status"):
    with open(path) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def watchdog(min_free_kb, stop):
    while not stop.is_set():
        avail = status_kb("MemAvailable", "/proc/meminfo")
        if avail and avail < min_free_kb:
            print(json.dumps({"error": "stopped: MemAvailable fell to %.2f GB (rss %.2f GB)"
                              % (avail / 1e6 * 1.024, status_kb("VmRSS") / 1e6 * 1.024)}), flush=True)
            os._exit(3)
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--min-free-gb", type=float, default=2.0)
    a = ap.parse_args()
    stop = threading.Event()
    threading.Thread(target=watchdog, args=(a.min_free_gb * 1e6 / 1.024, stop), daemon=True).start()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    model.eval()
    load_s = time.time() - t0
    rss_loaded = status_kb("VmRSS") * 1024
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (1, a.context), generator=g)
    lat = []
    with torch.no_grad():
        t0 = time.time()
        out = model(input_ids=ids, use_cache=True)
        prefill_s = time.time() - t0
        past = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(a.tokens):
            t = time.time()
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            lat.append(time.time() - t)
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
    stop.set()
    lat.sort()
    median = lat[len(lat) // 2]
    print(json.dumps({
        "impl": "transformers %s, torch %s" % (__import__("transformers").__version__, torch.__version__),
        "threads": a.threads, "load_s": round(load_s, 2), "rss_after_load_bytes": rss_loaded,
        "peak_rss_bytes": status_kb("VmHWM") * 1024,
        "prefill_tokens_per_s": round(a.context / prefill_s, 2),
        "decode_tokens_per_s": round(a.tokens / sum(lat), 3), "median_ms": round(1e3 * median, 2),
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
