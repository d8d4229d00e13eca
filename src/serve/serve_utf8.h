/* serve_utf8: UTF-8 as zaya serve needs it — checking request bodies, holding back a generation's unfinished
 * character, and repairing bytes that are not UTF-8 the way transformers' decode does (one U+FFFD per maximal
 * invalid subpart, Unicode's "substitution of maximal subparts"). */
#ifndef ZAYA_SERVE_UTF8_H
#define ZAYA_SERVE_UTF8_H

#include <stddef.h>

/* Bytes of the maximal valid prefix of a sequence at s[0..n) (n >= 1), and whether it is a whole character. */
size_t serve_utf8_subpart(const unsigned char *s, size_t n, int *whole);
/* Length of the longest prefix of s that does not end inside a sequence that could still become a character. */
size_t serve_utf8_complete(const char *s, size_t n);
/* n if s[0..n) is valid UTF-8, else the offset of its first invalid byte. */
size_t serve_utf8_valid_len(const char *s, size_t n);
/* Bytes as text: each maximal invalid UTF-8 subpart becomes one U+FFFD, as Python's bytes.decode(errors="replace")
 * (what transformers returns). Malloc'ed, NUL-terminated. */
char *serve_utf8_sanitize(const char *s, size_t n, size_t *out_len);

#endif
