/* Native read of a ledger's rows into Arrow buffers (the snapshot's raw rows), and,
 * for a segment being written, the same rows' chain check and data fields in that one pass.
 *
 * Why C: through Python's sqlite3 each row becomes a tuple of nine objects and each
 * value is converted again into Arrow, several microseconds per row; here a row is one
 * sqlite3_step and a memcpy per column into growing Arrow buffers, with the GIL released,
 * so seq ranges are read in threads of one process. Python wraps the buffers without
 * copying them (pyarrow.Array.from_buffers).
 *
 * read(path, after_seq, until_seq) -> (rows, seqs, [(validity|None, nulls, offsets, data)] * 8)
 * for the columns seq, id, ts, kind, run_id, block_id, data, digest, chain of the rows
 * with after_seq < seq <= until_seq in seq order; string columns as Arrow `string`
 * (int32 offsets; a range whose column passes 2 GiB is refused: read a smaller one). Each
 * buffer comes as a Memory object that owns what C allocated and lends it through the buffer
 * protocol, so no byte read is copied again.
 *
 * read_checked(path, after_seq, until_seq, expected_seq, previous_chain) -> the same three,
 * then (outcome, bad_seq, found_seq, last_good_seq, last_good_chain) and the data fields.
 * Each row read is checked as _cverify.c checks the database's rows (seq in order, digest
 * recomputed from the canonical envelope, chain link), before its bytes are copied, so the
 * rows returned are the rows proven: a snapshot segment needs no second scan of the file.
 * The fields are kind -> top-level key -> a mask of the JSON types its values have, as
 * DuckDB's json_keys and json_type name them (bits in TYPE_NAMES order), or None where a
 * row's data is anything but a canonical object with plain keys (then DuckDB types them).
 * Given ``typed`` (as read_checked_by_kind takes it), the kinds it names are also parsed into
 * their typed fields in the same pass, given last as (groups, unsure) in read_checked_by_kind's
 * form: a snapshot writes each projection from them rather than parse every row again.
 *
 * read_checked_by_kind(path, after_seq, until_seq, expected_seq, previous_chain[, columns]) ->
 * (rows, [(kind, rows, seqs, columns)], check): the rows checked as read_checked checks them, each
 * kind's rows into buffers of their own (in seq order within the kind, kinds in the order
 * they first appear), so that a verified report derives each kind's table from the rows its
 * verification read, without a second read of the file or a sort and copy of the rows by kind.
 * ``columns``, a mask of the text columns to copy (bit 0 id ... bit 7 chain; default all), spares
 * the copies of what the caller never reads (every column is still checked).
 * ``typed``, {kind: (columns, [(name, type, children)])}, parses each listed kind's data as it is
 * read into typed columns, as DuckDB's json_transform would (see "Each kind's typed fields"
 * below), and copies that kind's text columns of its own mask instead: then each group comes with
 * its typed columns (else None), and the result ends with True where a row of a listed kind was
 * one the parse is not sure of (its kind's typed columns are then dropped: read the range again
 * without ``typed`` and let DuckDB parse it).
 * ``scope``, (kinds, runs), keeps the rows of those kinds only where their run_id is null or one of
 * ``runs``: every row is checked, the others are neither copied nor parsed (a run's report on a
 * ledger of many runs).
 *
 * check_copy(data, expected_seq, previous_chain[, columns, typed]) -> the same, for the rows of
 * ``data``, PostgreSQL's binary COPY of those nine columns (a PostgreSQL ledger's rows, fetched by
 * ledger/_row_sources.py): every step above reads a row through a Source, an SQLite statement or
 * that data, so rows from either database are checked, split and parsed by the same code.
 * check_copy_rows(data, expected_seq, previous_chain) is read_checked over such data.
 *
 * copy_out(get_copy_data, free_mem, conn) -> (data, status): the rows of a COPY ... TO STDOUT that
 * ``conn`` (a PGconn *) has begun, by libpq's PQgetCopyData and PQfreemem at those addresses (the
 * libpq that made the connection: ledger/_row_sources.py finds them), one row after another with
 * the GIL released, into one buffer; status is PQgetCopyData's last (-1 done, -2 failed). A loop
 * in Python took a call and an append per row, holding the GIL the other reader needs.
 */
#define PY_SSIZE_T_CLEAN
/* OpenSSL's direct SHA256_* calls, as in _cverify.c (EVP costs about 30 ns more per hash). */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <openssl/sha.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Columns run to megabytes: start their buffers at 64 KiB. */
#define BUFFER_FIRST_CAP 65536
#include "_native.h"
#include "_rowcheck.h"

#define TEXT_COLUMNS 8

typedef struct {
    Buffer offsets, data, validity;
    int64_t nulls;
} Column;

enum { READ_OK = 0, READ_NOMEM = 1, READ_SQLITE = 2, READ_TOO_LARGE = 3 };

/* A failed read as the Python exception that says why; 0 (nothing raised) for READ_OK. */
static int raise_read_error(int outcome, const char *message) {
    switch (outcome) {
    case READ_NOMEM:
        PyErr_NoMemory();
        return 1;
    case READ_TOO_LARGE:
        PyErr_SetString(PyExc_OverflowError, "a column of this seq range passes 2 GiB: read a smaller range");
        return 1;
    case READ_SQLITE:
        PyErr_Format(PyExc_OSError, "sqlite: %s", message ? message : "cannot open or read");
        return 1;
    default:
        return 0;
    }
}

/* ---- Where rows come from. ---- */

/* An SQLite statement stepped row by row, or rows already in memory in PostgreSQL's binary COPY
 * format (a PostgreSQL ledger's rows, fetched by ledger/_row_sources.py with
 * ``COPY (SELECT seq, id, ts, kind, run_id, block_id, data, digest, chain ...) TO STDOUT (FORMAT
 * binary)``) walked tuple by tuple: every step below reads a row through these, so both are
 * checked, split and parsed by the same code. */
typedef struct {
    sqlite3_stmt *st;            /* NULL: the COPY data */
    const unsigned char *at, *end; /* the COPY data not yet read */
    long long seq;               /* the current tuple's seq and text columns (1 id ... 8 chain) */
    Text texts[TEXT_COLUMNS];
    const char *error;           /* why the COPY data could not be read, else NULL */
} Source;

static inline long long source_seq(const Source *s) {
    return s->st != NULL ? sqlite3_column_int64(s->st, 0) : s->seq;
}

/* A buffered row's text column ``col`` (1 id ... 8 chain, as in the SQLite statement). */
static inline void buffered_text(const Source *s, int col, Text *t) { *t = s->texts[col - 1]; }

/* The current row's text column ``col`` from either source; ``p`` is NULL for a column that is
 * not null only where SQLite ran out of memory converting it. */
static inline void source_text(const Source *s, int col, Text *t) {
    if (s->st == NULL) {
        buffered_text(s, col, t);
        return;
    }
    t->is_null = sqlite3_column_type(s->st, col) == SQLITE_NULL;
    t->p = t->is_null ? NULL : sqlite3_column_text(s->st, col);
    t->n = t->is_null ? 0 : (size_t)sqlite3_column_bytes(s->st, col);
}

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The COPY data's header (signature, flags, extension), checked and skipped: 0, or -1 with
 * ``error`` set. */
static int copy_start(Source *s) {
    static const unsigned char SIGNATURE[11] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n', 0};
    if (s->end - s->at < 19 || memcmp(s->at, SIGNATURE, 11) != 0) {
        s->error = "not PostgreSQL's binary COPY format (no signature)";
        return -1;
    }
    uint32_t extension = be32(s->at + 15);
    if ((uint64_t)(s->end - s->at - 19) < extension) {
        s->error = "the header's extension passes the end of the data";
        return -1;
    }
    s->at += 19 + extension;
    return 0;
}

/* The next tuple into seq and texts: 1, 0 at the trailer, -1 with ``error`` set where the data
 * is not nine fields of an int8 and eight texts, or ends early. */
static int copy_next(Source *s) {
    if (s->end - s->at < 2) {
        s->error = "the data ends before its trailer";
        return -1;
    }
    int fields = (int16_t)(s->at[0] << 8 | s->at[1]);
    s->at += 2;
    if (fields == -1) return 0;
    if (fields != 1 + TEXT_COLUMNS) {
        s->error = "a tuple without the nine columns seq, id, ts, kind, run_id, block_id, data, digest, chain";
        return -1;
    }
    for (int f = 0; f < fields; f++) {
        if (s->end - s->at < 4) goto short_data;
        int32_t n = (int32_t)be32(s->at);
        s->at += 4;
        if (n < -1 || (n > 0 && s->end - s->at < n)) goto short_data;
        if (f == 0) {
            if (n != 8) {
                s->error = "a seq that is not an int8";
                return -1;
            }
            uint64_t v = (uint64_t)be32(s->at) << 32 | be32(s->at + 4);
            s->seq = (long long)v;
        } else {
            Text *t = &s->texts[f - 1];
            t->is_null = n == -1;
            t->p = n > 0 ? s->at : (const unsigned char *)"";
            t->n = n > 0 ? (size_t)n : 0;
        }
        if (n > 0) s->at += n;
    }
    return 1;
short_data:
    s->error = "a field passes the end of the data";
    return -1;
}

/* The current row's canonical envelope into ``b``: 0, -1 on a column that cannot hold it, -2 when
 * out of memory. */
static int source_envelope(Buffer *b, const Source *s) {
    if (s->st != NULL) return envelope(b, s->st);
    Text id, ts, kind, run_id, block_id, data;
    buffered_text(s, 1, &id);
    buffered_text(s, 2, &ts);
    buffered_text(s, 3, &kind);
    buffered_text(s, 4, &run_id);
    buffered_text(s, 5, &block_id);
    buffered_text(s, 6, &data);
    if (id.is_null || ts.is_null || kind.is_null || data.is_null) return -1;
    return envelope_of(b, &id, &ts, &kind, &run_id, &block_id, &data);
}

/* A stored hex column (7 digest, 8 chain) equals ``hex``. */
static int source_column_is(const Source *s, int col, const char *hex) {
    if (s->st != NULL) return column_is(s->st, col, hex);
    Text t;
    buffered_text(s, col, &t);
    return !t.is_null && t.n == HEX_LEN && memcmp(t.p, hex, HEX_LEN) == 0;
}

/* ---- The chain check of each row read (mirrors _cverify.c's scan_rows). ---- */

enum { CHECK_OK = 0, CHECK_DELETED = 1, CHECK_EDITED = 2, CHECK_RELINKED = 3 };

typedef struct {
    long long expected;   /* the next seq that should come */
    char chain[HEX_LEN];  /* the stored chain of the row before it */
    size_t chain_len;     /* 64, or 0 when there is none to follow (the link then fails) */
    long long bad_seq, found_seq;
    int outcome;
    Buffer envelope;
} Check;

/* Check the current row (before any column is converted); after a failure rows are only read. */
static int check_row(Check *c, const Source *src) {
    if (c->outcome != CHECK_OK) return READ_OK;
    long long seq = source_seq(src);
    if (seq != c->expected) {
        c->outcome = CHECK_DELETED;
        c->found_seq = seq;
        c->bad_seq = seq < c->expected ? seq : c->expected;
        return READ_OK;
    }
    char digest[HEX_LEN], chain[HEX_LEN];
    int built = source_envelope(&c->envelope, src);
    if (built == -2) return READ_NOMEM;
    if (built == 0) sha256_hex(c->envelope.p, c->envelope.len, NULL, 0, digest);
    if (built == -1 || !source_column_is(src, 7, digest)) {
        c->outcome = CHECK_EDITED;
        c->bad_seq = seq;
        return READ_OK;
    }
    sha256_hex(c->chain, c->chain_len, digest, HEX_LEN, chain);
    if (!source_column_is(src, 8, chain)) {
        c->outcome = CHECK_RELINKED;
        c->bad_seq = seq;
        return READ_OK;
    }
    memcpy(c->chain, chain, HEX_LEN);
    c->chain_len = HEX_LEN;
    c->expected++;
    return READ_OK;
}

/* ---- Each kind's top-level data keys and the JSON types of their values. ---- */

/* DuckDB's json_type names, one bit each. */
static const char *TYPE_NAMES[] = {"NULL", "BOOLEAN", "UBIGINT", "BIGINT", "DOUBLE", "VARCHAR", "OBJECT", "ARRAY"};
enum { T_NULL = 1, T_BOOLEAN = 2, T_UBIGINT = 4, T_BIGINT = 8, T_DOUBLE = 16, T_VARCHAR = 32, T_OBJECT = 64,
       T_ARRAY = 128 };

typedef struct {
    unsigned char *name; /* the kind's bytes, then the key's */
    size_t kind_len, key_len;
    uint64_t hash;
    unsigned mask;
} Slot;

typedef struct {
    Slot *slots;
    size_t cap, used;
    int unsure; /* a row this scan does not type as DuckDB would: DuckDB types the segment */
} Fields;

static uint64_t fnv1a(const unsigned char *p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static int fields_grow(Fields *f) {
    size_t cap = f->cap ? f->cap * 2 : 256;
    Slot *slots = calloc(cap, sizeof(Slot));
    if (slots == NULL) return -1;
    for (size_t i = 0; i < f->cap; i++) {
        if (f->slots[i].name == NULL) continue;
        size_t j = f->slots[i].hash & (cap - 1);
        while (slots[j].name != NULL) j = (j + 1) & (cap - 1);
        slots[j] = f->slots[i];
    }
    free(f->slots);
    f->slots = slots;
    f->cap = cap;
    return 0;
}

static int fields_add(Fields *f, const unsigned char *kind, size_t kind_len, uint64_t kind_hash,
                      const unsigned char *key, size_t key_len, unsigned type) {
    if (2 * (f->used + 1) > f->cap && fields_grow(f) < 0) return -1;
    uint64_t h = fnv1a(key, key_len, kind_hash ^ 0x9e3779b97f4a7c15ULL);
    size_t j = h & (f->cap - 1);
    for (;; j = (j + 1) & (f->cap - 1)) {
        Slot *s = &f->slots[j];
        if (s->name == NULL) break;
        if (s->hash == h && s->kind_len == kind_len && s->key_len == key_len
            && memcmp(s->name, kind, kind_len) == 0 && memcmp(s->name + kind_len, key, key_len) == 0) {
            s->mask |= type;
            return 0;
        }
    }
    Slot *s = &f->slots[j];
    s->name = malloc(kind_len + key_len + 1);
    if (s->name == NULL) return -1;
    memcpy(s->name, kind, kind_len);
    memcpy(s->name + kind_len, key, key_len);
    s->kind_len = kind_len;
    s->key_len = key_len;
    s->hash = h;
    s->mask = type;
    f->used++;
    return 0;
}

static void fields_free(Fields *f) {
    for (size_t i = 0; i < f->cap; i++) free(f->slots[i].name);
    free(f->slots);
}

/* Past a string starting at its quote, or NULL; *escaped is set where it holds a backslash. */
static const unsigned char *skip_string(const unsigned char *p, const unsigned char *end, int *escaped) {
    /* memchr runs through the long plain strings (digests, ids) many bytes at a time. */
    for (p++; p < end;) {
        const unsigned char *quote = memchr(p, '"', (size_t)(end - p));
        if (quote == NULL) return NULL;
        const unsigned char *backslash = memchr(p, '\\', (size_t)(quote - p));
        if (backslash == NULL) return quote + 1;
        *escaped = 1;
        p = backslash + 2; /* past the escaped byte, which may be a quote */
    }
    return NULL;
}

/* Past an object or array starting at its bracket, or NULL. */
static const unsigned char *skip_nested(const unsigned char *p, const unsigned char *end) {
    int depth = 0, escaped = 0;
    while (p < end) {
        unsigned char c = *p;
        if (c == '"') {
            p = skip_string(p, end, &escaped);
            if (p == NULL) return NULL;
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (--depth == 0) return p + 1;
        }
        p++;
    }
    return NULL;
}

#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

enum { N_INT = 1, N_REAL = 2, N_BIG = 3 };

/* Past a number in JSON's grammar, without leading zeros, or NULL; its kind (an integer of at
 * most 18 digits, other than -0, is N_INT with its value). The fields scan and the typed parse
 * both read numbers through it. */
static const unsigned char *scan_number(const unsigned char *p, const unsigned char *end, int *kind, long long *value) {
    int negative = *p == '-';
    if (negative) p++;
    const unsigned char *digits = p;
    while (p < end && IS_DIGIT(*p)) p++;
    size_t count = (size_t)(p - digits);
    if (count == 0 || (count > 1 && *digits == '0')) return NULL;
    *kind = N_INT;
    if (p < end && *p == '.') {
        const unsigned char *d = ++p;
        while (p < end && IS_DIGIT(*p)) p++;
        if (p == d) return NULL;
        *kind = N_REAL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const unsigned char *d = p;
        while (p < end && IS_DIGIT(*p)) p++;
        if (p == d) return NULL;
        *kind = N_REAL;
    }
    if (*kind == N_INT) {
        if (count > 18 || (negative && *digits == '0')) {
            *kind = N_BIG;
        } else {
            long long v = 0;
            for (size_t i = 0; i < count; i++) v = v * 10 + (digits[i] - '0');
            *value = negative ? -v : v;
        }
    }
    return p;
}

/* Past a number in canonical form, with its type as yyjson (DuckDB) reads it, or NULL. */
static const unsigned char *skip_number(const unsigned char *p, const unsigned char *end, unsigned *type) {
    int kind;
    long long value = 0;
    p = scan_number(p, end, &kind, &value);
    if (p == NULL || kind == N_BIG) return NULL; /* past 64 bits, or -0: DuckDB's */
    *type = kind == N_REAL ? T_DOUBLE : value < 0 ? T_BIGINT : T_UBIGINT;
    return p;
}

/* The top-level keys of one row's data; 1 where the scan is not sure (DuckDB then types them). */
static int scan_fields(Fields *f, const unsigned char *kind, size_t kind_len, const unsigned char *p, size_t n) {
    const unsigned char *end = p + n, *previous = NULL;
    size_t previous_len = 0;
    uint64_t kind_hash = fnv1a(kind, kind_len, 14695981039346656037ULL);
    if (n < 2 || *p != '{') return 1;
    p++;
    if (*p == '}') return p + 1 == end ? 0 : 1;
    for (;;) {
        if (p >= end || *p != '"') return 1;
        int escaped = 0;
        const unsigned char *key = p + 1, *after = skip_string(p, end, &escaped);
        if (after == NULL || escaped) return 1;
        size_t key_len = (size_t)(after - 1 - key);
        if (previous != NULL) {
            /* Canonical keys are sorted by their bytes and unique: anything else is DuckDB's. */
            size_t common = previous_len < key_len ? previous_len : key_len;
            int order = memcmp(previous, key, common);
            if (order > 0 || (order == 0 && previous_len >= key_len)) return 1;
        }
        previous = key;
        previous_len = key_len;
        p = after;
        if (p >= end || *p != ':') return 1;
        if (++p >= end) return 1;
        unsigned type;
        switch (*p) {
            case '"':
                type = T_VARCHAR;
                p = skip_string(p, end, &escaped);
                break;
            case '{':
                type = T_OBJECT;
                p = skip_nested(p, end);
                break;
            case '[':
                type = T_ARRAY;
                p = skip_nested(p, end);
                break;
            case 't':
                type = T_BOOLEAN;
                p = (size_t)(end - p) >= 4 && memcmp(p, "true", 4) == 0 ? p + 4 : NULL;
                break;
            case 'f':
                type = T_BOOLEAN;
                p = (size_t)(end - p) >= 5 && memcmp(p, "false", 5) == 0 ? p + 5 : NULL;
                break;
            case 'n':
                type = T_NULL;
                p = (size_t)(end - p) >= 4 && memcmp(p, "null", 4) == 0 ? p + 4 : NULL;
                break;
            default:
                if (*p != '-' && !IS_DIGIT(*p)) return 1;
                p = skip_number(p, end, &type);
        }
        if (p == NULL || p >= end) return 1;
        if (fields_add(f, kind, kind_len, kind_hash, key, key_len, type) < 0) return -1;
        if (*p == '}') return p + 1 == end ? 0 : 1;
        if (*p++ != ',') return 1;
    }
}

/* ---- The read. ---- */

/* All text columns, or those of a mask's bits (bit c: text column c). */
#define ALL_COLUMNS ((1u << TEXT_COLUMNS) - 1)

static int add_row(Buffer *seqs, Column *cols, const Source *src, int64_t row, unsigned mask) {
    if (reserve(seqs, 8) < 0) return READ_NOMEM;
    int64_t seq = source_seq(src);
    memcpy(seqs->p + seqs->len, &seq, 8);
    seqs->len += 8;
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        if (!(mask & (1u << c))) continue;
        Column *col = &cols[c];
        if ((row & 7) == 0) {
            if (reserve(&col->validity, 1) < 0) return READ_NOMEM;
            col->validity.p[col->validity.len++] = 0;
        }
        Text value;
        source_text(src, c + 1, &value);
        if (value.is_null) {
            col->nulls++;
        } else {
            const unsigned char *text = value.p;
            size_t n = value.n;
            if (text == NULL && n) return READ_NOMEM;
            if (col->data.len + n > INT32_MAX) return READ_TOO_LARGE;
            if (reserve(&col->data, n) < 0) return READ_NOMEM;
            if (n) memcpy(col->data.p + col->data.len, text, n);
            col->data.len += n;
            col->validity.p[col->validity.len - 1] |= (unsigned char)(1u << (row & 7));
        }
        if (reserve(&col->offsets, 4) < 0) return READ_NOMEM;
        int32_t end = (int32_t)col->data.len;
        memcpy(col->offsets.p + col->offsets.len, &end, 4);
        col->offsets.len += 4;
    }
    return READ_OK;
}

/* The string just added to a column (the row's last), or NULL where it is null. */
static const unsigned char *last_text(const Column *col, int64_t row, size_t *n) {
    if (!(col->validity.p[row >> 3] & (1u << (row & 7)))) return NULL;
    int32_t start, stop;
    memcpy(&start, col->offsets.p + 4 * row, 4);
    memcpy(&stop, col->offsets.p + 4 * (row + 1), 4);
    *n = (size_t)(stop - start);
    return col->data.p + start;
}

enum { COL_KIND = 2, COL_DATA = 5 }; /* among the text columns */

/* The buffers of a read's text columns (those handed to Python are already NULL). */
static void columns_free(Column *cols) {
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        free(cols[c].offsets.p);
        free(cols[c].data.p);
        free(cols[c].validity.p);
    }
}

/* ---- Each kind's typed fields in C (read_checked_by_kind's ``typed``). ----
 *
 * What DuckDB's ``unnest(json_transform(data, '{"field": "TYPE", ...}'))`` gives for a row, for
 * the values this parse is sure of: where DuckDB would give anything this code does not
 * reproduce byte for byte (a float written back as text, an escape yyjson writes otherwise, a
 * number past 18 digits, a string where a number is asked for, JSON DuckDB would refuse,
 * keys out of canonical order...), the kind is marked unsure and the caller reads the rows
 * again for DuckDB to parse. Types: VARCHAR (a string unescaped; an integer, true, false, an
 * object or array as their JSON text), BIGINT (an integer), DOUBLE (a number, correctly
 * rounded as yyjson and strtod both round), BOOLEAN, JSON (the value's minified JSON text,
 * escapes as yyjson writes them), STRUCT (an object, its children typed the same way); a null
 * or missing key is NULL. */

enum { F_VARCHAR = 0, F_BIGINT = 1, F_DOUBLE = 2, F_BOOLEAN = 3, F_JSON = 4, F_STRUCT = 5 };
#define MAX_FIELDS 64
#define MAX_DEPTH 32
#define NUMBER_MAX 40 /* longest number text read into a double here */

typedef struct Field {
    char *name;
    size_t name_len;
    int type;
    int out; /* its output column (pre-order over the tree) */
    struct Field *children;
    int nchildren;
    int *order; /* the children by their names' bytes (a STRUCT's), or, for the top level, unused */
} Field;

/* Names compared as canonical JSON orders keys: bytewise, a prefix first. */
static inline int name_cmp(const unsigned char *a, size_t an, const unsigned char *b, size_t bn) {
    size_t n = an < bn ? an : bn;
    for (size_t i = 0; i < n; i++) /* names are short: no call */
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return (an > bn) - (an < bn);
}

/* One output column: values (int64, double, bits) or offsets and data (strings), validity. */
typedef struct {
    int type;
    Buffer values, data, validity;
    int64_t nulls, rows;
} Out;

/* The entries of one object field of the data, each kept where its key is one of ``names`` or
 * starts with one followed by '{' (a Prometheus sample's name and labels): one row per entry kept,
 * (seq, the name's label, the key past the name, the value as DOUBLE). What DuckDB gives for
 * ledger/_typed.py's entries_sql, where this parse is sure: a value kept that is not a number
 * or null, a key it cannot unescape, or a field value that is neither an object nor null is
 * DuckDB's. */
typedef struct {
    char *field;
    size_t field_len;
    int nnames;
    char **names, **labels;
    size_t *name_lens, *label_lens;
} Entries;

enum { E_SEQ = 0, E_LABEL = 1, E_SERIES = 2, E_VALUE = 3, E_OUTS = 4 };
static const int ENTRY_TYPES[E_OUTS] = {F_BIGINT, F_VARCHAR, F_VARCHAR, F_DOUBLE};

typedef struct {
    char *kind;
    size_t kind_len;
    unsigned mask; /* the text columns copied for this kind */
    Entries *entries; /* an object field's entries to unnest, or NULL */
    Field *fields;
    int *order; /* the fields by their names' bytes */
    int nfields, nouts;
    int *types; /* each output column's type */
} Spec;

typedef struct {
    Spec *items;
    size_t used;
} Specs;

static void fields_release(Field *f, int n) {
    for (int i = 0; i < n; i++) {
        free(f[i].name);
        free(f[i].order);
        fields_release(f[i].children, f[i].nchildren);
    }
    free(f);
}

static void entries_free(Entries *e) {
    if (e == NULL) return;
    for (int i = 0; i < e->nnames; i++) {
        free(e->names[i]);
        free(e->labels[i]);
    }
    free(e->names);
    free(e->labels);
    free(e->name_lens);
    free(e->label_lens);
    free(e->field);
    free(e);
}

static void specs_free(Specs *s) {
    for (size_t i = 0; i < s->used; i++) {
        entries_free(s->items[i].entries);
        free(s->items[i].kind);
        free(s->items[i].order);
        fields_release(s->items[i].fields, s->items[i].nfields);
        free(s->items[i].types);
    }
    free(s->items);
    memset(s, 0, sizeof *s);
}

static void outs_free(Out *o, int n) {
    if (o == NULL) return;
    for (int i = 0; i < n; i++) {
        free(o[i].values.p);
        free(o[i].data.p);
        free(o[i].validity.p);
    }
    free(o);
}

/* A new row's slot in a column: its validity bit (and its value bit for BOOLEAN). */
static int out_slot(Out *o, int valid) {
    int64_t r = o->rows;
    if ((r & 7) == 0) {
        if (reserve(&o->validity, 1) < 0) return -1;
        o->validity.p[o->validity.len++] = 0;
        if (o->type == F_BOOLEAN) {
            if (reserve(&o->values, 1) < 0) return -1;
            o->values.p[o->values.len++] = 0;
        }
    }
    if (valid) o->validity.p[r >> 3] |= (unsigned char)(1u << (r & 7));
    else o->nulls++;
    o->rows++;
    return 0;
}

/* The end of the string just written to a string column. */
static int out_offset(Out *o) {
    if (o->data.len > INT32_MAX) return -1;
    int32_t end = (int32_t)o->data.len;
    return put(&o->values, &end, 4);
}

static int out_fixed(Out *o, const void *value) {
    if (reserve(&o->values, 8) < 0) return -1;
    memcpy(o->values.p + o->values.len, value, 8);
    o->values.len += 8;
    return 0;
}

/* A NULL in the field's column (and its children's). */
static int out_null(Out *outs, const Field *f) {
    Out *o = &outs[f->out];
    if (out_slot(o, 0) < 0) return -1;
    switch (f->type) {
        case F_VARCHAR:
        case F_JSON:
            if (out_offset(o) < 0) return -1;
            break;
        case F_BIGINT:
        case F_DOUBLE: {
            uint64_t zero = 0;
            if (out_fixed(o, &zero) < 0) return -1;
            break;
        }
        case F_STRUCT:
            for (int i = 0; i < f->nchildren; i++)
                if (out_null(outs, &f->children[i]) < 0) return -1;
            break;
        default:
            break;
    }
    return 0;
}

/* Outcomes of the value parsers: a position past the value, or one of these. */
static const unsigned char MARKS[2] = {1, 2}; /* two addresses no value is parsed at */
#define UNSURE (&MARKS[0])
#define NOMEM (&MARKS[1])
#define FAILED(p) ((p) == UNSURE || (p) == NOMEM)

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const unsigned char *p, const unsigned char *end) {
    if (end - p < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Length of the valid UTF-8 sequence starting with lead byte p[0] (>= 0x80), or 0. */
static size_t utf8_length(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

static int put_utf8(Buffer *b, uint32_t cp) {
    unsigned char s[4];
    size_t n;
    if (cp < 0x80) s[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) s[0] = (unsigned char)(0xC0 | (cp >> 6)), s[1] = (unsigned char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        s[0] = (unsigned char)(0xE0 | (cp >> 12)), s[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)),
        s[2] = (unsigned char)(0x80 | (cp & 0x3F)), n = 3;
    else
        s[0] = (unsigned char)(0xF0 | (cp >> 18)), s[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F)),
        s[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), s[3] = (unsigned char)(0x80 | (cp & 0x3F)), n = 4;
    return put(b, s, n);
}

enum { S_SKIP = 0, S_JSON = 1, S_TEXT = 2 };

/* Past the bytes of a string that need no care (printable ASCII but '"' and '\\'), eight at a time
 * while none of the eight needs it (ids and digests are such runs whole). */
static inline const unsigned char *plain_run(const unsigned char *p, const unsigned char *end) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t quote = w ^ (ones * '"'), backslash = w ^ (ones * '\\');
        /* A byte below 0x20, a quote or a backslash sets its high bit (a borrow may set others: the
         * byte loop below settles the word); so does a byte of 0x80 or more. */
        if (((w - ones * 0x20) | (quote - ones) | (backslash - ones) | w) & highs) break;
        p += 8;
    }
    while (p < end && *p >= 0x20 && *p != '"' && *p != '\\' && *p < 0x80) p++;
    return p;
}

/* A string starting at its quote: checked (S_SKIP), written as yyjson writes it, quotes and
 * all (S_JSON), or unescaped (S_TEXT). */
static const unsigned char *json_string(const unsigned char *p, const unsigned char *end, Buffer *out, int mode) {
    p++;
    if (mode == S_JSON && put(out, "\"", 1) < 0) return NOMEM;
    for (;;) {
        const unsigned char *run = p;
        p = plain_run(p, end);
        if (mode != S_SKIP && put(out, run, (size_t)(p - run)) < 0) return NOMEM;
        if (p >= end) return UNSURE;
        unsigned char c = *p;
        if (c == '"') {
            if (mode == S_JSON && put(out, "\"", 1) < 0) return NOMEM;
            return p + 1;
        }
        if (c < 0x20) return UNSURE; /* a raw control: not JSON */
        if (c >= 0x80) {
            size_t n = utf8_length(p, end);
            if (n == 0) return UNSURE;
            if (mode != S_SKIP && put(out, p, n) < 0) return NOMEM;
            p += n;
            continue;
        }
        /* A backslash. */
        if (end - p < 2) return UNSURE;
        unsigned char e = p[1];
        const char *plain = NULL;
        switch (e) {
            case '"': plain = "\""; break;
            case '\\': plain = "\\"; break;
            case 'b': plain = "\b"; break;
            case 'f': plain = "\f"; break;
            case 'n': plain = "\n"; break;
            case 'r': plain = "\r"; break;
            case 't': plain = "\t"; break;
            case '/':
                if (mode == S_JSON) return UNSURE; /* yyjson writes it bare */
                plain = "/";
                break;
            case 'u': break;
            default: return UNSURE;
        }
        if (plain != NULL) {
            if (mode == S_JSON && put(out, p, 2) < 0) return NOMEM;
            if (mode == S_TEXT && put(out, plain, 1) < 0) return NOMEM;
            p += 2;
            continue;
        }
        int cp = hex4(p + 2, end);
        if (cp < 0 || cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF && mode == S_JSON)) return UNSURE;
        if (mode == S_JSON) {
            /* yyjson writes a control other than \b \t \n \f \r as \u00XX in upper case and
             * everything else verbatim: only the first is written back as it was. */
            if (cp >= 0x20 || cp == 8 || cp == 9 || cp == 10 || cp == 12 || cp == 13) return UNSURE;
            char esc[6] = {'\\', 'u', '0', '0', "0123456789ABCDEF"[cp >> 4], "0123456789ABCDEF"[cp & 15]};
            if (put(out, esc, 6) < 0) return NOMEM;
            p += 6;
            continue;
        }
        p += 6;
        uint32_t code = (uint32_t)cp;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return UNSURE;
            int low = hex4(p + 2, end);
            if (low < 0xDC00 || low > 0xDFFF) return UNSURE;
            code = 0x10000 + (((uint32_t)cp - 0xD800) << 10) + ((uint32_t)low - 0xDC00);
            p += 6;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return UNSURE;
        }
        if (mode == S_TEXT && put_utf8(out, code) < 0) return NOMEM;
    }
}

/* scan_number, with UNSURE where the text is not a number. */
static const unsigned char *json_number(const unsigned char *p, const unsigned char *end, int *kind, long long *value) {
    const unsigned char *after = scan_number(p, end, kind, value);
    return after == NULL ? UNSURE : after;
}

/* Any JSON value: checked (out NULL) or written as yyjson writes it (minified). */
static const unsigned char *json_value(const unsigned char *p, const unsigned char *end, Buffer *out, int depth) {
    if (p >= end) return UNSURE;
    switch (*p) {
        case '"':
            return json_string(p, end, out, out == NULL ? S_SKIP : S_JSON);
        case '{':
        case '[': {
            unsigned char close = *p == '{' ? '}' : ']';
            int object = *p == '{';
            if (depth >= MAX_DEPTH) return UNSURE;
            if (out != NULL && put(out, p, 1) < 0) return NOMEM;
            p++;
            if (p < end && *p == close) {
                if (out != NULL && put(out, p, 1) < 0) return NOMEM;
                return p + 1;
            }
            for (;;) {
                if (object) {
                    if (p >= end || *p != '"') return UNSURE;
                    p = json_string(p, end, out, out == NULL ? S_SKIP : S_JSON);
                    if (FAILED(p)) return p;
                    if (p >= end || *p != ':') return UNSURE;
                    if (out != NULL && put(out, ":", 1) < 0) return NOMEM;
                    p++;
                }
                p = json_value(p, end, out, depth + 1);
                if (FAILED(p)) return p;
                if (p >= end) return UNSURE;
                if (*p == close) {
                    if (out != NULL && put(out, p, 1) < 0) return NOMEM;
                    return p + 1;
                }
                if (*p != ',') return UNSURE;
                if (out != NULL && put(out, ",", 1) < 0) return NOMEM;
                p++;
            }
        }
        case 't':
        case 'f':
        case 'n': {
            const char *word = *p == 't' ? "true" : *p == 'f' ? "false" : "null";
            size_t n = strlen(word);
            if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) return UNSURE;
            if (out != NULL && put(out, word, n) < 0) return NOMEM;
            return p + n;
        }
        default: {
            if (*p != '-' && !IS_DIGIT(*p)) return UNSURE;
            int kind;
            long long value;
            const unsigned char *after = json_number(p, end, &kind, &value);
            if (FAILED(after)) return after;
            /* yyjson writes a float or a long integer back in its own form: only short integers
             * are sure to come back as they were. */
            if (out != NULL && kind != N_INT) return UNSURE;
            if (out != NULL && put(out, p, (size_t)(after - p)) < 0) return NOMEM;
            return after;
        }
    }
}

/* Where a row's entries go (the top level of its data only): read in the pass that types its fields. */
typedef struct {
    const Entries *entries;
    Out *outs;
    Buffer *key;
    int64_t seq;
} Unnest;

static const unsigned char *extract_object(const unsigned char *p, const unsigned char *end, const Field *fields,
                                           const int *order, int nfields, Out *outs, int depth, Unnest *unnest);
static const unsigned char *entries_of(const Entries *e, Out *outs, Buffer *key, int64_t seq, const unsigned char *p,
                                       const unsigned char *end);

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A decimal without exponent of at most 15 significant digits and 22 decimals, as m / 10^k: both
 * exact in a double, and one IEEE division rounds correctly, so this is strtod's value (Clinger's
 * fast path). 0 where the number is not of that form. */
static int fast_double(const unsigned char *p, const unsigned char *end, double *out) {
    int negative = *p == '-';
    if (negative) p++;
    uint64_t m = 0;
    int significant = 0, decimals = 0, in_fraction = 0;
    for (; p < end; p++) {
        if (*p == '.') {
            in_fraction = 1;
            continue;
        }
        if (!IS_DIGIT(*p)) return 0; /* an exponent */
        if (m != 0 || *p != '0') significant++;
        m = m * 10 + (uint64_t)(*p - '0');
        decimals += in_fraction;
        if (significant > 15 || decimals > 22) return 0;
    }
    double d = (double)m / POW10[decimals];
    *out = negative ? -d : d;
    return 1;
}

/* A number as DOUBLE (correctly rounded, as yyjson and strtod both round), or UNSURE: past 18
 * digits, -0, not finite, or a float whose text is too long to read here. */
static const unsigned char *parse_double(const unsigned char *p, const unsigned char *end, double *d) {
    if (*p != '-' && !IS_DIGIT(*p)) return UNSURE;
    int kind;
    long long value;
    const unsigned char *after = json_number(p, end, &kind, &value);
    if (FAILED(after)) return after;
    if (kind == N_INT) {
        *d = (double)value;
    } else if (fast_double(p, after, d)) {
        /* exact operands, one correctly rounded division: strtod's double */
    } else {
        size_t n = (size_t)(after - p);
        if (kind != N_REAL || n >= NUMBER_MAX) return UNSURE;
        char text[NUMBER_MAX];
        memcpy(text, p, n);
        text[n] = 0;
        char *stop;
        errno = 0;
        *d = strtod(text, &stop);
        if (errno != 0 || stop != text + n || !isfinite(*d) || (*d == 0 && strpbrk(text, "123456789")))
            return UNSURE;
    }
    return after;
}

/* One field's value into its column. */
static const unsigned char *extract_value(const unsigned char *p, const unsigned char *end, const Field *f, Out *outs,
                                          int depth) {
    Out *o = &outs[f->out];
    if (p >= end) return UNSURE;
    if (*p == 'n') {
        if ((size_t)(end - p) < 4 || memcmp(p, "null", 4) != 0) return UNSURE;
        return out_null(outs, f) < 0 ? NOMEM : p + 4;
    }
    switch (f->type) {
        case F_VARCHAR:
            if (*p == '"') {
                if (out_slot(o, 1) < 0) return NOMEM;
                p = json_string(p, end, &o->data, S_TEXT);
            } else {
                if (out_slot(o, 1) < 0) return NOMEM;
                p = json_value(p, end, &o->data, depth);
            }
            if (FAILED(p)) return p;
            return out_offset(o) < 0 ? NOMEM : p;
        case F_JSON:
            if (out_slot(o, 1) < 0) return NOMEM;
            p = json_value(p, end, &o->data, depth);
            if (FAILED(p)) return p;
            return out_offset(o) < 0 ? NOMEM : p;
        case F_BIGINT: {
            if (*p != '-' && !IS_DIGIT(*p)) return UNSURE;
            int kind;
            long long value;
            p = json_number(p, end, &kind, &value);
            if (FAILED(p)) return p;
            if (kind != N_INT) return UNSURE;
            int64_t v = value;
            return out_slot(o, 1) < 0 || out_fixed(o, &v) < 0 ? NOMEM : p;
        }
        case F_DOUBLE: {
            double d;
            const unsigned char *after = parse_double(p, end, &d);
            if (FAILED(after)) return after;
            return out_slot(o, 1) < 0 || out_fixed(o, &d) < 0 ? NOMEM : after;
        }
        case F_BOOLEAN: {
            int truth;
            if ((size_t)(end - p) >= 4 && memcmp(p, "true", 4) == 0) truth = 1, p += 4;
            else if ((size_t)(end - p) >= 5 && memcmp(p, "false", 5) == 0) truth = 0, p += 5;
            else return UNSURE;
            int64_t r = o->rows;
            if (out_slot(o, 1) < 0) return NOMEM;
            if (truth) o->values.p[r >> 3] |= (unsigned char)(1u << (r & 7));
            return p;
        }
        case F_STRUCT:
            if (*p != '{' || depth >= MAX_DEPTH) return UNSURE;
            if (out_slot(o, 1) < 0) return NOMEM;
            return extract_object(p, end, f->children, f->order, f->nchildren, outs, depth + 1, NULL);
        default:
            return UNSURE;
    }
}

/* An object's keys, in canonical order (bytewise, unique), each of ``fields`` into its column,
 * the others checked and passed over; a field it lacks is NULL. */
static const unsigned char *extract_object(const unsigned char *p, const unsigned char *end, const Field *fields,
                                           const int *order, int nfields, Out *outs, int depth, Unnest *unnest) {
    unsigned char seen[MAX_FIELDS] = {0};
    int next = 0; /* the keys come in canonical order: the fields are met in ``order`` */
    const unsigned char *previous = NULL;
    size_t previous_len = 0;
    if (p >= end || *p != '{') return UNSURE;
    p++;
    if (p < end && *p == '}') {
        p++;
    } else {
        for (;;) {
            if (p >= end || *p != '"') return UNSURE;
            /* A key of plain ASCII (any other, escaped or not, is DuckDB's to match). */
            const unsigned char *key = p + 1, *after = plain_run(key, end);
            if (after >= end || *after != '"') return UNSURE;
            size_t key_len = (size_t)(after - key);
            after++;
            if (previous != NULL && name_cmp(previous, previous_len, key, key_len) >= 0) return UNSURE;
            previous = key;
            previous_len = key_len;
            p = after;
            if (p >= end || *p != ':') return UNSURE;
            p++;
            int found = -1;
            while (next < nfields) {
                const Field *f = &fields[order[next]];
                int c = name_cmp((const unsigned char *)f->name, f->name_len, key, key_len);
                if (c > 0) break;
                next++;
                if (c == 0) {
                    found = order[next - 1];
                    break;
                }
            }
            if (unnest != NULL && key_len == unnest->entries->field_len
                && memcmp(key, unnest->entries->field, key_len) == 0) {
                if (found >= 0) return UNSURE; /* a typed field too: not both in one pass */
                p = entries_of(unnest->entries, unnest->outs, unnest->key, unnest->seq, p, end);
            } else if (found >= 0) {
                seen[found] = 1;
                p = extract_value(p, end, &fields[found], outs, depth);
            } else {
                p = json_value(p, end, NULL, depth);
            }
            if (FAILED(p)) return p;
            if (p >= end) return UNSURE;
            if (*p == '}') {
                p++;
                break;
            }
            if (*p++ != ',') return UNSURE;
        }
    }
    for (int i = 0; i < nfields; i++)
        if (!seen[i] && out_null(outs, &fields[i]) < 0) return NOMEM;
    return p;
}

/* One row's data into its kind's columns: READ_OK, READ_NOMEM, or EXTRACT_UNSURE. */
#define EXTRACT_UNSURE (-1)
static int row_data(const Source *src, const unsigned char **data, size_t *n) {
    if (src->st != NULL) {
        if (sqlite3_column_type(src->st, 6) != SQLITE_TEXT) return EXTRACT_UNSURE;
        *data = sqlite3_column_text(src->st, 6);
        *n = (size_t)sqlite3_column_bytes(src->st, 6);
        if (*data == NULL) return READ_NOMEM;
    } else {
        Text t;
        buffered_text(src, 6, &t);
        if (t.is_null) return EXTRACT_UNSURE;
        *data = t.n ? t.p : (const unsigned char *)"";
        *n = t.n;
    }
    return READ_OK;
}

/* ``unnest``: where the spec's entries go (NULL: it has none). */
static int extract_row(const Spec *spec, Out *outs, Unnest *unnest, const Source *src) {
    const unsigned char *p;
    size_t n;
    int got = row_data(src, &p, &n);
    if (got != READ_OK) return got;
    if (unnest != NULL) unnest->seq = source_seq(src);
    const unsigned char *after = extract_object(p, p + n, spec->fields, spec->order, spec->nfields, outs, 0, unnest);
    if (after == NOMEM) return READ_NOMEM;
    if (after == UNSURE || after != p + n) return EXTRACT_UNSURE;
    return READ_OK;
}

/* One object's entries (at ``p``, the field's value; null has none) into ``outs``: past the value,
 * UNSURE or NOMEM. ``key`` holds each key unescaped. */
static const unsigned char *entries_of(const Entries *e, Out *outs, Buffer *key, int64_t seq, const unsigned char *p,
                                       const unsigned char *end) {
    if (p >= end) return UNSURE;
    if (*p == 'n') return (size_t)(end - p) >= 4 && memcmp(p, "null", 4) == 0 ? p + 4 : UNSURE;
    if (*p != '{') return UNSURE;
    p++;
    if (p < end && *p == '}') return p + 1;
    for (;;) {
        if (p >= end || *p != '"') return UNSURE;
        /* The key's leading bytes that need no unescaping: where they differ from every name within
         * them, the key is none of the names (most of a scrape's samples), and is only checked. */
        const unsigned char *raw = p + 1;
        size_t plain = (size_t)(plain_run(raw, end) - raw);
        int candidate = 0;
        for (int i = 0; i < e->nnames && !candidate; i++) {
            size_t m = e->name_lens[i] < plain ? e->name_lens[i] : plain;
            candidate = memcmp(raw, e->names[i], m) == 0;
        }
        key->len = 0;
        p = json_string(p, end, candidate ? key : NULL, candidate ? S_TEXT : S_SKIP);
        if (FAILED(p)) return p;
        if (p >= end || *p != ':') return UNSURE;
        p++;
        int found = -1;
        for (int i = 0; i < e->nnames && found < 0 && candidate; i++) {
            size_t m = e->name_lens[i];
            if (key->len >= m && memcmp(key->p, e->names[i], m) == 0 && (key->len == m || key->p[m] == '{'))
                found = i;
        }
        if (found < 0) {
            p = json_value(p, end, NULL, 1);
            if (FAILED(p)) return p;
        } else {
            double value = 0;
            int valid = 1;
            if (p < end && *p == 'n') {
                if ((size_t)(end - p) < 4 || memcmp(p, "null", 4) != 0) return UNSURE;
                p += 4;
                valid = 0;
            } else {
                p = parse_double(p, end, &value);
                if (FAILED(p)) return p;
            }
            size_t m = e->name_lens[found];
            if (out_slot(&outs[E_SEQ], 1) < 0 || out_fixed(&outs[E_SEQ], &seq) < 0 || out_slot(&outs[E_LABEL], 1) < 0
                || put(&outs[E_LABEL].data, e->labels[found], e->label_lens[found]) < 0
                || out_offset(&outs[E_LABEL]) < 0 || out_slot(&outs[E_SERIES], 1) < 0
                || put(&outs[E_SERIES].data, key->p + m, key->len - m) < 0 || out_offset(&outs[E_SERIES]) < 0
                || out_slot(&outs[E_VALUE], valid) < 0 || out_fixed(&outs[E_VALUE], &value) < 0)
                return NOMEM;
        }
        if (p >= end) return UNSURE;
        if (*p == '}') return p + 1;
        if (*p++ != ',') return UNSURE;
    }
}

/* ---- Rows grouped by kind (read_checked_by_kind). ---- */

/* Rows of ``kinds`` kept only where their run_id is one of ``runs`` (or null): a report about a few
 * runs of a large ledger checks every row but copies and parses only those runs' (``scope``). */
typedef struct {
    Py_ssize_t nkinds, nruns;
    Text *kinds, *runs; /* borrowed from the str objects of the tuple parsed (alive for the call) */
} Scope;

/* One kind's rows, in seq order: its own seq buffer and text columns. */
typedef struct {
    unsigned char *kind; /* NULL for a row whose kind is null */
    size_t kind_len;
    Buffer seqs;
    Column cols[TEXT_COLUMNS];
    int64_t rows;
    unsigned mask;      /* the text columns copied */
    const Spec *spec;   /* its typed fields, or NULL */
    Out *outs;          /* their columns */
    Out *eouts;         /* its spec's entries' columns (E_OUTS), or NULL */
    Buffer key;         /* an entry's key, unescaped */
    int unsure;         /* a row the typed parse was not sure of: its columns are dropped */
    int scoped;         /* a kind of the scope: only its runs' rows are kept */
} Group;

typedef struct {
    Group *items;
    size_t used, cap, last; /* last: the group of the row before (kinds come in runs) */
    const Specs *specs;     /* each kind's typed fields (none where NULL) */
    unsigned mask;          /* the text columns copied for a kind without typed fields */
    const Scope *scope;     /* the rows kept (all where NULL) */
} Groups;

static void groups_free(Groups *g) {
    for (size_t i = 0; i < g->used; i++) {
        Group *x = &g->items[i];
        free(x->kind);
        free(x->seqs.p);
        columns_free(x->cols);
        outs_free(x->outs, x->spec ? x->spec->nouts : 0);
        outs_free(x->eouts, x->eouts ? E_OUTS : 0);
        free(x->key.p);
    }
    free(g->items);
    memset(g, 0, sizeof *g);
}

static int columns_start(Column *cols) {
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        int32_t zero = 0;
        if (reserve(&cols[c].offsets, 4) < 0) return READ_NOMEM;
        memcpy(cols[c].offsets.p, &zero, 4);
        cols[c].offsets.len = 4;
    }
    return READ_OK;
}

/* The group of the current row's kind, made on its first row; NULL when out of memory. */
static Group *group_of(Groups *g, const Source *src) {
    Text t;
    source_text(src, 3, &t);
    int is_null = t.is_null;
    const unsigned char *kind = t.p;
    size_t n = t.n;
    if (!is_null && kind == NULL) return NULL;
    for (size_t k = 0; k < g->used; k++) {
        size_t i = (g->last + k) % g->used;
        Group *x = &g->items[i];
        if ((x->kind == NULL) == is_null && x->kind_len == n && (is_null || memcmp(x->kind, kind, n) == 0)) {
            g->last = i;
            return x;
        }
    }
    if (g->used == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 32;
        Group *items = realloc(g->items, cap * sizeof(Group));
        if (items == NULL) return NULL;
        g->items = items;
        g->cap = cap;
    }
    Group *x = &g->items[g->used];
    memset(x, 0, sizeof *x);
    if (!is_null) {
        x->kind = malloc(n ? n : 1);
        if (x->kind == NULL) return NULL;
        if (n) memcpy(x->kind, kind, n);
    }
    x->kind_len = n;
    x->mask = g->mask;
    for (Py_ssize_t k = 0; !is_null && g->scope != NULL && k < g->scope->nkinds; k++)
        x->scoped |= g->scope->kinds[k].n == n && memcmp(g->scope->kinds[k].p, kind, n) == 0;
    g->last = g->used++;
    if (columns_start(x->cols) != READ_OK) return NULL;
    for (size_t s = 0; !is_null && g->specs != NULL && s < g->specs->used; s++) {
        const Spec *spec = &g->specs->items[s];
        if (spec->kind_len != n || memcmp(spec->kind, kind, n) != 0) continue;
        x->outs = calloc((size_t)spec->nouts, sizeof(Out));
        if (x->outs == NULL) return NULL;
        x->spec = spec;
        x->mask = spec->mask;
        for (int i = 0; i < spec->nouts; i++) {
            x->outs[i].type = spec->types[i];
            int32_t zero = 0;
            if ((spec->types[i] == F_VARCHAR || spec->types[i] == F_JSON) && put(&x->outs[i].values, &zero, 4) < 0)
                return NULL;
        }
        if (spec->entries != NULL) {
            x->eouts = calloc(E_OUTS, sizeof(Out));
            if (x->eouts == NULL) return NULL;
            for (int i = 0; i < E_OUTS; i++) {
                x->eouts[i].type = ENTRY_TYPES[i];
                int32_t zero = 0;
                if (ENTRY_TYPES[i] == F_VARCHAR && put(&x->eouts[i].values, &zero, 4) < 0) return NULL;
            }
        }
        break;
    }
    return x;
}

/* Texts in byte order (a shorter text first where one begins the other): the scope's runs are
 * sorted so, and looked up by bisection (a report of every run of a team ledger keeps thousands). */
static int text_order(const void *a, const void *b) {
    const Text *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    return c != 0 ? c : (x->n > y->n) - (x->n < y->n);
}

/* Whether the current row's run_id (null, or one of the scope's runs) keeps it. */
static int in_scope(const Scope *scope, const Source *src) {
    Text run;
    source_text(src, 4, &run);
    if (run.is_null) return 1;
    return bsearch(&run, scope->runs, (size_t)scope->nruns, sizeof(Text), text_order) != NULL;
}

/* The current row into its kind's group (of the scope's kinds, only where its run is kept). */
static int group_row(const Source *src, Groups *groups) {
    int outcome;
    Group *group = group_of(groups, src);
    if (group == NULL) return READ_NOMEM;
    if (group->scoped && !in_scope(groups->scope, src)) return READ_OK; /* checked, not kept */
    if ((outcome = add_row(&group->seqs, group->cols, src, group->rows, group->mask)) != READ_OK) return outcome;
    if (group->spec != NULL && !group->unsure) {
        Unnest unnest = {group->spec->entries, group->eouts, &group->key, 0};
        int typed = extract_row(group->spec, group->outs, group->eouts != NULL ? &unnest : NULL, src);
        if (typed == READ_NOMEM) return READ_NOMEM;
        group->unsure = typed != READ_OK;
    }
    group->rows++;
    return READ_OK;
}

/* One row into seqs and cols and, where groups is given, into its kind's group (groups alone
 * where seqs is NULL); checked first where check is given (reading a column as text may convert
 * it, and the check needs its type). */
static int take_row(const Source *src, int64_t row, Buffer *seqs, Column *cols, Check *check, Fields *fields,
                    Groups *groups) {
    int outcome;
    if (check != NULL && (outcome = check_row(check, src)) != READ_OK) return outcome;
    if (groups != NULL) {
        if ((outcome = group_row(src, groups)) != READ_OK) return outcome;
        if (seqs == NULL) return READ_OK;
    }
    if ((outcome = add_row(seqs, cols, src, row, ALL_COLUMNS)) != READ_OK) return outcome;
    if (fields != NULL && !fields->unsure) {
        size_t kind_len = 0, data_len = 0;
        const unsigned char *kind = last_text(&cols[COL_KIND], row, &kind_len);
        const unsigned char *data = last_text(&cols[COL_DATA], row, &data_len);
        int scanned = kind == NULL || data == NULL ? 1 : scan_fields(fields, kind, kind_len, data, data_len);
        if (scanned < 0) return READ_NOMEM;
        fields->unsure = scanned;
    }
    return READ_OK;
}

/* Into seqs and cols, or, where groups is given, into each kind's group. */
static int read_rows(const char *path, int64_t after, int64_t until, Buffer *seqs, Column *cols, int64_t *rows,
                     const char **sqlite_message, Check *check, Fields *fields, Groups *groups) {
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int outcome = READ_OK;
    *sqlite_message = NULL;
    if (cols != NULL && columns_start(cols) != READ_OK) return READ_NOMEM;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        outcome = READ_SQLITE;
        goto done;
    }
    sqlite3_busy_timeout(db, 30000);
    const char *sql =
        "SELECT seq, id, ts, kind, run_id, block_id, data, digest, chain FROM events "
        "WHERE seq > ?1 AND seq <= ?2 ORDER BY seq";
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        outcome = READ_SQLITE;
        goto done;
    }
    sqlite3_bind_int64(st, 1, after);
    sqlite3_bind_int64(st, 2, until);
    int step;
    int64_t row = 0;
    Source src = {.st = st};
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        if ((outcome = take_row(&src, row, seqs, cols, check, fields, groups)) != READ_OK) goto done;
        row++;
    }
    if (step != SQLITE_DONE) outcome = READ_SQLITE;
    *rows = row;
done:
    if (outcome == READ_SQLITE && db != NULL) *sqlite_message = sqlite3_errmsg(db);
    /* The message lives in db: copy it before closing. */
    static __thread char message[256];
    if (*sqlite_message != NULL) {
        strncpy(message, *sqlite_message, sizeof message - 1);
        message[sizeof message - 1] = 0;
        *sqlite_message = message;
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return outcome;
}

/* As read_rows, over the tuples of COPY data (``src``); where the data is not what it should be,
 * ``src->error`` says why (the outcome stays READ_OK: a malformed stream is not a verdict). */
static int read_copy(Source *src, Buffer *seqs, Column *cols, int64_t *rows, Check *check, Fields *fields,
                     Groups *groups) {
    if (cols != NULL && columns_start(cols) != READ_OK) return READ_NOMEM;
    if (copy_start(src) < 0) return READ_OK;
    int next, outcome;
    int64_t row = 0;
    while ((next = copy_next(src)) == 1) {
        if ((outcome = take_row(src, row, seqs, cols, check, fields, groups)) != READ_OK) return outcome;
        row++;
    }
    if (next == 0 && src->at != src->end) src->error = "data after the trailer";
    *rows = row;
    return READ_OK;
}

/* A buffer handed to Python as it is (no copy): the object owns the memory and frees it when
 * Arrow, which wraps it through the buffer protocol, lets it go. Copying each column into a
 * bytes object cost a memcpy of every byte read and a fresh page fault per 4 KiB. */
typedef struct {
    PyObject_HEAD
    unsigned char *p;
    Py_ssize_t len;
} Memory;

static int memory_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Memory *m = (Memory *)self;
    return PyBuffer_FillInfo(view, self, m->p ? m->p : (unsigned char *)"", m->len, 1, flags);
}

static void memory_dealloc(PyObject *self) {
    free(((Memory *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs memory_as_buffer = {.bf_getbuffer = memory_getbuffer};

static PyTypeObject MemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ledger._carrow.Memory",
    .tp_basicsize = sizeof(Memory),
    .tp_dealloc = memory_dealloc,
    .tp_as_buffer = &memory_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes read natively, owned here and lent to Arrow through the buffer protocol.",
};

/* The buffer's memory as a Memory object; the buffer is left empty (the object owns it now). */
static PyObject *as_memory(Buffer *b) {
    Memory *m = PyObject_New(Memory, &MemoryType);
    if (m == NULL) return NULL;
    m->p = b->p;
    m->len = (Py_ssize_t)b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)m;
}

/* kind -> key -> type mask, or None where a name is not UTF-8 (DuckDB then types the segment). */
static PyObject *fields_dict(const Fields *f) {
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    for (size_t i = 0; i < f->cap; i++) {
        const Slot *s = &f->slots[i];
        if (s->name == NULL) continue;
        PyObject *kind = PyUnicode_DecodeUTF8((const char *)s->name, (Py_ssize_t)s->kind_len, NULL);
        PyObject *key = PyUnicode_DecodeUTF8((const char *)s->name + s->kind_len, (Py_ssize_t)s->key_len, NULL);
        if (kind == NULL || key == NULL) {
            Py_XDECREF(kind);
            Py_XDECREF(key);
            Py_DECREF(out);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        PyObject *keys = PyDict_GetItemWithError(out, kind);
        if (keys == NULL && !PyErr_Occurred()) {
            keys = PyDict_New();
            if (keys != NULL && PyDict_SetItem(out, kind, keys) < 0) Py_CLEAR(keys);
            Py_XDECREF(keys); /* the dict holds it */
        }
        PyObject *mask = keys == NULL ? NULL : PyLong_FromUnsignedLong(s->mask);
        int failed = mask == NULL || PyDict_SetItem(keys, key, mask) < 0;
        Py_XDECREF(mask);
        Py_DECREF(kind);
        Py_DECREF(key);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* A read's columns (those of mask) as Python's [(validity | None, nulls, offsets, data)]; the
 * buffers pass to it. */
static PyObject *columns_list(Column *cols, unsigned mask) {
    PyObject *columns = PyList_New(0);
    if (columns == NULL) return NULL;
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        if (!(mask & (1u << c))) continue;
        PyObject *validity = cols[c].nulls ? as_memory(&cols[c].validity) : (Py_INCREF(Py_None), Py_None);
        PyObject *item = Py_BuildValue("(NLNN)", validity, (long long)cols[c].nulls,
                                       as_memory(&cols[c].offsets), as_memory(&cols[c].data));
        int failed = item == NULL || PyList_Append(columns, item) < 0;
        Py_XDECREF(item);
        if (failed) {
            Py_DECREF(columns);
            return NULL;
        }
    }
    return columns;
}

static int specs_parse(PyObject *typed, Specs *specs);
static PyObject *groups_list(Groups *groups, int *unsure);

/* ``typed`` ({kind: (columns, fields[, entries])}, or NULL): each of those kinds' rows is also
 * parsed into its typed fields as it is read (the group of a kind without them keeps its seqs
 * alone), given after the fields as (groups, unsure), as read_checked_by_kind gives them. */
static PyObject *read_any(const char *path, long long after, long long until, Source *buffered, Check *check,
                          Fields *fields, PyObject *typed) {
    Buffer seqs = {0};
    Column cols[TEXT_COLUMNS];
    memset(cols, 0, sizeof cols);
    int64_t rows = 0;
    const char *message = NULL;
    int outcome, unsure = 0;
    Specs specs = {0};
    Groups kinds = {.specs = &specs, .mask = 0};
    Groups *groups = typed != NULL && typed != Py_None ? &kinds : NULL;
    PyObject *result = NULL, *columns = NULL, *grouped = NULL;
    if (groups != NULL && specs_parse(typed, &specs) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    if (buffered == NULL) {
        outcome = read_rows(path, after, until, &seqs, cols, &rows, &message, check, fields, groups);
    } else {
        outcome = read_copy(buffered, &seqs, cols, &rows, check, fields, groups);
    }
    Py_END_ALLOW_THREADS
    if (buffered != NULL && buffered->error != NULL && outcome == READ_OK) {
        PyErr_Format(PyExc_ValueError, "COPY data: %s", buffered->error);
        goto done;
    }
    if (raise_read_error(outcome, message)) goto done;
    columns = columns_list(cols, ALL_COLUMNS);
    if (columns == NULL) goto done;
    if (check == NULL) {
        result = Py_BuildValue("(LNO)", (long long)rows, as_memory(&seqs), columns);
    } else {
        PyObject *found = fields->unsure ? (Py_INCREF(Py_None), Py_None) : fields_dict(fields);
        if (found == NULL) goto done;
        if (groups != NULL && (grouped = groups_list(groups, &unsure)) == NULL) {
            Py_DECREF(found);
            goto done;
        }
        result = groups == NULL
                     ? Py_BuildValue("(LNO(iLLLs#)N)", (long long)rows, as_memory(&seqs), columns, check->outcome,
                                     check->bad_seq, check->found_seq, check->expected - 1, check->chain,
                                     (Py_ssize_t)check->chain_len, found)
                     : Py_BuildValue("(LNO(iLLLs#)N(OO))", (long long)rows, as_memory(&seqs), columns,
                                     check->outcome, check->bad_seq, check->found_seq, check->expected - 1,
                                     check->chain, (Py_ssize_t)check->chain_len, found, grouped,
                                     unsure ? Py_True : Py_False);
    }
done:
    Py_XDECREF(columns);
    Py_XDECREF(grouped);
    free(seqs.p);
    columns_free(cols);
    groups_free(&kinds);
    specs_free(&specs);
    return result;
}

static PyObject *read_range(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    long long after, until;
    if (!PyArg_ParseTuple(args, "sLL", &path, &after, &until)) return NULL;
    return read_any(path, after, until, NULL, NULL, NULL, NULL);
}

static PyObject *read_checked(PyObject *self, PyObject *args) {
    (void)self;
    const char *path, *chain;
    Py_ssize_t chain_len;
    long long after, until, expected;
    PyObject *typed = NULL;
    if (!PyArg_ParseTuple(args, "sLLLs#|O", &path, &after, &until, &expected, &chain, &chain_len, &typed))
        return NULL;
    if (chain_len != HEX_LEN && chain_len != 0) {
        PyErr_SetString(PyExc_ValueError, "previous chain must be 64 hex characters or empty");
        return NULL;
    }
    Check check = {.expected = expected, .chain_len = (size_t)chain_len, .outcome = CHECK_OK};
    memcpy(check.chain, chain, (size_t)chain_len);
    Fields fields = {0};
    PyObject *result = read_any(path, after, until, NULL, &check, &fields, typed);
    free(check.envelope.p);
    fields_free(&fields);
    return result;
}

/* Python's [(name, type, children | None)] as fields, numbering their output columns from *next. */
static const Field *SORTING; /* the fields qsort orders (under the GIL: one parse at a time) */

static int by_name(const void *a, const void *b) {
    const Field *x = &SORTING[*(const int *)a], *y = &SORTING[*(const int *)b];
    return name_cmp((const unsigned char *)x->name, x->name_len, (const unsigned char *)y->name, y->name_len);
}

/* The fields' indices by their names' bytes. */
static int *fields_order(const Field *fields, int n) {
    int *order = malloc((n ? (size_t)n : 1) * sizeof(int));
    if (order == NULL) return NULL;
    for (int i = 0; i < n; i++) order[i] = i;
    SORTING = fields;
    qsort(order, (size_t)n, sizeof(int), by_name);
    return order;
}

static int fields_parse(PyObject *list, Field **fields, int *nfields, int *next, int **types, int depth) {
    if (!PyList_Check(list) || PyList_GET_SIZE(list) > MAX_FIELDS || depth > 4) {
        PyErr_SetString(PyExc_ValueError, "typed fields: a list of at most 64 (name, type, children) per object");
        return -1;
    }
    int n = (int)PyList_GET_SIZE(list);
    *fields = calloc(n ? (size_t)n : 1, sizeof(Field));
    if (*fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *nfields = n;
    for (int i = 0; i < n; i++) {
        Field *f = &(*fields)[i];
        const char *name;
        Py_ssize_t name_len;
        PyObject *children;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "s#iO", &name, &name_len, &f->type, &children)) return -1;
        if (f->type < F_VARCHAR || f->type > F_STRUCT || (f->type == F_STRUCT) != (children != Py_None)) {
            PyErr_SetString(PyExc_ValueError, "typed fields: unknown type, or children where there is no STRUCT");
            return -1;
        }
        f->name = malloc((size_t)name_len + 1);
        int *grown = realloc(*types, (size_t)(*next + 1) * sizeof(int));
        if (f->name == NULL || grown == NULL) {
            if (grown != NULL) *types = grown;
            PyErr_NoMemory();
            return -1;
        }
        *types = grown;
        memcpy(f->name, name, (size_t)name_len);
        f->name_len = (size_t)name_len;
        f->out = (*next)++;
        (*types)[f->out] = f->type;
        if (f->type == F_STRUCT) {
            if (fields_parse(children, &f->children, &f->nchildren, next, types, depth + 1) < 0) return -1;
            if ((f->order = fields_order(f->children, f->nchildren)) == NULL) {
                PyErr_NoMemory();
                return -1;
            }
        }
    }
    return 0;
}

static char *copy_text(const char *text, Py_ssize_t n) {
    char *out = malloc((size_t)n + 1);
    if (out == NULL) return NULL;
    memcpy(out, text, (size_t)n);
    out[n] = 0;
    return out;
}

/* (field, ((name, label), ...)) as Entries. */
static int entries_parse(PyObject *arg, Entries **out) {
    const char *field;
    Py_ssize_t field_len;
    PyObject *names;
    if (!PyArg_ParseTuple(arg, "s#O!", &field, &field_len, &PyTuple_Type, &names)) return -1;
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    if (count < 1 || count > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "entries: 1 to 64 (name, label) pairs");
        return -1;
    }
    Entries *e = calloc(1, sizeof(Entries));
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *out = e;
    e->field = copy_text(field, field_len);
    e->field_len = (size_t)field_len;
    e->names = calloc((size_t)count, sizeof(char *));
    e->labels = calloc((size_t)count, sizeof(char *));
    e->name_lens = calloc((size_t)count, sizeof(size_t));
    e->label_lens = calloc((size_t)count, sizeof(size_t));
    if (e->field == NULL || e->names == NULL || e->labels == NULL || e->name_lens == NULL || e->label_lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *name, *label;
        Py_ssize_t name_len, label_len;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(names, i), "s#s#", &name, &name_len, &label, &label_len)) return -1;
        if (name_len == 0) {
            PyErr_SetString(PyExc_ValueError, "entries: an empty name");
            return -1;
        }
        e->names[i] = copy_text(name, name_len);
        e->labels[i] = copy_text(label, label_len);
        e->nnames = (int)i + 1;
        if (e->names[i] == NULL || e->labels[i] == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        e->name_lens[i] = (size_t)name_len;
        e->label_lens[i] = (size_t)label_len;
    }
    return 0;
}

/* {kind: (columns, fields[, entries])} as specs. */
static int specs_parse(PyObject *typed, Specs *specs) {
    if (typed == NULL || typed == Py_None) return 0;
    if (!PyDict_Check(typed)) {
        PyErr_SetString(PyExc_TypeError, "typed: a dict {kind: (columns, fields)}");
        return -1;
    }
    specs->items = calloc((size_t)PyDict_Size(typed) + 1, sizeof(Spec));
    if (specs->items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(typed, &pos, &key, &value)) {
        Spec *s = &specs->items[specs->used++];
        const char *kind;
        Py_ssize_t kind_len;
        PyObject *fields;
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "typed: kinds are str");
            return -1;
        }
        kind = PyUnicode_AsUTF8AndSize(key, &kind_len);
        PyObject *entries = Py_None;
        if (kind == NULL || !PyArg_ParseTuple(value, "IO|O", &s->mask, &fields, &entries)) return -1;
        if (entries != Py_None && entries_parse(entries, &s->entries) < 0) return -1;
        s->mask &= ALL_COLUMNS;
        s->kind = copy_text(kind, kind_len);
        if (s->kind == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->kind_len = (size_t)kind_len;
        if (fields_parse(fields, &s->fields, &s->nfields, &s->nouts, &s->types, 0) < 0) return -1;
        if ((s->order = fields_order(s->fields, s->nfields)) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* ``scope``, (kinds, runs) as two tuples of str, or None; the texts are borrowed from them. */
static int scope_parse(PyObject *arg, Scope *scope) {
    if (arg == NULL || arg == Py_None) return 0;
    PyObject *kinds, *runs;
    if (!PyTuple_Check(arg) || !PyArg_ParseTuple(arg, "O!O!", &PyTuple_Type, &kinds, &PyTuple_Type, &runs)) {
        PyErr_SetString(PyExc_TypeError, "scope: (kinds, runs), two tuples of str");
        return -1;
    }
    PyObject *lists[2] = {kinds, runs};
    Text **texts[2] = {&scope->kinds, &scope->runs};
    Py_ssize_t *counts[2] = {&scope->nkinds, &scope->nruns};
    for (int l = 0; l < 2; l++) {
        Py_ssize_t count = PyTuple_GET_SIZE(lists[l]);
        *texts[l] = calloc((size_t)count + 1, sizeof(Text));
        if (*texts[l] == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *item = PyTuple_GET_ITEM(lists[l], i);
            Py_ssize_t n;
            const char *text = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &n) : NULL;
            if (text == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "scope: kinds and runs are str");
                return -1;
            }
            (*texts[l])[i] = (Text){(const unsigned char *)text, (size_t)n, 0};
            *counts[l] = i + 1;
        }
    }
    if (scope->nruns > 1) qsort(scope->runs, (size_t)scope->nruns, sizeof(Text), text_order);
    return 0;
}

static void scope_free(Scope *scope) {
    free(scope->kinds);
    free(scope->runs);
    memset(scope, 0, sizeof *scope);
}

/* A typed group's columns as [(validity | None, nulls, values | None, data | None)] in pre-order. */
static PyObject *outs_list(Out *outs, int nouts) {
    PyObject *list = PyList_New(nouts);
    if (list == NULL) return NULL;
    for (int i = 0; i < nouts; i++) {
        Out *o = &outs[i];
        int text = o->type == F_VARCHAR || o->type == F_JSON;
        PyObject *validity = o->nulls ? as_memory(&o->validity) : (Py_INCREF(Py_None), Py_None);
        PyObject *values = o->type == F_STRUCT ? (Py_INCREF(Py_None), Py_None) : as_memory(&o->values);
        PyObject *data = text ? as_memory(&o->data) : (Py_INCREF(Py_None), Py_None);
        PyObject *item = Py_BuildValue("(NLNN)", validity, (long long)o->nulls, values, data);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* Each group as (kind, rows, seq_bytes, columns, typed_columns | None, (entries, entry_columns) | None),
 * in order of first appearance; *unsure is set where a group's typed parse was not sure of a row
 * (its typed columns are then None). The buffers pass to Python. */
static PyObject *groups_list(Groups *g, int *unsure) {
    PyObject *list = PyList_New((Py_ssize_t)g->used);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < g->used; i++) {
        Group *x = &g->items[i];
        *unsure |= x->unsure;
        PyObject *kind = x->kind == NULL ? (Py_INCREF(Py_None), Py_None)
                                         : PyUnicode_DecodeUTF8((const char *)x->kind, (Py_ssize_t)x->kind_len,
                                                                "surrogateescape");
        PyObject *columns = kind == NULL ? NULL : columns_list(x->cols, x->mask);
        PyObject *fields = columns == NULL                    ? NULL
                           : x->spec == NULL || x->unsure ? (Py_INCREF(Py_None), Py_None)
                                                              : outs_list(x->outs, x->spec->nouts);
        PyObject *entries = fields == NULL                     ? NULL
                            : x->eouts == NULL || x->unsure ? (Py_INCREF(Py_None), Py_None)
                                                             : Py_BuildValue("(LN)", (long long)x->eouts[E_SEQ].rows,
                                                                             outs_list(x->eouts, E_OUTS));
        PyObject *item = entries == NULL ? NULL
                                         : Py_BuildValue("(NLNNNN)", kind, (long long)x->rows, as_memory(&x->seqs),
                                                         columns, fields, entries);
        if (item == NULL) {
            if (entries == NULL) {
                Py_XDECREF(kind);
                Py_XDECREF(columns);
                Py_XDECREF(fields);
            }
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

/* read_checked_by_kind's work, over the SQLite file at ``path`` (rows after < seq <= until), or,
 * where ``buffered`` is given, over the rows of its COPY data. */
static PyObject *checked_by_kind(const char *path, long long after, long long until, Source *buffered,
                                 long long expected, const char *chain, Py_ssize_t chain_len, unsigned int mask,
                                 PyObject *typed, PyObject *scope_arg) {
    if (chain_len != HEX_LEN && chain_len != 0) {
        PyErr_SetString(PyExc_ValueError, "previous chain must be 64 hex characters or empty");
        return NULL;
    }
    mask &= ALL_COLUMNS;
    Check check = {.expected = expected, .chain_len = (size_t)chain_len, .outcome = CHECK_OK};
    memcpy(check.chain, chain, (size_t)chain_len);
    Specs specs = {0};
    Scope scope = {0};
    Groups groups = {.specs = &specs, .mask = mask};
    int64_t rows = 0;
    const char *message = NULL;
    int outcome = READ_OK, unsure = 0;
    PyObject *result = NULL, *list = NULL;
    if (specs_parse(typed, &specs) < 0 || scope_parse(scope_arg, &scope) < 0) goto done;
    if (scope_arg != NULL && scope_arg != Py_None) groups.scope = &scope;
    Py_BEGIN_ALLOW_THREADS
    if (buffered == NULL) {
        outcome = read_rows(path, after, until, NULL, NULL, &rows, &message, &check, NULL, &groups);
    } else {
        outcome = read_copy(buffered, NULL, NULL, &rows, &check, NULL, &groups);
    }
    Py_END_ALLOW_THREADS
    if (buffered != NULL && buffered->error != NULL && outcome == READ_OK) {
        PyErr_Format(PyExc_ValueError, "COPY data: %s", buffered->error);
        goto done;
    }
    if (raise_read_error(outcome, message)) goto done;
    if ((list = groups_list(&groups, &unsure)) == NULL) goto done;
    result = Py_BuildValue("(LO(iLLLs#)O)", (long long)rows, list, check.outcome, check.bad_seq, check.found_seq,
                           check.expected - 1, check.chain, (Py_ssize_t)check.chain_len, unsure ? Py_True : Py_False);
done:
    Py_XDECREF(list);
    groups_free(&groups);
    specs_free(&specs);
    scope_free(&scope);
    free(check.envelope.p);
    return result;
}

static PyObject *read_checked_by_kind(PyObject *self, PyObject *args) {
    (void)self;
    const char *path, *chain;
    Py_ssize_t chain_len;
    long long after, until, expected;
    unsigned int mask = ALL_COLUMNS;
    PyObject *typed = NULL, *scope = NULL;
    if (!PyArg_ParseTuple(args, "sLLLs#|IOO", &path, &after, &until, &expected, &chain, &chain_len, &mask, &typed,
                          &scope))
        return NULL;
    return checked_by_kind(path, after, until, NULL, expected, chain, chain_len, mask, typed, scope);
}

static PyObject *check_copy(PyObject *self, PyObject *args) {
    (void)self;
    const char *chain;
    Py_ssize_t chain_len;
    long long expected;
    unsigned int mask = ALL_COLUMNS;
    PyObject *data, *typed = NULL, *scope = NULL;
    if (!PyArg_ParseTuple(args, "OLs#|IOO", &data, &expected, &chain, &chain_len, &mask, &typed, &scope))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    Source src = {.st = NULL, .at = view.buf, .end = (const unsigned char *)view.buf + view.len};
    PyObject *result = checked_by_kind(NULL, 0, 0, &src, expected, chain, chain_len, mask, typed, scope);
    PyBuffer_Release(&view);
    return result;
}

typedef int (*GetCopyData)(void *conn, char **row, int async);
typedef void (*FreeMem)(void *p);

static PyObject *copy_out(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long get_at, free_at, conn_at;
    if (!PyArg_ParseTuple(args, "KKK", &get_at, &free_at, &conn_at)) return NULL;
    if (get_at == 0 || free_at == 0 || conn_at == 0) {
        PyErr_SetString(PyExc_ValueError, "copy_out needs PQgetCopyData, PQfreemem and a connection");
        return NULL;
    }
    GetCopyData get_copy_data = (GetCopyData)(uintptr_t)get_at;
    FreeMem free_mem = (FreeMem)(uintptr_t)free_at;
    void *conn = (void *)(uintptr_t)conn_at;
    Buffer data = {0};
    int status = -2, no_memory = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        char *row = NULL;
        status = get_copy_data(conn, &row, 0); /* blocking: 0 (nothing yet) is never returned */
        if (status <= 0) break;
        no_memory = put(&data, row, (size_t)status) < 0;
        free_mem(row);
        if (no_memory) break;
    }
    Py_END_ALLOW_THREADS
    if (no_memory) {
        free(data.p);
        return PyErr_NoMemory();
    }
    PyObject *memory = as_memory(&data);
    if (memory == NULL) {
        free(data.p);
        return NULL;
    }
    return Py_BuildValue("(Ni)", memory, status);
}

static PyObject *check_copy_rows(PyObject *self, PyObject *args) {
    (void)self;
    const char *chain;
    Py_ssize_t chain_len;
    long long expected;
    PyObject *data, *typed = NULL;
    if (!PyArg_ParseTuple(args, "OLs#|O", &data, &expected, &chain, &chain_len, &typed)) return NULL;
    if (chain_len != HEX_LEN && chain_len != 0) {
        PyErr_SetString(PyExc_ValueError, "previous chain must be 64 hex characters or empty");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    Source src = {.st = NULL, .at = view.buf, .end = (const unsigned char *)view.buf + view.len};
    Check check = {.expected = expected, .chain_len = (size_t)chain_len, .outcome = CHECK_OK};
    memcpy(check.chain, chain, (size_t)chain_len);
    Fields fields = {0};
    PyObject *result = read_any(NULL, 0, 0, &src, &check, &fields, typed);
    free(check.envelope.p);
    fields_free(&fields);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_range, METH_VARARGS,
     "read(path, after_seq, until_seq) -> (rows, seq_bytes, [(validity, nulls, offsets, data)] * 8)"},
    {"read_checked", read_checked, METH_VARARGS,
     "read_checked(path, after_seq, until_seq, expected_seq, previous_chain, typed=None)\n"
     "    -> (rows, seq_bytes, columns, (outcome, bad_seq, found_seq, last_good_seq, last_good_chain),\n"
     "        {kind: {key: type mask}} | None[, (groups, unsure) as read_checked_by_kind gives them, where\n"
     "        typed is given])"},
    {"read_checked_by_kind", read_checked_by_kind, METH_VARARGS,
     "read_checked_by_kind(path, after_seq, until_seq, expected_seq, previous_chain, columns=all, typed=None,\n"
     "                     scope=None)\n"
     "    -> (rows, [(kind, rows, seq_bytes, columns, typed_columns | None, (entries, entry_columns) | None)]\n"
     "        in order of first appearance (the text columns of the mask's bits, 1 << 0 = id ... 1 << 7 =\n"
     "        chain); typed: {kind: (columns, fields[, (field, ((name, label), ...))])}\n"
     "        (outcome, bad_seq, found_seq, last_good_seq, last_good_chain), unsure);\n"
     "    scope=(kinds, runs): rows of those kinds kept only where their run_id is null or one of runs"},
    {"check_copy_rows", check_copy_rows, METH_VARARGS,
     "check_copy_rows(data, expected_seq, previous_chain, typed=None)\n"
     "    -> what read_checked gives, for the rows of ``data`` (PostgreSQL's binary COPY, as check_copy)"},
    {"copy_out", copy_out, METH_VARARGS,
     "copy_out(get_copy_data, free_mem, conn) -> (data, status): a begun COPY TO STDOUT's rows, by that\n"
     "    libpq's PQgetCopyData (blocking, GIL released) and PQfreemem; status -1 done, -2 failed"},
    {"check_copy", check_copy, METH_VARARGS,
     "check_copy(data, expected_seq, previous_chain, columns=all, typed=None, scope=None)\n"
     "    -> what read_checked_by_kind gives, for the rows of ``data``, PostgreSQL's binary COPY of\n"
     "       (seq, id, ts, kind, run_id, block_id, data, digest, chain), instead of an SQLite file's"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_carrow",
    .m_doc = "Native read of an SQLite ledger's rows into Arrow buffers.", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__carrow(void) {
    init_escapes();
    if (PyType_Ready(&MemoryType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *names = PyTuple_New(8);
    if (names == NULL) goto fail;
    for (int i = 0; i < 8; i++) {
        PyObject *name = PyUnicode_FromString(TYPE_NAMES[i]);
        if (name == NULL) {
            Py_DECREF(names);
            goto fail;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    if (PyModule_AddObject(m, "TYPE_NAMES", names) < 0) {
        Py_DECREF(names);
        goto fail;
    }
    /* The typed fields' type codes, in order (read_checked_by_kind's ``typed``). */
    PyObject *field_types = Py_BuildValue("(ssssss)", "VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN", "JSON", "STRUCT");
    if (field_types == NULL) goto fail;
    if (PyModule_AddObject(m, "FIELD_TYPES", field_types) < 0) {
        Py_DECREF(field_types);
        goto fail;
    }
    /* read_checked_by_kind and check_copy take a scope (a build before them did not). */
    if (PyModule_AddIntConstant(m, "SCOPES", 1) < 0) goto fail;
    /* read_checked and check_copy_rows take a typed spec (a build before them did not). */
    if (PyModule_AddIntConstant(m, "TYPED_ROWS", 1) < 0) goto fail;
    /* A typed spec may name an object field's entries to unnest (a build before it could not). */
    if (PyModule_AddIntConstant(m, "ENTRIES", 1) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "OK", CHECK_OK) || PyModule_AddIntConstant(m, "DELETED", CHECK_DELETED)
        || PyModule_AddIntConstant(m, "EDITED", CHECK_EDITED)
        || PyModule_AddIntConstant(m, "RELINKED", CHECK_RELINKED))
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
