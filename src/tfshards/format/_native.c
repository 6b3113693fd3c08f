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
 *   image_headers     (_native_imagehead.c) format, width, height and channels of
 *                     many images from their header bytes, without decoding them
 *   image_records     (_native_imagehead.c) the same for each record of a framed
 *                     buffer, with its size and its path's span and hash
 *   images_refused        (_native_imagehead.c) which of many JPEG and PNG images stop
 *                     before their format's end
 *   hash_files        (_native_files.c) SHA-256 and size of many files of one folder
 *   stat_files        (_native_files.c) stat of many files of one folder
 *   read_lines        (_native_files.c) many lines of a stored listing by line number
 *   match_members     (_native_members.c) where each line of a grown version's
 *                     previous member lists is in the new listing
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
static PyObject *hash_spans(PyObject *self, PyObject *args); /* below, after PyInit */

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
    {"match_members", match_members, METH_VARARGS,
     "match_members(listing, files, keep, members) -> [indices | None, ...] | None"},
    {"hash_spans", hash_spans, METH_VARARGS, "hash_spans(buffer, starts, ends) -> digests"},
    {"image_headers", image_headers, METH_VARARGS,
     "image_headers(buffer, starts, ends) -> int64 (format, width, height, channels) each"},
    {"image_records", image_records, METH_VARARGS,
     "image_records(buffer, payload_key, path_key) -> (rows, end)"},
    {"images_refused", images_refused, METH_VARARGS,
     "images_refused(buffer, starts, ends) -> one format code a span (0: not cut short)"},
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

/* hash_spans(buffer, starts, ends) -> digests: the 32-byte SHA-256 of each
 * buffer[start:end] (int64 ``starts`` and ``ends``), one after another, without
 * the GIL: the validator's sha256 rule over a window's payloads in one call.
 *
 * With AVX2, eight spans are hashed at once, one in each 32-bit lane (a lane
 * that finishes takes the next span); without it, OpenSSL's SHA256 one by one.
 * On 4 KB payloads without SHA instructions the lanes are several times faster. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <immintrin.h>
#include <openssl/sha.h>
#include <string.h>

static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};
static const uint32_t SHA_IV[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

typedef struct {
    Py_ssize_t item; /* the span it hashes; -1: idle */
    const uint8_t *data;
    int64_t len, full, blocks, done; /* bytes; whole 64-byte blocks in the data; all; hashed */
    uint8_t tail[128];               /* the last bytes, the 0x80, zeros and the bit length */
} Lane;

static void lane_take(Lane *l, Py_ssize_t item, const uint8_t *data, int64_t len) {
    l->item = item;
    l->data = data;
    l->len = len;
    l->full = len / 64;
    l->blocks = (len + 9 + 63) / 64;
    l->done = 0;
    int64_t rest = len - l->full * 64, tail = (l->blocks - l->full) * 64;
    memset(l->tail, 0, sizeof l->tail);
    memcpy(l->tail, data + l->full * 64, (size_t)rest);
    l->tail[rest] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int k = 0; k < 8; k++) l->tail[tail - 1 - k] = (uint8_t)(bits >> (8 * k));
}

static const uint8_t *lane_block(const Lane *l) {
    return l->done < l->full ? l->data + l->done * 64 : l->tail + (l->done - l->full) * 64;
}

#define XOR3(a, b, c) _mm256_xor_si256(_mm256_xor_si256(a, b), c)

/* One 64-byte block of each lane: ``w`` its 16 words by lane, ``st`` the state by lane.
 * Compiled twice: rotating with two shifts (AVX2), or in one instruction (AVX-512VL). */
#define SHA_BLOCKS8(name, target_isa)                                                         \
    __attribute__((target(target_isa))) static void name(uint32_t st[8][8], uint32_t w[16][8]) {   \
    __m256i W[64], v[8];                                                                           \
    for (int t = 0; t < 16; t++) W[t] = _mm256_loadu_si256((const __m256i *)w[t]);                 \
    for (int t = 16; t < 64; t++) {                                                                \
        __m256i a = W[t - 15], b = W[t - 2];                                                       \
        __m256i s0 = XOR3(ROR(a, 7), ROR(a, 18), _mm256_srli_epi32(a, 3));                         \
        __m256i s1 = XOR3(ROR(b, 17), ROR(b, 19), _mm256_srli_epi32(b, 10));                       \
        W[t] = _mm256_add_epi32(_mm256_add_epi32(s1, W[t - 7]), _mm256_add_epi32(s0, W[t - 16]));  \
    }                                                                                              \
    for (int k = 0; k < 8; k++) v[k] = _mm256_loadu_si256((const __m256i *)st[k]);                 \
    __m256i a = v[0], b = v[1], c = v[2], d = v[3], e = v[4], f = v[5], g = v[6], h = v[7];        \
    for (int t = 0; t < 64; t++) {                                                                 \
        __m256i ch = _mm256_xor_si256(_mm256_and_si256(e, f), _mm256_andnot_si256(e, g));          \
        __m256i t1 = _mm256_add_epi32(h, XOR3(ROR(e, 6), ROR(e, 11), ROR(e, 25)));                 \
        t1 = _mm256_add_epi32(t1, _mm256_add_epi32(ch, _mm256_add_epi32(                           \
                                      _mm256_set1_epi32((int)SHA_K[t]), W[t])));                   \
        __m256i maj = _mm256_or_si256(_mm256_and_si256(a, b), _mm256_and_si256(c, _mm256_or_si256(a, b))); \
        __m256i t2 = _mm256_add_epi32(XOR3(ROR(a, 2), ROR(a, 13), ROR(a, 22)), maj);               \
        h = g;                                                                                     \
        g = f;                                                                                     \
        f = e;                                                                                     \
        e = _mm256_add_epi32(d, t1);                                                               \
        d = c;                                                                                     \
        c = b;                                                                                     \
        b = a;                                                                                     \
        a = _mm256_add_epi32(t1, t2);                                                              \
    }                                                                                              \
    __m256i out[8] = {a, b, c, d, e, f, g, h};                                                     \
    for (int k = 0; k < 8; k++)                                                                    \
        _mm256_storeu_si256((__m256i *)st[k], _mm256_add_epi32(v[k], out[k]));                     \
    }


#define ROR(x, n) _mm256_or_si256(_mm256_srli_epi32(x, n), _mm256_slli_epi32(x, 32 - (n)))
SHA_BLOCKS8(sha_blocks8_avx2, "avx2")
#undef ROR
#define ROR(x, n) _mm256_ror_epi32(x, n)
SHA_BLOCKS8(sha_blocks8_avx512, "avx2,avx512f,avx512vl")
#undef ROR

/* The digests of n spans, eight lanes at a time (AVX2). */
static void sha_spans8(const uint8_t *b, const int64_t *s, const int64_t *e, Py_ssize_t n,
                       uint8_t *out, int avx512) {
    Lane lane[8];
    uint32_t st[8][8], w[16][8];
    static const uint8_t idle[64];
    Py_ssize_t next = 0;
    for (int j = 0; j < 8; j++) {
        lane[j].item = -1;
        if (next < n) {
            lane_take(&lane[j], next, b + s[next], e[next] - s[next]);
            next++;
        }
        for (int k = 0; k < 8; k++) st[k][j] = SHA_IV[k];
    }
    for (;;) {
        int busy = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *p = lane[j].item < 0 ? idle : lane_block(&lane[j]);
            busy |= lane[j].item >= 0;
            for (int t = 0; t < 16; t++) {
                uint32_t x;
                memcpy(&x, p + 4 * t, 4);
                w[t][j] = __builtin_bswap32(x); /* big-endian words (x86 is little-endian) */
            }
        }
        if (!busy) return;
        if (avx512)
            sha_blocks8_avx512(st, w);
        else
            sha_blocks8_avx2(st, w);
        for (int j = 0; j < 8; j++) {
            Lane *l = &lane[j];
            if (l->item < 0 || ++l->done < l->blocks) continue;
            uint8_t *d = out + l->item * SHA256_DIGEST_LENGTH;
            for (int k = 0; k < 8; k++) {
                uint32_t x = st[k][j];
                d[4 * k] = (uint8_t)(x >> 24);
                d[4 * k + 1] = (uint8_t)(x >> 16);
                d[4 * k + 2] = (uint8_t)(x >> 8);
                d[4 * k + 3] = (uint8_t)x;
                st[k][j] = SHA_IV[k];
            }
            l->item = -1;
            if (next < n) {
                lane_take(l, next, b + s[next], e[next] - s[next]);
                next++;
            }
        }
    }
}

int spans_inside(const Py_buffer *buf, const Py_buffer *starts, const Py_buffer *ends) {
    if (starts->len % 8 || ends->len != starts->len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        return 0;
    }
    const int64_t *s = starts->buf, *e = ends->buf;
    for (Py_ssize_t i = 0; i < starts->len / 8; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > buf->len) {
            PyErr_Format(PyExc_ValueError, "span %zd [%lld:%lld] is outside a buffer of %zd bytes",
                         i, (long long)s[i], (long long)e[i], buf->len);
            return 0;
        }
    }
    return 1;
}

static PyObject *hash_spans(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &buf, &starts, &ends)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = starts.len / 8;
    const int64_t *s = starts.buf, *e = ends.buf;
    if (!spans_inside(&buf, &starts, &ends)) goto done;
    out = PyBytes_FromStringAndSize(NULL, n * SHA256_DIGEST_LENGTH);
    if (out == NULL) goto done;
    uint8_t *d = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *b = buf.buf;
    /* 2: AVX-512VL lanes, 1: AVX2 lanes, 0: OpenSSL; TFSHARDS_SHA_LANES (the tests) caps it */
    const char *cap = getenv("TFSHARDS_SHA_LANES");
    int lanes = __builtin_cpu_supports("avx512vl") ? 2 : __builtin_cpu_supports("avx2");
    if (cap != NULL && cap[0] >= '0' && cap[0] < '0' + lanes) lanes = cap[0] - '0';
    Py_BEGIN_ALLOW_THREADS
    if (lanes) {
        sha_spans8(b, s, e, n, d, lanes > 1);
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            SHA256(b + s[i], (size_t)(e[i] - s[i]), d + i * SHA256_DIGEST_LENGTH);
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return out;
}
