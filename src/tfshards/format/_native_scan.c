/* TFRecord framing walked back, without the GIL:
 *
 *   scan_frames    walk a shard's framing, checking both CRCs
 *   frame_offsets  walk a stream's lengths only: where each whole record starts
 *
 * The reference walk is tfshards.format.tfrecord.scan; scan_frames stops
 * where it finds a problem and leaves the wording to it.
 */
#include "_native.h"

#include "_native_crc32c.h"

/* scan_frames(buffer) -> (offsets, data_ok, end)
 *
 * Walks the TFRecord framing of ``buffer`` as tfshards.format.tfrecord.scan
 * does: ``offsets`` (int64) of each record whose header is whole, whose
 * length CRC matches and whose data and footer fit; ``data_ok`` one byte per
 * record, 1 where its data CRC matches; ``end`` where the walk stopped: the
 * buffer's size, or the offset of the record scan reports a framing problem
 * for (a truncated header or record, a length CRC mismatch). */
PyObject *scan_frames(PyObject *self, PyObject *args) {
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
PyObject *frame_offsets(PyObject *self, PyObject *args) {
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
