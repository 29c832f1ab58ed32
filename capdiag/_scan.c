/* The compiled traffic scanner: the hot part of capdiag/traffic.py, optional.
 *
 * It matches the wordings that capdiag/traffic_shapes.py declares, with the C functions that
 * module generates from them (_scan_wordings.h, written by setup.py into the build), over the
 * stretches of a block the Python path would read, and returns
 * per stretch what the Python path sums from its regular expressions' rows: the line count,
 * the (usage, queued, running) histogram, the peak queue, the throughput range and the sums.
 * Where any line that begins a wording does not match it wholly, or a sum would not fit in 64
 * bits, it returns None: the Python path then reads the block, so a report never depends on
 * which path read it (tests/test_scanner.py proves it on random logs).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { FIGURE_DIGITS = 15, MAX_FIELDS = 8 };
/* a match: matched, not matched (the optional run that holds it is skipped), or refused
 * (a figure of more digits than a figure has: the regular expression would take part of it) */
enum { NO = 0, YES = 1, REFUSED = -1 };

/* a figure as matched: where, how long, its value (a decimal's fraction as 15 digits) and how
 * many digits its whole part has: with the length, these say what was printed, exactly */
typedef struct { const char *at; Py_ssize_t len, digits; int64_t whole, fraction; } Span;
/* a wording: its first literal, which byte of it is looked for first, its fields, its matcher */
typedef struct {
    const char *anchor;
    Py_ssize_t anchor_len, key;
    int fields;
    int (*match)(const char *s, Py_ssize_t i, Py_ssize_t end, Span *f, Py_ssize_t *out);
} Wording;

/* a == b over n bytes, for the literals the matchers compare: with n known where it is called,
 * this is a few loads and compares, not a call */
#if defined(_MSC_VER)
#define ALWAYS_INLINE __forceinline
#else
#define ALWAYS_INLINE inline __attribute__((always_inline))
#endif
static ALWAYS_INLINE int same(const char *a, const char *b, Py_ssize_t n) {
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
    }
    if (n >= 4) {
        uint32_t x, y;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        if (x != y) return 0;
        a += 4, b += 4, n -= 4;
    }
    if (n >= 2) {
        uint16_t x, y;
        memcpy(&x, a, 2);
        memcpy(&y, b, 2);
        if (x != y) return 0;
        a += 2, b += 2, n -= 2;
    }
    return !n || *a == *b;
}

#include "_scan_wordings.h"

/* The first place at or after `from` where the wording's first literal begins and ends before
 * `to`, or -1: memchr for its key byte, then the whole literal. */
static Py_ssize_t find(const char *s, Py_ssize_t from, Py_ssize_t to, const Wording *w) {
    Py_ssize_t n = w->anchor_len, k = w->key;
    char key = w->anchor[k];
    for (Py_ssize_t i = from + k; i < to;) {
        const char *q = memchr(s + i, key, (size_t)(to - i));
        if (!q) return -1;
        Py_ssize_t at = q - s - k;
        if (at + n <= to && memcmp(s + at, w->anchor, (size_t)n) == 0) return at;
        i = q - s + 1;
    }
    return -1;
}

/* ---- figures */
/* a figure added to a sum (figures are not negative); 0 where the sum would pass 64 bits */
static int add_int(int64_t *sum, Span f) {
    if (f.whole > INT64_MAX - *sum) return 0;
    *sum += f.whole;
    return 1;
}

/* Compare two decimals by their values, exactly: whole parts, then fractions (15 digits each). */
static int decimal_cmp(Span a, Span b) {
    if (a.whole != b.whole) return a.whole < b.whole ? -1 : 1;
    return (a.fraction > b.fraction) - (a.fraction < b.fraction);
}

/* float(figure) as Python computes it */
static PyObject *float_of(Span f) {
    char buf[2 * FIGURE_DIGITS + 2];
    memcpy(buf, f.at, (size_t)f.len);
    buf[f.len] = 0;
    double v = PyOS_string_to_double(buf, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(v);
}

/* ---- the (usage, queued, running) histogram: keys are copied, so it outlives the block */
enum { USAGE_BYTES = 2 * FIGURE_DIGITS + 1, RUNNING_BYTES = FIGURE_DIGITS };
typedef struct {
    char usage[USAGE_BYTES], running[RUNNING_BYTES];
    unsigned char usage_len, usage_digits, running_len, queued;
    int64_t usage_whole, usage_fraction, running_whole;
    Py_ssize_t n;
    uint64_t hash;
} Entry;
/* the entries in the order first seen, and an open-addressing index of them (entry + 1; 0: free) */
typedef struct { Entry *entries; uint32_t *index; Py_ssize_t size, used, room; } Table;

/* the key's hash, from its figures' values and shapes (which say what was printed) */
static uint64_t hash_of(Span u, int q, Span r) {
    uint64_t h = (uint64_t)u.whole * 0x9E3779B97F4A7C15ULL;
    h ^= ((uint64_t)u.fraction + ((uint64_t)u.len << 56) + ((uint64_t)u.digits << 48)) * 0xC2B2AE3D27D4EB4FULL;
    h ^= ((uint64_t)r.whole + ((uint64_t)r.len << 56) + ((uint64_t)q << 55)) * 0x165667B19E3779F9ULL;
    return h ^ (h >> 29);
}

static int bytes_equal(const char *a, const char *b, Py_ssize_t n) {
    while (n--)
        if (*a++ != *b++) return 0;
    return 1;
}

static void table_index(Table *t) {
    memset(t->index, 0, sizeof(uint32_t) * (size_t)t->size);
    for (Py_ssize_t k = 0; k < t->used; k++) {
        Py_ssize_t at = (Py_ssize_t)(t->entries[k].hash & (uint64_t)(t->size - 1));
        while (t->index[at]) at = (at + 1) & (t->size - 1);
        t->index[at] = (uint32_t)(k + 1);
    }
}

static int table_grow(Table *t) {
    Py_ssize_t size = t->size ? t->size * 2 : 256;
    if (size / 2 > (Py_ssize_t)UINT32_MAX - 1) return 0;
    uint32_t *index = PyMem_RawRealloc(t->index, sizeof(uint32_t) * (size_t)size);
    if (!index) return 0;
    t->index = index;
    Entry *entries = PyMem_RawRealloc(t->entries, sizeof(Entry) * (size_t)(size / 2));
    if (!entries) return 0;
    t->entries = entries;
    t->size = size;
    t->room = size / 2;
    table_index(t);
    return 1;
}

static void table_free(Table *t) {
    PyMem_RawFree(t->index);
    PyMem_RawFree(t->entries);
    memset(t, 0, sizeof *t);
}

/* add n lines of the key (usage u, queued q, running r), *entry its index; 0: out of memory */
static int table_add(Table *t, Span u, int q, Span r, Py_ssize_t n, uint64_t h, uint32_t *entry) {
    if (t->used + 1 > t->room && !table_grow(t)) return 0;
    Py_ssize_t at = (Py_ssize_t)(h & (uint64_t)(t->size - 1));
    for (;;) {
        uint32_t k = t->index[at];
        if (!k) {
            Entry *e = &t->entries[t->used];
            memcpy(e->usage, u.at, (size_t)u.len);
            memcpy(e->running, r.at, (size_t)r.len);
            e->usage_len = (unsigned char)u.len;
            e->usage_digits = (unsigned char)u.digits;
            e->usage_whole = u.whole;
            e->usage_fraction = u.fraction;
            e->running_len = (unsigned char)r.len;
            e->running_whole = r.whole;
            e->queued = (unsigned char)q;
            e->hash = h;
            e->n = n;
            *entry = (uint32_t)t->used;
            t->index[at] = (uint32_t)(++t->used);
            return 1;
        }
        Entry *e = &t->entries[k - 1];
        if (e->hash == h && e->usage_whole == u.whole && e->usage_fraction == u.fraction && e->running_whole == r.whole &&
            e->queued == q && e->usage_len == u.len && e->usage_digits == u.digits && e->running_len == r.len) {
            e->n += n;
            *entry = k - 1;
            return 1;
        }
        at = (at + 1) & (t->size - 1);
    }
}

/* the Histogram type: one rank's counts across blocks; items() gives them to Python. The
 * journal holds the entry each line of the block at hand was counted in, so that a block the
 * Python path must read after all is taken back out (an entry may be left at 0 lines). */
typedef struct {
    PyObject_HEAD
    Table table;
    uint32_t *journal;
    Py_ssize_t journaled, journal_room;
} Histogram;

static int journal(Histogram *h, uint32_t entry) {
    if (h->journaled == h->journal_room) {
        Py_ssize_t room = h->journal_room ? 2 * h->journal_room : 4096;
        uint32_t *grown = PyMem_RawRealloc(h->journal, sizeof(uint32_t) * (size_t)room);
        if (!grown) return 0;
        h->journal = grown;
        h->journal_room = room;
    }
    h->journal[h->journaled++] = entry;
    return 1;
}

static void take_back(Histogram *h) {
    for (Py_ssize_t k = 0; k < h->journaled; k++) h->table.entries[h->journal[k]].n--;
    h->journaled = 0;
}

static void histogram_dealloc(Histogram *self) {
    table_free(&self->table);
    PyMem_RawFree(self->journal);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *histogram_items(Histogram *self, PyObject *unused) {
    (void)unused;
    PyObject *d = PyDict_New();
    Table *t = &self->table;
    for (Py_ssize_t k = 0; d && k < t->used; k++) {
        Entry *e = &t->entries[k];
        if (!e->n) continue;
        PyObject *key = Py_BuildValue("(y#Oy#)", e->usage, (Py_ssize_t)e->usage_len, e->queued ? Py_True : Py_False,
                                      e->running, (Py_ssize_t)e->running_len);
        PyObject *n = PyLong_FromSsize_t(e->n);
        if (!key || !n || PyDict_SetItem(d, key, n) < 0) Py_CLEAR(d);
        Py_XDECREF(key);
        Py_XDECREF(n);
    }
    return d;
}

static PyMethodDef histogram_methods[] = {
    {"items", (PyCFunction)histogram_items, METH_NOARGS,
     "{(usage as printed, queued, running as printed): lines}"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HistogramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "capdiag._scan.Histogram",
    .tp_basicsize = sizeof(Histogram),
    .tp_dealloc = (destructor)histogram_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One rank's (usage, queued, running) counts, added to by scan().",
    .tp_methods = histogram_methods,
    .tp_new = PyType_GenericNew,
};

/* ---- what one stretch gives */
typedef struct {
    Py_ssize_t start, stop, lines, prefills;
    int64_t top_queue, top_running, ctx_tokens, ctx_running, prompt_tokens, prompt_seqs, prefill_max, preempted;
    int throughput_seen, preempted_seen, usage_seen;
    Span low, high, top_usage;
    Histogram *hist;  /* the rank's: what a line adds is journaled */
} Stretch;

static int queued_of(Span q) { return !(q.len == 1 && q.at[0] == '0'); }

static void throughput_add(Stretch *st, Span f) {
    if (!st->throughput_seen) {
        st->low = st->high = f;
        st->throughput_seen = 1;
        return;
    }
    if (decimal_cmp(f, st->low) < 0) st->low = f;
    if (decimal_cmp(f, st->high) > 0) st->high = f;
}

static int line_add(Stretch *st, Span usage, Span queue, Span running) {
    int64_t q = queue.whole, r = running.whole;
    int queued = queued_of(queue);
    if (q > st->top_queue) st->top_queue = q;
    if (r > st->top_running) st->top_running = r;
    if (usage.len && (!st->usage_seen || decimal_cmp(usage, st->top_usage) > 0)) {
        st->top_usage = usage;
        st->usage_seen = 1;
    }
    st->lines++;
    uint32_t entry;
    return table_add(&st->hist->table, usage, queued, running, 1, hash_of(usage, queued, running), &entry) &&
           journal(st->hist, entry);
}

static void clear(Span *f, int n) { memset(f, 0, sizeof(Span) * (size_t)n); }

/* 1: read; 0: not this path's (the block goes to Python); -1: out of memory.
 * Three cursors walk the stretch in order: the next decode head, prefill head and decode tail.
 * A tail met before its head's line, a second head in a line, a decode line without its tail:
 * all are lines the Python path reads otherwise, so the block goes to it. */
static int sglang_stretch(const char *s, Py_ssize_t start, Py_ssize_t stop, Stretch *st) {
    const Wording *decode = &SGLANG_DECODE, *tail = &SGLANG_DECODE_TAIL, *prefill = &SGLANG_PREFILL;
    Py_ssize_t d = find(s, start, stop, decode), pf = find(s, start, stop, prefill), t = find(s, start, stop, tail);
    Span f[MAX_FIELDS], g[MAX_FIELDS];
    while (d >= 0 || pf >= 0) {
        int is_decode = pf < 0 || (d >= 0 && d < pf);
        Py_ssize_t head = is_decode ? d : pf, pos;
        if (t >= 0 && t < head) return 0;  /* a tail outside a decode line */
        const char *nl = memchr(s + head, '\n', (size_t)(stop - head));
        Py_ssize_t end = nl ? nl - s : stop;
        if (is_decode) {
            clear(f, decode->fields);
            clear(g, tail->fields);
            if (decode->match(s, head, end, f, &pos) != YES || f[SGLANG_DECODE_SWA].at) return 0;
            if (t < 0 || t >= end) return 0;
            Py_ssize_t tp;
            if (tail->match(s, t, end, g, &tp) != YES) return 0;
            throughput_add(st, g[SGLANG_DECODE_TAIL_THROUGHPUT]);
            if (!add_int(&st->ctx_tokens, f[SGLANG_DECODE_TOKENS]) || !add_int(&st->ctx_running, f[SGLANG_DECODE_RUNNING]))
                return 0;
            if (!line_add(st, f[SGLANG_DECODE_USAGE], g[SGLANG_DECODE_TAIL_QUEUE], f[SGLANG_DECODE_RUNNING])) return -1;
            t = find(s, tp, stop, tail);
            d = find(s, pos, stop, decode);
        } else {
            clear(f, prefill->fields);
            if (prefill->match(s, head, end, f, &pos) != YES) return 0;
            int64_t new_tokens = f[SGLANG_PREFILL_NEW].whole;
            if (!add_int(&st->prompt_tokens, f[SGLANG_PREFILL_NEW]) || !add_int(&st->prompt_tokens, f[SGLANG_PREFILL_CACHED]) ||
                !add_int(&st->prompt_seqs, f[SGLANG_PREFILL_SEQS]))
                return 0;
            if (new_tokens > st->prefill_max) st->prefill_max = new_tokens;
            if (!line_add(st, f[SGLANG_PREFILL_USAGE], f[SGLANG_PREFILL_QUEUE], f[SGLANG_PREFILL_RUNNING])) return -1;
            st->prefills++;
            pf = find(s, pos, stop, prefill);
        }
        if ((d >= 0 && d < end) || (pf >= 0 && pf < end)) return 0;  /* two heads in one line */
    }
    return t < 0;  /* else a tail after the last decode line */
}

/* `engine`: the tag of the first `Engine N: Avg prompt` in the block (len 0 where none). Every
 * such phrase in the stretch must be that tag's and open a metrics line, and every metrics line
 * must have one (or, untagged, none may): else the lines of several engines are mixed, and
 * the Python path reads them line by line. */
static int vllm_stretch(const char *s, Py_ssize_t start, Py_ssize_t stop, Span engine, Stretch *st) {
    static const Span none = {"", 0, 0, 0, 0};
    const Wording *metrics = &VLLM_METRICS, *tag = &VLLM_ENGINE;
    Span f[MAX_FIELDS];
    Py_ssize_t lines = 0, tagged = 0, end;
    for (Py_ssize_t at = find(s, start, stop, metrics); at >= 0; at = find(s, at, stop, metrics)) {
        const char *nl = memchr(s + at, '\n', (size_t)(stop - at));
        clear(f, metrics->fields);
        if (metrics->match(s, at, nl ? nl - s : stop, f, &at) != YES) return 0;
        throughput_add(st, f[VLLM_METRICS_GENERATION]);
        if (f[VLLM_METRICS_PREEMPTED].at) {
            st->preempted_seen = 1;
            if (!add_int(&st->preempted, f[VLLM_METRICS_PREEMPTED])) return 0;
        }
        Span usage = f[VLLM_METRICS_USAGE].at ? f[VLLM_METRICS_USAGE] : none;
        if (!line_add(st, usage, f[VLLM_METRICS_WAITING], f[VLLM_METRICS_RUNNING])) return -1;
        lines++;
    }
    for (Py_ssize_t at = find(s, start, stop, tag); at >= 0; at = find(s, at + 1, stop, tag)) {
        Span g[MAX_FIELDS];
        clear(g, tag->fields);
        if (tag->match(s, at, stop, g, &end) != YES) continue;  /* no `Engine N: Avg prompt` here */
        Span n = g[VLLM_ENGINE_ENGINE];
        if (n.len != engine.len || !bytes_equal(n.at, engine.at, n.len)) return 0;
        /* the phrase's `Avg prompt` must be a metrics line's */
        Py_ssize_t avg = end - (Py_ssize_t)(sizeof "Avg prompt" - 1);
        if (stop - avg < metrics->anchor_len || !bytes_equal(s + avg, metrics->anchor, metrics->anchor_len)) return 0;
        tagged++;
        at = end - 1;
    }
    return tagged == (engine.len ? lines : 0);
}

/* ---- the module's functions */
static PyObject *optional_float(int seen, Span f) {
    if (!seen) Py_RETURN_NONE;
    return float_of(f);
}

/* SGLang (lines, top queue, top running, top usage, throughput low, high, context tokens,
 * context requests, prompt tokens, prompt requests, most new tokens of a prefill, prefills);
 * vLLM (lines, top queue, top running, top usage, generation low, high, preemptions printed,
 * their sum). Usage and throughput are floats as printed (None where none was). */
static PyObject *stretch_result(Stretch *st, int vllm) {
    PyObject *usage = optional_float(st->usage_seen, st->top_usage), *low = NULL, *high = NULL, *out = NULL;
    if (usage) low = optional_float(st->throughput_seen, st->low);
    if (low) high = optional_float(st->throughput_seen, st->high);
    if (high) {
        if (vllm)
            out = Py_BuildValue("(nLLOOOOL)", st->lines, (long long)st->top_queue, (long long)st->top_running, usage,
                                low, high, st->preempted_seen ? Py_True : Py_False, (long long)st->preempted);
        else
            out = Py_BuildValue("(nLLOOOLLLLLn)", st->lines, (long long)st->top_queue, (long long)st->top_running,
                                usage, low, high, (long long)st->ctx_tokens, (long long)st->ctx_running,
                                (long long)st->prompt_tokens, (long long)st->prompt_seqs, (long long)st->prefill_max,
                                st->prefills);
    }
    Py_XDECREF(usage);
    Py_XDECREF(low);
    Py_XDECREF(high);
    return out;
}

/* scan(vllm, block, cuts, histogram[, engine]): one result a stretch (None where it has no traffic
 * line), the block's lines counted into the rank's `histogram`; or None, and `histogram` as it
 * was, when the Python path must read the block. The stretches are read without the GIL (the reader's workers
 * search the next blocks meanwhile); the results are made with it. */
static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    int vllm, refused = 0, failed = 0;
    Py_buffer block;
    PyObject *cuts, *out = NULL, *seq = NULL;
    Histogram *into;
    Stretch *st = NULL;
    Py_buffer engine = {0};
    if (!PyArg_ParseTuple(args, "py*OO!|y*", &vllm, &block, &cuts, &HistogramType, &into, &engine)) return NULL;
    Span tag = {engine.buf ? engine.buf : "", engine.buf ? engine.len : 0, 0, 0, 0};
    seq = PySequence_Fast(cuts, "scan: cuts are a sequence of (start, stop)");
    if (!seq) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    st = PyMem_RawCalloc((size_t)(n ? n : 1), sizeof(Stretch));
    if (!st) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t start, stop;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "nn", &start, &stop)) goto done;
        if (start < 0 || stop > block.len || start > stop) {
            PyErr_SetString(PyExc_ValueError, "scan: a stretch outside the block");
            goto done;
        }
        st[k].start = start;
        st[k].stop = stop;
        st[k].hist = into;
    }
    into->journaled = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n && !refused && !failed; k++) {
        int r = vllm ? vllm_stretch(block.buf, st[k].start, st[k].stop, tag, &st[k])
                     : sglang_stretch(block.buf, st[k].start, st[k].stop, &st[k]);
        refused = r == 0;
        failed = r < 0;
    }
    Py_END_ALLOW_THREADS
    if (failed || refused) take_back(into);
    into->journaled = 0;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (refused) {  /* the Python path reads this block */
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyList_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        PyObject *item = st[k].lines ? stretch_result(&st[k], vllm) : Py_NewRef(Py_None);
        if (!item) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, item);
    }
done:
    PyMem_RawFree(st);
    Py_XDECREF(seq);
    PyBuffer_Release(&block);
    if (engine.obj) PyBuffer_Release(&engine);
    return out;
}

/* contains(block, needle, key): whether needle is in block, found by memchr of needle[key] */
static PyObject *contains(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer block, needle;
    Py_ssize_t key, found = -1;
    if (!PyArg_ParseTuple(args, "y*y*n", &block, &needle, &key)) return NULL;
    if (needle.len && key >= 0 && key < needle.len) {
        Wording w = {needle.buf, needle.len, key, 0, NULL};
        Py_BEGIN_ALLOW_THREADS
        found = find(block.buf, 0, block.len, &w);
        Py_END_ALLOW_THREADS
    } else if (!needle.len) {
        found = 0;
    } else {
        PyErr_SetString(PyExc_ValueError, "contains: the key is a place in the needle");
    }
    PyBuffer_Release(&block);
    PyBuffer_Release(&needle);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(found >= 0);
}

/* first_engine(block): the tag of the block's first `Engine N: Avg prompt`, or None */
static PyObject *first_engine(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer block;
    Span g[MAX_FIELDS];
    Py_ssize_t end, found = -1;
    if (PyObject_GetBuffer(arg, &block, PyBUF_SIMPLE) < 0) return NULL;
    const char *s = block.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t at = find(s, 0, block.len, &VLLM_ENGINE); at >= 0; at = find(s, at + 1, block.len, &VLLM_ENGINE)) {
        clear(g, VLLM_ENGINE.fields);
        if (VLLM_ENGINE.match(s, at, block.len, g, &end) == YES) {
            found = at;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *out = found < 0 ? Py_NewRef(Py_None)
                              : PyBytes_FromStringAndSize(g[VLLM_ENGINE_ENGINE].at, g[VLLM_ENGINE_ENGINE].len);
    PyBuffer_Release(&block);
    return out;
}

/* the digest of the wordings this build was generated from: capdiag/scanner.py uses the
 * scanner only where traffic_shapes.digest() is the same */
static PyObject *digest(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(WORDINGS_DIGEST);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Sum the traffic lines of each stretch of a block, or None: see capdiag/scanner.py."},
    {"first_engine", first_engine, METH_O, "The tag of a block's first `Engine N: Avg prompt`, or None."},
    {"contains", contains, METH_VARARGS, "Whether a needle is in a block: memchr of its rarest byte, then the needle."},
    {"digest", digest, METH_NOARGS, "The digest of the wordings this build was generated from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "capdiag._scan", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&HistogramType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Histogram", (PyObject *)&HistogramType) < 0) Py_CLEAR(m);
    return m;
}
