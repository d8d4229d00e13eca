#!/usr/bin/env python3
"""Oracle test: zaya's byte-level BPE tokenizer against Hugging Face `tokenizers`.

Builds a few-MB corpus (English prose with contractions, several scripts, digits and long numbers, white-space
runs, emoji with ZWJ sequences, punctuation, code, letters new in Unicode 15/16), trains with
`zaya tokenizer train`, and checks that
  - `tokenizers.Tokenizer.from_file` and transformers' PreTrainedTokenizerFast load the file;
  - HF's BpeTrainer, given the same text, learns the same vocabulary and merges;
  - HF and zaya encode thousands of held-out strings and a large text to the same ids, and decode them back;
  - the pre-tokenizer splits like HF's for every Unicode code point (which checks zaya's class table);
  - any bytes, invalid UTF-8 included, survive encode -> decode;
  - zaya loads files written by HF (merges as pairs and as "a b" strings, a GPT-2 style file) and encodes
    like HF with them, and refuses other pipelines with a message naming the file and field.

    python3 tests/oracle/test_tokenizer.py [--keep DIR]
    python3 tests/oracle/test_tokenizer.py --gen-unicode-table   # prints the C table for src/tokenizer/tokenizer_pretok.c

Prints one line per check and ends with `tokenizer: N passed, N failed`; exits non-zero on failure.
ZAYA_BIN overrides the zaya command (split with shlex).
"""
import argparse
import json
import random
import time

from harness import Suite, run_zaya, write_file
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]
VOCAB_SIZE = 4000
suite = Suite("tokenizer", print_passes=True)


# ----------------------------------------------------------------------------------------------
# text generator

WORDS = """the of and to in is was that for it with as on be at by this had not are but from or have an they which
one you were her all she there would their we him been has when who will more no if out so said what up its about
into than them can only other new some could time these two may then do first any my now such like our over man me
even most made after also did many before must through back years where much your way well down should because each
just those people how too little state good very make world still own see men work long get here between both life
being under never day same another know while last might us great old year off come since against go came right used
take three states himself few house use during without again place american around however home small found thought
went say part once general high upon school every don't does got united left number course war until always away
something fact though water less public put think almost hand enough far took head yet government system better set
told nothing night end why called didn't eyes find going look asked later knew point next program city business give
group toward young days let room president side social given present several order national second possible rather
per face among form important often things looking early white case john become large big need four within felt
along children saw best church ever least power development light thing seemed family interest want members mind
country area others although turned done open god service certain kind problem began different door thus help means
sense whole matter perhaps itself york it's times law human line above name example action company hands local show
whether five history gave today either act feet across taken past quite anything seen having death week experience
""".split()
CONTRACTIONS = ["don't", "it's", "we'll", "they're", "I've", "she'd", "I'm", "can't", "won't", "you're", "he's",
                "O'Brien", "rock'n'roll", "'tis", "y'all", "DON'T", "It'S"]
SCRIPTS = {
    "greek": (0x3B1, 0x3C9), "cyrillic": (0x430, 0x44F), "arabic": (0x627, 0x64A), "hebrew": (0x5D0, 0x5EA),
    "devanagari": (0x915, 0x939), "cjk": (0x4E00, 0x9FA5), "hiragana": (0x3041, 0x3096), "katakana": (0x30A1, 0x30FA),
    "hangul": (0xAC00, 0xD7A3), "thai": (0xE01, 0xE2E), "armenian": (0x561, 0x586), "georgian": (0x10D0, 0x10FA),
}
MARKS = {"devanagari": [0x93E, 0x93F, 0x940, 0x941, 0x947, 0x94B, 0x94D, 0x902], "thai": [0xE31, 0xE34, 0xE35, 0xE48],
         "arabic": [0x64E, 0x64F, 0x650, 0x651]}
EMOJI = ["😀", "🎉", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸", "🇯🇵", "1️⃣", "❤️", "🧑‍💻", "👩🏾‍🚀", "🐍", "✨", "🤖",
         "©", "™", "∑", "∞", "→"]
PUNCT = [".", ",", "!", "?", "...", "?!", ";", ":", "—", "–", "-", "(", ")", "[", "]", "{", "}", "«", "»", "“", "”", "‘",
         "’", "\"", "'", "/", "\\", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=", "<", ">", "|", "~", "`", "¿", "¡",
         "…", "·", "•", "§", "¶", "°"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", " \n", "  \n  ", "\r\n", "\u00a0", "\u3000", "\u2028",
          "\x85", "\x0b", "\x0c", " \t ", "\u2009", "\u1680"]
NEW_LETTERS = [0x1C89, 0x1C8A, 0xA7CB, 0xA7CD, 0x105C0, 0x105C5, 0x10D4A, 0x11380, 0x16D40, 0x1E5D0]  # Unicode 15/16
NUMBERS_EXTRA = ["٠١٢٣", "०१२३", "１２３", "²³", "½", "Ⅻ", "𝟙𝟚", "೧೨"]
CODE = [
    "def {name}(x, y=None):\n    if y is None:\n        return x * 2\n    return [i ** 2 for i in range(x) if i % 3]\n",
    "for (int i = 0; i < n; i++) {{\n\tsum += a[i] * b[i];\n}}\n",
    "#include <stdio.h>\nint main(void) {{ printf(\"%d\\n\", {num}); return 0; }}\n",
    "const {name} = async () => {{ await fetch('/api/v1/{name}?q=' + encodeURIComponent(s)); }};\n",
    "SELECT id, name FROM users WHERE age >= {num} ORDER BY name DESC;\n",
    "    x_{num} = np.zeros((3, 4), dtype=np.float32)  # shape (3, 4)\n",
    "<div class=\"{name}\">\n  <span>{num}</span>\n</div>\n",
    "if [ -f \"$HOME/.{name}rc\" ]; then\n    source \"$HOME/.{name}rc\"\nfi\n",
]


def script_word(rng, script):
    lo, hi = SCRIPTS[script]
    n = rng.randint(1, 8)
    out = []
    for _ in range(n):
        out.append(chr(rng.randint(lo, hi)))
        if script in MARKS and rng.random() < 0.3:
            out.append(chr(rng.choice(MARKS[script])))
    return "".join(out)


def number(rng):
    r = rng.random()
    if r < 0.3:
        return str(rng.randint(0, 999))
    if r < 0.5:
        return str(rng.randint(0, 10 ** rng.randint(4, 60)))
    if r < 0.6:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(1, 8)}f}"
    if r < 0.7:
        return f"{rng.randint(1, 999)},{rng.randint(0, 999):03d},{rng.randint(0, 999):03d}"
    if r < 0.8:
        return f"+1 ({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"
    if r < 0.9:
        return f"{rng.randint(1900, 2099)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return rng.choice(NUMBERS_EXTRA)


def sentence(rng):
    words = []
    for _ in range(rng.randint(3, 18)):
        r = rng.random()
        if r < 0.70:
            w = rng.choice(WORDS)
            if rng.random() < 0.1:
                w = w.capitalize()
            elif rng.random() < 0.02:
                w = w.upper()
        elif r < 0.76:
            w = rng.choice(CONTRACTIONS)
        elif r < 0.86:
            w = script_word(rng, rng.choice(list(SCRIPTS)))
        elif r < 0.93:
            w = number(rng)
        elif r < 0.97:
            w = rng.choice(EMOJI)
        elif r < 0.98:
            w = "".join(chr(rng.choice(NEW_LETTERS)) for _ in range(rng.randint(1, 3)))
        else:
            w = rng.choice(PUNCT) * rng.randint(1, 3)
        words.append(w)
    out = ""
    for i, w in enumerate(words):
        if i:
            out += rng.choice(SPACES) if rng.random() < 0.08 else " "
        out += w
        if rng.random() < 0.1:
            out += rng.choice(PUNCT)
    return out + rng.choice([".", ".", ".", "!", "?", "...", ":"])


def paragraph(rng):
    if rng.random() < 0.15:
        tpl = rng.choice(CODE)
        return tpl.format(name=rng.choice(WORDS).replace("'", ""), num=rng.randint(0, 10 ** 6))
    text = " ".join(sentence(rng) for _ in range(rng.randint(1, 6)))
    if rng.random() < 0.1:
        text += " " * rng.randint(1, 4)  # trailing spaces
    return text + rng.choice(["\n", "\n\n", "\n", "\r\n", "\n\n\n"])


def corpus(rng, n_bytes):
    parts, size = [], 0
    while size < n_bytes:
        p = paragraph(rng)
        parts.append(p)
        size += len(p.encode("utf-8"))
    return "".join(parts)


EDGE_CASES = [
    "", " ", "  ", "\n", "\t", "a", "'", "'s", "''s", " 's", "x's", "?'s", "'re'll'd", "don't stop", "  leading",
    "trailing  ", "trailing \n", "a  b", "a   b", "a\t\tb", "a \t b", "\n\n\nx", "x\n\n\n", " \n \n ", "\r\n\r\n",
    "123456789012345678901234567890", "3.14159", "1,000,000", "a1b2c3", " 1 2 3", "١٢٣ 456", "x²+y²", "½ cup",
    "hello world", "Hello, World!", "...", "?!?!", "((()))", "<<<>>>", "<|bos|>", "<|eos|><|pad|>", "a<|bos|>b",
    " <|eos|> ", "<|bos", "<|bos|", "|bos|>", "<<|bos|>>", "<|BOS|>", "<|bos|><|bos|>", "x <|pad|>\n",
    "👨‍👩‍👧‍👦", " 👨‍👩‍👧‍👦 family", "🏳️‍🌈🇺🇸", "1️⃣2️⃣", "e\u0301", "नमस्ते दुनिया", "สวัสดีครับ", "مرحبا بالعالم",
    "שלום עולם", "日本語のテキスト", "한국어 텍스트", "Ελληνικά κείμενα", "Русский текст", "\u00a0\u00a0x", "x\u3000y",
    "a\u2028b", "a\x85b", "\x85\x85", "a\x0bb", "\x0c", "\u200b", "\u200d", "\ufeffBOM", "\u1C89x", "a\U000105C0b",
    "\U0010FFFF", "\ue000", "tab\tsep\tvalues\n", "    indented\n        more\n", "def f():\n\treturn 1\n",
    "x" * 5000, " " * 3000 + "y", "é" * 1000, "ab" * 2000, "1" * 3000, "😀" * 500, "\n" * 1000,
]


# ----------------------------------------------------------------------------------------------
# HF side


def hf_pretokenizer():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def hf_train(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = hf_pretokenizer()
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False, special_tokens=SPECIALS,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=tr)
    return tok


def all_code_points(sample_unassigned_planes=True):
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        if sample_unassigned_planes and 0x40000 <= cp < 0xE0000 and cp % 257:
            continue  # planes 4-13 hold no assigned characters: a sample suffices
        yield cp


def probe_text(cps):
    # "aX X!\n" splits differently for a letter, a number, white space and anything else
    return "".join("a" + chr(c) + " " + chr(c) + "!\n" for c in cps)


def gen_unicode_table():
    """The class of every code point as HF's pre-tokenizer treats it, as the C table in src/tokenizer/tokenizer_pretok.c."""
    pt = hf_pretokenizer()
    patterns = {(0, 2, 4, 5): 1, (0, 1, 2, 4, 5): 2, (0, 1, 3, 4, 5): 3, (0, 1, 2, 5): 0}
    cls = []
    cps = list(all_code_points(sample_unassigned_planes=False))
    for k in range(0, len(cps), 1 << 16):
        chunk = cps[k:k + (1 << 16)]
        starts = [[] for _ in chunk]
        for _, (a, _) in pt.pre_tokenize_str(probe_text(chunk)):
            starts[a // 6].append(a % 6)
        for cp, st in zip(chunk, starts):
            c = 3 if cp == 0x20 else patterns.get(tuple(st))
            if c is None:
                raise SystemExit(f"U+{cp:04X}: unexpected split {st}")
            cls.append((cp, c))
    runs, prev = [], None
    for cp, c in cls:
        if c != prev:
            runs.append(cp << 2 | c)
            prev = c
    line, lines = "", []
    for r in runs:
        item = f"0x{r:x},"
        if len(line) + len(item) + 1 > 116:
            lines.append(line)
            line = ""
        line += (" " if line else "") + item
    lines.append(line)
    print("\n".join("    " + ln for ln in lines))


# ----------------------------------------------------------------------------------------------
# checks


def zaya_encode_file(tok_path, path, tmp):
    out = tmp / "ids.npy"
    rc, so, se = run_zaya(["tokenizer", "encode", "--tokenizer", tok_path, "--input", path, "--out", out], text=False)
    if rc:
        return None, se.decode(errors="replace")
    return np.load(out).tolist(), so.decode(errors="replace").strip()


def zaya_decode_ids(tok_path, ids, tmp):
    p = tmp / "dec_ids.npy"
    np.save(p, np.asarray(ids, dtype=np.int32))
    rc, so, se = run_zaya(["tokenizer", "decode", "--tokenizer", tok_path, "--input", p], text=False)
    return (so if rc == 0 else None), se.decode(errors="replace")


def compare_strings(name, tok_path, hf_tok, strings, tmp):
    """Encodes all strings joined by <|eos|> (specials split the text, so this is each string's encoding with
    id 2 between) in one zaya call, compares with HF, and points at the first string that differs."""
    joined = "<|eos|>".join(strings)
    path = tmp / f"{name}.txt"
    path.write_bytes(joined.encode("utf-8"))
    z, info = zaya_encode_file(tok_path, path, tmp)
    if z is None:
        return suite.check(False, f"{name}: zaya encode", info)
    h = hf_tok.encode(joined).ids
    if z == h:
        return suite.check(True, f"{name}: {len(strings)} strings, {len(h)} ids equal to HF")
    for s in strings:  # find the culprit
        zs, _ = zaya_encode_file(tok_path, write_file(tmp / "one.txt", s), tmp)
        hs = hf_tok.encode(s).ids
        if zs != hs:
            return suite.check(False, f"{name}: ids equal to HF", f"{s[:80]!r}: zaya {zs[:20]} HF {hs[:20]}")
    return suite.check(False, f"{name}: ids equal to HF", "joined text differs but no single string does")


def run(tmp):
    rng = random.Random(20240611)
    t0 = time.time()
    plain = corpus(rng, 2_500_000)
    docs = [corpus(rng, rng.randint(200, 4000)) for _ in range(300)]
    (tmp / "corpus.txt").write_bytes(plain.encode("utf-8"))
    with open(tmp / "docs.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": len(d), "text": d}) + "\n")
    mb = (len(plain.encode()) + sum(len(d.encode()) for d in docs)) / 1e6
    print(f"corpus: {mb:.2f} MB ({time.time() - t0:.1f} s to generate)", flush=True)

    tok_path = tmp / "tokenizer.json"
    t0 = time.time()
    rc, so, se = run_zaya(["tokenizer", "train", "--input", tmp / "corpus.txt", tmp / "docs.jsonl",
                           "--vocab-size", VOCAB_SIZE, "--out", tok_path], text=False)
    zsec = time.time() - t0
    if not suite.check(rc == 0 and tok_path.exists(), "zaya tokenizer train",
                       (so + se).decode(errors="replace").strip().replace("\n", "; ")):
        return

    # loading
    try:
        hf = Tokenizer.from_file(str(tok_path))
        suite.check(hf.get_vocab_size() == VOCAB_SIZE, "tokenizers.Tokenizer.from_file loads zaya's file",
                    f"vocab {hf.get_vocab_size()}")
    except Exception as e:  # noqa: BLE001
        suite.check(False, "tokenizers.Tokenizer.from_file loads zaya's file", repr(e))
        return
    suite.check([hf.token_to_id(s) for s in SPECIALS] == [0, 1, 2], "special tokens have ids 0, 1, 2")
    data = json.loads(tok_path.read_text(encoding="utf-8"))
    suite.check(data["version"] == "1.0" and data["model"]["type"] == "BPE"
                and data["pre_tokenizer"]["type"] == "ByteLevel" and data["decoder"]["type"] == "ByteLevel"
                and data["normalizer"] is None
                and data["pre_tokenizer"]["add_prefix_space"] is False and len(data["added_tokens"]) == 3
                and all(a["special"] and not a["normalized"] for a in data["added_tokens"]),
                "file format: BPE + ByteLevel, version 1.0")

    # HF's trainer on the same texts (one sequence per file / JSONL record, as zaya reads them)
    t0 = time.time()
    hf_trained = hf_train([plain] + docs, VOCAB_SIZE)
    hsec = time.time() - t0
    hf_path = tmp / "hf_tokenizer.json"
    hf_trained.save(str(hf_path))
    hdata = json.loads(hf_path.read_text(encoding="utf-8"))
    same_vocab = hdata["model"]["vocab"] == data["model"]["vocab"]
    same_merges = [list(m) for m in hdata["model"]["merges"]] == [list(m) for m in data["model"]["merges"]]
    detail = f"zaya {zsec:.2f} s, HF {hsec:.2f} s"
    if not same_merges:
        za, ha = data["model"]["merges"], hdata["model"]["merges"]
        i = next((i for i, (x, y) in enumerate(zip(za, ha)) if list(x) != list(y)), min(len(za), len(ha)))
        detail += f"; first difference at merge {i}: zaya {za[i:i + 1]} HF {ha[i:i + 1]}"
    suite.check(same_vocab and same_merges, "HF BpeTrainer learns the same vocab and merges", detail)

    # held-out strings
    rng2 = random.Random(777)
    held = [sentence(rng2) for _ in range(1500)] + [paragraph(rng2) for _ in range(1500)]
    compare_strings("held-out sentences", tok_path, hf, held, tmp)
    compare_strings("edge cases", tok_path, hf, EDGE_CASES, tmp)
    rng3 = random.Random(99)
    cps = [c for c in all_code_points()]
    rand_strings = ["".join(chr(rng3.choice(cps)) if rng3.random() < 0.5 else rng3.choice(" \n\t'sa1!")
                            for _ in range(rng3.randint(1, 40))) for _ in range(1500)]
    compare_strings("random code points", tok_path, hf, rand_strings, tmp)

    # one large text, encode speed and decode
    big = corpus(random.Random(5), 4_000_000)
    big_path = write_file(tmp / "big.txt", big)
    z, info = zaya_encode_file(tok_path, big_path, tmp)
    h = hf.encode(big).ids
    suite.check(z == h, "4 MB held-out text: ids equal to HF", info if z is None else f"{len(h)} ids; zaya: {info}")
    dec, err = zaya_decode_ids(tok_path, h, tmp)
    suite.check(dec == big.encode("utf-8"), "zaya decode of HF's ids gives the text back", err.strip())
    suite.check(z is not None and hf.decode(z, skip_special_tokens=False) == big,
                "HF decode of zaya's ids gives the text back")
    ids = hf.encode("a<|bos|>b<|eos|>").ids
    dec, err = zaya_decode_ids(tok_path, ids, tmp)
    suite.check(dec == b"a<|bos|>b<|eos|>" and hf.decode(ids, skip_special_tokens=False) == "a<|bos|>b<|eos|>",
                "special tokens decode to their text", f"{ids} -> {dec!r}")

    # transformers
    try:
        from transformers import PreTrainedTokenizerFast
        ft = PreTrainedTokenizerFast(tokenizer_file=str(tok_path), bos_token="<|bos|>", eos_token="<|eos|>",
                                     pad_token="<|pad|>")
        sample = held[:200]
        ok = all(ft(s, add_special_tokens=False)["input_ids"] == hf.encode(s).ids for s in sample)
        ok = ok and [ft.pad_token_id, ft.bos_token_id, ft.eos_token_id] == [0, 1, 2]
        suite.check(ok, "transformers PreTrainedTokenizerFast loads it and agrees")
    except Exception as e:  # noqa: BLE001
        suite.check(False, "transformers PreTrainedTokenizerFast loads it and agrees", repr(e))

    # the pre-tokenizer on every code point
    t0 = time.time()
    cps = list(all_code_points())
    pt = hf_pretokenizer()
    bad = []
    for k in range(0, len(cps), 1 << 17):
        chunk = cps[k:k + (1 << 17)]
        text = probe_text(chunk)
        rc, so, se = run_zaya(["tokenizer", "encode", "--pieces", "--input", write_file(tmp / "probe.txt", text)],
                              text=False)
        zp = json.loads(so) if rc == 0 else None
        hp = [p for p, _ in pt.pre_tokenize_str(text)]
        if zp != hp:
            i = next((i for i, (x, y) in enumerate(zip(zp or [], hp)) if x != y), 0)
            bad.append(f"near piece {i}: zaya {(zp or [])[i:i + 3]} HF {hp[i:i + 3]}")
    suite.check(not bad, f"pre-tokenizer splits like HF for {len(cps)} code points",
                "; ".join(bad[:3]) or f"{time.time() - t0:.1f} s")

    # any bytes round trip, invalid UTF-8 included
    rng4 = random.Random(4)
    blobs = [bytes(rng4.randrange(256) for _ in range(rng4.randint(0, 3000))) for _ in range(20)]
    blobs += [b"\xff\xfe\x80abc\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"a\xe2\x82", b"\xe2\x82\xac",
              b"  \xff  x", b"'\xffs", b"<|bos|>\xff<|eos|>", "é".encode()[:1] * 50]
    bad = 0
    for i, blob in enumerate(blobs):
        p = write_file(tmp / "blob.bin", blob)
        z, info = zaya_encode_file(tok_path, p, tmp)
        dec, err = zaya_decode_ids(tok_path, z or [], tmp)
        if z is None or dec != blob:
            bad += 1
            print(f"    blob {i}: {blob[:40]!r} -> {dec[:40] if dec else err!r}")
    suite.check(bad == 0, f"{len(blobs)} byte strings (invalid UTF-8 too) survive encode -> decode")

    # files written by HF
    compare_strings("HF-trained file in zaya", hf_path, hf_trained, held[:1000], tmp)
    legacy = json.loads(hf_path.read_text(encoding="utf-8"))
    legacy["model"]["merges"] = [" ".join(m) for m in legacy["model"]["merges"]]
    legacy_path = tmp / "legacy.json"
    legacy_path.write_text(json.dumps(legacy, ensure_ascii=False), encoding="utf-8")
    compare_strings("merges as \"a b\" strings", legacy_path, Tokenizer.from_file(str(legacy_path)), held[:500], tmp)
    gpt2 = json.loads(tok_path.read_text(encoding="utf-8"))  # GPT-2's layout: its end-of-text token last
    n = len(gpt2["model"]["vocab"])
    gpt2["model"]["vocab"] = {k: v - 3 for k, v in gpt2["model"]["vocab"].items() if v >= 3}
    gpt2["model"]["vocab"]["<|endoftext|>"] = n - 3
    gpt2["model"].update(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    gpt2["added_tokens"] = [{"id": n - 3, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": True, "special": True}]
    gpt2["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    gpt2_path = tmp / "gpt2_style.json"
    gpt2_path.write_text(json.dumps(gpt2, ensure_ascii=False), encoding="utf-8")
    gpt2_held = [s.replace("<|eos|>", "<|endoftext|>") for s in held[:500]] + ["a<|endoftext|>b"]
    compare_strings("GPT-2 style file", gpt2_path, Tokenizer.from_file(str(gpt2_path)), gpt2_held, tmp)

    # refusals name the file and the field
    bad_files = {
        "model.type": lambda d: d["model"].__setitem__("type", "WordPiece"),
        "pre_tokenizer": lambda d: d.__setitem__("pre_tokenizer", {"type": "Whitespace"}),
        "pre_tokenizer.add_prefix_space": lambda d: d["pre_tokenizer"].__setitem__("add_prefix_space", True),
        "normalizer": lambda d: d.__setitem__("normalizer", {"type": "BertNormalizer"}),
        "model.vocab": lambda d: d["model"].pop("vocab"),
        "model.merges[5]": lambda d: d["model"]["merges"].__setitem__(5, ["Ġthe", "nonexistent_token"]),
    }
    for field, mutate in bad_files.items():
        d = json.loads(tok_path.read_text(encoding="utf-8"))
        mutate(d)
        p = tmp / "bad.json"
        p.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
        rc, so, se = run_zaya(["tokenizer", "encode", "--tokenizer", p, "--text", "hello"], text=False)
        msg = se.decode(errors="replace").strip()
        suite.check(rc == 1 and str(p) in msg and field in msg, f"refuses a file with a bad {field}", msg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gen-unicode-table", action="store_true", help="print the class table for src/tokenizer/tokenizer_pretok.c")
    args = suite.parse_args(ap, keep=True)
    if args.gen_unicode_table:
        gen_unicode_table()
        return
    suite.require_zaya()
    with suite.work_dir("zaya_tok_") as tmp:
        suite.run("oracle script", run, tmp)
    suite.finish()


if __name__ == "__main__":
    main()
