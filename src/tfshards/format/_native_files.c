/* Files read for the listing and the writer, without the GIL:
 *
 *   read_file   one file straight into its slot of frame_files' buffer
 *   hash_files  SHA-256 and size of many files of one folder (the listing's content tokens)
 *   stat_files  stat of many files of one folder (the listing's hash cache)
 *   read_lines  many lines of a stored listing by line number, as one JSON array
 */
#include "_native.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init(): the 1.1 calls, in OpenSSL 1.1 and 3 */
#include <openssl/sha.h>

/* --------------------------------------------------------------- read_file */

/* Read ``rel`` into ``dst``, asking for ``cap`` bytes: the listed size + 1,
 * so that a file that grew shows in the same read(). Returns the byte count
 * or -errno, or NOT_REGULAR with the ``st_mode`` in ``file_size`` for
 * anything but a regular file (opening a FIFO without O_NONBLOCK waits for a
 * writer, forever if none comes); a file that fills all ``cap`` bytes has its
 * current size in ``file_size``. Like the Python loop, reads at least once,
 * then again only after a short read below the listed size. */
Py_ssize_t read_file(int dir_fd, const char *rel, uint8_t *dst, size_t cap, size_t *file_size) {
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
PyObject *hash_files(PyObject *self, PyObject *args) {
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
PyObject *stat_files(PyObject *self, PyObject *args) {
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
PyObject *read_lines(PyObject *self, PyObject *args) {
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
