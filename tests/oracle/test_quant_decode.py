#!/usr/bin/env python3
"""`--dtype q8|q4`: a quantized folder's codes read in place (docs/quantization.md), on test_serve.py's small random
model and tokenizer, quantized by `zaya quantize` (groups of 32: its widths are 32 and 64):

- `serve --dtype q4` completions equal `generate --dtype q4`'s greedy text, prompt for prompt;
- `--dtype auto` on a quantized folder runs it quantized (the start-up lines say so: codes mapped, which kernels);
- `forward --dtype q8|q4` with the widen way equals `forward --dtype f32` (the folder dequantized) to fp32 rounding,
  and with the int8 way stays close; `eval` runs quantized;
- `bench decode --dtype q4` reports the bytes per step at 4.5 bits a weight (the router's at its own 8), the bandwidth
  bound, and q4 vs f32;
- `quantize --calibration DATA` (a `data prepare` folder) with `--method mse` and `gptq` writes folders that run;
- `--dtype q8` on an unquantized folder, q8 on a 4-bit folder, `--device cuda` with quantized weights, a bad folder
  (a truncated weight, a mismatched scales shape), gptq without calibration data, calibration with mlx's rule, a
  missing calibration folder and calibrating a quantized folder are clear errors naming the folder, the flag or the tensor.
(convert, ckpt export and train refusing a quantized folder: test_quant_mlx.py.)

    python tests/oracle/test_quant_decode.py [--keep DIR]

The last line is `quant_decode: N passed, N failed`.
"""
import json
import os
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya  # noqa: E402
from test_serve import Server, generate_text, make_model  # noqa: E402

import numpy as np  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

PROMPTS = ["the quick", "12+34=", "hello", "def f(x):", "one two"]


def run_with_way(way, args):
    """zaya with ZAYA_QUANT_WAY set for this run only."""
    old = os.environ.get("ZAYA_QUANT_WAY")
    os.environ["ZAYA_QUANT_WAY"] = way
    try:
        return run_zaya(args)
    finally:
        if old is None:
            del os.environ["ZAYA_QUANT_WAY"]
        else:
            os.environ["ZAYA_QUANT_WAY"] = old


def checks(res, work):
    mdir = make_model(work)
    q = {}
    for bits in (8, 4):
        q[bits] = work / f"q{bits}"
        rc, _, err = run_zaya(["quantize", "--model", mdir, "--out", q[bits], "--bits", bits, "--group-size", 32])
        res.check(rc == 0, f"quantize --bits {bits}", err[-300:])
        shutil.copy(mdir / "tokenizer.json", q[bits] / "tokenizer.json")  # quantize copies it; keep the test honest
    q4 = q[4]

    # --dtype auto on a quantized folder: the codes in place, the kernels named
    rc, out, err = run_zaya(["generate", "--model", q4, "--tokenizer", q4 / "tokenizer.json", "--prompt", "hello",
                             "--max-tokens", 4, "--temperature", 0], text=False)  # random text: not UTF-8
    err = err.decode(errors="replace")
    res.check(rc == 0 and re.search(r"^weights +q4 \(4-bit codes read in place .*: [0-9.]+ MB mapped", err, re.M) and
              re.search(r"^quant kernels +\w+, (int8|widen)", err, re.M), "generate --dtype auto: q4 in place",
              err[-500:])

    # serve --dtype q4 == generate --dtype q4, greedy
    expected = {p: generate_text(q4, prompt=p, max_tokens=24, extra=("--dtype", "q4")) for p in PROMPTS}
    res.check(len(set(expected.values())) > 2, "the q4 model says different things to different prompts",
              str(list(expected.values())[:3]))
    srv = Server(q4, "--dtype", "q4", "--max-batch", 4)
    try:
        cl = srv.client()
        for p in PROMPTS:
            r = cl.completions.create(model=q4.name, prompt=p, max_tokens=24, temperature=0)
            res.check(r.choices[0].text == expected[p], f"serve --dtype q4 = generate --dtype q4: {p!r}",
                      f"{r.choices[0].text!r} vs {expected[p]!r}")
    finally:
        srv.stop()

    # forward: in place against the same folder dequantized (the values the kernels multiply by)
    tokens = work / "tok.npy"
    np.save(tokens, np.random.RandomState(5).randint(0, 384, size=(2, 48)).astype(np.int32))  # 96 rows: panels too
    short = work / "short.npy"
    np.save(short, np.random.RandomState(6).randint(0, 384, size=(1, 20)).astype(np.int32))  # 20 rows: the kernels
    for bits in (8, 4):
        for tok in (tokens, short):
            ref_npy, got_npy = work / "ref.npy", work / "got.npy"
            rc1, _, e1 = run_zaya(["forward", "--model", q[bits], "--tokens", tok, "--dtype", "f32", "--logits-out", ref_npy])
            # widen: the dequantized products in another order; int8: activations rounded per block of 32 in every
            # few-row product, which this random model (initializer_range 0.5) amplifies to 2-13% (measured); a
            # broken path is off by ~100%
            for way, bound in (("widen", 1e-5), ("int8", 0.25)):
                rc2, _, e2 = run_with_way(way, ["forward", "--model", q[bits], "--tokens", tok, "--dtype", f"q{bits}",
                                                "--logits-out", got_npy])
                if rc1 or rc2:
                    res.check(False, f"forward q{bits} {way}", (e1 + e2)[-400:])
                    continue
                a, b = np.load(got_npy), np.load(ref_npy)
                rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
                res.check(rel <= bound, f"forward --dtype q{bits} ({way}, {tok.stem}) = the dequantized forward",
                          f"rel err {rel:.3g} > {bound}")
    rc, out, err = run_zaya(["forward", "--model", q4, "--tokens", short, "--dtype", "q4", "--grads-out", work / "g"])
    res.check(rc != 0 and "--grads-out needs --dtype f32" in err, "forward --dtype q4 --grads-out refused", err[-300:])
    rc, out, err = run_zaya(["eval", "--model", q4, "--dtype", "auto", "--tokens", tokens, "--seq-len", 16])
    res.check(rc == 0 and "weights           q4" in err, "eval --dtype auto on the q4 folder", (out + err)[-400:])

    # bench decode: bytes per step at the quantized size, the bound, q4 against its dequantized f32 twin
    rc, out, err = run_zaya(["bench", "decode", "--model", q4, "--context", 16, "--tokens", 8])
    rc32, out32, _ = run_zaya(["bench", "decode", "--model", mdir, "--context", 16, "--tokens", 8])

    def bytes_per_step(text):
        m = re.search(r"^json +(\{.*\})$", text, re.M)
        return json.loads(m.group(1))["bytes_per_step"] if m else float("nan")

    # What a decoded row reads, tensor by tensor: the matrices (2+ dims, not the convolution kernels) at 4-bit codes and
    # an F32 scale and bias per 32 values (zaya init wrote f32): 0.5 + 2·4/32 bytes against f32's 4, the router's at
    # their own format (8 bits: config.json's per-module entries); one expert of E; everything else in fp32 (the
    # convolution kernels too: f32 values, not bf16 ones, so no bf16 copies)
    per4 = 0.5 + 2 * 4 / 32
    qcfg, src = json.loads((q4 / "config.json").read_text())["quantization"], load_file(str(mdir / "model.safetensors"))
    mcfg = json.loads((mdir / "config.json").read_text())
    router_extra = sum(src[k + ".weight"].size * (e["bits"] / 8 + 2 * 4 / e["group_size"] - per4)
                       for k, e in qcfg.items() if isinstance(e, dict))

    def read_bytes(per_matrix):
        total = 0.0
        for name, t in src.items():
            n = t.size / (mcfg["num_experts"] if ".mlp.experts." in name else 1)
            if name == "model.embed_tokens.weight" and not mcfg.get("tie_word_embeddings", True):
                n = mcfg["hidden_size"]  # one row gathered
            total += n * (per_matrix if t.ndim >= 2 and "conv_qk" not in name else 4)
        return total

    want4, want32 = read_bytes(per4) + router_extra, read_bytes(4)
    res.check(rc == 0 and rc32 == 0 and router_extra > 0 and abs(bytes_per_step(out) / want4 - 1) < 1e-6 and
              abs(bytes_per_step(out32) / want32 - 1) < 1e-6,
              "bench decode: bytes per step tensor by tensor (q4 matrices at 0.5 + 2·4/32, the 8-bit router's at its own, "
              "the rest fp32)", f"q4 {bytes_per_step(out):.0f} want {want4:.0f}, f32 {bytes_per_step(out32):.0f} want "
              f"{want32:.0f}; {err[-300:]}")
    res.check(re.search(r"^weights +q4: [0-9.]+ MB read per decoding step", out, re.M), "bench decode: q4 weights line",
              out[-400:])
    res.check(re.search(r"^bandwidth .* decoding at most [0-9.]+ tokens/s", out, re.M) and
              re.search(r"^q4   vs f32 +logits over 24 positions", out, re.M) and '"dtype": "q4"' in out,
              "bench decode: the bound, q4 vs f32, the json line", out[-600:])

    # calibrated quantization (--calibration, --method gptq): a token folder from text, quantized with it, run in place
    (work / "calib.txt").write_text("\n".join(f"{p} {i} the quick brown fox, 12+34=46; def f(x): return x"
                                              for i, p in enumerate(PROMPTS * 40)) + "\n")
    data = work / "calib-data"
    rc, _, err = run_zaya(["data", "prepare", "--tokenizer", mdir, "--input", work / "calib.txt", "--out", data,
                           "--force"])
    res.check(rc == 0, "data prepare: calibration shards", err[-300:])
    for method in ("mse", "gptq"):
        qc = work / f"q4-{method}-calibrated"
        rc, out, err = run_zaya(["quantize", "--model", mdir, "--out", qc, "--bits", 4, "--group-size", 32,
                                 "--method", method, "--calibration", data, "--calibration-tokens", 512,
                                 "--calibration-seq-len", 32])
        res.check(rc == 0 and re.search(r"^calibrated on 512 tokens of .* \(16 windows of 32\)", out, re.M) and
                  f"({method}, calibrated)" in out, f"quantize --method {method} --calibration", (out + err)[-400:])
        rc, out, err = run_zaya(["generate", "--model", qc, "--dtype", "q4", "--ids", "--prompt", "1 2 3 4"])
        res.check(rc == 0 and out.strip(), f"generate --dtype q4 on the {method}-calibrated folder", err[-300:])
    # --calibration without --method: mse, also at 8 bits (where the uncalibrated default is mlx's rule)
    rc, out, err = run_zaya(["quantize", "--model", mdir, "--out", work / "q8-calibrated", "--bits", 8, "--group-size",
                             32, "--calibration", data, "--calibration-tokens", 256, "--calibration-seq-len", 32])
    res.check(rc == 0 and "(mse, calibrated)" in out, "quantize --bits 8 --calibration: mse", (out + err)[-400:])

    # refusals: clear errors naming the folder, the flag or the tensor
    for args, needles, label in [
        (["quantize", "--model", mdir, "--out", work / "x", "--bits", 4, "--group-size", 32, "--method", "gptq"],
         ["--method gptq", "--calibration"], "gptq without calibration data"),
        (["quantize", "--model", mdir, "--out", work / "x", "--bits", 4, "--group-size", 32, "--method", "mlx",
          "--calibration", data], ["--method mlx", "calibration"], "calibration with mlx's rule"),
        (["quantize", "--model", mdir, "--out", work / "x", "--bits", 4, "--group-size", 32, "--calibration",
          work / "no-such-data"], [str(work / "no-such-data")], "a missing calibration folder"),
        (["quantize", "--model", q4, "--out", work / "x", "--bits", 4, "--group-size", 32, "--calibration", data],
         [str(q4), "4-bit quantized"], "calibrating a quantized folder"),
        (["generate", "--model", mdir, "--ids", "--prompt", "1 2", "--dtype", "q8"], [str(mdir), "is not quantized",
                                                                                       "zaya quantize"],
         "q8 on an unquantized folder"),
        (["generate", "--model", q4, "--ids", "--prompt", "1 2", "--dtype", "q8"], [str(q4), "holds 4-bit"],
         "q8 on a 4-bit folder"),
        (["generate", "--model", q4, "--ids", "--prompt", "1 2", "--device", "cuda"], ["--device cuda", "CPU only"],
         "quantized weights on a GPU"),
        (["generate", "--model", q4, "--ids", "--prompt", "1 2", "--dtype", "q5"], ["--dtype", '"q5"'],
         "an unknown --dtype"),
    ]:
        rc, out, err = run_zaya(args)
        res.check(rc != 0 and all(n in err for n in needles), label, f"exit {rc}: {err.strip()[-300:]}")
    name = "model.layers.1.self_attn.o_proj"
    shards = sorted(q4.glob("*.safetensors"))
    for label, edit, needles in (
        ("truncated weight", lambda t: t.__setitem__(name + ".weight", t[name + ".weight"][:, :-1].copy()),
         (name + ".weight", "truncated")),
        ("mismatched scales shape", lambda t: t.__setitem__(name + ".scales", t[name + ".scales"][:, :1].copy()),
         (name + ".scales", "groups of 32")),
    ):
        bad = work / ("bad-" + label.replace(" ", "-"))
        shutil.copytree(q4, bad, dirs_exist_ok=True)
        for f in shards:
            t = load_file(str(f))
            if name + ".weight" in t:
                edit(t)
                save_file(t, str(bad / f.name), metadata={"format": "mlx"})
        rc, out, err = run_zaya(["generate", "--model", bad, "--ids", "--prompt", "1 2", "--dtype", "q4"])
        res.check(rc != 0 and all(n in err for n in needles), f"{label}: an error naming the tensor at load",
                  f"exit {rc}: {err.strip()[-300:]}")


def main():
    suite = Suite("quant_decode")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-quant-decode-") as work:
        suite.run("quant_decode", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
