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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t read32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t input) { return rotl(acc + input * P2, 31) * P1; }

static inline uint64_t xxh_merge(uint64_t acc, uint64_t val) { return (acc ^ xxh_round(0, val)) * P1 + P4; }

/* XXH64 with seed 0, as xxhash.xxh64_intdigest computes it (tested against it). */
static uint64_t xxh64(const uint8_t *p, size_t len) {
    const uint8_t *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const uint8_t *limit = end - 32;
        uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = (uint64_t)0 - P1;
        do {
            v1 = xxh_round(v1, read64(p));
            v2 = xxh_round(v2, read64(p + 8));
            v3 = xxh_round(v3, read64(p + 16));
            v4 = xxh_round(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = xxh_merge(xxh_merge(xxh_merge(xxh_merge(h, v1), v2), v3), v4);
    } else {
        h = P5;
    }
    h += (uint64_t)len;
    for (; p + 8 <= end; p += 8) h = rotl(h ^ xxh_round(0, read64(p)), 27) * P1 + P4;
    if (p + 4 <= end) {
        h = rotl(h ^ ((uint64_t)read32(p) * P1), 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl(h ^ (*p * P5), 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* The code point that starts at s (valid UTF-8) and its byte length. */
static inline Py_UCS4 decode(const uint8_t *s, int *size) {
    uint8_t b = s[0];
    if (b < 0x80) { *size = 1; return b; }
    if (b < 0xE0) { *size = 2; return ((Py_UCS4)(b & 0x1F) << 6) | (s[1] & 0x3F); }
    if (b < 0xF0) {
        *size = 3;
        return ((Py_UCS4)(b & 0x0F) << 12) | ((Py_UCS4)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *size = 4;
    return ((Py_UCS4)(b & 0x07) << 18) | ((Py_UCS4)(s[1] & 0x3F) << 12) | ((Py_UCS4)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

/* [*lo, *hi) narrowed to str.strip()'s result. */
static void strip(const uint8_t *s, Py_ssize_t *lo, Py_ssize_t *hi) {
    Py_ssize_t a = *lo, b = *hi;
    int size;
    while (a < b && Py_UNICODE_ISSPACE(decode(s + a, &size))) a += size;
    while (b > a) {
        Py_ssize_t k = b - 1;
        while (k > a && (s[k] & 0xC0) == 0x80) k--;
        if (!Py_UNICODE_ISSPACE(decode(s + k, &size))) break;
        b = k;
    }
    *lo = a;
    *hi = b;
}

/* Whether s[lo:hi] holds at least n code points. */
static inline int at_least(const uint8_t *s, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n) {
    if (hi - lo < n) return 0;
    if (hi - lo >= 4 * n) return 1;  /* a code point is at most 4 bytes */
    Py_ssize_t count = 0;
    for (Py_ssize_t i = lo; i < hi; i++) count += (s[i] & 0xC0) != 0x80;
    return count >= n;
}

/* The UTF-8 form of text, or NULL with no error set when it has a lone surrogate (the caller's Python path). */
static const uint8_t *utf8_of(PyObject *text, Py_ssize_t *size) {
    const char *s = PyUnicode_AsUTF8AndSize(text, size);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) PyErr_Clear();
    return (const uint8_t *)s;
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
    const uint8_t *s = utf8_of(text, &size);
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
        if (at_least(s, lo, hi, min_chars)) keys[n++] = xxh64(s + lo, (size_t)(hi - lo));
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
    const uint8_t *s = utf8_of(text, &size);
    if (s == NULL) {
        if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
        goto done;
    }
    if (boilerplate.len % 8) {
        PyErr_SetString(PyExc_ValueError, "remove_lines: boilerplate must be a uint64 buffer");
        goto done;
    }
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
            drop = in_sorted(keys, n_keys, xxh64(s + a, (size_t)(b - a)));
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

static PyMethodDef methods[] = {
    {"line_hashes", line_hashes, METH_VARARGS, "The sorted distinct keys of a document's long stripped lines."},
    {"remove_lines", remove_lines, METH_VARARGS, "A document without its boilerplate lines, and how many."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lines",
                                    "Compiled boilerplate line keys and removal (see pipeline/clean/_lines.c).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__lines(void) { return PyModule_Create(&module); }
