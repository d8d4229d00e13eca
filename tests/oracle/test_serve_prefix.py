#!/usr/bin/env python3
"""`zaya serve`'s automatic prefix caching, on the small random model test_serve.py builds: one server with the cache
(the default), one with `--no-prefix-cache`, one with the cache and a KV pool so small that it must evict.

- the same requests give the same results token for token on all three (greedy text, tokens and top-logprob
  tokens; every logprob within 1e-4, the rounding that another prefill chunking gives too): prompts sharing 0, 1 and several blocks with a cached one, a prompt equal to a cached prompt and one
  equal to a cached prefix, n = 3 sampled choices with a seed, an echo request (lm-eval's) after its prompt is
  cached, streamed and not;
- the counters in /metrics move as they should: lookups, hits, the tokens reused (whole blocks only, never the
  last prompt token) and the prompt tokens computed; cached blocks stay after the requests end, and with the small
  pool the cache gives blocks back (evictions) instead of making a request wait or fail;
- `--no-prefix-cache` turns it off (no lookups, every prompt token computed) and the start-up line says which.

    python tests/oracle/test_serve_prefix.py [--keep DIR]

The last line is `serve_prefix: N passed, N failed`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite  # noqa: E402
from test_serve import Server, make_model  # noqa: E402

BT = 4  # --block-tokens of every server here
COMMON = ["--max-batch", 6, "--max-context", 64, "--block-tokens", BT, "--prefill-chunk", 5]
# The small pool: 24 blocks of 4 tokens (fp32 k and v, 2 layers x 2 x 32 channels x 4 bytes = 512 bytes a token,
# and the CCA state each block keeps: 2 layers x (2 x 96 conv columns + 16 delayed values) x 4 bytes = 1664);
# a request holds up to 9, and each leaves about 8 cached, so from the third request on blocks come from evictions.
SMALL_POOL = ["--kv-memory", 24 * (BT * 512 + 1664), "--kv-dtype", "f32"]
MAX_TOKENS = 6


def prompts():
    """(label, token ids, tokens the cache should give it), in the order they are sent to a fresh server."""
    base = [(7 * t + 11) % 300 + 20 for t in range(40)]
    other = [(13 * t + 5) % 300 + 20 for t in range(40)]
    tail = [(5 * t + 3) % 300 + 20 for t in range(40)]
    return [
        ("cold", base[:30], 0),
        ("shares 0 blocks (first token differs)", other[:30], 0),
        ("shares 1 block", base[:5] + tail[:20], 4),
        ("shares several blocks", base[:22] + tail[:10], 20),
        ("equal to a cached prompt", base[:30], 28),  # the last token is always computed
        ("equal to a cached prefix", base[:20], 16),
        ("shares 3 blocks, ends mid-block", base[:13] + tail[:6], 12),
    ]


def metrics_of(srv):
    m = srv.metrics()
    keys = ["queries_total", "hits_total", "hit_tokens_total", "evictions_total", "blocks"]
    out = {k: m.get("zaya_prefix_cache_" + k) for k in keys}
    out["prefill"] = m.get("zaya_prefill_tokens_total")
    out["used"] = m.get("zaya_kv_blocks_used")
    return out


def complete(srv, name, ids, stream=False, **kw):
    """Every choice's (text, tokens, logprobs, top logprobs) of one request."""
    body = dict(model=name, prompt=ids, max_tokens=MAX_TOKENS, temperature=0, logprobs=3)
    body.update(kw)
    r = srv.client().completions.create(stream=stream, **body)
    if stream:
        got = {}
        for chunk in r:
            for c in chunk.choices:
                g = got.setdefault(c.index, ["", [], [], []])
                g[0] += c.text
                if c.logprobs:
                    g[1] += c.logprobs.tokens
                    g[2] += c.logprobs.token_logprobs
                    g[3] += c.logprobs.top_logprobs
        return [tuple(got[i]) for i in sorted(got)]
    return [(c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs)
            for c in sorted(r.choices, key=lambda c: c.index)]


def difference(got, want):
    """None when the choices have the same text, tokens and top-logprob tokens; else what differs. Also the largest
    difference of a log-probability (the echo's first is None on both sides)."""
    if len(got) != len(want):
        return f"{len(got)} choices vs {len(want)}", 0.0
    worst = 0.0
    for (text, toks, lps, tops), (text2, toks2, lps2, tops2) in zip(got, want):
        if (text, toks) != (text2, toks2):
            return f"text {text!r} tokens {toks} vs {text2!r} {toks2}", 0.0
        if [sorted(t or {}) for t in tops] != [sorted(t or {}) for t in tops2]:
            return f"top logprobs {tops} vs {tops2}", 0.0
        for a, b in zip(lps, lps2):
            worst = max(worst, abs(a - b)) if a is not None and b is not None else worst
        for t, t2 in zip(tops, tops2):
            for k in (t or {}):
                worst = max(worst, abs(t[k] - t2[k]))
    return None, worst


def run_all(srv, name, res, label, expect_counts):
    """Sends every request in order; checks the counters after each where expect_counts. Returns the results."""
    out = []
    for i, (what, ids, reused) in enumerate(prompts()):
        before = metrics_of(srv)
        out.append((what, complete(srv, name, ids, stream=i % 2 == 1)))
        after = metrics_of(srv)
        if expect_counts == "cache":
            d = {k: after[k] - before[k] for k in ("queries_total", "hits_total", "hit_tokens_total", "prefill")}
            want = {"queries_total": 1, "hits_total": int(reused > 0), "hit_tokens_total": reused,
                    "prefill": len(ids) - reused}
            res.check(d == want, f"{label}: {what}: counters", f"moved {d}, want {want}")
        elif expect_counts == "none":
            ok = after["queries_total"] == 0 and after["prefill"] - before["prefill"] == len(ids)
            res.check(ok, f"{label}: {what}: no lookup, every prompt token computed", str(after))
    # n = 3 sampled choices of a cached prompt: the first prefills (from the cache), the others fork it
    ids = prompts()[0][1]
    out.append(("n=3 sampled", complete(srv, name, ids, n=3, seed=11, temperature=1.0)))
    # echo: the prompt's log-probabilities need every row's logits, so it never takes cached blocks
    before = metrics_of(srv)
    out.append(("echo", complete(srv, name, ids, echo=True)))
    after = metrics_of(srv)
    res.check(after["queries_total"] == before["queries_total"] and
              after["prefill"] - before["prefill"] == len(ids), f"{label}: an echo request computes its prompt",
              f"{before} -> {after}")
    return out


def checks(res, work):
    mdir = make_model(work)
    name = mdir.name
    results, lines = {}, {}
    for label, extra, counts in (("no cache", ["--no-prefix-cache"], "none"), ("cache", [], "cache"),
                                 ("small pool", SMALL_POOL, None)):
        srv = Server(mdir, *COMMON, *extra)
        try:
            results[label] = run_all(srv, name, res, label, counts)
            m = metrics_of(srv)
            if label == "cache":
                res.check(m["blocks"] > 0 and m["used"] == 0, "cache: cached blocks stay, none held, after the "
                          "requests end", str(m))
                res.check(m["evictions_total"] == 0, "cache: a large pool evicts nothing", str(m))
            if label == "small pool":
                res.check(m["evictions_total"] > 0 and m["hits_total"] > 0,
                          "small pool: blocks given back (evictions) and still hits", str(m))
                res.check(m["used"] == 0, "small pool: nothing held after the requests end", str(m))
            if label == "no cache":
                res.check(m["blocks"] == 0 and m["hits_total"] == 0, "no cache: nothing cached", str(m))
        finally:
            srv.stop()
            lines[label] = srv.proc.stderr.read()
    res.check("prefix cache off (--no-prefix-cache)" in lines["no cache"], "--no-prefix-cache: the start-up line "
              "says off", lines["no cache"][-300:])
    res.check("prefix cache on" in lines["cache"], "the start-up line says the cache is on", lines["cache"][-300:])
    ref = results["no cache"]
    worst_all = 0.0
    for label in ("cache", "small pool"):
        for (what, got), (_, want) in zip(results[label], ref):
            diff, worst = difference(got, want)
            # the prefill runs in other chunks from a reused block on (prefill chunks start at its end): the rows
            # grouped differently in the products round differently, as another --prefill-chunk does (the uncached
            # server with chunks of 3 instead of 5: up to 1.7e-5 on these requests); a wrong state or block is off
            # by 0.1 and more (tests/unit/test_decode.c has the bit-for-bit check with the same chunks)
            res.check(diff is None and worst < 1e-4, f"{label}: {what}: the uncached server's text and tokens, "
                      f"logprobs within 1e-4", diff or f"largest logprob difference {worst:.3g}")
            worst_all = max(worst_all, worst)
    print(f"largest logprob difference from the uncached server: {worst_all:.3g}")
    # the cases are what they say: the n = 3 choices differ from each other (sampling ran) and the greedy outputs
    # are not all the same text
    n3 = dict(ref)["n=3 sampled"]
    res.check(len(n3) == 3 and len({c[0] for c in n3}) > 1, "n=3: three different samples", str(n3)[:300])


def main():
    suite = Suite("serve_prefix")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-serve-prefix-") as work:
        suite.run("serve_prefix", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
