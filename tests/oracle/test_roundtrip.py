#!/usr/bin/env python3
"""Round-trip and input-validation tests of `zaya init` / `zaya convert` / `zaya forward` against transformers.

 (a) zaya init -> transformers loads it cleanly -> save_pretrained -> zaya convert -> bit-identical tensors;
     init statistics against the spec; --seed determinism; convert of a sharded HF checkpoint.
 (b) zaya convert --dtype bf16 -> transformers loads it; values equal torch's bf16 rounding of the fp32 weights.
 (c) bad inputs make zaya forward exit non-zero with a message naming the offending field or file.
 Sliding-window layers: their config keys round-trip through (a); bad ones are among (c).

    python tests/oracle/test_roundtrip.py [--keep DIR]

The last line is `roundtrip: N passed, N failed`; the exit status is non-zero if any check failed.
"""
import json
import math
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import ZayaForCausalLM, build_model, load_model_tensors, make_config, make_tokens, save_model  # noqa: E402

INIT_STD = 0.02


def init_config(tied=True):
    """A small config.json in the HF layout the spec lists."""
    return {
        "model_type": "zaya",
        "architectures": ["ZayaForCausalLM"],
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "moe_intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 1,
        "router_hidden_size": 32,
        "cca_time0": 2,
        "cca_time1": 2,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 1024,
        "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def hf_load(d, dtype=torch.float32):
    m, info = ZayaForCausalLM.from_pretrained(str(d), output_loading_info=True, dtype=dtype)
    return m, info


def loading_problems(info):
    return {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
            if info.get(k)}


def bits_equal(a, b):
    """Bitwise equality of two torch tensors of the same dtype."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bfloat16:
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return np.array_equal(a.numpy().view(np.uint8), b.numpy().view(np.uint8))


def compare_tensor_sets(got, want):
    """Names missing/extra and the names whose tensors are not bit-identical."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    diff = sorted(k for k in set(got) & set(want) if not bits_equal(got[k], want[k]))
    return missing, extra, diff


def zaya_ok(res, label, args):
    rc, out, err = run_zaya(args)
    ok = res.check(rc == 0, label, f"rc={rc} stderr: {err.strip()[-800:]!r}")
    return ok


# ----------------------------------------------------------------------------------------------- (a)

def classify(name):
    if name.endswith("balancing_biases"):
        return "balancing"
    if name.endswith("qk_norm.temp"):
        return "temp"
    if name.endswith("norm.weight") or name.endswith("_scale"):
        return "one"
    if name.endswith(".bias") or name.endswith("_bias"):
        return "zero"
    return "matrix"


def check_init_stats(res, tensors, cfg, tag):
    bad = []
    pad = cfg.get("pad_token_id")
    E = cfg["num_experts"]
    for k, t in sorted(tensors.items()):
        if t.dtype != torch.float32:
            bad.append(f"{k}: dtype {t.dtype}")
            continue
        a = t.numpy().astype(np.float64)
        kind = classify(k)
        if kind == "one" and not np.all(a == 1.0):
            bad.append(f"{k}: expected all 1, got min {a.min():.4g} max {a.max():.4g}")
        elif kind == "zero" and not np.all(a == 0.0):
            bad.append(f"{k}: expected all 0, got absmax {np.abs(a).max():.4g}")
        elif kind == "temp" and not np.all(a == 1.0):
            bad.append(f"{k}: expected temperature 1.0 (spec [zaya] init), got {a.tolist()}")
        elif kind == "balancing":
            want = np.zeros(E + 1)
            want[E] = -1.0
            if a.shape != want.shape or not np.array_equal(a, want):
                bad.append(f"{k}: expected {want.tolist()}, got {a.tolist()}")
        elif kind == "matrix":
            if k == "model.embed_tokens.weight" and pad is not None:
                row = a[pad]
                print(f"  info [{tag}] embedding pad row {pad}: {'all zero' if not row.any() else 'random'} "
                      "(HF's nn.Embedding init zeroes it; the spec does not say)")
                a = np.delete(a, pad, axis=0)
            n = a.size
            std = a.std()
            mean = a.mean()
            tol_std = 5.0 / math.sqrt(2 * n) + 0.01
            tol_mean = 5.0 * INIT_STD / math.sqrt(n)
            if abs(std / INIT_STD - 1) > tol_std or abs(mean) > tol_mean:
                bad.append(f"{k}: std {std:.5f} mean {mean:.2e} (want std {INIT_STD} within {tol_std:.1%}, "
                           f"|mean| < {tol_mean:.1e}, n={n})")
    res.check(not bad, f"init-stats [{tag}]", "; ".join(bad[:12]) + (f" (+{len(bad) - 12} more)" if len(bad) > 12 else ""))


def part_a(res, work, tied):
    tag = "tied" if tied else "untied"
    cfg = init_config(tied)
    cpath = work / f"init_{tag}.json"
    cpath.write_text(json.dumps(cfg, indent=2))
    d1 = work / f"init_{tag}"
    if not zaya_ok(res, f"init [{tag}]", ["init", "--config", cpath, "--out", d1, "--seed", "7"]):
        return
    ok = res.check((d1 / "config.json").is_file() and (d1 / "model.safetensors").is_file(), f"init files [{tag}]",
                   f"{d1} holds {sorted(p.name for p in d1.iterdir())}")
    if not ok:
        return
    written = json.loads((d1 / "config.json").read_text())
    res.check(written.get("model_type") == "zaya", f"init config model_type [{tag}]",
              f"model_type {written.get('model_type')!r}")
    want_keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "router_hidden_size",
                 "cca_time0", "cca_time1", "rms_norm_eps", "tie_word_embeddings", "pad_token_id"]
    try:
        t1 = load_model_tensors(d1)
    except Exception as ex:  # noqa: BLE001
        res.check(False, f"init safetensors readable [{tag}]", repr(ex))
        return
    check_init_stats(res, t1, cfg, tag)

    # transformers loads it without complaint, with our config, and holds exactly the file's values
    try:
        m, info = hf_load(d1)
    except Exception as ex:  # noqa: BLE001
        res.check(False, f"hf load [{tag}]", repr(ex))
        return
    probs = loading_problems(info)
    res.check(not probs, f"hf load [{tag}]", str(probs))
    cdiff = [f"{k}: {getattr(m.config, k, None)!r} != {cfg[k]!r}" for k in want_keys if getattr(m.config, k, None) != cfg[k]]
    rp = m.config.rope_parameters.get("hybrid", {}) if isinstance(m.config.rope_parameters, dict) else {}
    if rp.get("rope_theta") != 10000.0 or rp.get("partial_rotary_factor") != 0.5:
        cdiff.append(f"rope_parameters {m.config.rope_parameters}")
    res.check(not cdiff, f"hf config [{tag}]", "; ".join(cdiff))
    sd = m.state_dict()
    vdiff = [k for k, v in t1.items() if k in sd and not bits_equal(sd[k].detach().contiguous(), v)]
    res.check(not vdiff, f"hf holds the file's values [{tag}]", f"differ: {vdiff[:8]}")
    with torch.no_grad():
        lg = m(input_ids=torch.tensor([[1, 5, 9, 0, 3]]), use_cache=False).logits
    res.check(bool(torch.isfinite(lg).all()), f"hf forward finite [{tag}]", "non-finite logits")

    # HF save -> zaya convert -> bit-identical to what zaya init wrote
    d2 = work / f"init_{tag}_hf"
    m.save_pretrained(str(d2), safe_serialization=True)
    d3 = work / f"init_{tag}_conv"
    if zaya_ok(res, f"convert f32 [{tag}]", ["convert", "--model", d2, "--out", d3]):
        try:
            t3 = load_model_tensors(d3)
            missing, extra, diff = compare_tensor_sets(t3, t1)
            res.check(not missing and not extra and not diff, f"convert f32 bit-identical [{tag}]",
                      f"missing {missing} extra {extra} differ {diff[:8]}")
            res.check((d3 / "model.safetensors").is_file() and (d3 / "config.json").is_file()
                      and json.loads((d3 / "config.json").read_text()).get("model_type") == "zaya",
                      f"convert output files [{tag}]", f"{sorted(p.name for p in d3.iterdir())}")
        except Exception as ex:  # noqa: BLE001
            res.check(False, f"convert f32 bit-identical [{tag}]", repr(ex))

    # --seed: same seed same weights, other seed other weights
    if tied:
        d4 = work / f"init_{tag}_again"
        d5 = work / f"init_{tag}_seed8"
        if zaya_ok(res, "init same seed", ["init", "--config", cpath, "--out", d4, "--seed", "7"]) and \
                zaya_ok(res, "init other seed", ["init", "--config", cpath, "--out", d5, "--seed", "8"]):
            t4, t5 = load_model_tensors(d4), load_model_tensors(d5)
            m4, x4, diff4 = compare_tensor_sets(t4, t1)
            res.check(not m4 and not x4 and not diff4, "init deterministic for a seed", f"differ {diff4[:6]}")
            same = [k for k in t1 if classify(k) == "matrix" and k in t5 and bits_equal(t5[k], t1[k])]
            res.check(not same, "init depends on the seed", f"identical for seeds 7 and 8: {same[:6]}")


def part_a_sliding(res, work):
    """Sliding-window layers survive zaya init -> transformers -> save_pretrained -> zaya convert: the layer types, the
    window and the sliding layers' RoPE entry (here rotating the whole head, unlike the full layers)."""
    cfg = init_config(True)
    cfg.update(num_hidden_layers=3, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"], sliding_window=7)
    cfg["rope_parameters"]["hybrid_sliding"] = {"rope_type": "default", "rope_theta": 1000.0,
                                                "partial_rotary_factor": 1.0}
    cpath = work / "init_sliding.json"
    cpath.write_text(json.dumps(cfg, indent=2))
    d1 = work / "init_sliding"
    if not zaya_ok(res, "init [sliding]", ["init", "--config", cpath, "--out", d1, "--seed", "3"]):
        return

    def sliding_keys(c):
        rp = c.get("rope_parameters") or {}
        return (list(c.get("layer_types") or []), c.get("sliding_window"), rp.get("hybrid_sliding"), rp.get("hybrid"))

    want = sliding_keys(cfg)
    got1 = sliding_keys(json.loads((d1 / "config.json").read_text()))
    res.check(got1 == want, "init config sliding keys", f"{got1} != {want}")
    try:
        m, info = hf_load(d1)
    except Exception as ex:  # noqa: BLE001
        res.check(False, "hf load [sliding]", repr(ex))
        return
    res.check(not loading_problems(info), "hf load [sliding]", str(loading_problems(info)))
    hf = (list(m.config.layer_types), m.config.sliding_window, m.config.rope_parameters.get("hybrid_sliding"),
          m.config.rope_parameters.get("hybrid"))
    res.check(hf == want, "hf config sliding keys", f"{hf} != {want}")
    layers = [layer.self_attn.sliding_window for layer in m.model.layers]
    res.check(layers == [7, None, 7], "hf sliding layers", f"per-layer windows {layers}")
    d2 = work / "init_sliding_hf"
    m.save_pretrained(str(d2), safe_serialization=True)
    d3 = work / "init_sliding_conv"
    if zaya_ok(res, "convert [sliding]", ["convert", "--model", d2, "--out", d3]):
        got3 = sliding_keys(json.loads((d3 / "config.json").read_text()))
        res.check(got3 == want, "convert config sliding keys", f"{got3} != {want}")
        missing, extra, diff = compare_tensor_sets(load_model_tensors(d3), load_model_tensors(d1))
        res.check(not missing and not extra and not diff, "convert bit-identical [sliding]",
                  f"missing {missing} extra {extra} differ {diff[:8]}")


def part_a_sharded(res, work):
    """convert reads the sharded (index.json) form and writes one model.safetensors with the same bits."""
    cfg = make_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      num_experts=4, moe_intermediate_size=16, router_hidden_size=16, tie_word_embeddings=False,
                      vocab_size=128)
    tok = make_tokens(2, 9, 128, 5)
    m = build_model(cfg, 5, tok, 0.2)
    d = work / "sharded"
    save_model(m, d, max_shard_size="20KB")
    want = load_model_tensors(d)
    d2 = work / "sharded_conv"
    if zaya_ok(res, "convert sharded", ["convert", "--model", d, "--out", d2]):
        try:
            got = load_model_tensors(d2)
            missing, extra, diff = compare_tensor_sets(got, want)
            res.check(not missing and not extra and not diff, "convert sharded bit-identical",
                      f"missing {missing} extra {extra} differ {diff[:8]}")
        except Exception as ex:  # noqa: BLE001
            res.check(False, "convert sharded bit-identical", repr(ex))


# ----------------------------------------------------------------------------------------------- (b)

def part_b(res, work):
    cfg = make_config(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                      num_experts=4, moe_intermediate_size=16, router_hidden_size=16, tie_word_embeddings=False,
                      vocab_size=160)
    tok = make_tokens(2, 9, 160, 11)
    m = build_model(cfg, 11, tok, 0.2)
    d = work / "bf16_src"
    save_model(m, d)
    f32 = load_model_tensors(d)
    d2 = work / "bf16_out"
    if not zaya_ok(res, "convert bf16", ["convert", "--model", d, "--out", d2, "--dtype", "bf16"]):
        return
    try:
        got = load_model_tensors(d2)
    except Exception as ex:  # noqa: BLE001
        res.check(False, "convert bf16 readable", repr(ex))
        return
    missing = sorted(set(f32) - set(got))
    extra = sorted(set(got) - set(f32))
    bad = []
    bb_note = set()
    for k in sorted(set(f32) & set(got)):
        want = f32[k].to(torch.bfloat16)
        g = got[k]
        if k.endswith("balancing_biases") and g.dtype == torch.float32:
            bb_note.add("float32")
            if not bits_equal(g, f32[k]):
                bad.append(f"{k} (kept float32 but changed)")
            continue
        if k.endswith("balancing_biases"):
            bb_note.add(str(g.dtype))
        if g.dtype != torch.bfloat16:
            bad.append(f"{k}: dtype {g.dtype}")
        elif not bits_equal(g, want):
            n = int((g.view(torch.int16) != want.view(torch.int16)).sum()) if g.shape == want.shape else -1
            bad.append(f"{k}: {n} values differ from torch's bf16 rounding")
    print(f"  info bf16: balancing_biases stored as {sorted(bb_note)}")
    res.check(not missing and not extra and not bad, "convert bf16 values",
              f"missing {missing} extra {extra} bad {bad[:8]}")
    # transformers loads the bf16 files
    try:
        mb, info = hf_load(d2, dtype=torch.bfloat16)
        probs = loading_problems(info)
        res.check(not probs, "hf load bf16", str(probs))
        sd = mb.state_dict()
        vdiff = [k for k, v in got.items() if k in sd and not bits_equal(sd[k].detach().contiguous(), v.to(sd[k].dtype))]
        res.check(not vdiff, "hf holds the bf16 file's values", f"differ: {vdiff[:8]}")
        cfgj = json.loads((d2 / "config.json").read_text())
        print(f"  info bf16 config.json: dtype={cfgj.get('dtype')!r} torch_dtype={cfgj.get('torch_dtype')!r}")
    except Exception as ex:  # noqa: BLE001
        res.check(False, "hf load bf16", repr(ex))


# ----------------------------------------------------------------------------------------------- (c)

def part_c(res, work):
    cfg = make_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      num_experts=4, moe_intermediate_size=16, router_hidden_size=16, tie_word_embeddings=True,
                      vocab_size=128)
    V = cfg.vocab_size
    tokens = make_tokens(2, 7, V, 3)
    m = build_model(cfg, 3, tokens, 0.2)
    base = work / "neg_base"
    save_model(m, base)
    good_tok = work / "neg_tokens.npy"
    np.save(good_tok, tokens)

    rc, out, err = run_zaya(["forward", "--model", base, "--tokens", good_tok])
    if not res.check(rc == 0, "negative: control (the unmodified model runs)",
                     f"rc={rc} stderr {err.strip()[-500:]!r} - the negative cases below mean little"):
        pass

    def variant(name, cfg_edit=None, tensor_edit=None, file_edit=None):
        d = work / f"neg_{name}"
        shutil.copytree(base, d)
        if cfg_edit:
            c = json.loads((d / "config.json").read_text())
            cfg_edit(c)
            (d / "config.json").write_text(json.dumps(c, indent=2))
        if tensor_edit:
            from safetensors.numpy import load_file, save_file
            t = load_file(str(d / "model.safetensors"))
            tensor_edit(t)
            save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
        if file_edit:
            file_edit(d)
        return d

    def tok_file(name, arr):
        p = work / f"neg_{name}.npy"
        np.save(p, arr)
        return p

    def truncate(d):
        p = d / "model.safetensors"
        b = p.read_bytes()
        p.write_bytes(b[: int(len(b) * 0.6)])

    def bad_header_len(d):
        p = d / "model.safetensors"
        b = bytearray(p.read_bytes())
        b[0:8] = (len(b) * 4).to_bytes(8, "little")
        p.write_bytes(bytes(b))

    def bad_json(d):
        (d / "config.json").write_text('{"model_type": "zaya", "hidden_size": 32,,, ')

    def shard_missing(d):
        # a sharded checkpoint whose index names a shard file that is not there
        (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
        from safetensors.numpy import load_file
        names = list(load_file(str(d / "model-00001-of-00002.safetensors")).keys())
        wm = {k: "model-00001-of-00002.safetensors" for k in names}
        wm["model.layers.1.mlp.gate.router_states_scale"] = "model-00002-of-00002.safetensors"
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))

    qname = "model.layers.1.self_attn.qkv_proj.q_proj.weight"
    rname = "model.layers.1.mlp.gate.router_states_scale"
    big = tokens.copy()
    big[1, 3] = V
    neg = tokens.copy()
    neg[0, 2] = -1
    cases = [
        ("config missing hidden_size", variant("nokey", cfg_edit=lambda c: c.pop("hidden_size")), good_tok,
         ["hidden_size"]),
        ("heads not divisible", variant("heads", cfg_edit=lambda c: c.update(num_key_value_heads=3)), good_tok,
         ["num_key_value_heads", "num_attention_heads"]),
        ("num_experts_per_tok 2", variant("topk", cfg_edit=lambda c: c.update(num_experts_per_tok=2)), good_tok,
         ["num_experts_per_tok"]),
        ("model_type llama", variant("mtype", cfg_edit=lambda c: c.update(model_type="llama")), good_tok,
         ["model_type"]),
        # HF config knobs that change the model: zaya must refuse them rather than silently ignore them
        ("attention_bias true", variant("abias", cfg_edit=lambda c: c.update(attention_bias=True)), good_tok,
         ["attention_bias"]),
        ("lm_head_bias true", variant("hbias", cfg_edit=lambda c: c.update(lm_head_bias=True)), good_tok,
         ["lm_head_bias"]),
        ("hidden_act gelu", variant("act", cfg_edit=lambda c: c.update(hidden_act="gelu")), good_tok,
         ["hidden_act"]),
        # sliding windows: a sliding layer without its RoPE entry (transformers cannot load that either), without a
        # window, a window of 0, and a layer type transformers does not know
        ("sliding layer, no rope_parameters.hybrid_sliding", variant("slide", cfg_edit=lambda c: c.update(
            layer_types=["hybrid", "hybrid_sliding"], sliding_window=4)), good_tok, ["hybrid_sliding"]),
        ("sliding layer, sliding_window null", variant("slidenull", cfg_edit=lambda c: (c.update(
            layer_types=["hybrid", "hybrid_sliding"], sliding_window=None), c["rope_parameters"].update(
            hybrid_sliding={"rope_type": "default", "rope_theta": 1e4}))), good_tok, ["sliding_window"]),
        ("sliding_window 0", variant("slide0", cfg_edit=lambda c: c.update(sliding_window=0)), good_tok,
         ["sliding_window"]),
        ("layer type sliding_attention", variant("slidename", cfg_edit=lambda c: c.update(
            layer_types=["hybrid", "sliding_attention"], sliding_window=4)), good_tok,
         ["layer_types[1]", "sliding_attention"]),
        ("rope_type linear", variant("rope", cfg_edit=lambda c: c["rope_parameters"]["hybrid"].update(
            rope_type="linear", factor=2.0)), good_tok, ["rope_type", "rope_parameters"]),
        ("config.json not JSON", variant("json", file_edit=bad_json), good_tok, ["config.json", "json"]),
        ("tensor of the wrong shape", variant("shape", tensor_edit=lambda t: t.update(
            {qname: np.ascontiguousarray(t[qname][:, :-1])})), good_tok, [qname, "q_proj"]),
        ("missing tensor", variant("missing", tensor_edit=lambda t: t.pop(rname)), good_tok,
         [rname, "router_states_scale"]),
        ("truncated safetensors", variant("trunc", file_edit=truncate), good_tok, ["model.safetensors"]),
        ("safetensors header length past EOF", variant("hdr", file_edit=bad_header_len), good_tok,
         ["model.safetensors"]),
        ("index names a missing shard", variant("shard", file_edit=shard_missing), good_tok,
         ["model-00002-of-00002.safetensors"]),
        ("model dir does not exist", work / "neg_no_such_dir", good_tok, ["neg_no_such_dir"]),
        ("token id >= vocab_size", base, tok_file("big", big), ["neg_big.npy", "token", "vocab"]),
        ("negative token id", base, tok_file("negid", neg), ["neg_negid.npy", "token"]),
        ("float tokens", base, tok_file("float", tokens.astype(np.float32)),
         ["neg_float.npy", "token", "dtype", "float", "<f4"]),
        ("3-D tokens", base, tok_file("3d", tokens.reshape(1, 2, 7)), ["neg_3d.npy", "token", "shape", "dim"]),
        ("tokens file missing", base, work / "neg_absent.npy", ["neg_absent.npy"]),
    ]
    for label, mdir, tpath, keywords in cases:
        rc, out, err = run_zaya(["forward", "--model", mdir, "--tokens", tpath], timeout=60)
        msg = err.strip()
        first = msg.splitlines()[-1] if msg else ""
        clean_exit = 0 < rc < 124  # not 0, not a signal (negative), not a timeout
        named = any(k.lower() in msg.lower() for k in keywords)
        print(f"  [{label}] rc={rc} stderr: {first[:200]!r}")
        res.check(clean_exit and msg != "" and named, f"negative: {label}",
                  f"rc={rc} (want 1..123), stderr {'empty' if not msg else repr(msg[-300:])}; "
                  f"should mention one of {keywords}")


def main():
    suite = Suite("roundtrip")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya_roundtrip_") as work:
        for title, fn in [("(a) init -> hf -> convert, tied", lambda: part_a(suite, work, True)),
                          ("(a) init -> hf -> convert, untied", lambda: part_a(suite, work, False)),
                          ("(a) convert a sharded checkpoint", lambda: part_a_sharded(suite, work)),
                          ("(a) sliding-window layers: init -> hf -> convert", lambda: part_a_sliding(suite, work)),
                          ("(b) convert --dtype bf16", lambda: part_b(suite, work)),
                          ("(c) bad inputs", lambda: part_c(suite, work))]:
            print(title, flush=True)
            n0 = suite.count
            suite.run(title, fn)
            print(f"  {suite.count - n0} checks", flush=True)
    suite.finish()


if __name__ == "__main__":
    main()
