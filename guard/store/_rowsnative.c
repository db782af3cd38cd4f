/* The native WAL line of one `runs` row: guard/store/_rows.py `_py_line`, in C.
 *
 * line(fields) takes the 28 Outcome fields in RUN_COLUMNS order (the tuple `_RUN_FIELDS`
 * returns) and answers only for the record the Python fast path answers for: every field
 * already of its column's exact type and range. For anything else it returns None and the
 * caller takes the Python reference, so a case this file does not know cannot be encoded
 * differently. What it writes is byte-identical to `_py_line` (tests/store/test_rows.py):
 *   - strings as json.encoder.encode_basestring_ascii (escapes and hex digits as _json.c);
 *   - timestamps as f"{x:.3f}" and cost as float.__repr__, both through
 *     PyOS_double_to_string with the same format code and flags CPython uses;
 *   - ints in decimal, bools as true/false, an absent optional as null.
 * No I/O, no state but the three enum types configure() sets.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "../policy/_native_common.h"

#define NFIELDS 28
#define UINT32_TOP 4294967295ULL
#define MAX_TS 10413791999.999 /* 2299-12-31 23:59:59.999 UTC, the top of DateTime64(3) */
#define STACK_BYTES 2048

/* One letter a field, RUN_COLUMNS order:
 * S exact str; O None, "" (both null) or exact str; N str or one of the name enums;
 * T timestamp float in [1, MAX_TS] as :.3f; U int in [0, 2**64); D None or U;
 * I int in [0, 2**32); C None or a finite float (repr); B bool. */
static const char SPEC[NFIELDS + 1] = "SOSSNNSTTUDIIIIUUUUCOOIBBSNS";

/* The module's state (multi-phase init, PEP 489): the three name enums configure() set. */
typedef struct {
    PyTypeObject *name_types[3];
} rows_state;

static inline rows_state *
state_of(PyObject *module)
{
    return (rows_state *)PyModule_GetState(module);
}

static int
is_name(rows_state *st, PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    return t == &PyUnicode_Type ||
           (t != NULL && (t == st->name_types[0] || t == st->name_types[1] ||
                          t == st->name_types[2]));
}

/* The worst-case JSON text of a string: 12 chars a code point (a surrogate pair escape). */
static int
add_str_bound(PyObject *s, Py_ssize_t *bound)
{
    if (PyUnicode_READY(s) < 0)
        return -1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n > (PY_SSIZE_T_MAX / 16) - *bound)
        return -1;
    *bound += 2 + (PyUnicode_IS_ASCII(s) ? 6 : 12) * n;
    return 0;
}

static const char HEX[] = "0123456789abcdef";

static char *
put_escape(char *w, Py_UCS4 c)
{
    *w++ = '\\';
    switch (c) {
    case '\\': *w++ = '\\'; return w;
    case '"': *w++ = '"'; return w;
    case '\b': *w++ = 'b'; return w;
    case '\f': *w++ = 'f'; return w;
    case '\n': *w++ = 'n'; return w;
    case '\r': *w++ = 'r'; return w;
    case '\t': *w++ = 't'; return w;
    default: break;
    }
    if (c >= 0x10000) { /* a UTF-16 surrogate pair, as _json.c writes it */
        Py_UCS4 hi = Py_UNICODE_HIGH_SURROGATE(c);
        *w++ = 'u';
        *w++ = HEX[(hi >> 12) & 0xf];
        *w++ = HEX[(hi >> 8) & 0xf];
        *w++ = HEX[(hi >> 4) & 0xf];
        *w++ = HEX[hi & 0xf];
        c = Py_UNICODE_LOW_SURROGATE(c);
        *w++ = '\\';
    }
    *w++ = 'u';
    *w++ = HEX[(c >> 12) & 0xf];
    *w++ = HEX[(c >> 8) & 0xf];
    *w++ = HEX[(c >> 4) & 0xf];
    *w++ = HEX[c & 0xf];
    return w;
}

#define PLAIN(c) ((c) >= ' ' && (c) <= '~' && (c) != '\\' && (c) != '"')

static char *
put_str(char *w, PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    *w++ = '"';
    if (PyUnicode_IS_ASCII(s)) {
        const unsigned char *d = PyUnicode_1BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = d[i];
            if (PLAIN(c))
                *w++ = (char)c;
            else
                w = put_escape(w, c);
        }
    }
    else {
        int kind = PyUnicode_KIND(s);
        const void *d = PyUnicode_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, d, i);
            if (PLAIN(c))
                *w++ = (char)c;
            else
                w = put_escape(w, c);
        }
    }
    *w++ = '"';
    return w;
}

static char *
put_lit(char *w, const char *lit)
{
    while (*lit)
        *w++ = *lit++;
    return w;
}

static char *
put_u(char *w, unsigned long long x)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + x % 10);
        x /= 10;
    } while (x);
    while (n)
        *w++ = tmp[--n];
    return w;
}

/* PyOS_double_to_string's text (at most ~30 chars for a finite double in these formats). */
static char *
put_double(char *w, double x, char code, int precision, int flags)
{
    char *text = PyOS_double_to_string(x, code, precision, flags, NULL);
    if (text == NULL)
        return NULL;
    w = put_lit(w, text);
    PyMem_Free(text);
    return w;
}

/* An exact int in [0, top]: 1 and *out set; 0 otherwise (no exception left set). */
static int
as_u(PyObject *v, unsigned long long top, unsigned long long *out)
{
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (s == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (s < 0)
            return 0;
        *out = (unsigned long long)s;
    }
    else if (overflow < 0)
        return 0;
    else {
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear(); /* 2**64 or more */
            return 0;
        }
        *out = u;
    }
    return *out <= top;
}

static PyObject *
line(PyObject *module, PyObject *fields)
{
    rows_state *st = state_of(module);
    if (!PyTuple_CheckExact(fields) || PyTuple_GET_SIZE(fields) != NFIELDS) {
        PyErr_SetString(PyExc_TypeError, "line() takes the tuple of the 28 runs fields");
        return NULL;
    }
    unsigned long long ints[NFIELDS];
    double floats[NFIELDS];
    Py_ssize_t bound = 64; /* brackets, commas, and slack */
    for (int i = 0; i < NFIELDS; i++) {
        PyObject *v = PyTuple_GET_ITEM(fields, i);
        switch (SPEC[i]) {
        case 'O':
            if (v == Py_None)
                break;
            /* fall through */
        case 'S':
        case 'N':
            if (SPEC[i] == 'N' ? !is_name(st, v) : !PyUnicode_CheckExact(v))
                Py_RETURN_NONE;
            if (add_str_bound(v, &bound) < 0)
                goto refuse;
            break;
        case 'T':
            if (!PyFloat_CheckExact(v))
                Py_RETURN_NONE;
            floats[i] = PyFloat_AS_DOUBLE(v);
            if (!(floats[i] >= 1.0 && floats[i] <= MAX_TS))
                Py_RETURN_NONE;
            bound += 32;
            break;
        case 'C':
            if (v == Py_None)
                break;
            if (!PyFloat_CheckExact(v) || !isfinite(PyFloat_AS_DOUBLE(v)))
                Py_RETURN_NONE;
            floats[i] = PyFloat_AS_DOUBLE(v);
            bound += 32;
            break;
        case 'D':
            if (v == Py_None)
                break;
            /* fall through */
        case 'U':
            if (!as_u(v, ~0ULL, &ints[i]))
                Py_RETURN_NONE;
            bound += 24;
            break;
        case 'I':
            if (!as_u(v, UINT32_TOP, &ints[i]))
                Py_RETURN_NONE;
            bound += 24;
            break;
        case 'B':
            if (v != Py_True && v != Py_False)
                Py_RETURN_NONE;
            bound += 8;
            break;
        }
    }

    char stack[STACK_BYTES];
    char *buf = bound <= STACK_BYTES ? stack : PyMem_Malloc((size_t)bound);
    if (buf == NULL)
        return PyErr_NoMemory();
    char *w = buf;
    *w++ = '[';
    for (int i = 0; i < NFIELDS && w != NULL; i++) {
        PyObject *v = PyTuple_GET_ITEM(fields, i);
        if (i)
            *w++ = ',';
        switch (SPEC[i]) {
        case 'O':
            w = (v == Py_None || PyUnicode_GET_LENGTH(v) == 0) ? put_lit(w, "null")
                                                               : put_str(w, v);
            break;
        case 'S':
        case 'N': w = put_str(w, v); break;
        case 'T': w = put_double(w, floats[i], 'f', 3, 0); break;
        case 'C':
            w = v == Py_None ? put_lit(w, "null")
                             : put_double(w, floats[i], 'r', 0, Py_DTSF_ADD_DOT_0);
            break;
        case 'D':
            if (v == Py_None) {
                w = put_lit(w, "null");
                break;
            }
            /* fall through */
        case 'U':
        case 'I': w = put_u(w, ints[i]); break;
        case 'B': w = put_lit(w, v == Py_True ? "true" : "false"); break;
        }
    }
    PyObject *out = NULL;
    if (w != NULL) {
        *w++ = ']';
        out = PyUnicode_New(w - buf, 127);
        if (out != NULL)
            memcpy(PyUnicode_1BYTE_DATA(out), buf, (size_t)(w - buf));
    }
    if (buf != stack)
        PyMem_Free(buf);
    return out;

refuse: /* a string too long to bound, or not ready: the reference decides */
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyObject *
configure(PyObject *module, PyObject *args)
{
    rows_state *st = state_of(module);
    PyObject *a, *b, *c;
    if (!PyArg_ParseTuple(args, "O!O!O!:configure", &PyType_Type, &a, &PyType_Type, &b,
                          &PyType_Type, &c))
        return NULL;
    PyObject *types[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        if (!PyType_IsSubtype((PyTypeObject *)types[i], &PyUnicode_Type)) {
            PyErr_SetString(PyExc_TypeError, "configure() takes three str subclasses");
            return NULL;
        }
    }
    for (int i = 0; i < 3; i++) {
        Py_INCREF(types[i]);
        Py_XSETREF(st->name_types[i], (PyTypeObject *)types[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"line", line, METH_O,
     "line(fields) -> str | None: the WAL line of one runs row, or None (take the reference)."},
    {"configure", configure, METH_VARARGS,
     "configure(*name_types): the three str enums whose JSON text is their value."},
    {NULL, NULL, 0, NULL},
};

static int
rows_traverse(PyObject *m, visitproc visit, void *arg)
{
    rows_state *st = state_of(m);
    for (int i = 0; i < 3; i++)
        Py_VISIT(st->name_types[i]);
    return 0;
}

static int
rows_clear(PyObject *m)
{
    rows_state *st = state_of(m);
    for (int i = 0; i < 3; i++)
        Py_CLEAR(st->name_types[i]);
    return 0;
}

static void
rows_free(void *m)
{
    rows_clear((PyObject *)m);
}

/* Multi-phase initialisation (PEP 489): all state is the module's (rows_state), so the
 * module is per interpreter and needs no GIL of its own (line() reads only its tuple and the
 * configured types; configure() is called once, at import of guard/store/_rows.py). */
static PyModuleDef_Slot module_slots[] = {
    GUARD_SLOT_INTERPRETERS(Py_MOD_PER_INTERPRETER_GIL_SUPPORTED)
    GUARD_SLOT_GIL(Py_MOD_GIL_NOT_USED)
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "guard.store._rowsnative",
    "The native WAL line of one runs row (see guard/store/_rows.py).", sizeof(rows_state),
    methods, module_slots, rows_traverse, rows_clear, rows_free,
};

PyMODINIT_FUNC
PyInit__rowsnative(void)
{
    return PyModuleDef_Init(&module);
}
