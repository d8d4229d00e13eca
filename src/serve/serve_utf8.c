/* UTF-8 for zaya serve (see serve_utf8.h). */
#include "serve/serve_utf8.h"

#include <stdlib.h>
#include <string.h>

/* UTF-8 as Unicode defines it (Table 3-7): the length a lead byte announces (0: not a lead byte) and the range of
 * the byte after it. */
static int utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c > 0xF4) return 0;
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;
    return 4;
}

size_t serve_utf8_subpart(const unsigned char *s, size_t n, int *whole) {
    unsigned char lo, hi;
    const int want = utf8_lead(s[0], &lo, &hi);
    size_t k = 1;
    while (want && k < (size_t)want && k < n && s[k] >= lo && s[k] <= hi) {
        k++;
        lo = 0x80;
        hi = 0xBF;
    }
    *whole = want && k == (size_t)want;
    return k;
}

size_t serve_utf8_complete(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char *p = (const unsigned char *)s + n - back;
        unsigned char lo, hi;
        if (!utf8_lead(*p, &lo, &hi)) continue; /* a continuation (or invalid) byte: look further back */
        int whole;
        size_t k = serve_utf8_subpart(p, back, &whole);
        return k == back && !whole ? n - back : n; /* a valid but unfinished character: hold it back */
    }
    return n;
}

size_t serve_utf8_valid_len(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) { /* ASCII: the common case */
            i++;
            continue;
        }
        int whole;
        const size_t k = serve_utf8_subpart((const unsigned char *)s + i, n - i, &whole);
        if (!whole) return i;
        i += k;
    }
    return n;
}

char *serve_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        int whole;
        size_t k = serve_utf8_subpart((const unsigned char *)s + i, n - i, &whole);
        if (whole) {
            memcpy(o + w, s + i, k);
            w += k;
        } else {
            memcpy(o + w, "\xEF\xBF\xBD", 3);
            w += 3;
        }
        i += k;
    }
    o[w] = 0;
    *out_len = w;
    return o;
}
