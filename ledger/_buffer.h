/* A growing byte buffer, shared by the native verifier (_cverify.c), sealer (_cseal.c) and
 * Arrow reader (_carrow.c).
 *
 * The first allocation is BUFFER_FIRST_CAP bytes (4096 unless the including file defines it
 * first: the Arrow reader's columns run to megabytes, so it starts at 65536). The functions
 * are static inline so that a file using only some of them draws no unused-function warning.
 */
#ifndef KVLEDGER_BUFFER_H
#define KVLEDGER_BUFFER_H

#include <stdlib.h>
#include <string.h>

#ifndef BUFFER_FIRST_CAP
#define BUFFER_FIRST_CAP 4096
#endif

typedef struct {
    unsigned char *p;
    size_t len, cap;
} Buffer;

/* Room for ``more`` bytes past ``len``; -1 when out of memory (the buffer is left as it was). */
static inline int reserve(Buffer *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : BUFFER_FIRST_CAP;
    while (cap < b->len + more) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (p == NULL) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(Buffer *b, const void *s, size_t n) {
    if (n == 0) return 0; /* SQLite gives NULL for an empty value */
    if (reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

#define PUT_LITERAL(b, s) put((b), (s), sizeof(s) - 1)

#endif
