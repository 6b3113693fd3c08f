/* tfshards.format._native: the per-record loops of the writer and the
 * validator, in C, without the GIL. This file is the module table; the loops
 * are in the files named beside each function.
 *
 * Optional: setup.py builds it when a C compiler and OpenSSL's headers are
 * there, and tfshards.format.native falls back to the pure-Python loops when it is
 * missing (or when TFSHARDS_PURE_PYTHON=1). Both produce the same bytes and
 * the same findings; the tests run both.
 *
 *   frame_files       (_native_frame.c) read local files straight into their
 *                     slots in a buffer, as framed tf.train.Example records of
 *                     the base features (payload, label, path, sha256 of the payload)
 *   scan_frames       (_native_scan.c) walk a shard's TFRecord framing, checking both CRCs
 *   frame_offsets     (_native_scan.c) walk a TFRecord stream's lengths only:
 *                     where each whole record starts
 *   outline_examples  (_native_parse.c) parse many tf.train.Example records: verdict,
 *                     and the kind, count and first value of the features asked for
 *   hash_files        (_native_files.c) SHA-256 and size of many files of one folder
 *   stat_files        (_native_files.c) stat of many files of one folder
 *   read_lines        (_native_files.c) many lines of a stored listing by line number
 *
 * CRC-32C is in _native_crc32c.c, the shared constants in _native.h.
 *
 * The Python reference of each format rule is in tfshards/format/
 * (example.encode, tfrecord.scan, exampleparser.outline); these accept and
 * find exactly what it does, and the differential tests pit them against
 * each other. Problems are worded by the reference only: a record refused
 * here is handed back to it.
 *
 * Every function releases the GIL while it works, so two threads run two
 * shards on two cores with no process pool to start.
 */
#include "_native.h"

#include "_native_crc32c.h"

static PyObject *hash_spans(PyObject *self, PyObject *args); /* below, after PyInit */

static PyMethodDef methods[] = {
    {"frame_files", frame_files, METH_VARARGS,
     "frame_files(buffer, used, dir_fd, rels, labels, sizes, start, keys, roles"
     "[, expected[, images]])"
     " -> (next, used, error, found)"},
    {"hash_files", hash_files, METH_VARARGS, "hash_files(folder, names) -> (digests, sizes)"},
    {"stat_files", stat_files, METH_VARARGS, "stat_files(folder, names) -> stats"},
    {"frame_offsets", frame_offsets, METH_VARARGS, "frame_offsets(buffer) -> (offsets, end)"},
    {"scan_frames", scan_frames, METH_VARARGS, "scan_frames(buffer) -> (offsets, data_ok, end)"},
    {"outline_examples", outline_examples, METH_VARARGS,
     "outline_examples(buffer, starts, ends, keys) -> (ok, kinds, counts, firsts)"},
    {"read_lines", read_lines, METH_VARARGS, "read_lines(idx_fd, lines_fd, indices) -> (text, bad)"},
    {"hash_spans", hash_spans, METH_VARARGS, "hash_spans(buffer, starts, ends) -> digests"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "tfshards' per-record loops in C (see tfshards.format.native).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    return PyModule_Create(&module);
}

/* hash_spans(buffer, starts, ends) -> digests: the 32-byte SHA-256 of each
 * buffer[start:end] (int64 ``starts`` and ``ends``), one after another, without
 * the GIL: the validator's sha256 rule over a window's payloads in one call. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

static PyObject *hash_spans(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &buf, &starts, &ends)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = starts.len / 8;
    const int64_t *s = starts.buf, *e = ends.buf;
    if (starts.len % 8 || ends.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > buf.len) {
            PyErr_Format(PyExc_ValueError, "span %zd [%lld:%lld] is outside a buffer of %zd bytes",
                         i, (long long)s[i], (long long)e[i], buf.len);
            goto done;
        }
    }
    out = PyBytes_FromStringAndSize(NULL, n * SHA256_DIGEST_LENGTH);
    if (out == NULL) goto done;
    uint8_t *d = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *b = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        SHA256(b + s[i], (size_t)(e[i] - s[i]), d + i * SHA256_DIGEST_LENGTH);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return out;
}
