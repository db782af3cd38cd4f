/*
 * Reading and writing the __slots__ of Python objects from C, for the native paths that work
 * on the objects of exactly known classes (guard/policy/_speedups.c's record kernels and
 * guard/server/_applynative.c): a slot's offset is read once from its class's member
 * descriptor, then the slot is one pointer in the object. The callers check every object's
 * exact type against the class the offsets came from.
 */
#ifndef GUARD_SLOTS_H
#define GUARD_SLOTS_H

#include <Python.h>
#include <structmember.h>

/* The slot at `off` of `o`: a borrowed reference, NULL while unset. */
#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* The offset of the __slots__ member `name` of `type` (a member descriptor of an object). */
static int member_offset(PyObject *type, const char *name, Py_ssize_t *off) {
    PyObject *d = PyObject_GetAttrString(type, name);
    int ok;
    if (d == NULL) return -1;
    ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
         ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok) *off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) PyErr_Format(PyExc_TypeError, "%s is not a slot", name);
    return ok ? 0 : -1;
}

/* slot += delta, as Python's += computes it; 0, or -1 with an exception (nothing changed). */
static int slot_add(PyObject *o, Py_ssize_t off, PyObject *delta) {
    PyObject *v = SLOT(o, off), *sum;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "slot not set");
        return -1;
    }
    sum = PyNumber_InPlaceAdd(v, delta);
    if (sum == NULL) return -1;
    SLOT(o, off) = sum;
    Py_DECREF(v);
    return 0;
}

/* slot = v (a new reference is taken). */
static void slot_set(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = Py_NewRef(v);
    Py_XDECREF(old);
}

#endif
