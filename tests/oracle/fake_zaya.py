#!/usr/bin/env python3
"""An HF-backed stand-in for build/zaya, used only to validate the oracle scripts themselves.

    ZAYA_BIN="python tests/oracle/fake_zaya.py" python tests/oracle/test_oracle.py

It implements the same CLI (init / forward / convert) with transformers, using a *different* numerical path
from the oracle's reference (sdpa attention + grouped_mm experts instead of eager/eager), so the comparison code
sees real float32 rounding differences. Environment knobs:
  FAKE_ZAYA_F64=1        compute forward/backward in float64 (outputs still float32)
  FAKE_ZAYA_BUG=<name>   inject a bug, to prove the oracle catches it:
      temp_exp     QK-norm temperature applied as exp(T)
      pad_grad     the pad token's lookup sends gradient to its embedding row
      no_eda       router state not carried across depth
      routing      one token's reported routing index is wrong
      drop_grad    one gradient missing from the file
      extra_grad   balancing_biases reported as a gradient
      grad_scale   one gradient 0.1% off
      loss_digits  loss printed with 6 significant digits
      logits_eps   logits perturbed by 2e-5 relative
Not a validator of input: bad input mostly just crashes (non-zero exit) with a Python traceback.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import ZayaConfig, ZayaForCausalLM, hf_reference  # noqa: E402

BUG = os.environ.get("FAKE_ZAYA_BUG", "")


def die(msg):
    print(f"fake_zaya: {msg}", file=sys.stderr)
    sys.exit(2)


def cmd_init(a):
    cfgd = json.loads(Path(a.config).read_text())
    for k in ("model_type", "architectures", "torch_dtype", "dtype", "transformers_version"):
        cfgd.pop(k, None)
    cfg = ZayaConfig(**cfgd)
    torch.manual_seed(a.seed)
    m = ZayaForCausalLM._from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.qk_norm.temp.fill_(1.0)  # [zaya] T init 1
    m.config.architectures = ["ZayaForCausalLM"]
    m.save_pretrained(a.out, safe_serialization=True)
    print(f"wrote {a.out}")


def cmd_convert(a):
    m = ZayaForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    if a.dtype == "bf16":
        m = m.to(torch.bfloat16)
    m.save_pretrained(a.out, safe_serialization=True)
    print(f"wrote {a.out}")


def cmd_forward(a):
    tok = np.load(a.tokens)
    if tok.dtype not in (np.int32, np.int64):
        die(f"{a.tokens}: dtype {tok.dtype} (need int32/int64)")
    if tok.ndim != 2:
        die(f"{a.tokens}: shape {tok.shape} (need [B, T])")
    f64 = os.environ.get("FAKE_ZAYA_F64") == "1"  # grouped_mm has no float64 kernel
    m = ZayaForCausalLM.from_pretrained(a.model, attn_implementation="sdpa",
                                        experts_implementation="eager" if f64 else "grouped_mm", dtype=torch.float32)
    m.eval()
    V = m.config.vocab_size
    if tok.size and (tok.min() < 0 or tok.max() >= V):
        die(f"{a.tokens}: token id out of range [0, {V})")
    if f64:
        m = m.double()
    with torch.no_grad():
        if BUG == "temp_exp":
            for layer in m.model.layers:
                layer.self_attn.qk_norm.temp.exp_()
        if BUG == "no_eda":
            for layer in m.model.layers[1:]:
                layer.mlp.gate.router_states_scale.zero_()
    if BUG == "pad_grad":
        m.model.embed_tokens.padding_idx = None
    ref = hf_reference(m, tok)
    if a.logits_out:
        lg = ref["logits"].astype(np.float32)
        if BUG == "logits_eps":
            lg = lg + 2e-5 * np.linalg.norm(lg) / math.sqrt(lg.size)
        np.save(a.logits_out, lg)
    if a.grads_out:
        from safetensors.numpy import save_file
        g = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in ref["grads"].items()}
        if BUG == "drop_grad":
            g.pop(sorted(g)[3])
        if BUG == "extra_grad":
            g["model.layers.0.mlp.gate.balancing_biases"] = np.zeros(m.config.num_experts + 1, np.float32)
        if BUG == "grad_scale":
            k = "model.layers.0.self_attn.qkv_proj.conv_qk_grouped.weight"
            g[k] = g[k] * np.float32(1.001)
        for l, r in enumerate(ref["routing"]):
            r = np.ascontiguousarray(r, dtype=np.int32)
            if BUG == "routing" and l == len(ref["routing"]) - 1:
                r = r.copy()
                r.flat[0] = (r.flat[0] + 1) % (m.config.num_experts + 1)
            g[f"routing.layer{l}"] = r
        save_file(g, a.grads_out)
    print(f"tokens {tok.shape[0]}x{tok.shape[1]}")
    loss = ref["loss"]
    print(f"loss {loss:.6g}" if BUG == "loss_digits" else f"loss {loss:.10g}")


def main():
    ap = argparse.ArgumentParser(prog="fake_zaya")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("forward")
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--logits-out")
    p.add_argument("--grads-out")
    p = sub.add_parser("convert")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    a = ap.parse_args()
    {"init": cmd_init, "forward": cmd_forward, "convert": cmd_convert}[a.cmd](a)


if __name__ == "__main__":
    main()
