#!/usr/bin/env python3
"""`zaya serve --device cuda` on a trained model (tests/gpu/run.sh): greedy completions over HTTP, sent one at a time
and then all at once (so the engine runs ragged batches on the GPU's KV block pool: prefill chunks next to decode
rows, requests joining and leaving), each equal to `zaya generate --device cuda`'s text for the same prompt; prompts
that start alike, the later ones taking the earlier one's KV blocks from the prefix cache (its hits counted in
/metrics), and a prompt's `n` choices sharing its blocks (forked), equal to `generate`'s text too; an echoed prompt
with its log-probabilities (every prompt row's logits from one step, lm-eval's request), its text the prompt and
`generate`'s; the KV blocks all returned afterwards (/metrics); SIGTERM exits 0.

With bf16 products (--dtype bf16 or auto) a batched step may take a row through other kernels than `generate`'s one
row (cuBLASLt next to prefill rows, the few-row products alone), so its logits differ by bf16 rounding and a greedy
choice on a near tie may go the other way: there a completion may leave `generate`'s text only at a token whose
runner-up in its own top log-probabilities is `generate`'s, within NEAR_TIE nats (vLLM's check for the same thing).
fp32 products must give `generate`'s text exactly.

    python3 tests/gpu/serve_check.py ZAYA MODEL_DIR TOKENIZER [--dtype f32|bf16|auto] [--kv-dtype auto|f32|bf16]
                                     [--device cuda]

(--device cpu runs the same checks on the CPU: a check of this script, not of the GPU.)

Standard library only (the GPU machine may lack the openai package). Prints one line per check and ends with
"serve-gpu: N passed, N failed"; exits non-zero on any failure.
"""
import argparse
import http.client
import json
import re
import signal
import subprocess
import sys
import threading

PROMPTS = ["12+34=", "The ", "def f(x):", "Once upon a time", "7*8=", "hello world"]
# prompts with a common start several 4-token blocks long: the later ones reuse the first one's cached blocks
SHARED = "Once upon a time there was a little model that could add: "
PREFIXED = [SHARED + "12+34=", SHARED + "7*8=", SHARED + "hello"]
MAX_TOKENS = 40
# a tiny model answers in seconds; a hung engine must not eat the GPU session's minutes
GENERATE_TIMEOUT, HTTP_TIMEOUT, START_TIMEOUT = 120, 60, 120
# bf16 logits differ from one set of kernels to another by ~1e-2 of their size: a tie within this is rounding
NEAR_TIE = 0.25


def same_text(want, choice, ties):
    """'equal' when the choice's text is want; 'near tie' when (ties) it leaves want at a token whose top
    log-probabilities hold want's next token within NEAR_TIE of the one taken; else None."""
    if choice.get("text") == want:
        return "equal"
    lp = choice.get("logprobs") or {}
    tokens, tops = lp.get("tokens") or [], lp.get("top_logprobs") or []
    if not ties or len(tops) != len(tokens):
        return None
    at = 0
    for tok, top in zip(tokens, tops):
        if want.startswith(tok, at):
            at += len(tok)
            continue
        taken = (top or {}).get(tok)
        rest = want[at:]
        return "near tie" if taken is not None and any(
            k != tok and k and rest.startswith(k) and taken - v <= NEAR_TIE for k, v in top.items()) else None
    return None


def generate(args, prompt):
    cmd = [args.zaya, "generate", "--device", args.device, "--model", args.model, "--tokenizer", args.tokenizer,
           "--prompt", prompt, "--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--dtype", args.dtype,
           "--kv-dtype", args.kv_dtype]
    p = subprocess.run(cmd, capture_output=True, timeout=GENERATE_TIMEOUT)
    if p.returncode or not p.stdout.endswith(b"\n"):
        raise RuntimeError(f"zaya generate failed: {p.stderr.decode(errors='replace')[-500:]}")
    return p.stdout[:-1].decode("utf-8", "replace")


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    payload = r.read()
    c.close()
    return r.status, payload


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    c.request("GET", path)
    r = c.getresponse()
    payload = r.read()
    c.close()
    return r.status, payload


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("zaya")
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-dtype", default="auto")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    ties = args.dtype != "f32"  # bf16 products (auto: a bf16 folder's)
    passed = failed = 0
    near_ties = []

    def check(ok, name, detail=""):
        nonlocal passed, failed
        print(f"  {'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))
        passed += bool(ok)
        failed += not ok

    want = {p: generate(args, p) for p in PROMPTS + PREFIXED}
    check(len(set(want.values())) > 1, f"generate --device {args.device} says different things to different prompts",
          str(list(want.values())[:3]))
    # small blocks and prefill chunks, fewer slots than prompts: sequences span blocks, prompts run in pieces next to
    # decode rows, and the last requests wait for a slot
    srv = subprocess.Popen([args.zaya, "serve", "--device", args.device, "--model", args.model, "--tokenizer",
                            args.tokenizer, "--dtype", args.dtype, "--kv-dtype", args.kv_dtype, "--port", "0", "--model-name", "m",
                            "--max-batch", "4", "--max-context", "256", "--block-tokens", "4", "--prefill-chunk", "3"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = []
        reader = threading.Thread(target=lambda: first.append(srv.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        line = first[0] if first else f"(nothing in {START_TIMEOUT} s)"
        m = re.search(r"listening on http://[0-9.]+:(\d+)", line)
        if not m:
            srv.kill()
            check(False, f"serve --device {args.device} started", f"{line!r} {srv.stderr.read()[-800:]}")
            print(f"serve-gpu: {passed} passed, {failed} failed")
            return 1
        port = int(m.group(1))

        def complete(prompt, n=1, **extra):
            if ties:  # each token's runner-up, for same_text
                extra = {"logprobs": 2, **extra}
            try:
                st, body = post(port, "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                          "temperature": 0, "n": n, **extra})
                return st, json.loads(body)
            except Exception as e:  # a timeout or a dead server: a failed check, not a traceback
                return 0, {"error": f"{type(e).__name__}: {e}"}

        def agrees(label, text, choice):
            how = same_text(text, choice, ties)
            if how == "near tie":
                near_ties.append(label)
            return how is not None

        hung = False
        for p in PROMPTS[:2]:
            st, r = complete(p)
            got = r["choices"][0]["text"] if st == 200 else r
            check(st == 200 and agrees(p, want[p], r["choices"][0]), f"one at a time: {p!r}",
                  f"{st} {got!r} vs {want[p]!r}")
            hung = st == 0
            if hung:
                break
        if hung:  # no answer at all: the rest would only wait out their timeouts
            srv.kill()
            srv.wait()
            print(f"  server's last words: {srv.stderr.read()[-800:]!r}")
            print(f"serve-gpu: {passed} passed, {failed} failed (no answer from the server; the rest skipped)")
            return 1
        got = {}

        def job(p):
            got[p] = complete(p)

        threads = [threading.Thread(target=job, args=(p,)) for p in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for p in PROMPTS:
            st, r = got.get(p, (0, {}))
            text = r["choices"][0]["text"] if st == 200 else r
            check(st == 200 and agrees(p, want[p], r["choices"][0]), f"{len(PROMPTS)} at once: {p!r}",
                  f"{st} {text!r} vs {want[p]!r}")

        def read_metrics():
            try:
                st, body = get(port, "/metrics")
                return st, dict(ln.rsplit(" ", 1) for ln in body.decode().splitlines() if ln and not ln.startswith("#"))
            except Exception as e:
                return 0, {"error": f"{type(e).__name__}: {e}"}

        # the prefix cache: one after another, so each later prompt finds the first one's blocks cached
        _, before = read_metrics()
        for p in PREFIXED:
            st, r = complete(p)
            text = r["choices"][0]["text"] if st == 200 else r
            check(st == 200 and agrees(p, want[p], r["choices"][0]), f"prefix cache: {p[len(SHARED):]!r} after the shared start",
                  f"{st} {text!r} vs {want[p]!r}")
        st, metrics = read_metrics()
        hit_tokens = float(metrics.get("zaya_prefix_cache_hit_tokens_total", 0)) - \
            float(before.get("zaya_prefix_cache_hit_tokens_total", 0))
        check(st == 200 and hit_tokens >= 2 * 8, "prefix cache: the later prompts took the shared start's blocks "
              "(/metrics)", {k: metrics.get(k) for k in ("zaya_prefix_cache_hits_total",
                                                         "zaya_prefix_cache_hit_tokens_total")})
        # a prompt's choices: the first prefills it, the others continue from its blocks (forked)
        st, r = complete(PROMPTS[2], n=3)
        texts = [c["text"] for c in r["choices"]] if st == 200 else r
        check(st == 200 and len(texts) == 3 and all(agrees(PROMPTS[2], want[PROMPTS[2]], c) for c in r["choices"]),
              "n = 3 choices (forked from the prompt's blocks)",
              f"{st} {texts!r} vs {want[PROMPTS[2]]!r}")
        # an echoed prompt with log-probabilities: its rows' logits come from the prefill steps (every row's)
        p = PREFIXED[1]
        st, r = complete(p, echo=True, logprobs=2 if ties else 1)
        ok = st == 200 and agrees("echo " + p, p + want[p], r["choices"][0])
        lp = r["choices"][0]["logprobs"]["token_logprobs"] if ok else []
        ok = ok and lp[0] is None and len(lp) > 8 and all(x is not None and -100 < x <= 1e-4 for x in lp[1:])
        check(ok, "echo with logprobs: the prompt and generate's text, a log-probability for every token after the "
              "first", f"{st} {str(r)[:300]}")
        st, metrics = read_metrics()
        check(st == 200 and float(metrics.get("zaya_kv_blocks_used", -1)) == 0 and
              float(metrics.get("zaya_step_errors_total", -1)) == 0 and float(metrics.get("zaya_steps_total", 0)) > 0,
              "every KV block returned, no failed step (/metrics)",
              {k: metrics.get(k) for k in ("zaya_kv_blocks_used", "zaya_step_errors_total", "zaya_steps_total")})
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(30)
            except subprocess.TimeoutExpired:
                srv.kill()
                srv.wait()
    err = srv.stderr.read()
    check(srv.returncode == 0, "SIGTERM: exit 0", f"rc {srv.returncode}: {err[-800:]}")
    if args.device != "cpu":
        check("device GPU" in err, "serve said which GPU it runs on", err[-400:])
    if ties:  # how many completions needed the allowance (0 expected most runs)
        print(f"  completions that left generate's text on a bf16 near tie: {len(near_ties)} {near_ties!r}")
    print(f"serve-gpu: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
