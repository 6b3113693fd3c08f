/* The per-record loops of the writer and the validator, in C, without the GIL.
 *
 * Optional: setup.py builds it when a C compiler and OpenSSL's headers are
 * there, and tfshards.native falls back to the pure-Python loops when it is
 * missing (or when TFSHARDS_PURE_PYTHON=1). Both produce the same bytes and
 * the same findings; the tests run both.
 *
 *   frame_files    read local files straight into their slots in a buffer,
 *                  as framed tf.train.Example records of the base features
 *                  (payload, label, path, sha256 of the payload)
 *   frame_offsets  walk a shard's TFRecord framing: where each record starts
 *   crc32c_spans   CRC-32C of many slices of one buffer
 *   sha256_spans   SHA-256 of many slices of one buffer
 *   hash_files     SHA-256 and size of many files of one folder (the listing's content tokens)
 *   stat_files     stat of many files of one folder (the listing's hash cache)
 *   parse_examples the layout of many Examples of one-value features at once
 *   read_lines     many lines of a stored listing by line number, as one JSON array
 *
 * Every function releases the GIL while it works, so two threads run two
 * shards on two cores with no process pool to start.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256(): the one-shot call with the least overhead */
#include <openssl/sha.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define HAVE_X86 1
#endif

/* ------------------------------------------------------------------ CRC-32C */

static uint32_t crc_table[8][256]; /* slicing-by-8, for CPUs without SSE4.2 */

#define CRC_BLOCK 1024 /* buffers of 3 KB and more: three streams of this many bytes at once */
static uint32_t crc_shift_table[4][256]; /* state -> state after CRC_BLOCK zero bytes */
static int have_sse42;

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
              crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
              crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

static uint32_t crc_shift(uint32_t crc) {
    return crc_shift_table[0][crc & 0xff] ^ crc_shift_table[1][(crc >> 8) & 0xff] ^
           crc_shift_table[2][(crc >> 16) & 0xff] ^ crc_shift_table[3][crc >> 24];
}

#ifdef HAVE_X86
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
                                                          size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    /* The instruction's latency is three times its throughput: keep three
     * independent streams busy, then combine them (linearity of the CRC). */
    while (n >= 3 * CRC_BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *p1 = p + CRC_BLOCK, *p2 = p + 2 * CRC_BLOCK;
        for (size_t i = 0; i < CRC_BLOCK; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p1 + i, 8);
            memcpy(&w2, p2 + i, 8);
            c = _mm_crc32_u64(c, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        c = crc_shift(crc_shift((uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * CRC_BLOCK;
        n -= 3 * CRC_BLOCK;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

/* The CRC register update (no pre/post inversion). */
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) {
#ifdef HAVE_X86
    if (have_sse42) return crc_hw(crc, p, n);
#endif
    return crc_sw(crc, p, n);
}

static uint32_t crc32c(const uint8_t *p, size_t n) {
    return ~crc_update(0xffffffffu, p, n);
}

static uint32_t masked(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = crc_table[0][crc_table[t - 1][i] & 0xff] ^ (crc_table[t - 1][i] >> 8);
    /* The shift by CRC_BLOCK zero bytes is linear in the register: tabulate it
     * one register byte at a time from its values on the 32 single bits. */
    static const uint8_t zeros[CRC_BLOCK];
    uint32_t bit[32];
    for (int b = 0; b < 32; b++) bit[b] = crc_sw(1u << b, zeros, CRC_BLOCK);
    for (int t = 0; t < 4; t++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t s = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1u << b)) s ^= bit[8 * t + b];
            crc_shift_table[t][v] = s;
        }
#ifdef HAVE_X86
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

/* ------------------------------------------------------------ Example bytes */

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v > 0x7f) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v > 0x7f) {
        *p++ = (uint8_t)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
    return p + 8;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
    return p + 4;
}

/* Length of a delimited field (tag, varint length, contents) of ``n`` content bytes. */
static size_t delimited(size_t n) { return 1 + varint_len(n) + n; }

/* One map entry: {1: key, 2: Feature {kind_tag: List {1: value}}}.
 * ``value`` is the content of the List's field 1 (bytes, or packed varints). */
typedef struct {
    size_t list, feature, entry, total; /* contents lengths, and the entry's own bytes */
} EntrySizes;

static EntrySizes entry_sizes(size_t key_len, size_t value_len) {
    EntrySizes s;
    s.list = delimited(value_len);
    s.feature = delimited(s.list);
    s.entry = delimited(key_len) + delimited(s.feature);
    s.total = delimited(s.entry);
    return s;
}

/* Write an entry's bytes up to its value; returns where the value goes. */
static uint8_t *put_entry_head(uint8_t *p, const char *key, size_t key_len, uint8_t kind_tag,
                               size_t value_len, EntrySizes s) {
    *p++ = 0x0a;
    p = put_varint(p, s.entry);
    *p++ = 0x0a;
    p = put_varint(p, key_len);
    memcpy(p, key, key_len);
    p += key_len;
    *p++ = 0x12;
    p = put_varint(p, s.feature);
    *p++ = kind_tag;
    p = put_varint(p, s.list);
    *p++ = 0x0a;
    return put_varint(p, value_len);
}

static const char HEX[] = "0123456789abcdef";

/* -------------------------------------------------------------- known_image */

/* 1 when ``p`` (a file of ``n`` bytes) starts like a JPEG, PNG, GIF, BMP or
 * WebP file: the rule of tfshards.imageformat.image_format, on the same bytes. */
static int known_image(const uint8_t *p, size_t n) {
    static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return 1;
    if (n >= 8 && memcmp(p, png, 8) == 0) return 1;
    if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0)) return 1;
    if (n >= 18 && p[0] == 'B' && p[1] == 'M') {
        uint32_t dib = (uint32_t)p[14] | (uint32_t)p[15] << 8 | (uint32_t)p[16] << 16 |
                       (uint32_t)p[17] << 24;
        if (dib == 12 || dib == 16 || dib == 40 || dib == 52 || dib == 56 || dib == 64 ||
            dib == 108 || dib == 124)
            return 1;
    }
    if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) return 1;
    return 0;
}

/* The first (up to) 8 bytes of a payload, little-endian in one integer: what
 * frame_files reports of a file it refused as not an image. */
static int64_t head_bytes(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t k = 0; k < 8 && k < n; k++) v |= (uint64_t)p[k] << (8 * k);
    return (int64_t)v;
}

/* -------------------------------------------------------------- frame_files */

enum { ROLE_PAYLOAD, ROLE_LABEL, ROLE_PATH, ROLE_SHA };

typedef struct {
    const char *key;
    size_t key_len;
    int role;
} Slot;

typedef struct {
    const char *rel; /* NUL-terminated, relative to the folder opened as dir_fd */
    size_t rel_len;
    uint64_t label;
    size_t size;
} Item;

#define NOT_REGULAR (-((Py_ssize_t)1 << 40)) /* below every -errno */

/* Read ``rel`` into ``dst``, asking for ``cap`` bytes: the listed size + 1,
 * so that a file that grew shows in the same read(). Returns the byte count
 * or -errno, or NOT_REGULAR with the ``st_mode`` in ``file_size`` for
 * anything but a regular file (opening a FIFO without O_NONBLOCK waits for a
 * writer, forever if none comes); a file that fills all ``cap`` bytes has its
 * current size in ``file_size``. Like the Python loop, reads at least once,
 * then again only after a short read below the listed size. */
static Py_ssize_t read_file(int dir_fd, const char *rel, uint8_t *dst, size_t cap,
                            size_t *file_size) {
    int fd = openat(dir_fd, rel, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        *file_size = (size_t)st.st_mode;
        return NOT_REGULAR;
    }
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, dst + got, cap - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            return -e;
        }
        if (r == 0) break;
        got += (size_t)r;
        if (got + 1 >= cap) break;
    }
    *file_size = got;
    if (got == cap) { /* more than the listed size: report what it holds now */
        off_t end = lseek(fd, 0, SEEK_END);
        if (end >= 0) *file_size = (size_t)end;
    }
    close(fd);
    return (Py_ssize_t)got;
}

/* frame_files(buffer, used, dir_fd, rels, labels, sizes, start, keys, roles[, expected[, images]])
 *   -> (next, used, error, found)
 *
 * Frames the files ``rels`` (paths relative to the open folder ``dir_fd``),
 * items start, start+1, ... into ``buffer`` from offset ``used``
 * until one does not fit (error 0: flush and call again; a record larger
 * than the whole buffer needs a larger buffer), all are done (next ==
 * len(paths)), or item ``next`` fails: error > 0 is an errno of opening or
 * reading it, error -1 means it does not hold exactly its listed size (or is
 * empty), and ``found`` is the size it has; error -2 means its SHA-256
 * differs from its 32 bytes in ``expected`` (all zero: not checked), and
 * ``found`` is the 32-byte digest it has; error -3 means it is not a regular
 * file, and ``found`` is its ``st_mode``. ``keys`` are the four feature
 * names in sorted order, ``roles`` what each holds: "p" payload, "l" label,
 * "n" path (name), "s" sha256. ``images``, one byte per item, marks the files
 * whose name says image: error -4 means such a file is none of the known
 * formats, and ``found`` holds its first 8 bytes (see head_bytes). */
static PyObject *frame_files(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t used, start;
    int dir_fd;
    PyObject *rels, *labels, *sizes, *keys;
    const char *roles;
    Py_ssize_t roles_len;
    Py_buffer expected = {0};
    const char *images = NULL;
    Py_ssize_t images_len = 0;
    if (!PyArg_ParseTuple(args, "w*niO!O!O!nO!s#|y*y#", &buf, &used, &dir_fd, &PyList_Type,
                          &rels, &PyList_Type, &labels, &PyList_Type, &sizes, &start,
                          &PyTuple_Type, &keys, &roles, &roles_len, &expected, &images,
                          &images_len))
        return NULL;
    static const uint8_t unchecked[SHA256_DIGEST_LENGTH] = {0};
    unsigned char md[SHA256_DIGEST_LENGTH];
    PyObject *result = NULL;
    Item *items = NULL;
    Py_ssize_t count = PyList_GET_SIZE(rels);
    Slot slots[4];
    if ( PyList_GET_SIZE(labels) != count ||
        PyList_GET_SIZE(sizes) != count || PyTuple_GET_SIZE(keys) != 4 || roles_len != 4 ||
        used < 0 || used > buf.len || start < 0 || start > count ||
        (expected.buf != NULL && expected.len != count * SHA256_DIGEST_LENGTH) ||
        (images != NULL && images_len != count)) {
        PyErr_SetString(PyExc_ValueError, "frame_files: inconsistent arguments");
        goto done;
    }
    int seen = 0;
    for (int k = 0; k < 4; k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "frame_files: keys must be bytes");
            goto done;
        }
        slots[k].key = PyBytes_AS_STRING(key);
        slots[k].key_len = (size_t)PyBytes_GET_SIZE(key);
        const char *r = strchr("plns", roles[k]);
        if (r == NULL || roles[k] == '\0') {
            PyErr_SetString(PyExc_ValueError, "frame_files: roles must be a permutation of 'plns'");
            goto done;
        }
        slots[k].role = (int)(r - "plns");
        seen |= 1 << slots[k].role;
    }
    if (seen != 0xf) {
        PyErr_SetString(PyExc_ValueError, "frame_files: roles must be a permutation of 'plns'");
        goto done;
    }
    items = PyMem_Malloc(sizeof(Item) * (size_t)(count - start + 1));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = start; i < count; i++) {
        Item *it = &items[i - start];
        PyObject *rel = PyList_GET_ITEM(rels, i);
        if (!PyBytes_Check(rel) || memchr(PyBytes_AS_STRING(rel), 0, PyBytes_GET_SIZE(rel))) {
            PyErr_SetString(PyExc_TypeError, "frame_files: rels must be bytes without NUL");
            goto done;
        }
        it->rel = PyBytes_AS_STRING(rel);
        it->rel_len = (size_t)PyBytes_GET_SIZE(rel);
        long long label = PyLong_AsLongLong(PyList_GET_ITEM(labels, i));
        Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, i));
        if (PyErr_Occurred()) goto done;
        if (label < 0 || size < 0) {
            PyErr_SetString(PyExc_ValueError, "frame_files: labels and sizes must be >= 0");
            goto done;
        }
        it->label = (uint64_t)label;
        it->size = (size_t)size;
    }

    uint8_t *base = buf.buf;
    size_t cap = (size_t)buf.len, at = (size_t)used;
    Py_ssize_t i = start;
    int error = 0;
    size_t found = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i < count; i++) {
        Item *it = &items[i - start];
        uint8_t label_value[10];
        size_t label_len = (size_t)(put_varint(label_value, it->label) - label_value);
        EntrySizes sz[4];
        size_t value_len[4], body = 0;
        for (int k = 0; k < 4; k++) {
            switch (slots[k].role) {
            case ROLE_PAYLOAD: value_len[k] = it->size; break;
            case ROLE_LABEL: value_len[k] = label_len; break;
            case ROLE_PATH: value_len[k] = it->rel_len; break;
            default: value_len[k] = 64; break;
            }
            sz[k] = entry_sizes(slots[k].key_len, value_len[k]);
            body += sz[k].total;
        }
        size_t data_len = delimited(body);
        size_t total = 12 + data_len + 4;
        if (at + total + 1 > cap) break; /* +1: a byte past the payload shows a file that grew */
        uint8_t *rec = base + at, *data = rec + 12, *p = data;
        *p++ = 0x0a;
        p = put_varint(p, body);
        uint8_t *payload = NULL, *digest = NULL;
        for (int k = 0; k < 4; k++) {
            uint8_t tag = slots[k].role == ROLE_LABEL ? 0x1a : 0x0a;
            p = put_entry_head(p, slots[k].key, slots[k].key_len, tag, value_len[k], sz[k]);
            switch (slots[k].role) {
            case ROLE_PAYLOAD: payload = p; break;
            case ROLE_LABEL: memcpy(p, label_value, label_len); break;
            case ROLE_PATH: memcpy(p, it->rel, it->rel_len); break;
            default: digest = p; break;
            }
            p += value_len[k];
        }
        /* The payload's slot is followed by at least one byte of this buffer
         * (the +1 above), which the read may fill: those bytes are written
         * over below, after the file is checked. */
        uint8_t saved = payload[it->size];
        size_t file_size = 0;
        Py_ssize_t got = read_file(dir_fd, it->rel, payload, it->size + 1, &file_size);
        payload[it->size] = saved;
        if (got == NOT_REGULAR) {
            error = -3;
            found = file_size;
            break;
        }
        if (got < 0) {
            error = (int)-got;
            break;
        }
        if ((size_t)got != it->size || got == 0) {
            error = -1;
            found = file_size;
            break;
        }
        SHA256(payload, it->size, md);
        if (expected.buf != NULL) {
            const uint8_t *want = (const uint8_t *)expected.buf + i * SHA256_DIGEST_LENGTH;
            if (memcmp(want, unchecked, SHA256_DIGEST_LENGTH) &&
                memcmp(want, md, SHA256_DIGEST_LENGTH)) {
                error = -2;
                break;
            }
        }
        if (images != NULL && images[i] && !known_image(payload, it->size)) {
            error = -4;
            found = (size_t)head_bytes(payload, it->size);
            break;
        }
        for (int b = 0; b < SHA256_DIGEST_LENGTH; b++) {
            digest[2 * b] = (uint8_t)HEX[md[b] >> 4];
            digest[2 * b + 1] = (uint8_t)HEX[md[b] & 0xf];
        }
        put_u64(rec, data_len);
        put_u32(rec + 8, masked(crc32c(rec, 8)));
        put_u32(data + data_len, masked(crc32c(data, data_len)));
        at += total;
    }
    Py_END_ALLOW_THREADS
    if (error == -2)
        result = Py_BuildValue("(nniy#)", i, (Py_ssize_t)at, error, (const char *)md,
                               (Py_ssize_t)SHA256_DIGEST_LENGTH);
    else
        result = Py_BuildValue("(nnin)", i, (Py_ssize_t)at, error, (Py_ssize_t)found);
done:
    PyMem_Free(items);
    PyBuffer_Release(&buf);
    if (expected.buf != NULL) PyBuffer_Release(&expected);
    return result;
}

/* -------------------------------------------------------------- hash_files */

#define HASH_CHUNK (1 << 20)

/* SHA-256 of the whole file ``name`` in ``dir_fd`` into ``md``; returns its
 * size or -errno (-EINVAL: not a regular file). O_NONBLOCK: a FIFO put in
 * place of a listed file must not block the open. */
static int64_t hash_file(int dir_fd, const char *name, uint8_t *chunk, unsigned char *md) {
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -errno;
    struct stat st;
    int e = fstat(fd, &st) < 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (e) {
        close(fd);
        return -e;
    }
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    int64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, chunk, HASH_CHUNK);
        if (r < 0) {
            if (errno == EINTR) continue;
            e = errno;
            close(fd);
            return -e;
        }
        if (r == 0) break;
        SHA256_Update(&ctx, chunk, (size_t)r);
        total += r;
    }
    SHA256_Final(md, &ctx);
    close(fd);
    return total;
}

/* hash_files(folder, names) -> (digests, sizes): for each name (bytes, relative
 * to the folder ``folder``), the 32-byte SHA-256 of its bytes and, as int64,
 * how many bytes it holds, or -errno when it cannot be read (-EINVAL: not a
 * regular file); an unreadable folder gives -errno for every name. */
static PyObject *hash_files(PyObject *self, PyObject *args) {
    const char *folder;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "yO!", &folder, &PyList_Type, &names)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    const char **items = PyMem_Malloc(sizeof(char *) * (size_t)(n + 1));
    if (items == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyBytes_Check(name) || memchr(PyBytes_AS_STRING(name), 0, PyBytes_GET_SIZE(name))) {
            PyMem_Free(items);
            PyErr_SetString(PyExc_TypeError, "hash_files: names must be bytes without NUL");
            return NULL;
        }
        items[i] = PyBytes_AS_STRING(name);
    }
    PyObject *digests = PyBytes_FromStringAndSize(NULL, n * SHA256_DIGEST_LENGTH);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, n * 8);
    uint8_t *chunk = malloc(HASH_CHUNK);
    if (digests == NULL || sizes == NULL || chunk == NULL) {
        Py_XDECREF(digests);
        Py_XDECREF(sizes);
        free(chunk);
        PyMem_Free(items);
        return chunk == NULL ? PyErr_NoMemory() : NULL;
    }
    uint8_t *d = (uint8_t *)PyBytes_AS_STRING(digests);
    int64_t *sz = (int64_t *)PyBytes_AS_STRING(sizes);
    Py_BEGIN_ALLOW_THREADS
    int dir_fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int dir_error = dir_fd < 0 ? errno : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        memset(d + i * SHA256_DIGEST_LENGTH, 0, SHA256_DIGEST_LENGTH);
        sz[i] = dir_fd < 0 ? -(int64_t)dir_error
                           : hash_file(dir_fd, items[i], chunk, d + i * SHA256_DIGEST_LENGTH);
    }
    if (dir_fd >= 0) close(dir_fd);
    Py_END_ALLOW_THREADS
    free(chunk);
    PyMem_Free(items);
    return Py_BuildValue("(NN)", digests, sizes);
}

/* stat_files(folder, names) -> stats: for each name (bytes, relative to the
 * folder ``folder``), five int64 (st_dev, st_ino, st_size, st_mtime ns,
 * st_ctime ns) of what it names, links followed; size -errno when it cannot
 * be stat'ed (-EINVAL: not a regular file). The listing's hash cache compares
 * these with the stats it recorded, and reads no file whose stat is unchanged. */
static PyObject *stat_files(PyObject *self, PyObject *args) {
    const char *folder;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "yO!", &folder, &PyList_Type, &names)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    const char **items = PyMem_Malloc(sizeof(char *) * (size_t)(n + 1));
    if (items == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyBytes_Check(name) || memchr(PyBytes_AS_STRING(name), 0, PyBytes_GET_SIZE(name))) {
            PyMem_Free(items);
            PyErr_SetString(PyExc_TypeError, "stat_files: names must be bytes without NUL");
            return NULL;
        }
        items[i] = PyBytes_AS_STRING(name);
    }
    PyObject *stats = PyBytes_FromStringAndSize(NULL, n * 40);
    if (stats == NULL) {
        PyMem_Free(items);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(stats);
    Py_BEGIN_ALLOW_THREADS
    int dir_fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int dir_error = dir_fd < 0 ? errno : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t *o = out + 5 * i;
        struct stat st;
        int e = dir_fd < 0 ? dir_error : fstatat(dir_fd, items[i], &st, 0) < 0 ? errno : 0;
        if (!e && !S_ISREG(st.st_mode)) e = EINVAL;
        if (e) {
            o[0] = o[1] = o[3] = o[4] = 0;
            o[2] = -(int64_t)e;
            continue;
        }
        o[0] = (int64_t)st.st_dev;
        o[1] = (int64_t)st.st_ino;
        o[2] = (int64_t)st.st_size;
        o[3] = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        o[4] = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    }
    if (dir_fd >= 0) close(dir_fd);
    Py_END_ALLOW_THREADS
    PyMem_Free(items);
    return stats;
}

/* ------------------------------------------------------------ span kernels */

/* Parse (buffer, starts, ends): ``starts`` and ``ends`` are int64 buffers of
 * equal length, each span inside the buffer. */
static int get_spans(PyObject *args, Py_buffer *buf, Py_buffer *starts, Py_buffer *ends) {
    if (!PyArg_ParseTuple(args, "y*y*y*", buf, starts, ends)) return -1;
    Py_ssize_t n = starts->len / 8;
    if (starts->len % 8 || ends->len != starts->len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        goto fail;
    }
    const int64_t *s = starts->buf, *e = ends->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > buf->len) {
            PyErr_Format(PyExc_ValueError, "span %zd [%lld:%lld] is outside a buffer of %zd bytes",
                         i, (long long)s[i], (long long)e[i], buf->len);
            goto fail;
        }
    }
    return 0;
fail:
    PyBuffer_Release(buf);
    PyBuffer_Release(starts);
    PyBuffer_Release(ends);
    return -1;
}

typedef void (*SpanFn)(const uint8_t *data, size_t n, uint8_t *out);

static void crc_into(const uint8_t *data, size_t n, uint8_t *out) {
    uint32_t crc = crc32c(data, n);
    memcpy(out, &crc, 4); /* native order: read back as a numpy uint32 array */
}

static void sha_into(const uint8_t *data, size_t n, uint8_t *out) { SHA256(data, n, out); }

/* Apply ``fn`` to every span of (buffer, starts, ends), ``width`` output bytes each. */
static PyObject *map_spans(PyObject *args, SpanFn fn, Py_ssize_t width) {
    Py_buffer buf, starts, ends;
    if (get_spans(args, &buf, &starts, &ends) < 0) return NULL;
    Py_ssize_t n = starts.len / 8;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * width);
    if (out != NULL) {
        uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
        const int64_t *s = starts.buf, *e = ends.buf;
        const uint8_t *base = buf.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) fn(base + s[i], (size_t)(e[i] - s[i]), o + i * width);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return out;
}

/* crc32c_spans(buffer, starts, ends) -> bytes: uint32 CRC-32C of each span (unmasked). */
static PyObject *crc32c_spans(PyObject *self, PyObject *args) {
    return map_spans(args, crc_into, 4);
}

/* sha256_spans(buffer, starts, ends) -> bytes: the 32-byte SHA-256 of each span. */
static PyObject *sha256_spans(PyObject *self, PyObject *args) {
    return map_spans(args, sha_into, SHA256_DIGEST_LENGTH);
}

/* frame_offsets(buffer) -> (bytes, end): int64 offsets of the records whose
 * whole frame fits in the buffer, walking the length fields (not their CRCs),
 * and where the last of them ends. */
static PyObject *frame_offsets(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    const uint8_t *p = buf.buf;
    uint64_t size = (uint64_t)buf.len, offset = 0;
    Py_ssize_t n = 0, cap = 1024;
    int64_t *offsets = PyMem_RawMalloc((size_t)cap * 8);
    int oom = offsets == NULL;
    Py_BEGIN_ALLOW_THREADS
    while (!oom && size - offset >= 16) {
        uint64_t length = 0;
        for (int k = 7; k >= 0; k--) length = (length << 8) | p[offset + (uint64_t)k];
        if (length > size - offset - 16) break;
        if (n == cap) {
            int64_t *grown = PyMem_RawRealloc(offsets, (size_t)cap * 2 * 8);
            if (grown == NULL) {
                oom = 1;
                break;
            }
            offsets = grown;
            cap *= 2;
        }
        offsets[n++] = (int64_t)offset;
        offset += 16 + length;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (oom) {
        PyMem_RawFree(offsets);
        return PyErr_NoMemory();
    }
    PyObject *out = Py_BuildValue("(y#K)", (const char *)offsets, n * 8, (unsigned long long)offset);
    PyMem_RawFree(offsets);
    return out;
}


/* ----------------------------------------------------------- parse_examples */

/* A varint of at most 3 bytes (values below 2**21) at ``*at`` inside [.., end). */
static int get_varint3(const uint8_t *b, int64_t *at, int64_t end, int64_t *value) {
    int64_t a = *at, v = 0;
    for (int k = 0; k < 3; k++) {
        if (a + k >= end) return 0;
        uint8_t c = b[a + k];
        v |= (int64_t)(c & 0x7f) << (7 * k);
        if (c < 0x80) {
            *value = v;
            *at = a + k + 1;
            return 1;
        }
    }
    return 0;
}

/* ``tag`` then a length at ``*at``: the contents start at ``*at`` after, end at ``*end_out``. */
static int get_delimited(const uint8_t *b, int64_t *at, int64_t end, uint8_t tag,
                         int64_t *end_out) {
    int64_t length;
    if (*at >= end || b[*at] != tag) return 0;
    *at += 1;
    if (!get_varint3(b, at, end, &length)) return 0;
    *end_out = *at + length;
    return 1;
}

typedef struct {
    const char *key;
    size_t key_len;
    char kind; /* 'b': one bytes value, 'i': one int64 value */
} Field;

/* parse_examples(buffer, starts, ends, keys, kinds) -> (ok, spans, values)
 *
 * Parses each record buffer[start:end] as a canonical Example holding exactly
 * the features ``keys`` (sorted), one value each, of ``kinds`` (b"b" bytes,
 * b"i" int64), with varints of at most 3 bytes: what tfshards.bulkcheck's
 * numpy parse accepts, no more. ``ok`` is one byte per record; ``spans`` the
 * int64 (start, end) of each bytes value, ``values`` each int64 value, per
 * record and key (zero where ok is 0 or the kind differs). */
static PyObject *parse_examples(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, ends;
    PyObject *keys;
    const char *kinds;
    Py_ssize_t nk;
    if (!PyArg_ParseTuple(args, "y*y*y*O!y#", &buf, &starts, &ends, &PyTuple_Type, &keys,
                          &kinds, &nk))
        return NULL;
    PyObject *result = NULL, *ok = NULL, *spans = NULL, *values = NULL;
    Field *fields = NULL;
    Py_ssize_t n = starts.len / 8;
    if (starts.len % 8 || ends.len != starts.len || PyTuple_GET_SIZE(keys) != nk) {
        PyErr_SetString(PyExc_ValueError, "parse_examples: inconsistent arguments");
        goto done;
    }
    fields = PyMem_Malloc(sizeof(Field) * (size_t)(nk + 1));
    if (fields == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) >= 0x80 ||
            (kinds[k] != 'b' && kinds[k] != 'i')) {
            PyErr_SetString(PyExc_ValueError, "parse_examples: keys of < 128 bytes, kinds b/i");
            goto done;
        }
        fields[k].key = PyBytes_AS_STRING(key);
        fields[k].key_len = (size_t)PyBytes_GET_SIZE(key);
        fields[k].kind = kinds[k];
    }
    const int64_t *s = starts.buf, *e = ends.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > buf.len) {
            PyErr_Format(PyExc_ValueError, "span %zd is outside the buffer", i);
            goto done;
        }
    }
    ok = PyBytes_FromStringAndSize(NULL, n);
    spans = PyBytes_FromStringAndSize(NULL, n * nk * 16);
    values = PyBytes_FromStringAndSize(NULL, n * nk * 8);
    if (ok == NULL || spans == NULL || values == NULL) goto done;
    uint8_t *okp = (uint8_t *)PyBytes_AS_STRING(ok);
    int64_t *sp = (int64_t *)PyBytes_AS_STRING(spans), *vp = (int64_t *)PyBytes_AS_STRING(values);
    memset(sp, 0, (size_t)(n * nk * 16));
    memset(vp, 0, (size_t)(n * nk * 8));
    const uint8_t *b = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t end = e[i], pos = s[i], body_end;
        int good = get_delimited(b, &pos, end, 0x0a, &body_end) && body_end == end;
        for (Py_ssize_t k = 0; good && k < nk; k++) {
            const Field *field = &fields[k];
            int64_t entry_end, length, list_end, value_end;
            good = get_delimited(b, &pos, end, 0x0a, &entry_end) && entry_end <= end &&
                   pos + 3 + (int64_t)field->key_len <= end && b[pos] == 0x0a &&
                   b[pos + 1] == field->key_len &&
                   memcmp(b + pos + 2, field->key, field->key_len) == 0 &&
                   b[pos + 2 + field->key_len] == 0x12;
            if (!good) break;
            pos += 3 + (int64_t)field->key_len;
            good = get_varint3(b, &pos, end, &length) && length > 0 && pos + length == entry_end &&
                   get_delimited(b, &pos, end, field->kind == 'b' ? 0x0a : 0x1a, &list_end) &&
                   get_delimited(b, &pos, end, 0x0a, &value_end) && list_end == entry_end &&
                   value_end == entry_end;
            if (!good) break;
            if (field->kind == 'b') {
                sp[(i * nk + k) * 2] = pos;
                sp[(i * nk + k) * 2 + 1] = value_end;
            } else {
                int64_t value = 0, at = pos;
                good = get_varint3(b, &at, end, &value) && at == value_end;
                vp[i * nk + k] = value;
            }
            pos = entry_end;
        }
        okp[i] = (uint8_t)(good && pos == end);
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(3, ok, spans, values);
done:
    Py_XDECREF(ok);
    Py_XDECREF(spans);
    Py_XDECREF(values);
    PyMem_Free(fields);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}


/* --------------------------------------------------------------- read_lines */

/* Read exactly ``n`` bytes at ``offset`` (pread until done); 0 on a short read or error. */
static int pread_all(int fd, uint8_t *into, uint64_t n, uint64_t offset) {
    while (n) {
        ssize_t got = pread(fd, into, n, (off_t)offset);
        if (got <= 0) {
            if (got < 0 && errno == EINTR) continue;
            return 0;
        }
        into += got;
        n -= (uint64_t)got;
        offset += (uint64_t)got;
    }
    return 1;
}

/* read_lines(idx_fd, lines_fd, indices) -> (text, bad): for each line number
 * j of ``indices`` (uint32), its offsets [start, end) in files.idx (8 bytes
 * each, little-endian, at 8 * j), then files.jsonl's bytes from the newline
 * before ``start`` (none for line 0) to ``end``, which must hold no other
 * newline than their first and last: the lines' text joined as a JSON array
 * "[line,line,...]". ``bad`` is -1, or the position in ``indices`` of the
 * first line whose offsets are not those of one line (then ``text`` is empty
 * and the caller reads that batch line by line, for the message). */
static PyObject *read_lines(PyObject *self, PyObject *args) {
    int idx_fd, lines_fd;
    Py_buffer ind;
    if (!PyArg_ParseTuple(args, "iiy*", &idx_fd, &lines_fd, &ind)) return NULL;
    const uint32_t *js = ind.buf;
    Py_ssize_t count = ind.len / 4, bad = -1;
    size_t cap = 4096, used = 1;
    uint8_t *out = PyMem_RawMalloc(cap);
    int oom = out == NULL;
    Py_BEGIN_ALLOW_THREADS
    if (!oom) out[0] = '[';
    for (Py_ssize_t k = 0; !oom && k < count; k++) {
        uint8_t span[16];
        uint64_t start = 0, end = 0;
        if (!pread_all(idx_fd, span, 16, 8 * (uint64_t)js[k])) {
            bad = k;
            break;
        }
        for (int b = 7; b >= 0; b--) {
            start = (start << 8) | span[b];
            end = (end << 8) | span[8 + b];
        }
        uint64_t from = start ? start - 1 : 0; /* the newline before the line, if any */
        if (end <= start || end - from > ((uint64_t)1 << 30)) {
            bad = k;
            break;
        }
        uint64_t n = end - from;
        if (used + n + 2 > cap) {
            size_t want = cap;
            while (used + n + 2 > want) want *= 2;
            uint8_t *grown = PyMem_RawRealloc(out, want);
            if (grown == NULL) {
                oom = 1;
                break;
            }
            out = grown;
            cap = want;
        }
        uint8_t *at = out + used;
        if (!pread_all(lines_fd, at, n, from)) {
            bad = k;
            break;
        }
        uint8_t *text = start ? at + 1 : at; /* the line itself, with its newline */
        uint64_t len = start ? n - 1 : n;
        if ((start && at[0] != '\n') || text[len - 1] != '\n' ||
            memchr(text, '\n', len - 1) != NULL) {
            bad = k;
            break;
        }
        memmove(at, text, len - 1); /* the line without its newlines */
        used += len - 1;
        out[used++] = ',';
    }
    if (!oom && bad < 0) {
        if (count) used--; /* the last comma */
        out[used++] = ']';
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ind);
    if (oom) {
        PyMem_RawFree(out);
        return PyErr_NoMemory();
    }
    PyObject *result = Py_BuildValue("(y#n)", (const char *)out, bad < 0 ? (Py_ssize_t)used : 0, bad);
    PyMem_RawFree(out);
    return result;
}


static PyMethodDef methods[] = {
    {"frame_files", frame_files, METH_VARARGS,
     "frame_files(buffer, used, dir_fd, rels, labels, sizes, start, keys, roles"
     "[, expected[, images]])"
     " -> (next, used, error, found)"},
    {"hash_files", hash_files, METH_VARARGS, "hash_files(folder, names) -> (digests, sizes)"},
    {"stat_files", stat_files, METH_VARARGS, "stat_files(folder, names) -> stats"},
    {"frame_offsets", frame_offsets, METH_VARARGS, "frame_offsets(buffer) -> (offsets, end)"},
    {"crc32c_spans", crc32c_spans, METH_VARARGS, "crc32c_spans(buffer, starts, ends) -> bytes"},
    {"sha256_spans", sha256_spans, METH_VARARGS, "sha256_spans(buffer, starts, ends) -> bytes"},
    {"parse_examples", parse_examples, METH_VARARGS,
     "parse_examples(buffer, starts, ends, keys, kinds) -> (ok, spans, values)"},
    {"read_lines", read_lines, METH_VARARGS, "read_lines(idx_fd, lines_fd, indices) -> (text, bad)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "tfshards' per-record loops in C (see tfshards.native).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    return PyModule_Create(&module);
}
