/* The language-ID automaton walk and feature counts of pipeline.clean.langid, compiled.
 *
 * py3langid's model is an Aho-Corasick automaton over byte n-grams: after each byte it moves to the next
 * state and emits that state's feature (or none). FastIdentifier's numpy walk computes every position's state
 * from the start state over the last STATE_DEPTH bytes (five gathers per byte); this loop follows the
 * automaton one byte at a time, as py3langid's own Python loop does, and reaches the same states (the tests
 * compare the two on real and random bytes). Each document's emitted features are then counted and written
 * out in increasing feature order with their counts: exactly the sorted distinct features and counts that
 * FastIdentifier._score derives with numpy, so the scores that follow (numpy's matmul over the same rows) are
 * bitwise the same.
 *
 * walk_counts(next_row, next_feature, root_row, depth, num_features, data, offsets, out_features, out_counts,
 *             out_offsets) -> entries written
 *   next_row, next_feature: int32 tables, one entry per (state, byte): the row of the next state and the
 *       feature it emits (-1: none); an entry is found at (row of the current state) + byte.
 *   depth: the most bytes any state stands for (pipeline.clean.langid.STATE_DEPTH).
 *   data: the documents' bytes, one after another; offsets: int64, document d is data[offsets[d]:offsets[d+1]].
 *   out_features, out_counts: int32, as long as data at least; out_offsets: int64, one more than the documents:
 *       document d's distinct features and counts are out_*[out_offsets[d]:out_offsets[d+1]].
 * A table entry out of range (a corrupt table) raises ValueError. The GIL is released during the walk.
 */
#include "../_native.h"

#define LANES 8
/* What walk_one answers when it stops: a table entry out of range, or more entries than the room left. */
#define WALK_CORRUPT (-1)
#define WALK_NO_ROOM (-2)

/* Counts one emitted feature (branch-free but for the range check: whether a feature is new is unpredictable,
 * and marking it seen again costs less than a mispredicted branch); returns 0, or -1 out of range. */
static inline int count_feature(int32_t feature, int32_t num_features, int32_t *counts, uint64_t *seen,
                                Py_ssize_t *lo_word, Py_ssize_t *hi_word) {
    if (feature < 0) return 0;
    if (feature >= num_features) return -1;
    Py_ssize_t word = feature >> 6;
    counts[feature]++;
    seen[word] |= (uint64_t)1 << (feature & 63);
    *lo_word = word < *lo_word ? word : *lo_word;
    *hi_word = word > *hi_word ? word : *hi_word;
    return 0;
}

/* Walks one document of n bytes; returns the number of entries written at out, at most `room` (WALK_CORRUPT: a
 * table entry out of range; WALK_NO_ROOM: more distinct features than room, which n <= room rules out). Following the automaton is a chain of dependent loads from tables of ~40 MB, so the document is
 * cut into LANES stretches walked side by side, whose loads overlap. A stretch starts in the state that
 * the `depth` bytes before it lead to from the start state: that is the automaton's state there, as no state
 * stands for more than `depth` bytes (the deepest n-gram; pipeline.clean.langid.STATE_DEPTH, tested against the
 * model). */
static Py_ssize_t walk_one(const int32_t *next_row, const int32_t *next_feature, Py_ssize_t table_len,
                           int32_t root, int32_t depth, int32_t num_features, const uint8_t *bytes,
                           Py_ssize_t n, int32_t *counts, uint64_t *seen, int32_t *out_features,
                           int32_t *out_counts, Py_ssize_t room) {
    Py_ssize_t lo_word = PY_SSIZE_T_MAX, hi_word = -1, k = 0;
    int lanes = n >= 16 * LANES ? LANES : 1;
    Py_ssize_t stretch = (n + lanes - 1) / lanes, pos[LANES], end[LANES];
    int64_t row[LANES];
    for (int j = 0; j < lanes; j++) {
        pos[j] = j * stretch;
        end[j] = pos[j] + stretch < n ? pos[j] + stretch : n;
        row[j] = root;
        for (Py_ssize_t i = pos[j] - depth > 0 ? pos[j] - depth : 0; i < pos[j]; i++) {  /* no features */
            int64_t at = row[j] + bytes[i];
            if (at < 0 || at >= table_len) return WALK_CORRUPT;
            row[j] = next_row[at];
        }
    }
    /* the walk and the counting in blocks of 64 steps: the walk's loads and the counts' increments each run
     * without the other's competing for the cache (about 15% faster than counting as it goes) */
    int32_t emitted[LANES * 64];
    for (Py_ssize_t step = 0; step < stretch; step += 64) {
        Py_ssize_t steps = stretch - step < 64 ? stretch - step : 64, e = 0;
        if (steps * lanes > LANES * 64) return WALK_NO_ROOM; /* never: a block is 64 steps of each lane */
        for (Py_ssize_t t = 0; t < steps; t++) {
            for (int j = 0; j < lanes; j++) {
                if (pos[j] >= end[j]) continue;
                int64_t at = row[j] + bytes[pos[j]++];
                if (at < 0 || at >= table_len) return WALK_CORRUPT;
                row[j] = next_row[at];
                emitted[e++] = next_feature[at];
            }
        }
        for (Py_ssize_t q = 0; q < e; q++)
            if (count_feature(emitted[q], num_features, counts, seen, &lo_word, &hi_word)) return WALK_CORRUPT;
    }
    for (Py_ssize_t word = lo_word; word <= hi_word; word++) {
        uint64_t bits = seen[word];
        while (bits) {
            int32_t feature = (int32_t)(word * 64 + __builtin_ctzll(bits));
            if (k >= room) return WALK_NO_ROOM;
            out_features[k] = feature;
            out_counts[k++] = counts[feature];
            counts[feature] = 0;
            bits &= bits - 1;
        }
        seen[word] = 0;
    }
    return k;
}

static PyObject *walk_counts(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer next_row, next_feature, data, offsets, out_features, out_counts, out_offsets;
    int root, depth, num_features;
    if (!PyArg_ParseTuple(args, "y*y*iiiy*y*w*w*w*", &next_row, &next_feature, &root, &depth, &num_features, &data,
                          &offsets, &out_features, &out_counts, &out_offsets))
        return NULL;
    PyObject *result = NULL;
    int32_t *counts = NULL;
    uint64_t *seen = NULL;
    if (native_check_items(&next_row, 4, "walk_counts: next_row") ||
        native_check_items(&next_feature, 4, "walk_counts: next_feature") ||
        native_check_items(&offsets, 8, "walk_counts: offsets") ||
        native_check_items(&out_features, 4, "walk_counts: out_features") ||
        native_check_items(&out_counts, 4, "walk_counts: out_counts") ||
        native_check_items(&out_offsets, 8, "walk_counts: out_offsets"))
        goto done;
    Py_ssize_t table_len = next_row.len / 4, docs = offsets.len / 8 - 1;
    const int64_t *off = (const int64_t *)offsets.buf;
    if (next_feature.len != next_row.len || num_features <= 0 || depth < 1 || docs < 0 || out_offsets.len / 8 < docs + 1 ||
        out_features.len / 4 < data.len || out_counts.len / 4 < data.len) {
        PyErr_SetString(PyExc_ValueError, "walk_counts: tables or output buffers of the wrong size");
        goto done;
    }
    for (Py_ssize_t d = 0; d < docs; d++) {
        if (off[d] < 0 || off[d] > off[d + 1] || off[d + 1] > data.len) {
            PyErr_SetString(PyExc_ValueError, "walk_counts: offsets out of order or past the data");
            goto done;
        }
    }
    counts = calloc((size_t)num_features, sizeof(int32_t));
    seen = calloc((size_t)num_features / 64 + 1, sizeof(uint64_t));
    if (!counts || !seen) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0, written = 0, room = out_features.len / 4 < out_counts.len / 4 ? out_features.len / 4
                                                                                         : out_counts.len / 4;
    int64_t *out_off = (int64_t *)out_offsets.buf;
    Py_BEGIN_ALLOW_THREADS;
    out_off[0] = 0;
    for (Py_ssize_t d = 0; d < docs; d++) {
        written = walk_one((const int32_t *)next_row.buf, (const int32_t *)next_feature.buf, table_len, root,
                           depth, num_features, (const uint8_t *)data.buf + off[d], off[d + 1] - off[d], counts, seen,
                           (int32_t *)out_features.buf + total, (int32_t *)out_counts.buf + total,
                           room - total);
        if (written < 0) break;
        total += written;
        out_off[d + 1] = total;
    }
    Py_END_ALLOW_THREADS;
    if (written == WALK_CORRUPT) {
        PyErr_SetString(PyExc_ValueError, "walk_counts: a table entry points outside the tables (corrupt tables)");
        goto done;
    }
    if (written < 0) {
        PyErr_SetString(PyExc_RuntimeError, "walk_counts: more distinct features than bytes (a kernel bug)");
        goto done;
    }
    result = PyLong_FromSsize_t(total);
done:
    free(counts);
    free(seen);
    PyBuffer_Release(&next_row);
    PyBuffer_Release(&next_feature);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&out_features);
    PyBuffer_Release(&out_counts);
    PyBuffer_Release(&out_offsets);
    return result;
}

static PyMethodDef methods[] = {
    {"walk_counts", walk_counts, METH_VARARGS,
     "Walk the automaton over each document; write its sorted distinct features and their counts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_langid_walk",
                                    "The compiled language-ID automaton walk (see pipeline/clean/_langid_walk.c).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__langid_walk(void) { return PyModule_Create(&module); }
