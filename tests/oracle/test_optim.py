"""AdamW and Muon steps (with global-norm clipping) against PyTorch: torch.optim.AdamW, and Muon written in a
few lines of torch from SYSTEM.md. zaya runs through `zaya debug optim`. Tolerance: 1e-5 relative.
Also bench/vs_pytorch_gpu.py's PyTorch side on the CPU (its GPU comparison cannot run here): its options, the model
it builds from a zaya config, and its gradient accumulation (2 micro-batches of 2 = one batch of 4, same tokens)."""
import json
import math
import os
import subprocess
import sys
import tempfile

from harness import Suite, run_zaya
import numpy as np
import torch
from safetensors.numpy import load_file, save_file

TOL = 1e-5
suite = Suite("optim", print_passes=True)


def ns5(G, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.clone()
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if tall else X


def muon_step(W, G, M, lr, wd, mu):
    """W, G, M: [m, n] (one matrix). Moonlight-style RMS matching."""
    M.mul_(mu).add_(G)
    N = G + mu * M
    O = ns5(N)
    m, n = W.shape
    W.sub_(lr * (0.2 * math.sqrt(max(m, n)) * O + wd * W))


def run_case(name, shapes, steps, lr, wd, clip, seed):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s).astype(np.float32) * 0.5 for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s).astype(np.float32) * (0.1 if "adamw" in k else 1.0) for k, s in shapes.items()}
             for _ in range(steps)]
    tensors = dict(params)
    for k, g in enumerate(grads):
        for n, v in g.items():
            tensors[f"grad{k}/{n}"] = v
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.safetensors"), os.path.join(d, "out.safetensors")
        save_file(tensors, inp)
        rc, _, err = run_zaya(["debug", "optim", "--in", inp, "--out", out, "--steps", steps, "--lr", lr,
                               "--weight-decay", wd, "--beta1", "0.9", "--beta2", "0.95", "--eps", "1e-8",
                               "--momentum", "0.95", "--clip", clip])
        if rc != 0:
            suite.check(False, f"{name}: zaya debug optim failed", err.strip())
            return
        got = load_file(out)
    # torch reference
    tp = {k: torch.tensor(v, dtype=torch.float32) for k, v in params.items()}
    adam_decay = [tp[k] for k in tp if k.startswith("adamw/") and tp[k].dim() >= 2]
    adam_nodecay = [tp[k] for k in tp if k.startswith("adamw/") and tp[k].dim() < 2]
    for t in tp.values():
        t.requires_grad_(True)
    groups = []
    if adam_decay:
        groups.append({"params": adam_decay, "weight_decay": wd})
    if adam_nodecay:
        groups.append({"params": adam_nodecay, "weight_decay": 0.0})
    adam = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8) if groups else None
    moms = {k: torch.zeros_like(v) for k, v in tp.items() if k.startswith("muon/")}
    for g in grads:
        for k, t in tp.items():
            t.grad = torch.tensor(g[k])
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
        if adam:
            adam.step()
        with torch.no_grad():
            for k, t in tp.items():
                if not k.startswith("muon/"):
                    continue
                if t.dim() == 3:
                    for e in range(t.shape[0]):
                        muon_step(t[e], t.grad[e], moms[k][e], lr, wd, 0.95)
                else:
                    muon_step(t, t.grad, moms[k], lr, wd, 0.95)
    for k, t in tp.items():
        ref = t.detach().numpy()
        start = params[k]
        # compare the updates (final - start), the part the optimizer computed
        du_ref, du = ref - start, got[k] - start
        err = np.linalg.norm(du - du_ref) / max(np.linalg.norm(du_ref), 1e-30)
        suite.check(err <= TOL, f"{name} {k} {list(t.shape)}", f"update rel err {err:.2e}")


def vs_pytorch_accumulation():
    """One optimizer step of bench/vs_pytorch_gpu.py's eager worker on configs/tiny.json (fp32 on the CPU): 2
    micro-batches of 2 x 16 and 1 of 4 x 16 draw the same tokens, so the step's loss and gradient norm agree to
    float rounding (the mean of two equal halves' means is the whole's mean); a bad --micro-batches is refused."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "bench", "vs_pytorch_gpu.py")
    base = [sys.executable, script, "--worker", "eager", "--device", "cpu", "--config",
            os.path.join(root, "configs", "tiny.json"), "--seq", "16", "--steps", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="2")
    runs = {}
    for k, b in ((2, 2), (1, 4)):
        out = subprocess.run(base + ["--batch", str(b), "--micro-batches", str(k)], capture_output=True, text=True,
                             env=env, timeout=600)
        if not suite.check(out.returncode == 0, f"vs_pytorch_gpu.py --device cpu --micro-batches {k} runs",
                           out.stderr.strip()[-300:]):
            return
        runs[k] = json.loads(out.stdout.strip().splitlines()[-1])
    a, b = runs[2], runs[1]
    suite.check(a["tokens_per_step"] == b["tokens_per_step"] == 64 and a["micro_batches"] == 2,
                "vs_pytorch_gpu.py: tokens per optimizer step", f"{a['tokens_per_step']}, {b['tokens_per_step']}")
    for key, what in (("losses", "loss"), ("grad_norms", "gradient norm")):
        err = abs(a[key][0] - b[key][0]) / abs(b[key][0])
        suite.check(err <= TOL, f"vs_pytorch_gpu.py: 2 x 2 accumulated == 1 x 4, {what}",
                    f"{a[key][0]:.7g} vs {b[key][0]:.7g}, rel err {err:.1e}")
    bad = subprocess.run(base + ["--batch", "2", "--micro-batches", "0"], capture_output=True, text=True, timeout=120)
    suite.check(bad.returncode != 0 and "--micro-batches" in bad.stderr and "positive integer" in bad.stderr,
                "vs_pytorch_gpu.py: --micro-batches 0 refused", bad.stderr.strip().splitlines()[-1][-200:])


def main():
    suite.require_zaya()
    shapes = {"muon/wide": (16, 24), "muon/tall": (40, 12), "muon/experts": (3, 8, 12), "adamw/embed": (10, 6),
              "adamw/norm": (7,), "adamw/conv": (5, 1, 2)}
    cases = [
        ("plain", shapes, 3, 0.02, 0.0, 0.0, 1),
        ("weight-decay", shapes, 3, 0.01, 0.1, 0.0, 2),
        ("clipped", shapes, 4, 0.02, 0.05, 1.0, 3),
    ]
    for c in cases:
        suite.run(c[0], run_case, *c)
    suite.run("vs_pytorch", vs_pytorch_accumulation)
    suite.finish()


if __name__ == "__main__":
    main()
