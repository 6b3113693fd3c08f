/* image_headers: the format, width, height and channels of many images, from
 * their header bytes, without decoding them and without the GIL.
 *
 * The reference is tfshards.format.imageheader.read_header: this reads
 * exactly what it reads, and the tests compare the two on the same bytes.
 */
#include "_native.h"

#include <string.h>

enum { FMT_UNKNOWN, FMT_JPEG, FMT_PNG, FMT_GIF, FMT_BMP, FMT_WEBP };

static int64_t be16(const uint8_t *p) { return (int64_t)p[0] << 8 | p[1]; }
static int64_t le16(const uint8_t *p) { return (int64_t)p[0] | (int64_t)p[1] << 8; }
static int64_t le24(const uint8_t *p) { return le16(p) | (int64_t)p[2] << 16; }

static int is_sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

/* The JPEG marker walk to the first SOF segment; ``out`` keeps zeros when it cannot tell. */
static void jpeg(const uint8_t *p, int64_t n, int64_t *out) {
    int64_t at = 2;
    while (at + 1 < n) {
        if (p[at] != 0xFF) return;
        uint8_t m = p[at + 1];
        if (m == 0xFF) {
            at += 1;
            continue;
        }
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) {
            at += 2;
            continue;
        }
        if (is_sof(m)) {
            if (at + 10 > n) return;
            out[2] = be16(p + at + 5);
            out[1] = be16(p + at + 7);
            out[3] = p[at + 9];
            return;
        }
        if (m == 0xDA || at + 4 > n) return;
        at += 2 + be16(p + at + 2);
    }
}

static void png(const uint8_t *p, int64_t n, int64_t *out) {
    static const int64_t channels[7] = {1, 0, 3, 3, 2, 0, 4};
    if (n < 26 || memcmp(p + 12, "IHDR", 4) != 0) return;
    out[1] = (int64_t)p[16] << 24 | (int64_t)p[17] << 16 | (int64_t)p[18] << 8 | p[19];
    out[2] = (int64_t)p[20] << 24 | (int64_t)p[21] << 16 | (int64_t)p[22] << 8 | p[23];
    out[3] = p[25] < 7 ? channels[p[25]] : 0;
}

static void bmp(const uint8_t *p, int64_t n, int64_t *out) {
    if (n < 30) return;
    int64_t w, h, bpp;
    if (get_u32(p + 14) == 12) {
        w = le16(p + 18), h = le16(p + 20), bpp = le16(p + 24);
    } else {
        w = (int32_t)get_u32(p + 18), h = (int32_t)get_u32(p + 22), bpp = le16(p + 28);
    }
    out[1] = w < 0 ? -w : w;
    out[2] = h < 0 ? -h : h;
    out[3] = bpp == 32 ? 4 : 3;
}

static void webp(const uint8_t *p, int64_t n, int64_t *out) {
    if (n >= 30 && memcmp(p + 12, "VP8 ", 4) == 0 && p[23] == 0x9d && p[24] == 0x01 &&
        p[25] == 0x2a) {
        out[1] = le16(p + 26) & 0x3FFF, out[2] = le16(p + 28) & 0x3FFF, out[3] = 3;
    } else if (n >= 25 && memcmp(p + 12, "VP8L", 4) == 0 && p[20] == 0x2F) {
        uint32_t bits = get_u32(p + 21);
        out[1] = (bits & 0x3FFF) + 1, out[2] = (bits >> 14 & 0x3FFF) + 1;
        out[3] = (bits >> 28 & 1) ? 4 : 3;
    } else if (n >= 30 && memcmp(p + 12, "VP8X", 4) == 0) {
        out[1] = le24(p + 24) + 1, out[2] = le24(p + 27) + 1, out[3] = (p[20] & 0x10) ? 4 : 3;
    }
}

/* One image: out = {format, width, height, channels}, zeros where the header cannot tell. */
static void header(const uint8_t *p, int64_t n, int64_t *out) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memset(out, 0, 4 * sizeof(int64_t));
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) {
        out[0] = FMT_JPEG;
        jpeg(p, n, out);
    } else if (n >= 8 && memcmp(p, sig, 8) == 0) {
        out[0] = FMT_PNG;
        png(p, n, out);
    } else if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0)) {
        out[0] = FMT_GIF;
        if (n >= 10) out[1] = le16(p + 6), out[2] = le16(p + 8), out[3] = 3;
    } else if (n >= 18 && p[0] == 'B' && p[1] == 'M') {
        uint32_t dib = get_u32(p + 14);
        if (dib == 12 || dib == 16 || dib == 40 || dib == 52 || dib == 56 || dib == 64 ||
            dib == 108 || dib == 124) {
            out[0] = FMT_BMP;
            bmp(p, n, out);
        }
    } else if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) {
        out[0] = FMT_WEBP;
        webp(p, n, out);
    }
}

/* image_headers(buffer, starts, ends) -> int64 {format, width, height, channels} per span
 *
 * Formats: 0 unknown, 1 JPEG, 2 PNG, 3 GIF, 4 BMP, 5 WebP (the order of
 * tfshards.format.imageheader.NATIVE_FORMATS). */
PyObject *image_headers(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &buf, &starts, &ends)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = starts.len / 8;
    if (starts.len % 8 || ends.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must be int64 arrays of one length");
        goto done;
    }
    const int64_t *s = starts.buf, *e = ends.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > buf.len) {
            PyErr_Format(PyExc_ValueError, "span %zd [%lld:%lld] is outside a buffer of %zd bytes",
                         i, (long long)s[i], (long long)e[i], buf.len);
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, n * 4 * (Py_ssize_t)sizeof(int64_t));
    if (result == NULL) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
    const uint8_t *b = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) header(b + s[i], e[i] - s[i], out + 4 * i);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}
