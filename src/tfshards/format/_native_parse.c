/* outline_examples: many tf.train.Example records parsed without the GIL,
 * for a verdict and the kind, count and first value of the features asked for.
 *
 * The reference is tfshards.format.exampleparser.outline: this accepts
 * exactly the records it accepts, and a record refused here goes back to it
 * for the words of the problem.
 */
#include "_native.h"

#include <string.h>

/* The varint at ``*pos`` inside [.., end): its low 64 bits in ``*out``.
 * 0 when it is truncated or longer than MAX_VARINT_BYTES. */
static int get_varint(const uint8_t *b, int64_t *pos, int64_t end, uint64_t *out) {
    uint64_t v = 0;
    int64_t a = *pos;
    for (int k = 0; k < MAX_VARINT_BYTES; k++) {
        if (a >= end) return 0;
        uint8_t c = b[a++];
        v |= (uint64_t)(c & 0x7f) << (7 * k); /* bits past 64 fall off, as in the reference */
        if (c < 0x80) {
            *out = v;
            *pos = a;
            return 1;
        }
    }
    return 0;
}

/* The field at ``*pos`` of a message ending at ``end``: its number and its
 * contents [*start, *stop); 0 unless it is length-delimited and fits. */
static int next_field(const uint8_t *b, int64_t *pos, int64_t end, uint64_t *num, int64_t *start,
                      int64_t *stop) {
    uint64_t key, length;
    if (!get_varint(b, pos, end, &key) || (key & 7) != WIRE_LEN) return 0;
    if (!get_varint(b, pos, end, &length) || length > (uint64_t)(end - *pos)) return 0;
    *num = key >> 3;
    *start = *pos;
    *stop = *pos + (int64_t)length;
    *pos = *stop;
    return 1;
}

/* 1 when every field of the message [start, end) is length-delimited and fits. */
static int well_framed(const uint8_t *b, int64_t start, int64_t end) {
    uint64_t num;
    int64_t s, e;
    while (start < end)
        if (!next_field(b, &start, end, &num, &s, &e)) return 0;
    return 1;
}

/* 1 when [p, p + n) is UTF-8 that Python's strict decoder accepts. */
static int utf8_ok(const uint8_t *p, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        int len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (len == 0 || i + len > n) return 0;
        for (int k = 1; k < len; k++)
            if ((p[i + k] & 0xc0) != 0x80) return 0;
        if ((c == 0xe0 && p[i + 1] < 0xa0) || (c == 0xed && p[i + 1] > 0x9f) ||
            (c == 0xf0 && p[i + 1] < 0x90) || (c == 0xf4 && p[i + 1] > 0x8f))
            return 0; /* overlong, a surrogate, past U+10FFFF */
        i += len;
    }
    return 1;
}

typedef struct {
    uint8_t kind;  /* KIND_BYTES, KIND_FLOAT or KIND_INT64; 0: no such feature */
    int64_t count; /* values */
    int64_t a, b;  /* bytes: the first value's span; int64: the first value, and 1 if any */
} Found;

/* One Feature message [start, end), as exampleparser._feature reads it: its
 * first field says the kind. 0 when the reference refuses it. */
static int outline_feature(const uint8_t *b, int64_t start, int64_t end, Found *out) {
    Found f = {KIND_BYTES, 0, 0, 0};
    uint64_t kind, num;
    int64_t pos = start, ls, le, vs, ve;
    if (!well_framed(b, start, end)) return 0;
    if (start < end) {
        next_field(b, &pos, end, &kind, &ls, &le);
        if (kind < KIND_BYTES || kind > KIND_INT64 || !well_framed(b, ls, le)) return 0;
        f.kind = (uint8_t)kind;
        for (pos = ls; pos < le;) {
            next_field(b, &pos, le, &num, &vs, &ve);
            if (kind == KIND_BYTES) {
                if (f.count == 0) {
                    f.a = vs;
                    f.b = ve;
                }
                f.count++;
            } else if (kind == KIND_FLOAT) {
                f.count += ve - vs;
            } else {
                for (int64_t at = vs; at < ve; f.count++) {
                    uint64_t v;
                    if (!get_varint(b, &at, ve, &v)) return 0;
                    if (!f.b) {
                        f.a = (int64_t)v;
                        f.b = 1;
                    }
                }
            }
        }
        if (kind == KIND_FLOAT) {
            if (f.count % FLOAT_BYTES) return 0;
            f.count /= FLOAT_BYTES;
        }
    }
    *out = f;
    return 1;
}

typedef struct {
    const char *key;
    int64_t len;
} Key;

/* One Example [start, end), as exampleparser.outline reads it: every feature
 * parsed, the ``keys`` asked for kept in ``found`` (a repeated key: the last
 * wins). 0 when the reference refuses it. */
static int outline_example(const uint8_t *b, int64_t start, int64_t end, const Key *keys,
                           Py_ssize_t nk, Found *found) {
    uint64_t num;
    int64_t pos = start, fs, fe;
    if (!well_framed(b, start, end)) return 0;
    while (pos < end) {
        next_field(b, &pos, end, &num, &fs, &fe);
        if (num != 1) continue;
        if (!well_framed(b, fs, fe)) return 0;
        for (int64_t at = fs, es, ee; at < fe;) {
            next_field(b, &at, fe, &num, &es, &ee);
            if (num != 1) continue;
            if (!well_framed(b, es, ee)) return 0;
            Found feature = {KIND_BYTES, 0, 0, 0};
            int64_t ks = 0, ke = 0;
            for (int64_t q = es, ps, pe; q < ee;) {
                next_field(b, &q, ee, &num, &ps, &pe);
                if (num == 1) {
                    if (!utf8_ok(b + ps, pe - ps)) return 0;
                    ks = ps;
                    ke = pe;
                } else if (num == 2 && !outline_feature(b, ps, pe, &feature)) {
                    return 0;
                }
            }
            for (Py_ssize_t k = 0; k < nk; k++)
                if (keys[k].len == ke - ks && memcmp(keys[k].key, b + ks, (size_t)(ke - ks)) == 0) {
                    found[k] = feature;
                    break;
                }
        }
    }
    return 1;
}

/* outline_examples(buffer, starts, ends, keys) -> (ok, kinds, counts, firsts)
 *
 * Parses each record buffer[start:end] (int64 ``starts`` and ``ends``) as
 * tfshards.format.exampleparser.outline does, for the feature names ``keys``
 * (a tuple of UTF-8 bytes). ``ok`` is one byte per record (0: the reference
 * raises for it, and words why); per record and key, ``kinds`` (one byte: 1
 * bytes, 2 float, 3 int64, 0 absent), ``counts`` (int64: values) and
 * ``firsts`` (two int64: the first bytes value's span, or the first int64
 * value and 1; zeros for none). */
PyObject *outline_examples(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, ends;
    PyObject *keys;
    if (!PyArg_ParseTuple(args, "y*y*y*O!", &buf, &starts, &ends, &PyTuple_Type, &keys))
        return NULL;
    PyObject *result = NULL, *ok = NULL, *kinds = NULL, *counts = NULL, *firsts = NULL;
    Py_ssize_t n = starts.len / 8, nk = PyTuple_GET_SIZE(keys);
    Key *key = PyMem_Malloc(sizeof(Key) * (size_t)(nk + 1));
    Found *found = PyMem_Malloc(sizeof(Found) * (size_t)(nk + 1));
    if (key == NULL || found == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!spans_inside(&buf, &starts, &ends)) goto done;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *name = PyTuple_GET_ITEM(keys, k);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "outline_examples: keys must be bytes");
            goto done;
        }
        key[k].key = PyBytes_AS_STRING(name);
        key[k].len = (int64_t)PyBytes_GET_SIZE(name);
    }
    const int64_t *s = starts.buf, *e = ends.buf;
    ok = PyBytes_FromStringAndSize(NULL, n);
    kinds = PyBytes_FromStringAndSize(NULL, n * nk);
    counts = PyBytes_FromStringAndSize(NULL, n * nk * 8);
    firsts = PyBytes_FromStringAndSize(NULL, n * nk * 16);
    if (ok == NULL || kinds == NULL || counts == NULL || firsts == NULL) goto done;
    uint8_t *okp = (uint8_t *)PyBytes_AS_STRING(ok), *kp = (uint8_t *)PyBytes_AS_STRING(kinds);
    int64_t *cp = (int64_t *)PyBytes_AS_STRING(counts);
    int64_t *fp = (int64_t *)PyBytes_AS_STRING(firsts);
    const uint8_t *b = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        memset(found, 0, sizeof(Found) * (size_t)nk);
        int good = outline_example(b, s[i], e[i], key, nk, found);
        okp[i] = (uint8_t)good;
        for (Py_ssize_t k = 0; k < nk; k++) {
            Found f = good ? found[k] : (Found){0, 0, 0, 0};
            kp[i * nk + k] = f.kind;
            cp[i * nk + k] = f.count;
            fp[(i * nk + k) * 2] = f.a;
            fp[(i * nk + k) * 2 + 1] = f.b;
        }
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(4, ok, kinds, counts, firsts);
done:
    Py_XDECREF(ok);
    Py_XDECREF(kinds);
    Py_XDECREF(counts);
    Py_XDECREF(firsts);
    PyMem_Free(key);
    PyMem_Free(found);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}

