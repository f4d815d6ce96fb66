/* Boilerplate lines, compiled: the line hashes the boilerplate count takes and the line removal of the clean
 * stage (pipeline/clean/boilerplate.py, pipeline/clean/normalize.py), without a Python object per line.
 *
 * A line is what str.split("\n") gives; its key is xxhash64 (seed 0) of its UTF-8 bytes after str.strip()
 * (Python's whitespace: Py_UNICODE_ISSPACE); lengths are in code points, as len() counts them. Both
 * functions take a str and answer None when it holds a lone surrogate (it has no strict UTF-8 form), and the
 * caller then takes its Python path.
 *
 * line_hashes(text, min_line_chars) -> bytes | None
 *     The distinct keys (sorted, native uint64) of the lines whose stripped length is >= min_line_chars:
 *     doc_line_hashes() of boilerplate.py.
 * remove_lines(text, boilerplate, min_line_chars) -> (str, int) | None
 *     text without the lines of >= min_line_chars code points whose key is in boilerplate (a sorted uint64
 *     buffer), joined by "\n" again, and how many were removed; text itself when none was:
 *     remove_boilerplate() of normalize.py.
 * xxh64(data) -> int
 *     The key function itself over any bytes-like object (what the tests check against xxhash.xxh64_intdigest).
 */
#include "../_native.h"

/* [*lo, *hi) narrowed to str.strip()'s result. */
static void strip(const uint8_t *s, Py_ssize_t *lo, Py_ssize_t *hi) {
    *lo = native_lstrip(s, *lo, *hi);
    *hi = native_rstrip(s, *lo, *hi);
}

/* Whether s[lo:hi] holds at least n code points. */
static inline int at_least(const uint8_t *s, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n) {
    if (hi - lo < n) return 0;
    if (hi - lo >= 4 * n) return 1;  /* a code point is at most 4 bytes */
    Py_ssize_t count = 0;
    for (Py_ssize_t i = lo; i < hi; i++) count += (s[i] & 0xC0) != 0x80;
    return count >= n;
}

/* The end of the line that starts at i: the next newline, or size. */
static inline Py_ssize_t line_end(const uint8_t *s, Py_ssize_t i, Py_ssize_t size) {
    const uint8_t *nl = memchr(s + i, '\n', (size_t)(size - i));
    return nl ? nl - s : size;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static PyObject *line_hashes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *text;
    Py_ssize_t min_chars, size;
    if (!PyArg_ParseTuple(args, "Un", &text, &min_chars)) return NULL;
    const uint8_t *s = native_utf8(text, &size);
    if (s == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    Py_ssize_t lines = 1;
    for (Py_ssize_t i = 0; i < size; i++) lines += s[i] == '\n';
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)lines);
    if (!keys) return PyErr_NoMemory();
    Py_ssize_t n = 0, start = 0;
    for (Py_ssize_t i = line_end(s, 0, size);; i = line_end(s, start, size)) {
        Py_ssize_t lo = start, hi = i;
        start = i + 1;
        if (hi - lo < min_chars) {
            if (i >= size) break;
            continue;
        }  /* fewer bytes than the minimum: fewer code points too */
        strip(s, &lo, &hi);
        if (at_least(s, lo, hi, min_chars)) {
            if (n >= lines) {  /* never: a key per line at most, and the lines were counted */
                free(keys);
                PyErr_SetString(PyExc_RuntimeError, "line_hashes: more lines than newlines + 1 (a kernel bug)");
                return NULL;
            }
            keys[n++] = native_xxh64(s + lo, (size_t)(hi - lo));
        }
        if (i >= size) break;
    }
    qsort(keys, (size_t)n, sizeof(uint64_t), compare_u64);
    Py_ssize_t distinct = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (i == 0 || keys[i] != keys[distinct - 1]) keys[distinct++] = keys[i];
    PyObject *out = PyBytes_FromStringAndSize((const char *)keys, distinct * (Py_ssize_t)sizeof(uint64_t));
    free(keys);
    return out;
}

/* Whether key is in sorted[0..n): a branch-free search (the comparisons are unpredictable, and a mispredicted
 * branch per step cost more than the step). */
static int in_sorted(const uint64_t *sorted, Py_ssize_t n, uint64_t key) {
    if (n <= 0) return 0;
    const uint64_t *at = sorted;
    Py_ssize_t len = n;
    while (len > 1) {  /* the last key <= key lies in [at, at + len) */
        Py_ssize_t half = len / 2;
        at = at[half] <= key ? at + half : at;
        len -= half;
    }
    return *at == key;
}

static PyObject *remove_lines(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *text;
    Py_buffer boilerplate;
    Py_ssize_t min_chars, size;
    if (!PyArg_ParseTuple(args, "Uy*n", &text, &boilerplate, &min_chars)) return NULL;
    PyObject *result = NULL;
    uint8_t *out = NULL;
    const uint8_t *s = native_utf8(text, &size);
    if (s == NULL) {
        if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
        goto done;
    }
    if (native_check_items(&boilerplate, 8, "remove_lines: boilerplate (sorted uint64)")) goto done;
    const uint64_t *keys = (const uint64_t *)boilerplate.buf;
    Py_ssize_t n_keys = boilerplate.len / 8, removed = 0, written = 0, start = 0;
    int first = 1;
    for (Py_ssize_t i = line_end(s, 0, size);; i = line_end(s, start, size)) {
        Py_ssize_t lo = start, hi = i;
        start = i + 1;
        int drop = 0;
        if (n_keys && at_least(s, lo, hi, min_chars)) {
            Py_ssize_t a = lo, b = hi;
            strip(s, &a, &b);
            drop = in_sorted(keys, n_keys, native_xxh64(s + a, (size_t)(b - a)));
        }
        if (drop && !removed) {  /* the first line out: what came before it is kept as it is */
            out = malloc((size_t)size + 1);
            if (!out) {
                PyErr_NoMemory();
                goto done;
            }
            written = lo > 0 ? lo - 1 : 0;  /* without the newline before this line */
            memcpy(out, s, (size_t)written);
            first = lo == 0;
        }
        if (drop) {
            removed++;
        } else if (removed) {
            if (written + (hi - lo) + !first > size) {  /* never: the kept lines are fewer than all of them */
                PyErr_SetString(PyExc_RuntimeError, "remove_lines: kept lines longer than the text (a kernel bug)");
                goto done;
            }
            if (!first) out[written++] = '\n';
            memcpy(out + written, s + lo, (size_t)(hi - lo));
            written += hi - lo;
            first = 0;
        }
        if (i >= size) break;
    }
    PyObject *kept = removed ? PyUnicode_DecodeUTF8((const char *)out, written, "strict") : Py_NewRef(text);
    if (kept) {
        result = Py_BuildValue("(Nn)", kept, removed);
    }
done:
    free(out);
    PyBuffer_Release(&boilerplate);
    return result;
}

static PyObject *xxh64(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE)) return NULL;
    uint64_t h = native_xxh64((const uint8_t *)data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"xxh64", xxh64, METH_O, "XXH64 (seed 0) of a bytes-like object: the key of a stripped line's UTF-8 bytes."},
    {"line_hashes", line_hashes, METH_VARARGS, "The sorted distinct keys of a document's long stripped lines."},
    {"remove_lines", remove_lines, METH_VARARGS, "A document without its boilerplate lines, and how many."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lines",
                                    "Compiled boilerplate line keys and removal (see pipeline/clean/_lines.c).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__lines(void) { return PyModule_Create(&module); }
