/* What the native verifier (_cverify.c) and the native sealer (_cseal.c) share beside the
 * buffer of _buffer.h: JSON strings with orjson's escaping, and lower-case hex.
 *
 * orjson's escaping: '"', '\\', \b \t \n \f \r, other controls as \u00xx in lower-case hex,
 * everything else (DEL and all non-ASCII included) verbatim.
 */
#ifndef KVLEDGER_NATIVE_H
#define KVLEDGER_NATIVE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_buffer.h"

#define HEX_LEN 64

static const char HEX_DIGITS[] = "0123456789abcdef";

/* A string's UTF-8 bytes; ``is_null`` for a JSON null. */
typedef struct {
    const unsigned char *p;
    size_t n;
    int is_null;
} Text;

/* Bytes a JSON string must escape; set by init_escapes(). */
static unsigned char ESCAPED[256];

/* Two hex digits per byte value (set by init_escapes()). */
static char HEX_PAIRS[512];

/* Sets ESCAPED and HEX_PAIRS. */
static void init_escapes(void) {
    for (int c = 0; c < 0x20; c++) ESCAPED[c] = 1;
    ESCAPED['"'] = ESCAPED['\\'] = 1;
    for (int c = 0; c < 256; c++) {
        HEX_PAIRS[2 * c] = HEX_DIGITS[c >> 4];
        HEX_PAIRS[2 * c + 1] = HEX_DIGITS[c & 15];
    }
}

/* A JSON string with orjson's escaping, or null. Runs of plain bytes are copied whole. */
static int put_string(Buffer *b, const Text *t) {
    if (t->is_null) return PUT_LITERAL(b, "null");
    if (reserve(b, 6 * t->n + 2) < 0) return -1; /* worst case: every byte as \u00xx */
    const unsigned char *s = t->p, *end = t->p + t->n;
    unsigned char *out = b->p + b->len;
    *out++ = '"';
    while (s < end) {
        const unsigned char *plain = s;
        /* Eight bytes at a time while none is a control, '"' or '\\' (most strings: ids, hex). */
        while (end - s >= 8) {
            uint64_t w;
            memcpy(&w, s, 8);
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t quote = w ^ (ones * '"'), backslash = w ^ (ones * '\\');
            uint64_t found = ((w - ones * 0x20) | (quote - ones) | (backslash - ones)) & ~w & highs;
            /* ~w drops bytes >= 0x80 (UTF-8, never escaped); a hit may be a false one past a
             * true one, so the byte loop below settles the word. */
            if (found) break;
            s += 8;
        }
        while (s < end && !ESCAPED[*s]) s++;
        memcpy(out, plain, (size_t)(s - plain));
        out += s - plain;
        if (s == end) break;
        unsigned char c = *s++;
        *out++ = '\\';
        switch (c) {
            case '"': *out++ = '"'; break;
            case '\\': *out++ = '\\'; break;
            case '\b': *out++ = 'b'; break;
            case '\t': *out++ = 't'; break;
            case '\n': *out++ = 'n'; break;
            case '\f': *out++ = 'f'; break;
            case '\r': *out++ = 'r'; break;
            default:
                *out++ = 'u'; *out++ = '0'; *out++ = '0';
                *out++ = (unsigned char)HEX_DIGITS[c >> 4]; *out++ = (unsigned char)HEX_DIGITS[c & 15];
        }
    }
    *out++ = '"';
    b->len = (size_t)(out - b->p);
    return 0;
}

/* A digest's lower-case hex: 32 two-byte copies from HEX_PAIRS. */
static void to_hex(const unsigned char *md, char *out) {
    for (int i = 0; i < 32; i++) memcpy(out + 2 * i, HEX_PAIRS + 2 * md[i], 2);
}

#endif
