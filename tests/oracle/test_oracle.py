#!/usr/bin/env python3
"""Oracle test: `zaya forward` against Hugging Face transformers' ZayaForCausalLM (float32, eager attention,
eager experts) on tiny randomised models. Checks logits, loss, every gradient (names and values) and the routing
of every token in every layer.

    python tests/oracle/test_oracle.py [--only cfg3,cfg7] [--keep DIR]

The last line is `oracle: N passed, N failed`; the exit status is non-zero if any check failed.
ZAYA_BIN overrides the binary (see harness.py; fake_zaya.py is an HF stand-in used to validate this script).
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya  # noqa: E402
import numpy as np  # noqa: E402

from common import (build_model, fmt, hf_reference, load_model, make_config, make_tokens, parse_loss,  # noqa: E402
                    rel_err, save_model, significant_digits, trainable_names)

TOL_LOGITS = 1e-5
TOL_LOSS = 1e-6
TOL_GRAD = 1e-4
# A gradient that is mathematically zero comes out as fp32 rounding noise (see the gradient check): errors are
# measured against max(|ref|, GRAD_FLOOR x the norm of all gradients), so TOL_GRAD allows 1e-7 of the whole
# gradient's norm in absolute terms, fp32's epsilon. cfg11's window-1 layer (each query sees only itself) has
# q/k gradients of exactly 0 in HF and 1.7e-8 of the norm here on AVX2 (P = exp(0) recomputed, D summed in
# another order than dP); with a floor of 1e-5 it passed only where that noise happened to cancel (AVX-512).
GRAD_FLOOR = 1e-3
# tests/gpu/run.sh points ZAYA_BIN at `forward --device cuda` and says so here
ON_GPU = os.environ.get("ZAYA_ORACLE_DEVICE") == "cuda"
if ON_GPU:
    # The GPU's bar for fp32 gradients is 1e-3 (issue 13, as tests/gpu/test_gpu_model.c): its reductions sum in
    # another order, and some gradients here are ill-conditioned. cfg4 (T = 2) makes layer 0's q/k gradients tiny
    # differences of nearly equal terms (dS = P (dP - D) with one or two keys): the GPU gave 3.7e-4 there (H200,
    # 2026-11-26), and the CPU path itself gives 8e-4 when only the order of its D = rowsum(dO * O) sum changes
    # (a 32-lane tree instead of a running sum); it passes at 1e-4 because its D and dP happen to sum alike.
    TOL_GRAD = 1e-3

# name, model shape, batch, token dtype, target skip fraction, save options
CONFIGS = [
    dict(name="cfg1", shape=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=8, num_experts=4, moe_intermediate_size=16, router_hidden_size=16,
                                 cca_time0=2, cca_time1=2, partial_rotary_factor=0.5, tie_word_embeddings=True,
                                 vocab_size=128),
         B=1, T=17, tok_dtype=np.int64, skip=0.25),
    dict(name="cfg2", shape=dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                                 head_dim=8, num_experts=5, moe_intermediate_size=24, router_hidden_size=24,
                                 cca_time0=3, cca_time1=2, partial_rotary_factor=1.0, tie_word_embeddings=False,
                                 vocab_size=200),
         B=3, T=17, tok_dtype=np.int32, skip=0.3),
    dict(name="cfg3", shape=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                 head_dim=8, num_experts=2, moe_intermediate_size=16, router_hidden_size=16,
                                 cca_time0=2, cca_time1=3, partial_rotary_factor=0.5, tie_word_embeddings=True,
                                 vocab_size=150, pad_token_id=5),
         B=3, T=3, tok_dtype=np.int32, skip=0.2),
    dict(name="cfg4", shape=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                 head_dim=8, num_experts=4, moe_intermediate_size=16, router_hidden_size=16,
                                 cca_time0=3, cca_time1=3, partial_rotary_factor=1.0, tie_word_embeddings=False,
                                 vocab_size=100, rope_theta=1e6),
         B=1, T=2, tok_dtype=np.int64, skip=0.0),
    dict(name="cfg5", shape=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                 head_dim=8, num_experts=4, moe_intermediate_size=16, router_hidden_size=16,
                                 cca_time0=2, cca_time1=2, partial_rotary_factor=0.5, tie_word_embeddings=True,
                                 vocab_size=128),
         B=3, T=1, tok_dtype=np.int64, skip=0.34),
    # odd Hkv (a value head straddles the current/delayed halves), Hq*dh != D, rotary dim 2, no pad token
    dict(name="cfg6", shape=dict(hidden_size=40, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                                 head_dim=8, num_experts=4, moe_intermediate_size=20, router_hidden_size=16,
                                 cca_time0=2, cca_time1=2, partial_rotary_factor=0.25, tie_word_embeddings=False,
                                 vocab_size=120, pad_token_id=None),
         B=3, T=17, tok_dtype=np.int32, skip=0.15),
    # the larger one: ZAYA1-like head layout, T=64, sharded checkpoint (model.safetensors.index.json)
    dict(name="cfg7", shape=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=16, num_experts=4, moe_intermediate_size=32, router_hidden_size=32,
                                 cca_time0=2, cca_time1=2, partial_rotary_factor=0.5, tie_word_embeddings=True,
                                 vocab_size=300, rope_theta=1e6),
         B=3, T=64, tok_dtype=np.int64, skip=0.25, shard="40KB"),
    # G=4 with wide heads, three layers, E=5, untied, everything at once
    dict(name="cfg9", shape=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                                 head_dim=32, num_experts=5, moe_intermediate_size=48, router_hidden_size=32,
                                 cca_time0=3, cca_time1=3, partial_rotary_factor=0.5, tie_word_embeddings=False,
                                 vocab_size=256, rope_theta=5e6),
         B=3, T=64, tok_dtype=np.int32, skip=0.35),
    # a single layer (no EDA at all), MQA with dh=16, full rotary, eps 1e-6
    dict(name="cfg8", shape=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 head_dim=16, num_experts=4, moe_intermediate_size=16, router_hidden_size=16,
                                 cca_time0=3, cca_time1=3, partial_rotary_factor=1.0, tie_word_embeddings=True,
                                 vocab_size=128, rms_norm_eps=1e-6),
         B=1, T=64, tok_dtype=np.int32, skip=0.1),
    # sliding-window layers ("hybrid_sliding": query t sees keys t-W+1..t, with rope_parameters["hybrid_sliding"])
    # a ZAYA1-74B-like alternation, windows far below T, the sliding RoPE's theta differing from the full layers'
    dict(name="cfg10", shape=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=8, num_experts=4, moe_intermediate_size=16, router_hidden_size=16,
                                  cca_time0=2, cca_time1=2, partial_rotary_factor=0.5, tie_word_embeddings=True,
                                  vocab_size=128, rope_theta=1e6, layer_types=["hybrid_sliding", "hybrid",
                                                                               "hybrid_sliding"],
                                  sliding_window=5, sliding_rope_theta=1e3),
         B=2, T=40, tok_dtype=np.int64, skip=0.25),
    # W = 1 (each query sees itself only); the sliding entry omits partial_rotary_factor (transformers: 1.0, so
    # the two layer types rotate different numbers of dims); untied
    dict(name="cfg11", shape=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=8, num_experts=3, moe_intermediate_size=16, router_hidden_size=16,
                                  cca_time0=2, cca_time1=2, partial_rotary_factor=0.5, tie_word_embeddings=False,
                                  vocab_size=100, layer_types=["hybrid", "hybrid_sliding"], sliding_window=1,
                                  sliding_rope_theta=1e4, sliding_partial_rotary_factor=None),
         B=3, T=17, tok_dtype=np.int32, skip=0.2),
    # several 64-key tiles: a window of 70 crossing tile boundaries, every layer sliding, GQA, G=2, dh=16
    dict(name="cfg12", shape=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=16, num_experts=4, moe_intermediate_size=32, router_hidden_size=32,
                                  cca_time0=2, cca_time1=2, partial_rotary_factor=0.5, tie_word_embeddings=True,
                                  vocab_size=300, rope_theta=5e6, layer_types=["hybrid_sliding", "hybrid_sliding"],
                                  sliding_window=70, sliding_rope_theta=1e4),
         B=2, T=150, tok_dtype=np.int64, skip=0.25),
    # a window of exactly one tile (64), MQA, odd conv kernels; and a window >= T (plain causal with the sliding
    # RoPE) in the second model
    dict(name="cfg13", shape=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                  head_dim=8, num_experts=4, moe_intermediate_size=16, router_hidden_size=16,
                                  cca_time0=3, cca_time1=2, partial_rotary_factor=1.0, tie_word_embeddings=True,
                                  vocab_size=128, layer_types=["hybrid_sliding", "hybrid"], sliding_window=64,
                                  sliding_rope_theta=2e3, sliding_partial_rotary_factor=0.5),
         B=2, T=130, tok_dtype=np.int32, skip=0.2),
    dict(name="cfg14", shape=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                                  head_dim=8, num_experts=4, moe_intermediate_size=16, router_hidden_size=16,
                                  cca_time0=2, cca_time1=2, partial_rotary_factor=0.5, tie_word_embeddings=False,
                                  vocab_size=120, layer_types=["hybrid", "hybrid_sliding"], sliding_window=4096,
                                  sliding_rope_theta=3e3),
         B=2, T=33, tok_dtype=np.int64, skip=0.15),
]


def describe(c):
    s = c["shape"]
    sliding = ""
    if s.get("layer_types"):
        sliding = " sliding=" + "".join("s" if t == "hybrid_sliding" else "f" for t in s["layer_types"]) + \
            f" W={s['sliding_window']}"
    return (f"B={c['B']} T={c['T']} L={s['num_hidden_layers']} Hq/Hkv={s['num_attention_heads']}/"
            f"{s['num_key_value_heads']} dh={s['head_dim']} E={s['num_experts']} "
            f"cca={s['cca_time0']},{s['cca_time1']} prf={s['partial_rotary_factor']} "
            f"{'tied' if s['tie_word_embeddings'] else 'untied'}{sliding}")


def run_config(c, work, res, seed):
    name = c["name"]
    (work / name).mkdir(parents=True, exist_ok=True)
    cfg = make_config(**c["shape"])
    B, T, V = c["B"], c["T"], cfg.vocab_size
    L = cfg.num_hidden_layers
    tokens = make_tokens(B, T, V, seed, pad_id=cfg.pad_token_id if cfg.pad_token_id is not None else 0)
    model = build_model(cfg, seed, tokens, c["skip"])
    mdir = work / name / "model"
    save_model(model, mdir, c.get("shard"))
    if c.get("shard"):
        assert (mdir / "model.safetensors.index.json").is_file(), "sharding did not happen"
    # the reference is computed on the model as loaded back from the files zaya reads
    ref_model = load_model(mdir)
    ref = hf_reference(ref_model, tokens)
    names = set(trainable_names(ref_model))
    label = f"{name} {describe(c)}"

    res.check(ref["consistent"], f"{name} hf-routing-selfcheck",
              "recomputing argmax(softmax(logits)+balancing_biases) did not reproduce the router's choice")

    tok_path = work / name / "tokens.npy"
    np.save(tok_path, tokens.astype(c["tok_dtype"]))
    lpath = work / name / "logits.npy"
    gpath = work / name / "grads.safetensors"
    t0 = time.time()
    rc, out, err = run_zaya(["forward", "--model", mdir, "--tokens", tok_path, "--logits-out", lpath,
                             "--grads-out", gpath])
    wall = time.time() - t0
    loss = parse_loss(out)
    ok_run = rc == 0 and loss is not None
    res.check(ok_run, f"{name} run", f"rc={rc} loss-line={'ok' if loss is not None else 'missing'}; "
              f"stdout tail: {out.strip()[-300:]!r} stderr tail: {err.strip()[-600:]!r}")
    if not ok_run:
        for chk in ("logits", "loss", "grad-names", "grads", "routing"):
            res.check(False, f"{name} {chk}", "zaya forward failed")
        print(f"FAIL {label}", flush=True)
        return

    worst = {}
    ok_all = True

    # logits
    try:
        lg = np.load(lpath)
        if lg.dtype != np.float32 or lg.shape != (B, T, V):
            raise ValueError(f"logits file dtype {lg.dtype} shape {lg.shape}, want float32 {(B, T, V)}")
        e = rel_err(lg, ref["logits"])
        worst["logits"] = e
        ok = res.check(e <= TOL_LOGITS, f"{name} logits", f"rel err {e:.3e} > {TOL_LOGITS}")
    except Exception as ex:  # noqa: BLE001
        ok = res.check(False, f"{name} logits", str(ex))
    ok_all &= ok

    # loss
    last = out.strip().splitlines()[-1].split()[1]
    if T > 1:
        e = abs(loss - ref["loss"]) / abs(ref["loss"])
        digits = significant_digits(last)
        ok = res.check(e <= TOL_LOSS and digits >= 9, f"{name} loss",
                       f"zaya {last} hf {ref['loss']!r} rel {e:.3e} (tol {TOL_LOSS}), {digits} significant digits")
    else:
        e = abs(loss)
        ok = res.check(loss == 0.0, f"{name} loss", f"T=1 must print loss 0, got {last}")
    worst["loss"] = e
    ok_all &= ok

    # gradients
    try:
        from safetensors.numpy import load_file
        gz = load_file(str(gpath))
    except Exception as ex:  # noqa: BLE001
        gz = None
        res.check(False, f"{name} grad-names", f"cannot read {gpath}: {ex}")
        res.check(False, f"{name} grads", "no gradient file")
        ok_all = False
    worst_g = (0.0, "-")
    if gz is not None:
        gnames = {k for k in gz if not k.startswith("routing.")}
        missing = sorted(names - gnames)
        extra = sorted(gnames - names)
        bad_meta = [f"{k}: {gz[k].dtype}{list(gz[k].shape)} want float32{list(ref['grads'][k].shape)}"
                    for k in sorted(names & gnames)
                    if gz[k].dtype != np.float32 or gz[k].shape != ref["grads"][k].shape]
        ok = res.check(not missing and not extra and not bad_meta, f"{name} grad-names",
                       f"missing {missing} extra {extra} bad dtype/shape {bad_meta}")
        ok_all &= ok
        # A gradient that is mathematically zero (e.g. q/k of a sequence whose only query sees one key) is 0 in
        # HF but may come out as rounding noise elsewhere: the denominator has a floor relative to the norm of
        # all gradients together (0 when every gradient is 0, as for T = 1: then zaya must give exact zeros).
        gnorm = float(np.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in ref["grads"].values())))
        tiny = max(GRAD_FLOOR * gnorm, 1e-30)
        errs = []
        for k in sorted(names & gnames):
            if gz[k].shape != ref["grads"][k].shape:
                errs.append((float("inf"), k))
                continue
            errs.append((rel_err(gz[k], ref["grads"][k], tiny), k))
        errs.sort(key=lambda x: -x[0])
        if errs:
            worst_g = errs[0]
        bad = [(k, v) for v, k in errs if not v <= TOL_GRAD]
        ok = res.check(bool(errs) and not bad, f"{name} grads",
                       f"{len(bad)} gradients over {TOL_GRAD}: " + ", ".join(f"{k} {v:.2e}" for k, v in bad[:8]))
        ok_all &= ok

        # routing
        problems = []
        for l in range(L):
            key = f"routing.layer{l}"
            if key not in gz:
                problems.append(f"{key} missing")
                continue
            r = gz[key]
            if r.dtype != np.int32 or r.shape != (B, T):
                problems.append(f"{key} dtype {r.dtype} shape {r.shape}, want int32 {(B, T)}")
                continue
            diff = np.argwhere(r != ref["routing"][l])
            if len(diff):
                b, t = diff[0]
                problems.append(f"layer {l}: {len(diff)} tokens differ, first (b={b}, t={t}) zaya "
                                f"{r[b, t]} hf {ref['routing'][l][b, t]} (hf min margin {ref['margin'][l]:.1e})")
        extra_r = sorted(k for k in gz if k.startswith("routing.") and k not in {f"routing.layer{l}" for l in range(L)})
        if extra_r:
            problems.append(f"unexpected {extra_r}")
        ok = res.check(not problems, f"{name} routing", "; ".join(problems))
        ok_all &= ok

    skip = float(np.mean(ref["skip"]))
    print(f"{'ok  ' if ok_all else 'FAIL'} {label} logits {fmt(worst.get('logits', float('nan')))} "
          f"loss {fmt(worst.get('loss', float('nan')))} grad {fmt(worst_g[0])} ({worst_g[1]}) "
          f"skip {skip:.2f} [{' '.join(f'{s:.2f}' for s in ref['skip'])}] margin {min(ref['margin']):.1e} "
          f"zaya {wall:.2f}s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1234)
    suite = Suite("oracle")
    a = suite.parse_args(ap, parts="config names", keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya_oracle_") as work:
        for c in CONFIGS:
            suite.run(c["name"], run_config, c, work, suite, a.seed + 101 * int(c['name'][3:]))
    suite.finish()


if __name__ == "__main__":
    main()
