/* Native read of an SQLite ledger's rows into Arrow buffers (the snapshot's raw rows), and,
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
 *
 * read_checked_by_kind(path, after_seq, until_seq, expected_seq, previous_chain[, columns]) ->
 * (rows, [(kind, rows, seqs, columns)], check): the rows checked as read_checked checks them, each
 * kind's rows into buffers of their own (in seq order within the kind, kinds in the order
 * they first appear), so that a verified report derives each kind's table from the rows its
 * verification read, without a second read of the file or a sort and copy of the rows by kind.
 * ``columns``, a mask of the text columns to copy (bit 0 id ... bit 7 chain; default all), spares
 * the copies of what the caller never reads (every column is still checked).
 */
#define PY_SSIZE_T_CLEAN
/* OpenSSL's direct SHA256_* calls, as in _cverify.c (EVP costs about 30 ns more per hash). */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
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
static int check_row(Check *c, sqlite3_stmt *st) {
    if (c->outcome != CHECK_OK) return READ_OK;
    long long seq = sqlite3_column_int64(st, 0);
    if (seq != c->expected) {
        c->outcome = CHECK_DELETED;
        c->found_seq = seq;
        c->bad_seq = seq < c->expected ? seq : c->expected;
        return READ_OK;
    }
    char digest[HEX_LEN], chain[HEX_LEN];
    int built = envelope(&c->envelope, st);
    if (built == -2) return READ_NOMEM;
    if (built == 0) sha256_hex(c->envelope.p, c->envelope.len, NULL, 0, digest);
    if (built == -1 || !column_is(st, 7, digest)) {
        c->outcome = CHECK_EDITED;
        c->bad_seq = seq;
        return READ_OK;
    }
    sha256_hex(c->chain, c->chain_len, digest, HEX_LEN, chain);
    if (!column_is(st, 8, chain)) {
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

/* Past a number in canonical form, with its type as yyjson (DuckDB) reads it, or NULL. */
static const unsigned char *skip_number(const unsigned char *p, const unsigned char *end, unsigned *type) {
    int negative = *p == '-', real = 0;
    if (negative) p++;
    const unsigned char *digits = p;
    while (p < end && IS_DIGIT(*p)) p++;
    size_t count = (size_t)(p - digits);
    if (count == 0 || (count > 1 && *digits == '0')) return NULL;
    if (p < end && *p == '.') {
        real = 1;
        const unsigned char *d = ++p;
        while (p < end && IS_DIGIT(*p)) p++;
        if (p == d) return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        real = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const unsigned char *d = p;
        while (p < end && IS_DIGIT(*p)) p++;
        if (p == d) return NULL;
    }
    if (real) *type = T_DOUBLE;
    else if (count > 18 || (negative && *digits == '0')) return NULL; /* past 64 bits, or -0: DuckDB's */
    else *type = negative ? T_BIGINT : T_UBIGINT;
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

static int add_row(Buffer *seqs, Column *cols, sqlite3_stmt *st, int64_t row, unsigned mask) {
    if (reserve(seqs, 8) < 0) return READ_NOMEM;
    int64_t seq = sqlite3_column_int64(st, 0);
    memcpy(seqs->p + seqs->len, &seq, 8);
    seqs->len += 8;
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        if (!(mask & (1u << c))) continue;
        Column *col = &cols[c];
        if ((row & 7) == 0) {
            if (reserve(&col->validity, 1) < 0) return READ_NOMEM;
            col->validity.p[col->validity.len++] = 0;
        }
        size_t n = 0;
        if (sqlite3_column_type(st, c + 1) == SQLITE_NULL) {
            col->nulls++;
        } else {
            const unsigned char *text = sqlite3_column_text(st, c + 1);
            n = (size_t)sqlite3_column_bytes(st, c + 1);
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

/* ---- Rows grouped by kind (read_checked_by_kind). ---- */

/* One kind's rows, in seq order: its own seq buffer and text columns. */
typedef struct {
    unsigned char *kind; /* NULL for a row whose kind is null */
    size_t kind_len;
    Buffer seqs;
    Column cols[TEXT_COLUMNS];
    int64_t rows;
} Group;

typedef struct {
    Group *items;
    size_t used, cap, last; /* last: the group of the row before (kinds come in runs) */
} Groups;

static void groups_free(Groups *g) {
    for (size_t i = 0; i < g->used; i++) {
        Group *x = &g->items[i];
        free(x->kind);
        free(x->seqs.p);
        columns_free(x->cols);
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
static Group *group_of(Groups *g, sqlite3_stmt *st) {
    int is_null = sqlite3_column_type(st, 3) == SQLITE_NULL;
    const unsigned char *kind = is_null ? NULL : sqlite3_column_text(st, 3);
    size_t n = is_null ? 0 : (size_t)sqlite3_column_bytes(st, 3);
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
    g->last = g->used++;
    if (columns_start(x->cols) != READ_OK) return NULL;
    return x;
}

/* Into seqs and cols, or, where groups is given, into each kind's group. */
static int read_rows(const char *path, int64_t after, int64_t until, Buffer *seqs, Column *cols, int64_t *rows,
                     const char **sqlite_message, Check *check, Fields *fields, Groups *groups, unsigned mask) {
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int outcome = READ_OK;
    *sqlite_message = NULL;
    if (groups == NULL && columns_start(cols) != READ_OK) return READ_NOMEM;
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
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        /* Checked first: reading a column as text may convert it, and the check needs its type. */
        if (check != NULL && (outcome = check_row(check, st)) != READ_OK) goto done;
        if (groups != NULL) {
            Group *group = group_of(groups, st);
            if (group == NULL) {
                outcome = READ_NOMEM;
                goto done;
            }
            if ((outcome = add_row(&group->seqs, group->cols, st, group->rows, mask)) != READ_OK) goto done;
            group->rows++;
            row++;
            continue;
        }
        outcome = add_row(seqs, cols, st, row, ALL_COLUMNS);
        if (outcome != READ_OK) goto done;
        if (fields != NULL && !fields->unsure) {
            size_t kind_len = 0, data_len = 0;
            const unsigned char *kind = last_text(&cols[COL_KIND], row, &kind_len);
            const unsigned char *data = last_text(&cols[COL_DATA], row, &data_len);
            int scanned = kind == NULL || data == NULL ? 1 : scan_fields(fields, kind, kind_len, data, data_len);
            if (scanned < 0) {
                outcome = READ_NOMEM;
                goto done;
            }
            fields->unsure = scanned;
        }
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

static PyObject *read_any(const char *path, long long after, long long until, Check *check, Fields *fields) {
    Buffer seqs = {0};
    Column cols[TEXT_COLUMNS];
    memset(cols, 0, sizeof cols);
    int64_t rows = 0;
    const char *message = NULL;
    int outcome;
    Py_BEGIN_ALLOW_THREADS
    outcome = read_rows(path, after, until, &seqs, cols, &rows, &message, check, fields, NULL, ALL_COLUMNS);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL, *columns = NULL;
    if (raise_read_error(outcome, message)) goto done;
    columns = columns_list(cols, ALL_COLUMNS);
    if (columns == NULL) goto done;
    if (check == NULL) {
        result = Py_BuildValue("(LNO)", (long long)rows, as_memory(&seqs), columns);
    } else {
        PyObject *found = fields->unsure ? (Py_INCREF(Py_None), Py_None) : fields_dict(fields);
        if (found == NULL) goto done;
        result = Py_BuildValue("(LNO(iLLLs#)N)", (long long)rows, as_memory(&seqs), columns, check->outcome,
                               check->bad_seq, check->found_seq, check->expected - 1, check->chain,
                               (Py_ssize_t)check->chain_len, found);
    }
done:
    Py_XDECREF(columns);
    free(seqs.p);
    columns_free(cols);
    return result;
}

static PyObject *read_range(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    long long after, until;
    if (!PyArg_ParseTuple(args, "sLL", &path, &after, &until)) return NULL;
    return read_any(path, after, until, NULL, NULL);
}

static PyObject *read_checked(PyObject *self, PyObject *args) {
    (void)self;
    const char *path, *chain;
    Py_ssize_t chain_len;
    long long after, until, expected;
    if (!PyArg_ParseTuple(args, "sLLLs#", &path, &after, &until, &expected, &chain, &chain_len)) return NULL;
    if (chain_len != HEX_LEN && chain_len != 0) {
        PyErr_SetString(PyExc_ValueError, "previous chain must be 64 hex characters or empty");
        return NULL;
    }
    Check check = {.expected = expected, .chain_len = (size_t)chain_len, .outcome = CHECK_OK};
    memcpy(check.chain, chain, (size_t)chain_len);
    Fields fields = {0};
    PyObject *result = read_any(path, after, until, &check, &fields);
    free(check.envelope.p);
    fields_free(&fields);
    return result;
}

static PyObject *read_checked_by_kind(PyObject *self, PyObject *args) {
    (void)self;
    const char *path, *chain;
    Py_ssize_t chain_len;
    long long after, until, expected;
    unsigned int mask = ALL_COLUMNS;
    if (!PyArg_ParseTuple(args, "sLLLs#|I", &path, &after, &until, &expected, &chain, &chain_len, &mask))
        return NULL;
    if (chain_len != HEX_LEN && chain_len != 0) {
        PyErr_SetString(PyExc_ValueError, "previous chain must be 64 hex characters or empty");
        return NULL;
    }
    mask &= ALL_COLUMNS;
    Check check = {.expected = expected, .chain_len = (size_t)chain_len, .outcome = CHECK_OK};
    memcpy(check.chain, chain, (size_t)chain_len);
    Groups groups = {0};
    int64_t rows = 0;
    const char *message = NULL;
    int outcome;
    PyObject *result = NULL, *list = NULL;
    Py_BEGIN_ALLOW_THREADS
    outcome = read_rows(path, after, until, NULL, NULL, &rows, &message, &check, NULL, &groups, mask);
    Py_END_ALLOW_THREADS
    if (raise_read_error(outcome, message)) goto done;
    list = PyList_New((Py_ssize_t)groups.used);
    if (list == NULL) goto done;
    for (size_t i = 0; i < groups.used; i++) {
        Group *x = &groups.items[i];
        PyObject *kind = x->kind == NULL ? (Py_INCREF(Py_None), Py_None)
                                         : PyUnicode_DecodeUTF8((const char *)x->kind, (Py_ssize_t)x->kind_len,
                                                                "surrogateescape");
        PyObject *columns = kind == NULL ? NULL : columns_list(x->cols, mask);
        PyObject *item = columns == NULL ? NULL
                                         : Py_BuildValue("(NLNN)", kind, (long long)x->rows, as_memory(&x->seqs),
                                                         columns);
        if (item == NULL) {
            if (columns == NULL) Py_XDECREF(kind);
            goto done;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    result = Py_BuildValue("(LO(iLLLs#))", (long long)rows, list, check.outcome, check.bad_seq, check.found_seq,
                           check.expected - 1, check.chain, (Py_ssize_t)check.chain_len);
done:
    Py_XDECREF(list);
    groups_free(&groups);
    free(check.envelope.p);
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_range, METH_VARARGS,
     "read(path, after_seq, until_seq) -> (rows, seq_bytes, [(validity, nulls, offsets, data)] * 8)"},
    {"read_checked", read_checked, METH_VARARGS,
     "read_checked(path, after_seq, until_seq, expected_seq, previous_chain)\n"
     "    -> (rows, seq_bytes, columns, (outcome, bad_seq, found_seq, last_good_seq, last_good_chain),\n"
     "        {kind: {key: type mask}} | None)"},
    {"read_checked_by_kind", read_checked_by_kind, METH_VARARGS,
     "read_checked_by_kind(path, after_seq, until_seq, expected_seq, previous_chain, columns=all)\n"
     "    -> (rows, [(kind, rows, seq_bytes, columns)] in order of first appearance (the text\n"
     "        columns of the mask's bits, 1 << 0 = id ... 1 << 7 = chain),\n"
     "        (outcome, bad_seq, found_seq, last_good_seq, last_good_chain))"},
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
    if (PyModule_AddIntConstant(m, "OK", CHECK_OK) || PyModule_AddIntConstant(m, "DELETED", CHECK_DELETED)
        || PyModule_AddIntConstant(m, "EDITED", CHECK_EDITED)
        || PyModule_AddIntConstant(m, "RELINKED", CHECK_RELINKED))
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
