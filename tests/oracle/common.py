"""The torch side of the zaya oracle suites (the reference is Hugging Face transformers' ZayaForCausalLM): tiny
randomised models, their saved folders, HF's forward and backward, comparisons. The runner and the zaya calls are
harness.py's (imported first: it sets the Hugging Face environment before transformers loads).
"""
import json
import math
from pathlib import Path

import harness  # noqa: F401  (first: the Hugging Face environment)
import numpy as np

import torch
import torch.nn.functional as F

import transformers
from transformers import ZayaConfig, ZayaForCausalLM

# The reference models are tiny: one thread is much faster than two contending ones (and deterministic).
torch.set_num_threads(1)
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()


# ----------------------------------------------------------------------------------------------
# zaya's output


def parse_loss(stdout):
    """The value of the last stdout line `loss <value>`; None when absent."""
    lines = [ln.strip() for ln in stdout.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    parts = lines[-1].split()
    if len(parts) != 2 or parts[0] != "loss":
        return None
    try:
        return float(parts[1])
    except ValueError:
        return None


def significant_digits(s):
    """Number of significant digits written in a decimal string such as 4.85203457 or 4.852e+00."""
    mant = s.lower().split("e")[0].lstrip("+-").replace(".", "").lstrip("0")
    return len(mant)


# ----------------------------------------------------------------------------------------------
# configs and models


_UNSET = object()


def make_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_experts=4, moe_intermediate_size=16, router_hidden_size=16, cca_time0=2, cca_time1=2,
                partial_rotary_factor=0.5, rope_theta=10000.0, tie_word_embeddings=True, vocab_size=128,
                pad_token_id=0, rms_norm_eps=1e-5, max_position_embeddings=512, layer_types=None, sliding_window=None,
                sliding_rope_theta=None, sliding_partial_rotary_factor=_UNSET, **extra):
    """A ZayaConfig. Sliding-window layers: layer_types with "hybrid_sliding" entries, sliding_window, and the
    sliding layers' RoPE entry rope_parameters["hybrid_sliding"] (written when sliding_rope_theta is given; its
    partial_rotary_factor left out when sliding_partial_rotary_factor is None, which transformers reads as 1.0)."""
    rope = {"hybrid": {"rope_type": "default", "rope_theta": float(rope_theta),
                       "partial_rotary_factor": float(partial_rotary_factor)}}
    if sliding_rope_theta is not None:
        rope["hybrid_sliding"] = {"rope_type": "default", "rope_theta": float(sliding_rope_theta)}
        if sliding_partial_rotary_factor is _UNSET:
            sliding_partial_rotary_factor = partial_rotary_factor
        if sliding_partial_rotary_factor is not None:
            rope["hybrid_sliding"]["partial_rotary_factor"] = float(sliding_partial_rotary_factor)
    if layer_types is not None:
        extra["layer_types"] = list(layer_types)
    if sliding_window is not None:
        extra["sliding_window"] = int(sliding_window)
    return ZayaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads, head_dim=head_dim,
        num_experts=num_experts, num_experts_per_tok=1, moe_intermediate_size=moe_intermediate_size,
        router_hidden_size=router_hidden_size, cca_time0=cca_time0, cca_time1=cca_time1,
        rope_parameters=rope,
        tie_word_embeddings=tie_word_embeddings, pad_token_id=pad_token_id, rms_norm_eps=rms_norm_eps,
        max_position_embeddings=max_position_embeddings, bos_token_id=2 if vocab_size > 2 else None,
        eos_token_id=1, architectures=["ZayaForCausalLM"], **extra)


def new_model(cfg, attn="eager", experts="eager"):
    return ZayaForCausalLM._from_config(cfg, attn_implementation=attn, experts_implementation=experts,
                                        dtype=torch.float32)


def load_model(model_dir, attn="eager", experts="eager", dtype=torch.float32):
    m = ZayaForCausalLM.from_pretrained(str(model_dir), attn_implementation=attn, experts_implementation=experts,
                                        dtype=dtype)
    m.eval()
    return m


# Randomisation rules: (name suffix, kind, parameter). Every parameter must match exactly one rule.
def _rules(cfg):
    D = cfg.hidden_size
    R = cfg.router_hidden_size
    I = cfg.moe_intermediate_size
    Cq = cfg.num_attention_heads * cfg.head_dim
    s = 1.0 / math.sqrt(D)
    return [
        ("model.embed_tokens.weight", "normal", s),
        ("lm_head.weight", "normal", s),
        ("model.input_hidden_states_scale", "uniform", (0.5, 1.5)),
        ("model.input_hidden_states_bias", "normal", 0.1),
        ("input_layernorm.weight", "uniform", (0.5, 1.5)),
        ("post_attention_layernorm.weight", "uniform", (0.5, 1.5)),
        ("model.norm.weight", "uniform", (0.5, 1.5)),
        ("router_mlp.norm.weight", "uniform", (0.5, 1.5)),
        ("hidden_states_scale", "uniform", (0.5, 1.5)),
        ("residual_scale", "uniform", (0.5, 1.5)),
        ("hidden_states_bias", "normal", 0.1),
        ("residual_bias", "normal", 0.1),
        ("qkv_proj.q_proj.weight", "normal", s),
        ("qkv_proj.k_proj.weight", "normal", s),
        ("qkv_proj.v_proj_current.weight", "normal", s),
        ("qkv_proj.v_proj_delayed.weight", "normal", s),
        ("conv_qk_depthwise.weight", "normal", 0.3),
        ("conv_qk_grouped.weight", "normal", 0.3),
        ("conv_qk_depthwise.bias", "normal", 0.1),
        ("conv_qk_grouped.bias", "normal", 0.1),
        ("qk_norm.temp", "uniform", (0.5, 2.0)),
        ("self_attn.o_proj.weight", "normal", 0.5 / math.sqrt(Cq)),
        ("mlp.gate.down_proj.weight", "normal", s),
        ("mlp.gate.down_proj.bias", "normal", 0.1),
        ("router_states_scale", "uniform", (0.5, 1.5)),
        ("router_mlp.fc1.weight", "normal", 1.0 / math.sqrt(R)),
        ("router_mlp.fc2.weight", "normal", 1.0 / math.sqrt(R)),
        ("router_mlp.fc1.bias", "normal", 0.1),
        ("router_mlp.fc2.bias", "normal", 0.1),
        ("router_mlp.out_proj.weight", "normal", 1.5 / math.sqrt(R)),
        ("experts.gate_up_proj", "normal", s),
        ("experts.down_proj", "normal", 0.5 / math.sqrt(I)),
    ]


@torch.no_grad()
def randomise(model, seed):
    """Give every trainable parameter a value that is far from its init (see _rules)."""
    g = torch.Generator().manual_seed(seed)
    rules = _rules(model.config)
    for name, p in model.named_parameters():
        hits = [r for r in rules if name == r[0] or name.endswith("." + r[0])]
        if len(hits) != 1:
            raise RuntimeError(f"randomise: parameter {name} matched {len(hits)} rules")
        _, kind, arg = hits[0]
        if kind == "normal":
            v = torch.randn(p.shape, generator=g, dtype=torch.float32) * arg
        else:
            lo, hi = arg
            v = lo + (hi - lo) * torch.rand(p.shape, generator=g, dtype=torch.float32)
        p.copy_(v)
    # the balancing biases get a neutral start; calibrate_routing() sets them
    for layer in model.model.layers:
        bb = layer.mlp.gate.balancing_biases
        bb.zero_()
        bb[-1] = -1.0


class RoutingRecorder:
    """Forward hooks on every ZayaRouter. For each call, recompute the chosen expert from the router's returned
    logits exactly as the router does (fp32 softmax, + balancing_biases, argmax) and check that it reproduces the
    router's own (masked) choice."""

    def __init__(self, model):
        self.model = model
        self.records = {}
        self.handles = []
        for l, layer in enumerate(model.model.layers):
            self.handles.append(layer.mlp.gate.register_forward_hook(self._hook(l)))

    def _hook(self, l):
        def hook(module, inputs, output):
            router_logits, router_probs, router_indices = output[0], output[1], output[2]
            with torch.no_grad():
                probs = torch.softmax(router_logits.detach().to(torch.float32), dim=-1)
                biased = probs + module.balancing_biases.to(torch.float32)
                choice = torch.argmax(biased, dim=-1)
                top2 = torch.topk(biased, 2, dim=-1).values
                margin = (top2[:, 0] - top2[:, 1]) if biased.shape[-1] > 1 else torch.full_like(top2[:, 0], 1.0)
                E = module.num_experts
                idx = router_indices.detach().reshape(-1)
                w = router_probs.detach().reshape(-1)
                skip = choice == E
                ok_real = bool(torch.equal(idx[~skip], choice[~skip]))
                ok_real = ok_real and bool(torch.equal(w[~skip], probs[~skip].gather(1, choice[~skip, None])[:, 0]))
                ok_skip = bool((idx[skip] == 0).all()) and bool((w[skip] == 0).all())
            self.records[l] = dict(choice=choice.clone(), probs=probs.clone(), margin=margin.clone(),
                                   consistent=ok_real and ok_skip, E=E)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


@torch.no_grad()
def calibrate_routing(model, tokens, skip_frac, seed, min_margin=2e-5, bias_std=0.05, tries=40):
    """Set the balancing biases layer by layer so that about skip_frac of this batch's tokens route to the skip
    expert. The skip expert's bias stays at -1.0: transformers' from_pretrained overwrites balancing_biases[-1]
    with -1.0 whatever the checkpoint holds, so a checkpoint with another skip bias would load differently in
    HF than in zaya. Instead the real experts get N(0, bias_std) + c with a common shift c chosen so that
    round(skip_frac * B*T) tokens skip (c = 0 for skip_frac <= 0). Retries until no token's top-1/top-2 biased
    probability gap is below min_margin (routing must not be decided by rounding). Layers only affect deeper
    ones, so calibrating in depth order is exact."""
    g = torch.Generator().manual_seed(seed + 7919)
    ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    rec = RoutingRecorder(model)
    try:
        for l, layer in enumerate(model.model.layers):
            bb = layer.mlp.gate.balancing_biases
            E = layer.mlp.gate.num_experts
            best = None
            for attempt in range(tries):
                real = torch.randn(E, generator=g) * bias_std
                bb[:E] = real
                bb[E] = -1.0
                model(input_ids=ids, use_cache=False)
                P = rec.records[l]["probs"]
                N = P.shape[0]
                # token i skips iff the shift c < s_i
                s = (P[:, E] - 1.0) - (P[:, :E] + real).max(dim=-1).values
                c = 0.0
                if skip_frac > 0 and N > 1:
                    k = min(max(int(round(skip_frac * N)), 1), N - 1)
                    srt = torch.sort(s).values
                    j0 = N - k
                    # the widest gap near the target count (preferring the target)
                    _, j = max((float(srt[j] - srt[j - 1]) / (1 + abs(j - j0)), j)
                               for j in range(max(1, j0 - 3), min(N, j0 + 4)))
                    c = float(0.5 * (srt[j] + srt[j - 1]))
                bb[:E] = real + c
                biased = P + bb
                t2 = torch.topk(biased, 2, dim=-1).values
                marg = float((t2[:, 0] - t2[:, 1]).min()) if N else 1.0
                if best is None or marg > best[0]:
                    best = (marg, bb.clone())
                if marg >= min_margin:
                    break
            bb.copy_(best[1])
    finally:
        rec.remove()


def routing_stats(records, L):
    skip = []
    margins = []
    for l in range(L):
        r = records[l]
        skip.append(float((r["choice"] == r["E"]).float().mean()) if r["choice"].numel() else 0.0)
        margins.append(float(r["margin"].min()) if r["margin"].numel() else float("inf"))
    return skip, margins


def build_model(cfg, seed, tokens, skip_frac=0.25):
    """A randomised float32 eager ZayaForCausalLM with balancing biases calibrated on `tokens`."""
    torch.manual_seed(seed)
    m = new_model(cfg)
    randomise(m, seed)
    m.eval()
    calibrate_routing(m, tokens, skip_frac, seed)
    return m


def save_model(model, out_dir, max_shard_size=None):
    out_dir = Path(out_dir)
    kw = {"safe_serialization": True}
    if max_shard_size:
        kw["max_shard_size"] = max_shard_size
    model.save_pretrained(str(out_dir), **kw)
    cfg = json.loads((out_dir / "config.json").read_text())
    if cfg.get("model_type") != "zaya":
        raise RuntimeError(f"{out_dir}/config.json has model_type {cfg.get('model_type')!r}")
    return cfg


def trainable_names(model):
    return [n for n, p in model.named_parameters() if p.requires_grad]


def hf_reference(model, tokens):
    """Forward + loss + backward on the HF model. Returns dict(logits [B,T,V] f32, loss float, grads {name: f32},
    routing [L x [B,T] int32], skip [L], margin [L], consistent bool)."""
    ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    B, T = ids.shape
    model.zero_grad(set_to_none=True)
    rec = RoutingRecorder(model)
    try:
        with torch.enable_grad():
            out = model(input_ids=ids, use_cache=False)
            logits = out.logits
            V = logits.shape[-1]
            if T > 1:
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
                loss.backward()
                loss_v = float(loss.detach())
            else:
                loss_v = 0.0
    finally:
        rec.remove()
    grads = {}
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        grads[n] = (p.grad.detach().to(torch.float32).numpy().copy() if p.grad is not None
                    else np.zeros(tuple(p.shape), np.float32))
    L = len(model.model.layers)
    skip, margin = routing_stats(rec.records, L)
    routing = [rec.records[l]["choice"].reshape(B, T).to(torch.int32).numpy() for l in range(L)]
    consistent = all(rec.records[l]["consistent"] for l in range(L))
    model.zero_grad(set_to_none=True)
    return dict(logits=logits.detach().to(torch.float32).numpy(), loss=loss_v, grads=grads, routing=routing,
                skip=skip, margin=margin, consistent=consistent)


# ----------------------------------------------------------------------------------------------
# comparisons and files


def rel_err(x, ref, tiny=1e-30):
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    d = np.linalg.norm((x - ref).ravel())
    n = np.linalg.norm(ref.ravel())
    if not np.isfinite(d):
        return float("inf")
    return float(d / max(n, tiny))


def make_tokens(B, T, V, seed, pad_id=0, pad_frac=0.12):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, V, size=(B, T), dtype=np.int64)
    if pad_id is not None and B * T > 1:
        mask = rng.random((B, T)) < pad_frac
        mask.flat[rng.integers(0, B * T)] = True  # at least one pad token
        t[mask] = pad_id
    return t


def save_npy(path, arr):
    np.save(str(path), arr)


def load_safetensors_np(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


def load_model_tensors(model_dir):
    """All tensors of a model dir (single file or sharded index) as torch tensors (keeps bf16)."""
    from safetensors.torch import load_file
    d = Path(model_dir)
    idx = d / "model.safetensors.index.json"
    if idx.is_file():
        files = sorted(set(json.loads(idx.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        for k, v in load_file(str(d / f)).items():
            if k in out:
                raise RuntimeError(f"{k} twice in {d}")
            out[k] = v
    return out


def fmt(x):
    return f"{x:.1e}" if isinstance(x, float) and np.isfinite(x) else str(x)
