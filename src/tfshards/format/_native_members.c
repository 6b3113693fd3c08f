/* A grown version's previous shards matched against the new listing, without the GIL:
 *
 *   match_members  where each line of each previous member list is in a listing
 *
 * The reference is the pure-Python match of tfshards.writing.growth: a member
 * line is held when the listing has a line whose member line, written as
 * tfshards.shardset.members.encode writes it, is the same bytes. Here both
 * sides stay bytes: one pass over files.jsonl builds a hash table keyed by
 * those member lines (never built as strings), one pass over each member list
 * looks its lines up. */
#include "_native.h"

#include <string.h>

typedef struct {
    const char *path, *token;
    Py_ssize_t path_len, token_len;
    Py_ssize_t label; /* index into the keep texts */
    uint64_t hash;
} Line;

typedef struct {
    const char *text;
    Py_ssize_t len;
} Text;

#define MIX 0x9E3779B97F4A7C15ULL

/* h and the n bytes at p, eight at a time (byte by byte cost ~3x more here);
 * the length goes in with the last word, so pieces hashed one after another
 * cannot shift into each other. */
static inline uint64_t mix(uint64_t h, const char *p, Py_ssize_t n) {
    uint64_t w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * MIX;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w ^ ((uint64_t)n << 56)) * MIX;
    return h ^ (h >> 29);
}

/* The hash of a member line from its three parts (path, token, label id text). */
static inline uint64_t key_hash(const char *path, Py_ssize_t path_len, const char *token,
                                Py_ssize_t token_len, const char *label, Py_ssize_t label_len) {
    return mix(mix(mix(MIX, path, path_len), token, token_len), label, label_len);
}

/* The plain string at *p (after its opening quote): no quote, backslash or
 * newline inside; *p moves past the closing quote. 0 when it is not plain. */
static int plain(const char **p, const char *end, const char **s, Py_ssize_t *n) {
    const char *q = *p;
    while (q < end && *q != '"' && *q != '\\' && *q != '\n') q++;
    if (q >= end || *q != '"') return 0;
    *s = *p;
    *n = q - *p;
    *p = q + 1;
    return 1;
}

static int literal(const char **p, const char *end, const char *text) {
    size_t n = strlen(text);
    if ((size_t)(end - *p) < n || memcmp(*p, text, n) != 0) return 0;
    *p += n;
    return 1;
}

static int digits(const char **p, const char *end, Py_ssize_t *value) {
    const char *q = *p;
    Py_ssize_t v = 0;
    while (q < end && *q >= '0' && *q <= '9' && q - *p < 12) v = v * 10 + (*q++ - '0');
    if (q == *p) return 0;
    *value = v;
    *p = q;
    return 1;
}

/* One files.jsonl line as the listing writes it (storedlisting._PLAIN_LINE). */
static int parse_line(const char *p, const char *end, Py_ssize_t labels, Line *line) {
    const char *label;
    Py_ssize_t label_len, size;
    if (!literal(&p, end, "{\"label\":\"") || !plain(&p, end, &label, &label_len)) return 0;
    if (!literal(&p, end, ",\"label_index\":") || !digits(&p, end, &line->label)) return 0;
    if (line->label >= labels) return 0;
    if (!literal(&p, end, ",\"path\":\"") || !plain(&p, end, &line->path, &line->path_len)) return 0;
    if (!literal(&p, end, ",\"size\":") || !digits(&p, end, &size)) return 0;
    if (!literal(&p, end, ",\"token\":\"") || !plain(&p, end, &line->token, &line->token_len))
        return 0;
    return literal(&p, end, "}") && p == end;
}

/* The hash of the member line ["path","token",keep] the line stands for. */
static uint64_t member_hash(const Line *line, const Text *keep) {
    return key_hash(line->path, line->path_len, line->token, line->token_len, keep->text, keep->len);
}

/* The hash of a member line as written, from its parts; 0 with *ok unset when it is not
 * ["path","token",label] with plain strings (then no listing line stands for it). */
static uint64_t line_hash(const char *p, Py_ssize_t n, int *ok) {
    const char *end = p + n, *path = p + 2, *token, *label;
    *ok = 0;
    if (n < 8 || memcmp(p, "[\"", 2) != 0 || end[-1] != ']') return 0;
    const char *q = memchr(path, '"', (size_t)(end - path));
    if (q == NULL || end - q < 4 || memcmp(q, "\",\"", 3) != 0) return 0;
    token = q + 3;
    const char *r = memchr(token, '"', (size_t)(end - token));
    if (r == NULL || end - r < 3 || memcmp(r, "\",", 2) != 0) return 0;
    label = r + 2;
    *ok = 1;
    return key_hash(path, q - path, token, r - token, label, end - 1 - label);
}

static int same(const char *m, Py_ssize_t n, const Line *line, const Text *keep) {
    if (n != 2 + line->path_len + 3 + line->token_len + 2 + keep->len + 1) return 0;
    if (memcmp(m, "[\"", 2) != 0 || memcmp(m + 2, line->path, line->path_len) != 0) return 0;
    m += 2 + line->path_len;
    if (memcmp(m, "\",\"", 3) != 0 || memcmp(m + 3, line->token, line->token_len) != 0) return 0;
    m += 3 + line->token_len;
    if (memcmp(m, "\",", 2) != 0 || memcmp(m + 2, keep->text, keep->len) != 0) return 0;
    return m[2 + keep->len] == ']';
}

typedef struct {
    Line *lines;
    Py_ssize_t count;
    int32_t *slots;
    uint64_t mask;
    const Text *keep;
} Table;

/* a < b, as bytes (UTF-8 bytes sort as their code points: Python's str order). */
static int before(const Line *a, const Line *b) {
    Py_ssize_t n = a->path_len < b->path_len ? a->path_len : b->path_len;
    int c = memcmp(a->path, b->path, (size_t)n);
    return c < 0 || (c == 0 && a->path_len < b->path_len);
}

/* Parses every line of the listing into the table; 0 when one is not plain, or its
 * path is not after the one before (a listing holds each path once, in order). */
static int build(Table *t, const char *p, const char *end, Py_ssize_t labels) {
    Py_ssize_t n = 0;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *stop = eol == NULL ? end : eol;
        if (n == t->count || !parse_line(p, stop, labels, &t->lines[n])) return 0;
        Line *line = &t->lines[n];
        if (n > 0 && !before(&t->lines[n - 1], line)) return 0;
        line->hash = member_hash(line, &t->keep[line->label]);
        uint64_t at = line->hash & t->mask;
        while (t->slots[at] >= 0) at = (at + 1) & t->mask; /* paths differ: keys do too */
        t->slots[at] = (int32_t)n++;
        p = stop + 1;
    }
    return n == t->count;
}

/* The listing line of each line of a member list into out; its line count, or -1
 * when a line is not in the table. */
static Py_ssize_t look_up(const Table *t, const char *p, const char *end, int32_t *out) {
    Py_ssize_t n = 0;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *stop = eol == NULL ? end : eol;
        Py_ssize_t len = stop - p;
        int ok;
        uint64_t h = line_hash(p, len, &ok), at = h & t->mask;
        int32_t found = -1;
        for (int32_t slot; ok && (slot = t->slots[at]) >= 0; at = (at + 1) & t->mask) {
            const Line *line = &t->lines[slot];
            if (line->hash == h && same(p, len, line, &t->keep[line->label])) {
                found = slot;
                break;
            }
        }
        if (found < 0) return -1;
        out[n++] = found;
        p = stop + 1;
    }
    return n;
}

static void release(Py_buffer *views, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
}

/* match_members(listing, files, keep, members) -> [bytes | None, ...] | None
 *
 * ``listing``: the bytes of files.jsonl, ``files`` lines; ``keep``: per label
 * index, the label id text a member line holds when its record is kept (a
 * text no line holds, such as b"-1", when none is); ``members``: the bytes of
 * each previous member list. For each member list, the int32 listing line of
 * each of its lines, or None when one is not there. None as a whole when a
 * listing line is not plain (an escaped character, extra columns, a label
 * index beyond keep) or its path is not after the one before: then the
 * Python match decodes, and a bad line is named there. */
PyObject *match_members(PyObject *self, PyObject *args) {
    Py_buffer listing;
    Py_ssize_t files;
    PyObject *keep_obj, *members_obj;
    if (!PyArg_ParseTuple(args, "y*nOO", &listing, &files, &keep_obj, &members_obj)) return NULL;
    PyObject *keep_seq = PySequence_Fast(keep_obj, "keep must be a sequence of bytes");
    PyObject *member_seq =
        keep_seq == NULL ? NULL : PySequence_Fast(members_obj, "members must be a sequence");
    Py_ssize_t labels = keep_seq == NULL ? 0 : PySequence_Fast_GET_SIZE(keep_seq);
    Py_ssize_t blobs = member_seq == NULL ? 0 : PySequence_Fast_GET_SIZE(member_seq);
    uint64_t capacity = 16;
    while (capacity < (uint64_t)files * 2) capacity <<= 1;
    Text *keep = PyMem_Calloc((size_t)labels + 1, sizeof(Text));
    Py_buffer *views = PyMem_Calloc((size_t)blobs + 1, sizeof(Py_buffer));
    Py_ssize_t held = 0;
    Table t = {PyMem_RawMalloc(((size_t)files + 1) * sizeof(Line)), files,
               PyMem_RawMalloc((size_t)capacity * sizeof(int32_t)), capacity - 1, keep};
    int32_t **found = PyMem_RawCalloc((size_t)blobs + 1, sizeof(int32_t *));
    Py_ssize_t *lengths = PyMem_RawCalloc((size_t)blobs + 1, sizeof(Py_ssize_t));
    PyObject *out = NULL;
    if (member_seq == NULL) goto done;
    if (keep == NULL || views == NULL || t.lines == NULL || t.slots == NULL || found == NULL ||
        lengths == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < labels; k++) {
        PyObject *text = PySequence_Fast_GET_ITEM(keep_seq, k);
        if (!PyBytes_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "keep must be a sequence of bytes");
            goto done;
        }
        keep[k] = (Text){PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text)};
    }
    for (; held < blobs; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(member_seq, held), &views[held],
                               PyBUF_SIMPLE) < 0)
            goto done;
    memset(t.slots, 0xff, (size_t)capacity * sizeof(int32_t));
    int plain_listing, oom = 0;
    const char *start = listing.buf;
    Py_BEGIN_ALLOW_THREADS
    plain_listing = build(&t, start, start + listing.len, labels);
    for (Py_ssize_t k = 0; plain_listing && k < blobs && !oom; k++) {
        const char *p = views[k].buf, *end = p + views[k].len;
        Py_ssize_t lines = 0;
        for (const char *q = p; q < end; q++) lines += *q == '\n';
        found[k] = PyMem_RawMalloc(((size_t)lines + 1) * sizeof(int32_t));
        oom = found[k] == NULL;
        lengths[k] = oom ? -1 : look_up(&t, p, end, found[k]);
    }
    Py_END_ALLOW_THREADS
    if (oom) {
        PyErr_NoMemory();
        goto done;
    }
    if (!plain_listing) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyList_New(blobs);
    for (Py_ssize_t k = 0; out != NULL && k < blobs; k++) {
        PyObject *item = lengths[k] < 0 ? Py_NewRef(Py_None)
                                        : PyBytes_FromStringAndSize((const char *)found[k],
                                                                    lengths[k] * 4);
        if (item == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, item);
    }
done:
    for (Py_ssize_t k = 0; found != NULL && k < blobs; k++) PyMem_RawFree(found[k]);
    PyMem_RawFree(found);
    PyMem_RawFree(lengths);
    PyMem_RawFree(t.lines);
    PyMem_RawFree(t.slots);
    PyMem_Free(keep);
    if (views != NULL) release(views, held);
    Py_XDECREF(keep_seq);
    Py_XDECREF(member_seq);
    PyBuffer_Release(&listing);
    return out;
}
