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

PyObject *scan_folder(PyObject *self, PyObject *args); /* below: the listing's folder read */
PyObject *fsencode_all(PyObject *self, PyObject *args); /* below */

static PyMethodDef methods[] = {
    {"scan_folder", scan_folder, METH_VARARGS, "scan_folder(folder) -> (names, kinds, hidden)"},
    {"fsencode_all", fsencode_all, METH_VARARGS, "fsencode_all(names) -> [os.fsencode(n), ...]"},
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

/* ----------------------------------------- the listing's walk: scan_folder, fsencode_all
 * scan_folder(folder) -> (names, kinds, hidden): one folder read for the
 * listing's sorted walk (tfshards.listing.sortedwalk) in one call, readdir
 * and sort without the GIL. ``names`` (str, decoded as os.fsdecode does) are
 * the folder's entries but "." and ".." and the hidden ones (starting with
 * "."; ``hidden`` counts them), sorted by their bytes (UTF-8: codepoint
 * order, as Python sorts str); per name one byte of ``kinds``: 'f' a regular
 * file, 'd' a folder, '?' anything else or unknown (a symlink: the caller
 * stats it). An unreadable folder raises OSError.
 *
 * fsencode_all(names) -> list: os.fsencode of each str, for stat_files and
 * hash_files (a Python loop of os.fsencode took 0.12 s per 200,000 names). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    size_t at;        /* offset of the name in the arena while it grows */
    const char *name; /* the name, once the arena is complete */
    size_t len;
    char kind;
} ScanEntry;

static int scan_cmp(const void *a, const void *b) {
    return strcmp(((const ScanEntry *)a)->name, ((const ScanEntry *)b)->name);
}

/* Read every entry of ``dir`` into ``*entries`` (names in ``*arena``); 0 or an errno. */
static int scan_entries(DIR *dir, ScanEntry **entries, char **arena, size_t *count,
                        Py_ssize_t *hidden) {
    size_t n = 0, cap = 0, used = 0, room = 0;
    struct dirent *d;
    errno = 0;
    while ((d = readdir(dir)) != NULL) {
        const char *name = d->d_name;
        if (name[0] == '.') {
            if (name[1] != '\0' && !(name[1] == '.' && name[2] == '\0')) (*hidden)++;
            errno = 0;
            continue;
        }
        size_t len = strlen(name);
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            ScanEntry *grown = realloc(*entries, cap * sizeof(ScanEntry));
            if (grown == NULL) return ENOMEM;
            *entries = grown;
        }
        if (used + len + 1 > room) {
            room = 2 * (used + len + 1) + 4096;
            char *grown = realloc(*arena, room);
            if (grown == NULL) return ENOMEM;
            *arena = grown;
        }
        memcpy(*arena + used, name, len + 1);
        (*entries)[n].at = used;
        (*entries)[n].len = len;
        (*entries)[n].kind = d->d_type == DT_REG ? 'f' : d->d_type == DT_DIR ? 'd' : '?';
        used += len + 1;
        *count = ++n;
        errno = 0;
    }
    if (errno) return errno;
    for (size_t i = 0; i < n; i++) (*entries)[i].name = *arena + (*entries)[i].at;
    if (n > 1) qsort(*entries, n, sizeof(ScanEntry), scan_cmp);
    return 0;
}

PyObject *scan_folder(PyObject *self, PyObject *args) {
    const char *folder;
    if (!PyArg_ParseTuple(args, "y", &folder)) return NULL;
    ScanEntry *entries = NULL;
    char *arena = NULL;
    size_t n = 0;
    Py_ssize_t hidden = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    int dir_fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = dir_fd < 0 ? NULL : fdopendir(dir_fd);
    if (dir == NULL) {
        err = errno;
        if (dir_fd >= 0) close(dir_fd);
    } else {
        err = scan_entries(dir, &entries, &arena, &n, &hidden);
        closedir(dir);
    }
    Py_END_ALLOW_THREADS
    PyObject *names = NULL, *kinds = NULL, *result = NULL;
    if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, folder);
        goto done;
    }
    names = PyList_New((Py_ssize_t)n);
    kinds = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (names == NULL || kinds == NULL) goto done;
    for (size_t i = 0; i < n; i++) {
        PyObject *name = PyUnicode_DecodeFSDefaultAndSize(entries[i].name,
                                                          (Py_ssize_t)entries[i].len);
        if (name == NULL) goto done;
        PyList_SET_ITEM(names, (Py_ssize_t)i, name);
        PyBytes_AS_STRING(kinds)[i] = entries[i].kind;
    }
    result = Py_BuildValue("(NNn)", names, kinds, hidden);
    names = kinds = NULL;
done:
    Py_XDECREF(names);
    Py_XDECREF(kinds);
    free(entries);
    free(arena);
    return result;
}

PyObject *fsencode_all(PyObject *self, PyObject *args) {
    PyObject *names;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &names)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        PyObject *encoded = PyUnicode_Check(name) ? PyUnicode_EncodeFSDefault(name) : NULL;
        if (encoded == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "fsencode_all: names must be str");
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, encoded);
    }
    return out;
}
