/* Native decode of an OTLP ExportTraceServiceRequest into the guard's observations.
 *
 * One pass over the wire bytes, no protobuf objects: the request is validated as the
 * generated classes would validate it (structure, strict UTF-8 of every string field) and the
 * span attributes the guard reads are turned into Observation lists, exactly as the reference
 * decoder (guard/server/decode/_pydecode.py: decode_spans over the generated classes) turns them.
 *
 * Exactness by refusal: this path only answers for the canonical, well-formed case. Anything
 * else (an unknown field, a field with an unexpected wire type, a oneof or a value given
 * twice, a counter out of range, a value of another type than expected for a known key, a span
 * the reference would reject, nesting deeper than MAX_DEPTH, invalid UTF-8, a truncated
 * message, a varint padded wider than protobuf's parser reads: see _otlp_wire.h) makes
 * decode() return None, and the caller decodes the whole request with the reference, which
 * then says what is wrong with the reference's own words. So a request is never accepted
 * here that the reference refuses, and what is accepted decodes to the same observations
 * (tests/server/test_native_decode.py and test_native_decode_varints.py hold the two equal).
 *
 * Resumable: decode(data, state, max_spans) decodes at most max_spans spans and returns the
 * state to continue from, so the caller can yield to its event loop between slices of a
 * large request. The state is (position, level, end of the current ResourceSpans, end of the
 * current ScopeSpans): the only nesting above a span.
 *
 * Configured once by configure(): the key table (key bytes -> (slot, type)), the slots, the
 * Observation class, the operation sets and the span names, all from guard/server/decode/_schema.py
 * and guard/semconv.py, so the names and numbers live in one place.
 *
 * Parts (one translation unit): this file (configuration, the request walk, the module),
 * _otlp_wire.h (wire primitives, strict UTF-8, validation of what is not read) and
 * _otlp_span.h (one span: attributes, classification, the Observation).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../policy/_native_common.h"

#define MAX_DEPTH 32
#define MAX_SLOTS 48
#define TABLE_SIZE 512 /* open addressing, power of two, > 4x the keys */

enum { T_STR = 0, T_INT = 1, T_FLOAT = 2, T_BOOL = 3, T_HEX = 4 };

/* ---- configuration ------------------------------------------------------------------- */
typedef struct {
    const char *key; /* owned copy; NULL = empty entry */
    Py_ssize_t len;
    int slot;
    int type;
} entry;

static entry table[TABLE_SIZE];
static PyObject *obs_type = NULL;  /* the Observation class (a list subclass) */
static PyObject *kind_obj[5];      /* the KIND_* ints, by kind */
static PyObject *str_error = NULL; /* "error" */
static PyObject *str_empty = NULL; /* "" */
static PyObject *int_zero = NULL;
static PyObject *last_trace = NULL; /* the last trace id returned (see span()) */
static PyObject *nones = NULL;      /* a tuple of NSLOTS Nones: a new Observation's items */
/* the span and operation names classify() reads (guard.semconv): the step span's name, the
 * run's and the tool's operation (also the head of their span names) */
#define MAX_NAME 64
static char step_span[MAX_NAME], invoke_agent[MAX_NAME], execute_tool[MAX_NAME],
    tool_head[MAX_NAME + 1];
static int nslots = 0;
static int S_RUN_ID, S_OP, S_MODEL, S_RESP_MODEL, S_IN, S_OUT, S_CACHED, S_REASONING,
    S_TOOL_NAME, S_ERROR, S_KIND, S_FOREIGN, S_TRACE_ID, S_SPAN_ID, S_PARENT_SPAN_ID;
static int K_RUN, K_STEP, K_MODEL, K_TOOL;
static long long max_counter = 0;
static Py_ssize_t max_id_chars = 0;
static double max_cost = 0.0;
/* operation names as bytes: model calls, and aggregates (never a call when foreign) */
#define MAX_OPS 32
static char *model_ops[MAX_OPS];
static Py_ssize_t model_ops_len[MAX_OPS];
static int n_model_ops = 0;
static char *aggregate_ops[MAX_OPS];
static Py_ssize_t aggregate_ops_len[MAX_OPS];
static int n_aggregate_ops = 0;

static inline uint32_t hash_bytes(const char *p, Py_ssize_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 16777619u;
    }
    return h;
}

static const entry *lookup(const char *p, Py_ssize_t n) {
    uint32_t i = hash_bytes(p, n) & (TABLE_SIZE - 1);
    for (;;) {
        const entry *e = &table[i];
        if (e->key == NULL)
            return NULL;
        if (e->len == n && memcmp(e->key, p, (size_t)n) == 0)
            return e;
        i = (i + 1) & (TABLE_SIZE - 1);
    }
}

#include "_otlp_wire.h"
#include "_otlp_span.h"

/* ---- the request: ExportTraceServiceRequest > ResourceSpans > ScopeSpans > Span ----------- */
enum { L_REQUEST = 0, L_RESOURCE = 1, L_SCOPE = 2 }; /* each its message's nesting depth */

/* A field of the ResourceSpans (level L_RESOURCE) or the ScopeSpans (L_SCOPE) being walked,
 * other than its field 2 (its scope_spans or spans: the walk's), the tag read: 1 its resource
 * or its scope (validated, a message one level deeper), 3 its schema_url. 0, or -1 for
 * anything else (fall back). */
static inline int level_field(rd *in, uint64_t tag, int level) {
    const unsigned char *s;
    Py_ssize_t len;
    if (tag == 0x0A) /* 1 resource | scope */
        return message_field(in, level == L_SCOPE ? M_SCOPE : M_RESOURCE, level + 1);
    if (tag == 0x1A) /* 3 schema_url */
        return utf8_field(in, &s, &len);
    return -1;
}

static PyObject *sp_decode(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(data, state, max_spans)");
        return NULL;
    }
    if (obs_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t max_spans = PyLong_AsSsize_t(args[2]);
    if (max_spans == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const unsigned char *base = buf.buf;
    Py_ssize_t size = buf.len, pos = 0, rs_end = 0, ss_end = 0;
    int level = L_REQUEST;
    if (args[1] != Py_None) {
        /* a state decode() returned: (pos, level, rs_end, ss_end), every offset inside the
         * data, the position inside the message of its level (pos <= ss_end <= rs_end) */
        if (!PyTuple_Check(args[1])) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_TypeError, "decode(): the state is a tuple decode() returned");
            return NULL;
        }
        if (!PyArg_ParseTuple(args[1], "ninn", &pos, &level, &rs_end, &ss_end)) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        if (pos < 0 || pos > size || rs_end < 0 || rs_end > size || ss_end < 0 ||
            ss_end > size || level < L_REQUEST || level > L_SCOPE ||
            (level >= L_RESOURCE && pos > rs_end) ||
            (level == L_SCOPE && (pos > ss_end || ss_end > rs_end))) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_ValueError, "bad state");
            return NULL;
        }
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t spans = 0;
    rd r = {base + pos, base + size};
    int rc = 0;
    while (spans < max_spans) {
        const unsigned char *s;
        Py_ssize_t len;
        uint64_t tag;
        if (level == L_REQUEST) {
            if (r.p >= r.end)
                break;
            if (wire_tag(&r, &tag) < 0 || tag != 0x0A) /* 1 resource_spans: descend */
                goto fallback;
            if (delimited(&r, &s, &len) < 0)
                goto fallback;
            rs_end = (s - base) + len;
            r.p = s;
            level = L_RESOURCE;
            continue;
        }
        /* in a ResourceSpans or a ScopeSpans, which share their layout */
        rd in = {r.p, base + (level == L_SCOPE ? ss_end : rs_end)};
        if (in.p >= in.end) { /* its end: up a level */
            level = level == L_SCOPE ? L_RESOURCE : L_REQUEST;
            continue;
        }
        if (wire_tag(&in, &tag) < 0)
            goto fallback;
        if (tag == 0x12) {
            if (delimited(&in, &s, &len) < 0)
                goto fallback;
            if (level == L_SCOPE) { /* 2 spans */
                rc = span(s, len, out, 3);
                if (rc < 0)
                    goto failed;
                spans++;
            } else { /* 2 scope_spans: descend */
                ss_end = (s - base) + len;
                in.p = s;
                level = L_SCOPE;
            }
        } else if (level_field(&in, tag, level) < 0) {
            goto fallback;
        }
        r.p = in.p;
    }
    pos = r.p - base;
    PyBuffer_Release(&buf);
    int finished = level == L_REQUEST && pos >= size;
    PyObject *state;
    if (finished) {
        state = Py_None;
        Py_INCREF(state);
    } else {
        state = Py_BuildValue("(ninn)", pos, level, rs_end, ss_end);
        if (state == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    }
    PyObject *result = Py_BuildValue("(NnN)", out, spans, state);
    return result;
failed:
    if (rc == -2) {
        PyBuffer_Release(&buf);
        Py_DECREF(out);
        return NULL;
    }
fallback:
    PyBuffer_Release(&buf);
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* ---- configure ------------------------------------------------------------------------- */
typedef struct {
    char *ops[MAX_OPS];
    Py_ssize_t lens[MAX_OPS];
    int count;
} opset;

static void opset_free(opset *o) {
    for (int i = 0; i < o->count; i++)
        PyMem_Free(o->ops[i]);
    o->count = 0;
}

static int copy_ops(PyObject *seq, opset *out) {
    PyObject *fast = PySequence_Fast(seq, "operations must be a sequence of str");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_OPS) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many operations");
        return -1;
    }
    out->count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        const char *s = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &len) : NULL;
        if (s == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "operations must be a sequence of str");
            goto fail;
        }
        out->ops[i] = PyMem_Malloc((size_t)len + 1);
        if (out->ops[i] == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(out->ops[i], s, (size_t)len + 1);
        out->lens[i] = len;
        out->count = (int)i + 1;
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    opset_free(out);
    return -1;
}

/* d[name] as an int in [lo, hi) */
static int get_int(PyObject *d, const char *name, int lo, int hi, int *out) {
    PyObject *v = PyDict_GetItemString(d, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: missing %s", name);
        return -1;
    }
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "configure: %s must be an int", name);
        return -1;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < lo || x >= hi) {
        PyErr_Format(PyExc_ValueError, "configure: %s out of range", name);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int copy_name(PyObject *v, char *dst) {
    Py_ssize_t len;
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8AndSize(v, &len) : NULL;
    if (s == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "configure: a name must be a str");
        return -1;
    }
    if (len == 0 || len >= MAX_NAME || strlen(s) != (size_t)len) {
        PyErr_SetString(PyExc_ValueError, "configure: a name must have 1..63 bytes");
        return -1;
    }
    memcpy(dst, s, (size_t)len + 1);
    return 0;
}

static void table_free(entry *t) {
    for (int i = 0; i < TABLE_SIZE; i++) {
        PyMem_Free((void *)t[i].key);
        t[i].key = NULL;
    }
}

/* configure(keys, slots, observation, model_ops, aggregate_ops, bounds, unique, names)
 *   keys: {str: (slot, type)}; slots: {name: index} incl. "NSLOTS" and the KIND_* values;
 *   bounds: (max_counter, max_id_chars, max_cost); unique: slots of per-call strings;
 *   names: (step span name, run operation, tool operation)
 * All or nothing: everything is read and checked (every slot index inside NSLOTS) into
 * locals, and only then does the configuration change. */
static PyObject *sp_configure(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *keys, *slots, *cls, *mops, *aops, *unique, *n_step, *n_run, *n_tool;
    long long mc;
    Py_ssize_t mid;
    double mcost;
    char step_l[MAX_NAME], run_l[MAX_NAME], tool_l[MAX_NAME];
    if (!PyArg_ParseTuple(args, "O!O!OOO(Lnd)O(OOO)", &PyDict_Type, &keys, &PyDict_Type, &slots,
                          &cls, &mops, &aops, &mc, &mid, &mcost, &unique, &n_step, &n_run,
                          &n_tool))
        return NULL;
    if (copy_name(n_step, step_l) < 0 || copy_name(n_run, run_l) < 0 ||
        copy_name(n_tool, tool_l) < 0)
        return NULL;
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: the observation class must subclass list");
        return NULL;
    }
    if (mc < 0 || mid < 0 || !(mcost >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "configure: bounds must be >= 0");
        return NULL;
    }
    int n_slots, v_slot[15], v_kind[4];
    static const char *const slot_names[15] = {
        "RUN_ID", "OP", "MODEL", "RESP_MODEL", "IN", "OUT", "CACHED", "REASONING",
        "TOOL_NAME", "ERROR", "KIND", "FOREIGN", "TRACE_ID", "SPAN_ID", "PARENT_SPAN_ID"};
    static const char *const kind_names[4] = {"KIND_RUN", "KIND_STEP", "KIND_MODEL", "KIND_TOOL"};
    if (get_int(slots, "NSLOTS", 1, MAX_SLOTS + 1, &n_slots) < 0)
        return NULL;
    for (int i = 0; i < 15; i++)
        if (get_int(slots, slot_names[i], 0, n_slots, &v_slot[i]) < 0)
            return NULL;
    for (int i = 0; i < 4; i++)
        if (get_int(slots, kind_names[i], 1, 5, &v_kind[i]) < 0)
            return NULL;
    unsigned char uniq[MAX_SLOTS];
    memset(uniq, 0, sizeof(uniq));
    PyObject *fast = PySequence_Fast(unique, "unique must be a sequence of slots");
    if (fast == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        long u = PyLong_Check(item) ? PyLong_AsLong(item) : -1;
        if (u < 0 || u >= n_slots) {
            Py_DECREF(fast);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "configure: unique slot out of range");
            return NULL;
        }
        uniq[u] = 1;
    }
    Py_DECREF(fast);
    entry *tab = PyMem_Calloc(TABLE_SIZE, sizeof(entry));
    if (tab == NULL)
        return PyErr_NoMemory();
    opset mo = {0}, ao = {0};
    Py_ssize_t count = 0;
    /* a snapshot of the pairs (the ints' __index__ below may run code that changes `keys`) */
    PyObject *pairs = PyDict_Items(keys);
    if (pairs == NULL)
        goto fail;
    for (Py_ssize_t it = 0; it < PyList_GET_SIZE(pairs); it++) {
        PyObject *k = PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, it), 0);
        PyObject *v = PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, it), 1);
        Py_ssize_t len;
        int slot, type;
        const char *s = NULL;
        /* the value first: its ints' __index__ may run Python code; the key's bytes after */
        if (!PyTuple_Check(v) || !PyArg_ParseTuple(v, "ii", &slot, &type) ||
            !PyUnicode_Check(k) || (s = PyUnicode_AsUTF8AndSize(k, &len)) == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "configure: keys are {str: (slot, type)}");
            goto fail;
        }
        if (slot < 0 || slot >= n_slots || type < 0 || type > 4 || ++count > TABLE_SIZE / 4) {
            PyErr_SetString(PyExc_ValueError, "configure: bad key table");
            goto fail;
        }
        uint32_t i = hash_bytes(s, len) & (TABLE_SIZE - 1);
        while (tab[i].key != NULL) {
            if (tab[i].len == len && memcmp(tab[i].key, s, (size_t)len) == 0)
                break; /* (a str subclass key equal to another's bytes: the last counts) */
            i = (i + 1) & (TABLE_SIZE - 1);
        }
        char *copy = PyMem_Malloc((size_t)len + 1);
        if (copy == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(copy, s, (size_t)len + 1);
        PyMem_Free((void *)tab[i].key);
        tab[i] = (entry){copy, len, slot, type};
    }
    Py_CLEAR(pairs);
    if (copy_ops(mops, &mo) < 0 || copy_ops(aops, &ao) < 0)
        goto fail;
    PyObject *kinds[5] = {NULL};
    PyObject *none_row = PyTuple_New(n_slots);
    if (none_row == NULL)
        goto fail;
    for (int i = 0; i < n_slots; i++)
        PyTuple_SET_ITEM(none_row, i, Py_NewRef(Py_None));
    for (int i = 1; i <= 4; i++)
        if ((kinds[i] = PyLong_FromLong(i)) == NULL) {
            for (int j = 1; j < i; j++)
                Py_DECREF(kinds[j]);
            Py_DECREF(none_row);
            goto fail;
        }
    /* commit */
    table_free(table);
    memcpy(table, tab, sizeof(entry) * TABLE_SIZE);
    PyMem_Free(tab);
    for (int i = 0; i < n_model_ops; i++)
        PyMem_Free(model_ops[i]);
    for (int i = 0; i < n_aggregate_ops; i++)
        PyMem_Free(aggregate_ops[i]);
    memcpy(model_ops, mo.ops, sizeof(mo.ops));
    memcpy(model_ops_len, mo.lens, sizeof(mo.lens));
    n_model_ops = mo.count;
    memcpy(aggregate_ops, ao.ops, sizeof(ao.ops));
    memcpy(aggregate_ops_len, ao.lens, sizeof(ao.lens));
    n_aggregate_ops = ao.count;
    memcpy(step_span, step_l, sizeof(step_l));
    memcpy(invoke_agent, run_l, sizeof(run_l));
    memcpy(execute_tool, tool_l, sizeof(tool_l));
    snprintf(tool_head, sizeof(tool_head), "%s ", execute_tool);
    nslots = n_slots;
    int *dst[15] = {&S_RUN_ID, &S_OP, &S_MODEL, &S_RESP_MODEL, &S_IN, &S_OUT, &S_CACHED,
                    &S_REASONING, &S_TOOL_NAME, &S_ERROR, &S_KIND, &S_FOREIGN, &S_TRACE_ID,
                    &S_SPAN_ID, &S_PARENT_SPAN_ID};
    for (int i = 0; i < 15; i++)
        *dst[i] = v_slot[i];
    K_RUN = v_kind[0], K_STEP = v_kind[1], K_MODEL = v_kind[2], K_TOOL = v_kind[3];
    memcpy(unique_slot, uniq, sizeof(uniq));
    for (int i = 0; i < CACHE_SIZE; i++)
        Py_CLEAR(cache[i].value);
    for (int i = 1; i <= 4; i++)
        Py_XSETREF(kind_obj[i], kinds[i]);
    Py_XSETREF(nones, none_row);
    Py_INCREF(cls);
    Py_XSETREF(obs_type, cls);
    max_counter = mc;
    max_id_chars = mid;
    max_cost = mcost;
    Py_RETURN_NONE;
fail:
    Py_XDECREF(pairs);
    table_free(tab);
    PyMem_Free(tab);
    opset_free(&mo);
    opset_free(&ao);
    return NULL;
}

static PyMethodDef methods[] = {
    {"configure", sp_configure, METH_VARARGS,
     "configure(keys, slots, observation_class, model_ops, aggregate_ops, bounds, unique, names)"},
    GUARD_FASTCALL("decode", sp_decode,
        "decode(data, state, max_spans) -> (observations, spans, state) | None (fall back)"),
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *Py_UNUSED(m)) {
    static const guard_name names[] = {{&str_error, "error"}, {&str_empty, ""}};
    if (int_zero == NULL && (int_zero = PyLong_FromLong(0)) == NULL)
        return -1;
    return guard_intern(names, Py_ARRAY_LENGTH(names));
}

/* Multi-phase initialisation (PEP 489). The configuration, the string cache and the last trace
 * id are process-wide (configure() is called once, by guard/server/decode/_nativedecode.py), so the
 * module is one per process: not loaded into subinterpreters, and it keeps the GIL (3.13
 * free threading: the string cache is shared by every call). */
static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec}, GUARD_SLOTS_ONE_PER_PROCESS {0, NULL}};

GUARD_MODULE(_otlpnative, "Native OTLP span decode (see _nativedecode.py).", methods, module_slots)
