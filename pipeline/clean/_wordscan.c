/* The byte-level word scan of the quality rules, compiled (the numpy scan: pipeline/clean/wordscan.py).
 *
 * scan_words(texts, max_dup_line_fraction, max_dup_line_char_fraction, max_dup_para_fraction,
 *            max_dup_para_char_fraction) -> (hashes, lengths, sizes, per_doc, repetition_ok, cjk, alpha, marks)
 *
 * For a list of str: every word's 64-bit hash (uint64) and length in code points (int64), concatenated in
 * order; per document its word count (int64), whether it must take the per-document path (a lone
 * surrogate: no strict UTF-8 form; then it has no words here), whether upper bounds prove that it passes
 * the four repetition rules, its CJK character count (int64) and its words holding an alphabetic character
 * (int64: an ASCII letter, or a non-ASCII code point with Py_UNICODE_ISALPHA, what str.isalpha tests; a CJK
 * character is a word of its own); all as bytes for numpy.frombuffer. A threshold below 0 is a rule turned off. marks: per document six int64 counts for the per-document rules:
 * text.count("#"), text.count("..."), text.count("…"), text.count("\n"), the bullet lines (BULLET_LINE_RE's
 * matches plus a first line that starts with a bullet) and the lines ending in an ellipsis (text.count("...\n")
 * + text.count("…\n") + whether text.rstrip() ends with one).
 *
 * Words are those of str.split() once every CJK character (CJK_RANGES of wordscan.py) is taken out:
 * separators are Python's whitespace (Py_UNICODE_ISSPACE, what str.split() splits on) and CJK characters,
 * each of which is counted. A word's hash mixes its byte length with its first and last 8 bytes, as
 * wordscan._word_hashes does, so the n-gram screen that reads them gives the same answers.
 *
 * Repetition bounds: lines are the non-empty stretches between newlines, paragraphs those between runs of
 * two or more newlines (and the document's ends), as wordscan._repetition_passes cuts them. An item's key
 * mixes the sum of its words' hashes with its byte length, so equal items have equal keys and the repeats
 * counted can only be too many (each key after the first of its kind is a repeat; the characters of a key's
 * repeats are all of its items' but the shortest one's). A document passes when neither fraction is over
 * its threshold with those counts: then the exact rules pass too.
 */
#include "../_native.h"

#define M1 0xFF51AFD7ED558CCDULL
#define M2 0xC4CEB9FE1A85EC53ULL

static const Py_UCS4 CJK_RANGES[][2] = {
    {0x3000, 0x30FF}, {0x3400, 0x4DBF}, {0x4E00, 0x9FFF}, {0xA000, 0xA4CF},
    {0xAC00, 0xD7A3}, {0xF900, 0xFAFF}, {0xFF00, 0xFFEF}, {0x20000, 0x3134F},
};

static inline int is_cjk(Py_UCS4 cp) {
    if (cp < 0x3000) return 0;
    for (size_t k = 0; k < sizeof(CJK_RANGES) / sizeof(CJK_RANGES[0]); k++)
        if (cp >= CJK_RANGES[k][0] && cp <= CJK_RANGES[k][1]) return 1;
    return 0;
}

/* The bytes below 0x80: 0 a word byte, 1 whitespace other than a newline, 2 a newline; 3 a lead or
 * continuation byte of a multi-byte character. Filled from Py_UNICODE_ISSPACE when the module loads. */
static uint8_t BYTE_CLASS[256];
/* The ASCII letters and the ASCII letters and digits (str.isalpha, str.isalnum below 0x80). */
static uint8_t ASCII_ALPHA[256], ASCII_ALNUM[256];

/* A growable array of fixed-size items. */
typedef struct {
    char *data;
    size_t size, cap, item;
} Vec;

static int vec_push(Vec *v, const void *value) {
    if (v->size == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 1024;
        char *grown = realloc(v->data, cap * v->item);
        if (!grown) return -1;
        v->data = grown;
        v->cap = cap;
    }
    memcpy(v->data + v->size * v->item, value, v->item);
    v->size++;
    return 0;
}

/* Room for `more` items without a check per push (a document of n bytes has at most n / 2 + 1 words). */
static int vec_reserve(Vec *v, size_t more) {
    if (v->size + more <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 1024;
    while (cap < v->size + more) cap *= 2;
    char *grown = realloc(v->data, cap * v->item);
    if (!grown) return -1;
    v->data = grown;
    v->cap = cap;
    return 0;
}

/* Appends a word without growing the arrays (the caller reserved the room); -1 when there is none left. */
static inline int push_word(Vec *hashes, Vec *lengths, uint64_t h, int64_t chars) {
    if (hashes->size >= hashes->cap || lengths->size >= lengths->cap) return -1;
    ((uint64_t *)hashes->data)[hashes->size++] = h;
    ((int64_t *)lengths->data)[lengths->size++] = chars;
    return 0;
}

typedef struct {
    uint64_t key;
    int64_t chars;
} Item;

/* Whether the items (lines or paragraphs of one document) pass both fractions, each item whose key came
 * before it counted as a repeat (`table`: scratch of at least 2 * n + 2 slots, zeroed on return); -1 with
 * RuntimeError set when the table is smaller. */
static int items_pass(const Item *items, size_t n, double max_frac, double max_char_frac, uint64_t *table,
                      size_t slots) {
    if (max_frac < 0 && max_char_frac < 0) return 1;
    size_t mask = 1;
    while (mask < 2 * n) mask <<= 1;
    if (mask > slots) {  /* never: the caller sized the table */
        PyErr_SetString(PyExc_RuntimeError, "scan_words: repeat table smaller than its items (a kernel bug)");
        return -1;
    }
    mask -= 1;
    int64_t repeats = 0, repeat_chars = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = items[i].key ? items[i].key : 1;  /* 0 marks an empty slot */
        total += items[i].chars;
        size_t at = (size_t)((key * NATIVE_MIX) >> 32) & mask;
        while (table[at] && table[at] != key) at = (at + 1) & mask;
        if (table[at]) {
            repeats++;
            repeat_chars += items[i].chars;
        } else {
            table[at] = key;
        }
    }
    memset(table, 0, (mask + 1) * sizeof(uint64_t));
    int64_t count = n > 0 ? (int64_t)n : 1;
    if (max_frac >= 0 && (double)repeats / (double)count > max_frac) return 0;
    if (max_char_frac >= 0 && (double)repeat_chars / (double)(total > 1 ? total : 1) > max_char_frac) return 0;
    return 1;
}

/* A word's hash from its first and last (up to) 8 bytes, read little-endian as numpy reads them (a short word
 * is read as 8 bytes when the document goes on that far, and masked to its own). */
static inline uint64_t word_hash(const uint8_t *s, Py_ssize_t n, Py_ssize_t start, Py_ssize_t end) {
    uint64_t len = (uint64_t)(end - start), first = 0, last = 0;
    if (len >= 8) {
        first = native_read_le64(s + start);
        last = native_read_le64(s + end - 8);
        return (first * M1) ^ (last * M2) ^ len;
    }
    if (start + 8 <= n) {
        first = native_read_le64(s + start) & (((uint64_t)1 << (8 * len)) - 1);
        return (first * M1) ^ (first * M2) ^ len;
    }
    for (size_t i = 0; i < (size_t)len; i++) first |= (uint64_t)s[start + (Py_ssize_t)i] << (8 * i);
    return (first * M1) ^ (first * M2) ^ len;
}

typedef struct {
    Py_ssize_t start;
    uint64_t sum;
    int64_t chars;
} Stretch;

static int close_stretch(Vec *items, Stretch *st, Py_ssize_t end) {
    if (end > st->start) {
        Item item = {((st->sum * M2) ^ (uint64_t)(end - st->start)), st->chars};
        if (vec_push(items, &item)) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* The marks the per-document rules count (quality._counted_reason, _line_reason), in this order: the names and
 * the order of pipeline.clean.wordscan.Mark, which reads them (tests/pipeline/clean/test_wordscan.py parses
 * this enum and compares). */
enum { MARK_HASH, MARK_DOTS, MARK_ELLIPSIS, MARK_NEWLINES, MARK_BULLET_LINES, MARK_ELLIPSIS_ENDS, MARKS };

static const Py_UCS4 BULLETS[] = {0x2022, 0x2023, 0x25E6, 0x2043, 0x25CF, 0x25AA, '-', '*', 0xB7, 0x2013};

/* Whether a bullet line starts at j: spaces and tabs, then a bullet (quality.BULLETS; BULLET_LINE_RE). */
static int bullet_at(const uint8_t *s, Py_ssize_t n, Py_ssize_t j) {
    while (j < n && (s[j] == ' ' || s[j] == '\t')) j++;
    if (j >= n) return 0;
    int size;
    Py_UCS4 cp = native_decode(s, j, n, &size);
    for (size_t k = 0; k < sizeof(BULLETS) / sizeof(BULLETS[0]); k++)
        if (cp == BULLETS[k]) return 1;
    return 0;
}

static inline int ends_with_ellipsis(const uint8_t *s, Py_ssize_t end) {
    if (end < 3) return 0;
    const uint8_t *t = s + end - 3;
    return (t[0] == '.' && t[1] == '.' && t[2] == '.') || (t[0] == 0xE2 && t[1] == 0x80 && t[2] == 0xA6);
}

/* The counts of text.count("#"), text.count("..."), text.count("…") (non-overlapping, as str.count), and
 * whether text.rstrip() ends with an ellipsis. */
static void count_marks(const uint8_t *s, Py_ssize_t n, int64_t *marks) {
    const uint8_t *p = s, *end = s + n;
    while ((p = memchr(p, '#', (size_t)(end - p))) != NULL) {
        marks[MARK_HASH]++;
        p++;
    }
    for (p = s; (p = memchr(p, '.', (size_t)(end - p))) != NULL;) {
        const uint8_t *q = p;
        while (q < end && *q == '.') q++;
        marks[MARK_DOTS] += (q - p) / 3;
        p = q;
    }
    for (p = s; (p = memchr(p, 0xE2, (size_t)(end - p))) != NULL; p++)
        if (end - p >= 3 && p[1] == 0x80 && p[2] == 0xA6) marks[MARK_ELLIPSIS]++;
    marks[MARK_ELLIPSIS_ENDS] += ends_with_ellipsis(s, native_rstrip(s, 0, n));
}

typedef struct {
    Vec hashes, lengths, lines, paras;
    uint64_t *table;
    size_t slots;
} Scan;

/* The repeat table, at least 2 * items + 2 slots (a power of two), zeroed. */
static int reserve_table(Scan *sc, size_t items) {
    size_t need = 2;
    while (need < 2 * items + 2) need <<= 1;
    if (need <= sc->slots) return 0;
    free(sc->table);
    sc->table = calloc(need, sizeof(uint64_t));
    sc->slots = sc->table ? need : 0;
    return sc->table ? 0 : -1;
}

/* The word being scanned: where it started (-1: between words), its characters, whether one is alphabetic. */
typedef struct {
    Py_ssize_t start;
    int64_t chars;
    int alpha;
} Word;

/* Ends the word being scanned (if one is) at end: appends it, adds its hash to its line and paragraph, counts
 * it (and, if it holds a letter, in *alpha_words); -1 when the reserved room is full. */
static inline int end_word(Scan *sc, const uint8_t *s, Py_ssize_t n, Word *word, Py_ssize_t end, Stretch *line,
                            Stretch *para, Py_ssize_t *words, int64_t *alpha_words) {
    if (word->start < 0) return 0;
    uint64_t h = word_hash(s, n, word->start, end);
    if (push_word(&sc->hashes, &sc->lengths, h, word->chars)) return -1;
    line->sum += h;
    para->sum += h;
    (*words)++;
    *alpha_words += word->alpha;
    word->start = -1;
    return 0;
}

static inline void start_word(Word *word, Py_ssize_t at) {
    if (word->start < 0) *word = (Word){at, 0, 0};
}

static Py_ssize_t word_room_error(void) {
    PyErr_SetString(PyExc_RuntimeError, "scan_words: more words than n / 2 + 1 in n bytes (a kernel bug)");
    return -1;
}

/* Scans one document: appends its words; returns its word count (-1 with the error set: out of memory, or a
 * broken bound) and sets *cjk, *alpha (its words with a letter, CJK ones included), *ok. */
static Py_ssize_t scan_one(Scan *sc, const uint8_t *s, Py_ssize_t n, const double *limits, int64_t *cjk,
                           int64_t *alpha, int *ok, int64_t *marks) {
    Py_ssize_t words = 0;
    Word word = {-1, 0, 0};
    Stretch line = {0, 0, 0}, para = {0, 0, 0};
    sc->lines.size = sc->paras.size = 0;
    if (vec_reserve(&sc->hashes, (size_t)n / 2 + 1) || vec_reserve(&sc->lengths, (size_t)n / 2 + 1)) {
        PyErr_NoMemory();
        return -1;
    }
    *cjk = *alpha = 0;
    memset(marks, 0, MARKS * sizeof(int64_t));
    count_marks(s, n, marks);
    marks[MARK_BULLET_LINES] += bullet_at(s, n, 0);
    for (Py_ssize_t i = 0; i <= n;) {
        int size = 1, separator = 1;
        Py_UCS4 cp = '\n';  /* past the end: the document's end closes everything */
        if (i < n) {
            uint8_t b = s[i];
            if (BYTE_CLASS[b] == 0) {  /* a run of ASCII word bytes */
                Py_ssize_t j = i + 1;
                while (j < n && BYTE_CLASS[s[j]] == 0) j++;
                start_word(&word, i);
                for (Py_ssize_t k = i; k < j && !word.alpha; k++) word.alpha = ASCII_ALPHA[s[k]];
                word.chars += j - i;
                line.chars += j - i;
                para.chars += j - i;
                i = j;
                continue;
            }
            if (BYTE_CLASS[b] == 1) {  /* whitespace: ends a word */
                if (end_word(sc, s, n, &word, i, &line, &para, &words, alpha)) return word_room_error();
                line.chars++;
                para.chars++;
                i++;
                continue;
            }
            if (b < 0x80) {
                cp = b;
                separator = 1;
            } else {
                cp = native_decode(s, i, n, &size);
                if (cp == NATIVE_BAD_CHAR) {
                    PyErr_SetString(PyExc_RuntimeError, "scan_words: UTF-8 cut short at the end of a text");
                    return -1;
                }
                int wide = is_cjk(cp);
                *cjk += wide;
                *alpha += wide && Py_UNICODE_ISALPHA(cp) != 0;
                separator = wide || Py_UNICODE_ISSPACE(cp);
            }
        }
        if (separator) {
            if (end_word(sc, s, n, &word, i, &line, &para, &words, alpha)) return word_room_error();
        } else {
            start_word(&word, i);
            word.chars++;
            if (!word.alpha) word.alpha = Py_UNICODE_ISALPHA(cp) != 0;
        }
        if (cp != '\n') {
            line.chars++;
            para.chars++;
            i += size;
            continue;
        }
        Py_ssize_t run = 0;  /* a newline (or the end): the line ends; a run of two or more ends the paragraph */
        while (i + run < n && s[i + run] == '\n') run++;
        if (run) {  /* only the first newline of a run follows a character, only the last precedes one */
            marks[MARK_NEWLINES] += run;
            marks[MARK_ELLIPSIS_ENDS] += ends_with_ellipsis(s, i);
            marks[MARK_BULLET_LINES] += bullet_at(s, n, i + run);
        }
        if (close_stretch(&sc->lines, &line, i)) return -1;
        int breaks = i >= n || i == 0 || run >= 2 || i + run >= n;
        if (breaks) {
            if (close_stretch(&sc->paras, &para, i)) return -1;
            para = (Stretch){i + (run ? run : 1), 0, 0};
        } else {
            para.chars++;
        }
        line = (Stretch){i + (run ? run : 1), 0, 0};
        i += run ? run : 1;
    }
    if (reserve_table(sc, sc->lines.size > sc->paras.size ? sc->lines.size : sc->paras.size)) {
        PyErr_NoMemory();
        return -1;
    }
    int lines_ok = items_pass((const Item *)sc->lines.data, sc->lines.size, limits[0], limits[1], sc->table,
                              sc->slots);
    int paras_ok = lines_ok == 1 ? items_pass((const Item *)sc->paras.data, sc->paras.size, limits[2], limits[3],
                                              sc->table, sc->slots)
                                 : lines_ok;
    if (paras_ok < 0) return -1;
    *ok = paras_ok;
    return words;
}

static PyObject *scan_words(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *texts;
    double limits[4];
    if (!PyArg_ParseTuple(args, "O!dddd", &PyList_Type, &texts, &limits[0], &limits[1], &limits[2], &limits[3]))
        return NULL;
    Py_ssize_t docs = PyList_GET_SIZE(texts);
    Scan sc = {{NULL, 0, 0, 8}, {NULL, 0, 0, 8}, {NULL, 0, 0, sizeof(Item)}, {NULL, 0, 0, sizeof(Item)}, NULL, 0};
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, docs * 8), *per_doc = PyBytes_FromStringAndSize(NULL, docs);
    PyObject *rep_ok = PyBytes_FromStringAndSize(NULL, docs), *cjk = PyBytes_FromStringAndSize(NULL, docs * 8);
    PyObject *alpha = PyBytes_FromStringAndSize(NULL, docs * 8);
    PyObject *marks = PyBytes_FromStringAndSize(NULL, docs * MARKS * 8);
    PyObject *result = NULL;
    if (!sizes || !per_doc || !rep_ok || !cjk || !alpha || !marks) goto done;
    for (Py_ssize_t d = 0; d < docs; d++) {
        PyObject *text = PyList_GET_ITEM(texts, d);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "scan_words: every text must be a str");
            goto done;
        }
        Py_ssize_t n;
        const uint8_t *s = native_utf8(text, &n);
        int64_t words = 0, wide = 0, letters = 0, *doc_marks = (int64_t *)PyBytes_AS_STRING(marks) + MARKS * d;
        int ok = 0, other = s == NULL;  /* a lone surrogate: the per-document path */
        memset(doc_marks, 0, MARKS * sizeof(int64_t));
        if (other && PyErr_Occurred()) goto done;
        if (!other) {
            Py_ssize_t found = scan_one(&sc, s, n, limits, &wide, &letters, &ok, doc_marks);
            if (found < 0) goto done;
            words = found;
        }
        memcpy(PyBytes_AS_STRING(sizes) + 8 * d, &words, 8);
        memcpy(PyBytes_AS_STRING(cjk) + 8 * d, &wide, 8);
        memcpy(PyBytes_AS_STRING(alpha) + 8 * d, &letters, 8);
        PyBytes_AS_STRING(per_doc)[d] = (char)other;
        PyBytes_AS_STRING(rep_ok)[d] = (char)ok;
    }
    PyObject *hashes = PyBytes_FromStringAndSize(sc.hashes.data, (Py_ssize_t)(sc.hashes.size * 8));
    PyObject *lengths = PyBytes_FromStringAndSize(sc.lengths.data, (Py_ssize_t)(sc.lengths.size * 8));
    if (hashes && lengths) result = PyTuple_Pack(8, hashes, lengths, sizes, per_doc, rep_ok, cjk, alpha, marks);
    Py_XDECREF(hashes);
    Py_XDECREF(lengths);
done:
    Py_XDECREF(sizes);
    Py_XDECREF(per_doc);
    Py_XDECREF(rep_ok);
    Py_XDECREF(cjk);
    Py_XDECREF(alpha);
    Py_XDECREF(marks);
    free(sc.hashes.data);
    free(sc.lengths.data);
    free(sc.lines.data);
    free(sc.paras.data);
    free(sc.table);
    return result;
}


/* ------------------------------------------------------------------ the n-gram screen
 *
 * screen_ngrams(hashes, lengths, sizes, pending, top, dup) -> flagged
 *
 * Per document (its words' hashes and lengths, as scan_words gives them; `sizes` the word counts, `pending`
 * one byte per document, 0: skip it) whether the n-gram rules may fail it: 0 proves that it passes them, so
 * only flagged documents need the exact rules (quality._fast_ngram_reason). `top`, `dup`: the (n, fraction)
 * pairs of QualityConfig.top_ngram_max_fraction and dup_ngram_max_fraction.
 *
 * n-grams are counted by key in a hash table per document; a key mixes the n words' hashes, so equal n-grams
 * have equal keys and counts can only be too high (keys that collide add up). From them, upper bounds:
 *  - top n-gram rule: count x characters of each n-gram. An n-gram occurs at most as often as its first word
 *    (or its (n-1)-gram prefix), so the bound from the shorter counts is tried first, and the n-gram table
 *    is only built when that bound is over the threshold.
 *  - repeated n-gram rules: the characters of the words covered by an n-gram whose key came earlier. As the
 *    exact rules run them in order of n, a bound over n's threshold flags the document and one at most the
 *    smallest threshold still to come proves it (the true coverage there is no higher, so the exact rules
 *    stop there and pass it).
 * Thresholds are taken times (1 - 1e-9) of the characters, so float rounding cannot clear a failing document.
 */
#define STEP 0xD6E8FEB86659FD93ULL
#define SLACK (1.0 - 1e-9)
#define MAX_RULES 32

typedef struct {
    uint64_t key;
    uint32_t count, first;
} Slot;

typedef struct {
    uint64_t *keys;   /* the n-gram keys of the document, by start */
    uint32_t *slot;   /* the slot of each start's key */
    int64_t *cum;     /* characters before each word */
    uint32_t *count1; /* each start's first-word count */
    Slot *table;
    size_t words, slots;
} Screen;

static int screen_reserve(Screen *sc, size_t words) {
    if (words <= sc->words) return 0;
    size_t slots = 2;
    while (slots < 2 * words) slots <<= 1;
    free(sc->keys);
    free(sc->slot);
    free(sc->cum);
    free(sc->count1);
    free(sc->table);
    sc->keys = malloc(words * sizeof(uint64_t));
    sc->slot = malloc(words * sizeof(uint32_t));
    sc->cum = malloc((words + 1) * sizeof(int64_t));
    sc->count1 = malloc(words * sizeof(uint32_t));
    sc->table = malloc(slots * sizeof(Slot));
    sc->words = words;
    sc->slots = slots;
    return sc->keys && sc->slot && sc->cum && sc->count1 && sc->table ? 0 : -1;
}

/* Counts the m keys of sc->keys in the table (2^k >= 2m slots): each start's slot, each slot's count and
 * first start; -1 with RuntimeError set when m is more than the room reserved. */
static int count_keys(Screen *sc, size_t m) {
    size_t slots = 2;
    while (slots < 2 * m) slots <<= 1;
    if (m > sc->words || slots > sc->slots) {  /* never: no document has more n-grams than words */
        PyErr_SetString(PyExc_RuntimeError, "screen_ngrams: more n-grams than words reserved (a kernel bug)");
        return -1;
    }
    size_t mask = slots - 1;
    memset(sc->table, 0, slots * sizeof(Slot));
    for (size_t p = 0; p < m; p++) {
        uint64_t key = sc->keys[p];
        size_t at = (size_t)((key * NATIVE_MIX) >> 40) & mask;
        while (sc->table[at].count && sc->table[at].key != key) at = (at + 1) & mask;
        if (!sc->table[at].count) {
            sc->table[at].key = key;
            sc->table[at].first = (uint32_t)p;
        }
        sc->table[at].count++;
        sc->slot[p] = (uint32_t)at;
    }
    return 0;
}

/* Whether some n-gram (starts 0..m-1) may score over `limit` by count x characters, with `count_of(p)` an upper
 * bound of the count of the n-gram at p (and only counts of 2 or more scoring, as the exact rule requires). */
static int top_over(const Screen *sc, size_t m, size_t n, const uint32_t *bound, int from_table, double limit) {
    for (size_t p = 0; p < m; p++) {
        uint32_t c = from_table ? sc->table[sc->slot[p]].count : bound[p];
        if (c >= 2 && (double)c * (double)(sc->cum[p + n] - sc->cum[p]) > limit) return 1;
    }
    return 0;
}

/* The characters of the words covered by an n-gram start (0..m-1) whose key came earlier. */
static int64_t covered_chars(const Screen *sc, size_t m, size_t n) {
    int64_t covered = 0;
    size_t until = 0; /* words before `until` are counted already */
    for (size_t p = 0; p < m; p++) {
        if (sc->table[sc->slot[p]].first >= p) continue;
        size_t from = p > until ? p : until, to = p + n;
        if (to > from) covered += sc->cum[to] - sc->cum[from];
        if (to > until) until = to;
    }
    return covered;
}

/* 1: the document may fail an n-gram rule; 0: it passes them all; -1: an error is set. */
static int screen_one(Screen *sc, const uint64_t *hashes, const int64_t *lengths, size_t w, const long *top_n,
                      const double *top_f, size_t n_top, const long *dup_n, const double *dup_f, size_t n_dup) {
    sc->cum[0] = 0;
    for (size_t i = 0; i < w; i++) sc->cum[i + 1] = sc->cum[i] + lengths[i];
    double chars = (double)sc->cum[w] * SLACK;
    size_t max_n = 0;
    for (size_t k = 0; k < n_top; k++) max_n = (size_t)top_n[k] > max_n ? (size_t)top_n[k] : max_n;
    for (size_t k = 0; k < n_dup; k++) max_n = (size_t)dup_n[k] > max_n ? (size_t)dup_n[k] : max_n;
    if (max_n > w) max_n = w;
    /* n = 1: each word's count bounds the top rules of every n until a table of n-grams is built */
    for (size_t p = 0; p < w; p++) sc->keys[p] = hashes[p] * NATIVE_MIX;
    if (count_keys(sc, w)) return -1;
    for (size_t p = 0; p < w; p++) sc->count1[p] = sc->table[sc->slot[p]].count;
    int built = 1, undecided = n_dup > 0; /* built: the table holds the current n's counts */
    size_t last_top = 0;
    for (size_t k = 0; k < n_top; k++) last_top = (size_t)top_n[k] > last_top ? (size_t)top_n[k] : last_top;
    uint32_t *bound = sc->count1; /* the shorter n-grams' counts, where no table of this n is built */
    for (size_t n = 1; n <= max_n; n++) {
        size_t m = w - n + 1;
        if (n > 1) {
            for (size_t p = 0; p < m; p++) sc->keys[p] = sc->keys[p] * STEP + hashes[p + n - 1] * NATIVE_MIX;
            built = 0;
        }
        for (size_t k = 0; k < n_top; k++) {
            if ((size_t)top_n[k] != n) continue;
            double limit = top_f[k] * chars;
            if (n == 1 || top_over(sc, m, n, bound, 0, limit)) { /* the bound is not enough: count them */
                if (!built) {
                    if (count_keys(sc, m)) return -1;
                    built = 1;
                }
                if (top_over(sc, m, n, NULL, 1, limit)) return 1;
                for (size_t p = 0; p < m; p++) bound[p] = sc->table[sc->slot[p]].count; /* tighter from now */
            }
        }
        for (size_t k = 0; k < n_dup && undecided; k++) {
            if ((size_t)dup_n[k] != n) continue;
            double least = dup_f[k];
            for (size_t j = k; j < n_dup; j++) least = dup_f[j] < least ? dup_f[j] : least;
            int64_t covered = 0;
            if (m > 1) {
                if (!built) {
                    if (count_keys(sc, m)) return -1;
                    built = 1;
                }
                covered = covered_chars(sc, m, n);
            }
            if ((double)covered > dup_f[k] * chars) return 1;
            undecided = (double)covered > least * chars;
        }
        if (n >= last_top && !undecided) break;
    }
    return 0;
}

static int read_rules(PyObject *pairs, long *ns, double *fs, size_t *count) {
    PyObject *seq = PySequence_Fast(pairs, "screen_ngrams: rules must be a sequence of (n, fraction)");
    if (!seq) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k > MAX_RULES) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "screen_ngrams: too many rules");
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ld", &ns[i], &fs[i]) || ns[i] < 1) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "screen_ngrams: n must be >= 1");
            Py_DECREF(seq);
            return -1;
        }
    }
    *count = (size_t)k;
    Py_DECREF(seq);
    return 0;
}

static PyObject *screen_ngrams(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer hashes, lengths, sizes, pending;
    PyObject *top, *dup;
    if (!PyArg_ParseTuple(args, "y*y*y*y*OO", &hashes, &lengths, &sizes, &pending, &top, &dup)) return NULL;
    PyObject *result = NULL;
    Screen sc = {NULL, NULL, NULL, NULL, NULL, 0, 0};
    long top_n[MAX_RULES], dup_n[MAX_RULES];
    double top_f[MAX_RULES], dup_f[MAX_RULES];
    size_t n_top = 0, n_dup = 0;
    if (read_rules(top, top_n, top_f, &n_top) || read_rules(dup, dup_n, dup_f, &n_dup)) goto done;
    if (native_check_items(&hashes, 8, "screen_ngrams: hashes") ||
        native_check_items(&lengths, 8, "screen_ngrams: lengths") ||
        native_check_items(&sizes, 8, "screen_ngrams: sizes"))
        goto done;
    Py_ssize_t docs = sizes.len / 8, words = hashes.len / 8;
    const int64_t *size = sizes.buf;
    if (lengths.len != hashes.len || pending.len != docs) {
        PyErr_SetString(PyExc_ValueError, "screen_ngrams: arrays of different lengths");
        goto done;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t d = 0; d < docs; d++) {
        if (size[d] < 0 || size[d] > words - at) {
            PyErr_SetString(PyExc_ValueError, "screen_ngrams: word counts past the words");
            goto done;
        }
        if ((uint64_t)size[d] > UINT32_MAX / 2) {  /* the table's slots and counts are 32-bit */
            PyErr_SetString(PyExc_ValueError, "screen_ngrams: a document of more than 2^31 words");
            goto done;
        }
        at += size[d];
    }
    result = PyBytes_FromStringAndSize(NULL, docs);
    if (!result) goto done;
    char *flagged = PyBytes_AS_STRING(result);
    at = 0;
    for (Py_ssize_t d = 0; d < docs; d++) {
        size_t w = (size_t)size[d];
        flagged[d] = 0;
        if (((const char *)pending.buf)[d] && w >= 1) {
            if (screen_reserve(&sc, w)) {
                Py_CLEAR(result);
                PyErr_NoMemory();
                goto done;
            }
            int maybe = screen_one(&sc, (const uint64_t *)hashes.buf + at, (const int64_t *)lengths.buf + at, w,
                                   top_n, top_f, n_top, dup_n, dup_f, n_dup);
            if (maybe < 0) {
                Py_CLEAR(result);
                goto done;
            }
            flagged[d] = (char)maybe;
        }
        at += (Py_ssize_t)w;
    }
done:
    free(sc.keys);
    free(sc.slot);
    free(sc.cum);
    free(sc.count1);
    free(sc.table);
    PyBuffer_Release(&hashes);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&pending);
    return result;
}


/* ------------------------------------------------------------------ the stop-word count
 *
 * count_stop_words(text, words, need) -> int
 *
 * How many tokens of text (str.split()'s) are one of `words` (a tuple of lowercase ASCII str) once stripped of
 * the characters at either end that are not alphanumeric (Py_UNICODE_ISALNUM) and lowercased (str.lower); the
 * count stops at `need`. -1: text has a lone surrogate (no UTF-8 form), the caller counts in Python. Exact for
 * ASCII words: the only non-ASCII character whose str.lower() is ASCII is the Kelvin sign (U+212A -> 'k'); a
 * core with any other non-ASCII character cannot equal an ASCII word.
 */
/* Whether the character at s[i] (i < n) is alphanumeric; its byte length in *size. */
static inline int is_alnum_at(const uint8_t *s, Py_ssize_t i, Py_ssize_t n, int *size) {
    if (s[i] < 0x80) {
        *size = 1;
        return ASCII_ALNUM[s[i]];
    }
    return Py_UNICODE_ISALNUM(native_decode(s, i, n, size)) != 0;
}

/* Whether the core s[start:end] lowercased is one of the words (each `size` bytes, `count` of them). */
static int is_stop_word(const uint8_t *s, Py_ssize_t start, Py_ssize_t end, const char *const *words,
                        const Py_ssize_t *sizes, Py_ssize_t count, Py_ssize_t longest) {
    char lower[64];
    Py_ssize_t k = 0;
    for (Py_ssize_t i = start; i < end; k++) {
        if (k >= longest || k >= (Py_ssize_t)sizeof(lower)) return 0;
        if (s[i] < 0x80) {
            lower[k] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
            i++;
        } else if (s[i] == 0xE2 && i + 3 <= end && s[i + 1] == 0x84 && s[i + 2] == 0xAA) {
            lower[k] = 'k';  /* U+212A KELVIN SIGN */
            i += 3;
        } else {
            return 0;
        }
    }
    for (Py_ssize_t w = 0; w < count; w++)
        if (sizes[w] == k && memcmp(words[w], lower, (size_t)k) == 0) return 1;
    return 0;
}

static PyObject *count_stop_words(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *text, *tuple;
    Py_ssize_t need, n, count = 0, longest = 0;
    if (!PyArg_ParseTuple(args, "UO!n", &text, &PyTuple_Type, &tuple, &need)) return NULL;
    Py_ssize_t nwords = PyTuple_GET_SIZE(tuple);
    if (nwords > 256) {
        PyErr_SetString(PyExc_ValueError, "count_stop_words: at most 256 words");
        return NULL;
    }
    const char *words[256];
    Py_ssize_t sizes[256];
    for (Py_ssize_t w = 0; w < nwords; w++) {
        words[w] = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(tuple, w), &sizes[w]);
        if (!words[w]) return NULL;
        if (sizes[w] > 63) {
            PyErr_SetString(PyExc_ValueError, "count_stop_words: a word of at most 63 characters");
            return NULL;
        }
        if (sizes[w] > longest) longest = sizes[w];
    }
    const uint8_t *s = native_utf8(text, &n);
    if (!s) return PyErr_Occurred() ? NULL : PyLong_FromLong(-1);
    Py_ssize_t i = 0;
    while (i < n && count < need) {
        Py_ssize_t start = i;  /* a token runs to the next whitespace */
        int step = 1, size;  /* the byte length of the character at i (at the end: the whitespace) */
        while (i < n) {
            uint8_t b = s[i];
            if (BYTE_CLASS[b] == 0) {
                i++;
                continue;
            }
            step = 1;
            if (b < 0x80 || Py_UNICODE_ISSPACE(native_decode(s, i, n, &step))) break;
            i += step;
        }
        Py_ssize_t end = i, core = start;
        if (end > start) {
            while (core < end && !is_alnum_at(s, core, end, &size)) core += size;
            while (end > core && !is_alnum_at(s, native_char_before(s, core, end), end, &size))
                end = native_char_before(s, core, end);
            if (end > core && end - core <= 3 * longest)
                count += is_stop_word(s, core, end, words, sizes, nwords, longest);
        }
        if (i < n) i += step; /* past the whitespace that ended the token */
    }
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"scan_words", scan_words, METH_VARARGS, "The words, word counts and repetition bounds of documents."},
    {"screen_ngrams", screen_ngrams, METH_VARARGS, "Whether the n-gram rules may fail each document."},
    {"count_stop_words", count_stop_words, METH_VARARGS, "Tokens that are stop words, up to a number."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wordscan",
                                    "The compiled word scan of the quality rules (see pipeline/clean/_wordscan.c).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__wordscan(void) {
    for (int b = 0; b < 256; b++) {
        BYTE_CLASS[b] = b >= 0x80 ? 3 : b == '\n' ? 2 : Py_UNICODE_ISSPACE(b) ? 1 : 0;
        ASCII_ALPHA[b] = b < 0x80 && Py_UNICODE_ISALPHA(b);
        ASCII_ALNUM[b] = b < 0x80 && Py_UNICODE_ISALNUM(b);
    }
    return PyModule_Create(&module);
}
