#!/usr/bin/env python3
"""Oracle test: zaya's tokenizer on the pipelines tokenizers are released with, against Hugging Face `tokenizers`.

Builds, with the `tokenizers` library itself, tokenizers shaped like the released ones and trains them on a
generated corpus (mixed scripts, emoji, code, white-space runs, numbers):
  - Gemma 3: BPE(byte_fallback, unk <unk>, fuse_unk) with the 256 <0xNN> tokens, normalizer Replace(" ", "▁"),
    pre-tokenizer Split(" ", MergedWithPrevious), decoder Sequence[Replace("▁", " "), ByteFallback, Fuse],
    TemplateProcessing adding <bos> (its converter's exact components, transformers' GemmaConverter), plus added
    tokens with every flag combination (special or not, lstrip, rstrip, single_word, normalized), saved with a
    tokenizer_config.json (add_bos_token);
  - the same vocabulary under other pipelines: Llama 2 (Prepend + Replace normalizers, Strip decoder), Metaspace
    (prepend_scheme first / always / never, split), Split with regex patterns and each behavior, invert;
  - a byte-level BPE as Llama 3 has it (Split regex Isolated + ByteLevel(use_regex=False), ignore_merges);
and checks that `zaya tokenizer encode` gives HF's Tokenizer.encode(text).ids (with and without special tokens)
and `zaya tokenizer decode` gives HF's decode(ids) (skip_special_tokens both ways; --lossy byte for byte, also on
ids that decode to invalid UTF-8) for hundreds of held-out strings and edge cases, that invalid UTF-8 encodes as
its U+FFFD replacement, that tokenizer_config.json's add_bos_token / add_eos_token act as in transformers, that a
262,144-token vocabulary loads in well under a second, and measures encode speed against `tokenizers` on the
same text, one thread each.

    python3 tests/oracle/test_tokenizer_gemma.py [--keep DIR] [--bench-mb N]

Prints one line per check and ends with `tokenizer_gemma: N passed, N failed`; exits non-zero on failure.
ZAYA_BIN overrides the zaya command (split with shlex).
"""
import argparse
import json
import os
import random
import re
import time

from harness import Suite, run_zaya, write_file

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers loads: the speed checks set one thread against one
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402,E501

suite = Suite("tokenizer_gemma", print_passes=True)


def zaya(*args):
    """zaya on one thread (the speed checks set one thread against one), bytes out (decoded ids need not be UTF-8)."""
    return run_zaya(args, timeout=600, text=False, threads=1)


# ----------------------------------------------------------------------------------------------
# text

WORDS = """the of and to in is was that for it with as on be at by this had not are but from or have an they which
one you were her all she there would their we him been has when who will more no if out so said what up its about
into than them can only other new some could time these two may then do first any my now such like our over man me
even most made after also did many before must through back years where much your way well down should because each
just those people how too little state good very make world still own see men work long get here between both life
being under never day same another know while last might us great old year off come since against go came right used
take three states himself few house use during without again place around however home small found thought went say
part once general high upon school every don't does got left number course war until always away something fact
though water less public put think almost hand enough far took head yet government system better set told nothing
night end why called didn't eyes find going look asked later knew point next program city business give group young
""".split()
SCRIPTS = {
    "greek": (0x3B1, 0x3C9), "cyrillic": (0x430, 0x44F), "arabic": (0x627, 0x64A), "hebrew": (0x5D0, 0x5EA),
    "devanagari": (0x915, 0x939), "cjk": (0x4E00, 0x4FFF), "hiragana": (0x3041, 0x3096), "hangul": (0xAC00, 0xAFFF),
    "thai": (0xE01, 0xE2E), "georgian": (0x10D0, 0x10FA),
}
MARKS = {"devanagari": [0x93E, 0x93F, 0x940, 0x947, 0x94D, 0x902], "thai": [0xE31, 0xE34, 0xE48], "arabic": [0x64E, 0x650]}
EMOJI = ["😀", "🎉", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸", "1️⃣", "❤️", "🧑‍💻", "🐍", "✨", "🤖", "©", "™", "∑", "→"]
PUNCT = [".", ",", "!", "?", "...", ";", ":", "—", "-", "(", ")", "[", "]", "{", "}", "«", "»", "“", "”", "'", "\"", "/",
         "\\", "@", "#", "$", "%", "&", "*", "_", "+", "=", "<", ">", "|", "~", "`", "¿", "…", "·", "°"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", " \n", "  \n  ", "\r\n", "\u00a0", "\u3000", "\u2009"]
CODE = [
    "def {name}(x, y=None):\n    if y is None:\n        return x * 2\n    return [i ** 2 for i in range(x) if i % 3]\n",
    "for (int i = 0; i < n; i++) {{\n\tsum += a[i] * b[i];\n}}\n",
    "#include <stdio.h>\nint main(void) {{ printf(\"%d\\n\", {num}); return 0; }}\n",
    "const {name} = async () => {{ await fetch('/api/v1/{name}?q=' + s); }};\n",
    "    x_{num} = np.zeros((3, 4), dtype=np.float32)  # shape (3, 4)\n",
    "<div class=\"{name}\">\n  <span>{num}</span>\n</div>\n",
]


def script_word(rng, script):
    lo, hi = SCRIPTS[script]
    out = []
    for _ in range(rng.randint(1, 7)):
        out.append(chr(rng.randint(lo, hi)))
        if script in MARKS and rng.random() < 0.3:
            out.append(chr(rng.choice(MARKS[script])))
    return "".join(out)


def sentence(rng):
    parts = []
    for _ in range(rng.randint(3, 25)):
        r = rng.random()
        if r < 0.6:
            w = rng.choice(WORDS)
            parts.append(w.capitalize() if rng.random() < 0.1 else w)
        elif r < 0.72:
            parts.append(script_word(rng, rng.choice(list(SCRIPTS))))
        elif r < 0.8:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        elif r < 0.86:
            parts.append(rng.choice(EMOJI))
        else:
            parts.append(rng.choice(PUNCT))
        parts.append(rng.choice(SPACES) if rng.random() < 0.12 else " ")
    return "".join(parts).strip(" ") + rng.choice([".", "!", "?", "", "\n"])


def paragraph(rng):
    if rng.random() < 0.2:
        return rng.choice(CODE).format(name=rng.choice(WORDS).replace("'", ""), num=rng.randint(0, 9999))
    return " ".join(sentence(rng) for _ in range(rng.randint(1, 5)))


def corpus(rng, n_chars):
    out, n = [], 0
    while n < n_chars:
        p = paragraph(rng)
        out.append(p)
        n += len(p)
    return "\n".join(out)


EDGE_CASES = [
    "", " ", "  ", "      ", "\n", "\n\n\n\n", "\t", " \t \n ", "a", " a", "a ", "  a  b  ", "a  b   c    d",
    "hello world", "Hello, World!", "don't stop", "x\u00a0y", "x\u3000y", "\u2028", "line1\r\nline2\r\n",
    "😀", "😀😀😀", "👨‍👩‍👧‍👦", "🏳️‍🌈 flag", "a😀b", "日本語のテキスト", "한국어 텍스트", "Ελληνικά κείμενο",
    "नमस्ते दुनिया", "مرحبا بالعالم", "שלום עולם", "ภาษาไทย", "mixed English 日本語 and Русский 123",
    "12345678901234567890", "3.14159", "1,000,000", "-42", "0x1F600",
    "\u0301", "e\u0301", "\ufffd", "\x00", "a\x00b", "\x7f", "\u200d", "\ufeff", "\U0001F9D1\u200d\U0001F4BB",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U00010348", "\U000E0001", "ǅ", "ﬁ", "Ⅻ", "½",
    "▁", "▁▁", "a▁b", "▁leading", "trailing▁", " ▁ ", "<0x41>", "<unk>", "<bos>", "<eos>", "<pad>",
    "<bos>hello", "hello<eos>", "<bos><eos><pad>", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "x<start_of_turn>y", "  <start_of_turn>  ", "<mask>", "a <mask> b", "a<mask>b", "a  <mask>  b", "\n<mask>\n",
    "[[x]]", "a[[x]]b", "a [[x]] b", "é[[x]]", "[[x]][[x]]", "_[[x]]_", "1[[x]]2", ".[[x]].",
    "hello world!", "hello  world", "say hello world", "hello▁world", "Hello World",
    "<lstrip>", "a   <lstrip>", "a   <lstrip>   b", "<rstrip>   b", "a <rstrip>   b", "<both>", "  <both>  x",
    "<lstrip><rstrip>", "<rstrip>   <lstrip>", "x  <rstrip>  <lstrip>  y",
    "\n\n", "a\n\nb", "\n\n\n", " \n\n ", "code:\n\n\tindent",
    "<tag>", "<tag>a", "a<tag>", "<ta", "tag>",
    "sp ace", "sp  ace", "sp ace sp ace",
    "\u00e9\u00e8\u00ea", "ß", "İstanbul", "ﬀ", "\U0001F600" * 10, "a" * 300, " " * 300, "ab" * 200, "\n" * 100,
    "the " * 200, "日本" * 150, "x" * 1000 + " y",
]


# ----------------------------------------------------------------------------------------------
# building the tokenizers


SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def added_tokens():
    """Added tokens after the model vocabulary, one for each flag combination worth telling apart."""
    return [
        AddedToken("<start_of_turn>", special=True, normalized=False),
        AddedToken("<end_of_turn>", special=True, normalized=False),
        AddedToken("[[x]]", special=False, normalized=False, single_word=True),
        AddedToken("hello world", special=False, normalized=True),
        AddedToken("<lstrip>", special=True, normalized=False, lstrip=True),
        AddedToken("<rstrip>", special=False, normalized=False, rstrip=True),
        AddedToken("<both>", special=True, normalized=False, lstrip=True, rstrip=True),
        AddedToken("\n\n", special=False, normalized=False),
        AddedToken("<tag>", special=False, normalized=True, single_word=True),
        AddedToken("sp ace", special=False, normalized=True, lstrip=True),
        AddedToken("▁▁", special=False, normalized=True),
    ]


def train_gemma_like(texts, vocab_size, whole_texts=False):
    """A Gemma-3-shaped BPE trained by tokenizers. SentencePiece splits words at white space while training, so
    the trainer runs with Split("▁", MergedWithNext) unless whole_texts (then merges may span words); the
    vocabulary gets the specials first, then the 256 byte tokens, then the learned tokens."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    if whole_texts:
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    else:
        tok.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  max_token_length=16 if whole_texts else None)
    tok.train_from_iterator(texts, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    learned = sorted((i, t) for t, i in vocab.items() if t not in SPECIALS)
    new_vocab = {t: i for i, t in enumerate(SPECIALS)}
    for t in BYTE_TOKENS:
        new_vocab.setdefault(t, len(new_vocab))
    for _, t in learned:
        new_vocab.setdefault(t, len(new_vocab))
    data["model"]["vocab"] = new_vocab
    data["added_tokens"] = [{"id": new_vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for t in SPECIALS]
    return data


def gemma_pipeline(data):
    """Gemma 3's components (transformers' GemmaConverter) on a tokenizer.json dict."""
    tok = Tokenizer.from_str(json.dumps(data))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos>:1 $B:1",
                                                       special_tokens=[("<bos>", bos)])
    tok.add_tokens(added_tokens())
    return tok


def save(tok, folder, config=None):
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = folder / "tokenizer_config.json"
    if config is None:
        if cfg.exists():
            cfg.unlink()
    else:
        cfg.write_text(json.dumps(config), encoding="utf-8")
    return folder


# ----------------------------------------------------------------------------------------------
# zaya calls


def zaya_encode_many(tok_path, texts, tmp, no_special=False):
    p = tmp / "enc.jsonl"
    with open(p, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t, ensure_ascii=True) + "\n")
    args = ["tokenizer", "encode", "--tokenizer", tok_path, "--jsonl", p] + (["--no-special"] if no_special else [])
    rc, so, se = zaya(*args)
    if rc:
        return None, se.decode(errors="replace").strip()
    lines = so.decode().split("\n")[:-1]
    return [[int(x) for x in line.split()] for line in lines], ""


def zaya_decode_many(tok_path, id_lists, tmp, skip_special=False, lossy=False):
    p = tmp / "dec.jsonl"
    with open(p, "w") as f:
        for ids in id_lists:
            f.write(json.dumps(ids) + "\n")
    args = ["tokenizer", "decode", "--tokenizer", tok_path, "--jsonl", p]
    args += (["--skip-special"] if skip_special else []) + (["--lossy"] if lossy else [])
    rc, so, se = zaya(*args)
    if rc:
        return None, se.decode(errors="replace").strip()
    out = [json.loads(line).encode("utf-8", "surrogateescape") for line in so.decode("utf-8").split("\n")[:-1]]
    return out, ""


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_encode(name, tok_path, hf, texts, tmp, no_special=False):
    z, err = zaya_encode_many(tok_path, texts, tmp, no_special)
    if z is None:
        return suite.check(False, f"{name}: zaya encode", err)
    h = [e.ids for e in hf.encode_batch(texts, add_special_tokens=not no_special)]
    bad = [i for i in range(len(texts)) if i >= len(z) or z[i] != h[i]]
    if not bad and len(z) == len(h):
        return suite.check(True, f"{name}: {len(texts)} strings, {sum(map(len, h))} ids equal to HF")
    i = bad[0] if bad else len(h)
    zi = z[i] if i < len(z) else None
    k = first_diff(zi or [], h[i])
    return suite.check(False, f"{name}: ids equal to HF",
                       f"{len(bad)} of {len(texts)} differ; first {texts[i][:60]!r}: at {k}: "
                       f"zaya {(zi or [])[k:k + 8]} HF {h[i][k:k + 8]} ({[hf.id_to_token(x) for x in h[i][k:k + 8]]})")


def compare_decode(name, tok_path, hf, id_lists, tmp, skip_special=False, lossy=False, only_valid=False):
    z, err = zaya_decode_many(tok_path, id_lists, tmp, skip_special, lossy)
    if z is None:
        return suite.check(False, f"{name}: zaya decode", err)
    h = [s.encode("utf-8") for s in hf.decode_batch(id_lists, skip_special_tokens=skip_special)]
    idx = [i for i in range(len(h)) if not only_valid or "\ufffd" not in h[i].decode()]
    bad = [i for i in idx if z[i] != h[i]]
    if not bad:
        return suite.check(True, f"{name}: {len(idx)} id lists decode as HF")
    i = bad[0]
    return suite.check(False, f"{name}: decode equal to HF",
                       f"{len(bad)} differ; first {id_lists[i][:12]}: zaya {z[i][:60]!r} HF {h[i][:60]!r}")


def full_check(name, tok, folder, texts, tmp, specials=True):
    """Encode with and without specials, decode HF's ids back both ways, lossy decode byte for byte."""
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    compare_encode(f"{name}: encode", folder, hf if specials else tok, texts, tmp)
    compare_encode(f"{name}: encode --no-special", folder, hf, texts, tmp, no_special=True)
    ids = [e.ids for e in hf.encode_batch(texts)]
    compare_decode(f"{name}: decode", folder, hf, ids, tmp, only_valid=True)
    compare_decode(f"{name}: decode --skip-special", folder, hf, ids, tmp, skip_special=True, only_valid=True)
    compare_decode(f"{name}: decode --lossy", folder, hf, ids, tmp, lossy=True)


def random_id_lists(rng, hf, n):
    """Id sequences that are not encodings: byte tokens that make invalid UTF-8, specials, added tokens, ▁."""
    v = hf.get_vocab_size()
    pool = [hf.token_to_id(t) for t in BYTE_TOKENS if hf.token_to_id(t) is not None]
    out = []
    for _ in range(n):
        ids = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            ids.append(rng.choice(pool) if r < 0.5 else rng.randrange(v))
        out.append(ids)
    return out


def set_pipeline(tok, normalizer=None, pre=None, decoder=None, post=None):
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    tok.post_processor = post


def bos_template(tok):
    return processors.TemplateProcessing(single="<bos> $A <eos>", pair="<bos> $A <eos> $B:1 <eos>:1",
                                         special_tokens=[("<bos>", tok.token_to_id("<bos>")),
                                                         ("<eos>", tok.token_to_id("<eos>"))])


SP_DECODER = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
VARIANTS = {
    # Llama 2 as converted with legacy=True
    "llama2 (Prepend+Replace, Strip)": lambda t: set_pipeline(
        t, normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None,
        decoders.Sequence(SP_DECODER + [decoders.Strip(" ", 1, 0)]), bos_template(t)),
    # Mistral / Llama 2 with legacy=False
    "metaspace first, no split": lambda t: set_pipeline(
        t, None, pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False),
        decoders.Sequence(SP_DECODER + [decoders.Strip(" ", 1, 0)]), bos_template(t)),
    "metaspace always, split": lambda t: set_pipeline(
        t, None, pre_tokenizers.Metaspace("▁", prepend_scheme="always", split=True),
        decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="always"), decoders.Fuse()])),
    "metaspace never, split": lambda t: set_pipeline(
        t, None, pre_tokenizers.Metaspace("▁", prepend_scheme="never", split=True),
        decoders.Sequence([decoders.Metaspace("▁", prepend_scheme="never"), decoders.ByteFallback(), decoders.Fuse()])),
    "metaspace first after Replace+Prepend normalizers": lambda t: set_pipeline(
        t, normalizers.Sequence([normalizers.Replace("x", "▁x"), normalizers.Prepend("«"), normalizers.Replace(" ", "  ")]),
        pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=True),
        decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="first")])),
    "split regex isolated + metaspace": lambda t: set_pipeline(
        t, normalizers.Replace(Regex(r"[ \t]+"), " "),
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}{1,3}|[^\s\p{L}\p{N}]+"), "isolated"),
                                 pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=True)]),
        decoders.Sequence(SP_DECODER + [decoders.Strip(" ", 2, 0)])),
    "split removed, invert": lambda t: set_pipeline(
        t, normalizers.Replace(" ", "▁"), pre_tokenizers.Split(Regex(r"▁*[\p{L}\p{M}]+|\p{N}"), "removed", invert=True),
        decoders.Sequence(SP_DECODER)),
    "split merged_with_next": lambda t: set_pipeline(
        t, normalizers.Replace(" ", "▁"), pre_tokenizers.Split("▁", "merged_with_next"), decoders.Sequence(SP_DECODER)),
    "split contiguous regex": lambda t: set_pipeline(
        t, normalizers.Replace(" ", "▁"), pre_tokenizers.Split(Regex(r"[▁\s]"), "contiguous"), decoders.Sequence(SP_DECODER)),
    "split merged_with_previous, empty matches": lambda t: set_pipeline(
        t, normalizers.Sequence([normalizers.Replace(Regex(r"q*"), "~"), normalizers.Replace(" ", "▁")]),
        pre_tokenizers.Split(Regex(r"\d*"), "merged_with_previous"),
        decoders.Sequence([decoders.Replace(Regex(r"~+"), ""), decoders.Replace("▁", " "), decoders.ByteFallback(),
                           decoders.Fuse()])),
    "no pre-tokenizer, no decoder": lambda t: set_pipeline(t, normalizers.Replace(" ", "▁"), None, None),
}


def invalid_utf8(folder, hf, tmp):
    """Invalid UTF-8 encodes as its U+FFFD replacement (Python's errors="replace")."""
    rng = random.Random(8)
    blobs = [b"\xff", b"a\xffb", b"\xe2\x82", b"\xe2\x82a", b"\xf0\x90\x80", b"\xed\xa0\x80", b"\xc0\xaf",
             b"\xf4\x90\x80\x80", b"ok \x80\x80 ok", b"<bos>\xff<eos>", b"\xfe\xfe hello world \xc3", "é".encode()[:1] * 5]
    for _ in range(100):
        blobs.append(bytes(rng.randrange(256) if rng.random() < 0.3 else rng.choice(b"abc \n\xc3\xa9")
                           for _ in range(rng.randint(1, 60))))
    strings = [b.decode("utf-8", "surrogateescape") for b in blobs]
    z, err = zaya_encode_many(folder, strings, tmp)
    h = [hf.encode(b.decode("utf-8", "replace")).ids for b in blobs]
    bad = [i for i in range(len(blobs)) if z is None or z[i] != h[i]]
    suite.check(not bad, f"invalid UTF-8: {len(blobs)} byte strings encode as their U+FFFD replacement",
                err or (f"{blobs[bad[0]]!r}: zaya {z[bad[0]][:10]} HF {h[bad[0]][:10]}" if bad else ""))


def v4_template(tok, cfg):
    """The post-processor transformers 4's Llama/Gemma fast tokenizers build from tokenizer_config.json
    (update_post_processor); transformers 5 drops add_bos_token / add_eos_token when tokenizer.json is there."""
    name = lambda v: v["content"] if isinstance(v, dict) else v  # noqa: E731
    bos, eos = name(cfg.get("bos_token")), name(cfg.get("eos_token"))
    ab, ae = cfg.get("add_bos_token") or False, cfg.get("add_eos_token") or False
    single = f"{(bos + ':0 ') if ab else ''}$A:0{(' ' + eos + ':0') if ae else ''}"
    pair = f"{single}{(' ' + bos + ':1') if ab else ''} $B:1{(' ' + eos + ':1') if ae else ''}"
    specials = ([(bos, tok.token_to_id(bos))] if ab else []) + ([(eos, tok.token_to_id(eos))] if ae else [])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def config_checks(tok, tmp, texts):
    """tokenizer_config.json's add_bos_token / add_eos_token."""
    configs = {
        "add_bos_token": {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>"},
        "add_bos+eos": {"add_bos_token": True, "add_eos_token": True, "bos_token": "<bos>", "eos_token": "<eos>"},
        "add_eos only": {"add_bos_token": False, "add_eos_token": True, "bos_token": {"content": "<bos>"},
                         "eos_token": {"__type": "AddedToken", "content": "<eos>", "special": True}},
        "add_bos_token only, no flags true": {"add_bos_token": False, "eos_token": "<eos>"},
        "neither key (tokenizer.json's template)": {"bos_token": "<bos>", "eos_token": "<eos>"},
    }
    for name, cfg in configs.items():
        folder = save(tok, tmp / "cfg", cfg)
        ref = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if "add_bos_token" in cfg or "add_eos_token" in cfg:
            ref.post_processor = v4_template(ref, cfg)
        want = [e.ids for e in ref.encode_batch(texts)]
        z, err = zaya_encode_many(folder, texts, tmp)
        ok = z == want
        i = 0 if ok or z is None else next(i for i in range(len(texts)) if z[i] != want[i])
        suite.check(ok, f"tokenizer_config.json {name}: ids as transformers 4 adds specials",
                    err or ("" if ok else f"{texts[i][:40]!r}: zaya {z[i][:4]}..{z[i][-3:]} "
                                          f"want {want[i][:4]}..{want[i][-3:]}"))
    # the released layout (config agreeing with tokenizer.json) against transformers as installed
    from transformers import PreTrainedTokenizerFast
    folder = save(tok, tmp / "cfg", dict(configs["add_bos_token"], tokenizer_class="PreTrainedTokenizerFast"))
    ft = PreTrainedTokenizerFast.from_pretrained(str(folder))
    want = [ft(t)["input_ids"] for t in texts]
    z, err = zaya_encode_many(folder, texts, tmp)
    suite.check(z == want,
                "model folder with tokenizer_config.json: ids equal to transformers' PreTrainedTokenizerFast", err)
    # a model folder and the file inside it give the same tokenizer, config included
    folder = save(tok, tmp / "cfg", {"add_bos_token": False, "add_eos_token": True, "eos_token": "<eos>"})
    a, _ = zaya_encode_many(folder, texts[:20], tmp)
    b, _ = zaya_encode_many(folder / "tokenizer.json", texts[:20], tmp)
    suite.check(a is not None and a == b and
                all(x[-1] == tok.token_to_id("<eos>") for x in a), "--tokenizer takes the folder or the file")
    for bad, field in [('{"add_bos_token": "yes"}', "add_bos_token"), ('{"add_eos_token": true}', "add_eos_token"),
                       ('{"add_bos_token": true, "bos_token": "<nope>"}', "bos_token"), ("{", "invalid JSON")]:
        (folder / "tokenizer_config.json").write_text(bad)
        rc, so, se = zaya("tokenizer", "encode", "--tokenizer", folder, "--text", "x")
        msg = se.decode(errors="replace")
        suite.check(rc == 1 and f"tokenizer_config.json: {field}" in msg,
                    f"a bad tokenizer_config.json ({bad}) is refused naming the file and field", msg.strip())


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3(train_texts, texts, tmp):
    """Byte-level BPE as Llama 3 ships it: Split(regex) + ByteLevel(use_regex=False), ignore_merges."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_texts[:3000], trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                              processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                                            pair="<|begin_of_text|> $A $B:1",
                                                                            special_tokens=[("<|begin_of_text|>", bos)])])
    tok.add_tokens([AddedToken("<|eot_id|>", special=True, normalized=False), AddedToken(" hello", normalized=True),
                    AddedToken("[[x]]", single_word=True, normalized=False)])
    folder = save(tok, tmp / "llama3")
    full_check("llama3 (Split regex + ByteLevel, ignore_merges)", tok, folder, texts, tmp)
    # byte-level: any bytes come back from decode
    rng = random.Random(4)
    blobs = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))) for _ in range(30)] + [b"\xff\xfe a \xc3"]
    p = tmp / "blob.bin"
    bad = 0
    for blob in blobs:
        p.write_bytes(blob)
        rc, so, se = zaya("tokenizer", "encode", "--tokenizer", folder, "--input", p, "--no-special")
        ids = [int(x) for x in so.split()] if rc == 0 else None
        out, _ = zaya_decode_many(folder, [ids or []], tmp)
        bad += ids is None or out is None or out[0] != blob
    suite.check(bad == 0, f"llama3: {len(blobs)} byte strings (invalid UTF-8 too) survive encode -> decode")


# ----------------------------------------------------------------------------------------------
# a Gemma-3-sized vocabulary, and speed

SYLLABLE_SETS = [
    [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "ch", "sh", "qu", "str", "ing", "ion"],
    [c + v for c in "бвгдзклмнпрстфх" for v in "аеиоуя"],
    [chr(c) for c in range(0x4E00, 0x5E00)],
    [chr(c) for c in range(0xAC00, 0xB400)],
    [chr(c) + chr(m) for c in range(0x915, 0x939) for m in (0x93E, 0x93F, 0x940, 0x947)],
    [chr(c) for c in range(0x3041, 0x3097)],
]


def big_vocab(target=262144):
    """A vocabulary of `target` tokens shaped like Gemma 3's: specials, the 256 byte tokens, characters, and
    whole words "▁word" built by prefix merges (▁, ▁w, ▁wo, ...) in order of word frequency, as BPE learns
    them. Returns (tokenizer.json dict with Gemma 3's pipeline, the words by frequency)."""
    rng = random.Random(262144)
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for t in BYTE_TOKENS:
        vocab[t] = len(vocab)
    for chars in SYLLABLE_SETS:
        for syl in chars:
            for ch in syl:
                vocab.setdefault(ch, len(vocab))
    for ch in "▁ \n\t.,;:!?'\"()[]{}<>-_=+*/\\0123456789@#$%^&|~`":
        vocab.setdefault(ch, len(vocab))
    merges, words, seen = [], [], set()
    while len(vocab) < target:
        sset = SYLLABLE_SETS[min(int(rng.expovariate(1.2)), len(SYLLABLE_SETS) - 1)]
        w = "".join(rng.choice(sset) for _ in range(rng.randint(1, 4)))
        if w in seen:
            continue
        seen.add(w)
        words.append(w)
        cur = "▁"
        for ch in w:
            nxt = cur + ch
            if nxt not in vocab:
                if len(vocab) >= target:
                    break
                vocab[nxt] = len(vocab)
                merges.append([cur, ch])
            cur = nxt
    data = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for t in SPECIALS],
            "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}
    return data, words


def zipf_text(rng, words, n_bytes):
    out, n = [], 0
    while n < n_bytes:
        w = words[min(int(rng.paretovariate(0.9)) - 1, len(words) - 1)]
        sep = rng.choice([" "] * 12 + [", ", ". ", "\n", "\n\n", "  ", "! "])
        out.append(w + sep)
        n += len(w.encode()) + len(sep)
    return "".join(out)


def zaya_bench(folder, arg, path):
    rc, so, se = zaya("tokenizer", "bench", "--tokenizer", folder, arg, path, "--repeat", "3")
    if rc:
        return None, se.decode(errors="replace").strip()
    out = so.decode()
    num = lambda pat: float(re.search(pat, out).group(1))  # noqa: E731
    return {"load": num(r"loaded in ([0-9.]+) s"), "cold": num(r"empty cache\): [0-9.]+ s, ([0-9.]+) MB/s"),
            "warm": num(r"best of \d+\): [0-9.]+ s, ([0-9.]+) MB/s"), "tokens": int(re.search(r"-> (\d+) tokens", out).group(1))}, out


def hf_bench(hf, texts):
    """Encode MB/s of `tokenizers` on one thread (RAYON_NUM_THREADS=1): the first pass and the best of two more."""
    mb = sum(len(t.encode()) for t in texts) / 1e6
    times, n = [], 0
    for _ in range(3):
        t0 = time.perf_counter()
        n = sum(len(hf.encode(t, add_special_tokens=False).ids) for t in texts)
        times.append(time.perf_counter() - t0)
    return {"cold": mb / times[0], "warm": mb / min(times[1:]), "tokens": n}


def speed(name, folder, texts, tmp):
    """zaya and tokenizers on the same texts, one thread each: one long text and many documents."""
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    one = tmp / "bench_one.txt"
    one.write_bytes("\n".join(texts).encode())
    docs = tmp / "bench_docs.jsonl"
    with open(docs, "w") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    for label, arg, path, hf_texts in [("one text", "--input", one, ["\n".join(texts)]), ("documents", "--jsonl", docs, texts)]:
        z, out = zaya_bench(folder, arg, path)
        if z is None:
            suite.check(False, f"speed {name}, {label}: zaya tokenizer bench", out)
            continue
        h = hf_bench(hf, hf_texts)
        mb = sum(len(t.encode()) for t in hf_texts) / 1e6
        # Speed is a benchmark (`zaya tokenizer bench`), never a check: a loaded machine would fail a timed test.
        # The check is that the bench runs on this text and counts the tokens HF counts; its detail prints the speeds.
        suite.check(z["tokens"] == h["tokens"],
                    f"bench {name}, {label} ({mb:.1f} MB): zaya tokenizer bench counts as many tokens as HF",
                    f"zaya {z['cold']:.1f} MB/s first pass, {z['warm']:.1f} warm; tokenizers {h['cold']:.2f} first, "
                    f"{h['warm']:.2f} warm ({z['tokens']} vs {h['tokens']} tokens)")


def big_vocab_checks(tmp, bench_mb):
    t0 = time.time()
    data, words = big_vocab()
    folder = tmp / "big"
    folder.mkdir(exist_ok=True)
    tok = Tokenizer.from_str(json.dumps(data))
    set_pipeline(tok, normalizers.Replace(" ", "▁"), pre_tokenizers.Split(" ", "merged_with_previous"),
                 decoders.Sequence(SP_DECODER), processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)]))
    tok.add_tokens([AddedToken("<start_of_turn>", special=True, normalized=False),
                    AddedToken("<end_of_turn>", special=True, normalized=False)])
    tok.save(str(folder / "tokenizer.json"))
    size = (folder / "tokenizer.json").stat().st_size / 1e6
    t1 = time.time()
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf_load = time.time() - t1
    print(f"built a {hf.get_vocab_size()}-token vocabulary, {len(data['model']['merges'])} merges, {size:.1f} MB "
          f"({t1 - t0:.1f} s); tokenizers loads it in {hf_load:.2f} s", flush=True)
    rng = random.Random(11)
    texts = [zipf_text(rng, words, rng.randint(20, 3000)) for _ in range(200)] + EDGE_CASES
    compare_encode("262k vocabulary: encode", folder, hf, texts, tmp)
    compare_decode("262k vocabulary: decode", folder, hf, [e.ids for e in hf.encode_batch(texts)], tmp, lossy=True)
    loads = []
    for _ in range(3):
        z, out = zaya_bench(folder, "--input", write_file(tmp / "tiny.txt", "hello"))
        loads.append(z["load"] if z else 99)
    # The load time is printed, not asserted (a benchmark, like the speeds above).
    suite.check(all(x != 99 for x in loads), "262k vocabulary: zaya tokenizer bench loads it",
                f"zaya {min(loads):.3f} s (best of 3; {', '.join(f'{x:.3f}' for x in loads)}), "
                f"tokenizers {hf_load:.2f} s")
    docs = []
    n = 0
    while n < bench_mb * 1e6:
        docs.append(zipf_text(rng, words, rng.randint(500, 20000)))
        n += len(docs[-1].encode())
    speed("262k vocabulary", folder, docs, tmp)


# ----------------------------------------------------------------------------------------------
# the checks


def run(tmp, bench_mb):
    rng = random.Random(20250301)
    t0 = time.time()
    train_texts = [paragraph(rng) for _ in range(6000)]
    held = [sentence(rng) for _ in range(300)] + [paragraph(rng) for _ in range(200)]
    texts = held + EDGE_CASES
    print(f"corpus: {sum(len(t) for t in train_texts) / 1e6:.2f} M characters ({time.time() - t0:.1f} s)", flush=True)

    t0 = time.time()
    base = train_gemma_like(train_texts, 4000)
    gemma = gemma_pipeline(base)
    print(f"trained a Gemma-like tokenizer: {gemma.get_vocab_size()} tokens ({time.time() - t0:.1f} s)", flush=True)
    g_dir = save(gemma, tmp / "gemma", {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>",
                                         "eos_token": "<eos>", "tokenizer_class": "GemmaTokenizer"})
    full_check("gemma", gemma, g_dir, texts, tmp)
    hf = Tokenizer.from_file(str(g_dir / "tokenizer.json"))
    rid = random_id_lists(random.Random(3), hf, 400)
    compare_decode("gemma: random ids (invalid UTF-8 bytes, specials)", g_dir, hf, rid, tmp, lossy=True)
    compare_decode("gemma: random ids, raw bytes where valid", g_dir, hf, rid, tmp, only_valid=True)
    compare_decode("gemma: random ids, skip special", g_dir, hf, rid, tmp, skip_special=True, lossy=True)
    invalid_utf8(g_dir, hf, tmp)
    config_checks(gemma, tmp, texts[:150])

    t0 = time.time()
    whole = gemma_pipeline(train_gemma_like(train_texts[:3000], 3000, whole_texts=True))
    print(f"trained on whole texts (merges across words): {whole.get_vocab_size()} tokens ({time.time() - t0:.1f} s)")
    full_check("gemma, merges across words", whole, save(whole, tmp / "whole"), texts, tmp)

    for name, fn in VARIANTS.items():
        tok = Tokenizer.from_str(json.dumps(base))
        fn(tok)
        tok.add_tokens(added_tokens())
        full_check(name, tok, save(tok, tmp / re.sub(r"\W+", "_", name)), texts, tmp)

    llama3(train_texts, texts, tmp)

    rng = random.Random(5)
    docs, n = [], 0
    while n < bench_mb * 1e6:
        docs.append(corpus(rng, rng.randint(500, 8000)))
        n += len(docs[-1].encode())
    speed("gemma (4k vocabulary)", g_dir, docs, tmp)
    speed("llama3 (byte-level)", tmp / "llama3", docs, tmp)
    big_vocab_checks(tmp, bench_mb)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-mb", type=float, default=8.0, help="size of the benchmark text in MB")
    args = suite.parse_args(ap, keep=True)
    suite.require_zaya()
    with suite.work_dir("zaya_tokg_") as tmp:
        suite.run("oracle script", run, tmp, args.bench_mb)
    suite.finish()


if __name__ == "__main__":
    main()
