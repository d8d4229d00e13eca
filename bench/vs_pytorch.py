"""Side by side on the same cores and thread count: training steps (forward, loss, backward, optimizer) of the same
ZAYA config through transformers' ZayaForCausalLM + torch.optim.AdamW (eager, and optionally torch.compile) and
through `zaya bench train`; and greedy generation (`model.generate`) vs `zaya bench decode`. Every variant runs in
its own process (so peak resident memory is its own) and the variants alternate over --rounds rounds; the table
shows medians. With --bf16 it adds PyTorch with bf16 autocast (fp32 master weights and AdamW, forward and loss under
torch.autocast("cpu", torch.bfloat16); torch.compile too with --compile) against `zaya bench train --precision bf16`.
Usage: python3 bench/vs_pytorch.py --config configs/demo-model.json [--batch 16 --seq 128 --steps 5
--threads 2 --compile --bf16 --rounds 1 --decode-context 128 --decode-tokens 64 --no-decode]"""
import contextlib
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZAYA = os.path.join(ROOT, "build", "zaya")


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def torch_worker(args):
    """One variant in this process; prints one JSON line."""
    import torch
    from transformers import ZayaConfig, ZayaForCausalLM
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ZayaConfig.from_json_file(args.config)
    model = ZayaForCausalLM(cfg).float()
    vocab = cfg.vocab_size
    if args.worker in ("generate", "generate_bf16"):
        if args.worker == "generate_bf16":
            model = model.to(torch.bfloat16)
        model.eval()
        prompt = torch.randint(3, vocab, (1, args.decode_context))
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
            t0 = time.perf_counter()
            model.generate(prompt, max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens,
                           do_sample=False)
            tps = args.decode_tokens / (time.perf_counter() - t0)
        print(json.dumps({"tokens_per_s": tps, "peak_rss_mb": peak_rss_mb()}))
        return
    model.train()
    compiled = args.worker in ("compile", "compile_bf16")
    step_model = torch.compile(model) if compiled else model
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.worker.endswith("_bf16")
                else contextlib.nullcontext())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (args.batch, args.seq))
    # torch.compile compiles forward and backward on the first calls (and may recompile once): more warm-up
    warmup = args.compile_warmup if compiled else 2
    times = []
    for i in range(args.steps + warmup):
        t0 = time.perf_counter()
        with autocast:
            logits = step_model(tokens).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"tokens_per_s": args.batch * args.seq / statistics.median(times), "peak_rss_mb": peak_rss_mb()}))


def run_torch(args, worker):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--config", args.config, "--batch",
           str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps), "--threads", str(args.threads),
           "--compile-warmup", str(args.compile_warmup), "--decode-context", str(args.decode_context), "--decode-tokens", str(args.decode_tokens)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"torch {worker} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_zaya(args, *extra):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([ZAYA, "bench", *extra], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"zaya bench failed: {out.stderr}")
    return out.stdout


def zaya_train(args, optimizer, precision="fp32"):
    out = run_zaya(args, "train", "--config", args.config, "--batch", str(args.batch), "--seq", str(args.seq),
                   "--steps", str(max(args.steps, 5)), "--threads", str(args.threads), "--optimizer", optimizer,
                   "--precision", precision)
    return {"tokens_per_s": float(re.search(r"throughput\s+(\d+) tokens/s", out).group(1)),
            "mfu": float(re.search(r"MFU\s+([\d.]+)%", out).group(1)),
            "mfu_fwd_bwd": float(re.search(r"MFU fwd\+bwd\s+([\d.]+)%", out).group(1)),
            "peak_rss_mb": float(re.search(r"peak memory\s+([\d.]+) MB", out).group(1)),
            "breakdown": ", ".join(f"{name} {share}%" for name, share in
                                   re.findall(r"^\s+([a-z+]+)\s+([\d.]+)%", out, re.M))}


def zaya_decode(args, dtype):
    out = run_zaya(args, "decode", "--config", args.config, "--context", str(args.decode_context), "--tokens",
                   str(args.decode_tokens), "--threads", str(args.threads), "--dtype", dtype)
    return {"tokens_per_s": float(re.search(r"decode .* ([\d.]+) tokens/s", out).group(1))}


def median_of(results, key="tokens_per_s"):
    return statistics.median(r[key] for r in results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/demo-model.json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=1, help="alternate every variant this many times")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile)")
    ap.add_argument("--compile-warmup", type=int, default=6,
                    help="untimed torch.compile steps (compilation, recompiles for data-dependent expert shapes)")
    ap.add_argument("--decode-context", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--bf16", action="store_true",
                    help="also PyTorch bf16 autocast vs zaya --precision bf16")
    ap.add_argument("--worker", choices=["eager", "compile", "eager_bf16", "compile_bf16", "generate", "generate_bf16"],
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        torch_worker(args)
        return
    variants = ["eager"] + (["compile"] if args.compile else [])
    if args.bf16:
        variants += ["eager_bf16"] + (["compile_bf16"] if args.compile else [])
    zaya_variants = ["zaya", "zaya_adamw"] + (["zaya_bf16", "zaya_adamw_bf16"] if args.bf16 else [])
    res = {v: [] for v in variants + zaya_variants}
    dec = {"generate": [], "generate_bf16": [], "zaya": [], "zaya_bf16": []}
    for _ in range(args.rounds):
        for v in variants:
            res[v].append(run_torch(args, v))
        res["zaya_adamw"].append(zaya_train(args, "adamw"))
        res["zaya"].append(zaya_train(args, "muon"))
        if args.bf16:
            res["zaya_adamw_bf16"].append(zaya_train(args, "adamw", "bf16"))
            res["zaya_bf16"].append(zaya_train(args, "muon", "bf16"))
        if not args.no_decode:
            dec["generate"].append(run_torch(args, "generate"))
            dec["generate_bf16"].append(run_torch(args, "generate_bf16"))
            dec["zaya"].append(zaya_decode(args, "f32"))
            dec["zaya_bf16"].append(zaya_decode(args, "bf16"))
    z = median_of(res["zaya_adamw"])  # like for like: the PyTorch side runs AdamW
    info = subprocess.run([ZAYA, "info"], capture_output=True, text=True).stdout
    for line in info.splitlines():
        if line.startswith(("cpu ", "kernels ", "blas core ", "bf16 train ", "bf16 weights ")):
            print(line)
    print(f"config {args.config}, batch {args.batch} x {args.seq}, {args.threads} threads, "
          f"medians of {args.rounds} round(s)")
    print(f"{'training':48s} {'tokens/s':>10s} {'peak MB':>9s} {'zaya AdamW (same precision) / this':>12s}")
    names = {"eager": "transformers eager + AdamW", "compile": "transformers torch.compile + AdamW",
             "eager_bf16": "transformers eager, bf16 autocast + AdamW",
             "compile_bf16": "transformers torch.compile, bf16 autocast + AdamW"}
    for v in variants:
        zz = median_of(res["zaya_adamw_bf16"]) if v.endswith("_bf16") else z
        print(f"{names[v]:48s} {median_of(res[v]):10.0f} {median_of(res[v], 'peak_rss_mb'):9.0f} "
              f"{zz / median_of(res[v]):12.2f}")
    labels = [("zaya_adamw", "zaya, AdamW"), ("zaya", "zaya, Muon + AdamW")]
    if args.bf16:
        labels += [("zaya_adamw_bf16", "zaya bf16, AdamW"), ("zaya_bf16", "zaya bf16, Muon + AdamW")]
    for key, label in labels:
        name = f"{label} (MFU {median_of(res[key], 'mfu'):.1f}%, fwd+bwd {median_of(res[key], 'mfu_fwd_bwd'):.1f}%)"
        print(f"{name:48s} {median_of(res[key]):10.0f} {median_of(res[key], 'peak_rss_mb'):9.0f} "
              f"{median_of(res[key]) / z:12.2f}   (/ zaya fp32 AdamW)")
    print(f"zaya (Muon) breakdown: {res['zaya'][-1]['breakdown']}")
    if args.bf16:
        zb = median_of(res["zaya_adamw_bf16"])
        print(f"zaya bf16 / zaya fp32 (AdamW): {zb / z:.2f}; (Muon + AdamW): "
              f"{median_of(res['zaya_bf16']) / median_of(res['zaya']):.2f}")
        print(f"zaya bf16 / transformers eager bf16 autocast (AdamW): {zb / median_of(res['eager_bf16']):.2f}")
        if args.compile:
            print(f"zaya bf16 / torch.compile bf16 autocast (AdamW): {zb / median_of(res['compile_bf16']):.2f}")
        print(f"zaya bf16 (AdamW) breakdown: {res['zaya_adamw_bf16'][-1]['breakdown']}")
    if not args.no_decode:
        zd, zb = median_of(dec["zaya"]), median_of(dec["zaya_bf16"])
        gen, genb = median_of(dec["generate"]), median_of(dec["generate_bf16"])
        print(f"{'decoding (context %d, %d new tokens)' % (args.decode_context, args.decode_tokens):42s} "
              f"{'tokens/s':>10s} {'':9s} {'zaya f32 / this':>15s} {'zaya bf16 / this':>16s}")
        print(f"{'transformers model.generate, float32':42s} {gen:10.0f} {'':9s} {zd / gen:15.2f} {zb / gen:16.2f}")
        print(f"{'transformers model.generate, bfloat16':42s} {genb:10.0f} {'':9s} {zd / genb:15.2f} {zb / genb:16.2f}")
        print(f"{'zaya bench decode --dtype f32':42s} {zd:10.0f}")
        print(f"{'zaya bench decode --dtype bf16':42s} {zb:10.0f}")


if __name__ == "__main__":
    main()
