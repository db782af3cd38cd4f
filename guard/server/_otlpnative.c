/* Native decode of an OTLP ExportTraceServiceRequest into the guard's observations.
 *
 * One pass over the wire bytes, no protobuf objects: the request is validated as the
 * generated classes would validate it (structure, strict UTF-8 of every string field) and the
 * span attributes the guard reads are turned into Observation lists, exactly as the reference
 * decoder (guard/server/_pydecode.py: decode_spans over the generated classes) turns them.
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
 * Observation class, the operation sets and the span names, all from guard/server/_schema.py
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

static uint32_t hash_bytes(const char *p, Py_ssize_t n) {
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
enum { L_REQUEST = 0, L_RESOURCE = 1, L_SCOPE = 2 };

static PyObject *sp_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
        if (!PyArg_ParseTuple(args[1], "ninn", &pos, &level, &rs_end, &ss_end)) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        if (pos < 0 || pos > size || rs_end > size || ss_end > size || level < 0 || level > 2) {
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
        if (level == L_SCOPE) {
            rd in = {r.p, base + ss_end};
            if (in.p >= in.end) {
                level = L_RESOURCE;
                continue;
            }
            if (wire_tag(&in, &tag) < 0)
                goto fallback;
            if (tag == 0x12) { /* 2 spans */
                if (delimited(&in, &s, &len) < 0)
                    goto fallback;
                rc = span(s, len, out, 3);
                if (rc < 0)
                    goto failed;
                spans++;
            } else if (tag == 0x0A) { /* 1 scope */
                if (delimited(&in, &s, &len) < 0 || validate(s, len, M_SCOPE, 3) < 0)
                    goto fallback;
            } else if (tag == 0x1A) { /* 3 schema_url */
                if (delimited(&in, &s, &len) < 0 || !utf8_ok(s, len, NULL))
                    goto fallback;
            } else {
                goto fallback;
            }
            r.p = in.p;
        } else if (level == L_RESOURCE) {
            rd in = {r.p, base + rs_end};
            if (in.p >= in.end) {
                level = L_REQUEST;
                continue;
            }
            if (wire_tag(&in, &tag) < 0)
                goto fallback;
            if (tag == 0x12) { /* 2 scope_spans: descend */
                if (delimited(&in, &s, &len) < 0)
                    goto fallback;
                ss_end = (s - base) + len;
                in.p = s;
                level = L_SCOPE;
            } else if (tag == 0x0A) { /* 1 resource */
                if (delimited(&in, &s, &len) < 0 || validate(s, len, M_RESOURCE, 2) < 0)
                    goto fallback;
            } else if (tag == 0x1A) { /* 3 schema_url */
                if (delimited(&in, &s, &len) < 0 || !utf8_ok(s, len, NULL))
                    goto fallback;
            } else {
                goto fallback;
            }
            r.p = in.p;
        } else {
            if (r.p >= r.end)
                break;
            if (wire_tag(&r, &tag) < 0 || tag != 0x0A) /* 1 resource_spans: descend */
                goto fallback;
            if (delimited(&r, &s, &len) < 0)
                goto fallback;
            rs_end = (s - base) + len;
            r.p = s;
            level = L_RESOURCE;
        }
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
static int copy_ops(PyObject *seq, char **ops, Py_ssize_t *lens, int *count) {
    PyObject *fast = PySequence_Fast(seq, "operations must be a sequence of str");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_OPS) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many operations");
        return -1;
    }
    for (int i = 0; i < *count; i++)
        PyMem_Free(ops[i]);
    *count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(fast, i), &len);
        if (s == NULL) {
            Py_DECREF(fast);
            return -1;
        }
        ops[i] = PyMem_Malloc((size_t)len + 1);
        if (ops[i] == NULL) {
            Py_DECREF(fast);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(ops[i], s, (size_t)len + 1);
        lens[i] = len;
        *count = (int)i + 1;
    }
    Py_DECREF(fast);
    return 0;
}

static int get_int(PyObject *d, const char *name, int *out) {
    PyObject *v = PyDict_GetItemString(d, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: missing %s", name);
        return -1;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int)x;
    return 0;
}

static int copy_name(PyObject *v, char *dst) {
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(v, &len);
    if (s == NULL)
        return -1;
    if (len == 0 || len >= MAX_NAME) {
        PyErr_SetString(PyExc_ValueError, "configure: a name must have 1..63 bytes");
        return -1;
    }
    memcpy(dst, s, (size_t)len + 1);
    return 0;
}

/* configure(keys, slots, observation, model_ops, aggregate_ops, bounds, unique, names)
 *   keys: {str: (slot, type)}; slots: {name: index} incl. "NSLOTS" and the KIND_* values;
 *   bounds: (max_counter, max_id_chars, max_cost); unique: slots of per-call strings;
 *   names: (step span name, run operation, tool operation) */
static PyObject *sp_configure(PyObject *self, PyObject *args) {
    PyObject *keys, *slots, *cls, *mops, *aops, *unique, *n_step, *n_run, *n_tool;
    long long mc;
    Py_ssize_t mid;
    double mcost;
    if (!PyArg_ParseTuple(args, "O!O!OOO(Lnd)O(OOO)", &PyDict_Type, &keys, &PyDict_Type, &slots,
                          &cls, &mops, &aops, &mc, &mid, &mcost, &unique, &n_step, &n_run,
                          &n_tool))
        return NULL;
    if (copy_name(n_step, step_span) < 0 || copy_name(n_run, invoke_agent) < 0 ||
        copy_name(n_tool, execute_tool) < 0)
        return NULL;
    snprintf(tool_head, sizeof(tool_head), "%s ", execute_tool);
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: the observation class must subclass list");
        return NULL;
    }
    struct {
        const char *name;
        int *dst;
    } names[] = {{"RUN_ID", &S_RUN_ID},       {"OP", &S_OP},
                 {"MODEL", &S_MODEL},         {"RESP_MODEL", &S_RESP_MODEL},
                 {"IN", &S_IN},               {"OUT", &S_OUT},
                 {"CACHED", &S_CACHED},       {"REASONING", &S_REASONING},
                 {"TOOL_NAME", &S_TOOL_NAME}, {"ERROR", &S_ERROR},
                 {"KIND", &S_KIND},           {"FOREIGN", &S_FOREIGN},
                 {"TRACE_ID", &S_TRACE_ID},   {"SPAN_ID", &S_SPAN_ID},
                 {"PARENT_SPAN_ID", &S_PARENT_SPAN_ID}, {"NSLOTS", &nslots},
                 {"KIND_RUN", &K_RUN},        {"KIND_STEP", &K_STEP},
                 {"KIND_MODEL", &K_MODEL},    {"KIND_TOOL", &K_TOOL}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (get_int(slots, names[i].name, names[i].dst) < 0)
            return NULL;
    if (nslots <= 0 || nslots > MAX_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "configure: NSLOTS out of range");
        return NULL;
    }
    int kinds[4] = {K_RUN, K_STEP, K_MODEL, K_TOOL};
    for (int i = 0; i < 4; i++)
        if (kinds[i] < 1 || kinds[i] > 4) {
            PyErr_SetString(PyExc_ValueError, "configure: KIND_* must be 1..4");
            return NULL;
        }
    for (int i = 0; i < TABLE_SIZE; i++) {
        PyMem_Free((void *)table[i].key);
        table[i].key = NULL;
    }
    PyObject *k, *v;
    Py_ssize_t it = 0, count = 0;
    while (PyDict_Next(keys, &it, &k, &v)) {
        Py_ssize_t len;
        int slot, type;
        const char *s = PyUnicode_AsUTF8AndSize(k, &len);
        if (s == NULL || !PyArg_ParseTuple(v, "ii", &slot, &type))
            return NULL;
        if (slot < 0 || slot >= nslots || type < 0 || type > 4 || ++count > TABLE_SIZE / 4) {
            PyErr_SetString(PyExc_ValueError, "configure: bad key table");
            return NULL;
        }
        char *copy = PyMem_Malloc((size_t)len + 1);
        if (copy == NULL)
            return PyErr_NoMemory();
        memcpy(copy, s, (size_t)len + 1);
        uint32_t i = hash_bytes(s, len) & (TABLE_SIZE - 1);
        while (table[i].key != NULL)
            i = (i + 1) & (TABLE_SIZE - 1);
        table[i] = (entry){copy, len, slot, type};
    }
    if (copy_ops(mops, model_ops, model_ops_len, &n_model_ops) < 0 ||
        copy_ops(aops, aggregate_ops, aggregate_ops_len, &n_aggregate_ops) < 0)
        return NULL;
    memset(unique_slot, 0, sizeof(unique_slot));
    PyObject *fast = PySequence_Fast(unique, "unique must be a sequence of slots");
    if (fast == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        long u = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (u < 0 || u >= nslots) {
            Py_DECREF(fast);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "configure: unique slot out of range");
            return NULL;
        }
        unique_slot[u] = 1;
    }
    Py_DECREF(fast);
    for (int i = 0; i < CACHE_SIZE; i++)
        Py_CLEAR(cache[i].value);
    for (int i = 1; i <= 4; i++) {
        Py_XSETREF(kind_obj[i], PyLong_FromLong(i));
        if (kind_obj[i] == NULL)
            return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(obs_type, cls);
    max_counter = mc;
    max_id_chars = mid;
    max_cost = mcost;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", sp_configure, METH_VARARGS,
     "configure(keys, slots, observation_class, model_ops, aggregate_ops, bounds, unique, names)"},
    {"decode", (PyCFunction)(void (*)(void))sp_decode, METH_FASTCALL,
     "decode(data, state, max_spans) -> (observations, spans, state) | None (fall back)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpnative",
                                    "Native OTLP span decode (see _nativedecode.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__otlpnative(void) {
    str_error = PyUnicode_InternFromString("error");
    str_empty = PyUnicode_InternFromString("");
    int_zero = PyLong_FromLong(0);
    if (str_error == NULL || str_empty == NULL || int_zero == NULL)
        return NULL;
    return PyModule_Create(&module);
}
