"""Side by side on the same cores and thread count: training steps (forward, loss, backward, optimizer) of the same
ZAYA config through transformers' ZayaForCausalLM + torch.optim.AdamW (eager, and optionally torch.compile) and
through `zaya bench train`; and greedy generation (`model.generate`) vs `zaya bench decode`. Prints tokens/s
(medians) and the ratios. Usage: python3 bench/vs_pytorch.py --config configs/demo-model.json [--batch 16 --seq 128
--steps 5 --threads 2 --compile --decode-context 128 --decode-tokens 64]"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZAYA = os.path.join(ROOT, "build", "zaya")


def torch_train(model, batch, seq, steps, vocab):
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (batch, seq))
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        logits = model(tokens).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return batch * seq / statistics.median(times)


def torch_generate(model, context, new_tokens, vocab):
    import torch
    prompt = torch.randint(3, vocab, (1, context))
    model.generate(prompt, max_new_tokens=4, do_sample=False, min_new_tokens=4)  # warm-up
    t0 = time.perf_counter()
    model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return new_tokens / (time.perf_counter() - t0)


def zaya(args, *extra):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([ZAYA, "bench", *extra], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"zaya bench failed: {out.stderr}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/demo-model.json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile)")
    ap.add_argument("--decode-context", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    args = ap.parse_args()
    import torch
    from transformers import ZayaConfig, ZayaForCausalLM
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ZayaConfig.from_json_file(args.config)
    model = ZayaForCausalLM(cfg).float().train()
    vocab = cfg.vocab_size
    rows = []
    eager = torch_train(model, args.batch, args.seq, args.steps, vocab)
    rows.append(("transformers eager + AdamW", eager))
    compiled = None
    if args.compile:
        compiled = torch_train(torch.compile(model), args.batch, args.seq, args.steps, vocab)
        rows.append(("transformers torch.compile + AdamW", compiled))
    out = zaya(args, "train", "--config", args.config, "--batch", str(args.batch), "--seq", str(args.seq), "--steps",
               str(max(args.steps, 5)), "--threads", str(args.threads))
    z = float(re.search(r"throughput\s+(\d+) tokens/s", out).group(1))
    mfu = re.search(r"MFU\s+([\d.]+)%", out).group(1)
    rows.append((f"zaya bench train (MFU {mfu}%)", z))
    print(f"config {args.config}, batch {args.batch} x {args.seq}, {args.threads} threads")
    print(f"{'training':40s} {'tokens/s':>10s} {'zaya / this':>12s}")
    for name, v in rows:
        print(f"{name:40s} {v:10.0f} {z / v:12.2f}")
    model.eval()
    with torch.no_grad():
        gen = torch_generate(model, args.decode_context, args.decode_tokens, vocab)
    out = zaya(args, "decode", "--config", args.config, "--context", str(args.decode_context), "--tokens",
               str(args.decode_tokens), "--threads", str(args.threads))
    zd = float(re.search(r"decode .* ([\d.]+) tokens/s", out).group(1))
    print(f"{'decoding (context %d, %d new tokens)' % (args.decode_context, args.decode_tokens):40s} {'tokens/s':>10s}")
    print(f"{'transformers model.generate (greedy)':40s} {gen:10.0f} {zd / gen:12.2f}")
    print(f"{'zaya bench decode':40s} {zd:10.0f}")


if __name__ == "__main__":
    main()
