/* What the native verifier (_cverify.c) and the snapshot's row reader (_carrow.c) share: a
 * stored row's columns, its canonical envelope (as ledger/_events.envelope_text writes it) and
 * the SHA-256 hex of its digest and chain link. Rows are read with the columns
 * 0 seq, 1 id, 2 ts, 3 kind, 4 run_id, 5 block_id, 6 data, 7 digest, 8 chain.
 */
#ifndef KVLEDGER_ROWCHECK_H
#define KVLEDGER_ROWCHECK_H

#include <openssl/sha.h>
#include <sqlite3.h>
#include <string.h>

#include "_native.h"

/* A column's bytes; NULL only where the envelope allows it. */
static inline int text_of(sqlite3_stmt *st, int col, int nullable, Text *t) {
    /* One column lookup, not three. The value is "unprotected" (it takes no mutex): fine here, as
     * every reader opens its own connection (SQLITE_OPEN_NOMUTEX) on one thread and reads the value
     * before the next step. */
    sqlite3_value *v = sqlite3_column_value(st, col);
    int type = sqlite3_value_type(v);
    t->is_null = type == SQLITE_NULL;
    if (t->is_null) return nullable ? 0 : -1;
    if (type != SQLITE_TEXT && type != SQLITE_BLOB) return -1;
    t->p = sqlite3_value_blob(v); /* text or blob bytes, unconverted */
    t->n = (size_t)sqlite3_value_bytes(v);
    return 0;
}

/* SHA-256 in binary of two parts, so the chain link needs no copy of the previous chain and the
 * digest. */
static inline void sha256_two(const void *data, size_t n, const void *more, size_t more_n, unsigned char *md) {
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, data, n);
    if (more_n) SHA256_Update(&ctx, more, more_n);
    SHA256_Final(md, &ctx);
}

/* The same, as lower-case hex. */
static inline void sha256_hex(const void *data, size_t n, const void *more, size_t more_n, char *out) {
    unsigned char md[32];
    sha256_two(data, n, more, more_n, md);
    to_hex(md, out);
}

/* The stored hex of column ``col`` (64 bytes of text), or NULL where it is not that: a value of
 * another type or length never matches. One column lookup (see text_of). */
static inline const unsigned char *stored_hex(sqlite3_stmt *st, int col) {
    sqlite3_value *v = sqlite3_column_value(st, col);
    if (sqlite3_value_type(v) != SQLITE_TEXT) return NULL;
    const unsigned char *p = sqlite3_value_text(v);
    return sqlite3_value_bytes(v) == HEX_LEN ? p : NULL;
}

/* A stored hex column equals ``hex`` (a non-text value never does). */
static inline int column_is(sqlite3_stmt *st, int col, const char *hex) {
    const unsigned char *stored = stored_hex(st, col);
    return stored != NULL && memcmp(stored, hex, HEX_LEN) == 0;
}

/* The canonical envelope of a row's six texts into ``b``; -2 when out of memory. Shared by the
 * SQLite rows below and rows handed over in buffers (_carrow.c's check_by_kind). */
static inline int envelope_of(Buffer *b, const Text *id, const Text *ts, const Text *kind, const Text *run_id,
                              const Text *block_id, const Text *data) {
    b->len = 0;
    if (PUT_LITERAL(b, "{\"block_id\":") || put_string(b, block_id) || PUT_LITERAL(b, ",\"data\":")
        || put(b, data->p, data->n) || PUT_LITERAL(b, ",\"id\":") || put_string(b, id)
        || PUT_LITERAL(b, ",\"kind\":") || put_string(b, kind) || PUT_LITERAL(b, ",\"run_id\":")
        || put_string(b, run_id) || PUT_LITERAL(b, ",\"ts\":") || put_string(b, ts) || PUT_LITERAL(b, "}"))
        return -2;
    return 0;
}

/* The canonical envelope of the current row into ``b``; -1 on a column that cannot hold it. */
static inline int envelope(Buffer *b, sqlite3_stmt *st) {
    /* Columns: 0 seq, 1 id, 2 ts, 3 kind, 4 run_id, 5 block_id, 6 data, 7 digest, 8 chain. */
    Text id, ts, kind, run_id, block_id, data;
    if (text_of(st, 1, 0, &id) || text_of(st, 2, 0, &ts) || text_of(st, 3, 0, &kind)
        || text_of(st, 4, 1, &run_id) || text_of(st, 5, 1, &block_id) || text_of(st, 6, 0, &data))
        return -1;
    return envelope_of(b, &id, &ts, &kind, &run_id, &block_id, &data);
}

#endif
