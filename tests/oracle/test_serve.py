#!/usr/bin/env python3
"""`zaya serve` through the official `openai` Python client (and raw HTTP for what the client hides), on a small
random model with a byte-level BPE tokenizer and a ChatML-style chat template built in the test:

- completions and chat, streaming and not, equal `zaya generate`'s greedy text for the same prompt / messages;
- 32 concurrent streaming clients all complete with their own right outputs;
- stop strings, seeds, logprobs, usage, /v1/models, /health, /metrics;
- every bad input gets an OpenAI-style 4xx body: malformed JSON, wrong types, unknown fields, ids out of range,
  a prompt longer than the context, negative max_tokens, n > 1, a wrong model, a missing or wrong API key;
- a full queue answers 503 with Retry-After;
- a disconnect storm (clients closing mid-stream) leaves no KV blocks held (/metrics back to zero);
- SIGTERM lets a running stream finish, answers a new connection 503, and exits 0.

    python tests/oracle/test_serve.py [--keep DIR]

The last line is `serve: N passed, N failed`.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya, zaya_cmd  # noqa: E402

import openai  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["the quick brown fox jumps over the lazy dog", "12+34=46", "hello world, this is zaya serving a model",
          "Über naïve café — ☕ emoji 🎉 and 漢字", "def f(x):\n    return x * 2\n", "one two three four five six"]


def make_model(work):
    mdir = work / "m"
    cfg = dict(model_type="zaya", architectures=["ZayaForCausalLM"], vocab_size=384, hidden_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               moe_intermediate_size=64, num_experts=4, num_experts_per_tok=1, router_hidden_size=32, cca_time0=2,
               cca_time1=2, rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=4096,
               rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 10000.0,
                                           "partial_rotary_factor": 0.5}},
               initializer_range=0.5, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    (work / "cfg.json").write_text(json.dumps(cfg))
    rc, out, err = run_zaya(["init", "--config", work / "cfg.json", "--out", mdir, "--seed", "7"])
    if rc:
        raise RuntimeError(f"zaya init failed: {err}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=380, special_tokens=["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>",
                                                                  "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(mdir / "tokenizer.json"))
    (mdir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": CHAT_TEMPLATE}))
    return mdir


class Server:
    def __init__(self, mdir, *extra):
        self.proc = subprocess.Popen(zaya_cmd() + ["serve", "--model", str(mdir), "--port", "0", *map(str, extra)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://[0-9.]+:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"zaya serve did not start: {line!r} {self.proc.stderr.read()}")
        self.port = int(m.group(1))
        self.base = f"http://127.0.0.1:{self.port}/v1"

    def client(self, key="unused", **kw):
        return openai.OpenAI(base_url=self.base, api_key=key, max_retries=0, timeout=120, **kw)

    def raw(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = body if isinstance(body, (bytes, type(None))) else (body if isinstance(body, str) else json.dumps(body))
        c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        payload = r.read()
        hdrs = dict(r.getheaders())
        c.close()
        return r.status, hdrs, payload

    def metrics(self):
        _, _, body = self.raw("GET", "/metrics")
        out = {}
        for ln in body.decode().splitlines():
            if ln and not ln.startswith("#"):
                k, v = ln.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def generate_text(mdir, prompt=None, messages_file=None, max_tokens=16, extra=()):
    args = ["generate", "--model", mdir, "--tokenizer", mdir / "tokenizer.json", "--max-tokens", max_tokens,
            "--temperature", "0", *extra]
    args += ["--prompt", prompt] if prompt is not None else ["--messages", messages_file]
    rc, out, err = run_zaya(args, timeout=120, text=False)
    if rc:
        raise RuntimeError(f"zaya generate failed: {err.decode()}")
    assert out.endswith(b"\n")
    return out[:-1].decode("utf-8", "replace")


def stream_text(client, kind, **kw):
    """Concatenated text of a streamed completion or chat, the finish reason, the usage chunk and chunk count."""
    text, finish, usage, n = "", None, None, 0
    if kind == "chat":
        s = client.chat.completions.create(stream=True, **kw)
    else:
        s = client.completions.create(stream=True, **kw)
    for ch in s:
        n += 1
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            text += (c.delta.content or "") if kind == "chat" else c.text
            finish = c.finish_reason or finish
    return text, finish, usage, n


def error_of(status, payload):
    try:
        e = json.loads(payload)["error"]
        return status, e.get("type"), e.get("param"), e.get("message", "")
    except Exception:
        return status, None, None, payload[:200]


def checks(res, work):
    """Every check, in order, on one model: the servers run one after another."""
    mdir = make_model(work)
    name = mdir.name
    prompts = ["the quick", "12+34=", "hello", "Über naïve", "def f(x):", "one two", "zaya", "🎉 and"]
    expected = {(p, n): generate_text(mdir, prompt=p, max_tokens=n) for p in prompts for n in (12, 40)}
    res.check(len(set(expected.values())) > 4, "the test model says different things to different prompts",
              str(list(expected.values())[:4]))

    # bad flags: a clear error naming the flag, non-zero exit, before anything listens
    for flags, says in [(["--port", "70000"], "--port"), (["--host", "localhost:1"], "--host"),
                        (["--kv-memory", "12Q"], "--kv-memory"), (["--kv-memory", "1K"], "--kv-memory"),
                        (["--max-batch", "0"], "--max-batch"), (["--max-context", "100000"], "--max-context"),
                        (["--dtype", "f16"], "--dtype"), (["--device", "tpu"], "--device"), (["--bogus"], "--bogus"),
                        (["--kv-dtype", "f16"], "--kv-dtype")]:
        rc, out, err = run_zaya(["serve", "--model", mdir, "--port", "0", *flags], timeout=60)
        res.check(rc != 0 and says in err and "listening" not in out, f"serve {' '.join(flags)} refused",
                  f"rc {rc}: {err.strip()[-200:]}")
    rc, out, err = run_zaya(["serve", "--model", work / "nope"], timeout=60)
    res.check(rc != 0 and "nope" in err, "serve on a missing model directory", err.strip()[-200:])

    srv = Server(mdir, "--max-batch", 8, "--max-context", 128, "--block-tokens", 8, "--prefill-chunk", 4)
    try:
        cl = srv.client()
        models_list = cl.models.list()
        res.check([m.id for m in models_list.data] == [name], "/v1/models", str(models_list))
        st, _, body = srv.raw("GET", "/health")
        res.check(st == 200 and json.loads(body)["status"] == "ok", "/health", body)

        # completions, not streamed and streamed, equal zaya generate greedy (prompts longer than a prefill chunk)
        for p in prompts[:5]:
            for n in (12, 40):
                r = cl.completions.create(model=name, prompt=p, max_tokens=n, temperature=0)
                want = expected[(p, n)]
                res.check(r.choices[0].text == want, f"completion {p!r} max {n}", f"{r.choices[0].text!r} vs {want!r}")
                res.check(r.usage.completion_tokens <= n and r.usage.prompt_tokens > 0 and
                          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
                          f"usage {p!r}", str(r.usage))
                res.check(r.choices[0].finish_reason == ("length" if r.usage.completion_tokens == n else "stop"),
                          f"finish reason {p!r}", f"{r.choices[0].finish_reason} with {r.usage}")
                text, finish, usage, chunks = stream_text(cl, "completion", model=name, prompt=p, max_tokens=n,
                                                          temperature=0, stream_options={"include_usage": True})
                res.check(text == want and finish == r.choices[0].finish_reason and usage is not None and
                          usage.completion_tokens == r.usage.completion_tokens and chunks >= 3,
                          f"streamed completion {p!r} max {n}", f"{text!r} {finish} {usage} {chunks}")

        # chat: the model folder's template, as zaya generate --messages renders it
        for i, msgs in enumerate([[{"role": "user", "content": "hello"}],
                                  [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12+34="},
                                   {"role": "assistant", "content": "46"}, {"role": "user", "content": "and 1+1?"}],
                                  [{"role": "user", "content": [{"type": "text", "text": "one"},
                                                                {"type": "text", "text": "two"}]}]]):
            mf = work / f"messages{i}.json"
            joined = [dict(m, content="\n".join(p["text"] for p in m["content"])) if isinstance(m["content"], list)
                      else m for m in msgs]
            mf.write_text(json.dumps(joined))
            want = generate_text(mdir, messages_file=mf, max_tokens=24)
            r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=24, temperature=0)
            res.check(r.choices[0].message.content == want and r.choices[0].message.role == "assistant",
                      f"chat {i}", f"{r.choices[0].message.content!r} vs {want!r}")
            text, finish, _, _ = stream_text(cl, "chat", model=name, messages=msgs, max_tokens=24, temperature=0)
            res.check(text == want and finish == r.choices[0].finish_reason, f"streamed chat {i}",
                      f"{text!r} vs {want!r}")

        # 32 concurrent streaming clients, 8 slots: all finish with their own outputs
        results = {}

        def client_job(k):
            p, n = prompts[k % len(prompts)], (12, 40)[k % 2]
            try:
                text, finish, _, _ = stream_text(srv.client(), "completion", model=name, prompt=p, max_tokens=n,
                                                 temperature=0)
                results[k] = (text == expected[(p, n)], text, expected[(p, n)])
            except Exception as e:  # noqa: BLE001
                results[k] = (False, repr(e), expected[(p, n)])
        threads = [threading.Thread(target=client_job, args=(k,)) for k in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        bad = [(k, v[1], v[2]) for k, v in sorted(results.items()) if not v[0]]
        res.check(len(results) == 32 and not bad, "32 concurrent streams equal zaya generate", str(bad[:3]))
        mt = srv.metrics()
        res.check(mt.get("zaya_kv_blocks_used") == 0 and mt.get("zaya_requests_running") == 0,
                  "no KV blocks held after the concurrent run", str({k: v for k, v in mt.items() if "kv" in k}))

        # stop strings: the text ends before the first one
        full = expected[("the quick", 40)]
        if len(full) > 8:
            stop = full[5:8]
            r = cl.completions.create(model=name, prompt="the quick", max_tokens=40, temperature=0, stop=[stop, "QQQ"])
            want = full[:full.find(stop)]
            res.check(r.choices[0].text == want and r.choices[0].finish_reason == "stop", "stop string",
                      f"{r.choices[0].text!r} vs {want!r}")
            text, finish, _, _ = stream_text(cl, "completion", model=name, prompt="the quick", max_tokens=40,
                                             temperature=0, stop=stop)
            res.check(text == want and finish == "stop", "stop string, streamed", f"{text!r} vs {want!r}")

        # sampling with a seed repeats; logprobs are the model's and the greedy token is the most likely
        a = cl.completions.create(model=name, prompt="hello", max_tokens=20, temperature=1.0, seed=11)
        b = cl.completions.create(model=name, prompt="hello", max_tokens=20, temperature=1.0, seed=11)
        res.check(a.choices[0].text == b.choices[0].text, "seeded sampling repeats", f"{a.choices[0].text!r}")
        r = cl.completions.create(model=name, prompt="hello", max_tokens=10, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        ok = (lp is not None and len(lp.tokens) == r.usage.completion_tokens == len(lp.token_logprobs) ==
              len(lp.top_logprobs) == len(lp.text_offset))
        ok = ok and all(len(t) <= 3 and abs(max(t.values()) - l) < 1e-5 and l <= 0
                        for t, l in zip(lp.top_logprobs, lp.token_logprobs))
        res.check(ok, "completion logprobs (greedy token = the top one)", str(lp)[:300])
        r = cl.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=2)
        c = r.choices[0].logprobs.content if r.choices[0].logprobs else None
        res.check(c is not None and len(c) == r.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in c),
                  "chat logprobs", str(c)[:300])

        # bad input: OpenAI-style errors, never a crash
        base = {"model": name, "prompt": "hello", "max_tokens": 4}
        cases = [
            ("malformed JSON", "/v1/completions", '{"model": "m", "prompt": ', 400, None),
            ("not an object", "/v1/completions", "[1, 2]", 400, None),
            ("wrong type", "/v1/completions", dict(base, temperature="hot"), 400, "temperature"),
            ("unknown field", "/v1/completions", dict(base, max_token=3), 400, "max_token"),
            ("negative max_tokens", "/v1/completions", dict(base, max_tokens=-1), 400, "max_tokens"),
            ("ids out of range", "/v1/completions", dict(base, prompt=[1, 5, 99999]), 400, "prompt"),
            ("negative id", "/v1/completions", dict(base, prompt=[1, -5]), 400, "prompt"),
            ("prompt longer than the context", "/v1/completions", dict(base, prompt=[5] * 200), 400, "prompt"),
            ("prompt + max_tokens past the context", "/v1/completions", dict(base, max_tokens=1000), 400, "max_tokens"),
            ("n above --max-batch", "/v1/completions", dict(base, n=9), 400, "n"),
            ("missing prompt", "/v1/completions", {"model": name}, 400, "prompt"),
            ("top_p 0", "/v1/completions", dict(base, top_p=0), 400, "top_p"),
            ("too many stops", "/v1/completions", dict(base, stop=["a", "b", "c", "d", "e"]), 400, "stop"),
            ("wrong model", "/v1/completions", dict(base, model="gpt-4"), 404, "model"),
            ("chat without messages", "/v1/chat/completions", {"model": name}, 400, "messages"),
            ("chat bad role", "/v1/chat/completions", {"model": name, "messages": [{"role": "wizard", "content": "x"}]},
             400, "messages[0]"),
            ("chat image part", "/v1/chat/completions", {"model": name, "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages[0]"),
        ]
        for label, path, body, status, param in cases:
            st, _, payload = srv.raw("POST", path, body)
            s, ty, pa, msg = error_of(st, payload)
            res.check(s == status and ty is not None and (param is None or pa == param) and msg,
                      f"bad input: {label}", f"{st} {payload[:200]!r}")
        st, _, payload = srv.raw("GET", "/v1/completions")
        res.check(st == 405, "GET on a POST route", f"{st}")
        st, _, payload = srv.raw("GET", "/nope")
        res.check(st == 404 and error_of(st, payload)[1], "unknown route", f"{st}")
        try:
            cl.completions.create(model=name, prompt="x", max_tokens=-3)
            res.check(False, "openai client sees a 400", "no error raised")
        except openai.BadRequestError as e:
            res.check(e.status_code == 400 and "max_tokens" in str(e), "openai client sees a 400", str(e))

        # a disconnect storm: clients close mid-stream; their blocks come back
        def drop_after_first_chunk(k):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            c.request("POST", "/v1/completions", body=json.dumps(dict(model=name, prompt=prompts[k % 8],
                                                                      max_tokens=100, stream=True, temperature=0.7)),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read(40)
            c.sock.close() if c.sock else None
            c.close()
        storm = [threading.Thread(target=drop_after_first_chunk, args=(k,)) for k in range(24)]
        for t in storm:
            t.start()
        for t in storm:
            t.join(60)
        deadline = time.time() + 30
        while time.time() < deadline:
            mt = srv.metrics()
            if mt.get("zaya_kv_blocks_used") == 0 and mt.get("zaya_requests_running") == 0 and \
                    mt.get("zaya_requests_waiting") == 0:
                break
            time.sleep(0.2)
        res.check(mt.get("zaya_kv_blocks_used") == 0 and mt.get("zaya_requests_running") == 0 and
                  mt.get("zaya_requests_waiting") == 0, "disconnect storm leaves no KV blocks held",
                  str({k: v for k, v in mt.items() if "kv" in k or "running" in k}))
        res.check(mt.get("zaya_client_disconnects_total", 0) >= 1 and
                  mt.get('zaya_requests_finished_total{reason="abort"}', 0) >= 1,
                  "disconnects counted and cancelled", str(mt.get("zaya_client_disconnects_total")))
        r = cl.completions.create(model=name, prompt="12+34=", max_tokens=12, temperature=0)
        res.check(r.choices[0].text == expected[("12+34=", 12)], "the server still answers after the storm",
                  r.choices[0].text)
    finally:
        rc = srv.stop()
    res.check(rc == 0, "SIGTERM on an idle server exits 0", f"exit {rc}: {srv.proc.stderr.read()[-400:]}")

    # an API key: missing or wrong is 401, right is 200
    srv = Server(mdir, "--api-key", "sekret")
    try:
        st, hdr, payload = srv.raw("POST", "/v1/completions", {"model": name, "prompt": "x", "max_tokens": 2})
        res.check(st == 401 and error_of(st, payload)[1] == "authentication_error", "missing API key", f"{st}")
        try:
            srv.client(key="wrong").completions.create(model=name, prompt="x", max_tokens=2)
            res.check(False, "wrong API key", "no error")
        except openai.AuthenticationError as e:
            res.check(e.status_code == 401, "wrong API key", str(e))
        r = srv.client(key="sekret").completions.create(model=name, prompt="12+34=", max_tokens=12, temperature=0)
        res.check(r.choices[0].text == expected[("12+34=", 12)], "right API key", r.choices[0].text)
        st, _, _ = srv.raw("GET", "/health")
        res.check(st == 200, "/health needs no key", f"{st}")
    finally:
        srv.stop()

    # bf16 weights (and so, by default, a bf16 KV cache at half the bytes per token), and bf16 k/v under fp32 weights:
    # greedy completions equal zaya generate's with the same flags, some requests at once
    for flags in (["--dtype", "bf16"], ["--kv-dtype", "bf16"]):
        want = {p: generate_text(mdir, prompt=p, max_tokens=24, extra=flags) for p in prompts[:6]}
        srv = Server(mdir, "--max-batch", 4, "--max-context", 128, "--block-tokens", 8, "--prefill-chunk", 4, *flags)
        try:
            out = {}

            def one(p):
                out[p] = srv.client().completions.create(model=name, prompt=p, max_tokens=24, temperature=0)
            ts = [threading.Thread(target=one, args=(p,)) for p in want]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            bad = [(p, out[p].choices[0].text, w) for p, w in want.items() if p not in out or out[p].choices[0].text != w]
            res.check(not bad, f"serve {' '.join(flags)}: 6 greedy completions at once equal generate's", str(bad[:2]))
            log = srv.proc.stderr.readline() + srv.proc.stderr.readline()
            per_token = 2 * 2 * 2 * 16 * 2  # layers x (k, v) x kv heads x head_dim x 2 bytes
            res.check(f"(bf16, {per_token} bytes per token" in log, f"serve {' '.join(flags)}: a bf16 KV pool", log)
        finally:
            srv.stop()

    # continuous batching: 8 long requests (1,500 tokens each, seconds on this model) run in the same steps
    srv = Server(mdir, "--max-batch", 8, "--max-context", 2048)
    try:
        peak = [0]

        def long_request(k):
            srv.raw("POST", "/v1/completions", {"model": name, "prompt": prompts[k], "max_tokens": 1500,
                                                "ignore_eos": True, "temperature": 0})
        ts = [threading.Thread(target=long_request, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        while any(t.is_alive() for t in ts):
            peak[0] = max(peak[0], int(srv.metrics().get("zaya_requests_running", 0)))
            time.sleep(0.05)
        for t in ts:
            t.join()
        mt = srv.metrics()
        res.check(peak[0] >= 4 and mt.get('zaya_step_batch_size_bucket{le="4"}', 0) < mt.get("zaya_step_batch_size_count", 0)
                  and mt.get("zaya_generation_tokens_total") == 8 * 1500 and mt.get("zaya_kv_blocks_used") == 0,
                  "8 long requests share steps (continuous batching)",
                  f"peak running {peak[0]}, {mt.get('zaya_steps_total')} steps, {mt.get('zaya_generation_tokens_total')} tokens")
    finally:
        srv.stop()

    # a full queue is 503 with Retry-After; SIGTERM lets the running stream finish, then exits 0
    srv = Server(mdir, "--max-batch", 1, "--max-queue", 0, "--max-context", 4096, "--grace-seconds", 120)
    got = {}

    def long_stream():
        try:
            got["text"], got["finish"], _, _ = stream_text(srv.client(), "completion", model=name, prompt="one two",
                                                           max_tokens=3000, temperature=0.9, seed=3,
                                                           extra_body={"ignore_eos": True})
        except Exception as e:  # noqa: BLE001
            got["error"] = repr(e)
    t = threading.Thread(target=long_stream)
    t.start()
    deadline = time.time() + 20
    while time.time() < deadline and srv.metrics().get("zaya_requests_running") != 1:
        time.sleep(0.05)
    st, hdr, payload = srv.raw("POST", "/v1/completions", {"model": name, "prompt": "x", "max_tokens": 2})
    res.check(st == 503 and hdr.get("Retry-After") and error_of(st, payload)[1], "full queue: 503 + Retry-After",
              f"{st} {hdr} {payload[:200]!r}")
    srv.proc.send_signal(signal.SIGTERM)
    # a client that connects during the grace period gets the 503 the docs describe, not a reset
    deadline = time.time() + 10
    st, hdr, payload = None, {}, b""
    while time.time() < deadline:
        try:
            st, hdr, payload = srv.raw("POST", "/v1/completions", {"model": name, "prompt": "x", "max_tokens": 2})
        except OSError as e:  # noqa: PERF203
            st, payload = None, repr(e).encode()
            break
        if st == 503 and b"shutting down" in payload:
            break
        time.sleep(0.1)  # the signal not handled yet: the full queue's 503 says something else
    res.check(st == 503 and b"shutting down" in payload and hdr.get("Connection", "").lower() == "close",
              "SIGTERM: a new connection gets 503 (not a reset)", f"{st} {hdr} {payload[:200]!r}")
    t.join(150)
    try:
        rc = srv.proc.wait(60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        rc = "hung"
    res.check("error" not in got and got.get("finish") == "length" and len(got.get("text", "")) > 0,
              "SIGTERM: the running stream finishes", str(got)[:300])
    res.check(rc == 0, "SIGTERM: exit 0", f"exit {rc}")


def main():
    suite = Suite("serve")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-serve-") as work:
        suite.run("serve", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
