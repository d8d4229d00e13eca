#!/usr/bin/env python3
"""Markovian RSA as the "rsa" extension of `zaya serve`'s /v1/chat/completions, through the official `openai` client
(`extra_body={"rsa": ...}`), on the small random model test_serve.py builds:

- the answer: one message, the chosen trace, equal to `zaya reason --messages` with the same seed and settings
  (the same rounds on an engine of its own); `usage` sums the rounds; the `rsa` field's per-round report (tokens
  generated, prompt tokens, prefix-cache hits, seconds) agrees with `usage`;
- each round ran as one batch: the engine's step-size histogram has steps of more than half the population, and
  the mean batch of the RSA run is above half of it;
- two RSA requests at once both answer; afterwards no KV block is held; a client that disconnects mid-round stops
  its traces (their blocks come back);
- every bad field is a 400 naming it (rsa.population above --max-batch, rsa.subset above the population, zero
  rounds, a negative tail, an unknown member, stream, n > 1, logprobs, rsa on /v1/completions).

    python tests/oracle/test_serve_rsa.py [--keep DIR]

The last line is `serve_rsa: N passed, N failed`.
"""
import json
import sys
import threading
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya  # noqa: E402
from test_serve import Server, make_model  # noqa: E402

N, K, T, TAIL, MAX_TOKENS, SEED = 8, 4, 3, 12, 16, 42
PROBLEM = "What is 12 + 34? Give the answer as \\boxed{N}."


def rsa_body(**over):
    rsa = {"population": N, "subset": K, "rounds": T, "tail": TAIL}
    rsa.update(over)
    return {"rsa": rsa}


def checks(res, work):
    mdir = make_model(work)
    name = mdir.name
    msgs = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": PROBLEM}]
    (work / "msgs.json").write_text(json.dumps(msgs))
    rc, out, err = run_zaya(["reason", "--model", mdir, "--messages", work / "msgs.json", "--population", N,
                             "--subset", K, "--rounds", T, "--tail", TAIL, "--max-tokens", MAX_TOKENS,
                             "--temperature", "0.8", "--seed", SEED, "--json"], timeout=300)
    res.check(rc == 0, "zaya reason --json runs", err[-500:] if isinstance(err, str) else "")
    cli = json.loads(out) if rc == 0 else None

    srv = Server(mdir, "--max-batch", N, "--max-context", 2048)
    try:
        cl = srv.client()
        before = srv.metrics()
        t0 = time.time()
        r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=MAX_TOKENS, temperature=0.8, seed=SEED,
                                       extra_body=rsa_body())
        wall = time.time() - t0
        after = srv.metrics()
        rep = (r.model_extra or {}).get("rsa")
        res.check(rep is not None and len(r.choices) == 1 and r.choices[0].message.role == "assistant",
                  "openai client: one choice and an rsa report", str(r)[:300])
        if rep is None:
            return
        rounds = rep["round_reports"]
        res.check(len(rounds) == T and [x["round"] for x in rounds] == list(range(1, T + 1)) and
                  rep["population"] == N and rep["subset"] == K and rep["tail"] == TAIL,
                  "rsa: the shape and one report per round", json.dumps(rep)[:300])
        res.check(all(0 < x["tokens_generated"] <= N * MAX_TOKENS and x["prompt_tokens"] > 0 and x["seconds"] > 0 and
                      (x["prefix_cache_hits"] is not None and x["prefix_cache_hits"] >= 0) for x in rounds) and
                  sum(x["seconds"] for x in rounds) <= wall + 0.5,
                  "rsa: per round tokens generated, prompt tokens, prefix-cache hits, seconds", json.dumps(rounds))
        res.check(r.usage.completion_tokens == sum(x["tokens_generated"] for x in rounds) == rep["tokens_generated"]
                  and r.usage.prompt_tokens == sum(x["prompt_tokens"] for x in rounds),
                  "usage sums the rounds", f"{r.usage} vs {rounds}")
        # later rounds' prompts hold the problem and K tails: longer than round 1's N copies of the problem
        res.check(all(x["prompt_tokens"] > rounds[0]["prompt_tokens"] for x in rounds[1:]),
                  "later rounds prompt with the aggregation template", json.dumps(rounds))
        if cli:
            res.check(r.choices[0].message.content == cli["text"] and rep["chosen"] == cli["chosen"] and
                      rep["answer"] == cli["answer"] and
                      [x["tokens_generated"] for x in rounds] == [x["tokens_generated"] for x in cli["round_reports"]],
                      "the answer equals zaya reason's with the same seed",
                      f"{r.choices[0].message.content!r} vs {cli['text']!r}")
        # the rounds ran batched: steps of more than N/2 sequences, and a mean batch above N/2
        key_le = lambda le: f'zaya_step_batch_size_bucket{{le="{le}"}}'  # noqa: E731
        big_steps = (after[key_le(8)] - after[key_le(4)]) - (before[key_le(8)] - before[key_le(4)])
        steps = after["zaya_step_batch_size_count"] - before["zaya_step_batch_size_count"]
        mean = (after["zaya_step_batch_size_sum"] - before["zaya_step_batch_size_sum"]) / max(steps, 1)
        res.check(big_steps > 0 and mean > N / 2, "each round decodes as one batch",
                  f"{big_steps} steps of 5-8 sequences, mean batch {mean:.2f} over {steps} steps")

        # two at once
        outs, errs = [], []

        def one(seed):
            try:
                outs.append(cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, seed=seed,
                                                       extra_body=rsa_body(population=4, subset=2, rounds=2)))
            except Exception as e:  # noqa: BLE001
                errs.append(repr(e))
        ths = [threading.Thread(target=one, args=(s,)) for s in (1, 2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        res.check(not errs and len(outs) == 2 and all(len(o.model_extra["rsa"]["round_reports"]) == 2 for o in outs),
                  "two RSA requests at once", str(errs)[:300])
        m = srv.metrics()
        res.check(m["zaya_kv_blocks_used"] == 0 and m["zaya_requests_running"] == 0, "no KV block held afterwards",
                  f"{m['zaya_kv_blocks_used']} blocks, {m['zaya_requests_running']} running")

        # a client that goes away mid-round: its traces stop, their blocks come back
        import socket
        body = json.dumps({"model": name, "messages": msgs, "max_tokens": 1900, "ignore_eos": True,
                           **rsa_body(rounds=16)}).encode()  # 16 rounds of 1,900 steps: far longer than 3 s
        sk = socket.create_connection(("127.0.0.1", srv.port))
        sk.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.time() + 30
        while time.time() < deadline and srv.metrics()["zaya_requests_running"] < N:
            time.sleep(0.05)
        running = srv.metrics()["zaya_requests_running"]
        sk.close()
        closed = time.time()
        deadline = closed + 30
        busy = lambda m: m["zaya_requests_running"] or m["zaya_kv_blocks_used"]  # noqa: E731
        while time.time() < deadline and busy(srv.metrics()):
            time.sleep(0.1)
        m, took = srv.metrics(), time.time() - closed
        res.check(running == N and m["zaya_requests_running"] == 0 and m["zaya_kv_blocks_used"] == 0 and took < 3,
                  "a client that disconnects stops its round",
                  f"{running} running before, {m['zaya_requests_running']} after, {m['zaya_kv_blocks_used']} blocks, "
                  f"{took:.1f} s")

        # bad fields: 400 naming the field
        bad = [
            ("rsa.population above --max-batch", dict(extra_body=rsa_body(population=N + 1)), "rsa.population"),
            ("rsa.subset above the population", dict(extra_body=rsa_body(population=4, subset=5)), "rsa.subset"),
            ("rsa.rounds 0", dict(extra_body=rsa_body(rounds=0)), "rsa.rounds"),
            ("rsa.tail -1", dict(extra_body=rsa_body(tail=-1)), "rsa.tail"),
            ("rsa.tail not a number", dict(extra_body=rsa_body(tail="8")), "rsa.tail"),
            ("an unknown rsa member", dict(extra_body=rsa_body(beams=2)), "rsa.beams"),
            ("rsa not an object", dict(extra_body={"rsa": 8}), "rsa"),
            ("rsa with stream", dict(extra_body=rsa_body(), stream=True), "stream"),
            ("rsa with n = 2", dict(extra_body=rsa_body(), n=2), "n"),
            ("rsa with logprobs", dict(extra_body=rsa_body(), logprobs=True), "logprobs"),
        ]
        for label, kw, param in bad:
            try:
                cl.chat.completions.create(model=name, messages=msgs, max_tokens=4, **kw)
                res.check(False, f"{label}: 400", "accepted")
            except openai.BadRequestError as e:
                body = e.body if isinstance(e.body, dict) else {}
                got = body.get("param", body.get("error", {}).get("param") if isinstance(body.get("error"), dict)
                               else None)
                res.check(e.status_code == 400 and got == param, f"{label}: 400 naming {param}", f"{got}: {e}")
        try:
            cl.completions.create(model=name, prompt="x", max_tokens=4, extra_body=rsa_body())
            res.check(False, "rsa on /v1/completions: 400", "accepted")
        except openai.BadRequestError as e:
            res.check("rsa" in str(e), "rsa on /v1/completions: 400 naming rsa", str(e))
    finally:
        srv.stop()


def main():
    suite = Suite("serve_rsa")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-serve-rsa-") as work:
        suite.run("serve_rsa", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
