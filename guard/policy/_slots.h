/*
 * Reading and writing the __slots__ of Python objects from C, for the native paths that work
 * on the objects of exactly known classes (guard/policy/_speedups.c's record kernels and
 * guard/server/applier/_applynative.c): a slot's offset is read once from its class's member table
 * (public API: the type's Py_tp_members, the PyMemberDef array __slots__ creates), then the
 * slot is one pointer in the object. The callers check every object's exact type against the
 * class the offsets came from.
 *
 * References: SLOT() is borrowed and only good until the next call that can run Python code
 * (a dunder, a finalizer run by an allocation's collection): whatever must outlive such a
 * call is taken with slot_get() (a new reference). Writes go through slot_put()/slot_set(),
 * which store first and release the old value after, so code run by that release sees the
 * object consistent.
 */
#ifndef GUARD_SLOTS_H
#define GUARD_SLOTS_H

#include <Python.h>
#include <structmember.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

/* The slot at `off` of `o`: a borrowed reference, NULL while unset. */
#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* The offset of the __slots__ member `name` of `type`, and only when `type.name` (Python's
 * lookup, along the MRO) is that member's descriptor: a property or a class attribute of
 * that name in a subclass refuses, as does a member that is not an object slot. The member is
 * found in the member tables of the type and its bases (the layout chain that holds every
 * slot), nearest first, as the MRO finds it. */
static int member_offset(PyObject *type, const char *name, Py_ssize_t *off) {
    PyObject *d = PyObject_GetAttrString(type, name);
    PyTypeObject *t;
    if (d == NULL) return -1;
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        Py_DECREF(d);
        PyErr_Format(PyExc_TypeError, "%s is not a slot", name);
        return -1;
    }
    Py_DECREF(d);
    for (t = (PyTypeObject *)type; t != NULL; t = (PyTypeObject *)PyType_GetSlot(t, Py_tp_base)) {
        PyMemberDef *m = (PyMemberDef *)PyType_GetSlot(t, Py_tp_members);
        if (PyErr_Occurred()) return -1;
        for (; m != NULL && m->name != NULL; m++) {
            if (strcmp(m->name, name) != 0) continue;
            if (m->type != Py_T_OBJECT_EX || m->offset < (Py_ssize_t)sizeof(PyObject) ||
                m->offset + (Py_ssize_t)sizeof(PyObject *) > ((PyTypeObject *)type)->tp_basicsize) {
                PyErr_Format(PyExc_TypeError, "%s is not an object slot", name);
                return -1;
            }
            *off = m->offset;
            return 0;
        }
        if (!(PyType_GetFlags(t) & Py_TPFLAGS_HEAPTYPE)) break; /* built-in bases: no slots */
    }
    PyErr_Format(PyExc_TypeError, "%s is not a slot", name);
    return -1;
}

/* The slot's value as a new reference; NULL with AttributeError when it is unset. */
static inline PyObject *slot_get(PyObject *o, Py_ssize_t off) {
    PyObject *v = SLOT(o, off);
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "slot not set");
        return NULL;
    }
    return Py_NewRef(v);
}

/* slot = v, stealing the reference to v; the old value is released after the store. */
static inline void slot_put(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = v;
    Py_XDECREF(old);
}

/* slot = v (a new reference is taken). */
static inline void slot_set(PyObject *o, Py_ssize_t off, PyObject *v) {
    slot_put(o, off, Py_NewRef(v));
}

/* slot += delta, as Python's `o.x += delta` computes it (read, __iadd__, store: the result
 * is stored whatever __iadd__ did to the slot meanwhile); 0, or -1 with an exception (then
 * nothing is stored). The caller holds `o` and `delta`. */
static int slot_add(PyObject *o, Py_ssize_t off, PyObject *delta) {
    PyObject *v = slot_get(o, off), *sum;
    if (v == NULL) return -1;
    sum = PyNumber_InPlaceAdd(v, delta);
    Py_DECREF(v);
    if (sum == NULL) return -1;
    slot_put(o, off, sum);
    return 0;
}

#endif
