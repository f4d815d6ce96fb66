/* Byte-level BPE training, compiled: counting a part's words, and the merges from the merged counts
 * (the Python reference: pipeline/tokenize/bpe_train.py, the same results, tested).
 *
 * count_words(texts) -> (blob, ends, counts)
 *   Every text split as the GPT-2 pattern of byte-level BPE splits it
 *       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   (letters: Py_UNICODE_ISALPHA, the L categories; numbers: Py_UNICODE_ISNUMERIC and not a letter, the N
 *   categories; whitespace: Unicode's White_Space, what the regex crate's \s is), and each distinct word's
 *   UTF-8 bytes counted. Returned in the order first seen: the words' bytes concatenated, their ends (int64)
 *   and counts (int64), as bytes for numpy.frombuffer. A text with a lone surrogate raises ValueError.
 *
 * train_merges(blob, ends, counts, new_tokens, min_frequency) -> bytes
 *   The merges of byte-level BPE over those words (byte b is token b; merged tokens get 256, 257, ... in
 *   order): each step merges the adjacent pair of the highest count (a pair counted once per position it
 *   holds, times its word's count; ties: the smallest (left, right) ids), every occurrence in every word, left
 *   to right. A merge whose bytes an earlier token has already gets that token's id (no new token). Stops after
 *   new_tokens new tokens, or when the best count is below min_frequency. As int32 triples (left, right, id).
 *   The result depends on the counts only, not on the words' order.
 */
#include "../_native.h"

/* ------------------------------------------------------------------ growable arrays */

typedef struct {
    char *data;
    size_t size, cap, item;
} Vec;

static int vec_reserve(Vec *v, size_t want) {
    if (want <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 16;
    while (cap < want) cap *= 2;
    char *grown = realloc(v->data, cap * v->item);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    v->data = grown;
    v->cap = cap;
    return 0;
}

static int vec_push(Vec *v, const void *value) {
    if (vec_reserve(v, v->size + 1) < 0) return -1;
    memcpy(v->data + v->size * v->item, value, v->item);
    v->size++;
    return 0;
}

/* ------------------------------------------------------------------ the GPT-2 split */

enum { C_SPACE, C_LETTER, C_NUMBER, C_OTHER };

static inline int is_white(Py_UCS4 c) {
    if (c == 0x20 || (c >= 0x09 && c <= 0x0D)) return 1;
    if (c < 0x85) return 0;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static inline int char_class(Py_UCS4 c) {
    if (c < 0x80) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return C_LETTER;
        if (c >= '0' && c <= '9') return C_NUMBER;
        return is_white(c) ? C_SPACE : C_OTHER;
    }
    if (is_white(c)) return C_SPACE;
    if (Py_UNICODE_ISALPHA(c)) return C_LETTER;
    if (Py_UNICODE_ISNUMERIC(c)) return C_NUMBER;
    return C_OTHER;
}

static inline Py_ssize_t utf8_size(Py_UCS4 c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

/* The end (in code points) of the word that starts at i of a text of n code points. */
static Py_ssize_t word_end(int kind, const void *data, Py_ssize_t i, Py_ssize_t n) {
    Py_UCS4 c = PyUnicode_READ(kind, data, i);
    if (c == '\'' && i + 1 < n) {
        Py_UCS4 c1 = PyUnicode_READ(kind, data, i + 1);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
        if (i + 2 < n) {
            Py_UCS4 c2 = PyUnicode_READ(kind, data, i + 2);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
        }
    }
    Py_ssize_t j = i;
    int cls = char_class(c);
    if (c == ' ' && i + 1 < n) {
        int next = char_class(PyUnicode_READ(kind, data, i + 1));
        if (next != C_SPACE) {  /* ` ?X+`: the space, then the run of the next character's class */
            cls = next;
            j = i + 1;
        }
    }
    if (cls != C_SPACE) {
        j++;
        while (j < n && char_class(PyUnicode_READ(kind, data, j)) == cls) j++;
        return j;
    }
    while (j < n && is_white(PyUnicode_READ(kind, data, j))) j++;
    if (j == n || j - i == 1) return j;  /* \s+(?!\S) to the end; else \s+ of one */
    return j - 1;                        /* \s+(?!\S): the run but its last, which goes with the next word */
}

/* ------------------------------------------------------------------ counting words */

typedef struct {
    Vec blob;     /* char: the distinct words' bytes */
    Vec ends;     /* int64 */
    Vec counts;   /* int64 */
    Vec hashes;   /* uint64 */
    int64_t *slots; /* index + 1 into ends, 0: empty */
    size_t mask;
} WordTable;

static int table_grow(WordTable *t) {
    size_t cap = t->slots ? 2 * (t->mask + 1) : 1 << 16;
    int64_t *slots = calloc(cap, sizeof(int64_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    const uint64_t *hashes = (const uint64_t *)t->hashes.data;
    for (size_t k = 0; k < t->hashes.size; k++) {
        size_t at = (size_t)(hashes[k] * NATIVE_MIX) & (cap - 1);
        while (slots[at]) at = (at + 1) & (cap - 1);
        slots[at] = (int64_t)k + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->mask = cap - 1;
    return 0;
}

static int table_add(WordTable *t, const uint8_t *word, size_t len) {
    uint64_t h = native_xxh64(word, len);
    const int64_t *ends = (const int64_t *)t->ends.data;
    size_t at = (size_t)(h * NATIVE_MIX) & t->mask;
    for (int64_t k; (k = t->slots[at]) != 0; at = (at + 1) & t->mask) {
        k--;
        int64_t start = k ? ends[k - 1] : 0;
        if (((uint64_t *)t->hashes.data)[k] == h && (size_t)(ends[k] - start) == len &&
            memcmp(t->blob.data + start, word, len) == 0) {
            ((int64_t *)t->counts.data)[k]++;
            return 0;
        }
    }
    int64_t one = 1, end = (int64_t)(t->blob.size + len);
    if (vec_reserve(&t->blob, t->blob.size + len) < 0) return -1;
    memcpy(t->blob.data + t->blob.size, word, len);
    t->blob.size += len;
    if (vec_push(&t->ends, &end) < 0 || vec_push(&t->counts, &one) < 0 || vec_push(&t->hashes, &h) < 0) return -1;
    t->slots[at] = (int64_t)t->ends.size;
    if (2 * t->ends.size > t->mask) return table_grow(t);
    return 0;
}

static int count_text(WordTable *t, PyObject *text) {
    Py_ssize_t size;
    const uint8_t *utf8 = native_utf8(text, &size);
    if (utf8 == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "count_words: a text holds a lone surrogate");
        return -1;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i = 0, at = 0;
    while (i < n) {
        Py_ssize_t j = word_end(kind, data, i, n), bytes = 0;
        if (kind == PyUnicode_1BYTE_KIND && PyUnicode_IS_ASCII(text)) {
            bytes = j - i;
        } else {
            for (Py_ssize_t k = i; k < j; k++) bytes += utf8_size(PyUnicode_READ(kind, data, k));
        }
        if (table_add(t, utf8 + at, (size_t)bytes) < 0) return -1;
        at += bytes;
        i = j;
    }
    return 0;
}

static PyObject *count_words(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *texts;
    if (!PyArg_ParseTuple(args, "O!:count_words", &PyList_Type, &texts)) return NULL;
    WordTable t = {{NULL, 0, 0, 1}, {NULL, 0, 0, 8}, {NULL, 0, 0, 8}, {NULL, 0, 0, 8}, NULL, 0};
    PyObject *out = NULL;
    if (table_grow(&t) < 0) goto done;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(texts); k++) {
        PyObject *text = PyList_GET_ITEM(texts, k);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "count_words: texts must be a list of str");
            goto done;
        }
        if (count_text(&t, text) < 0) goto done;
    }
    out = Py_BuildValue("(y#y#y#)", t.blob.data ? t.blob.data : "", (Py_ssize_t)t.blob.size,
                        t.ends.data ? t.ends.data : "", (Py_ssize_t)(t.ends.size * 8),
                        t.counts.data ? t.counts.data : "", (Py_ssize_t)(t.counts.size * 8));
done:
    free(t.blob.data);
    free(t.ends.data);
    free(t.counts.data);
    free(t.hashes.data);
    free(t.slots);
    return out;
}

/* ------------------------------------------------------------------ training */

/* A pair's entry: its count, and the words where it was formed (a word may be listed twice, or no longer
 * hold the pair: the merge looks). */
typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX: empty */
    int64_t count;
    uint32_t pushed; /* the last merge step that pushed it onto the heap */
    Vec where;    /* int32 word indices */
} PairEntry;

typedef struct {
    PairEntry *slots;
    size_t mask, used;
} PairTable;

#define EMPTY_KEY UINT64_MAX

static int pairs_init(PairTable *p, size_t cap) {
    p->slots = malloc(cap * sizeof(PairEntry));
    if (p->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < cap; k++) p->slots[k].key = EMPTY_KEY;
    p->mask = cap - 1;
    p->used = 0;
    return 0;
}

static PairEntry *pairs_find(PairTable *p, uint64_t key) {
    size_t at = (size_t)((key ^ (key >> 29)) * NATIVE_MIX >> 16) & p->mask;
    while (p->slots[at].key != EMPTY_KEY && p->slots[at].key != key) at = (at + 1) & p->mask;
    return &p->slots[at];
}

/* The entry of key, made (count 0) when new; NULL with MemoryError when the table cannot grow. */
static PairEntry *pairs_get(PairTable *p, uint64_t key) {
    PairEntry *e = pairs_find(p, key);
    if (e->key == key) return e;
    if (2 * (p->used + 1) > p->mask) {
        PairTable bigger;
        if (pairs_init(&bigger, 2 * (p->mask + 1)) < 0) return NULL;
        for (size_t k = 0; k <= p->mask; k++)
            if (p->slots[k].key != EMPTY_KEY) *pairs_find(&bigger, p->slots[k].key) = p->slots[k];
        bigger.used = p->used;
        free(p->slots);
        *p = bigger;
        e = pairs_find(p, key);
    }
    e->key = key;
    e->count = 0;
    e->pushed = 0;
    e->where = (Vec){NULL, 0, 0, sizeof(int32_t)};
    p->used++;
    return e;
}

/* The heap of (count, key): the highest count first, then the smallest key. Entries go stale as counts
 * fall; a popped entry whose count is no longer its pair's goes back with the pair's count. */
typedef struct {
    int64_t count;
    uint64_t key;
} HeapItem;

static inline int heap_before(HeapItem a, HeapItem b) {
    return a.count > b.count || (a.count == b.count && a.key < b.key);
}

static int heap_push(Vec *h, HeapItem item) {
    if (vec_push(h, &item) < 0) return -1;
    HeapItem *a = (HeapItem *)h->data;
    size_t i = h->size - 1;
    while (i > 0 && heap_before(a[i], a[(i - 1) / 2])) {
        HeapItem tmp = a[i];
        a[i] = a[(i - 1) / 2];
        a[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
    return 0;
}

static HeapItem heap_pop(Vec *h) {
    HeapItem *a = (HeapItem *)h->data, top = a[0];
    a[0] = a[--h->size];
    size_t i = 0, n = h->size;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < n && heap_before(a[l], a[best])) best = l;
        if (r < n && heap_before(a[r], a[best])) best = r;
        if (best == i) break;
        HeapItem tmp = a[i];
        a[i] = a[best];
        a[best] = tmp;
        i = best;
    }
    return top;
}

typedef struct {
    int32_t *syms;   /* every word's symbols, words at offsets */
    int64_t *start;  /* word w: syms[start[w] : start[w] + len[w]] */
    int32_t *len;
    const int64_t *counts;
    int32_t nwords;
    PairTable pairs;
    Vec heap;        /* HeapItem */
    Vec tokens;      /* Vec of (offset, length) into tokbytes: each token's bytes */
    Vec tokbytes;    /* char */
} Trainer;

static inline uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

/* Add sign * count to every adjacent pair of word w; where a pair gains and note is set, list w under it. */
static int count_word_pairs(Trainer *t, int32_t w, int64_t sign, int note_token) {
    const int32_t *s = t->syms + t->start[w];
    for (int32_t k = 0; k + 1 < t->len[w]; k++) {
        PairEntry *e = pairs_get(&t->pairs, pair_key(s[k], s[k + 1]));
        if (e == NULL) return -1;
        e->count += sign * t->counts[w];
        if (sign > 0 && (note_token < 0 || s[k] == note_token || s[k + 1] == note_token))
            if (vec_push(&e->where, &w) < 0) return -1;
    }
    return 0;
}

/* Replace every (a, b) of word w, left to right, by id; 1 if it held one. */
static int merge_word(Trainer *t, int32_t w, int32_t a, int32_t b, int32_t id) {
    int32_t *s = t->syms + t->start[w], n = t->len[w], out = 0;
    int found = 0;
    for (int32_t k = 0; k < n; k++) {
        if (k + 1 < n && s[k] == a && s[k + 1] == b) {
            s[out++] = id;
            k++;
            found = 1;
        } else {
            s[out++] = s[k];
        }
    }
    t->len[w] = out;
    return found;
}

typedef struct {
    int64_t offset, length;
} TokenSpan;

/* The id of the token whose bytes are those of a then b: an existing one, or a new one (*is_new = 1). */
static int32_t token_of(Trainer *t, int32_t a, int32_t b, int *is_new) {
    TokenSpan *spans = (TokenSpan *)t->tokens.data;
    TokenSpan sa = spans[a], sb = spans[b];
    int64_t length = sa.length + sb.length;
    if (vec_reserve(&t->tokbytes, t->tokbytes.size + (size_t)length) < 0) return -1;
    char *bytes = t->tokbytes.data;
    memcpy(bytes + t->tokbytes.size, bytes + sa.offset, (size_t)sa.length);
    memcpy(bytes + t->tokbytes.size + sa.length, bytes + sb.offset, (size_t)sb.length);
    /* an earlier token of the same bytes: tokens of equal length are few once merges are long; a linear scan of
     * the tokens keeps this simple and costs a vocabulary's length per merge */
    for (size_t k = 256; k < t->tokens.size; k++) {
        if (spans[k].length == length &&
            memcmp(bytes + spans[k].offset, bytes + t->tokbytes.size, (size_t)length) == 0) {
            *is_new = 0;
            return (int32_t)k;
        }
    }
    TokenSpan span = {(int64_t)t->tokbytes.size, length};
    t->tokbytes.size += (size_t)length;
    if (vec_push(&t->tokens, &span) < 0) return -1;
    *is_new = 1;
    return (int32_t)(t->tokens.size - 1);
}

static int trainer_setup(Trainer *t, const uint8_t *blob, const int64_t *ends, Py_ssize_t nwords, int64_t blob_len) {
    t->nwords = (int32_t)nwords;
    t->syms = malloc((size_t)(blob_len ? blob_len : 1) * sizeof(int32_t));
    t->start = malloc((size_t)(nwords ? nwords : 1) * sizeof(int64_t));
    t->len = malloc((size_t)(nwords ? nwords : 1) * sizeof(int32_t));
    if (t->syms == NULL || t->start == NULL || t->len == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t k = 0; k < blob_len; k++) t->syms[k] = blob[k];
    for (Py_ssize_t w = 0; w < nwords; w++) {
        t->start[w] = w ? ends[w - 1] : 0;
        t->len[w] = (int32_t)(ends[w] - t->start[w]);
    }
    if (vec_reserve(&t->tokbytes, 256) < 0) return -1;
    for (int k = 0; k < 256; k++) {
        TokenSpan span = {k, 1};
        t->tokbytes.data[k] = (char)k;
        if (vec_push(&t->tokens, &span) < 0) return -1;
    }
    t->tokbytes.size = 256;
    if (pairs_init(&t->pairs, 1 << 16) < 0) return -1;
    for (int32_t w = 0; w < t->nwords; w++)
        if (count_word_pairs(t, w, 1, -1) < 0) return -1;
    for (size_t k = 0; k <= t->pairs.mask; k++) {
        PairEntry *e = &t->pairs.slots[k];
        if (e->key != EMPTY_KEY && e->count > 0 && heap_push(&t->heap, (HeapItem){e->count, e->key}) < 0) return -1;
    }
    return 0;
}

/* One merge of (a, b) into a token; its triple goes to merges. */
static int merge_step(Trainer *t, uint64_t key, int64_t min_frequency, Vec *merges, int *made_new,
                      uint32_t *stamp, uint32_t step) {
    int32_t a = (int32_t)(key >> 32), b = (int32_t)(key & 0xFFFFFFFFu);
    int32_t id = token_of(t, a, b, made_new);
    if (id < 0) return -1;
    int32_t triple[3] = {a, b, id};
    for (int k = 0; k < 3; k++)
        if (vec_push(merges, &triple[k]) < 0) return -1;
    PairEntry *e = pairs_find(&t->pairs, key);
    Vec where = e->where;  /* taken: the pair's list is rebuilt where the merge forms it again */
    e->where = (Vec){NULL, 0, 0, sizeof(int32_t)};
    const int32_t *words = (const int32_t *)where.data;
    int rc = 0;
    for (size_t k = 0; k < where.size && rc == 0; k++) {
        int32_t w = words[k];
        if (stamp[w] == step) continue;
        stamp[w] = step;
        if (count_word_pairs(t, w, -1, -1) < 0) { rc = -1; break; }
        merge_word(t, w, a, b, id);
        /* every pair the merge formed holds id: those are listed and pushed; the others only fell */
        if (count_word_pairs(t, w, 1, id) < 0) rc = -1;
    }
    for (size_t k = 0; k < where.size && rc == 0; k++) {
        const int32_t *s = t->syms + t->start[words[k]];
        int32_t n = t->len[words[k]];
        for (int32_t j = 0; j + 1 < n && rc == 0; j++) {
            if (s[j] != id && s[j + 1] != id) continue;
            PairEntry *f = pairs_find(&t->pairs, pair_key(s[j], s[j + 1]));
            if (f->pushed == step) continue;
            f->pushed = step;
            if (f->count >= min_frequency && heap_push(&t->heap, (HeapItem){f->count, f->key}) < 0) rc = -1;
        }
    }
    free(where.data);
    return rc;
}

static PyObject *train_merges(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer blob, ends, counts;
    Py_ssize_t new_tokens;
    long long min_frequency;
    if (!PyArg_ParseTuple(args, "y*y*y*nL:train_merges", &blob, &ends, &counts, &new_tokens, &min_frequency))
        return NULL;
    Trainer t;
    memset(&t, 0, sizeof(t));
    t.heap.item = sizeof(HeapItem);
    t.tokens.item = sizeof(TokenSpan);
    t.tokbytes.item = 1;
    Vec merges = {NULL, 0, 0, sizeof(int32_t)};
    uint32_t *stamp = NULL;
    PyObject *out = NULL;
    Py_ssize_t nwords = ends.len / 8;
    if (native_check_items(&ends, 8, "train_merges: ends") < 0 ||
        native_check_items(&counts, 8, "train_merges: counts") < 0)
        goto done;
    if (counts.len != ends.len || nwords > INT32_MAX - 1 ||
        (nwords && ((const int64_t *)ends.buf)[nwords - 1] != blob.len)) {
        PyErr_SetString(PyExc_ValueError, "train_merges: ends and counts must match the words of blob");
        goto done;
    }
    for (Py_ssize_t w = 0; w < nwords; w++) {
        int64_t lo = w ? ((const int64_t *)ends.buf)[w - 1] : 0, hi = ((const int64_t *)ends.buf)[w];
        if (hi < lo || hi - lo > INT32_MAX || ((const int64_t *)counts.buf)[w] < 0) {
            PyErr_SetString(PyExc_ValueError, "train_merges: ends must grow and counts be >= 0");
            goto done;
        }
    }
    t.counts = (const int64_t *)counts.buf;
    if (trainer_setup(&t, (const uint8_t *)blob.buf, (const int64_t *)ends.buf, nwords, blob.len) < 0) goto done;
    stamp = calloc((size_t)(nwords ? nwords : 1), sizeof(uint32_t));
    if (stamp == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t made = 0;
    uint32_t step = 0;
    while (made < new_tokens && t.heap.size > 0) {
        HeapItem top = heap_pop(&t.heap);
        int64_t now = pairs_find(&t.pairs, top.key)->count;
        if (now != top.count) {
            if (now >= min_frequency && now > 0 && heap_push(&t.heap, (HeapItem){now, top.key}) < 0) goto done;
            continue;
        }
        if (now < min_frequency || now < 1) break;
        int made_new = 0;
        if (merge_step(&t, top.key, min_frequency, &merges, &made_new, stamp, ++step) < 0) goto done;
        made += made_new;
    }
    out = PyBytes_FromStringAndSize(merges.data ? merges.data : "", (Py_ssize_t)(merges.size * sizeof(int32_t)));
done:
    if (t.pairs.slots != NULL)
        for (size_t k = 0; k <= t.pairs.mask; k++)
            if (t.pairs.slots[k].key != EMPTY_KEY) free(t.pairs.slots[k].where.data);
    free(t.pairs.slots);
    free(t.heap.data);
    free(t.tokens.data);
    free(t.tokbytes.data);
    free(t.syms);
    free(t.start);
    free(t.len);
    free(stamp);
    free(merges.data);
    PyBuffer_Release(&blob);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&counts);
    return out;
}

static PyMethodDef METHODS[] = {
    {"count_words", count_words, METH_VARARGS, "A list of texts' GPT-2 words: (blob, ends, counts)."},
    {"train_merges", train_merges, METH_VARARGS, "Byte-level BPE merges from word counts: int32 triples."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_bpe", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__bpe(void) { return PyModule_Create(&MODULE); }
