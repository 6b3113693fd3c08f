/* frame_files: local files read straight into their slots in a buffer, as
 * framed tf.train.Example records of the base features (payload, label, path,
 * sha256 of the payload), without the GIL.
 *
 * The Python reference of the layout is tfshards.format.example.encode of
 * those four features, framed by tfshards.format.tfrecord.frame; the tests
 * compare the two byte for byte.
 */
#include "_native.h"

#include <string.h>

#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256(): the one-shot call with the least overhead */
#include <openssl/sha.h>

#include "_native_crc32c.h"

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


/* The four slots from ``keys`` (bytes, sorted) and ``roles`` ("plns" in some
 * order); 0 with an exception set when they are not that. */
static int parse_slots(PyObject *keys, const char *roles, Py_ssize_t roles_len, Slot *slots) {
    if (PyTuple_GET_SIZE(keys) != 4 || roles_len != 4) {
        PyErr_SetString(PyExc_ValueError, "frame_files: inconsistent arguments");
        return 0;
    }
    int seen = 0;
    for (int k = 0; k < 4; k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "frame_files: keys must be bytes");
            return 0;
        }
        slots[k].key = PyBytes_AS_STRING(key);
        slots[k].key_len = (size_t)PyBytes_GET_SIZE(key);
        const char *r = strchr("plns", roles[k]);
        if (r == NULL || roles[k] == '\0') {
            PyErr_SetString(PyExc_ValueError, "frame_files: roles must be a permutation of 'plns'");
            return 0;
        }
        slots[k].role = (int)(r - "plns");
        seen |= 1 << slots[k].role;
    }
    if (seen != 0xf) {
        PyErr_SetString(PyExc_ValueError, "frame_files: roles must be a permutation of 'plns'");
        return 0;
    }
    return 1;
}

/* Items start..count-1 of the lists (PyMem_Free them); NULL with an exception set. */
static Item *parse_items(PyObject *rels, PyObject *labels, PyObject *sizes, Py_ssize_t start,
                         Py_ssize_t count) {
    Item *items = PyMem_Malloc(sizeof(Item) * (size_t)(count - start + 1));
    if (items == NULL) return (Item *)PyErr_NoMemory();
    for (Py_ssize_t i = start; i < count; i++) {
        Item *it = &items[i - start];
        PyObject *rel = PyList_GET_ITEM(rels, i);
        if (!PyBytes_Check(rel) || memchr(PyBytes_AS_STRING(rel), 0, PyBytes_GET_SIZE(rel))) {
            PyErr_SetString(PyExc_TypeError, "frame_files: rels must be bytes without NUL");
            goto fail;
        }
        it->rel = PyBytes_AS_STRING(rel);
        it->rel_len = (size_t)PyBytes_GET_SIZE(rel);
        long long label = PyLong_AsLongLong(PyList_GET_ITEM(labels, i));
        Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, i));
        if (PyErr_Occurred()) goto fail;
        if (label < 0 || size < 0) {
            PyErr_SetString(PyExc_ValueError, "frame_files: labels and sizes must be >= 0");
            goto fail;
        }
        it->label = (uint64_t)label;
        it->size = (size_t)size;
    }
    return items;
fail:
    PyMem_Free(items);
    return NULL;
}

typedef struct {
    int error;    /* 0, an errno, or -1 .. -4 (see frame_files) */
    size_t found; /* with -1: the file's size; -3: its st_mode; -4: its first bytes */
    unsigned char md[SHA256_DIGEST_LENGTH]; /* the payload's SHA-256 (with -2: the one found) */
} Outcome;

/* Frame item ``it`` at ``rec``, ``room`` bytes before the buffer ends: lay out
 * its Example, read its file into the payload's slot, check it against
 * ``want`` (a 32-byte SHA-256, all zero or NULL: unchecked) and, with
 * ``check_image``, the known image formats, then write the digest and both
 * CRCs. Returns the record's size, or 0 when it does not fit or ``out->error``
 * says why its file failed. */
static size_t frame_one(const Slot *slots, const Item *it, int dir_fd, uint8_t *rec, size_t room,
                        const uint8_t *want, int check_image, Outcome *out) {
    static const uint8_t unchecked[SHA256_DIGEST_LENGTH] = {0};
    uint8_t label_value[MAX_VARINT_BYTES];
    size_t label_len = (size_t)(put_varint(label_value, it->label) - label_value);
    EntrySizes sz[4];
    size_t value_len[4], body = 0;
    for (int k = 0; k < 4; k++) {
        switch (slots[k].role) {
        case ROLE_PAYLOAD: value_len[k] = it->size; break;
        case ROLE_LABEL: value_len[k] = label_len; break;
        case ROLE_PATH: value_len[k] = it->rel_len; break;
        default: value_len[k] = 2 * SHA256_DIGEST_LENGTH; break; /* hex */
        }
        sz[k] = entry_sizes(slots[k].key_len, value_len[k]);
        body += sz[k].total;
    }
    size_t data_len = delimited(body);
    size_t total = HEADER_BYTES + data_len + FOOTER_BYTES;
    if (total + 1 > room) return 0; /* +1: a byte past the payload shows a file that grew */
    uint8_t *data = rec + HEADER_BYTES, *p = data;
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
    /* The payload's slot is followed by at least one byte of this buffer (the
     * +1 above), which the read may fill: it is put back right after. */
    uint8_t saved = payload[it->size];
    size_t file_size = 0;
    Py_ssize_t got = read_file(dir_fd, it->rel, payload, it->size + 1, &file_size);
    payload[it->size] = saved;
    if (got == NOT_REGULAR) {
        out->error = -3;
        out->found = file_size;
        return 0;
    }
    if (got < 0) {
        out->error = (int)-got;
        return 0;
    }
    if ((size_t)got != it->size || got == 0) {
        out->error = -1;
        out->found = file_size;
        return 0;
    }
    SHA256(payload, it->size, out->md);
    if (want != NULL && memcmp(want, unchecked, SHA256_DIGEST_LENGTH) &&
        memcmp(want, out->md, SHA256_DIGEST_LENGTH)) {
        out->error = -2;
        return 0;
    }
    if (check_image && !known_image(payload, it->size)) {
        out->error = -4;
        out->found = (size_t)head_bytes(payload, it->size);
        return 0;
    }
    if (check_image && (out->found = (size_t)image_refused(payload, it->size)) != 0) {
        out->error = -5;
        return 0;
    }
    for (int b = 0; b < SHA256_DIGEST_LENGTH; b++) {
        digest[2 * b] = (uint8_t)HEX[out->md[b] >> 4];
        digest[2 * b + 1] = (uint8_t)HEX[out->md[b] & 0xf];
    }
    put_u64(rec, data_len);
    put_u32(rec + LENGTH_BYTES, masked(crc32c(rec, LENGTH_BYTES)));
    put_u32(data + data_len, masked(crc32c(data, data_len)));
    return total;
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
 * formats, and ``found`` holds its first 8 bytes (see head_bytes); error -5
 * means TensorFlow's decoder refuses it by its bytes alone (a JPEG or PNG cut
 * short, an animated WebP), and ``found`` is that format's code (image_refused). */
PyObject *frame_files(PyObject *self, PyObject *args) {
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
    PyObject *result = NULL;
    Item *items = NULL;
    Py_ssize_t count = PyList_GET_SIZE(rels);
    Slot slots[4];
    if (PyList_GET_SIZE(labels) != count || PyList_GET_SIZE(sizes) != count || used < 0 ||
        used > buf.len || start < 0 || start > count ||
        (expected.buf != NULL && expected.len != count * SHA256_DIGEST_LENGTH) ||
        (images != NULL && images_len != count)) {
        PyErr_SetString(PyExc_ValueError, "frame_files: inconsistent arguments");
        goto done;
    }
    if (!parse_slots(keys, roles, roles_len, slots)) goto done;
    items = parse_items(rels, labels, sizes, start, count);
    if (items == NULL) goto done;

    uint8_t *base = buf.buf;
    size_t cap = (size_t)buf.len, at = (size_t)used;
    Py_ssize_t i = start;
    Outcome out = {0, 0, {0}};
    Py_BEGIN_ALLOW_THREADS
    for (; i < count; i++) {
        const uint8_t *want = expected.buf == NULL
                                  ? NULL
                                  : (const uint8_t *)expected.buf + i * SHA256_DIGEST_LENGTH;
        int check_image = images != NULL && images[i];
        size_t total = frame_one(slots, &items[i - start], dir_fd, base + at, cap - at, want,
                                 check_image, &out);
        if (total == 0) break; /* it does not fit, or out.error */
        at += total;
    }
    Py_END_ALLOW_THREADS
    if (out.error == -2)
        result = Py_BuildValue("(nniy#)", i, (Py_ssize_t)at, out.error, (const char *)out.md,
                               (Py_ssize_t)SHA256_DIGEST_LENGTH);
    else
        result = Py_BuildValue("(nnin)", i, (Py_ssize_t)at, out.error, (Py_ssize_t)out.found);
done:
    PyMem_Free(items);
    PyBuffer_Release(&buf);
    if (expected.buf != NULL) PyBuffer_Release(&expected);
    return result;
}
