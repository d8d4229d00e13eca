#!/usr/bin/env python3
"""`zaya serve`'s structured output (`response_format`) through the official `openai` client, on the small random
model test_serve.py builds, checked with `jsonschema`:

- 200 answers sampled at temperature 1 (chat and completions, streamed and not, n choices, several max_tokens down to
  the shortest document's length) under five schemas (properties with required and optional ones, nesting, arrays
  with minItems/maxItems, enum, const, anyOf, type lists, $defs/$ref) ALL parse and validate against their schema;
- json_object: every answer is a JSON object;
- the openai client's own `parse` with a pydantic model (its strict schema: additionalProperties false, every property
  required) gives the model's object;
- bad schemas and response_format shapes get a 400 naming response_format and the keyword; a max_tokens below the
  shortest document a 400 naming max_tokens.

    python tests/oracle/test_serve_schema.py [--keep DIR]

The last line is `serve_schema: N passed, N failed`.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite  # noqa: E402
from test_serve import Server, error_of, make_model  # noqa: E402

import jsonschema  # noqa: E402

SCHEMAS = {
    "person": {
        "type": "object", "title": "Person",
        "properties": {
            "name": {"type": "string", "description": "full name"},
            "age": {"type": "integer"},
            "email": {"type": ["string", "null"]},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "tags"], "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                      "required": ["x", "y"], "additionalProperties": False},
            "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "values": {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
            "meta": {"type": "object"},
        },
        "required": ["point", "values"], "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "kind": {"const": "event"},
            "level": {"enum": ["low", "mid", "high", 3, None]},
            "ok": {"type": "boolean"},
            "items": {"type": "array"},
        },
        "required": ["kind", "level", "ok"], "additionalProperties": False,
    },
    "refs": {
        "$defs": {"Item": {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
                           "required": ["id"], "additionalProperties": False}},
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1, "maxItems": 3},
                       "total": {"type": "number"}},
        "required": ["items", "total"], "additionalProperties": False,
    },
    "list": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}},
                                        "required": ["k"]}, "maxItems": 5},
}
# the shortest documents, written compactly: the least max_tokens each schema accepts (one token per byte)
SHORTEST = {"person": '{"name":"","age":0,"tags":["red"]}', "nested": '{"point":{"x":0,"y":0},"values":[]}',
            "event": '{"kind":"event","level":3,"ok":true}', "refs": '{"items":[{"id":0}],"total":0}', "list": "[]"}

MSGS = [{"role": "user", "content": "Give me the data as JSON."}]


def rf(name):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def validate(res, label, text, schema, bad):
    """One answer: parses and validates, or is recorded in bad."""
    try:
        doc = json.loads(text)
        jsonschema.validate(doc, schema)
        return True
    except Exception as e:  # noqa: BLE001
        bad.append(f"{label}: {type(e).__name__}: {str(e)[:120]} in {text!r}"[:400])
        return False


def sample_all(res, srv, name_):
    """Answers under each schema, in every way a client asks: (label, text, finish_reason) triples."""
    cl = srv.client()
    out = []
    seed = 0
    for name in SCHEMAS:
        for max_tokens in (len(SHORTEST[name]), 48, 120):
            seed += 1
            # chat, n choices in one request
            r = cl.chat.completions.create(model=name_, messages=MSGS, response_format=rf(name), temperature=1.0,
                                           max_tokens=max_tokens, n=4, seed=seed)
            out += [(f"{name} chat max_tokens={max_tokens} #{c.index}", name, c.message.content, c.finish_reason)
                    for c in r.choices]
            # completions, a batch of two prompts with 2 choices each (vLLM takes response_format there too)
            r = cl.completions.create(model=name_, prompt=["hello", "12+34="], temperature=1.0, max_tokens=max_tokens,
                                      n=2, seed=seed, extra_body={"response_format": rf(name)})
            out += [(f"{name} completion max_tokens={max_tokens} #{c.index}", name, c.text, c.finish_reason)
                    for c in r.choices]
            # streamed chat
            text, finish = "", None
            for ch in cl.chat.completions.create(model=name_, messages=MSGS, response_format=rf(name),
                                                 temperature=1.0, max_tokens=max_tokens, seed=seed, stream=True):
                for c in ch.choices:
                    text += c.delta.content or ""
                    finish = c.finish_reason or finish
            out.append((f"{name} streamed max_tokens={max_tokens}", name, text, finish))
    return out


def checks(res, work):
    mdir = make_model(work)
    name_ = mdir.name
    for s in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(s)
    for name, doc in SHORTEST.items():
        jsonschema.validate(json.loads(doc), SCHEMAS[name])
    srv = Server(mdir, "--max-batch", 8)
    try:
        cl = srv.client()
        answers = sample_all(res, srv, name_)
        # top up to 200 with more chat choices at temperature 1 and moderate budgets
        seed = 1000
        while len(answers) < 200:
            name = list(SCHEMAS)[seed % len(SCHEMAS)]
            seed += 1
            r = cl.chat.completions.create(model=name_, messages=MSGS, response_format=rf(name), temperature=1.0,
                                           max_tokens=32 + seed % 64, n=min(8, 200 - len(answers)), seed=seed)
            answers += [(f"{name} chat seed={seed} #{c.index}", name, c.message.content, c.finish_reason)
                        for c in r.choices]
        bad = []
        ok = sum(validate(res, label, text, SCHEMAS[name], bad) for label, name, text, _ in answers)
        res.check(len(answers) >= 200 and ok == len(answers),
                  f"{len(answers)} answers at temperature 1 under {len(SCHEMAS)} schemas parse and validate",
                  f"{ok} valid; " + " | ".join(bad[:3]))
        finishes = {f for *_, f in answers}
        res.check(finishes <= {"stop", "length"} and "stop" in finishes, "finish reasons are stop (the document "
                  "ended) or length (closed within max_tokens)", str(finishes))
        tight = [(label, name, t) for label, name, t, _ in answers if f"max_tokens={len(SHORTEST[name])} " in label + " "]
        tight_bad = []
        res.check(len(tight) >= 40 and all(validate(res, lb, t, SCHEMAS[n], tight_bad) for lb, n, t in tight),
                  "answers with max_tokens = the shortest document's length in bytes validate", f"{len(tight)} "
                  f"answers; " + " | ".join(tight_bad[:2]))
        distinct = len({t for _, _, t, _ in answers})
        res.check(distinct > 150, "the answers differ (sampled, not one forced document)", f"{distinct} distinct")

        # json_object
        objs = []
        for seed in range(5):
            r = cl.chat.completions.create(model=name_, messages=MSGS, response_format={"type": "json_object"},
                                           temperature=1.0, max_tokens=40 + 10 * seed, n=4, seed=seed)
            objs += [c.message.content for c in r.choices]
        parsed = []
        for t in objs:
            try:
                parsed.append(json.loads(t))
            except ValueError:
                parsed.append(None)
        res.check(all(isinstance(p, dict) for p in parsed), "json_object: 20 answers are JSON objects",
                  str([t for t, p in zip(objs, parsed) if not isinstance(p, dict)][:2]))
        r = cl.chat.completions.create(model=name_, messages=MSGS, response_format={"type": "text"}, max_tokens=4,
                                       temperature=0)
        res.check(r.choices[0].finish_reason in ("stop", "length"), "response_format text: as without it")

        # the client's parse with a pydantic model
        try:
            import pydantic
        except ImportError:
            pydantic = None
        res.check(pydantic is not None, "pydantic (an openai dependency) is installed")
        if pydantic is not None:
            class Point(pydantic.BaseModel):
                x: int
                label: str
                tags: list[str]

            parse = getattr(cl.chat.completions, "parse", None) or cl.beta.chat.completions.parse
            r = parse(model=name_, messages=MSGS, response_format=Point, temperature=1.0, max_tokens=60, seed=5)
            p = r.choices[0].message.parsed
            res.check(isinstance(p, Point), "openai's parse(response_format=PydanticModel) gives the model's object",
                      repr(r.choices[0].message.content))

        # errors
        def bad_schema(schema, want, param="response_format", **extra):
            body = {"model": name_, "messages": MSGS, "max_tokens": 64,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
            body.update(extra)
            st, _, payload = srv.raw("POST", "/v1/chat/completions", body)
            _, _, prm, msg = error_of(st, payload)
            res.check(st == 400 and prm == param and want in msg, f"400 naming {want!r}", f"{st} {payload[:300]}")

        bad_schema({"type": "string", "pattern": "^a"}, "'pattern' is not supported")
        bad_schema({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}},
                   "'format' is not supported (at properties.when)")
        bad_schema({"anyOf": [{"type": "integer"}, {"type": "number"}]}, "two alternatives can start with")
        bad_schema({"$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}},
                    "$ref": "#/$defs/N"}, "recursive")
        bad_schema({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "'required' names \"b\"")
        bad_schema({"type": "xml"}, "'type' \"xml\"")
        bad_schema(SCHEMAS["person"], "'max_tokens' is 10", param="max_tokens", max_tokens=10)
        for fmt, want in [({"type": "json_schema"}, "'response_format.json_schema' must be an object"),
                          ({"type": "json_schema", "json_schema": {"schema": {}}}, "name' is required"),
                          ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}},
                           "unknown field 'extra'"),
                          ({"type": "yaml"}, "'response_format.type' must be"),
                          ({"type": "json_object", "schema": {}}, "unknown field 'schema'")]:
            st, _, payload = srv.raw("POST", "/v1/completions",
                                     {"model": name_, "prompt": "x", "max_tokens": 8, "response_format": fmt})
            _, _, prm, msg = error_of(st, payload)
            res.check(st == 400 and prm == "response_format" and want in msg, f"400 for response_format {fmt}",
                      f"{st} {payload[:300]}")
    finally:
        srv.stop()


def main():
    suite = Suite("serve_schema")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-serve-schema-") as work:
        suite.run("serve_schema", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
