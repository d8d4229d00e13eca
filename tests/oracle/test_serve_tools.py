#!/usr/bin/env python3
"""`zaya serve`'s tool calls through the official `openai` client (and raw HTTP for bad requests), on the small
random model test_serve.py builds, given a ZAYA1-style chat template and tokenizer:

- the template renders `tools`, assistant `tool_calls` (their arguments sent back as JSON strings, as the client
  does) and `role: tool` results exactly as transformers' apply_chat_template renders them;
- the model's output is made a known text by logit_bias on tokens that hold whole calls (added tokens), so that
  tool_choice "auto" must parse them: content outside the calls, tool_calls with ids, names and JSON arguments,
  finish_reason "tool_calls"; streamed, the deltas are OpenAI's (a call's first delta carries index, id, type,
  name and arguments "", the next its arguments) and add up to the non-streamed answer;
- "none": the same prompt (the tools still rendered, as vLLM does) and the text left alone; "required" and a named
  function: the prompt ends with the format's opening, so even this random model answers with a call (named: that
  function; usage counts the opening);
- bad `tools` / `tool_choice` are 400s naming the field; without a known format (a plain template, or
  --tool-call-parser none) tool_choice is a 400 and tools alone are rendered with the text left alone;
  --tool-call-parser with an unknown name stops the server.

    python tests/oracle/test_serve_tools.py [--keep DIR]

The last line is `serve_tools: N passed, N failed`.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya  # noqa: E402
from test_serve import CORPUS, Server, error_of, make_model  # noqa: E402

import openai  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

# ZAYA1's tool-call format (Zyphra's vLLM `zaya_xml` parser; the wrapper tags are special tokens), in a ChatML
# template written for this test: the repository holds no ZAYA1 template.
TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] == 'system' or tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '# Tools\\n\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call a function reply with:\\n<zyphra_tool_call>\\n<function=NAME>\\n"
    "<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</zyphra_tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for tc in message['tool_calls'] or [] -%}"
    "{{- '<zyphra_tool_call>\\n<function=' + tc['function']['name'] + '>\\n' -}}"
    "{%- for k, v in tc['function']['arguments'] | items -%}"
    "{{- '<parameter=' + k + '>\\n' + (v if v is string else v | tojson) + '\\n</parameter>\\n' -}}"
    "{%- endfor -%}"
    "{{- '</function>\\n</zyphra_tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<zyphra_tool_response>\\n' + message['content'] + '\\n</zyphra_tool_response><|im_end|>\\n' -}}"
    "{%- elif message['role'] != 'system' -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>", "<zyphra_tool_call>", "</zyphra_tool_call>",
            "<zyphra_tool_response>", "</zyphra_tool_response>"]
# Whole answers as one token each: logit_bias on one of them makes the random model write exactly that text.
ONE_CALL = ("Let me look.\n<zyphra_tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</zyphra_tool_call>")
TWO_CALLS = ("<zyphra_tool_call>\n<function=now>\n</function>\n</zyphra_tool_call>\n<zyphra_tool_call>\n"
             "<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n</function>\n</zyphra_tool_call>\n"
             "Both asked.")
NAME_NOW = "now>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</zyphra_tool_call>"  # after "<function=" (required)
BROKEN = "<zyphra_tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</zyphra_tool_call> oops"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "now", "description": "The time", "parameters": {"type": "object",
                                                                 "properties": {"tz": {"type": "string"}}}}},
]
MSGS = [{"role": "user", "content": "hello world, what is the weather?"}]


def make_tools_model(work):
    """test_serve's model with a tokenizer holding ZAYA1's tool tokens and the answers above, and TEMPLATE."""
    mdir = make_model(work)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=370, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (ONE_CALL, TWO_CALLS, NAME_NOW, BROKEN)])
    assert tok.get_vocab_size() <= 384
    tok.save(str(mdir / "tokenizer.json"))
    (mdir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": TEMPLATE,
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    return mdir, tok


def whole(r):
    """(content, [(name, arguments dict)], finish) of a non-streamed chat answer; ids checked apart."""
    m = r.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in (m.tool_calls or [])]
    return m.content, calls, r.choices[0].finish_reason


def whole_choice(ch):
    return ch.message.content, len(ch.message.tool_calls or []), ch.finish_reason


def streamed(client, res, label, **kw):
    """The same from a stream, checking each delta has OpenAI's shape."""
    content, calls, finish, shape_ok, why = "", {}, None, True, ""
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            d = c.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                if tc.index not in calls:  # a call's first delta: index, id, type, name, arguments ""
                    ok = tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == ""
                    calls[tc.index] = [tc.id, tc.function.name, ""]
                else:  # then its arguments, appended
                    ok = tc.id is None and tc.function.name is None and tc.function.arguments
                    calls[tc.index][2] += tc.function.arguments or ""
                if not ok:
                    shape_ok, why = False, f"delta {tc}"
            finish = c.finish_reason or finish
    res.check(shape_ok, f"{label}: streamed deltas have OpenAI's shape", why)
    out = [(calls[i][1], json.loads(calls[i][2])) for i in sorted(calls)]
    return content or None, out, finish


def post(srv, body):
    st, _, payload = srv.raw("POST", "/v1/chat/completions", body)
    return st, payload


def checks(res, work):
    mdir, tok = make_tools_model(work)
    name = mdir.name
    vocab = tok.get_vocab()
    bias = {t: {str(vocab[t]): 100} for t in (ONE_CALL, TWO_CALLS, NAME_NOW, BROKEN)}

    # ---- the template: tools, tool_calls sent back with string arguments, role tool = transformers' rendering
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=str(mdir / "tokenizer.json"), bos_token="<|bos|>",
                                 eos_token="<|eos|>")
    history = MSGS + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        {"role": "user", "content": "and tomorrow?"}]
    hf_history = json.loads(json.dumps(history))
    hf_history[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "days": 3}
    want_text = hf.apply_chat_template(hf_history, tools=TOOLS, chat_template=TEMPLATE, tokenize=False,
                                       add_generation_prompt=True)
    want_ids = hf(want_text, add_special_tokens=False)["input_ids"]

    srv = Server(mdir, "--max-batch", 4, "--max-context", 1024)
    try:
        st, _, payload = srv.raw("POST", "/tokenize", {"model": name, "messages": history, "tools": TOOLS,
                                                       "return_token_strs": True})
        got = json.loads(payload)
        res.check(st == 200 and got["tokens"] == want_ids,
                  "role tool round trip: rendered as apply_chat_template renders it",
                  f"{st} {payload[:300]!r}\nwant {want_text!r}")
        res.check("<zyphra_tool_response>\nsunny, 21 C\n</zyphra_tool_response>" in want_text and
                  "<parameter=days>\n3\n</parameter>" in want_text, "role tool round trip: the template's text",
                  want_text)
        cl = srv.client()
        r = cl.chat.completions.create(model=name, messages=history, tools=TOOLS, max_tokens=4, temperature=0)
        res.check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"),
                  "role tool round trip: the conversation is answered", str(r))

        base = dict(model=name, messages=MSGS, tools=TOOLS, temperature=0, max_tokens=1)
        # ---- auto (the default with tools): the calls parsed out of the text
        for label, token, want in [
                ("one call after text", ONE_CALL, ("Let me look.", [("get_weather", {"city": "Paris", "days": 3})])),
                ("two calls, text after", TWO_CALLS, ("Both asked.", [("now", {}), ("get_weather",
                                                                                    {"city": "São Paulo"})])),
                ("a malformed call stays content", BROKEN, (BROKEN, []))]:
            for choice in (None, "auto"):
                kw = dict(base, logit_bias=bias[token], **({"tool_choice": choice} if choice else {}))
                r = cl.chat.completions.create(**kw)
                content, calls, finish = whole(r)
                want_finish = "tool_calls" if want[1] else "length"
                res.check((content, calls, finish) == (want[0], want[1], want_finish),
                          f"auto ({choice or 'default'}): {label}", f"{(content, calls, finish)} vs {want}")
                ids = [c.id for c in r.choices[0].message.tool_calls or []]
                res.check(len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids) and
                          all(c.type == "function" and isinstance(c.function.arguments, str)
                              for c in r.choices[0].message.tool_calls or []),
                          f"auto ({choice or 'default'}): {label}: ids and types", str(ids))
                s = streamed(cl, res, f"auto ({choice or 'default'}): {label}", **kw)
                res.check(s == (content, calls, finish), f"auto ({choice or 'default'}): {label}: streamed = whole",
                          f"{s} vs {(content, calls, finish)}")
        # ---- skip_special_tokens: the calls' tags are special tokens here, so the parser needs them (as in vLLM)
        # (the special opening alone: an unfinished call, so its text comes back, tag included)
        r = cl.chat.completions.create(**dict(base, logit_bias={str(vocab["<zyphra_tool_call>"]): 100},
                                              extra_body={"skip_special_tokens": True}))
        res.check(whole(r) == ("<zyphra_tool_call>", [], "length"),
                  "skip_special_tokens: the special tags still reach the parser", str(whole(r)))
        # ---- n choices: each parsed on its own, ids unique across them
        r = cl.chat.completions.create(**dict(base, logit_bias=bias[TWO_CALLS], n=2))
        ids = [c.id for ch in r.choices for c in ch.message.tool_calls or []]
        res.check(len(r.choices) == 2 and all(whole_choice(ch) == ("Both asked.", 2, "tool_calls") for ch in r.choices)
                  and len(set(ids)) == 4, "n = 2: both choices' calls, four ids", str(r))
        # ---- none: the same prompt, the text untouched
        r_none = cl.chat.completions.create(**dict(base, logit_bias=bias[ONE_CALL], tool_choice="none"))
        content, calls, finish = whole(r_none)
        res.check((content, calls, finish) == (ONE_CALL, [], "length"), "none: the text left alone",
                  str((content, calls, finish)))
        r_auto = cl.chat.completions.create(**dict(base, logit_bias=bias[ONE_CALL]))
        res.check(r_none.usage.prompt_tokens == r_auto.usage.prompt_tokens == len(
            hf(hf.apply_chat_template(MSGS, tools=TOOLS, chat_template=TEMPLATE, tokenize=False,
                                      add_generation_prompt=True), add_special_tokens=False)["input_ids"]),
                  "none: the tools are still rendered (vLLM's behaviour)",
                  f"{r_none.usage.prompt_tokens} vs {r_auto.usage.prompt_tokens}")
        plain = cl.chat.completions.create(model=name, messages=MSGS, temperature=0, max_tokens=6)
        res.check(plain.choices[0].message.tool_calls is None and plain.choices[0].message.content is not None,
                  "no tools: a plain answer", str(plain))
        # ---- required and named: the call is forced, even from this random model
        prompt_len = r_auto.usage.prompt_tokens
        for label, kw, want_name in [
                ("named", dict(tool_choice={"type": "function", "function": {"name": "get_weather"}}), "get_weather"),
                ("required, one tool", dict(tool_choice="required", tools=TOOLS[:1]), "get_weather"),
                ("required, the model names it", dict(tool_choice="required", logit_bias=bias[NAME_NOW]), "now")]:
            args = dict(base, max_tokens=12, **kw)
            r = cl.chat.completions.create(**args)
            m = r.choices[0].message
            ok = (r.choices[0].finish_reason == "tool_calls" and m.tool_calls and
                  m.tool_calls[0].function.name == want_name and
                  isinstance(json.loads(m.tool_calls[0].function.arguments), dict))
            res.check(ok, f"{label}: a call to {want_name}", str(r))
            s = streamed(cl, res, label, **args)
            res.check(s == whole(r), f"{label}: streamed = whole", f"{s} vs {whole(r)}")
            if label == "required, the model names it":
                res.check(json.loads(m.tool_calls[0].function.arguments) == {"tz": "UTC"},
                          f"{label}: its arguments", str(m.tool_calls[0]))
        r = cl.chat.completions.create(**dict(base, max_tokens=12, tool_choice={"type": "function", "function":
                                                                                {"name": "get_weather"}}))
        opening = hf("<zyphra_tool_call>\n<function=get_weather>\n", add_special_tokens=False)["input_ids"]
        res.check(r.usage.prompt_tokens == prompt_len + len(opening),
                  "named: the prompt ends with the call's opening", f"{r.usage.prompt_tokens} vs {prompt_len} + "
                                                                    f"{len(opening)}")
        # ---- bad tools and tool_choice: 400 naming the field
        bad = [
            ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name"),
            ({"tools": [{"type": "function"}]}, "tools[0].function"),
            ({"tools": {"name": "f"}}, "tools"),
            ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
            ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
            ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
            ({"tools": TOOLS, "tool_choice": 3}, "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tools": TOOLS, "messages": [{"role": "assistant", "content": "", "tool_calls": {}}]},
             "messages[0].tool_calls"),
        ]
        for fields, param in bad:
            body = dict({"model": name, "messages": MSGS, "max_tokens": 2}, **fields)
            st, payload = post(srv, body)
            e = error_of(st, payload)
            res.check(e[0] == 400 and e[1] == "invalid_request_error" and e[2] == param,
                      f"bad request names {param}: {json.dumps(fields)[:60]}", str(e))
        try:
            cl.chat.completions.create(**dict(base, tool_choice={"type": "function", "function": {"name": "nope"}}))
            res.check(False, "the openai client sees the 400", "no error")
        except openai.BadRequestError as ex:
            res.check(ex.status_code == 400 and "nope" in str(ex), "the openai client sees the 400", str(ex))
    finally:
        srv.stop()

    # ---- no format: --tool-call-parser none (and a template without one behaves the same)
    srv = Server(mdir, "--max-batch", 2, "--max-context", 1024, "--tool-call-parser", "none")
    try:
        cl = srv.client()
        r = cl.chat.completions.create(**dict(base, logit_bias=bias[ONE_CALL]))
        res.check(whole(r) == (ONE_CALL, [], "length"), "--tool-call-parser none: tools rendered, the text left alone",
                  str(whole(r)))
        st, payload = post(srv, {"model": name, "messages": MSGS, "tools": TOOLS, "tool_choice": "auto"})
        e = error_of(st, payload)
        res.check(e[0] == 400 and e[2] == "tool_choice" and "--tool-call-parser" in e[3],
                  "--tool-call-parser none: tool_choice is a 400 that says why", str(e))
    finally:
        srv.stop()
    srv = Server(mdir, "--max-batch", 2, "--max-context", 1024, "--tool-call-parser", "hermes")
    try:
        r = srv.client().chat.completions.create(**dict(base, logit_bias=bias[ONE_CALL]))
        res.check(whole(r) == (ONE_CALL, [], "length"), "--tool-call-parser hermes: ZAYA1's calls are not hermes'",
                  str(whole(r)))
    finally:
        srv.stop()
    rc, out, err = run_zaya(["serve", "--model", mdir, "--port", "0", "--tool-call-parser", "llama9"], timeout=60)
    res.check(rc != 0 and "--tool-call-parser llama9" in err and "zaya_xml" in err and "listening" not in out,
              "--tool-call-parser with an unknown name", err.strip()[-200:])


def main():
    suite = Suite("serve_tools")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-serve-tools-") as work:
        suite.run("serve_tools", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
