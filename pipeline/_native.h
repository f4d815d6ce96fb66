/* What the compiled kernels share: reading buffers, decoding UTF-8 and hashing bytes.
 *
 * pipeline/clean/_langid_walk.c, pipeline/clean/_lines.c and pipeline/clean/_wordscan.c include this one header
 * (it ships in the sdist as each extension's `depends`). Every helper is bounded: a decoder never reads past the
 * end it is given, whatever the bytes, so a broken invariant becomes a Python exception in the caller instead of
 * a read out of bounds (`make sanitize` runs the kernels' tests under AddressSanitizer and UBSan).
 */
#ifndef PILEWORKS_NATIVE_H
#define PILEWORKS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ buffers */

/* 0, or -1 with ValueError set, when buf is not a whole number of items of itemsize bytes, aligned for them
 * (the kernels read it as int32/int64/uint64 in place; a misaligned read is undefined behaviour). */
static inline int native_check_items(const Py_buffer *buf, Py_ssize_t itemsize, const char *name) {
    if (buf->len % itemsize != 0 || (uintptr_t)buf->buf % (uintptr_t)itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: an aligned buffer of %zd-byte items was expected", name, itemsize);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ UTF-8 */

/* What native_decode answers for a sequence cut short by the end: above every code point, so it is no space,
 * letter or bullet, and the callers that must see valid UTF-8 check for it. */
#define NATIVE_BAD_CHAR ((Py_UCS4)0xFFFFFFFFu)

/* The UTF-8 form of text (valid UTF-8, as CPython keeps it), or NULL with no error set when text holds a lone
 * surrogate (it has no strict UTF-8 form: the caller takes its Python path); NULL with an error otherwise. */
static inline const uint8_t *native_utf8(PyObject *text, Py_ssize_t *size) {
    const char *s = PyUnicode_AsUTF8AndSize(text, size);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) PyErr_Clear();
    return (const uint8_t *)s;
}

/* The byte length a UTF-8 sequence with lead byte b claims (a stray continuation byte counts as 1). */
static inline int native_char_size(uint8_t b) { return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

/* The code point that starts at s[i] (i < n) and its byte length in *size; never reads s[n] or past it. A
 * sequence the end cuts short gives NATIVE_BAD_CHAR and the bytes left (so a caller stepping by *size stays
 * within n). */
static inline Py_UCS4 native_decode(const uint8_t *s, Py_ssize_t i, Py_ssize_t n, int *size) {
    uint8_t b = s[i];
    int k = native_char_size(b);
    if (k == 1) {
        *size = 1;
        return b;
    }
    if (n - i < k) {
        *size = (int)(n - i);
        return NATIVE_BAD_CHAR;
    }
    *size = k;
    const uint8_t *p = s + i;
    if (k == 2) return ((Py_UCS4)(b & 0x1F) << 6) | (p[1] & 0x3F);
    if (k == 3) return ((Py_UCS4)(b & 0x0F) << 12) | ((Py_UCS4)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return ((Py_UCS4)(b & 0x07) << 18) | ((Py_UCS4)(p[1] & 0x3F) << 12) | ((Py_UCS4)(p[2] & 0x3F) << 6) |
           (p[3] & 0x3F);
}

/* The start of the character that ends just before s[i] (lo < i): continuation bytes skipped, never below lo. */
static inline Py_ssize_t native_char_before(const uint8_t *s, Py_ssize_t lo, Py_ssize_t i) {
    do i--;
    while (i > lo && (s[i] & 0xC0) == 0x80);
    return i;
}

/* The end of s[lo:hi] once str.rstrip() has taken Python's whitespace (Py_UNICODE_ISSPACE) off it. */
static inline Py_ssize_t native_rstrip(const uint8_t *s, Py_ssize_t lo, Py_ssize_t hi) {
    int size;
    while (hi > lo) {
        Py_ssize_t k = native_char_before(s, lo, hi);
        if (!Py_UNICODE_ISSPACE(native_decode(s, k, hi, &size))) break;
        hi = k;
    }
    return hi;
}

/* The start of s[lo:hi] once str.lstrip() has taken Python's whitespace off it. */
static inline Py_ssize_t native_lstrip(const uint8_t *s, Py_ssize_t lo, Py_ssize_t hi) {
    int size;
    while (lo < hi && Py_UNICODE_ISSPACE(native_decode(s, lo, hi, &size))) lo += size;
    return lo;
}

/* ------------------------------------------------------------------ hashing */

static inline uint64_t native_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* The 8 (4) bytes at p as a little-endian integer, wherever p points. */
static inline uint64_t native_read_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t native_read_le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

/* The golden-ratio multiplier (Fibonacci hashing) that spreads a 64-bit key over a power-of-two table. */
#define NATIVE_MIX 0x9E3779B97F4A7C15ULL

#define XXH_P1 0x9E3779B185EBCA87ULL
#define XXH_P2 0xC2B2AE3D27D4EB4FULL
#define XXH_P3 0x165667B19E3779F9ULL
#define XXH_P4 0x85EBCA77C2B2AE63ULL
#define XXH_P5 0x27D4EB2F165667C5ULL

static inline uint64_t native_xxh_round(uint64_t acc, uint64_t input) {
    return native_rotl64(acc + input * XXH_P2, 31) * XXH_P1;
}

static inline uint64_t native_xxh_merge(uint64_t acc, uint64_t val) {
    return (acc ^ native_xxh_round(0, val)) * XXH_P1 + XXH_P4;
}

/* XXH64 with seed 0 of p[0:len], as xxhash.xxh64_intdigest computes it (tested against it on every length
 * from 0 to 300: the 32-byte stripes and each tail). */
static inline uint64_t native_xxh64(const uint8_t *p, size_t len) {
    const uint8_t *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const uint8_t *limit = end - 32;
        uint64_t v1 = XXH_P1 + XXH_P2, v2 = XXH_P2, v3 = 0, v4 = (uint64_t)0 - XXH_P1;
        do {
            v1 = native_xxh_round(v1, native_read_le64(p));
            v2 = native_xxh_round(v2, native_read_le64(p + 8));
            v3 = native_xxh_round(v3, native_read_le64(p + 16));
            v4 = native_xxh_round(v4, native_read_le64(p + 24));
            p += 32;
        } while (p <= limit);
        h = native_rotl64(v1, 1) + native_rotl64(v2, 7) + native_rotl64(v3, 12) + native_rotl64(v4, 18);
        h = native_xxh_merge(native_xxh_merge(native_xxh_merge(native_xxh_merge(h, v1), v2), v3), v4);
    } else {
        h = XXH_P5;
    }
    h += (uint64_t)len;
    for (; end - p >= 8; p += 8) h = native_rotl64(h ^ native_xxh_round(0, native_read_le64(p)), 27) * XXH_P1 + XXH_P4;
    if (end - p >= 4) {
        h = native_rotl64(h ^ ((uint64_t)native_read_le32(p) * XXH_P1), 23) * XXH_P2 + XXH_P3;
        p += 4;
    }
    for (; p < end; p++) h = native_rotl64(h ^ (*p * XXH_P5), 11) * XXH_P1;
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

#endif /* PILEWORKS_NATIVE_H */
