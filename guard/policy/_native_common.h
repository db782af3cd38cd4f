/*
 * What the four native extensions share: guard/policy/_speedups.c,
 * guard/server/decode/_otlpnative.c, guard/server/applier/_applynative.c and
 * guard/store/_rowsnative.c each include this header once (everything in it is static to the
 * translation unit):
 *   - the entries of their method tables and the argument-count check of a fast-call function;
 *   - the interned str constants a module creates once;
 *   - their multi-phase initialisation (PEP 489): the module definition and its PyInit, and
 *     the slots that say what a module supports (subinterpreters from 3.12, running without
 *     the GIL from 3.13), in one place.
 * Public CPython API only.
 */
#ifndef GUARD_NATIVE_COMMON_H
#define GUARD_NATIVE_COMMON_H

#include <Python.h>

/* ---- method tables ------------------------------------------------------------------------ */

/* A METH_FASTCALL entry (ml_meth is declared as a PyCFunction: the cast goes through a
 * function pointer of no prototype, so that no compiler warns about it). */
#define GUARD_FASTCALL(name, fn, doc) {name, (PyCFunction)(void (*)(void))(fn), METH_FASTCALL, doc}

/* A fast-call function's check of its argument count: 1 when nargs is n, else 0 with
 * TypeError "<name>() takes <n> arguments". */
static inline int guard_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t n) {
    if (nargs == n) return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", name, n);
    return 0;
}

/* ---- constants ---------------------------------------------------------------------------- */

/* An interned str a module keeps in a static variable for the process's life. */
typedef struct {
    PyObject **at;
    const char *text;
} guard_name;

/* Each name interned into its variable, unless the variable is set already (so a call after
 * one that failed half-way makes only what is missing): 0, or -1 with an exception. */
static inline int guard_intern(const guard_name *names, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject **at = names[i].at;
        if (*at == NULL && (*at = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    }
    return 0;
}

/* ---- multi-phase initialisation (PEP 489) --------------------------------------------------
 * GUARD_SLOT_INTERPRETERS(v): the module's Py_mod_multiple_interpreters slot (3.12+, where
 * the slot exists); GUARD_SLOT_GIL(v): its Py_mod_gil slot (3.13+). Each expands to a slot
 * entry and its comma, or to nothing on an older Python (the value's name is not needed then). */
#if PY_VERSION_HEX >= 0x030C0000
#define GUARD_SLOT_INTERPRETERS(v) {Py_mod_multiple_interpreters, (v)},
#else
#define GUARD_SLOT_INTERPRETERS(v)
#endif
#if PY_VERSION_HEX >= 0x030D0000
#define GUARD_SLOT_GIL(v) {Py_mod_gil, (v)},
#else
#define GUARD_SLOT_GIL(v)
#endif

/* The slots of a module whose state is process-wide (static variables that a configure() or
 * bind() writes after import), which therefore is one per process:
 *   - not loaded into a subinterpreter: importing it there raises ImportError, instead of a
 *     second module sharing (or re-configuring) the one state across interpreters;
 *   - it needs the GIL: that state is written after import and read by every call without a
 *     lock of its own (a free-threaded 3.13 build turns the GIL on when it is imported). */
#define GUARD_SLOTS_ONE_PER_PROCESS                                                            \
    GUARD_SLOT_INTERPRETERS(Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED)                        \
    GUARD_SLOT_GIL(Py_MOD_GIL_USED)

/* The definition of the extension module NAME (its m_name "NAME") with no module state, its
 * methods and slots, and PyInit_NAME, which hands it to multi-phase initialisation. */
#define GUARD_MODULE(NAME, DOC, METHODS, SLOTS)                                                \
    static struct PyModuleDef NAME##_module = {                                                \
        PyModuleDef_HEAD_INIT, #NAME, DOC, 0, METHODS, SLOTS, NULL, NULL, NULL};               \
    PyMODINIT_FUNC PyInit_##NAME(void) { return PyModuleDef_Init(&NAME##_module); }

#endif /* GUARD_NATIVE_COMMON_H */
