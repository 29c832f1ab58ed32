/* The compiled traffic scanner: the hot part of capdiag/traffic.py, optional.
 *
 * It runs the wordings' programs that capdiag/traffic_shapes.py compiles (the op codes below
 * are that module's), over the stretches of a block the Python path would read, and returns
 * per stretch what the Python path sums from its regular expressions' rows: the line count,
 * the (usage, queued, running) histogram, the peak queue, the throughput range and the sums.
 * Where any line that begins a wording does not match it wholly, or a sum would not fit in 64
 * bits, it returns None: the Python path then reads the block, so a report never depends on
 * which path read it (tests/test_scanner.py proves it on random logs).
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { OP_LIT = 1, OP_EITHER, OP_OPT, OP_RUN, OP_INT, OP_NUM, OP_FLAG };
enum { FIGURE_DIGITS = 15, MAX_FIELDS = 8 };
/* a match: matched, not matched (the optional run that holds it is skipped), or refused
 * (a figure of more digits than a figure has: the regular expression would take part of it) */
enum { NO = 0, YES = 1, REFUSED = -1 };

typedef struct { const char *at; Py_ssize_t len; } Span;
typedef struct { const unsigned char *code; Py_ssize_t len; } Program;

static unsigned short u16(const unsigned char *p) { return (unsigned short)(p[0] | (p[1] << 8)); }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static Py_ssize_t take_digits(const char *s, Py_ssize_t i, Py_ssize_t end) {
    while (i < end && is_digit(s[i])) i++;
    return i;
}

/* Run `prog` on s[*pos:end); on YES, *pos is past the match and fields[] hold the figures. */
static int run(const unsigned char *code, Py_ssize_t len, const char *s, Py_ssize_t *pos, Py_ssize_t end,
               Span *fields) {
    Py_ssize_t i = *pos, pc = 0;
    while (pc < len) {
        unsigned char op = code[pc++];
        switch (op) {
        case OP_LIT: {
            unsigned short n = u16(code + pc);
            pc += 2;
            if (end - i < n || memcmp(s + i, code + pc, n) != 0) return NO;
            i += n;
            pc += n;
            break;
        }
        case OP_EITHER: {
            unsigned char count = code[pc++];
            int found = 0;
            for (unsigned char k = 0; k < count; k++) {
                unsigned short n = u16(code + pc);
                pc += 2;
                if (!found && end - i >= n && memcmp(s + i, code + pc, n) == 0) {
                    i += n;
                    found = 1;
                }
                pc += n;
            }
            if (!found) return NO;
            break;
        }
        case OP_OPT: {
            unsigned short n = u16(code + pc);
            Span saved[MAX_FIELDS];
            Py_ssize_t at = i;
            pc += 2;
            memcpy(saved, fields, sizeof saved);
            int r = run(code + pc, n, s, &at, end, fields);
            if (r == REFUSED) return REFUSED;
            if (r == YES) i = at;
            else memcpy(fields, saved, sizeof saved);
            pc += n;
            break;
        }
        case OP_RUN: {
            unsigned char exact = code[pc], n = code[pc + 1];
            const unsigned char *chars = code + pc + 2;
            Py_ssize_t j = i;
            pc += 2 + n;
            while (j < end && (!exact || j - i < exact) && memchr(chars, (unsigned char)s[j], n)) j++;
            if (j == i || (exact && j - i != exact)) return NO;
            i = j;
            break;
        }
        case OP_INT:
        case OP_NUM: {
            unsigned char slot = code[pc++];
            Py_ssize_t j = take_digits(s, i, end);
            if (j == i) return NO;
            if (j - i > FIGURE_DIGITS) return REFUSED;
            if (op == OP_NUM && j + 1 < end && s[j] == '.' && is_digit(s[j + 1])) {
                Py_ssize_t k = take_digits(s, j + 1, end);
                if (k - (j + 1) > FIGURE_DIGITS) return REFUSED;
                j = k;
            }
            fields[slot].at = s + i;
            fields[slot].len = j - i;
            i = j;
            break;
        }
        case OP_FLAG: {
            unsigned char slot = code[pc];
            unsigned short n = u16(code + pc + 1);
            pc += 3;
            if (end - i >= n && memcmp(s + i, code + pc, n) == 0) {
                fields[slot].at = s + i;
                fields[slot].len = n;
                i += n;
            }
            pc += n;
            break;
        }
        default:
            return REFUSED;
        }
    }
    *pos = i;
    return YES;
}

/* ---- figures */
static int add_int(int64_t *sum, Span f) {
    int64_t v = 0;
    for (Py_ssize_t k = 0; k < f.len; k++) v = v * 10 + (f.at[k] - '0');
    return !__builtin_add_overflow(*sum, v, sum);
}

static int64_t int_of(Span f) {
    int64_t v = 0;
    for (Py_ssize_t k = 0; k < f.len; k++) v = v * 10 + (f.at[k] - '0');
    return v;
}

/* Compare two decimals as printed (digits, perhaps a point and digits): their values, exactly. */
static int decimal_cmp(Span a, Span b) {
    Py_ssize_t ai = 0, bi = 0, ae, be;
    while (ai < a.len && a.at[ai] == '0') ai++;
    while (bi < b.len && b.at[bi] == '0') bi++;
    for (ae = ai; ae < a.len && a.at[ae] != '.'; ae++);
    for (be = bi; be < b.len && b.at[be] != '.'; be++);
    if (ae - ai != be - bi) return ae - ai < be - bi ? -1 : 1;
    int c = memcmp(a.at + ai, b.at + bi, (size_t)(ae - ai));
    if (c) return c < 0 ? -1 : 1;
    Py_ssize_t ap = ae + 1, bp = be + 1;
    while (ap < a.len || bp < b.len) {
        char x = ap < a.len ? a.at[ap] : '0', y = bp < b.len ? b.at[bp] : '0';
        if (x != y) return x < y ? -1 : 1;
        ap++;
        bp++;
    }
    return 0;
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
    unsigned char usage_len, running_len, queued;
    Py_ssize_t n;
    uint64_t hash;
} Entry;
typedef struct { Entry *slots; Py_ssize_t size, used; } Table;

static uint64_t hash_of(const char *u, Py_ssize_t ul, int q, const char *r, Py_ssize_t rl) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)q;
    for (Py_ssize_t k = 0; k < ul; k++) h = (h ^ (unsigned char)u[k]) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
    for (Py_ssize_t k = 0; k < rl; k++) h = (h ^ (unsigned char)r[k]) * 1099511628211ULL;
    return h;
}

static int table_grow(Table *t) {
    Py_ssize_t size = t->size ? t->size * 2 : 256;
    Entry *slots = PyMem_Calloc((size_t)size, sizeof(Entry));
    if (!slots) return 0;
    for (Py_ssize_t k = 0; k < t->size; k++) {
        Entry *e = &t->slots[k];
        if (!e->n) continue;
        Py_ssize_t at = (Py_ssize_t)(e->hash & (uint64_t)(size - 1));
        while (slots[at].n) at = (at + 1) & (size - 1);
        slots[at] = *e;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->size = size;
    return 1;
}

/* add n lines of the key (usage u, queued q, running r); 0: out of memory */
static int table_add(Table *t, const char *u, Py_ssize_t ul, int q, const char *r, Py_ssize_t rl, Py_ssize_t n,
                     uint64_t h) {
    if (2 * (t->used + 1) > t->size && !table_grow(t)) return 0;
    Py_ssize_t at = (Py_ssize_t)(h & (uint64_t)(t->size - 1));
    for (;;) {
        Entry *e = &t->slots[at];
        if (!e->n) {
            memcpy(e->usage, u, (size_t)ul);
            memcpy(e->running, r, (size_t)rl);
            e->usage_len = (unsigned char)ul;
            e->running_len = (unsigned char)rl;
            e->queued = (unsigned char)q;
            e->hash = h;
            e->n = n;
            t->used++;
            return 1;
        }
        if (e->hash == h && e->queued == q && e->usage_len == ul && e->running_len == rl &&
            memcmp(e->usage, u, (size_t)ul) == 0 && memcmp(e->running, r, (size_t)rl) == 0) {
            e->n += n;
            return 1;
        }
        at = (at + 1) & (t->size - 1);
    }
}

static int table_merge(Table *into, const Table *from) {
    for (Py_ssize_t k = 0; k < from->size; k++) {
        const Entry *e = &from->slots[k];
        if (e->n && !table_add(into, e->usage, e->usage_len, e->queued, e->running, e->running_len, e->n, e->hash))
            return 0;
    }
    return 1;
}

/* the Histogram type: one rank's counts across blocks; items() gives them to Python */
typedef struct { PyObject_HEAD Table table; } Histogram;

static void histogram_dealloc(Histogram *self) {
    PyMem_Free(self->table.slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *histogram_items(Histogram *self, PyObject *unused) {
    (void)unused;
    PyObject *d = PyDict_New();
    Table *t = &self->table;
    for (Py_ssize_t k = 0; d && k < t->size; k++) {
        Entry *e = &t->slots[k];
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

static PyTypeObject HistogramType;

static PyObject *histogram_merge(Histogram *self, PyObject *other) {
    if (!PyObject_TypeCheck(other, &HistogramType)) {
        PyErr_SetString(PyExc_TypeError, "merge: a Histogram");
        return NULL;
    }
    if (!table_merge(&self->table, &((Histogram *)other)->table)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef histogram_methods[] = {
    {"items", (PyCFunction)histogram_items, METH_NOARGS,
     "{(usage as printed, queued, running as printed): lines}"},
    {"merge", (PyCFunction)histogram_merge, METH_O, "Add another Histogram's counts to this one's."},
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
    Py_ssize_t lines, prefills;
    int64_t top_queue, top_running, ctx_tokens, ctx_running, prompt_tokens, prompt_seqs, prefill_max, preempted;
    int throughput_seen, preempted_seen, usage_seen;
    Span low, high, top_usage;
    Table *hist;  /* the block's, merged into the rank's when the whole block is read */
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
    int64_t q = int_of(queue), r = int_of(running);
    int queued = queued_of(queue);
    if (q > st->top_queue) st->top_queue = q;
    if (r > st->top_running) st->top_running = r;
    if (usage.len && (!st->usage_seen || decimal_cmp(usage, st->top_usage) > 0)) {
        st->top_usage = usage;
        st->usage_seen = 1;
    }
    st->lines++;
    return table_add(st->hist, usage.at, usage.len, queued, running.at, running.len, 1,
                     hash_of(usage.at, usage.len, queued, running.at, running.len));
}

/* 1: read; 0: not this path's (the block goes to Python); -1: out of memory */
static int sglang_stretch(const char *s, Py_ssize_t start, Py_ssize_t stop, const Program *decode,
                          const Program *tail, const Program *prefill, Stretch *st) {
    static const char batch[] = " batch", gen[] = "gen throughput (token/s): ";
    Py_ssize_t p = start, last_end = start, decodes = 0;
    while (p < stop) {
        const char *h = memmem(s + p, (size_t)(stop - p), batch, 6);
        if (!h) break;
        Py_ssize_t at = h - s, head;
        int is_decode = at - 6 >= start && memcmp(h - 6, "Decode", 6) == 0;
        int is_prefill = !is_decode && at - 7 >= start && memcmp(h - 7, "Prefill", 7) == 0;
        p = at + 6;
        if (!is_decode && !is_prefill) continue;
        head = at - (is_decode ? 6 : 7);
        if (head < last_end) return 0;  /* two batch lines' heads in one line */
        const char *nl = memchr(s + head, '\n', (size_t)(stop - head));
        Py_ssize_t end = nl ? nl - s : stop, pos = head;
        Span f[MAX_FIELDS] = {{0}};
        if (is_decode) {
            Span t[MAX_FIELDS] = {{0}};
            if (run(decode->code, decode->len, s, &pos, end, f) != YES || f[3].at) return 0;
            const char *g = memmem(s + pos, (size_t)(end - pos), gen, sizeof gen - 1);
            if (!g) return 0;
            Py_ssize_t tp = g - s;
            if (run(tail->code, tail->len, s, &tp, end, t) != YES) return 0;
            throughput_add(st, t[0]);
            if (!add_int(&st->ctx_tokens, f[1]) || !add_int(&st->ctx_running, f[0])) return 0;
            if (!line_add(st, f[2], t[1], f[0])) return -1;
            decodes++;
        } else {
            if (run(prefill->code, prefill->len, s, &pos, end, f) != YES) return 0;
            int64_t new_tokens = int_of(f[1]);
            if (!add_int(&st->prompt_tokens, f[1]) || !add_int(&st->prompt_tokens, f[2]) ||
                !add_int(&st->prompt_seqs, f[0]))
                return 0;
            if (new_tokens > st->prefill_max) st->prefill_max = new_tokens;
            if (!line_add(st, f[3], f[5], f[4])) return -1;
            st->prefills++;
        }
        last_end = end;
    }
    /* every decode tail's wording in the stretch is a decode line's own */
    Py_ssize_t tails = 0;
    for (p = start; p < stop;) {
        const char *g = memmem(s + p, (size_t)(stop - p), gen, sizeof gen - 1);
        if (!g) break;
        tails++;
        p = g - s + (Py_ssize_t)(sizeof gen - 1);
    }
    return tails == decodes;
}

static int vllm_stretch(const char *s, Py_ssize_t start, Py_ssize_t stop, const Program *metrics, Stretch *st) {
    const char *anchor = (const char *)metrics->code + 3;
    size_t anchor_len = u16(metrics->code + 1);
    static const Span none = {"", 0};
    Py_ssize_t p = start;
    while (p < stop) {
        const char *h = memmem(s + p, (size_t)(stop - p), anchor, anchor_len);
        if (!h) break;
        Py_ssize_t pos = h - s;
        const char *nl = memchr(h, '\n', (size_t)(stop - pos));
        Span f[MAX_FIELDS] = {{0}};
        if (run(metrics->code, metrics->len, s, &pos, nl ? nl - s : stop, f) != YES) return 0;
        throughput_add(st, f[1]);
        if (f[4].at) {
            st->preempted_seen = 1;
            if (!add_int(&st->preempted, f[4])) return 0;
        }
        if (!line_add(st, f[5].at ? f[5] : none, f[3], f[2])) return -1;
        p = pos;
    }
    return 1;
}

/* ---- the module's functions */
static int program_of(PyObject *o, Program *p) {
    char *code;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(o, &code, &len) < 0) return 0;
    p->code = (const unsigned char *)code;
    p->len = len;
    return 1;
}

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

/* scan(vllm, block, cuts, programs, histogram): one result a stretch (None where it has no
 * traffic line), and `histogram` emptied and filled with the block's lines; or None when the
 * Python path must read the block. */
static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    int vllm;
    Py_buffer block;
    PyObject *cuts, *programs, *out = NULL, *seq = NULL;
    Histogram *into;
    Program prog[3];
    if (!PyArg_ParseTuple(args, "py*OO!O!", &vllm, &block, &cuts, &PyTuple_Type, &programs, &HistogramType, &into))
        return NULL;
    Py_ssize_t nprog = PyTuple_GET_SIZE(programs);
    if (nprog != (vllm ? 1 : 3)) {
        PyErr_SetString(PyExc_ValueError, "scan: one program for vLLM, three for SGLang");
        goto done;
    }
    for (Py_ssize_t k = 0; k < nprog; k++)
        if (!program_of(PyTuple_GET_ITEM(programs, k), &prog[k])) goto done;
    if (prog[0].len < 3 || prog[0].code[0] != OP_LIT) {
        PyErr_SetString(PyExc_ValueError, "scan: a wording begins with a literal");
        goto done;
    }
    PyMem_Free(into->table.slots);
    memset(&into->table, 0, sizeof into->table);
    seq = PySequence_Fast(cuts, "scan: cuts are a sequence of (start, stop)");
    if (!seq) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    out = PyList_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        Py_ssize_t start, stop;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "nn", &start, &stop)) {
            Py_CLEAR(out);
            break;
        }
        if (start < 0 || stop > block.len || start > stop) {
            PyErr_SetString(PyExc_ValueError, "scan: a stretch outside the block");
            Py_CLEAR(out);
            break;
        }
        Stretch st;
        memset(&st, 0, sizeof st);
        st.hist = &into->table;
        int r = vllm ? vllm_stretch(block.buf, start, stop, &prog[0], &st)
                     : sglang_stretch(block.buf, start, stop, &prog[0], &prog[1], &prog[2], &st);
        if (r == 0) {  /* the Python path reads this block */
            Py_SETREF(out, Py_NewRef(Py_None));
            break;
        }
        PyObject *item = r < 0 ? PyErr_NoMemory() : st.lines ? stretch_result(&st, vllm) : Py_NewRef(Py_None);
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, item);
    }
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&block);
    return out;
}

/* the field names each wording's program numbers its figures by, in the order this file reads
 * them: capdiag/scanner.py uses the scanner only where traffic_shapes declares the same */
static PyObject *fields(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("{s(ssss)s(ss)s(ssssss)s(ssssss)}",
                         "sglang decode", "running", "tokens", "usage", "swa",
                         "sglang decode tail", "throughput", "queue",
                         "sglang prefill", "seqs", "new", "cached", "usage", "running", "queue",
                         "vllm metrics", "prompt", "generation", "running", "waiting", "preempted", "usage");
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Sum the traffic lines of each stretch of a block, or None: see capdiag/scanner.py."},
    {"fields", fields, METH_NOARGS, "The field names each wording's figures are read by."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "capdiag._scan", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&HistogramType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Histogram", (PyObject *)&HistogramType) < 0) Py_CLEAR(m);
    return m;
}
