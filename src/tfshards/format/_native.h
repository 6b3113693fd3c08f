/* What the C files of tfshards.format._native share: the wire constants, the
 * little-endian helpers, the file reader frame_files uses, and the functions
 * the module table (_native.c) lists.
 *
 * The numbers are those of tfshards/format/wire.py, stated once for C.
 */
#ifndef TFSHARDS_NATIVE_H
#define TFSHARDS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

#define HEADER_BYTES 12 /* uint64 length + masked CRC-32C of it */
#define LENGTH_BYTES 8
#define FOOTER_BYTES 4 /* masked CRC-32C of the data */
#define WIRE_LEN 2     /* length-delimited: the only wire type of an Example */
#define TAG1 (1 << 3 | WIRE_LEN) /* 0x0a */
#define TAG2 (2 << 3 | WIRE_LEN) /* 0x12 */
#define KIND_BYTES 1             /* Feature's oneof: BytesList, FloatList, Int64List */
#define KIND_FLOAT 2
#define KIND_INT64 3
#define FLOAT_BYTES 4
#define MAX_VARINT_BYTES 10

static inline uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = LENGTH_BYTES - 1; k >= 0; k--) v = (v << 8) | p[k];
    return v;
}

static inline uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint8_t *put_u64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
    return p + 8;
}

static inline uint8_t *put_u32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
    return p + 4;
}

/* _native_files.c: one file read into place (frame_files' reads). */
/* 1 when ``starts`` and ``ends`` are int64 arrays of one length whose spans all lie in
 * ``buf``; else 0 with a ValueError set (_native.c). */
int spans_inside(const Py_buffer *buf, const Py_buffer *starts, const Py_buffer *ends);

#define NOT_REGULAR (-((Py_ssize_t)1 << 40)) /* below every -errno */
Py_ssize_t read_file(int dir_fd, const char *rel, uint8_t *dst, size_t cap, size_t *file_size);

/* The module's functions (their comments say what each does). */
PyObject *frame_files(PyObject *self, PyObject *args);   /* _native_frame.c */
PyObject *scan_frames(PyObject *self, PyObject *args);   /* _native_scan.c */
PyObject *frame_offsets(PyObject *self, PyObject *args); /* _native_scan.c */
PyObject *outline_examples(PyObject *self, PyObject *args); /* _native_parse.c */
PyObject *image_headers(PyObject *self, PyObject *args);    /* _native_imagehead.c */
PyObject *image_records(PyObject *self, PyObject *args);    /* _native_imagehead.c */
PyObject *images_refused(PyObject *self, PyObject *args);       /* _native_imagehead.c */
int image_refused(const uint8_t *p, size_t n);                  /* _native_imagehead.c */
PyObject *hash_files(PyObject *self, PyObject *args);    /* _native_files.c */
PyObject *stat_files(PyObject *self, PyObject *args);    /* _native_files.c */
PyObject *read_lines(PyObject *self, PyObject *args);    /* _native_files.c */
PyObject *match_members(PyObject *self, PyObject *args); /* _native_members.c */

#endif
