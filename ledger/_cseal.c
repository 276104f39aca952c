/* Native sealing for append: the same envelope, digest and chain as ledger/_events.seal and
 * ledger/_store's chaining, without a Python object per step.
 *
 * Why C: in Python a sealed event costs about 15-20 us (envelope regexes, vocabulary check,
 * orjson encode, the parse back for the recorded event, SHA-256, chain); the insert with the
 * ledger's indexes costs about 11. Here one pass over the data writes its canonical JSON
 * straight into the envelope buffer and copies the value for the recorded event (what the
 * parse back gave), so sealing drops to a few microseconds.
 *
 * The canonical form is orjson's with OPT_SORT_KEYS: keys sorted by their UTF-8 bytes, no
 * white space, strings escaped as ledger/_native.h does, integers in 64 bits, floats in the
 * shortest round-trip digits (Python's repr and orjson's Ryu agree on the digits; only the
 * layout differs, see put_float).
 *
 * Anything this path is not sure of (a subclass, a tuple, a non-string key, NaN, an integer
 * past 64 bits, deep nesting, a field the vocabulary refuses, an id or ts off its pattern) is
 * handed to the Python seal for that one event: it raises the same error or returns the same
 * result, so the Python path stays the reference and tests/ledger/test_seal_parity.py holds
 * the two byte for byte.
 *
 * On SQLite, insert() then chains the batch and steps the prepared INSERT on the handle of the
 * pool's own connection, inside the caller's BEGIN IMMEDIATE (see the section below).
 */
#define PY_SSIZE_T_CLEAN
/* OpenSSL's direct SHA256_* calls: deprecated in OpenSSL 3 for EVP, which adds about 30 ns
 * of provider dispatch per hash to the same SHA-NI code. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <openssl/sha.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "_native.h"

/* Nesting past this is left to orjson (which refuses it at 255). */
#define MAX_DEPTH 128

/* Result of a fast step: done, or hand this event to the Python seal. */
enum { FAST_OK = 0, FAST_FALLBACK = 1, FAST_ERROR = -1 };

/* Set by configure(): the types built, the Python seal, the vocabulary and field names. */
static PyObject *SealedType, *EventType, *python_seal, *parse_json, *vocabulary;
static PyObject *name_kind, *name_data, *name_run_id, *name_block_id, *name_id, *name_ts;
static PyObject *event_fields[9]; /* seq id ts kind run_id block_id data digest chain */
static PyObject *NO_ARGS;         /* () */
static int sha256_hex(const void *data, size_t n, char *out) {
    unsigned char md[32];
    SHA256_CTX ctx;
    if (!SHA256_Init(&ctx) || !SHA256_Update(&ctx, data, n) || !SHA256_Final(md, &ctx)) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL: SHA-256 failed");
        return -1;
    }
    to_hex(md, out);
    return 0;
}

/* -- canonical JSON of the data, with a copy of it ------------------------------------- */

/* Decimal digits of ``value`` ending at ``end``; returns where they start. */
static char *format_unsigned(unsigned long long value, char *end) {
    do {
        *--end = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    return end;
}

static int put_int(Buffer *b, PyObject *v) {
    int overflow = 0;
    char text[24], *end = text + sizeof text, *start;
    long long signed_value = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (signed_value == -1 && PyErr_Occurred()) return FAST_ERROR;
    if (overflow == 0) {
        unsigned long long magnitude = signed_value < 0 ? 0ULL - (unsigned long long)signed_value
                                                        : (unsigned long long)signed_value;
        start = format_unsigned(magnitude, end);
        if (signed_value < 0) *--start = '-';
    } else if (overflow > 0) {
        /* orjson takes up to 2**64 - 1; past that it refuses (the Python path names it). */
        unsigned long long unsigned_value = PyLong_AsUnsignedLongLong(v);
        if (unsigned_value == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return FAST_FALLBACK;
        }
        start = format_unsigned(unsigned_value, end);
    } else {
        return FAST_FALLBACK;
    }
    return put(b, start, (size_t)(end - start)) ? FAST_ERROR : FAST_OK;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
                               1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17};

/* The shortest round-trip text of ``value`` without dtoa, for the common case of a
 * magnitude in [1e-4, 1e15) with few decimals (a measurement rounded to some places);
 * 0 when the case does not apply (then Python's repr serves).
 *
 * The fewest decimals k such that some integer m has m / 10**k == value (IEEE division
 * is correctly rounded, as parsing is) give the shortest digits; the candidate nearest
 * value * 10**k is checked with its neighbours, so a rounding in that product cannot
 * skip one. While 10**-k exceeds the value's ulp, the interval that rounds to the value
 * holds at most one candidate of k decimals, so it is also the closest one, as repr's. */
static size_t short_float(double value, char *out) {
    double magnitude = fabs(value);
    if (!(magnitude >= 1e-4 && magnitude < 1e15)) return 0;
    double ulp = nextafter(magnitude, INFINITY) - magnitude;
    for (int k = 0; k < (int)(sizeof POW10 / sizeof POW10[0]); k++) {
        double scale = POW10[k];
        if (!(ulp * scale < 1.0)) return 0;
        double scaled = magnitude * scale;
        if (scaled >= 9007199254740992.0) return 0; /* 2**53: m must be exact */
        double nearest_value = nearbyint(scaled), off = fabs(scaled - nearest_value);
        /* An m with m / scale == value lies within bound of scaled: half the value's ulp
         * scaled, plus scaled's own rounding (at most scaled * 2**-53); doubled for the
         * rounding of this arithmetic. A k whose candidates are all farther is skipped
         * without dividing (most are: the fraction of scaled is then about random). */
        double bound = 2.0 * (0.5 * ulp * scale + scaled * 0x1p-53) + 0x1p-1000;
        if (off > bound && 1.0 - off > bound) continue;
        long long nearest = (long long)nearest_value;
        for (long long m = nearest - 1; m <= nearest + 1; m++) {
            if (m <= 0 || (double)m / scale != magnitude) continue;
            char digits[24], *end = digits + sizeof digits;
            char *start = format_unsigned((unsigned long long)m, end);
            size_t count = (size_t)(end - start), n = 0;
            if (value < 0) out[n++] = '-';
            if (k == 0) {
                memcpy(out + n, start, count);
                n += count;
                memcpy(out + n, ".0", 2);
                return n + 2;
            }
            if (count <= (size_t)k) { /* 0.000ddd */
                out[n++] = '0';
                out[n++] = '.';
                memset(out + n, '0', (size_t)k - count);
                n += (size_t)k - count;
                memcpy(out + n, start, count);
                return n + count;
            }
            memcpy(out + n, start, count - (size_t)k);
            n += count - (size_t)k;
            out[n++] = '.';
            memcpy(out + n, end - k, (size_t)k);
            return n + (size_t)k;
        }
    }
    return 0;
}

/* Python's repr digits in orjson's layout: orjson writes exponent -5 as a plain decimal
 * (0.00001 where repr says 1e-05) and negative exponents without a leading zero (1e-7). */
static int put_float(Buffer *b, PyObject *v) {
    double value = PyFloat_AS_DOUBLE(v);
    if (!isfinite(value)) return FAST_FALLBACK; /* the Python path names the field */
    char quick[48];
    size_t quick_len = short_float(value, quick);
    if (quick_len) return put(b, quick, quick_len) ? FAST_ERROR : FAST_OK;
    char *text = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) return FAST_ERROR;
    int rc = 0;
    char *e = strchr(text, 'e');
    if (e == NULL) {
        rc = put(b, text, strlen(text));
    } else if (e[1] == '-' && e[2] == '0' && e[3] == '5' && e[4] == '\0') {
        const char *s = text;
        if (*s == '-') rc |= PUT_LITERAL(b, "-"), s++;
        rc |= PUT_LITERAL(b, "0.0000");
        for (; s < e; s++)
            if (*s != '.') rc |= put(b, s, 1);
    } else if (e[1] == '-' && e[2] == '0') {
        rc = put(b, text, (size_t)(e - text)) || PUT_LITERAL(b, "e-") || put(b, e + 3, strlen(e + 3));
    } else {
        rc = put(b, text, strlen(text));
    }
    PyMem_Free(text);
    return rc ? FAST_ERROR : FAST_OK;
}

typedef struct {
    PyObject *key, *value;
    const char *utf8;
    Py_ssize_t len, index;
} Item;

static int compare_items(const void *a, const void *b) {
    const Item *x = a, *y = b;
    Py_ssize_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->utf8, y->utf8, (size_t)n);
    if (c) return c;
    return (x->len > y->len) - (x->len < y->len);
}

/* The last top-level key set seen, sorted: a producer's events of one kind come with the
 * same key objects (the literals of its code) in the same order, so the next one reuses the
 * order and the keys' JSON text instead of sorting and escaping again. The keys are held,
 * so a key matched by identity is that very string. */
#define SHAPE_MAX 32
static struct {
    Py_ssize_t n;
    PyObject *keys[SHAPE_MAX];         /* in insertion order */
    Py_ssize_t order[SHAPE_MAX];       /* the insertion index of each key, in sorted order */
    size_t text_end[SHAPE_MAX];        /* where each sorted key's `"key":` ends in text */
    Buffer text;
} shape;

static int shape_matches(const Item *items, Py_ssize_t n) {
    if (n != shape.n) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i].key != shape.keys[i]) return 0;
    return 1;
}

/* Remember ``items`` (sorted; their index is the insertion order); on failure the cache is
 * left empty, which only costs speed. */
static void shape_store(const Item *items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < shape.n; i++) Py_CLEAR(shape.keys[i]);
    shape.n = 0;
    shape.text.len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Text key_text = {(const unsigned char *)items[i].utf8, (size_t)items[i].len, 0};
        if (put_string(&shape.text, &key_text) || PUT_LITERAL(&shape.text, ":")) return;
        shape.text_end[i] = shape.text.len;
        shape.order[i] = items[i].index;
    }
    for (Py_ssize_t i = 0; i < n; i++) shape.keys[items[i].index] = Py_NewRef(items[i].key);
    shape.n = n;
}

static int encode(Buffer *b, PyObject *v, int depth, PyObject **copy);

static int encode_dict(Buffer *b, PyObject *v, int depth, PyObject **copy) {
    Py_ssize_t n = PyDict_GET_SIZE(v), pos = 0, i = 0;
    Item small[SHAPE_MAX];
    Item *items = n <= SHAPE_MAX ? small : PyMem_Malloc(sizeof(Item) * (size_t)n);
    if (items == NULL) return PyErr_NoMemory(), FAST_ERROR;
    int rc = FAST_OK;
    PyObject *key, *value;
    while (PyDict_Next(v, &pos, &key, &value)) {
        items[i].key = key;
        items[i].value = value;
        items[i].index = i;
        i++;
    }
    int cached = depth == 0 && shape_matches(items, n);
    if (!cached) {
        for (i = 0; i < n; i++) {
            if (!PyUnicode_CheckExact(items[i].key)) {
                rc = FAST_FALLBACK;
                goto done;
            }
            items[i].utf8 = PyUnicode_AsUTF8AndSize(items[i].key, &items[i].len);
            if (items[i].utf8 == NULL) { /* a lone surrogate: orjson refuses it */
                PyErr_Clear();
                rc = FAST_FALLBACK;
                goto done;
            }
        }
        /* Insertion sort for the usual small object (often nearly sorted already), qsort past that. */
        if (n > SHAPE_MAX) qsort(items, (size_t)n, sizeof(Item), compare_items);
        for (Py_ssize_t j = 1; j < n && n <= SHAPE_MAX; j++) {
            Item moving = items[j];
            Py_ssize_t k = j;
            while (k > 0 && compare_items(&items[k - 1], &moving) > 0) {
                items[k] = items[k - 1];
                k--;
            }
            items[k] = moving;
        }
        if (depth == 0 && n <= SHAPE_MAX) shape_store(items, n);
    }
    /* Sized once for all its keys, as orjson.loads would build it; no resize on the way.
     * Without ``copy`` (no recorded Event will hold it) only the text is written. */
    PyObject *out = NULL;
    if (copy != NULL && (out = _PyDict_NewPresized(n)) == NULL) {
        rc = FAST_ERROR;
        goto done;
    }
    if (PUT_LITERAL(b, "{")) rc = FAST_ERROR;
    for (i = 0; i < n && rc == FAST_OK; i++) {
        PyObject *item_copy = NULL;
        Item *item;
        if (cached) {
            item = &items[shape.order[i]];
            size_t start = i ? shape.text_end[i - 1] : 0;
            if ((i && PUT_LITERAL(b, ",")) || put(b, shape.text.p + start, shape.text_end[i] - start)) {
                rc = FAST_ERROR;
                break;
            }
        } else {
            item = &items[i];
            Text key_text = {(const unsigned char *)item->utf8, (size_t)item->len, 0};
            if ((i && PUT_LITERAL(b, ",")) || put_string(b, &key_text) || PUT_LITERAL(b, ":")) {
                rc = FAST_ERROR;
                break;
            }
        }
        rc = encode(b, item->value, depth + 1, out ? &item_copy : NULL);
        if (rc == FAST_OK && out != NULL) {
            if (PyDict_SetItem(out, item->key, item_copy) < 0) rc = FAST_ERROR;
            Py_DECREF(item_copy);
        }
    }
    if (rc == FAST_OK && PUT_LITERAL(b, "}")) rc = FAST_ERROR;
    if (rc == FAST_OK && copy != NULL)
        *copy = out;
    else
        Py_XDECREF(out);
done:
    if (items != small) PyMem_Free(items);
    return rc;
}

static int encode_list(Buffer *b, PyObject *v, int depth, PyObject **copy) {
    Py_ssize_t n = PyList_GET_SIZE(v);
    PyObject *out = copy != NULL ? PyList_New(n) : NULL;
    if ((copy != NULL && out == NULL) || PUT_LITERAL(b, "[")) {
        Py_XDECREF(out);
        return FAST_ERROR;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item_copy = NULL;
        /* The list cannot change under us: no Python code runs while encoding. */
        int rc = (i && PUT_LITERAL(b, ",")) ? FAST_ERROR
                                            : encode(b, PyList_GET_ITEM(v, i), depth + 1, out ? &item_copy : NULL);
        if (rc != FAST_OK) {
            Py_XDECREF(out);
            return rc;
        }
        if (out != NULL) PyList_SET_ITEM(out, i, item_copy);
    }
    if (PUT_LITERAL(b, "]")) {
        Py_XDECREF(out);
        return FAST_ERROR;
    }
    if (copy != NULL) *copy = out;
    return FAST_OK;
}

/* Append the canonical JSON of ``v``; ``*copy`` gets what orjson.loads would give back
 * (new containers, the same immutable scalars); a NULL ``copy`` asks for the text alone. */
static int encode(Buffer *b, PyObject *v, int depth, PyObject **copy) {
    int rc;
    if (depth > MAX_DEPTH) return FAST_FALLBACK;
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &n);
        if (utf8 == NULL) {
            PyErr_Clear();
            return FAST_FALLBACK;
        }
        Text text = {(const unsigned char *)utf8, (size_t)n, 0};
        rc = put_string(b, &text) ? FAST_ERROR : FAST_OK;
    } else if (type == &PyLong_Type) {
        rc = put_int(b, v);
    } else if (type == &PyFloat_Type) {
        rc = put_float(b, v);
    } else if (v == Py_None) {
        rc = PUT_LITERAL(b, "null") ? FAST_ERROR : FAST_OK;
    } else if (v == Py_True) {
        rc = PUT_LITERAL(b, "true") ? FAST_ERROR : FAST_OK;
    } else if (v == Py_False) {
        rc = PUT_LITERAL(b, "false") ? FAST_ERROR : FAST_OK;
    } else if (type == &PyDict_Type) {
        return encode_dict(b, v, depth, copy);
    } else if (type == &PyList_Type) {
        return encode_list(b, v, depth, copy);
    } else {
        return FAST_FALLBACK; /* tuples, subclasses, other types: orjson's rules, via Python */
    }
    if (rc == FAST_OK && copy != NULL) *copy = Py_NewRef(v);
    return rc;
}

/* -- the envelope and the vocabulary --------------------------------------------------- */

/* Byte classes for the id and ts shapes: a pattern position accepts the classes in its mask.
 * ASCII only; a Unicode digit that Python's \d accepts goes to the Python path. */
enum { C_HEX = 1, C_DIGIT = 2, C_DASH = 4, C_T = 8, C_COLON = 16, C_DOT = 32, C_Z = 64 };
static unsigned char BYTE_CLASS[256];

static void init_classes(void) {
    for (int c = '0'; c <= '9'; c++) BYTE_CLASS[c] = C_HEX | C_DIGIT;
    for (int c = 'a'; c <= 'f'; c++) BYTE_CLASS[c] = C_HEX;
    BYTE_CLASS['-'] = C_DASH;
    BYTE_CLASS['T'] = C_T;
    BYTE_CLASS[':'] = C_COLON;
    BYTE_CLASS['.'] = C_DOT;
    BYTE_CLASS['Z'] = C_Z;
}

#define X C_HEX
#define D C_DIGIT
static const unsigned char UUID_SHAPE[36] = {X, X, X, X, X, X, X, X, C_DASH, X, X, X, X, C_DASH, X, X, X, X,
                                             C_DASH, X, X, X, X, C_DASH, X, X, X, X, X, X, X, X, X, X, X, X};
static const unsigned char TS_SHAPE[27] = {D, D, D, D, C_DASH, D, D, C_DASH, D, D, C_T, D, D, C_COLON,
                                           D, D, C_COLON, D, D, C_DOT, D, D, D, D, D, D, C_Z};
#undef X
#undef D

static int matches(PyObject *v, const unsigned char *shape, Py_ssize_t length) {
    if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_ASCII(v) || PyUnicode_GET_LENGTH(v) != length) return 0;
    const unsigned char *s = PyUnicode_1BYTE_DATA(v);
    unsigned char miss = 0;
    for (Py_ssize_t i = 0; i < length; i++) miss |= (unsigned char)!(BYTE_CLASS[s[i]] & shape[i]);
    return !miss;
}

static int optional_name(PyObject *v) {
    if (v == Py_None) return 1;
    if (!PyUnicode_CheckExact(v) || PyUnicode_GET_LENGTH(v) == 0) return 0;
    if (PyUnicode_IS_ASCII(v)) return 1;
    /* A name with no UTF-8 form (a lone surrogate) goes to Python's seal, which names the field.
     * The UTF-8 made here is kept in the string, for put_optional_name. */
    if (PyUnicode_AsUTF8AndSize(v, NULL) != NULL) return 1;
    PyErr_Clear();
    return 0;
}

/* ``value`` is in a frozenset; an unhashable value is left to the Python path. */
static int member(PyObject *set, PyObject *value) {
    int found = PySet_Contains(set, value);
    if (found < 0) PyErr_Clear();
    return found > 0;
}

/* 1: the vocabulary accepts ``data`` for ``kind`` on the fast reading; 0: ask Python; -1: error.
 * The spec is ledger/_vocabulary.native_spec(): (fields, optional_enums, one_of), each field
 * (name, exact types, allowed values or None). */
static int vocabulary_accepts(PyObject *kind, PyObject *data) {
    PyObject *spec = PyDict_GetItemWithError(vocabulary, kind);
    if (spec == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *fields = PyTuple_GET_ITEM(spec, 0), *optional = PyTuple_GET_ITEM(spec, 1),
             *one_of = PyTuple_GET_ITEM(spec, 2);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        PyObject *value = PyDict_GetItemWithError(data, PyTuple_GET_ITEM(field, 0));
        if (value == NULL) return PyErr_Occurred() ? -1 : 0;
        int ok = member(PyTuple_GET_ITEM(field, 1), (PyObject *)Py_TYPE(value));
        if (ok <= 0) return ok;
        PyObject *allowed = PyTuple_GET_ITEM(field, 2);
        if (allowed != Py_None && (ok = member(allowed, value)) <= 0) return ok;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(optional); i++) {
        PyObject *pair = PyTuple_GET_ITEM(optional, i);
        PyObject *value = PyDict_GetItemWithError(data, PyTuple_GET_ITEM(pair, 0));
        if (value == NULL && PyErr_Occurred()) return -1;
        if (value == NULL || value == Py_None) continue;
        int ok = member(PyTuple_GET_ITEM(pair, 1), value);
        if (ok <= 0) return ok;
    }
    if (PyTuple_GET_SIZE(one_of) == 0) return 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(one_of); i++) {
        PyObject *value = PyDict_GetItemWithError(data, PyTuple_GET_ITEM(one_of, i));
        if (value == NULL && PyErr_Occurred()) return -1;
        if (value != NULL && value != Py_None) return 1;
    }
    return 0;
}

static int put_optional_name(Buffer *b, PyObject *v) {
    if (v == Py_None) return PUT_LITERAL(b, "null");
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(v, &n);
    if (utf8 == NULL) return -1;
    Text text = {(const unsigned char *)utf8, (size_t)n, 0};
    return put_string(b, &text);
}

static int put_ascii(Buffer *b, PyObject *v) {
    return put(b, PyUnicode_1BYTE_DATA(v), (size_t)PyUnicode_GET_LENGTH(v));
}

/* A Sealed named tuple from its eight fields (steals the references): allocated as
 * tuple.__new__(Sealed, fields) allocates it (the named tuple has no __dict__), less the
 * two tuples on the way. */
static PyObject *make_sealed(PyObject **fields) {
    PyObject *sealed = ((PyTypeObject *)SealedType)->tp_alloc((PyTypeObject *)SealedType, 8);
    if (sealed == NULL) {
        for (int i = 0; i < 8; i++) Py_DECREF(fields[i]);
        return NULL;
    }
    int tracked_value = 0;
    for (int i = 0; i < 8; i++) {
        PyTuple_SET_ITEM(sealed, i, fields[i]);
        tracked_value |= PyObject_IS_GC(fields[i]) && PyObject_GC_IsTracked(fields[i]);
    }
    /* Strings, None and a flat copy: no cycle can pass through it, so the collector need not
     * visit it (as it would itself conclude for a plain tuple). */
    if (!tracked_value) PyObject_GC_UnTrack(sealed);
    return sealed;
}

static PyObject *get(PyObject *event, PyObject *name) { return PyObject_GetAttr(event, name); }

/* One event on the fast path: a Sealed, Py_None to ask Python, or NULL on an error. Without
 * ``parsed`` the Sealed carries None for the data (no recorded Event will be built from it). */
static PyObject *seal_fast(Buffer *b, PyObject *event, int parsed) {
    PyObject *id = get(event, name_id), *ts = get(event, name_ts), *kind = get(event, name_kind),
             *run_id = get(event, name_run_id), *block_id = get(event, name_block_id),
             *data = get(event, name_data), *copy = NULL, *result = NULL;
    if (!id || !ts || !kind || !run_id || !block_id || !data) goto done;
    if (!matches(id, UUID_SHAPE, 36) || !matches(ts, TS_SHAPE, 27) || !optional_name(run_id)
        || !optional_name(block_id) || !PyDict_CheckExact(data) || !PyUnicode_CheckExact(kind)
        || !PyUnicode_IS_ASCII(kind)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    int accepted = vocabulary_accepts(kind, data);
    if (accepted <= 0) {
        if (accepted == 0) result = Py_NewRef(Py_None);
        goto done;
    }
    b->len = 0;
    if (PUT_LITERAL(b, "{\"block_id\":") || put_optional_name(b, block_id) || PUT_LITERAL(b, ",\"data\":")) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    size_t data_start = b->len;
    int rc = encode(b, data, 0, parsed ? &copy : NULL);
    if (rc != FAST_OK) {
        if (rc == FAST_FALLBACK) result = Py_NewRef(Py_None);
        else if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    size_t data_end = b->len;
    if (PUT_LITERAL(b, ",\"id\":\"") || put_ascii(b, id) || PUT_LITERAL(b, "\",\"kind\":\"")
        || put_ascii(b, kind) || PUT_LITERAL(b, "\",\"run_id\":") || put_optional_name(b, run_id)
        || PUT_LITERAL(b, ",\"ts\":\"") || put_ascii(b, ts) || PUT_LITERAL(b, "\"}")) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    char digest[HEX_LEN];
    if (sha256_hex(b->p, b->len, digest) < 0) goto done;
    PyObject *data_json = PyUnicode_DecodeUTF8((const char *)b->p + data_start, (Py_ssize_t)(data_end - data_start), NULL);
    if (data_json == NULL) goto done;
    PyObject *digest_text = PyUnicode_FromStringAndSize(digest, HEX_LEN);
    if (digest_text == NULL) {
        Py_DECREF(data_json);
        goto done;
    }
    if (copy == NULL) copy = Py_NewRef(Py_None);
    PyObject *fields[8] = {id, ts, kind, run_id, block_id, data_json, digest_text, copy};
    id = ts = kind = run_id = block_id = copy = NULL; /* make_sealed takes them */
    result = make_sealed(fields);
done:
    Py_XDECREF(id);
    Py_XDECREF(ts);
    Py_XDECREF(kind);
    Py_XDECREF(run_id);
    Py_XDECREF(block_id);
    Py_XDECREF(data);
    Py_XDECREF(copy);
    return result;
}

static int configured(void) {
    if (SealedType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ledger._cseal is not configured (ledger._events does that)");
        return 0;
    }
    return 1;
}

static PyObject *seal_many(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"events", "parsed", NULL};
    PyObject *events;
    int parsed = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p:seal_many", keywords, &events, &parsed)) return NULL;
    if (!configured()) return NULL;
    PyObject *sequence = PySequence_Fast(events, "events must be a sequence");
    if (sequence == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
    PyObject *out = PyList_New(n);
    Buffer b = {NULL, 0, 0};
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *event = PySequence_Fast_GET_ITEM(sequence, i);
        PyObject *sealed = seal_fast(&b, event, parsed);
        if (sealed == Py_None) {
            Py_DECREF(sealed);
            sealed = PyObject_CallOneArg(python_seal, event);
        }
        if (sealed == NULL) goto fail;
        PyList_SET_ITEM(out, i, sealed);
    }
    free(b.p);
    Py_DECREF(sequence);
    return out;
fail:
    free(b.p);
    Py_XDECREF(out);
    Py_DECREF(sequence);
    return NULL;
}

/* -- the chain, the rows and the recorded events --------------------------------------- */

/* An Event with its fields stored as object.__setattr__ would (the frozen dataclass's own
 * __setattr__ refuses), in field order: the instance keeps them in its inline values with
 * the type's shared keys, without a dict of its own; the same object as
 * ledger/_events.recorded builds. */
static PyObject *make_event(PyObject **values) {
    /* object.__new__(Event): the allocation that also sets up the inline values. */
    PyObject *event = PyBaseObject_Type.tp_new((PyTypeObject *)EventType, NO_ARGS, NULL);
    if (event == NULL) return NULL;
    for (int i = 0; i < 9; i++) {
        if (PyObject_GenericSetAttr(event, event_fields[i], values[i]) < 0) {
            Py_DECREF(event);
            return NULL;
        }
    }
    return event;
}

/* A Sealed's data as an object (a new reference): the one it carries, else its canonical text
 * parsed; NULL with an exception set on failure. */
static PyObject *sealed_data(PyObject *s) {
    PyObject *data = PyTuple_GET_ITEM(s, 7);
    return data == Py_None ? PyObject_CallOneArg(parse_json, PyTuple_GET_ITEM(s, 5)) : Py_NewRef(data);
}

/* The nine fields of the stored Event of Sealed ``s`` (borrowed references). */
static void stored_values(PyObject *s, PyObject *seq, PyObject *data, PyObject *chain, PyObject **values) {
    values[0] = seq;
    for (int k = 0; k < 5; k++) values[k + 1] = PyTuple_GET_ITEM(s, k);
    values[6] = data;
    values[7] = PyTuple_GET_ITEM(s, 6);
    values[8] = chain;
}

static PyObject *link_rows(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *sealed_list;
    long long seq;
    const char *chain_in;
    Py_ssize_t chain_len;
    int with_events = 1;
    if (!PyArg_ParseTuple(args, "O!Ls#|p", &PyList_Type, &sealed_list, &seq, &chain_in, &chain_len, &with_events))
        return NULL;
    if (!configured()) return NULL;
    if (chain_len != HEX_LEN) {
        PyErr_SetString(PyExc_ValueError, "the previous chain must be 64 hex characters");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(sealed_list);
    PyObject *rows = PyList_New(n), *events = with_events ? PyList_New(n) : Py_NewRef(Py_None), *chain_text = NULL;
    Buffer link_text = {NULL, 0, 0};
    char chain[HEX_LEN];
    memcpy(chain, chain_in, HEX_LEN);
    if (rows == NULL || events == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyList_GET_ITEM(sealed_list, i);
        if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != 8) {
            PyErr_SetString(PyExc_TypeError, "link() takes a list of Sealed");
            goto fail;
        }
        Py_ssize_t digest_len;
        const char *digest = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(s, 6), &digest_len);
        if (digest == NULL) goto fail;
        link_text.len = 0;
        if (put(&link_text, chain, HEX_LEN) || put(&link_text, digest, (size_t)digest_len)) {
            PyErr_NoMemory();
            goto fail;
        }
        if (sha256_hex(link_text.p, link_text.len, chain) < 0) goto fail;
        seq++;
        PyObject *seq_value = PyLong_FromLongLong(seq);
        chain_text = PyUnicode_FromStringAndSize(chain, HEX_LEN);
        PyObject *data = with_events ? sealed_data(s) : Py_NewRef(Py_None);
        if (seq_value == NULL || chain_text == NULL || data == NULL) {
            Py_XDECREF(seq_value);
            Py_XDECREF(data);
            goto fail;
        }
        PyObject *values[9];
        stored_values(s, seq_value, data, chain_text, values);
        PyObject *event = with_events ? make_event(values) : Py_NewRef(Py_None);
        values[6] = PyTuple_GET_ITEM(s, 5); /* the row holds the data's canonical text */
        PyObject *row = PyTuple_New(9);
        if (event == NULL || row == NULL) {
            Py_XDECREF(event);
            Py_XDECREF(row);
            Py_DECREF(seq_value);
            Py_DECREF(data);
            goto fail;
        }
        for (int k = 0; k < 9; k++) PyTuple_SET_ITEM(row, k, Py_NewRef(values[k]));
        PyObject_GC_UnTrack(row); /* strings, ints and None only: no cycle for the collector to find */
        Py_DECREF(seq_value);
        Py_DECREF(data);
        Py_CLEAR(chain_text);
        PyList_SET_ITEM(rows, i, row);
        if (with_events)
            PyList_SET_ITEM(events, i, event);
        else
            Py_DECREF(event);
    }
    free(link_text.p);
    link_text.p = NULL;
    chain_text = PyUnicode_FromStringAndSize(chain, HEX_LEN);
    if (chain_text == NULL) goto fail;
    return Py_BuildValue("NNN", rows, events, chain_text);
fail:
    free(link_text.p);
    Py_XDECREF(chain_text);
    Py_XDECREF(rows);
    Py_XDECREF(events);
    return NULL;
}

/* -- the insert into SQLite, on the connection the ledger's pool gave ------------------
 *
 * Why: through Python's sqlite3 ``executemany`` each row is a tuple of nine objects, bound
 * one by one with copies (SQLITE_TRANSIENT) and stepped with the GIL passed back and forth.
 * Here the batch is chained, bound without copies and stepped in one pass with the GIL
 * released, on the very sqlite3 handle of the pool's connection: same transaction (the
 * caller's BEGIN IMMEDIATE), same lock, same commit, so nothing about concurrency,
 * idempotency or a killed process changes. The rows as Python tuples are never built.
 *
 * The handle is the first field after the object header of CPython's sqlite3.Connection
 * (Modules/_sqlite/connection.h, 3.11 to 3.13). It is used only where configure_sqlite()
 * found that Python's sqlite3 module and this one call the same SQLite library (one copy of
 * the code, so one meaning of the handle) and read a probe connection's handle back right;
 * elsewhere the ledger inserts through executemany. */

typedef struct {
    PyObject_HEAD
    sqlite3 *db;
} ConnectionHead;

static PyObject *ConnectionType, *IntegrityError, *OperationalError;

static const char INSERT_SQL[] =
    "INSERT INTO events (seq, id, ts, kind, run_id, block_id, data, digest, chain) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/* configure_sqlite(Connection, IntegrityError, OperationalError, sqlite3_module_path, probe)
 * -> bool: whether insert() may be used. ``probe`` is a connection of Python's sqlite3 that
 * has made exactly three changes. */
static PyObject *configure_sqlite(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *connection_type, *integrity, *operational, *probe;
    const char *module_path;
    if (!PyArg_ParseTuple(args, "O!OOsO", &PyType_Type, &connection_type, &integrity, &operational,
                          &module_path, &probe))
        return NULL;
#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
    (void)probe;
    Py_RETURN_FALSE; /* a layout this file was not written against */
#else
    /* The sqlite3_step that Python's module calls (its own library or a copy linked into it). */
    void *module = dlopen(module_path, RTLD_LAZY | RTLD_NOLOAD);
    if (module == NULL) Py_RETURN_FALSE;
    void *theirs = dlsym(module, "sqlite3_step");
    dlclose(module);
    if (theirs == NULL || theirs != (void *)&sqlite3_step) Py_RETURN_FALSE;
    if (!Py_IS_TYPE(probe, (PyTypeObject *)connection_type)) Py_RETURN_FALSE;
    sqlite3 *db = ((ConnectionHead *)probe)->db;
    if (db == NULL || sqlite3_total_changes(db) != 3) Py_RETURN_FALSE;
    Py_XSETREF(ConnectionType, Py_NewRef(connection_type));
    Py_XSETREF(IntegrityError, Py_NewRef(integrity));
    Py_XSETREF(OperationalError, Py_NewRef(operational));
    Py_RETURN_TRUE;
#endif
}

/* What one row binds: seven texts (id ts kind run_id block_id data digest; NULL for None)
 * and the chain computed before the step. */
typedef struct {
    const char *text[7];
    Py_ssize_t len[7];
    char chain[HEX_LEN];
} RowText;

static int step_rows(sqlite3 *db, RowText *rows, Py_ssize_t n, long long seq, char *chain,
                     int *rc_out, char *message, size_t message_size) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, INSERT_SQL, -1, &st, NULL);
    for (Py_ssize_t i = 0; i < n && rc == SQLITE_OK; i++) {
        RowText *r = &rows[i];
        unsigned char md[32];
        SHA256_CTX ctx;
        /* next_chain: SHA-256 of the previous chain's hex and the digest's, as text. */
        if (!SHA256_Init(&ctx) || !SHA256_Update(&ctx, chain, HEX_LEN)
            || !SHA256_Update(&ctx, r->text[6], (size_t)r->len[6]) || !SHA256_Final(md, &ctx)) {
            rc = -1;
            break;
        }
        to_hex(md, chain);
        memcpy(r->chain, chain, HEX_LEN);
        sqlite3_bind_int64(st, 1, seq + 1 + i);
        /* Bindings outlive a reset: a value the row before bound already (the same string,
         * as kind and run_id mostly are) is left bound. */
        const RowText *before = i ? &rows[i - 1] : NULL;
        for (int k = 0; k < 7 && rc == SQLITE_OK; k++) {
            if (before && before->text[k] == r->text[k] && before->len[k] == r->len[k]) continue;
            rc = r->text[k] == NULL ? sqlite3_bind_null(st, k + 2)
                                    : sqlite3_bind_text(st, k + 2, r->text[k], (int)r->len[k], SQLITE_STATIC);
        }
        if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 9, r->chain, HEX_LEN, SQLITE_STATIC);
        if (rc != SQLITE_OK) break;
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) rc = sqlite3_reset(st);
    }
    if (rc > 0 && rc != SQLITE_OK) {
        *rc_out = sqlite3_extended_errcode(db);
        snprintf(message, message_size, "%s", sqlite3_errmsg(db));
    }
    sqlite3_finalize(st);
    return rc == SQLITE_OK ? 0 : rc < 0 ? -1 : 1;
}

static PyObject *insert_rows(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *connection, *sealed_list;
    long long seq;
    const char *chain_in;
    Py_ssize_t chain_len;
    int with_events = 1;
    if (!PyArg_ParseTuple(args, "OO!Ls#|p", &connection, &PyList_Type, &sealed_list, &seq, &chain_in, &chain_len,
                          &with_events))
        return NULL;
    if (!configured()) return NULL;
    if (ConnectionType == NULL || !Py_IS_TYPE(connection, (PyTypeObject *)ConnectionType)) {
        PyErr_SetString(PyExc_TypeError, "insert() takes a sqlite3.Connection of the checked library");
        return NULL;
    }
    if (chain_len != HEX_LEN) {
        PyErr_SetString(PyExc_ValueError, "the previous chain must be 64 hex characters");
        return NULL;
    }
    sqlite3 *db = ((ConnectionHead *)connection)->db;
    if (db == NULL || sqlite3_get_autocommit(db)) {
        /* Rows outside the caller's write transaction would escape the append lock. */
        PyErr_SetString(PyExc_RuntimeError, "insert() needs an open write transaction (BEGIN IMMEDIATE)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(sealed_list);
    RowText *rows = PyMem_Calloc(n ? (size_t)n : 1, sizeof(RowText));
    PyObject *events = NULL, *chain_text = NULL;
    if (rows == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyList_GET_ITEM(sealed_list, i);
        if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != 8) {
            PyErr_SetString(PyExc_TypeError, "insert() takes a list of Sealed");
            goto done;
        }
        for (int k = 0; k < 7; k++) {
            PyObject *v = PyTuple_GET_ITEM(s, k);
            if (v == Py_None && (k == 3 || k == 4)) continue; /* run_id, block_id */
            if (!PyUnicode_Check(v)) {
                PyErr_SetString(PyExc_TypeError, "insert() takes a list of Sealed");
                goto done;
            }
            rows[i].text[k] = PyUnicode_AsUTF8AndSize(v, &rows[i].len[k]);
            if (rows[i].text[k] == NULL) goto done;
            if (rows[i].len[k] > INT_MAX) {
                PyErr_SetString(PyExc_OverflowError, "a value past 2 GiB cannot be stored");
                goto done;
            }
        }
        if (rows[i].len[6] != HEX_LEN) {
            PyErr_SetString(PyExc_ValueError, "a digest must be 64 hex characters");
            goto done;
        }
    }
    char chain[HEX_LEN], message[512] = "";
    memcpy(chain, chain_in, HEX_LEN);
    int outcome, code = 0;
    /* The list and its strings are held: nothing the rows point to can go while the GIL is away. */
    Py_BEGIN_ALLOW_THREADS
    outcome = step_rows(db, rows, n, seq, chain, &code, message, sizeof message);
    Py_END_ALLOW_THREADS
    if (outcome < 0) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL: SHA-256 failed");
        goto done;
    }
    if (outcome > 0) {
        PyObject *error = (code & 0xff) == SQLITE_CONSTRAINT ? IntegrityError : OperationalError;
        PyErr_SetString(error, message);
        goto done;
    }
    /* Without events the caller wants only the new head: no Event, seq or chain object is made. */
    events = with_events ? PyList_New(n) : Py_NewRef(Py_None);
    if (events == NULL) goto done;
    for (Py_ssize_t i = 0; i < n && with_events; i++) {
        PyObject *s = PyList_GET_ITEM(sealed_list, i);
        PyObject *seq_value = PyLong_FromLongLong(seq + 1 + i);
        PyObject *row_chain = PyUnicode_FromStringAndSize(rows[i].chain, HEX_LEN);
        PyObject *data = sealed_data(s);
        PyObject *event = NULL;
        if (seq_value != NULL && row_chain != NULL && data != NULL) {
            PyObject *values[9];
            stored_values(s, seq_value, data, row_chain, values);
            event = make_event(values);
        }
        Py_XDECREF(seq_value);
        Py_XDECREF(row_chain);
        Py_XDECREF(data);
        if (event == NULL) {
            Py_CLEAR(events);
            goto done;
        }
        PyList_SET_ITEM(events, i, event);
    }
    chain_text = PyUnicode_FromStringAndSize(chain, HEX_LEN);
    if (chain_text == NULL) Py_CLEAR(events);
done:
    PyMem_Free(rows);
    if (events == NULL) {
        Py_XDECREF(chain_text);
        return NULL;
    }
    return Py_BuildValue("NN", events, chain_text);
}

static PyObject *configure(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *sealed_type, *event_type, *seal_function, *parse, *spec;
    if (!PyArg_ParseTuple(args, "O!O!OOO!", &PyType_Type, &sealed_type, &PyType_Type, &event_type,
                          &seal_function, &parse, &PyDict_Type, &spec))
        return NULL;
    Py_XSETREF(SealedType, Py_NewRef(sealed_type));
    Py_XSETREF(EventType, Py_NewRef(event_type));
    Py_XSETREF(python_seal, Py_NewRef(seal_function));
    Py_XSETREF(parse_json, Py_NewRef(parse));
    Py_XSETREF(vocabulary, Py_NewRef(spec));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Sealed, Event, seal, parse_json, vocabulary_spec)\n\n"
     "Name the types to build, the Python seal to fall back on and the vocabulary (done by\n"
     "ledger._events at import)."},
    {"seal_many", (PyCFunction)(void (*)(void))seal_many, METH_VARARGS | METH_KEYWORDS,
     "seal_many(events, parsed=True) -> list[Sealed]\n\n"
     "Seal each NewEvent as ledger._events.seal does (the events it cannot take, it hands to it).\n"
     "Without ``parsed`` a Sealed may carry None for its parsed data (no recorded Event wanted)."},
    {"link", link_rows, METH_VARARGS,
     "link(sealed, last_seq, last_chain, events=True) -> (rows, events, chain)\n\n"
     "Number and chain ``sealed`` after ``last_seq``/``last_chain``: the rows to insert, the\n"
     "recorded Events (None without ``events``) and the new head's chain."},
    {"configure_sqlite", configure_sqlite, METH_VARARGS,
     "configure_sqlite(Connection, IntegrityError, OperationalError, module_path, probe) -> bool\n\n"
     "Whether insert() may use the handle of Python's sqlite3 connections (done by ledger._events)."},
    {"insert", insert_rows, METH_VARARGS,
     "insert(connection, sealed, last_seq, last_chain, events=True) -> (events, chain)\n\n"
     "Chain ``sealed`` after ``last_seq``/``last_chain`` and insert the rows on ``connection``'s\n"
     "open write transaction: the recorded Events (None without ``events``) and the new head's chain."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_cseal",
    .m_doc = "Native sealing and chaining for append.", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cseal(void) {
    init_escapes();
    init_classes();
    if ((NO_ARGS = PyTuple_New(0)) == NULL) return NULL;
    static const char *names[9] = {"seq", "id", "ts", "kind", "run_id", "block_id", "data", "digest", "chain"};
    for (int i = 0; i < 9; i++)
        if ((event_fields[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    name_kind = event_fields[3];
    name_run_id = event_fields[4];
    name_block_id = event_fields[5];
    name_data = event_fields[6];
    name_id = event_fields[1];
    name_ts = event_fields[2];
    PyObject *m = PyModule_Create(&module);
    /* Read by ledger/_events: seal_many(parsed=False), link(..., False) and insert(..., False) are
     * there (a build older than its source lacks them, and extend then builds and drops the events). */
    if (m != NULL && PyModule_AddIntConstant(m, "WITHOUT_EVENTS", 1) < 0) Py_CLEAR(m);
    return m;
}
