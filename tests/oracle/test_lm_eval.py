#!/usr/bin/env python3
"""lm-evaluation-harness (`lm_eval --model local-completions`, --batch_size 8) against `zaya serve`, on local tasks
made here (no hub access): a multiple-choice task scored by log-likelihood (echo + logprobs, batched token-id
prompts) and a generate_until task (batched token-id prompts, stop "\\n", greedy), with accuracies equal to
`zaya eval`'s on the same items.

The two read the items the same way (docs/serving.md, "lm-eval"): lm-eval's tokenizer is the model folder's
(tokenizer_backend=huggingface, tokenizer=DIR) with a post-processor putting bos first, and add_bos_token=True, as
`zaya eval` puts bos before every context; target_delimiter "" (the choices carry their own leading space, as
zaya's task lines do); the answer is greedy for at most 32 tokens (EVAL_MAX_ANSWER_TOKENS), ended by "\\n" or eos,
stripped of whitespace.

The model is test_serve.py's small random one with the embedding rows of printable ASCII tokens scaled up (tied to
lm_head), so that its greedy answers are text: half the generation items are given the model's own answer (from
`zaya generate`), half a wrong one, and exact match is 0.5 on both sides only if both generate the same text.

    python tests/oracle/test_lm_eval.py [--keep DIR]

The last line is `lm_eval: N passed, N failed`.
"""
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Suite, run_zaya  # noqa: E402
from test_serve import Server, make_model  # noqa: E402

from safetensors.numpy import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer, processors  # noqa: E402

MC_ITEMS = [
    ("the quick brown", [" fox", " dog", " cat"], 0), ("the lazy", [" dog", " fox", " one"], 0),
    ("12+34=", ["46", "12", "99"], 0), ("hello", [" world", " zaya", " two"], 0),
    ("one two", [" three", " four", " five"], 0), ("four five", [" six", " one", " dog"], 0),
    ("jumps over the", [" lazy", " quick", " brown"], 0), ("this is zaya", [" serving", " jumps", " two"], 0),
    ("def f(x):", ["\n    return x", " hello", " 12"], 0), ("return x *", [" 2", " 3", " x"], 0),
    ("hello world,", [" this", " the", " that"], 1), ("the", [" quick", " lazy", " brown", " dog"], 2),
    ("zaya serving a", [" model", " world", " fox"], 0), ("five six", [" seven", " one"], 1),
    ("quick brown fox", [" jumps", " runs", " sits"], 0), ("two three", [" four", " two", " one"], 2),
    ("a model", [" serving", " zaya", " the"], 1), ("the quick", [" brown", " lazy"], 0),
]
GEN_PROMPTS = ["the quick", "12+34=", "hello world", "one two three", "def f(x):", "zaya", "brown fox", "lazy dog",
               "four five six", "this is", "jumps over", "a model"]

MC_YAML = """task: zaya_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
"""
GEN_YAML = """task: zaya_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 32
  do_sample: false
  temperature: 0
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
"""


def prepare_model(work):
    """test_serve.py's model, its tokenizer putting bos first (post-processor) and loadable by AutoTokenizer, and
    its printable-ASCII tokens made likely."""
    mdir = make_model(work)
    tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", bos)])
    tok.save(str(mdir / "tokenizer.json"))
    cfg = json.loads((mdir / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # the tokenizer.json as it is (not the model type's class)
    (mdir / "tokenizer_config.json").write_text(json.dumps(cfg))
    w = load_file(str(mdir / "model.safetensors"))
    key = next(k for k in w if k.endswith("embed_tokens.weight"))
    emb = w[key].copy()
    for i in range(tok.get_vocab_size()):
        t = tok.decode([i], skip_special_tokens=False)
        if t and t.isascii() and t.isprintable() and not t.startswith("<|"):
            emb[i] *= 2.5
    w[key] = emb
    save_file(w, str(mdir / "model.safetensors"), metadata={"format": "pt"})
    return mdir


def greedy_answer(mdir, prompt):
    """zaya eval's answer: greedy from bos + prompt, at most 32 tokens, cut at the first newline, stripped; None
    when it is not clean UTF-8 text."""
    rc, out, err = run_zaya(["generate", "--model", mdir, "--tokenizer", mdir / "tokenizer.json", "--prompt", prompt,
                             "--max-tokens", 32, "--temperature", 0], timeout=120, text=False)
    if rc:
        raise RuntimeError(f"zaya generate failed: {err.decode()}")
    out = out[:-1].split(b"\n")[0]
    try:
        text = out.decode("utf-8").strip(" \t\n\r\f\v")
    except UnicodeDecodeError:
        return None
    return text if text and "\ufffd" not in text and "<|" not in text else None


def checks(res, work):
    """zaya eval on the items, then lm-eval against zaya serve on the same items."""
    mdir = prepare_model(work)
    tasks = work / "tasks"
    tasks.mkdir(exist_ok=True)
    with open(tasks / "mc.jsonl", "w") as f:
        for ctx, choices, answer in MC_ITEMS:
            f.write(json.dumps({"context": ctx, "choices": choices, "answer": answer}) + "\n")
    gen, clean = [], 0
    for i, p in enumerate(GEN_PROMPTS):
        a = greedy_answer(mdir, p)
        right = a is not None and i % 2 == 0
        clean += right
        gen.append({"prompt": p, "answer": a if right else "not the answer"})
    res.check(clean >= 3, "the model's greedy answers are text for some prompts", f"{clean} of {len(GEN_PROMPTS)}")
    with open(tasks / "gen.jsonl", "w") as f:
        for g in gen:
            f.write(json.dumps(g) + "\n")
    (tasks / "zaya_mc.yaml").write_text(MC_YAML.format(data=tasks / "mc.jsonl"))
    (tasks / "zaya_gen.yaml").write_text(GEN_YAML.format(data=tasks / "gen.jsonl"))

    # zaya eval on the same items
    rc, out, err = run_zaya(["eval", "--model", mdir, "--tokenizer", mdir / "tokenizer.json", "--task",
                             tasks / "mc.jsonl", tasks / "gen.jsonl", "--json", work / "zaya_eval.json"], timeout=600)
    if not res.check(rc == 0, "zaya eval", err[-400:]):
        return
    zaya = {t["task"]: t for t in json.loads((work / "zaya_eval.json").read_text())["tasks"]}

    srv = Server(mdir, "--max-batch", 8, "--max-context", 512)
    try:
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", OPENAI_API_KEY="unused")
        model_args = ",".join([f"model={mdir.name}", f"base_url=http://127.0.0.1:{srv.port}/v1/completions",
                               "tokenizer_backend=huggingface", f"tokenizer={mdir}", "tokenized_requests=True",
                               "add_bos_token=True", "max_length=512", "max_gen_toks=32", "num_concurrent=1",
                               "max_retries=1", "timeout=300"])
        cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
               "--tasks", "zaya_mc", "zaya_gen", "--include_path", str(tasks), "--batch_size", "8",
               "--output_path", str(work / "lm_eval_out"), "--seed", "1234"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, cwd=str(work))
        res.check(p.returncode == 0, "lm_eval --model local-completions runs", (p.stdout + p.stderr)[-1500:])
        files = sorted(glob.glob(str(work / "lm_eval_out" / "**" / "results_*.json"), recursive=True))
        res.check(bool(files), "lm_eval wrote its results", str(files))
        if p.returncode == 0 and files:
            got = json.loads(Path(files[-1]).read_text())["results"]
            mc, gn = got.get("zaya_mc", {}), got.get("zaya_gen", {})
            zmc, zgen = zaya["mc"], zaya["gen"]
            res.check(np.isclose(mc.get("acc,none", -1), zmc["acc"]), "multiple choice: acc = zaya eval's",
                      f"lm-eval {mc.get('acc,none')} vs zaya {zmc['acc']}")
            res.check(np.isclose(mc.get("acc_norm,none", -1), zmc["acc_norm"]),
                      "multiple choice: acc_norm = zaya eval's", f"lm-eval {mc.get('acc_norm,none')} vs zaya "
                      f"{zmc['acc_norm']}")
            res.check(np.isclose(gn.get("exact_match,strip", -1), zgen["exact_match"]) and
                      np.isclose(zgen["exact_match"], clean / len(GEN_PROMPTS)),
                      "generate_until: exact_match = zaya eval's = the items given the model's answer",
                      f"lm-eval {gn.get('exact_match,strip')} vs zaya {zgen['exact_match']}, {clean} right")
        mt = srv.metrics()
        n_req = sum(len(c) for _, c, _ in MC_ITEMS) + len(GEN_PROMPTS)
        done = mt.get('zaya_http_responses_total{route="/v1/completions",status="2xx"}', 0)
        res.check(0 < done < n_req / 4, "lm-eval's requests came batched (--batch_size 8)",
                  f"{done} responses for {n_req} requests")
    finally:
        srv.stop()


def main():
    suite = Suite("lm_eval")
    suite.parse_args(keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya-lm-eval-") as work:
        suite.run("lm_eval", checks, suite, work)
    suite.finish()


if __name__ == "__main__":
    main()
