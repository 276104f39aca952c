/* Native read of an SQLite ledger's rows into Arrow buffers (the snapshot's raw rows).
 *
 * Why C: through Python's sqlite3 each row becomes a tuple of nine objects and each
 * value is converted again into Arrow, several microseconds per row; here a row is one
 * sqlite3_step and a memcpy per column into growing Arrow buffers, with the GIL released,
 * so seq ranges are read in threads of one process. Python wraps the buffers without
 * copying them (pyarrow.Array.from_buffers).
 *
 * read(path, after_seq, until_seq) -> (rows, seq_bytes, [(validity|None, nulls, offsets, data)] * 8)
 * for the columns seq, id, ts, kind, run_id, block_id, data, digest, chain of the rows
 * with after_seq < seq <= until_seq in seq order; string columns as Arrow `string`
 * (int32 offsets; a range whose column passes 2 GiB is refused: read a smaller one).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_COLUMNS 8

/* Columns run to megabytes: start their buffers at 64 KiB. */
#define BUFFER_FIRST_CAP 65536
#include "_buffer.h"

typedef struct {
    Buffer offsets, data, validity;
    int64_t nulls;
} Column;

enum { READ_OK = 0, READ_NOMEM = 1, READ_SQLITE = 2, READ_TOO_LARGE = 3 };

static int add_row(Buffer *seqs, Column *cols, sqlite3_stmt *st, int64_t row) {
    if (reserve(seqs, 8) < 0) return READ_NOMEM;
    int64_t seq = sqlite3_column_int64(st, 0);
    memcpy(seqs->p + seqs->len, &seq, 8);
    seqs->len += 8;
    for (int c = 0; c < TEXT_COLUMNS; c++) {
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

static int read_rows(const char *path, int64_t after, int64_t until, Buffer *seqs, Column *cols,
                     int64_t *rows, const char **sqlite_message) {
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int outcome = READ_OK;
    *sqlite_message = NULL;
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        int32_t zero = 0;
        if (reserve(&cols[c].offsets, 4) < 0) return READ_NOMEM;
        memcpy(cols[c].offsets.p, &zero, 4);
        cols[c].offsets.len = 4;
    }
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
        outcome = add_row(seqs, cols, st, row++);
        if (outcome != READ_OK) goto done;
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

static PyObject *as_bytes(Buffer *b) {
    return PyBytes_FromStringAndSize((const char *)(b->p ? b->p : (unsigned char *)""), (Py_ssize_t)b->len);
}

static PyObject *read_range(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    long long after, until;
    if (!PyArg_ParseTuple(args, "sLL", &path, &after, &until)) return NULL;
    Buffer seqs = {0};
    Column cols[TEXT_COLUMNS];
    memset(cols, 0, sizeof cols);
    int64_t rows = 0;
    const char *message = NULL;
    int outcome;
    Py_BEGIN_ALLOW_THREADS
    outcome = read_rows(path, after, until, &seqs, cols, &rows, &message);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL, *columns = NULL;
    if (outcome == READ_NOMEM) {
        PyErr_NoMemory();
        goto done;
    }
    if (outcome == READ_TOO_LARGE) {
        PyErr_SetString(PyExc_OverflowError, "a column of this seq range passes 2 GiB: read a smaller range");
        goto done;
    }
    if (outcome == READ_SQLITE) {
        PyErr_Format(PyExc_OSError, "sqlite: %s", message ? message : "cannot open or read");
        goto done;
    }
    columns = PyList_New(TEXT_COLUMNS);
    if (columns == NULL) goto done;
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        PyObject *validity = cols[c].nulls ? as_bytes(&cols[c].validity) : (Py_INCREF(Py_None), Py_None);
        PyObject *item = Py_BuildValue("(NLNN)", validity, (long long)cols[c].nulls,
                                       as_bytes(&cols[c].offsets), as_bytes(&cols[c].data));
        if (item == NULL) goto done;
        PyList_SET_ITEM(columns, c, item);
    }
    result = Py_BuildValue("(LNO)", (long long)rows, as_bytes(&seqs), columns);
done:
    Py_XDECREF(columns);
    free(seqs.p);
    for (int c = 0; c < TEXT_COLUMNS; c++) {
        free(cols[c].offsets.p);
        free(cols[c].data.p);
        free(cols[c].validity.p);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_range, METH_VARARGS,
     "read(path, after_seq, until_seq) -> (rows, seq_bytes, [(validity, nulls, offsets, data)] * 8)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_carrow",
    .m_doc = "Native read of an SQLite ledger's rows into Arrow buffers.", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__carrow(void) { return PyModule_Create(&module); }
