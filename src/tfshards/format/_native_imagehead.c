/* image_headers: the format, width, height and channels of many images, from
 * their header bytes, without decoding them and without the GIL.
 *
 * The reference is tfshards.format.imageheader.read_header: this reads
 * exactly what it reads, and the tests compare the two on the same bytes.
 *
 * image_records does the same for the records of a buffer the writer has just
 * framed, finding each one's payload and path features itself.
 */
#include "_native.h"

#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init/Update/Final: no fetch per call */
#include <openssl/sha.h>
#include <string.h>

enum { FMT_UNKNOWN, FMT_JPEG, FMT_PNG, FMT_GIF, FMT_BMP, FMT_WEBP };
enum { ROW = 9 }; /* int64 values per record of image_records */

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
    if (p[25] != 3) return; /* a palette: RGBA when a tRNS chunk comes before the data */
    for (int64_t at = 8; at + 8 <= n;) {
        if (memcmp(p + at + 4, "IDAT", 4) == 0 || memcmp(p + at + 4, "IEND", 4) == 0) return;
        if (memcmp(p + at + 4, "tRNS", 4) == 0) {
            out[3] = 4;
            return;
        }
        at += 12 + ((int64_t)p[at] << 24 | (int64_t)p[at + 1] << 16 | (int64_t)p[at + 2] << 8 |
                    p[at + 3]);
    }
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
    /* as TensorFlow's decoder gives them: 8 bits grey (the palette ignored), fewer refused */
    out[3] = bpp == 32 ? 4 : bpp == 24 ? 3 : bpp == 8 ? 1 : bpp > 8 ? 3 : 0;
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

/* The orientation tag (0x0112) of IFD0 of the TIFF block [t, t + n); 1 when absent or bad.
 * The reference is tfshards.format.exif.tiff_orientation. */
static int64_t tiff_orientation(const uint8_t *t, int64_t n) {
    int little;
    if (n < 8) return 1;
    if (t[0] == 'I' && t[1] == 'I') little = 1;
    else if (t[0] == 'M' && t[1] == 'M') little = 0;
    else return 1;
#define U16(p) (little ? le16(p) : be16(p))
#define U32(p) (little ? (int64_t)get_u32(p) : be16(p) << 16 | be16((p) + 2))
    if (U16(t + 2) != 42) return 1;
    int64_t ifd = U32(t + 4);
    if (ifd + 2 > n) return 1;
    int64_t entries = U16(t + ifd);
    for (int64_t k = 0; k < entries; k++) {
        int64_t at = ifd + 2 + 12 * k;
        if (at + 12 > n) return 1;
        if (U16(t + at) == 0x0112) {
            int64_t value = U16(t + at + 2) == 3 ? U16(t + at + 8) : 0;
            return value >= 1 && value <= 8 ? value : 1;
        }
    }
    return 1;
#undef U16
#undef U32
}

/* The EXIF orientation of a JPEG (the first APP1 Exif segment before the first scan), a
 * PNG (the first eXIf chunk before IDAT) or a WebP (its first EXIF chunk); 1 when it has
 * none. The reference is tfshards.format.exif.orientation. */
static int64_t orientation(const uint8_t *p, int64_t n) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) {
        int64_t at = 2;
        while (at + 4 <= n) {
            if (p[at] != 0xFF) return 1;
            uint8_t m = p[at + 1];
            if (m == 0xFF) {
                at += 1;
                continue;
            }
            if (m == 0xDA || m == 0xD9) return 1;
            if ((m >= 0xD0 && m <= 0xD7) || m == 0x01) {
                at += 2;
                continue;
            }
            int64_t len = be16(p + at + 2), body = at + 4, end = at + 2 + len;
            if (end > n) end = n;
            if (m == 0xE1 && end - body >= 6 && memcmp(p + body, "Exif\0\0", 6) == 0)
                return tiff_orientation(p + body + 6, end - body - 6);
            at += 2 + len;
        }
    } else if (n >= 8 && memcmp(p, sig, 8) == 0) {
        int64_t at = 8;
        while (at + 8 <= n) {
            int64_t len = be16(p + at) << 16 | be16(p + at + 2), end;
            if (memcmp(p + at + 4, "IDAT", 4) == 0 || memcmp(p + at + 4, "IEND", 4) == 0) return 1;
            if (memcmp(p + at + 4, "eXIf", 4) == 0) {
                end = at + 8 + len;
                return tiff_orientation(p + at + 8, (end > n ? n : end) - at - 8);
            }
            at += 12 + len;
        }
    } else if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) {
        int64_t at = 12;
        while (at + 8 <= n) {
            int64_t len = (int64_t)get_u32(p + at + 4), body = at + 8, end = body + len;
            if (end > n) end = n;
            if (memcmp(p + at, "EXIF", 4) == 0) {
                if (end - body >= 6 && memcmp(p + body, "Exif\0\0", 6) == 0) body += 6;
                return tiff_orientation(p + body, end - body);
            }
            at += 8 + len + (len & 1); /* chunks are padded to an even size */
        }
    }
    return 1;
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

/* A JPEG's first SOS marker: its offset; -1 when the bytes end first; -2 when a segment
 * starts with other bytes than a marker, or an end comes before any scan. */
static int64_t jpeg_scan(const uint8_t *p, int64_t n) {
    int64_t at = 2;
    while (at + 1 < n) {
        if (p[at] != 0xFF) return -2;
        uint8_t m = p[at + 1];
        if (m == 0xFF) {
            at += 1;
        } else if (m == 0xDA) {
            return at;
        } else if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) {
            at += 2;
        } else if (m == 0xD9) {
            return -2;
        } else if (at + 4 > n) {
            return -1;
        } else {
            at += 2 + be16(p + at + 2);
        }
    }
    return -1;
}

/* The format of bytes TensorFlow's decoder refuses by their bytes alone, else 0: FMT_JPEG
 * or FMT_PNG when they stop before the format's end (no FF D9 at or after the first scan;
 * no whole IEND chunk), FMT_WEBP for an animated WebP (its VP8X animation flag), FMT_BMP
 * for a BMP of fewer than 8 bits a pixel. The rule of
 * tfshards.format.imageformat.image_problem, on the same bytes. */
int image_refused(const uint8_t *p, size_t size) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    int64_t n = (int64_t)size;
    if (n >= 30 && p[0] == 'B' && p[1] == 'M') {
        uint32_t dib = get_u32(p + 14);
        int64_t bpp = dib == 12 ? le16(p + 24) : le16(p + 28);
        int known = dib == 12 || dib == 16 || dib == 40 || dib == 52 || dib == 56 ||
                    dib == 64 || dib == 108 || dib == 124;
        return known && bpp > 0 && bpp < 8 ? FMT_BMP : 0;
    }
    if (n >= 21 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBPVP8X", 8) == 0 &&
        (p[20] & 0x02))
        return FMT_WEBP;
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) {
        int64_t scan = jpeg_scan(p, n);
        if (scan == -2) return 0;
        if (scan >= 0)
            for (int64_t at = n - 2; at >= scan; at--)
                if (p[at] == 0xFF && p[at + 1] == 0xD9) return 0;
        return FMT_JPEG;
    }
    if (n >= 8 && memcmp(p, sig, 8) == 0) {
        for (int64_t at = 8; at + 8 <= n;) {
            int64_t length = (int64_t)p[at] << 24 | (int64_t)p[at + 1] << 16 |
                             (int64_t)p[at + 2] << 8 | p[at + 3];
            if (length > 0x7FFFFFFF) return 0;
            if (memcmp(p + at + 4, "IEND", 4) == 0) return at + 12 + length > n ? FMT_PNG : 0;
            at += 12 + length;
        }
        return FMT_PNG;
    }
    return 0;
}

/* The bytes of ``n`` spans of ``buf``, each handed to ``each`` with its ``width`` bytes of
 * the result, without the GIL: the frame of images_refused and image_headers. */
typedef void (*SpanFn)(const uint8_t *p, int64_t n, uint8_t *out);

static PyObject *per_span(PyObject *args, Py_ssize_t width, SpanFn each) {
    Py_buffer buf, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &buf, &starts, &ends)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = starts.len / 8;
    if (!spans_inside(&buf, &starts, &ends)) goto done;
    const int64_t *s = starts.buf, *e = ends.buf;
    result = PyBytes_FromStringAndSize(NULL, n * width);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    const uint8_t *b = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) each(b + s[i], e[i] - s[i], out + i * width);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}

static void refused_one(const uint8_t *p, int64_t n, uint8_t *out) {
    *out = (uint8_t)image_refused(p, (size_t)n);
}

static void header_one(const uint8_t *p, int64_t n, uint8_t *out) {
    int64_t row[4];
    header(p, n, row);
    memcpy(out, row, sizeof(row));
}

/* images_refused(buffer, starts, ends) -> one byte per span: image_refused of its bytes. */
PyObject *images_refused(PyObject *self, PyObject *args) { return per_span(args, 1, refused_one); }

/* image_headers(buffer, starts, ends) -> int64 {format, width, height, channels} per span
 *
 * Formats: 0 unknown, 1 JPEG, 2 PNG, 3 GIF, 4 BMP, 5 WebP (the order of
 * tfshards.format.imageheader.NATIVE_FORMATS). */
PyObject *image_headers(PyObject *self, PyObject *args) {
    return per_span(args, 4 * (Py_ssize_t)sizeof(int64_t), header_one);
}

/* The varint at ``*pos`` before ``end``; 0 when cut short or over 10 bytes. */
static int varint(const uint8_t *b, int64_t *pos, int64_t end, uint64_t *out) {
    uint64_t v = 0;
    for (int k = 0; k < MAX_VARINT_BYTES && *pos < end; k++) {
        uint8_t c = b[(*pos)++];
        v |= (uint64_t)(c & 0x7f) << (7 * k);
        if (c < 0x80) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* The length-delimited field at ``*pos``: its number and span; 0 when it is not one. */
static int field(const uint8_t *b, int64_t *pos, int64_t end, uint64_t *num, int64_t *s,
                 int64_t *e) {
    uint64_t key, len;
    if (!varint(b, pos, end, &key) || (key & 7) != WIRE_LEN) return 0;
    if (!varint(b, pos, end, &len) || len > (uint64_t)(end - *pos)) return 0;
    *num = key >> 3, *s = *pos, *e = *pos + (int64_t)len, *pos = *e;
    return 1;
}

/* The first value of the BytesList feature [s, e) (a Feature message); 0 when none. */
static int first_bytes(const uint8_t *b, int64_t s, int64_t e, int64_t *vs, int64_t *ve) {
    uint64_t num;
    int64_t ls, le;
    if (!field(b, &s, e, &num, &ls, &le) || num != KIND_BYTES) return 0;
    return field(b, &ls, le, &num, vs, ve) && num == 1;
}

/* The spans of the first values of features ``k0`` (out[0..1]) and ``k1`` (out[2..3]). */
static int two_features(const uint8_t *b, int64_t s, int64_t e, const char *k0, int64_t n0,
                        const char *k1, int64_t n1, int64_t *out) {
    uint64_t num;
    int64_t fs, fe, es, ee, ks, ke, vs, ve;
    int found = 0;
    while (s < e) {
        if (!field(b, &s, e, &num, &fs, &fe)) return 0;
        if (num != 1) continue;
        while (fs < fe) {
            if (!field(b, &fs, fe, &num, &es, &ee)) return 0;
            if (num != 1) continue;
            ks = ke = vs = ve = -1;
            while (es < ee) {
                int64_t a, z;
                if (!field(b, &es, ee, &num, &a, &z)) return 0;
                if (num == 1) ks = a, ke = z;
                if (num == 2) vs = a, ve = z;
            }
            int which = ks < 0 ? -1
                        : ke - ks == n0 && memcmp(b + ks, k0, (size_t)n0) == 0 ? 0
                        : ke - ks == n1 && memcmp(b + ks, k1, (size_t)n1) == 0 ? 1 : -1;
            if (which < 0 || vs < 0) continue;
            if (!first_bytes(b, vs, ve, out + 2 * which, out + 2 * which + 1)) return 0;
            found |= 1 << which;
        }
    }
    return found == 3;
}

/* image_records(buffer, payload_key, path_key) -> (rows, end)
 *
 * Walks the whole framed records of ``buffer`` (lengths only: bytes just
 * framed) and gives, per record, nine int64: image_headers' four of its
 * payload, the payload's size, its path's span [start, end) in ``buffer``,
 * the first 8 bytes of the path's SHA-256 (big-endian, as uint64 bits), and
 * the payload's EXIF orientation (1..8; 1 without one).
 * A record whose two features cannot be found has format -1 (the Python
 * reference reads it). ``end``: where the last whole record ends. */
PyObject *image_records(PyObject *self, PyObject *args) {
    Py_buffer buf;
    const char *k0, *k1;
    Py_ssize_t n0, n1;
    if (!PyArg_ParseTuple(args, "y*y#y#", &buf, &k0, &n0, &k1, &n1)) return NULL;
    const uint8_t *b = buf.buf;
    int64_t size = buf.len, at = 0, count = 0;
    while (size - at >= HEADER_BYTES + FOOTER_BYTES) {
        uint64_t len = get_u64(b + at);
        if (len > (uint64_t)(size - at - HEADER_BYTES - FOOTER_BYTES)) break;
        at += HEADER_BYTES + (int64_t)len + FOOTER_BYTES;
        count++;
    }
    PyObject *rows = PyBytes_FromStringAndSize(NULL, count * ROW * (Py_ssize_t)sizeof(int64_t));
    if (rows == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(rows), end = at;
    Py_BEGIN_ALLOW_THREADS
    at = 0;
    for (int64_t i = 0; i < count; i++, out += ROW) {
        int64_t len = (int64_t)get_u64(b + at), s = at + HEADER_BYTES, spans[4];
        at = s + len + FOOTER_BYTES;
        memset(out, 0, ROW * sizeof(int64_t));
        if (!two_features(b, s, s + len, k0, n0, k1, n1, spans)) {
            out[0] = -1;
            continue;
        }
        header(b + spans[0], spans[1] - spans[0], out);
        out[4] = spans[1] - spans[0];
        out[5] = spans[2], out[6] = spans[3];
        uint8_t md[SHA256_DIGEST_LENGTH];
        SHA256_CTX ctx; /* the low-level calls: OpenSSL 3's one-shot SHA256() fetches per call */
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, b + spans[2], (size_t)(spans[3] - spans[2]));
        SHA256_Final(md, &ctx);
        uint64_t key = 0;
        for (int k = 0; k < 8; k++) key = key << 8 | md[k];
        memcpy(out + 7, &key, sizeof key);
        out[8] = orientation(b + spans[0], spans[1] - spans[0]);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return Py_BuildValue("(NL)", rows, (long long)end);
}
