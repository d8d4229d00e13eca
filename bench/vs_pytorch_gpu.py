"""On one GPU, same config, batch, sequence length and gradient accumulation: bf16 optimizer steps (K micro-batches'
forward, loss and backward accumulated, clipping, optimizer) through transformers' ZayaForCausalLM (bf16 autocast,
fp32 master weights, fused AdamW; eager and torch.compile) and through `zaya bench train --device cuda --precision
bf16 --micro-batches K` (AdamW for the same work, and Muon + AdamW, ZAYA's recipe). Each variant runs in its own
process; prints a markdown table (median optimizer-step times; MFU of every row from zaya's FLOPs per token against
the dense bf16 peak) and JSON.
Usage: python3 bench/vs_pytorch_gpu.py --config configs/bench-gpu.json --batch 4 --seq 2048 [--micro-batches K]
       [--steps 5] [--no-compile] [--compile-timeout 300]
Decoding alone (no training rows), e.g. ZAYA1-8B's schema with random bf16 weights on both sides, zaya through the
server's block pool with its steps replayed as CUDA graphs:
       python3 bench/vs_pytorch_gpu.py --config configs/zaya1-8b.json --decode-only --decode-path pool \
           --decode-batches 1,32 --decode-tokens 64
A worker alone on a CPU (fp32, no autocast; a check of the options and the accumulation, no benchmark):
       python3 bench/vs_pytorch_gpu.py --worker eager --device cpu --config configs/tiny.json --batch 2 --seq 16 \
           --micro-batches 2 --steps 1"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZAYA = os.path.join(ROOT, "build", "zaya")


def torch_worker(args):
    import torch
    from transformers import ZayaConfig, ZayaForCausalLM
    torch.manual_seed(0)
    cfg = ZayaConfig.from_json_file(args.config)
    if args.worker == "generate":  # bf16 weights, greedy, the cache transformers builds
        with torch.device("cuda"):  # initialised on the GPU: a 2 B model's CPU initialisation takes minutes
            model = ZayaForCausalLM(cfg).to(torch.bfloat16).eval()
        prompt = torch.randint(3, cfg.vocab_size, (args.batch, args.decode_context), device="cuda")
        n = args.decode_tokens
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        print(json.dumps({"decode_tokens_per_s": args.batch * n / dt, "batch": args.batch}))
        return
    dev = args.device
    with torch.device(dev):  # initialised where it trains (on the GPU: seconds, not the CPU's minutes at 2 B)
        model = ZayaForCausalLM(cfg).float().train()
    step_model = torch.compile(model) if args.worker == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev == "cuda")
    vocab, K = cfg.vocab_size, args.micro_batches
    # K fixed micro-batches [batch, seq], the same every step (as zaya bench train's random tokens)
    tokens = torch.randint(0, vocab, (K, args.batch, args.seq), device=dev)
    warmup = args.compile_warmup if args.worker == "compile" else (2 if args.steps > 1 else 0)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times, losses, norms = [], [], []
    for i in range(args.steps + warmup):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for k in range(K):  # gradient accumulation: the mean over micro-batches, as zaya's step reduces
            # bf16 autocast on the GPU; fp32 on a CPU (the options and the accumulation checked, not the speed)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
                logits = step_model(tokens[k]).logits
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(),
                                                         tokens[k, :, 1:].reshape(-1))
            (loss / K).backward()
            step_loss += loss.detach() / K
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        sync()
        losses.append(float(step_loss))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    tokens_per_step = K * args.batch * args.seq
    print(json.dumps({"tokens_per_s": tokens_per_step / step, "step_s": step, "tokens_per_step": tokens_per_step,
                      "micro_batches": K, "losses": losses, "grad_norms": norms,
                      "gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0,
                      "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}))


def run_torch(args, worker, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--config", args.config, "--batch",
           str(args.batch), "--seq", str(args.seq), "--micro-batches", str(args.micro_batches), "--steps",
           str(args.steps), "--device", args.device, "--compile-warmup",
           str(args.compile_warmup), "--decode-context", str(args.decode_context), "--decode-tokens",
           str(args.decode_tokens)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout} s"}
    if out.returncode != 0:
        last = [l for l in out.stderr.strip().splitlines() if l.strip()][-1:] or ["?"]
        return {"error": last[0][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_zaya(args, optimizer):
    cmd = [ZAYA, "bench", "train", "--config", args.config, "--batch", str(args.batch), "--seq", str(args.seq),
           "--micro-batches", str(args.micro_batches), "--steps", str(args.steps), "--device", "cuda", "--precision", "bf16", "--optimizer", optimizer]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-300:]}
    sys.stderr.write(out.stdout)
    r = json.loads(re.search(r"^json\s+(\{.*\})$", out.stdout, re.M).group(1))
    return r


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a positive integer, got {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expects a positive integer, got {v}")
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/bench-gpu.json")
    ap.add_argument("--batch", type=positive_int, default=4)
    ap.add_argument("--seq", type=positive_int, default=2048)
    ap.add_argument("--micro-batches", type=positive_int, default=1,
                    help="micro-batches of --batch x --seq accumulated per optimizer step (default 1)")
    ap.add_argument("--steps", type=positive_int, default=5)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a --worker alone, fp32, to check the options and the accumulation")
    ap.add_argument("--compile-warmup", type=int, default=4)
    ap.add_argument("--compile-timeout", type=int, default=300)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--decode-batches", default="1,32", help="decode comparison batch sizes ('' = none)")
    ap.add_argument("--decode-context", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--decode-only", action="store_true", help="the decode comparison alone, no training rows")
    ap.add_argument("--decode-path", default="cache", choices=["cache", "pool"],
                    help="zaya's decoding: cache (generate's same-length cache) or pool (the server's block pool, "
                         "its steps replayed as CUDA graphs: ZAYA_GPU_GRAPHS=1)")
    ap.add_argument("--worker", choices=["eager", "compile", "generate"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        torch_worker(args)
        return
    if args.device != "cuda":
        ap.error("--device cpu runs a --worker alone (the comparison needs a GPU)")
    rows = [] if args.decode_only else train_rows(args)
    decode = decode_rows(args)
    print("\njson " + json.dumps({"train": rows, "decode": decode}))


def train_rows(args):
    rows = [("zaya, AdamW (same work as PyTorch)", run_zaya(args, "adamw")),
            ("zaya, Muon + AdamW (ZAYA's recipe)", run_zaya(args, "muon")),
            ("PyTorch eager (bf16 autocast, fused AdamW)", run_torch(args, "eager", 600))]
    if not args.no_compile:
        rows.append(("PyTorch torch.compile", run_torch(args, "compile", args.compile_timeout)))
    base = rows[0][1].get("tokens_per_s")
    # every row does the same model FLOPs per token: its MFU is zaya's scaled by the throughputs
    mfu_per_tps = rows[0][1]["mfu_dense"] / base if base and rows[0][1].get("mfu_dense") else None
    print(f"\n{args.config}, {args.micro_batches} micro-batch(es) of {args.batch} x {args.seq} = "
          f"{args.micro_batches * args.batch * args.seq} tokens per optimizer step, bf16, median of {args.steps} "
          "steps\n")
    print("| run | tokens/s | optimizer step (s) | zaya AdamW vs this | MFU (dense bf16) | peak GPU memory (GiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows:
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | |")
            continue
        ratio = f"{base / r['tokens_per_s']:.2f}x" if base else ""
        mfu = f"{100 * mfu_per_tps * r['tokens_per_s']:.1f}%" if mfu_per_tps else ""
        print(f"| {name} | {r['tokens_per_s']:.0f} | {r['step_s']:.3f} | {ratio} | {mfu} | {r['gpu_mem_gib']:.1f} |")
    return rows


def decode_rows(args):
    decode = []
    pool = args.decode_path == "pool"
    env = dict(os.environ, ZAYA_GPU_GRAPHS="1") if pool else None
    for b in [int(x) for x in args.decode_batches.split(",") if x]:
        out = subprocess.run([ZAYA, "bench", "decode", "--config", args.config, "--device", "cuda", "--dtype", "bf16",
                              "--batch", str(b), "--context", str(args.decode_context), "--tokens",
                              str(args.decode_tokens)] + (["--path", "pool"] if pool else []),
                             capture_output=True, text=True, env=env)
        z = (json.loads(re.search(r"^json\s+(\{.*\})$", out.stdout, re.M).group(1)) if out.returncode == 0
             else {"error": out.stderr.strip()[-200:]})
        sys.stderr.write(out.stdout)
        targs = argparse.Namespace(**vars(args))
        targs.batch = b
        t = run_torch(targs, "generate", 600)
        decode.append((b, z, t))
    if decode:
        how = "the block pool with CUDA graphs" if pool else "the same-length cache"
        print(f"\ndecode: {args.config}, {args.decode_context}-token context, {args.decode_tokens} new tokens per "
              f"sequence, greedy, bf16 weights; zaya through {how}\n")
        print("| batch | zaya tokens/s | transformers `generate` tokens/s | zaya vs generate |")
        print("|---:|---:|---:|---:|")
        for b, z, t in decode:
            zt, tt = z.get("decode_tokens_per_s"), t.get("decode_tokens_per_s")
            ratio = f"{zt / tt:.2f}x" if zt and tt else ""
            print(f"| {b} | {zt if zt else z.get('error')} | {tt if tt else t.get('error')} | {ratio} |")
    return decode


if __name__ == "__main__":
    main()
