/* Native chain verification of an SQLite ledger: the same checks as ledger/_verify.py's
 * scan_rows, without a Python object per row.
 *
 * Why C: in Python each row costs about 2.8 us to read through sqlite3 and 2.8 us to
 * check, so a million events take seconds; here a row is one sqlite3_step, two SHA-256
 * (OpenSSL's SHA-256, SHA-NI where the CPU has it) and a few memcpy. The GIL is released for the
 * whole scan, so several ranges run in threads of one process.
 *
 * The envelope is rebuilt exactly as ledger/_events.envelope_text does: keys in order,
 * strings quoted with orjson's escaping (", \, \b \t \n \f \r, other controls as \u00xx
 * in lowercase hex, everything else verbatim), data inserted as stored canonical JSON.
 */
#define PY_SSIZE_T_CLEAN
/* SHA256_Init and friends are deprecated in OpenSSL 3 in favour of EVP, which costs
 * about 30 ns more per call (provider dispatch); they still run the same SHA-NI code. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <openssl/sha.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "_native.h"
#include "_rowcheck.h"

/* Outcomes; ledger/_verify.py owns the messages. */
enum { SCAN_OK = 0, SCAN_DELETED = 1, SCAN_EDITED = 2, SCAN_RELINKED = 3 };

typedef struct {
    long long expected;      /* the next seq that should come */
    char chain[HEX_LEN + 1]; /* the stored chain of the row before it */
    size_t chain_len;        /* 64, or 0 when the row before is missing (the link then fails) */
    long long bad_seq;
    long long found_seq;     /* the seq found where ``expected`` was due */
    int outcome;
    char error[256];         /* set when SQLite or OpenSSL failed (not a verdict) */
} Scan;

static void fail(Scan *scan, const char *what, const char *detail) {
    snprintf(scan->error, sizeof scan->error, "%s: %s", what, detail ? detail : "unknown error");
}

#ifdef __SSE2__
#include <emmintrin.h>

/* Sixteen nibbles (one a byte) as lower-case hex digits. */
static inline __m128i hex_digits(__m128i nibbles) {
    __m128i letter = _mm_cmpgt_epi8(nibbles, _mm_set1_epi8(9));
    __m128i digit = _mm_add_epi8(nibbles, _mm_set1_epi8('0'));
    return _mm_add_epi8(digit, _mm_and_si128(letter, _mm_set1_epi8('a' - '0' - 10)));
}

/* Whether ``hex`` (64 bytes) is the lower-case hex of the digest ``md``: the digest is spelled
 * sixteen bytes at a time in SSE2 registers and compared there, nothing written. */
static int hex_is(const unsigned char *hex, const unsigned char *md) {
    const __m128i low = _mm_set1_epi8(0x0f);
    __m128i same = _mm_set1_epi8(-1);
    for (int half = 0; half < 2; half++) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(md + 16 * half));
        __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low), rest = _mm_and_si128(bytes, low);
        const unsigned char *h = hex + 32 * half;
        /* Each byte's high nibble first: interleave the two. */
        same = _mm_and_si128(same, _mm_cmpeq_epi8(hex_digits(_mm_unpacklo_epi8(high, rest)),
                                                  _mm_loadu_si128((const __m128i *)h)));
        same = _mm_and_si128(same, _mm_cmpeq_epi8(hex_digits(_mm_unpackhi_epi8(high, rest)),
                                                  _mm_loadu_si128((const __m128i *)(h + 16))));
    }
    return _mm_movemask_epi8(same) == 0xffff;
}
#else
static int hex_is(const unsigned char *hex, const unsigned char *md) {
    char spelled[HEX_LEN];
    to_hex(md, spelled);
    return memcmp(hex, spelled, HEX_LEN) == 0;
}
#endif

/* Check the rows of ``st`` in seq order; mirrors _verify.scan_rows.
 *
 * A row's chain link is the SHA-256 of the previous row's chain and this row's digest, both as
 * hex text. Each is hashed here as stored, once checked equal to the hex of the digest computed:
 * no hex is written, and the stored forms are compared with the digests in binary. */
static void scan_rows(sqlite3_stmt *st, Scan *scan) {
    Buffer b = {NULL, 0, 0};
    unsigned char link[2 * HEX_LEN], md[32];
    size_t prefix = scan->chain_len; /* 64, or 0 while the row before is missing */
    memcpy(link + HEX_LEN - prefix, scan->chain, prefix);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        long long seq = sqlite3_column_int64(st, 0);
        if (seq != scan->expected) {
            scan->outcome = SCAN_DELETED;
            scan->found_seq = seq;
            scan->bad_seq = seq < scan->expected ? seq : scan->expected;
            break;
        }
        int built = envelope(&b, st);
        if (built == -2) {
            fail(scan, "out of memory", NULL);
            break;
        }
        if (built == 0) sha256_two(b.p, b.len, NULL, 0, md);
        const unsigned char *stored = stored_hex(st, 7);
        if (built == -1 || stored == NULL || !hex_is(stored, md)) {
            scan->outcome = SCAN_EDITED;
            scan->bad_seq = seq;
            break;
        }
        memcpy(link + HEX_LEN, stored, HEX_LEN);
        sha256_two(link + HEX_LEN - prefix, prefix + HEX_LEN, NULL, 0, md);
        stored = stored_hex(st, 8);
        if (stored == NULL || !hex_is(stored, md)) {
            scan->outcome = SCAN_RELINKED;
            scan->bad_seq = seq;
            break;
        }
        memcpy(link, stored, HEX_LEN);
        prefix = HEX_LEN;
        scan->expected++;
    }
    memcpy(scan->chain, link + HEX_LEN - prefix, prefix);
    scan->chain_len = prefix;
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) fail(scan, "SQLite", sqlite3_errstr(rc));
    free(b.p);
}

static const char *SQL =
    "SELECT seq, id, ts, kind, run_id, block_id, data, digest, chain FROM events "
    "WHERE seq > ?1 AND seq <= ?2 ORDER BY seq";

/* Open read-only, select the range and scan it; all without the GIL. */
static void scan_file(const char *path, long long after, long long last, Scan *scan) {
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    /* NOMUTEX: the connection is this thread's alone, so SQLite need not lock on every column read. */
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        fail(scan, "SQLite open", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return;
    }
    /* Sixteen cached pages (64 kB) rather than 2 MB: a scan reads each leaf once, and the few
     * buffers the kernel copies pages into then stay in the core's cache. */
    sqlite3_exec(db, "PRAGMA cache_size=16", NULL, NULL, NULL);
    if (sqlite3_prepare_v2(db, SQL, -1, &st, NULL) != SQLITE_OK) {
        fail(scan, "SQLite prepare", sqlite3_errmsg(db));
    } else {
        sqlite3_bind_int64(st, 1, after);
        sqlite3_bind_int64(st, 2, last);
        scan_rows(st, scan); /* one statement: one read transaction, a consistent view */
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
}

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *path, *chain;
    Py_ssize_t chain_len;
    long long after, last, expected;
    if (!PyArg_ParseTuple(args, "sLLLs#", &path, &after, &last, &expected, &chain, &chain_len)) return NULL;
    if (chain_len != HEX_LEN && chain_len != 0) {
        PyErr_SetString(PyExc_ValueError, "previous chain must be 64 hex characters or empty");
        return NULL;
    }
    Scan result = {.expected = expected, .chain_len = (size_t)chain_len, .outcome = SCAN_OK};
    memcpy(result.chain, chain, (size_t)chain_len);
    Py_BEGIN_ALLOW_THREADS
    scan_file(path, after, last, &result);
    Py_END_ALLOW_THREADS
    if (result.error[0]) {
        PyErr_SetString(PyExc_RuntimeError, result.error);
        return NULL;
    }
    return Py_BuildValue("iLLLs#", result.outcome, result.bad_seq, result.found_seq, result.expected - 1,
                         result.chain, (Py_ssize_t)result.chain_len);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(path, after, last, expected, previous_chain)\n"
     "    -> (outcome, bad_seq, found_seq, last_good_seq, last_good_chain)\n\n"
     "Check the rows with after < seq <= last of the SQLite ledger at ``path`` (a URI is\n"
     "accepted), expecting the first to be ``expected`` and to follow ``previous_chain``."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_cverify",
    .m_doc = "Native chain verification of SQLite ledgers.", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cverify(void) {
    init_escapes();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "OK", SCAN_OK) || PyModule_AddIntConstant(m, "DELETED", SCAN_DELETED)
        || PyModule_AddIntConstant(m, "EDITED", SCAN_EDITED)
        || PyModule_AddIntConstant(m, "RELINKED", SCAN_RELINKED)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
