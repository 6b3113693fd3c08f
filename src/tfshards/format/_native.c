/* The per-record loops of the writer and the validator, in C, without the GIL.
 *
 * Optional: setup.py builds it when a C compiler and OpenSSL's headers are
 * there, and tfshards.format.native falls back to the pure-Python loops when it is
 * missing (or when TFSHARDS_PURE_PYTHON=1). Both produce the same bytes and
 * the same findings; the tests run both.
 *
 *   frame_files    read local files straight into their slots in a buffer,
 *                  as framed tf.train.Example records of the base features
 *                  (payload, label, path, sha256 of the payload)
 *   scan_frames    walk a shard's TFRecord framing, checking both CRCs
 *   outline_examples  parse many tf.train.Example records: verdict, and the
 *                  kind, count and first value of the features asked for
 *   hash_files     SHA-256 and size of many files of one folder (the listing's content tokens)
 *   stat_files     stat of many files of one folder (the listing's hash cache)
 *   frame_offsets  walk a TFRecord stream's lengths only: where each whole record starts
 *   read_lines     many lines of a stored listing by line number, as one JSON array
 *
 * The Python reference of each format rule is in tfshards/format/
 * (tfrecord.scan, exampleparser.outline); these accept and find exactly
 * what it does, and the differential tests pit them against each other.
 * Problems are worded by the reference only: a record refused here is
 * handed back to it.
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

/* ---------------------------------------------------- wire constants
 * The numbers of tfshards/format/wire.py, stated once for C. */
#define HEADER_BYTES 12 /* uint64 length + masked CRC-32C of it */
#define LENGTH_BYTES 8
#define FOOTER_BYTES 4 /* masked CRC-32C of the data */
#define MASK_DELTA 0xa282ead8u
#define CRC32C_POLYNOMIAL 0x82f63b78u /* Castagnoli, reflected */
#define WIRE_LEN 2                    /* length-delimited: the only wire type of an Example */
#define TAG1 (1 << 3 | WIRE_LEN)      /* 0x0a */
#define TAG2 (2 << 3 | WIRE_LEN)      /* 0x12 */
#define KIND_BYTES 1                  /* Feature's oneof: BytesList, FloatList, Int64List */
#define KIND_FLOAT 2
#define KIND_INT64 3
#define FLOAT_BYTES 4
#define MAX_VARINT_BYTES 10

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
    return ((crc >> 15) | (crc << 17)) + MASK_DELTA;
}

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLYNOMIAL : c >> 1;
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
    *p++ = TAG1;
    p = put_varint(p, s.entry);
    *p++ = TAG1;
    p = put_varint(p, key_len);
    memcpy(p, key, key_len);
    p += key_len;
    *p++ = TAG2;
    p = put_varint(p, s.feature);
    *p++ = kind_tag;
    p = put_varint(p, s.list);
    *p++ = TAG1;
    return put_varint(p, value_len);
}

static const char HEX[] = "0123456789abcdef";

/* -------------------------------------------------------------- known_image */

/* 1 when ``p`` (a file of ``n`` bytes) starts like a JPEG, PNG, GIF, BMP or
 * WebP file: the rule of tfshards.format.imageformat.image_format, on the same bytes. */
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
        size_t total = HEADER_BYTES + data_len + FOOTER_BYTES;
        if (at + total + 1 > cap) break; /* +1: a byte past the payload shows a file that grew */
        uint8_t *rec = base + at, *data = rec + HEADER_BYTES, *p = data;
        *p++ = TAG1;
        p = put_varint(p, body);
        uint8_t *payload = NULL, *digest = NULL;
        for (int k = 0; k < 4; k++) {
            uint8_t tag = (slots[k].role == ROLE_LABEL ? KIND_INT64 : KIND_BYTES) << 3 | WIRE_LEN;
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
        put_u32(rec + LENGTH_BYTES, masked(crc32c(rec, LENGTH_BYTES)));
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

/* ------------------------------------------------------------- scan_frames */

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = LENGTH_BYTES - 1; k >= 0; k--) v = (v << 8) | p[k];
    return v;
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* scan_frames(buffer) -> (offsets, data_ok, end)
 *
 * Walks the TFRecord framing of ``buffer`` as tfshards.format.tfrecord.scan
 * does: ``offsets`` (int64) of each record whose header is whole, whose
 * length CRC matches and whose data and footer fit; ``data_ok`` one byte per
 * record, 1 where its data CRC matches; ``end`` where the walk stopped: the
 * buffer's size, or the offset of the record scan reports a framing problem
 * for (a truncated header or record, a length CRC mismatch). */
static PyObject *scan_frames(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    const uint8_t *p = buf.buf;
    uint64_t size = (uint64_t)buf.len, offset = 0;
    Py_ssize_t n = 0, cap = 1024;
    int64_t *offsets = PyMem_RawMalloc((size_t)cap * 8);
    uint8_t *ok = PyMem_RawMalloc((size_t)cap);
    int oom = offsets == NULL || ok == NULL;
    Py_BEGIN_ALLOW_THREADS
    while (!oom && size - offset >= HEADER_BYTES) {
        const uint8_t *head = p + offset, *data = head + HEADER_BYTES;
        uint64_t length = get_u64(head), room = size - offset - HEADER_BYTES;
        if (masked(crc32c(head, LENGTH_BYTES)) != get_u32(head + LENGTH_BYTES)) break;
        if (room < FOOTER_BYTES || length > room - FOOTER_BYTES) break;
        if (n == cap) {
            int64_t *more = PyMem_RawRealloc(offsets, (size_t)cap * 2 * 8);
            uint8_t *more_ok = more == NULL ? NULL : PyMem_RawRealloc(ok, (size_t)cap * 2);
            if (more != NULL) offsets = more;
            if (more_ok == NULL) {
                oom = 1;
                break;
            }
            ok = more_ok;
            cap *= 2;
        }
        offsets[n] = (int64_t)offset;
        ok[n++] = masked(crc32c(data, (size_t)length)) == get_u32(data + length);
        offset += HEADER_BYTES + length + FOOTER_BYTES;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyObject *out = oom ? PyErr_NoMemory()
                        : Py_BuildValue("(y#y#K)", (const char *)offsets, n * 8, (const char *)ok,
                                        n, (unsigned long long)offset);
    PyMem_RawFree(offsets);
    PyMem_RawFree(ok);
    return out;
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
    while (!oom && size - offset >= HEADER_BYTES + FOOTER_BYTES) {
        uint64_t length = 0;
        length = get_u64(p + offset);
        if (length > size - offset - HEADER_BYTES - FOOTER_BYTES) break;
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
        offset += HEADER_BYTES + length + FOOTER_BYTES;
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

/* -------------------------------------------------------- outline_examples */

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
static PyObject *outline_examples(PyObject *self, PyObject *args) {
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
    if (starts.len % 8 || ends.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        goto done;
    }
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
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > buf.len) {
            PyErr_Format(PyExc_ValueError, "span %zd [%lld:%lld] is outside a buffer of %zd bytes",
                         i, (long long)s[i], (long long)e[i], buf.len);
            goto done;
        }
    }
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
