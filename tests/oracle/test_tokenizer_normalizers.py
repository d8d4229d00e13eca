#!/usr/bin/env python3
"""Oracle test: zaya's Unicode normalizers (NFD, NFKD, NFC, NFKC, Lowercase, Strip, StripAccents) against
Hugging Face `tokenizers`.

  - every code point (U+0001..U+10FFFF less the surrogates), alone and between a composing mark and one that
    reorders around it (a\\u0301 X \\u0334), and every canonical decomposition recomposed, through each
    normalizer: `zaya tokenizer encode` on a byte-fallback vocabulary gives the normalized bytes, which must equal
    HF's normalize_str byte for byte (this checks the tables in src/tokenizer/tokenizer_normalize.c where HF's Unicode data differs
    from utf8proc's);
  - BPE tokenizers trained by `tokenizers` with the normalizers in released shapes (NFKC + ByteLevel, NFC +
    Metaspace(first) + byte_fallback, NFD + StripAccents + Lowercase, Strip + NFKD + Prepend + Replace, ...) and
    added tokens matched on the normalized text (normalized=true) and on the raw text, compared id for id on
    held-out text with mixed scripts, combining characters, compatibility characters (ligatures, fullwidth,
    superscripts, circled letters), Hangul syllables and jamo; decode as HF; invalid UTF-8 as its U+FFFD
    replacement;
  - normalizers zaya does not run are refused by name; encode speed with NFKC.

    python3 tests/oracle/test_tokenizer_normalizers.py [--keep DIR] [--bench-mb N]
    python3 tests/oracle/test_tokenizer_normalizers.py --gen-tables   # prints the tables for src/tokenizer/tokenizer_normalize.c

Prints one line per check and ends with `tokenizer_normalizers: N passed, N failed`; exits non-zero on failure.
ZAYA_BIN overrides the zaya command (split with shlex).
"""
import argparse
import ctypes
import ctypes.util
import json
import random
import sys
import time
import unicodedata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_tokenizer_gemma as g  # noqa: E402  (its helpers: zaya calls, comparisons, the corpus)
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402,E501

# gemma's helpers (full_check, speed) count into g.suite: this suite is that one, under its own name
suite = g.suite
suite.name = "tokenizer_normalizers"
N = normalizers


# ----------------------------------------------------------------------------------------------
# the tables in src/tokenizer/tokenizer_normalize.c: where HF's Unicode data differs from utf8proc's


def utf8proc():
    name = ctypes.util.find_library("utf8proc") or "libutf8proc.so.2"
    u = ctypes.CDLL(name)
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    for f in ("NFD", "NFC", "NFKD", "NFKC"):
        getattr(u, "utf8proc_" + f).restype = ctypes.c_void_p
        getattr(u, "utf8proc_" + f).argtypes = [ctypes.c_char_p]
    u.utf8proc_tolower.restype = ctypes.c_int32
    u.utf8proc_tolower.argtypes = [ctypes.c_int32]
    u.utf8proc_category.restype = ctypes.c_int
    u.utf8proc_category.argtypes = [ctypes.c_int32]
    u.utf8proc_unicode_version.restype = ctypes.c_char_p

    def norm(form, s):
        p = getattr(u, "utf8proc_" + form)(s.encode())
        r = ctypes.string_at(p).decode()
        libc.free(p)
        return r
    return u, norm


def ranges(cps):
    out = []
    for c in sorted(set(cps)):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def gen_tables():
    """norm_inert: what HF's NFx (Unicode 9.0 data) leaves alone but utf8proc decomposes, reorders or composes;
    mark_flip: marks for one and not the other (StripAccents); lower_extra: Rust's lower case utf8proc lacks."""
    import tokenizers
    u, un = utf8proc()
    hf = {f: getattr(N, f)() for f in ("NFD", "NFC", "NFKD", "NFKC")}
    strip, lower = N.StripAccents(), N.Lowercase()
    inert, flip, low = set(), [], []
    for c in range(1, 0x110000):
        if 0xD800 <= c < 0xE000:
            continue
        s = chr(c)
        probe = "a\u0301" + s + "\u0334"
        if any(hf[f].normalize_str(x) != un(f, x) for f in hf for x in (s, probe)):
            inert.add(c)
        d = un("NFD", s)
        if len(d) > 1 and hf["NFC"].normalize_str(d) != un("NFC", d):  # a composition HF does not know
            inert.update(ord(x) for x in d[1:] if hf["NFD"].normalize_str("a\u0301" + x + "\u0334") == "a\u0301" + x + "\u0334")
        if (strip.normalize_str(s) == "") != (u.utf8proc_category(c) in (6, 7, 8)):
            flip.append(c)
        lo = lower.normalize_str(s)
        if c != 0x130 and lo != chr(u.utf8proc_tolower(c)):
            assert len(lo) == 1, f"U+{c:04X} lower-cases to {len(lo)} characters"
            low.append((c, ord(lo) - c))
    assert lower.normalize_str("\u0130") == "i\u0307"
    lr = []
    for c, d in low:
        if lr and lr[-1][1] == c - 1 and lr[-1][2] == d:
            lr[-1][1] = c
        else:
            lr.append([c, c, d])

    def table(items, per):
        return "\n".join("    " + ", ".join(items[i:i + per]) + "," for i in range(0, len(items), per))
    print(f"/* generated against utf8proc {u.utf8proc_unicode_version().decode()} and tokenizers {tokenizers.__version__} */")
    print("static const CpRange norm_inert[] = {\n" + table([f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges(inert)], 6) + "\n};")
    print("static const CpRange mark_flip[] = {\n" + table([f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges(flip)], 6) + "\n};")
    print("static const CaseRange lower_extra[] = {\n" + table([f"{{0x{a:X}, 0x{b:X}, {d}}}" for a, b, d in lr], 5) + "\n};")


# ----------------------------------------------------------------------------------------------
# every code point through each normalizer


def byte_vocab_tokenizer(normalizer):
    """BPE with only <unk> and the 256 byte tokens (id = byte + 1), so the ids spell the normalized bytes."""
    vocab = {"<unk>": 0}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = b + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizer
    return tok


def every_code_point(tmp):
    units = []
    for c in range(1, 0x110000):
        if 0xD800 <= c < 0xE000 or c == 0x0A:
            continue
        s = chr(c)
        units.append(s)
        units.append("a\u0301" + s + "\u0334")
        for d in {unicodedata.normalize("NFD", s), N.NFD().normalize_str(s)}:
            if d != s:
                units.append(d)  # recomposed by NFC / NFKC: every composition pair
    units += ["\u1100\u1161\u11a7", "\uac00\u11a7", "\uac00\u11a8", "\u1100\u1161\u11a8\u0301", "\u0130\u0307",
              "a" + "".join(chr(x) for x in range(0x300, 0x370)) * 3, "\u0334" * 40 + "\u0301" * 40 + "b"]
    text = "\n".join(units)
    path = tmp / "all_code_points.txt"
    path.write_bytes(text.encode())
    print(f"every code point: {len(units)} units, {len(text.encode()) / 1e6:.1f} MB", flush=True)
    forms = {"NFD": N.NFD(), "NFKD": N.NFKD(), "NFC": N.NFC(), "NFKC": N.NFKC(), "Lowercase": N.Lowercase(),
             "StripAccents": N.StripAccents(), "Sequence[NFKD, StripAccents, Lowercase, NFC]":
             N.Sequence([N.NFKD(), N.StripAccents(), N.Lowercase(), N.NFC()])}
    for name, norm in forms.items():
        tok = byte_vocab_tokenizer(norm)
        folder = tmp / "bytes"
        folder.mkdir(exist_ok=True)
        tok.save(str(folder / "tokenizer.json"))
        out = tmp / "ids.npy"
        t0 = time.time()
        rc, so, se = g.zaya("tokenizer", "encode", "--tokenizer", folder, "--input", path, "--out", out, "--no-special")
        dt = time.time() - t0
        if rc:
            suite.check(False, f"every code point through {name}", se.decode(errors="replace").strip())
            continue
        import numpy as np
        z = bytes((np.load(out) - 1).astype(np.uint8).tolist())
        want = norm.normalize_str(text).encode()
        if z == want:
            suite.check(True, f"every code point through {name}: {len(want)} bytes equal to HF's normalize_str "
                              f"({dt:.1f} s)")
            continue
        k = g.first_diff(z, want)
        at = z[:k].count(b"\n")
        suite.check(False, f"every code point through {name}", f"differs at byte {k}, unit {units[at]!r} "
                    f"({' '.join(f'U+{ord(x):04X}' for x in units[at])}): "
                    f"zaya {z[k - 8:k + 16]!r} HF {want[k - 8:k + 16]!r}")
    # the pipeline's ids, not only the bytes: HF's encode on a part of it
    tok = byte_vocab_tokenizer(N.NFKC())
    tok.save(str(tmp / "bytes" / "tokenizer.json"))
    some = units[::97]
    g.compare_encode("byte vocabulary, NFKC: sampled units", tmp / "bytes", tok, some, tmp)


# ----------------------------------------------------------------------------------------------
# trained tokenizers


COMPAT = ["ﬁ", "ﬂ", "ﬃ", "ﬅ", "Ａ", "ｂ", "１２３", "ｶﾀｶﾅ", "ｶﾞ", "ﾞ", "²", "³", "x²", "H₂O", "½", "™", "℃", "Ⅻ", "①",
          "㍿", "ǅ", "Ⓐ", "ℌ", "µ", "ſ", "…", "¨", "\u00a0", "\u2002", "\u3000", "𝐀𝐁𝐂", "🄰", "㎏", "ℵ", "ﷺ", "ﴀ"]
CANON = ["e\u0301", "a\u0308", "o\u0302\u0323", "q\u0307\u0323", "\u1e9b\u0323", "Å", "\u212b", "\u2126", "\u212a",
         "\u0958", "\u0344", "\u1100\u1161\u11a8", "\u1100\u1161", "\uac00\u11a7", "か\u3099", "が", "ḍ̇", "ệ",
         "\u0915\u093c", "\u09c7\u09be", "\u0b47\u0b3e", "\U00011935\U00011930", "\u0898", "\U0001e030", "\U0001e08f"]
CASE = ["İstanbul", "STRASSE", "Straße", "ΣΊΣΥΦΟΣ", "ΟΔΥΣΣΕΥΣ", "ǅemal", "ÀÉÎÕÜ", "Ꭰ", "ẞ", "\u1c89", "\U00010d50",
        "ＦＵＬＬ"]
COMBINING = [chr(c) for c in list(range(0x300, 0x36F)) + [0x1dc0, 0x20d0, 0x20e3, 0x0591, 0x05b0, 0x0610, 0x064b, 0x093c,
                                                           0x0e48, 0x3099]]


def unicode_word(rng):
    r = rng.random()
    if r < 0.3:
        return rng.choice(COMPAT) + (rng.choice(g.WORDS) if rng.random() < 0.5 else "")
    if r < 0.55:
        return rng.choice(CANON) + (rng.choice(g.WORDS) if rng.random() < 0.3 else "")
    if r < 0.7:
        return rng.choice(CASE)
    base = rng.choice(g.WORDS + ["x", "A", "ω", "и", "가", "क"])
    return "".join(ch + "".join(rng.choice(COMBINING) for _ in range(rng.choice([0, 0, 1, 2, 3]))) for ch in base)


def text(rng):
    parts = []
    for _ in range(rng.randint(1, 4)):
        s = g.sentence(rng) if rng.random() < 0.6 else g.paragraph(rng)
        words = s.split(" ")
        for _ in range(rng.randint(1, 8)):
            words.insert(rng.randrange(len(words) + 1), unicode_word(rng))
        parts.append(" ".join(words))
    return "\n".join(parts) if rng.random() < 0.8 else "  " + " ".join(parts) + "\u3000 "


SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def added_tokens():
    """Added tokens whose content the normalizers change (matched on the normalized text) and raw ones."""
    return [AddedToken("<|im_start|>", special=True, normalized=False),
            AddedToken("ＡＢＣ", special=False, normalized=True), AddedToken("Straße", special=False, normalized=True),
            AddedToken("ﬁx", special=False, normalized=True), AddedToken("café", special=False, normalized=True),
            AddedToken("cafe\u0301", special=False, normalized=False), AddedToken("ﬂ", special=False, normalized=False),
            AddedToken("² ", special=False, normalized=True), AddedToken("<tag>", normalized=True, single_word=True),
            AddedToken("x²", normalized=True, lstrip=True, rstrip=True)]


def train(texts, normalizer, pre, decoder, byte_level, vocab_size=3000):
    if byte_level:
        tok = Tokenizer(models.BPE())
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    tok.train_from_iterator(texts, trainer)
    if not byte_level:  # the 256 byte tokens after the specials, as SentencePiece-converted vocabularies have them
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        new = {t: i for i, t in enumerate(SPECIALS)}
        for t in g.BYTE_TOKENS:
            new.setdefault(t, len(new))
        for _, t in sorted((i, t) for t, i in vocab.items() if t not in SPECIALS):
            new.setdefault(t, len(new))
        data["model"]["vocab"] = new
        data["added_tokens"] = [{"id": new[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False, "special": True} for t in SPECIALS]
        tok = Tokenizer.from_str(json.dumps(data))
    bos, eos = tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>", pair="<bos> $A <eos> $B:1 <eos>:1",
                                                       special_tokens=[("<bos>", bos), ("<eos>", eos)])
    tok.add_tokens(added_tokens())
    return tok


SP_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                decoders.Strip(" ", 1, 0)])
PIPELINES = {
    "NFKC + ByteLevel": (N.NFKC(), pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(), True),
    "NFC + Metaspace(first) + byte_fallback": (N.NFC(), pre_tokenizers.Metaspace("▁", prepend_scheme="first"),
                                               decoders.Metaspace("▁", prepend_scheme="first"), False),
    "NFD + StripAccents + Lowercase, Metaspace(always)": (
        N.Sequence([N.NFD(), N.StripAccents(), N.Lowercase()]), pre_tokenizers.Metaspace("▁", prepend_scheme="always"),
        decoders.Metaspace("▁", prepend_scheme="always"), False),
    "Strip + NFKD + Prepend + Replace (Llama 2 shape)": (
        N.Sequence([N.Strip(), N.NFKD(), N.Prepend("▁"), N.Replace(" ", "▁")]), None, SP_DECODER, False),
    "Lowercase + NFKC, Metaspace(first, no split)": (
        N.Sequence([N.Lowercase(), N.NFKC()]), pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False),
        decoders.Metaspace("▁", prepend_scheme="first"), False),
    "Strip(left) + NFKC + Replace, Split(MergedWithPrevious)": (
        N.Sequence([N.Strip(left=True, right=False), N.NFKC(), N.Replace(" ", "▁")]),
        pre_tokenizers.Split("▁", "merged_with_next"), SP_DECODER, False),
    # Metaspace(first) asks whether a piece starts at offset 0 of the original: after a ligature's expansion
    # every piece of it does ("ﬀ" -> "f" "f"), after a stripped start none does
    "NFKD, Split(f) + Metaspace(first)": (
        N.NFKD(), pre_tokenizers.Sequence([pre_tokenizers.Split("f", "isolated"),
                                            pre_tokenizers.Metaspace("▁", prepend_scheme="first")]),
        decoders.Metaspace("▁", prepend_scheme="first"), False),
    "Strip + NFC, Metaspace(first)": (N.Sequence([N.Strip(), N.NFC()]),
                                      pre_tokenizers.Metaspace("▁", prepend_scheme="first"),
                                      decoders.Metaspace("▁", prepend_scheme="first"), False),
    "NFD + StripAccents, Metaspace(first)": (N.Sequence([N.NFD(), N.StripAccents()]),
                                             pre_tokenizers.Metaspace("▁", prepend_scheme="first"),
                                             decoders.Metaspace("▁", prepend_scheme="first"), False),
}

EDGE = ["", " ", "  ", "\u3000", " \u3000 x \u3000 ", "ﬁ", "ﬁx", " ﬁx", "ﬁxﬁx", "ﬀ", "ﬀa", "aﬀ", "ﬀﬀ", "ＡＢＣ", "ＡＢＣd",
        "ABC", "Straße", "STRASSE", "straße", "café", "cafe\u0301", "CAFÉ", "² ", "x²", " x² ", "a x² b", "<tag>",
        "a<tag>b", " <tag> ", "İ", "İİ", "i\u0307", "\u0130\u0301", "\u0301", "\u0301a", "\u0301\u0301ﬁ", "\u0334\u0301",
        "e\u0334\u0301", "\u1100\u1161\u11a8", "\uac00\u11a7", "\u1100", "\u11a8", "Å", "\u212b", "\u0958", "\u0344",
        "<|im_start|>ＡＢＣ", "ＡＢＣ<|im_start|>", "<|im_start|> ﬁx", "ﬂ", "ﬂﬂ", "ﬂa", "\U00011935\U00011930",
        "\u0898a\u0301", "x\u0898\u0301", "\U0001e030", "ǅ", "ǅemal", "\u1c89", "\U00010d50", "½ ⅓", "①②③",
        "\ufb01\u0301", "ｶﾞ", "ｶﾞｷﾞ", "\u00a0x\u00a0", "\x00", "\ufffd", "a" + "\u0301" * 100, "\u0334" * 50 + "b",
        "ＡＢＣ" * 30, "ﬁ" * 100, "  ﬁ  ", "\tﬁ\n", "ﬀ", "ﬀa", "ﬀﬀ", "xﬀ", " ﬀ", "ﬃ", "ﬃx", "  x", "\u3000x y",
        "\u0301a", "\u0301\u0301ab", "\u0301", "a\u0301b", "İf", "ＡＢＣf", "ﬁxf", "ﬁxa", "<|im_start|>ﬀ"]


def invalid_utf8(name, folder, hf, tmp):
    """Invalid UTF-8 encodes as its U+FFFD replacement (Python's errors="replace"), normalizers included."""
    rng = random.Random(8)
    blobs = [b"\xff", b"a\xffb", b"\xe2\x82", b"e\xcc", b"e\xcc\x81\xff\xcc\x81", b"\xef\xac\x81\xff", b"\xc3",
             b"\xff\xef\xbc\xa1", b"\xed\xa0\x80\xcc\x81"]
    for _ in range(100):
        blobs.append(bytes(rng.randrange(256) if rng.random() < 0.3 else rng.choice(b"abc \n\xc3\xa9\xcc\x81")
                           for _ in range(rng.randint(1, 60))))
    strings = [b.decode("utf-8", "surrogateescape") for b in blobs]
    z, err = g.zaya_encode_many(folder, strings, tmp)
    h = [hf.encode(b.decode("utf-8", "replace")).ids for b in blobs]
    bad = [i for i in range(len(blobs)) if z is None or z[i] != h[i]]
    suite.check(not bad, f"{name}: {len(blobs)} invalid UTF-8 strings encode as their U+FFFD replacement",
                err or (f"{blobs[bad[0]]!r}: zaya {z[bad[0]][:10]} HF {h[bad[0]][:10]}" if bad else ""))


def trained(tmp, bench_mb):
    rng = random.Random(20251125)
    train_texts = [text(rng) for _ in range(3000)]
    held = [text(rng) for _ in range(400)] + EDGE
    for name, (norm, pre, dec, byte_level) in PIPELINES.items():
        t0 = time.time()
        tok = train(train_texts, norm, pre, dec, byte_level)
        folder = g.save(tok, tmp / ("p" + str(abs(hash(name)) % 10 ** 8)))
        print(f"trained {name}: {tok.get_vocab_size()} tokens ({time.time() - t0:.1f} s)", flush=True)
        g.full_check(name, tok, folder, held, tmp)
        if not byte_level:
            invalid_utf8(name, folder, Tokenizer.from_file(str(folder / "tokenizer.json")), tmp)
        if name.startswith("NFC + Metaspace"):
            docs, n = [], 0
            drng = random.Random(5)
            while n < bench_mb * 1e6:
                docs.append("\n".join(text(drng) for _ in range(20)))
                n += len(docs[-1].encode())
            g.speed(name, folder, docs, tmp)


def refused(tmp):
    """Normalizers zaya does not run are refused naming the type, and bad Strip fields name the field."""
    tok = byte_vocab_tokenizer(None)
    folder = tmp / "refused"
    folder.mkdir(exist_ok=True)
    base = json.loads(tok.to_str())
    cases = [({"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None,
               "lowercase": True}, 'normalizer: type "BertNormalizer" is not supported'),
             ({"type": "Precompiled", "precompiled_charsmap": ""}, 'normalizer: type "Precompiled" is not supported'),
             ({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Nmt"}]},
              'normalizer.normalizers[1]: type "Nmt" is not supported'),
             ({"type": "Strip", "strip_left": True}, "normalizer.strip_right: missing or not a boolean")]
    for norm, want in cases:
        base["normalizer"] = norm
        (folder / "tokenizer.json").write_text(json.dumps(base))
        rc, so, se = g.zaya("tokenizer", "encode", "--tokenizer", folder, "--text", "x")
        msg = se.decode(errors="replace")
        suite.check(rc == 1 and want in msg, f"normalizer {json.dumps(norm)[:60]} is refused with a clear error",
                    msg.strip())


def run(tmp, bench_mb):
    every_code_point(tmp)
    trained(tmp, bench_mb)
    refused(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-mb", type=float, default=2.0, help="size of the benchmark text in MB")
    ap.add_argument("--gen-tables", action="store_true", help="print the Unicode tables for src/tokenizer/tokenizer_normalize.c")
    args = suite.parse_args(ap, keep=True)
    if args.gen_tables:
        gen_tables()
        return
    suite.require_zaya()
    with suite.work_dir("zaya_tokn_") as tmp:
        suite.run("oracle script", run, tmp, args.bench_mb)
    suite.finish()


if __name__ == "__main__":
    main()
