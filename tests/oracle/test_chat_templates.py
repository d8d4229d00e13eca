#!/usr/bin/env python3
"""Oracle test: `zaya tokenizer chat` against transformers' apply_chat_template(..., tokenize=False).

Every template in tests/oracle/chat_templates/ (real chat templates of released models, see the README there) is
set on a tiny PreTrainedTokenizerFast with the model family's special tokens and saved with save_pretrained, so
zaya reads the folder transformers wrote (chat_template.jinja + tokenizer_config.json). Each template renders
several conversations (system prompt, multi-turn, tool calls and tool results, reasoning, content parts, Unicode
and escapes), with and without the generation prompt, with and without tools, and with enable_thinking on and off
where the template reads it. A case passes when both sides render byte-identical text, or both fail (a template
that raises: zaya's message must then contain the template's own text). strftime_now is pinned to 2024-07-26 on
both sides (zaya's --date). Also checks the tokenizer_config.json "chat_template" forms (a string, and a list of
named templates), and that the model-folder loader reports a missing template.

    python3 tests/oracle/test_chat_templates.py [-v] [--only NAMES]

--only takes template names (file names less .jinja) or shell patterns, comma-separated: `--only '*gemma*'`;
`loader` names the loader checks.

Ends with `chat_templates: N passed, N failed` (one check per template, plus the loader checks) after a line per
template giving its byte-exact count; exits non-zero on failure. ZAYA_BIN overrides the zaya command.
"""
import argparse
import datetime
import json
from pathlib import Path

from harness import Suite, run_zaya
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
import transformers.utils.chat_template_utils as ctu

transformers.utils.logging.set_verbosity_error()
TEMPLATES = Path(__file__).resolve().parent / "chat_templates"
DATE = "2024-07-26"
suite = Suite("chat_templates", print_passes=True)


class FixedDatetime(datetime.datetime):
    """strftime_now() in transformers calls datetime.now(): pinned so that both sides print the same date."""

    @classmethod
    def now(cls, tz=None):
        return cls(2024, 7, 26, 0, 0, 0)


ctu.datetime = FixedDatetime


# ----------------------------------------------------------------------------------------------
# special tokens by model family (file-name prefix); the rest get <s> / </s>

SPECIALS = [
    ("google-gemma", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}),
    ("meta-llama", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("fireworks", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("meetkai", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("NousResearch", {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}),
    ("Qwen", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ("deepseek", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("llama-cpp-deepseek", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("microsoft-Phi", {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"}),
    ("CohereForAI", {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"}),
    ("openai-gpt-oss", {"eos_token": "<|return|>", "pad_token": "<|endoftext|>"}),
]


def specials_for(name):
    for prefix, sp in SPECIALS:
        if name.startswith(prefix):
            return sp
    return {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def make_tokenizer(template, specials):
    vocab = {"<unk>": 0}
    for tok in specials.values():
        vocab.setdefault(tok, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tk, chat_template=template, **specials)


# ----------------------------------------------------------------------------------------------
# conversations

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web — returns snippets.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "What to look for"}},
                       "required": ["query"]},
    },
}
TOOLS = [WEATHER, SEARCH]

CALL = {"id": "call_abc123def", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 2}}}
CALL_STR = {"id": "call_xyz987uvw", "type": "function",
            "function": {"name": "search", "arguments": "{\"query\": \"zaya \\\"models\\\"\"}"}}

CONVERSATIONS = {
    "system": [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "Hello!"}],
    "multi": [{"role": "user", "content": "What is 2+2?"},
              {"role": "assistant", "content": "2+2 = 4."},
              {"role": "user", "content": "And 3+3?"}],
    "multi_sys": [{"role": "system", "content": "Answer briefly.\nUse metric units."},
                  {"role": "user", "content": "How tall is the Eiffel tower?"},
                  {"role": "assistant", "content": "About 330 m."},
                  {"role": "user", "content": "And in feet?"},
                  {"role": "assistant", "content": "About 1,083 ft."}],
    "tool_calls": [{"role": "system", "content": "You can look up the weather."},
                   {"role": "user", "content": "Weather in Paris for 2 days?"},
                   {"role": "assistant", "content": "", "tool_calls": [CALL]},
                   {"role": "tool", "tool_call_id": "call_abc123def", "name": "get_weather",
                    "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
                   {"role": "assistant", "content": "It is 21.5 °C and clear."},
                   {"role": "user", "content": "Thanks! Now search for zaya."}],
    "tool_string_args": [{"role": "user", "content": "Search for zaya models."},
                         {"role": "assistant", "content": None, "tool_calls": [CALL_STR]},
                         {"role": "tool", "tool_call_id": "call_xyz987uvw", "name": "search",
                          "content": "Zaya: a family of MoE models."}],
    "reasoning": [{"role": "user", "content": "Is 17 prime?"},
                  {"role": "assistant", "reasoning_content": "17 has no divisors but 1 and itself.",
                   "content": "Yes, 17 is prime."},
                  {"role": "user", "content": "And 21?"}],
    "parts": [{"role": "system", "content": [{"type": "text", "text": "Be concise."}]},
              {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "a cat."}]}],
    "unicode": [{"role": "user", "content": "  Quotes ' \" and \\backslash\\, tabs\tand\nnewlines;\n émoji 😀, 中文, "
                                            "{{ not jinja }} {% raw %} <|im_end|>  "},
                {"role": "assistant", "content": "Ünïcödé ✓ — \"ok\"\n\n"},
                {"role": "user", "content": "Again: \u2028 line separator, \u00a0nbsp."}],
}


# variables a template needs beyond transformers' own (fireworks' firefunction reads its tools as a JSON string)
EXTRA_VARS = {
    "fireworks-ai-llama-3-firefunction-v2": {
        "functions": json.dumps([t["function"] for t in TOOLS], ensure_ascii=False), "datetime": "2024-07-26 12:00"},
}


def kw_variants(template, name):
    base = EXTRA_VARS.get(name, {})
    out = [dict(base)]
    if "enable_thinking" in template:
        out += [dict(base, enable_thinking=False), dict(base, enable_thinking=True)]
    return out


def render_ref(tok, messages, gen, tools, kwargs):
    try:
        return "ok", tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False, **kwargs)
    except Exception as e:  # the template (or transformers) refused
        return "err", f"{type(e).__name__}: {e}"


def render_zaya(folder, messages, gen, tools, kwargs, tmp):
    """One conversation through `zaya tokenizer chat --messages` (--tools, --set, --add-generation-prompt)."""
    mfile = Path(tmp) / "messages.json"
    mfile.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    args = ["tokenizer", "chat", "--tokenizer", folder, "--messages", mfile, "--date", DATE]
    if gen:
        args.append("--add-generation-prompt")
    if tools is not None:
        tfile = Path(tmp) / "tools.json"
        tfile.write_text(json.dumps(tools, ensure_ascii=False), encoding="utf-8")
        args += ["--tools", tfile]
    for k, v in kwargs.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    rc, out, err = run_zaya(args, timeout=60, text=False)
    if rc == 0:
        return "ok", out.decode("utf-8")
    return "err", err.decode("utf-8", "replace").strip()


def render_zaya_jsonl(folder, cases, tmp):
    """Every case in one `zaya tokenizer chat --jsonl` run: a JSON string or {"error": ...} per line."""
    jfile = Path(tmp) / f"{Path(folder).name}.jsonl"
    with open(jfile, "w", encoding="utf-8") as f:
        for _, messages, gen, tools, kwargs in cases:
            obj = {"messages": messages, "add_generation_prompt": gen, **kwargs}
            if tools is not None:
                obj["tools"] = tools
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    rc, out, err = run_zaya(["tokenizer", "chat", "--tokenizer", folder, "--jsonl", jfile, "--date", DATE], timeout=60,
                            text=False)
    lines = out.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(cases):
        return [("err", f"zaya --jsonl gave {len(lines)} lines for {len(cases)} cases (exit {rc}): "
                        f"{err.decode('utf-8', 'replace')[:300]}")] * len(cases)
    res = []
    for line in lines:
        v = json.loads(line)
        res.append(("ok", v) if isinstance(v, str) else ("err", v.get("error", "")))
    return res


def same(ref, got):
    if ref[0] == "ok":
        return got[0] == "ok" and got[1] == ref[1]
    if got[0] != "err":
        return False
    # a template's own raise_exception message must come through
    if ref[1].startswith("TemplateError: "):
        return ref[1][len("TemplateError: "):] in got[1]
    return True


def run_template(path, args, tmp):
    name = path.stem
    template = path.read_text(encoding="utf-8")
    specials = specials_for(name)
    tok = make_tokenizer(template, specials)
    folder = Path(tmp) / name
    tok.save_pretrained(folder)
    cases = []
    for conv_name, conv in CONVERSATIONS.items():
        for tools in ([None, TOOLS] if "tools" in template else [None]):
            for gen in (False, True):
                for kw in kw_variants(template, name):
                    cases.append((f"{conv_name} gen={gen} tools={tools is not None} {kw or ''}", conv, gen, tools, kw))
    refs = [render_ref(tok, json.loads(json.dumps(c[1])), c[2], json.loads(json.dumps(c[3])), c[4]) for c in cases]
    gots = render_zaya_jsonl(folder, cases, tmp)
    # the single-conversation path (--messages, --tools, --set) on the richest case that renders
    direct = max((i for i, r in enumerate(refs) if r[0] == "ok"),
                 key=lambda i: (cases[i][3] is not None, bool(cases[i][4]), len(cases[i][1])), default=0)
    _, conv, gen, tools, kw = cases[direct]
    direct_got = render_zaya(folder, conv, gen, tools, kw, tmp)
    n_ok = n_exact = 0
    first_bad = None
    for i, (case, ref, got) in enumerate(zip(cases, refs, gots)):
        ok = same(ref, got)
        n_ok += ok
        n_exact += ok and ref[0] == "ok"
        if not ok and first_bad is None:
            first_bad = f"{case[0]}\n      ref : {ref[1][:400]!r}\n      zaya: {got[1][:400]!r}"
        if args.verbose:
            print(f"    {'ok  ' if ok else 'FAIL'} {case[0]} ({ref[0]})")
            if ref[0] == "err" or not ok:
                print(f"        ref : {ref[1][:300]!r}\n        zaya: {got[1][:300]!r}")
    direct_ok = same(refs[direct], direct_got)
    if not direct_ok and first_bad is None:
        first_bad = f"--messages {cases[direct][0]}\n      ref : {refs[direct][1][:400]!r}\n      zaya: {direct_got[1][:400]!r}"
    detail = f"{n_exact} byte-exact renders, {n_ok - n_exact} errors on both sides, of {len(cases)} cases"
    if first_bad:
        detail += f"; first difference: {first_bad}"
    return suite.check(n_ok == len(cases) and direct_ok and n_exact > 0, name, detail), n_exact, len(cases)


def loader_checks(tmp):
    gemma = (TEMPLATES / "google-gemma-3-it.jinja").read_text(encoding="utf-8")
    conv = CONVERSATIONS["system"]
    tok = make_tokenizer(gemma, specials_for("google-gemma"))
    want = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    # "chat_template" as a string of tokenizer_config.json, special tokens as AddedToken objects
    d = Path(tmp) / "config_string"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<bos>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "eos_token": "<eos>", "chat_template": gemma}), encoding="utf-8")
    got = render_zaya(d / "tokenizer_config.json", conv, True, None, {}, tmp)
    suite.check(got == ("ok", want), "loader: tokenizer_config.json chat_template string", repr(got[1][:200]))
    # a list of named templates: "default", or "tool_use" when tools are given (as transformers picks)
    d = Path(tmp) / "config_list"
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "chat_template": [{"name": "tool_use", "template": "TOOLS {{ tools|length }}"},
                                                {"name": "default", "template": gemma}]}), encoding="utf-8")
    got = render_zaya(d, conv, True, None, {}, tmp)
    suite.check(got == ("ok", want), "loader: named templates pick 'default'", repr(got[1][:200]))
    got = render_zaya(d, conv, True, TOOLS, {}, tmp)
    suite.check(got == ("ok", "TOOLS 2"), "loader: named templates pick 'tool_use' with tools", repr(got[1][:200]))
    # no template at all: a clear error naming the folder
    d = Path(tmp) / "no_template"
    d.mkdir()
    (d / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    got = render_zaya(d, conv, True, None, {}, tmp)
    suite.check(got[0] == "err" and "no chat template" in got[1], "loader: missing template is an error", got[1][:200])
    # an unsupported construct names itself and its line:column
    d = Path(tmp) / "unsupported"
    d.mkdir()
    (d / "chat_template.jinja").write_text("{{ bos_token }}\n  {{ messages | wordwrap(5) }}", encoding="utf-8")
    got = render_zaya(d, conv, True, None, {}, tmp)
    suite.check(got[0] == "err" and "line 2:17" in got[1] and "wordwrap" in got[1],
                "loader: unsupported filter reported with line:column", got[1][:200])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = suite.parse_args(ap, parts="template names (file names less .jinja), loader")
    suite.require_zaya()
    paths = [p for p in sorted(TEMPLATES.glob("*.jinja")) if suite.selected(p.stem)]
    with suite.work_dir("zaya-chat-") as tmp:
        exact = total = 0
        for p in paths:
            counts = suite.run(p.stem, run_template, p, args, tmp)
            if counts:  # None where the template's part raised
                exact += counts[1]
                total += counts[2]
        print(f"templates: {len(paths)}, cases: {total}, byte-exact renders: {exact} (the rest fail on both sides)")
        suite.run("loader", loader_checks, tmp)
    suite.finish()


if __name__ == "__main__":
    main()
