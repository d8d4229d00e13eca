#!/usr/bin/env python3
"""`zaya quantize` against mlx.core.quantize (the layout mlx-lm writes; `pip install "mlx[cpu]"`).

 (a) codes, scales and biases equal mlx.core.quantize's, bit for bit, for bf16, f16 and f32 sources, 8 and 4 bits,
     groups of 32, 64 and 128 (experts' 3-D stacks included); every other tensor unchanged; config.json's
     "quantization" as mlx-lm writes it; sharded output with an index.
 (b) a folder mlx wrote (mx.quantize + mx.save_safetensors, mlx-lm's names) loads: `zaya forward` gives the same
     logits as on zaya's own quantized folder, and as on mlx's dequantized weights (fp32 scales: s*q + b exactly).
 (e) `--method mse` folders (the default at 4 bits; (a) runs 4 bits with --method mlx, 8 bits by default): mlx's
     mx.dequantize gives zaya's values, each matrix's error at most mx.quantize's.
 (c) bad input is an error naming the tensor: a truncated weight, a mismatched scales shape, missing biases, a
     group size that does not divide a width, bits 3; and a quantized folder refuses convert, ckpt export, train.

    python tests/oracle/test_quant_mlx.py [--keep DIR] [--only PARTS]

The last line is `quant_mlx: N passed, N failed`; the exit status is non-zero if any check failed.
"""
import json
import shutil
from pathlib import Path

from harness import Suite, run_zaya
import numpy as np

suite = Suite("quant_mlx")
try:
    import mlx.core as mx
    import mlx.nn as mlx_nn
    from mlx.utils import tree_flatten
except ImportError:
    mx = None
    suite.check(False, "mlx", 'not installed (pip install "mlx[cpu]"; scripts/install-deps.sh does)')
    suite.finish()


def config(**over):
    """A small ZAYA1 config whose every matrix width is a multiple of 128 except where a test wants otherwise."""
    c = {"model_type": "zaya", "architectures": ["ZayaForCausalLM"], "vocab_size": 256, "hidden_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "moe_intermediate_size": 128, "num_experts": 3, "num_experts_per_tok": 1, "router_hidden_size": 128,
         "cca_time0": 2, "cca_time1": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
         "max_position_embeddings": 256, "initializer_range": 0.2,
         "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
         "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    c.update(over)
    return c


def base_name(name):
    return name[: -len(".weight")] if name.endswith(".weight") else name


def quantized(name, arr):
    """The tensors zaya quantizes: every matrix a product reads (not the convolution kernels, not vectors)."""
    return arr.ndim >= 2 and ".conv_qk_" not in name


def bits_of(a):
    """An mlx array's raw bits as numpy (bf16 has no numpy dtype)."""
    size = {mx.uint32: mx.uint32, mx.float32: mx.uint32, mx.bfloat16: mx.uint16, mx.float16: mx.uint16}[a.dtype]
    return np.array(a.view(size))


def load_dir(d):
    out = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        out.update(mx.load(str(f)))
    return out


def zaya_ok(args, label):
    rc, out, err = run_zaya(args)
    suite.check(rc == 0, label, err.strip()[-400:])
    return rc == 0, out


def zaya_fails(args, label, *needles):
    rc, out, err = run_zaya(args)
    ok = rc != 0 and all(n in err for n in needles)
    suite.check(ok, label, f"exit {rc}, stderr: {err.strip()[-400:]} (wanted {needles})")


def logits_of(model, tokens, out, label):
    ok, _ = zaya_ok(["forward", "--model", model, "--tokens", tokens, "--logits-out", out], label)
    return np.load(out) if ok else None


def sources(work):
    """A bf16 and an f32 model from zaya init, and an f16 one (the f32 values rounded by mlx)."""
    (work / "cfg.json").write_text(json.dumps(config()))
    for dt in ("f32", "bf16"):
        zaya_ok(["init", "--config", work / "cfg.json", "--out", work / dt, "--dtype", dt, "--seed", "5"], f"init {dt}")
    (work / "f16").mkdir(exist_ok=True)
    shutil.copy(work / "f32" / "config.json", work / "f16" / "config.json")
    src32 = load_dir(work / "f32")
    mx.save_safetensors(str(work / "f16" / "model.safetensors"),
                        {k: (v.astype(mx.float16) if quantized(k, v) or "norm" in k else v) for k, v in src32.items()},
                        metadata={"format": "pt"})


def class_of(name):
    """io/quant_plan.c's classes of matrices"""
    if ".self_attn." in name:
        return "attention"
    if ".mlp.gate." in name:
        return "router"
    return "experts" if ".mlp." in name else "embedding"


def planned_format(name, bits, g, extra):
    """(bits, group size) zaya quantize gives a matrix, None if it stays unquantized: mlx-lm's quant_predicate for MoE
    models (qwen3_moe.py: "mlp.gate" -> {"group_size": 64, "bits": 8}) keeps the router at 8 bits by default."""
    opts = dict(zip(extra[::2], extra[1::2]))
    if class_of(name) in opts.get("--keep-float", "").split(","):
        return None
    if class_of(name) == "router" and int(opts.get("--router-bits", 8)) != bits:
        return int(opts.get("--router-bits", 8)), 64
    return bits, g


def folder_name(src, bits, g, extra):
    return f"q-{src}-{bits}-{g}" + "".join("-" + str(x).replace(",", "+").lstrip("-") for x in extra)


QUANT_CASES = [("bf16", 4, 32, []), ("bf16", 4, 64, []), ("bf16", 8, 64, []), ("bf16", 8, 128, []),
               ("f32", 8, 32, []), ("f32", 4, 128, []), ("f16", 4, 64, []), ("f16", 8, 32, []),
               ("bf16", 4, 32, ["--router-bits", "4"]), ("f32", 4, 64, ["--keep-float", "embedding,attention"])]


def against_mx_quantize(work):
    """(a) every code, scale and bias equal mx.quantize's, each matrix in its planned format"""
    for src, bits, g, extra in QUANT_CASES:
        out = work / folder_name(src, bits, g, extra)
        shard = ["--shard-size", "0.1"] if (bits, g) == (8, 128) else []
        label = f"{src} {bits}-bit g{g}{' ' + ' '.join(extra) if extra else ''}"
        method = ["--method", "mlx"] if bits == 4 else []  # 8 bits: mlx's rule is the default
        if not zaya_ok(["quantize", "--model", work / src, "--out", out, "--bits", bits, "--group-size", g] + method
                       + shard + extra, f"quantize {label}")[0]:
            continue
        source, got = load_dir(work / src), load_dir(out)
        bad, n_q, own = [], 0, {}
        for name, w in source.items():
            fmt = planned_format(name, bits, g, extra) if quantized(name, w) else None
            if fmt is None:
                if name not in got or not np.array_equal(bits_of(got[name]), bits_of(w)) or got[name].dtype != w.dtype:
                    bad.append(f"{name} changed")
                if base_name(name) + ".scales" in got:
                    bad.append(f"{name} quantized, planned unquantized")
                if quantized(name, w):
                    own[base_name(name)] = False
                continue
            n_q += 1
            if fmt != (bits, g):
                own[base_name(name)] = {"group_size": fmt[1], "bits": fmt[0]}
            q, s, b = mx.quantize(w, group_size=fmt[1], bits=fmt[0])
            base = base_name(name)
            for key, want in ((name, q), (base + ".scales", s), (base + ".biases", b)):
                have = got.get(key)
                if have is None or have.dtype != want.dtype or have.shape != want.shape:
                    bad.append(f"{key}: {None if have is None else (have.dtype, have.shape)} vs {(want.dtype, want.shape)}")
                elif not np.array_equal(bits_of(have), bits_of(want)):
                    diff = int((bits_of(have) != bits_of(want)).sum())
                    bad.append(f"{key}: {diff} of {want.size} values differ")
        suite.check(not bad and n_q > 0, f"{label}: {n_q} matrices equal mx.quantize's", "; ".join(bad[:4]))
        cfg = json.loads((out / "config.json").read_text())
        want_q = {"group_size": g, "bits": bits, "mode": "affine", **own}
        suite.check(cfg.get("quantization") == want_q and cfg.get("quantization_config") == want_q,
                    f"{label}: config.json quantization, mlx-lm's per-module entries ({len(own)})",
                    str(cfg.get("quantization"))[:400])
        if shard:
            index = json.loads((out / "model.safetensors.index.json").read_text())
            suite.check(len(set(index["weight_map"].values())) > 1 and set(index["weight_map"]) == set(got),
                        "sharded output: the index lists every tensor", str(len(index["weight_map"])))


def mlx_folder_loads(work, tokens):
    """(b) a folder mlx wrote loads, and runs on the same values as zaya's own"""
    src32 = load_dir(work / "f32")
    for bits, g in ((4, 64), (8, 32)):
        mine = work / f"q-f32-{bits}-{g}-uniform"
        zaya_ok(["quantize", "--model", work / "f32", "--out", mine, "--bits", bits, "--group-size", g, "--router-bits",
                 bits, "--method", "mlx"], f"quantize f32 {bits}-bit g{g}, the router too")
        theirs, deq = work / f"mlx-{bits}-{g}", work / f"mlx-deq-{bits}-{g}"
        theirs.mkdir(exist_ok=True), deq.mkdir(exist_ok=True)
        tensors, dense = {}, {}
        for name, w in src32.items():
            if quantized(name, w):
                q, s, b = mx.quantize(w, group_size=g, bits=bits)
                tensors[name], tensors[base_name(name) + ".scales"], tensors[base_name(name) + ".biases"] = q, s, b
                dense[name] = mx.dequantize(q, s, b, group_size=g, bits=bits)
            else:
                tensors[name] = dense[name] = w
        mx.save_safetensors(str(theirs / "model.safetensors"), tensors, metadata={"format": "mlx"})
        mx.save_safetensors(str(deq / "model.safetensors"), dense, metadata={"format": "pt"})
        cfg = json.loads((work / "f32" / "config.json").read_text())
        shutil.copy(work / "f32" / "config.json", deq / "config.json")
        cfg["quantization"] = cfg["quantization_config"] = {"group_size": g, "bits": bits}
        (theirs / "config.json").write_text(json.dumps(cfg))
        a = logits_of(str(theirs), tokens, work / "a.npy", f"forward on mlx's {bits}-bit folder")
        b = logits_of(str(mine), tokens, work / "b.npy", f"forward on zaya's {bits}-bit folder")
        c = logits_of(str(deq), tokens, work / "c.npy", f"forward on mlx's dequantized {bits}-bit weights")
        if a is not None and b is not None and c is not None:
            suite.check(np.array_equal(a, b), f"{bits}-bit: mlx's folder and zaya's give the same logits",
                        f"max diff {np.abs(a - b).max():.3g}")
            suite.check(np.array_equal(a, c), f"{bits}-bit: the same logits as mlx's dequantized weights",
                        f"max diff {np.abs(a - c).max():.3g}")
            full = logits_of(str(work / "f32"), tokens, work / "d.npy", "forward on the fp32 model")
            if full is not None:  # a random model: for the record
                rel = np.linalg.norm(a - full) / np.linalg.norm(full)
                print(f"  {bits}-bit group {g}: logits differ from the fp32 model's by {rel:.3g} (normwise)")


def mse_folder(work, tokens):
    """(e) `--method mse` (least-squared-error scales and biases, src/kernels/quant_mse.c): mlx loads the folder, and
    mx.dequantize of its codes, scales and biases (widened to fp32, as zaya multiplies) gives zaya's values — `zaya
    forward` on the quantized folder and on a folder of those dequantized weights give the same logits; each matrix's
    squared error is at most mx.quantize's, and at 4 bits clearly less; the codes are not mx.quantize's."""
    for src, bits, g in (("f32", 4, 64), ("bf16", 4, 32), ("f32", 8, 32)):
        label = f"mse {src} {bits}-bit g{g}"
        mine, deq = work / f"mse-{src}-{bits}-{g}", work / f"mse-deq-{src}-{bits}-{g}"
        if not zaya_ok(["quantize", "--model", work / src, "--out", mine, "--bits", bits, "--group-size", g,
                        "--router-bits", bits, "--method", "mse"], f"quantize {label}")[0]:
            continue
        source, got = load_dir(work / src), load_dir(mine)
        deq.mkdir(exist_ok=True)
        dense, worse, err_mse, err_mlx, n_q, differ = {}, [], 0.0, 0.0, 0, 0
        for name, w in source.items():
            if not quantized(name, w):
                dense[name] = w.astype(mx.float32)
                continue
            n_q += 1
            base = base_name(name)
            q, s, b = got[name], got[base + ".scales"], got[base + ".biases"]
            y = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=g, bits=bits)
            dense[name] = y
            mq, ms, mb = mx.quantize(w, group_size=g, bits=bits)
            ym = mx.dequantize(mq, ms.astype(mx.float32), mb.astype(mx.float32), group_size=g, bits=bits)
            x = np.array(w.astype(mx.float32), dtype=np.float64)
            e, em = float(((x - np.array(y)) ** 2).sum()), float(((x - np.array(ym)) ** 2).sum())
            if e > em * (1 + 1e-9):
                worse.append(f"{name}: {e:.4g} > mx.quantize's {em:.4g}")
            err_mse, err_mlx = err_mse + e, err_mlx + em
            differ += int((np.array(q) != np.array(mq)).any())
        suite.check(not worse and n_q > 0, f"{label}: no matrix's squared error above mx.quantize's ({n_q} matrices, "
                    f"{err_mse / err_mlx:.3f} of it in all)", "; ".join(worse[:4]))
        if bits == 4:
            suite.check(err_mse < 0.9 * err_mlx, f"{label}: at 4 bits less than 0.9 of mx.quantize's error",
                        f"{err_mse:.4g} vs {err_mlx:.4g}")
        suite.check(differ > 0, f"{label}: the codes differ from mx.quantize's ({differ} of {n_q} matrices)", "")
        if bits == 4:  # mse is the default at 4 bits
            default = work / f"mse-default-{src}-{bits}-{g}"
            zaya_ok(["quantize", "--model", work / src, "--out", default, "--bits", bits, "--group-size", g,
                     "--router-bits", bits], f"quantize {src} {bits}-bit g{g} without --method")
            same = (default / "model.safetensors").exists() and \
                (default / "model.safetensors").read_bytes() == (mine / "model.safetensors").read_bytes()
            suite.check(same, f"{src} {bits}-bit g{g}: without --method, the same file as --method mse", "")
        mx.save_safetensors(str(deq / "model.safetensors"), dense, metadata={"format": "pt"})
        shutil.copy(work / src / "config.json", deq / "config.json")
        a = logits_of(str(mine), tokens, work / "a.npy", f"forward on zaya's {label} folder")
        c = logits_of(str(deq), tokens, work / "c.npy", f"forward on mlx's dequantized {label} weights")
        if a is not None and c is not None:
            suite.check(np.array_equal(a, c), f"{label}: the same logits as mx.dequantize's weights",
                        f"max diff {np.abs(a - c).max():.3g}")


class Stack(mlx_nn.Module):
    """An experts' stack [E, out, in] as mlx-lm's SwitchLinear holds it (weight; quantized: weight, scales, biases)."""

    def __init__(self, w):
        super().__init__()
        self.weight = w

    def to_quantized(self, group_size=64, bits=4, mode="affine", **_):
        q = Stack(None)
        q.weight, q.scales, q.biases = mx.quantize(self.weight, group_size=group_size, bits=bits)
        q.bits, q.group_size = bits, group_size
        return q


def mlx_skeleton(source):
    """An mlx.nn module tree with the source folder's tensors: nn.Embedding for the embedding, nn.Linear for the other
    matrices, Stack for the experts' stacks (named X.weight, as a port's sanitize() renames zaya's X), arrays for the
    rest (norms, convolution kernels, residual scales, balancing biases)."""
    root = {}
    for name, w in source.items():
        parts = name.split(".")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = w

    def build(path, d):
        w = d.get("weight")
        if w is not None and w.ndim == 2 and set(d) <= {"weight", "bias"} and ".conv_qk_" not in path:
            if path.endswith("embed_tokens"):
                m = mlx_nn.Embedding(*w.shape)
            else:
                m = mlx_nn.Linear(w.shape[1], w.shape[0], bias="bias" in d)
            m.update({k: v for k, v in d.items()})
            return m
        m = mlx_nn.Module()
        for k, v in d.items():
            if isinstance(v, dict):
                children = [build(f"{path}.{k}.{i}", v[str(i)]) for i in range(len(v))] if "0" in v else None
                setattr(m, k, children if children is not None else build(f"{path}.{k}", v))
            elif v.ndim == 3 and ".mlp.experts" in f"{path}.{k}":
                setattr(m, k, Stack(v))
            else:
                setattr(m, k, v)
        return m
    return build("", root)


def mlx_lm_loads(work):
    """(d) mlx loads zaya's folders as mlx-lm's load_model does: nn.quantize with its class_predicate (a path's own
    entry in config.json's "quantization" first, else quantized when it has .scales), then load_weights(strict=True),
    which fails on any tensor whose packed shape does not match the format the config gives its module"""
    for src, bits, g, extra in QUANT_CASES:
        if (bits, g) not in ((4, 32), (4, 64)):
            continue
        folder = work / folder_name(src, bits, g, extra)
        if not (folder / "config.json").exists():
            continue
        label = f"{src} {bits}-bit g{g}{' ' + ' '.join(extra) if extra else ''}"
        cfg = json.loads((folder / "config.json").read_text())
        weights = {(k + ".weight" if ".mlp.experts." in k and k.count(".") == 5 else k): v
                   for k, v in load_dir(folder).items()}
        model = mlx_skeleton(load_dir(work / src))

        def class_predicate(p, m):
            if p in cfg["quantization"]:
                return cfg["quantization"][p]
            if not hasattr(m, "to_quantized"):
                return False
            return f"{p}.scales" in weights
        try:
            mlx_nn.quantize(model, group_size=cfg["quantization"]["group_size"], bits=cfg["quantization"]["bits"],
                            class_predicate=class_predicate)
            model.load_weights(list(weights.items()), strict=True)
            ok, why = True, ""
        except (ValueError, KeyError) as e:
            ok, why = False, str(e)[:400]
        suite.check(ok, f"{label}: mlx loads it as mlx-lm does (nn.quantize per config.json, strict load)", why)
        if not ok:
            continue
        flat = dict(tree_flatten(model.leaf_modules(), is_leaf=mlx_nn.Module.is_module))
        got = {p: (m.bits, m.group_size) if hasattr(m, "scales") else None for p, m in flat.items()
               if isinstance(m, (mlx_nn.Linear, mlx_nn.QuantizedLinear, mlx_nn.Embedding, mlx_nn.QuantizedEmbedding,
                                 Stack))}
        want = {p: planned_format(p, bits, g, extra) for p in got}
        suite.check(got == want,
                    f"{label}: each module in its planned format ({sum(v is not None for v in got.values())} "
                    f"quantized, {sum(v == (8, 64) for v in got.values())} at 8 bits in groups of 64)",
                    str({p: (got[p], want[p]) for p in got if got[p] != want[p]})[:400])


def bad_input(work, tokens):
    """(c) bad input names the tensor; what cannot use a quantized folder says so, by name"""
    good = work / "mlx-4-64"
    name = "model.layers.1.self_attn.o_proj.weight"
    for label, edit, needles in (
        ("truncated weight", lambda t: t.__setitem__(name, t[name][:, :-1]), (name, "truncated")),
        ("mismatched scales shape", lambda t: t.__setitem__("model.layers.1.self_attn.o_proj.scales",
                                                           t["model.layers.1.self_attn.o_proj.scales"][:, :1]),
         ("model.layers.1.self_attn.o_proj.scales", "groups of 64")),
        ("missing biases", lambda t: t.pop("model.layers.0.mlp.experts.down_proj.biases"),
         ("model.layers.0.mlp.experts.down_proj.biases",)),
    ):
        bad = work / ("bad-" + label.replace(" ", "-"))
        bad.mkdir(exist_ok=True)
        shutil.copy(good / "config.json", bad / "config.json")
        t = dict(mx.load(str(good / "model.safetensors")))
        edit(t)
        mx.save_safetensors(str(bad / "model.safetensors"), t)
        zaya_fails(["forward", "--model", bad, "--tokens", tokens], f"{label}: an error naming the tensor", *needles)
    bad = work / "bad-bits"
    shutil.copytree(good, bad, dirs_exist_ok=True)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization"] = {"group_size": 64, "bits": 3}
    (bad / "config.json").write_text(json.dumps(cfg))
    zaya_fails(["forward", "--model", bad, "--tokens", tokens], "bits 3 in config.json", "3-bit", "quantization")
    zaya_fails(["quantize", "--model", work / "bf16", "--out", work / "x", "--bits", "3"], "quantize --bits 3", "3-bit")
    zaya_fails(["quantize", "--model", work / "bf16", "--out", work / "x", "--bits", "4", "--method", "fast"],
               "quantize --method fast", "--method", "mlx, mse or gptq", "fast")
    (work / "narrow.json").write_text(json.dumps(config(router_hidden_size=96)))
    zaya_ok(["init", "--config", work / "narrow.json", "--out", work / "narrow", "--dtype", "bf16"], "init narrow")
    zaya_fails(["quantize", "--model", work / "narrow", "--out", work / "x", "--bits", "4", "--group-size", "64"],
               "a group size not dividing a width", "model.layers.0.mlp.gate.router_mlp.fc1.weight", "width 96",
               "group size 64")
    zaya_fails(["convert", "--model", good, "--out", work / "x"], "convert refuses", "convert", "4-bit quantized")
    zaya_fails(["ckpt", "export", good, "--out", work / "x"], "ckpt export refuses", "ckpt export", "quantized")
    (work / "run.json").write_text(json.dumps({
        "init_from": str(good), "datasets": {"general": str(work)}, "batch_size": 2, "micro_batch": 2, "seed": 1,
        "phases": [{"name": "p", "tokens": 64, "seq_len": 16, "mixture": {"general": 1}}], "out_dir": str(work / "run")}))
    zaya_fails(["train", work / "run.json"], "train refuses", "train", "4-bit quantized")


def main():
    suite.parse_args(parts="sources, mx_quantize, mlx_folder, mlx_lm_load, bad_input, mse_folder", keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-quant-mlx.") as work:
        tokens = work / "tok.npy"
        np.save(tokens, np.random.RandomState(3).randint(0, 256, size=(2, 16)).astype(np.int32))
        suite.run("sources", sources, work)
        suite.run("mx_quantize", against_mx_quantize, work)
        suite.run("mlx_folder", mlx_folder_loads, work, tokens)
        suite.run("mlx_lm_load", mlx_lm_loads, work)
        suite.run("bad_input", bad_input, work, tokens)
        suite.run("mse_folder", mse_folder, work, tokens)
    suite.finish()


if __name__ == "__main__":
    main()
