#!/usr/bin/env python3
"""`zaya serve`'s vLLM-style features over HTTP (the official `openai` client and raw requests), on the small random
model test_serve.py builds:

- the request defects of issue 33: junk after the JSON body, raw invalid UTF-8, `temperature: 1e309`, a stop string
  holding U+FFFD (the byte 0xFF forced by logit_bias: each comes out as U+FFFD);
- echo + logprobs (lm-eval's request): the prompt's log-probabilities equal log_softmax of `zaya forward`'s logits,
  the first null, in the shapes vLLM and OpenAI's legacy API give (tokens, token_logprobs, top_logprobs,
  text_offset), with max_tokens 0 and 1, token-id and text prompts, batched, streamed;
- /tokenize and /detokenize against the HF tokenizer, GET /v1/models/{id};
- batched prompts (one choice per prompt, in order) and n choices per prompt (index = prompt n + j; choice j = one
  request with seed + j), streamed and not;
- min_p, presence/frequency/repetition penalties and logit_bias (greedy, against a step-by-step reference on
  `zaya forward`'s logits), stop_token_ids, skip_special_tokens, include_stop_str_in_output;
- --chat-template FILE for a model folder without a template (and a clear 400 without one).

    python tests/oracle/test_serve_api.py [--keep DIR]

The last line is `serve_api: N passed, N failed`.
"""
import http.client
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya  # noqa: E402
from test_serve import CHAT_TEMPLATE, Server, error_of, generate_text, make_model, stream_text  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402


def forward_logits(work, mdir, ids):
    """`zaya forward`'s logits [T, V] for one sequence."""
    tok = work / "fwd_tokens.npy"
    out = work / "fwd_logits.npy"
    np.save(tok, np.array([ids], dtype=np.int32))
    rc, _, err = run_zaya(["forward", "--model", mdir, "--tokens", tok, "--logits-out", out])
    if rc:
        raise RuntimeError(f"zaya forward failed: {err}")
    return np.load(out)[0].astype(np.float64)


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def raw_post(srv, path, body):
    """POST raw bytes (a body the client library would never send)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    payload = r.read()
    c.close()
    return r.status, payload


def check_echo(res, label, choice, want_ids, lsm, tok, n_gen):
    """One echoed choice against the forward's log-softmax lsm [T, V] of its prompt."""
    lp = choice["logprobs"]
    n = len(want_ids)
    ok = (len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) ==
          n + n_gen and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0)
    res.check(ok, f"{label}: shapes", json.dumps(lp)[:300])
    if not ok:
        return
    err = max(abs(lp["token_logprobs"][t] - lsm[t - 1, want_ids[t]]) for t in range(1, n))
    res.check(err < 1e-4, f"{label}: prompt logprobs = log_softmax of zaya forward", f"max error {err:.3g}")
    tops_ok = all(abs(max(lp["top_logprobs"][t].values()) - lsm[t - 1].max()) < 1e-4 for t in range(1, n))
    res.check(tops_ok, f"{label}: top_logprobs hold the most likely token", str(lp["top_logprobs"][:3]))
    texts = [tok.decode([i], skip_special_tokens=False) for i in want_ids]
    res.check(lp["tokens"][:n] == texts, f"{label}: tokens", f"{lp['tokens'][:5]} vs {texts[:5]}")
    offs = lp["text_offset"]
    res.check(all(offs[i + 1] - offs[i] == len(lp["tokens"][i]) for i in range(len(offs) - 1)),
              f"{label}: text_offset", str(offs[:8]))


def penalized_reference(work, mdir, prompt_ids, n_new, presence, frequency, repetition, bias, n_allowed):
    """Greedy decoding with vLLM's penalties, recomputed from `zaya forward` at every step."""
    ids, out = list(prompt_ids), []
    for _ in range(n_new):
        lg = forward_logits(work, mdir, ids)[-1][:n_allowed].copy()
        for t, b in bias.items():
            lg[int(t)] += b
        counts = {}
        for t in out:
            counts[t] = counts.get(t, 0) + 1
        for t in set(prompt_ids) | set(out):
            if repetition != 1:
                lg[t] = lg[t] / repetition if lg[t] > 0 else lg[t] * repetition
        for t, c in counts.items():
            lg[t] -= frequency * c + presence
        nxt = int(np.argmax(lg))
        out.append(nxt)
        ids.append(nxt)
    return out


def checks(res, work):
    """Every check, in order, on one model: the servers run one after another."""
    mdir = make_model(work)
    name = mdir.name
    tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
    V_tok = tok.get_vocab_size()
    ff = tok.token_to_id("ÿ")  # the byte-level token of the byte 0xFF
    bos = tok.token_to_id("<|bos|>")

    srv = Server(mdir, "--max-batch", 6, "--max-context", 256, "--block-tokens", 4, "--prefill-chunk", 5)
    try:
        cl = srv.client()
        base = {"model": name, "prompt": "hello", "max_tokens": 4}
        # ---- the defects
        st, payload = raw_post(srv, "/v1/completions", json.dumps(base).encode() + b"xyz")
        res.check(st == 400 and "more follows" in error_of(st, payload)[3], "junk after the JSON body: 400",
                  f"{st} {payload[:200]!r}")
        st, payload = raw_post(srv, "/v1/completions", b'{"model": "%s", "prompt": "a\xffb", "max_tokens": 2}' %
                               name.encode())
        res.check(st == 400 and "UTF-8" in error_of(st, payload)[3], "raw invalid UTF-8 in a string: 400",
                  f"{st} {payload[:200]!r}")
        st, payload = raw_post(srv, "/v1/completions", b'{"model": "%s", "prompt": "a", "temperature": 1e309}' %
                               name.encode())
        msg = error_of(st, payload)[3]
        res.check(st == 400 and "null" not in msg and "too large" in msg and error_of(st, payload)[2] == "temperature",
                  "temperature 1e309: a clear message", msg)
        for include in (False, True):
            r = cl.completions.create(model=name, prompt="hello", max_tokens=10, temperature=0,
                                      logit_bias={str(ff): 100}, stop=["\ufffd\ufffd"],
                                      extra_body={"include_stop_str_in_output": include})
            want = "\ufffd\ufffd" if include else ""
            res.check(r.choices[0].text == want and r.choices[0].finish_reason == "stop",
                      f"a stop string holding U+FFFD matches (include_stop_str_in_output {include})",
                      f"{r.choices[0].text!r} {r.choices[0].finish_reason}")

        # ---- echo + logprobs
        prompt_ids = [bos] + tok.encode("the quick brown fox jumps over the lazy dog 12+34=46").ids
        lsm = log_softmax(forward_logits(work, mdir, prompt_ids))
        r = cl.completions.create(model=name, prompt=[prompt_ids], max_tokens=0, echo=True, logprobs=3, temperature=0)
        ch = r.model_dump()["choices"][0]
        check_echo(res, "echo, max_tokens 0", ch, prompt_ids, lsm, tok, 0)
        res.check(ch["text"] == tok.decode(prompt_ids, skip_special_tokens=False) and r.usage.completion_tokens == 0
                  and r.usage.prompt_tokens == len(prompt_ids), "echo, max_tokens 0: text and usage",
                  f"{ch['text']!r} {r.usage}")
        # lm-eval's request: a batch of token lists, max_tokens 1, logprobs 1, echo
        other = [bos] + tok.encode("one two three four five six").ids
        lsm2 = log_softmax(forward_logits(work, mdir, other))
        st, _, payload = srv.raw("POST", "/v1/completions", {"model": name, "prompt": [prompt_ids, other],
                                                             "max_tokens": 1, "logprobs": 1, "echo": True,
                                                             "temperature": 0, "seed": 1234})
        out = json.loads(payload) if st == 200 else {}
        res.check(st == 200 and [c["index"] for c in out["choices"]] == [0, 1], "lm-eval's batched echo request",
                  f"{st} {payload[:300]!r}")
        if st == 200:
            for i, (ids, l) in enumerate([(prompt_ids, lsm), (other, lsm2)]):
                c = out["choices"][i]
                check_echo(res, f"batched echo {i}", c, ids, l, tok, 1)
                gen_lp = c["logprobs"]["token_logprobs"][-1]
                res.check(abs(gen_lp - l[-1].max()) < 1e-4, f"batched echo {i}: the greedy token's logprob",
                          f"{gen_lp} vs {l[-1].max()}")
        # a text prompt: the text comes back as given, then the completion; streamed the same
        r = cl.completions.create(model=name, prompt="12+34=", max_tokens=6, echo=True, temperature=0)
        want = "12+34=" + generate_text(mdir, prompt="12+34=", max_tokens=6)
        res.check(r.choices[0].text == want, "echo of a text prompt", f"{r.choices[0].text!r} vs {want!r}")
        text, finish, _, _ = stream_text(cl, "completion", model=name, prompt="12+34=", max_tokens=6, echo=True,
                                         temperature=0)
        res.check(text == want, "echo of a text prompt, streamed", f"{text!r} vs {want!r}")

        # ---- /tokenize, /detokenize, /v1/models/{id}
        st, _, payload = srv.raw("POST", "/tokenize", {"prompt": "hello world", "add_special_tokens": False,
                                                       "return_token_strs": True})
        t = json.loads(payload)
        want_ids = tok.encode("hello world").ids
        res.check(st == 200 and t["tokens"] == want_ids and t["count"] == len(want_ids) and t["max_model_len"] == 256
                  and t["token_strs"] == [tok.id_to_token(i) for i in want_ids], "/tokenize", str(t))
        st, _, payload = srv.raw("POST", "/tokenize", {"model": name, "prompt": "hello world"})
        res.check(st == 200 and json.loads(payload)["tokens"] == [bos] + want_ids and
                  json.loads(payload)["token_strs"] is None, "/tokenize puts bos first by default", payload[:200])
        msgs = [{"role": "user", "content": "hello"}]
        st, _, payload = srv.raw("POST", "/tokenize", {"messages": msgs})
        chat = cl.chat.completions.create(model=name, messages=msgs, max_tokens=1, temperature=0)
        res.check(st == 200 and json.loads(payload)["count"] == chat.usage.prompt_tokens,
                  "/tokenize with messages = the chat prompt", f"{payload[:200]!r} vs {chat.usage.prompt_tokens}")
        st, _, payload = srv.raw("POST", "/detokenize", {"tokens": want_ids})
        res.check(st == 200 and json.loads(payload) == {"prompt": "hello world"}, "/detokenize", payload[:200])
        st, _, payload = srv.raw("POST", "/tokenize", {"model": "nope", "prompt": "x"})
        res.check(st == 404, "/tokenize with another model: 404", f"{st}")
        m = cl.models.retrieve(name)
        res.check(m.id == name and m.object == "model", "GET /v1/models/{id}", str(m))
        st, _, payload = srv.raw("GET", "/v1/models/nope")
        res.check(st == 404 and error_of(st, payload)[1] == "not_found_error", "GET /v1/models/{unknown}: 404", f"{st}")

        # ---- batched prompts and n
        prompts = ["the quick", "12+34=", "hello"]
        want = [generate_text(mdir, prompt=p, max_tokens=10) for p in prompts]
        r = cl.completions.create(model=name, prompt=prompts, max_tokens=10, temperature=0)
        res.check([c.text for c in r.choices] == want and [c.index for c in r.choices] == [0, 1, 2],
                  "a list of prompts: one choice each, in order", f"{[c.text for c in r.choices]} vs {want}")
        r = cl.completions.create(model=name, prompt="the quick", max_tokens=10, temperature=0, n=3)
        res.check([c.text for c in r.choices] == [want[0]] * 3, "n = 3 greedy: three copies", str(r.choices))
        seeded = cl.completions.create(model=name, prompt=["the quick", "hello"], max_tokens=12, temperature=1.0,
                                       seed=5, n=2)
        alone = [cl.completions.create(model=name, prompt=p, max_tokens=12, temperature=1.0, seed=5 + j).choices[0].text
                 for p in ["the quick", "hello"] for j in range(2)]
        res.check([c.text for c in seeded.choices] == alone and [c.index for c in seeded.choices] == [0, 1, 2, 3],
                  "2 prompts x n = 2: choice p n + j is one request with seed + j",
                  f"{[c.text for c in seeded.choices]} vs {alone}")
        res.check(seeded.usage.prompt_tokens == sum(len(tok.encode(p).ids) + 1 for p in ["the quick", "hello"]),
                  "usage counts each prompt once", str(seeded.usage))
        chunks = cl.completions.create(model=name, prompt=["the quick", "hello"], max_tokens=12, temperature=1.0,
                                       seed=5, n=2, stream=True, stream_options={"include_usage": True})
        got, finishes, usage = ["", "", "", ""], {}, None
        for c in chunks:
            usage = c.usage or usage
            for x in c.choices:
                got[x.index] += x.text
                if x.finish_reason:
                    finishes[x.index] = x.finish_reason
        res.check(got == alone and len(finishes) == 4 and usage and
                  usage.completion_tokens == seeded.usage.completion_tokens, "the same streamed",
                  f"{got} vs {alone}, {finishes}, {usage}")
        r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0, n=2)
        res.check(len(r.choices) == 2 and r.choices[0].message.content == r.choices[1].message.content,
                  "chat with n = 2", str(r.choices))

        # ---- sampling parameters
        greedy = cl.completions.create(model=name, prompt="hello", max_tokens=12, temperature=0).choices[0].text
        r = cl.completions.create(model=name, prompt="hello", max_tokens=12, temperature=1.5, seed=3,
                                  extra_body={"min_p": 1.0})
        res.check(r.choices[0].text == greedy, "min_p 1 = greedy at any temperature", f"{r.choices[0].text!r}")
        hello = [bos] + tok.encode("hello").ids
        pen = dict(presence=0.6, frequency=0.4, repetition=1.5, bias={"17": 2.0, "40": -100})
        want_ids = penalized_reference(work, mdir, hello, 8, pen["presence"], pen["frequency"], pen["repetition"],
                                       pen["bias"], V_tok)
        r = cl.completions.create(model=name, prompt=[hello], max_tokens=8, temperature=0, presence_penalty=0.6,
                                  frequency_penalty=0.4, logit_bias=pen["bias"], logprobs=0,
                                  extra_body={"repetition_penalty": 1.5, "ignore_eos": True})
        got_toks = r.choices[0].logprobs.tokens  # the text may not round-trip: compare the tokens' texts
        want_toks = [tok.decode([i], skip_special_tokens=False) for i in want_ids]
        res.check(got_toks == want_toks, "penalties and logit_bias = vLLM's formulas on zaya forward's logits",
                  f"{got_toks} vs {want_toks}")
        r = cl.completions.create(model=name, prompt="hello", max_tokens=10, temperature=0,
                                  logit_bias={str(ff): 100}, extra_body={"stop_token_ids": [ff]})
        res.check(r.choices[0].text == "" and r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1,
                  "stop_token_ids", str(r.choices[0]))
        for skip in (False, True):
            r = cl.completions.create(model=name, prompt="hello", max_tokens=3, temperature=0,
                                      logit_bias={str(bos): 100}, extra_body={"skip_special_tokens": skip})
            res.check(r.choices[0].text == ("" if skip else "<|bos|>" * 3), f"skip_special_tokens {skip}",
                      repr(r.choices[0].text))
        st, _, payload = srv.raw("POST", "/v1/completions", dict(base, logit_bias={"99999": 1}))
        res.check(st == 400 and error_of(st, payload)[2] == "logit_bias", "logit_bias outside the vocabulary: 400",
                  payload[:200])
        st, _, payload = srv.raw("POST", "/v1/completions", dict(base, max_tokens=0))
        res.check(st == 400 and error_of(st, payload)[2] == "max_tokens", "max_tokens 0 without echo: 400",
                  payload[:200])
    finally:
        srv.stop()

    # ---- --chat-template FILE on a folder without a template
    bare = work / "bare"
    shutil.copytree(mdir, bare)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    (work / "tpl.jinja").write_text(CHAT_TEMPLATE)
    msgs = [{"role": "user", "content": "12+34="}]
    mf = work / "msgs.json"
    mf.write_text(json.dumps(msgs))
    want = generate_text(mdir, messages_file=mf, max_tokens=12)
    srv = Server(bare, "--max-context", 128)
    try:
        st, _, payload = srv.raw("POST", "/v1/chat/completions", {"model": "bare", "messages": msgs})
        res.check(st == 400 and "chat-template" in error_of(st, payload)[3], "chat without a template: a clear 400",
                  payload[:300])
    finally:
        srv.stop()
    srv = Server(bare, "--max-context", 128, "--chat-template", work / "tpl.jinja")
    try:
        r = srv.client().chat.completions.create(model="bare", messages=msgs, max_tokens=12, temperature=0)
        res.check(r.choices[0].message.content == want, "--chat-template FILE", f"{r.choices[0].message.content!r} "
                  f"vs {want!r}")
    finally:
        srv.stop()
    rc, out, err = run_zaya(["serve", "--model", bare, "--port", "0", "--chat-template", work / "missing.jinja"],
                            timeout=60)
    res.check(rc != 0 and "--chat-template" in err and "listening" not in out, "--chat-template on a missing file",
              err.strip()[-200:])


def main():
    suite = Suite("serve_api")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-serve-api-") as work:
        suite.run("serve_api", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
