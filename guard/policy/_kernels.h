/*
 * The record kernels of guard/policy/_speedups.c (included there: one translation unit, so
 * they share its loop-window helpers call_values and quiet_window). See the comment below.
 */
#ifndef GUARD_KERNELS_H
#define GUARD_KERNELS_H

/* ---- record kernels: the policy's per-span arithmetic on its own objects --------------------
 *
 * The guard's span path (guard/server/applier/_applynative.c) records every span of the three common
 * kinds through these (and checks a request's touched runs with budget_quiet), instead of through Budget.record_step / record_model_call,
 * LoopDetector.observe_action / end_step and Forecaster.observe. Each one does exactly what its
 * Python method does, in the same order and with the same Python arithmetic (PyNumber_*), on
 * the slots of the policy's own classes, which guard/policy/_kernels.py hands to bind() (the
 * offsets are read from the classes' member descriptors, and every object is checked to be
 * of exactly the bound class). Exactness by refusal: a kernel that returns None has changed
 * nothing, and its caller takes the Python method instead (a budget whose lock is held by
 * another thread, a count or cost the Python check would refuse, a step it does not cover).
 * tests/policy/test_policy_kernels.py holds each kernel to its method. */

enum {
    B_USAGES, B_SEQ, B_LOCK, B_LIMITS, B_TRIG, B_USAGE, B_RESERVED, B_CLOCK, B_STARTED,
    B_PAUSED_AT, B_PAUSED_TOTAL, NB
};
enum { U_STEPS, U_MODEL_CALLS, U_IN, U_OUT, U_REASONING, U_CACHED, U_COST, U_TOOLS, U_ATTEMPTS, NU };
enum { L_ACTS, L_RES, L_N, L_SETTINGS, L_STALE, L_GBITS, L_GOFF, NL };
enum { F_N, F_SX, F_SY, F_SXX, F_SXY, F_LAST, NF };
static PyTypeObject *k_budget, *k_usage, *k_loop, *k_forecaster;
static Py_ssize_t off_b[NB], off_u[NU], off_l[NL], off_f[NF];
static PyObject *k_ok, *k_zero_f, *k_zero, *k_one, *s_acquire, *s_release, *s_locked,
    *s_window, *s_threshold;
/* the trigger points' fields (Triggers, _escalation.py) and the limits' the check reads */
enum { TR_LIMITS, TR_RANK, TR_STEPS, TR_MODEL_CALLS, TR_TOKENS, TR_TOKENS_RESERVE, TR_COST,
       TR_TOOL_CALLS, TR_ELAPSED, TR_ELAPSED_RESERVE, NTR };
static PyObject *s_tr[NTR], *s_deadline, *s_freezes, *k_inf;

/* The kernels' constants, made by the first bind() (each once: see guard_intern). */
static int constants(void) {
    static const guard_name names[] = {
        {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_locked, "locked"},
        {&s_window, "window"}, {&s_threshold, "repeat_threshold"},
        {&s_deadline, "deadline_s"}, {&s_freezes, "pause_freezes_deadline"},
        {&s_tr[TR_LIMITS], "limits"}, {&s_tr[TR_RANK], "rank"}, {&s_tr[TR_STEPS], "steps"},
        {&s_tr[TR_MODEL_CALLS], "model_calls"}, {&s_tr[TR_TOKENS], "tokens"},
        {&s_tr[TR_TOKENS_RESERVE], "tokens_reserve"}, {&s_tr[TR_COST], "cost_usd"},
        {&s_tr[TR_TOOL_CALLS], "tool_calls"}, {&s_tr[TR_ELAPSED], "elapsed_s"},
        {&s_tr[TR_ELAPSED_RESERVE], "elapsed_reserve_s"}};
    if (k_zero_f == NULL && (k_zero_f = PyFloat_FromDouble(0.0)) == NULL) return -1;
    if (k_inf == NULL && (k_inf = PyFloat_FromDouble(Py_HUGE_VAL)) == NULL) return -1;
    if (k_one == NULL && (k_one = PyLong_FromLong(1)) == NULL) return -1;
    if (k_zero == NULL && (k_zero = PyLong_FromLong(0)) == NULL) return -1;
    return guard_intern(names, Py_ARRAY_LENGTH(names));
}

static int offsets(PyObject *type, const char *const *names, Py_ssize_t *out, int n) {
    int i;
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes classes");
        return -1;
    }
    for (i = 0; i < n; i++)
        if (member_offset(type, names[i], &out[i]) < 0) return -1;
    return 0;
}

/* bind(Budget, Usage, LoopDetector, Forecaster, ok_verdict): all or nothing (a bind that
 * fails leaves the classes and offsets bound before it, which the objects are checked by). */
static PyObject *sp_bind(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    static const char *const nb[] = {"_usages",   "_seq",   "_lock",    "_limits",
                                     "_trig",     "_usage", "_reserved", "_clock",
                                     "_started",  "_paused_at", "_paused_total"};
    static const char *const nu[] = {"steps",         "model_calls",      "input_tokens",
                                     "output_tokens", "reasoning_tokens", "cached_tokens",
                                     "cost_usd",      "tool_calls",       "tool_attempts"};
    static const char *const nl[] = {"_acts", "_res", "_n", "settings", "_stale", "_gbits", "_goff"};
    static const char *const nf[] = {"_n", "_sx", "_sy", "_sxx", "_sxy", "_last"};
    Py_ssize_t ob[NB], ou[NU], ol[NL], of[NF];
    if (!guard_nargs("bind", nargs, 5)) return NULL;
    if (offsets(args[0], nb, ob, NB) < 0 || offsets(args[1], nu, ou, NU) < 0 ||
        offsets(args[2], nl, ol, NL) < 0 || offsets(args[3], nf, of, NF) < 0)
        return NULL;
    if (constants() < 0) return NULL;
    memcpy(off_b, ob, sizeof ob);
    memcpy(off_u, ou, sizeof ou);
    memcpy(off_l, ol, sizeof ol);
    memcpy(off_f, of, sizeof of);
    Py_XSETREF(k_budget, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(k_usage, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(k_loop, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(k_forecaster, (PyTypeObject *)Py_NewRef(args[3]));
    Py_XSETREF(k_ok, Py_NewRef(args[4]));
    Py_RETURN_NONE;
}

/* u.cost_usd = (u.cost_usd or 0.0) + cost */
static int add_cost(PyObject *u, PyObject *cost) {
    PyObject *v = slot_get(u, off_u[U_COST]), *sum;
    int t;
    if (v == NULL) return -1;
    t = PyObject_IsTrue(v);
    if (t < 0) {
        Py_DECREF(v);
        return -1;
    }
    sum = PyNumber_Add(t ? v : k_zero_f, cost);
    Py_DECREF(v);
    if (sum == NULL) return -1;
    slot_put(u, off_u[U_COST], sum);
    return 0;
}

/* An exact int >= 0 (of any size). */
static int plain_count(PyObject *v) {
    int over;
    long long x;
    if (!PyLong_CheckExact(v)) return 0;
    x = PyLong_AsLongLongAndOverflow(v, &over); /* cannot fail on an exact int */
    return over > 0 || (over == 0 && x >= 0);
}

/* The pending exception kept across a call that must run anyway (the lock's release). */
#if PY_VERSION_HEX >= 0x030C0000
#define SAVE_EXC(e) PyObject *e = PyErr_GetRaisedException()
#define RESTORE_EXC(e) PyErr_SetRaisedException(e)
#else
#define SAVE_EXC(e) PyObject *e##_t, *e##_v, *e##_tb; PyErr_Fetch(&e##_t, &e##_v, &e##_tb)
#define RESTORE_EXC(e) PyErr_Restore(e##_t, e##_v, e##_tb)
#endif

/* The budget's lock taken without waiting, as the Python methods' `with self._lock:` holds
 * it around the same writes (so the kernels are right with or without the GIL: another
 * thread's method, or a kernel, waits or is refused): 1 taken (*lock a new reference, to give
 * to budget_exit), 0 refused (held elsewhere, or not the case), -1 error. */
static int budget_enter(PyObject *budget, PyObject **lock) {
    PyObject *l = SLOT(budget, off_b[B_LOCK]), *r, *call[2];
    if (l == NULL) return 0;
    Py_INCREF(l);
    call[0] = l, call[1] = Py_False;
    r = PyObject_VectorcallMethod(s_acquire, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) {
        Py_DECREF(l);
        return -1;
    }
    Py_DECREF(r);
    if (r != Py_True) {
        Py_DECREF(l);
        return 0;
    }
    *lock = l;
    return 1;
}

/* The lock of budget_enter() released (and its reference); `res` is returned, or NULL when
 * the release fails (an exception pending before it stays the one raised). */
static PyObject *budget_exit(PyObject *lock, PyObject *res) {
    PyObject *r;
    if (res == NULL && PyErr_Occurred()) {
        SAVE_EXC(exc);
        r = PyObject_CallMethodNoArgs(lock, s_release);
        Py_XDECREF(r);
        if (r == NULL) PyErr_Clear();
        RESTORE_EXC(exc);
    } else {
        r = PyObject_CallMethodNoArgs(lock, s_release);
        if (r == NULL) Py_CLEAR(res);
        Py_XDECREF(r);
    }
    Py_DECREF(lock);
    return res;
}

/* The budget's usages (itself and its ancestors), read under its lock (budget_enter), when
 * they may be recorded into natively: a new reference to the tuple, or NULL (refused). */
static PyObject *usages_of(PyObject *budget) {
    PyObject *usages = SLOT(budget, off_b[B_USAGES]);
    Py_ssize_t i;
    if (usages == NULL || SLOT(budget, off_b[B_SEQ]) == NULL || !PyTuple_CheckExact(usages))
        return NULL;
    for (i = 0; i < PyTuple_GET_SIZE(usages); i++)
        if (!Py_IS_TYPE(PyTuple_GET_ITEM(usages, i), k_usage)) return NULL;
    return Py_NewRef(usages);
}

/* A Usage whose counters the kernels write are plain values (exact ints, a cost that is an
 * exact float or int or None): adding to them runs no Python code. */
static int plain_usage(PyObject *u) {
    int f;
    for (f = U_STEPS; f <= U_ATTEMPTS; f++) {
        PyObject *v = SLOT(u, off_u[f]);
        if (v == NULL) return 0;
        if (f == U_COST ? !(v == Py_None || PyFloat_CheckExact(v) || PyLong_CheckExact(v))
                        : !PyLong_CheckExact(v))
            return 0;
    }
    return 1;
}

/* What a record kernel holds while it writes (see budget_begin). */
typedef struct {
    PyObject *lock;   /* the budget's lock, taken (free-threaded build), else NULL */
    PyObject *usages; /* the budget's usages tuple */
    int gc_was;       /* the collector was enabled (GIL build: paused while writing) */
} held;

/* The record kernels' common start: exactly a bound Budget and Usage, the budget's lock not
 * held by anyone, the usages read. 1 go (release with budget_end), 0 refused (nothing held),
 * -1 error.
 *
 * The Python methods write under `with self._lock:`; a kernel must exclude them the same way.
 * - Free-threaded build (Py_GIL_DISABLED, the GIL turned off): the lock is taken without
 *   waiting (held elsewhere: refused) and released by budget_end.
 * - With the GIL (the default, and what this module declares it needs, Py_mod_gil): the lock
 *   is checked free with locked(), then everything is written without running any Python
 *   code, so the GIL is never released in between and no other thread can take the lock
 *   meanwhile: every counter written must be a plain value (plain_usage, an exact int seq:
 *   else refused, for the method), and the collector is paused so that no finalizer runs
 *   during the writes' allocations. The same as taking the lock, at a third of the cost
 *   (acquire()'s argument parsing and release() are two calls more per span). */
static int budget_begin(PyObject *b, PyObject *also, held *h) {
    PyObject *lock, *r;
    Py_ssize_t i;
    if (k_budget == NULL || !Py_IS_TYPE(b, k_budget) || !Py_IS_TYPE(also, k_usage)) return 0;
#ifdef Py_GIL_DISABLED
    int rc = budget_enter(b, &lock);
    if (rc <= 0) return rc;
    h->lock = lock;
#else
    if ((lock = SLOT(b, off_b[B_LOCK])) == NULL) return 0;
    Py_INCREF(lock);
    r = PyObject_CallMethodNoArgs(lock, s_locked);
    Py_DECREF(lock);
    if (r == NULL) return -1;
    Py_DECREF(r);
    if (r != Py_False) return 0;
    h->lock = NULL;
#endif
    /* read after locked()/acquire(), which may have run Python code */
    h->usages = usages_of(b);
    if (h->usages == NULL) goto refuse;
#ifndef Py_GIL_DISABLED
    if (!PyLong_CheckExact(SLOT(b, off_b[B_SEQ])) || !plain_usage(also)) goto refuse;
    for (i = 0; i < PyTuple_GET_SIZE(h->usages); i++)
        if (!plain_usage(PyTuple_GET_ITEM(h->usages, i))) goto refuse;
    h->gc_was = PyGC_Disable();
#else
    (void)i, (void)r;
    h->gc_was = 0;
#endif
    return 1;
refuse:
    Py_CLEAR(h->usages);
    if (h->lock != NULL) {
        r = budget_exit(h->lock, Py_NewRef(Py_None));
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* The kernels' common end: the budget's seq (or the error), what begin took released. */
static PyObject *budget_end(PyObject *b, held *h, int failed) {
    PyObject *res = failed ? NULL : slot_get(b, off_b[B_SEQ]);
    if (h->gc_was) PyGC_Enable();
    Py_DECREF(h->usages);
    return h->lock == NULL ? res : budget_exit(h->lock, res);
}

/* None when begin refused, NULL when it failed. */
#define REFUSED(rc) ((rc) < 0 ? NULL : Py_NewRef(Py_None))

/* budget_step(budget, also) -> seq | None: Budget.record_step(), then also.steps += 1. */
static PyObject *sp_budget_step(PyObject *Py_UNUSED(self), PyObject *const *args,
                                Py_ssize_t nargs) {
    PyObject *usages, *b;
    held h;
    Py_ssize_t i;
    int rc, failed = 0;
    if (!guard_nargs("budget_step", nargs, 2)) return NULL;
    b = args[0];
    rc = budget_begin(b, args[1], &h);
    if (rc <= 0) return REFUSED(rc);
    usages = h.usages;
    for (i = 0; i < PyTuple_GET_SIZE(usages) && !failed; i++)
        failed = slot_add(PyTuple_GET_ITEM(usages, i), off_u[U_STEPS], k_one) < 0;
    failed = failed || slot_add(b, off_b[B_SEQ], k_one) < 0 ||
             slot_add(args[1], off_u[U_STEPS], k_one) < 0;
    return budget_end(b, &h, failed);
}

/* The model-call counters of one usage, in Budget._add_model_call_locked's order. */
static int add_model(PyObject *u, PyObject *const *c, PyObject *cost) {
    int j;
    if (slot_add(u, off_u[U_MODEL_CALLS], k_one) < 0) return -1;
    for (j = 0; j < 4; j++)
        if (slot_add(u, off_u[U_IN + j], c[j]) < 0) return -1;
    return cost == Py_None ? 0 : add_cost(u, cost);
}

/* budget_model_call(budget, also, input, output, reasoning, cached, cost) -> seq | None:
 * Budget.record_model_call(...) of plain counts (exact ints >= 0) and a plain cost (None or
 * an exact finite float >= 0), then the same usage added to `also`. */
static PyObject *sp_budget_model_call(PyObject *Py_UNUSED(self), PyObject *const *args,
                                      Py_ssize_t nargs) {
    PyObject *usages, *b, *cost;
    held h;
    Py_ssize_t i;
    int j, rc, failed = 0;
    if (!guard_nargs("budget_model_call", nargs, 7)) return NULL;
    for (j = 2; j < 6; j++)
        if (!plain_count(args[j])) Py_RETURN_NONE;
    cost = args[6];
    if (cost != Py_None) {
        double c;
        if (!PyFloat_CheckExact(cost)) Py_RETURN_NONE;
        c = PyFloat_AS_DOUBLE(cost);
        if (!(c >= 0.0 && c < Py_HUGE_VAL)) Py_RETURN_NONE;
    }
    b = args[0];
    rc = budget_begin(b, args[1], &h);
    if (rc <= 0) return REFUSED(rc);
    usages = h.usages;
    failed = slot_add(b, off_b[B_SEQ], k_one) < 0;
    for (i = 0; i < PyTuple_GET_SIZE(usages) && !failed; i++)
        failed = add_model(PyTuple_GET_ITEM(usages, i), args + 2, cost) < 0;
    failed = failed || add_model(args[1], args + 2, cost) < 0;
    return budget_end(b, &h, failed);
}

/* budget_tool_calls(budget, also, n, attempts) -> seq | None:
 * Budget.record_tool_calls(n, attempts=attempts) of exact ints >= 0 and no cost, then
 * also.tool_calls += n and also.tool_attempts += attempts. */
static PyObject *sp_budget_tool_calls(PyObject *Py_UNUSED(self), PyObject *const *args,
                                      Py_ssize_t nargs) {
    PyObject *usages, *b, *u;
    held h;
    Py_ssize_t i;
    int rc, failed = 0;
    if (!guard_nargs("budget_tool_calls", nargs, 4)) return NULL;
    if (!plain_count(args[2]) || !plain_count(args[3])) Py_RETURN_NONE;
    b = args[0];
    rc = budget_begin(b, args[1], &h);
    if (rc <= 0) return REFUSED(rc);
    usages = h.usages;
    for (i = 0; i < PyTuple_GET_SIZE(usages) && !failed; i++) {
        u = PyTuple_GET_ITEM(usages, i);
        failed = slot_add(u, off_u[U_TOOLS], args[2]) < 0 ||
                 slot_add(u, off_u[U_ATTEMPTS], args[3]) < 0;
    }
    failed = failed || slot_add(b, off_b[B_SEQ], k_one) < 0 ||
             slot_add(args[1], off_u[U_TOOLS], args[2]) < 0 ||
             slot_add(args[1], off_u[U_ATTEMPTS], args[3]) < 0;
    return budget_end(b, &h, failed);
}

/* 1 when `a op b` (Python's comparison), 0 when not, -1 on error. */
static int cmp(PyObject *a, PyObject *b, int op) { return PyObject_RichCompareBool(a, b, op); }

/* Budget._elapsed_locked(): a new reference, or NULL. */
static PyObject *elapsed_of(PyObject *b, PyObject *limits) {
    PyObject *clock, *now, *freezes, *x = NULL, *paused = NULL, *y, *v;
    int f;
    if ((clock = slot_get(b, off_b[B_CLOCK])) == NULL) return NULL;
    now = PyObject_CallNoArgs(clock);
    Py_DECREF(clock);
    if (now == NULL) return NULL;
    freezes = PyObject_GetAttr(limits, s_freezes);
    f = freezes == NULL ? -1 : PyObject_IsTrue(freezes);
    Py_XDECREF(freezes);
    if (f < 0) goto fail;
    if ((v = slot_get(b, off_b[B_STARTED])) == NULL) goto fail;
    x = PyNumber_Subtract(now, v);
    Py_DECREF(v);
    if (x == NULL) goto fail;
    if (f) {
        if ((paused = slot_get(b, off_b[B_PAUSED_TOTAL])) == NULL) goto fail;
        if ((v = slot_get(b, off_b[B_PAUSED_AT])) == NULL) goto fail;
        if (v != Py_None) {
            PyObject *d = PyNumber_Subtract(now, v);
            y = d == NULL ? NULL : PyNumber_InPlaceAdd(paused, d);
            Py_XDECREF(d);
            Py_SETREF(paused, y);
        }
        Py_DECREF(v);
        if (paused == NULL) goto fail;
        y = PyNumber_Subtract(x, paused);
        Py_CLEAR(paused);
        Py_SETREF(x, y);
        if (x == NULL) goto fail;
    }
    Py_DECREF(now);
    f = cmp(x, k_zero_f, Py_GT); /* max(0.0, x) */
    if (f < 0) {
        Py_DECREF(x);
        return NULL;
    }
    if (!f) Py_SETREF(x, Py_NewRef(k_zero_f));
    return x;
fail:
    Py_DECREF(now);
    Py_XDECREF(x);
    Py_XDECREF(paused);
    return NULL;
}

/* `o.<slot> op y` with the slot read now: 1, 0, or -1 on an error (an unset slot included). */
static int cmp_slot(PyObject *o, Py_ssize_t off, PyObject *y, int op) {
    PyObject *v = slot_get(o, off);
    int c;
    if (v == NULL) return -1;
    c = cmp(v, y, op);
    Py_DECREF(v);
    return c;
}

/* A usage's input_tokens + output_tokens, both read now: a new reference, or NULL. */
static PyObject *tokens_of(PyObject *u) {
    PyObject *in = slot_get(u, off_u[U_IN]), *out, *sum;
    if (in == NULL) return NULL;
    if ((out = slot_get(u, off_u[U_OUT])) == NULL) {
        Py_DECREF(in);
        return NULL;
    }
    sum = PyNumber_Add(in, out);
    Py_DECREF(in), Py_DECREF(out);
    return sum;
}

/* The check of Escalations._quiet_locked(rank) with the budget's current trigger points:
 * 1 quiet, 0 not (or not known here), -1 error. Every field is read as a new reference: the
 * attribute reads and comparisons below can run Python code, which may rebind any of them. */
static int quiet_of(PyObject *b, PyObject *rank) {
    PyObject *limits = SLOT(b, off_b[B_LIMITS]), *t = SLOT(b, off_b[B_TRIG]), *tr[NTR];
    PyObject *u = SLOT(b, off_b[B_USAGE]), *r = SLOT(b, off_b[B_RESERVED]), *tokens = NULL;
    PyObject *deadline = NULL, *elapsed = NULL, *v;
    int i, rc = 0, c;
    if (!limits || !t || !u || !r || !Py_IS_TYPE(u, k_usage) || !Py_IS_TYPE(r, k_usage))
        return 0;
    Py_INCREF(limits), Py_INCREF(t), Py_INCREF(u), Py_INCREF(r);
    for (i = 0; i < NTR; i++) tr[i] = NULL;
    for (i = 0; i < NTR; i++)
        if ((tr[i] = PyObject_GetAttr(t, s_tr[i])) == NULL) goto done;
    /* stale trigger points (other limits or rank): the method recomputes them */
    if (tr[TR_LIMITS] != limits || (c = cmp(tr[TR_RANK], rank, Py_EQ)) <= 0) goto done;
    if ((tokens = tokens_of(u)) == NULL) goto done;
#define FIRES(x, y) ((c = cmp((x), (y), Py_GE)) != 0)         /* true on error too */
#define SLOT_FIRES(o, f, y) ((c = cmp_slot((o), off_u[f], (y), Py_GE)) != 0)
    if (SLOT_FIRES(u, U_STEPS, tr[TR_STEPS]) || SLOT_FIRES(u, U_MODEL_CALLS, tr[TR_MODEL_CALLS]) ||
        FIRES(tokens, tr[TR_TOKENS]) || SLOT_FIRES(u, U_TOOLS, tr[TR_TOOL_CALLS]))
        goto done;
    if ((c = cmp(tr[TR_TOKENS_RESERVE], k_inf, Py_NE)) != 0) {
        PyObject *held;
        if (c < 0) goto done;
        if ((held = tokens_of(r)) == NULL) goto done;
        Py_SETREF(held, PyNumber_Add(tokens, held));
        if (held == NULL) goto done;
        c = cmp(held, tr[TR_TOKENS_RESERVE], Py_GE);
        Py_DECREF(held);
        if (c != 0) goto done;
    }
    if ((v = slot_get(u, off_u[U_COST])) == NULL) goto done;
    c = v == Py_None ? 0 : cmp(v, tr[TR_COST], Py_GE);
    Py_DECREF(v);
    if (c != 0) goto done;
    deadline = PyObject_GetAttr(limits, s_deadline);
    if (deadline == NULL) goto done;
    if (deadline == Py_None) { /* then the clock cannot make anything fire: not read */
        rc = 1;
        goto done;
    }
    elapsed = elapsed_of(b, limits);
    if (elapsed == NULL) goto done;
    if (FIRES(elapsed, tr[TR_ELAPSED]) || FIRES(elapsed, tr[TR_ELAPSED_RESERVE])) goto done;
    rc = 1;
#undef FIRES
#undef SLOT_FIRES
done:
    for (i = 0; i < NTR; i++) Py_XDECREF(tr[i]);
    Py_XDECREF(tokens);
    Py_XDECREF(deadline);
    Py_XDECREF(elapsed);
    Py_DECREF(limits), Py_DECREF(t), Py_DECREF(u), Py_DECREF(r);
    if (PyErr_Occurred()) return -1;
    return rc;
}

/* budget_quiet(budget, rank) -> True | None: True when Budget.escalation(above=<the action of
 * rank>) without a loop verdict is None for certain, by the check of _quiet_locked() on the
 * budget's trigger points as they are (read under its lock, as the method reads them); None
 * when that needs the method (its lock held, its trigger points for other limits or another
 * rank, a check that may fire). */
static PyObject *sp_budget_quiet(PyObject *Py_UNUSED(self), PyObject *const *args,
                                 Py_ssize_t nargs) {
    PyObject *b, *lock, *res;
    int rc;
    if (!guard_nargs("budget_quiet", nargs, 2)) return NULL;
    b = args[0];
    if (k_budget == NULL || !Py_IS_TYPE(b, k_budget) || !PyLong_CheckExact(args[1]))
        Py_RETURN_NONE;
    rc = budget_enter(b, &lock);
    if (rc <= 0) return REFUSED(rc);
    for (rc = 0; rc < NB; rc++)
        if (SLOT(b, off_b[rc]) == NULL) break;
    rc = rc < NB ? 0 : quiet_of(b, args[1]);
    res = rc < 0 ? NULL : Py_NewRef(rc ? Py_True : Py_None);
    return budget_exit(lock, res);
}

/* The detector's rings and window when it is exactly a bound LoopDetector whose rings match
 * its settings (else 0: the Python method handles it). The settings' attribute reads run
 * Python code: the settings object is held across them, and the rings are read after them. */
static int loop_rings(PyObject *d, Py_buffer *va, Py_buffer *vr, Py_ssize_t *w, Py_ssize_t *k) {
    PyObject *settings, *v, *acts, *res;
    int rc;
    if (k_loop == NULL || !Py_IS_TYPE(d, k_loop)) return 0;
    settings = SLOT(d, off_l[L_SETTINGS]);
    if (settings == NULL) return 0;
    Py_INCREF(settings);
    v = PyObject_GetAttr(settings, s_window);
    if (v == NULL) goto fail;
    *w = PyLong_CheckExact(v) ? PyLong_AsSsize_t(v) : -1;
    Py_DECREF(v);
    v = PyObject_GetAttr(settings, s_threshold);
    if (v == NULL) goto fail;
    *k = PyLong_CheckExact(v) ? PyLong_AsSsize_t(v) : -1;
    Py_DECREF(v);
    Py_DECREF(settings);
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear(); /* a window beyond Py_ssize_t: the method's */
        return 0;
    }
    if (*w < 2 || *k < 2 || *w > PY_SSIZE_T_MAX / 8) return 0;
    acts = SLOT(d, off_l[L_ACTS]), res = SLOT(d, off_l[L_RES]);
    if (acts == NULL || res == NULL) return 0;
    Py_INCREF(acts), Py_INCREF(res);
    rc = -1;
    if (rings_get(acts, res, va, vr) < 0) goto out;
    /* (the views hold the rings: an array with an exported buffer cannot be resized) */
    if (va->len != 8 * *w || vr->len != 8 * *w) {
        rings_release(va, vr);
        rc = 0;
        goto out;
    }
    rc = 1;
out:
    Py_DECREF(acts), Py_DECREF(res);
    return rc;
fail:
    Py_DECREF(settings);
    return -1;
}

/* loop_observe(detector, action, result) -> bool | None: LoopDetector.observe_action()'s
 * first half, as observe() above on the detector's own rings, with its call count advanced:
 * True when no pattern can fire (the verdict is CONTINUE), False when the caller must finish
 * with detector.judge_last(). None, with nothing written: the method handles it. */
static PyObject *sp_loop_observe(PyObject *Py_UNUSED(self), PyObject *const *args,
                                 Py_ssize_t nargs) {
    Py_buffer va, vr;
    Py_ssize_t w, k, slot, n;
    uint64_t a, r;
    PyObject *d, *nobj, *next;
    int rc, quiet;
    if (!guard_nargs("loop_observe", nargs, 3)) return NULL;
    d = args[0];
    if (!call_values(args[1], args[2], &a, &r)) Py_RETURN_NONE;
    rc = loop_rings(d, &va, &vr, &w, &k);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    /* the count, read after everything that can run Python code (the settings' reads) */
    nobj = SLOT(d, off_l[L_N]);
    n = nobj != NULL && PyLong_CheckExact(nobj) ? PyLong_AsSsize_t(nobj) : -1;
    if (n < 0 || n == PY_SSIZE_T_MAX) {
        rings_release(&va, &vr);
        PyErr_Clear(); /* an exact int: only OverflowError; the method's to answer */
        Py_RETURN_NONE;
    }
    next = PyLong_FromSsize_t(n + 1);
    if (next == NULL) {
        rings_release(&va, &vr);
        return NULL;
    }
    slot = n % w;
    quiet = quiet_window(va.buf, vr.buf, w, slot, a, r, k - 1, k + 1);
    rings_release(&va, &vr);
    slot_put(d, off_l[L_N], next);
    return PyBool_FromLong(quiet);
}

/* loop_end_step(detector, state, progress) -> verdict | None: LoopDetector.end_step() when
 * the step says nothing (no state, no progress signal: CONTINUE, nothing changes) or reports
 * progress without a state (the stale count restarts and the facts grew at this call count,
 * within the kept bits). None, with nothing changed, for every other step. */
static PyObject *sp_loop_end_step(PyObject *Py_UNUSED(self), PyObject *const *args,
                                  Py_ssize_t nargs) {
    PyObject *d, *n, *goff, *gbits, *acts, *b, *bit, *merged;
    Py_ssize_t width;
    long long bv;
    int over;
    if (!guard_nargs("loop_end_step", nargs, 3)) return NULL;
    d = args[0];
    if (k_loop == NULL || !Py_IS_TYPE(d, k_loop) || args[1] != Py_None) Py_RETURN_NONE;
    if (args[2] == Py_None) return Py_NewRef(k_ok);
    if (args[2] != Py_True) Py_RETURN_NONE;
    if ((acts = SLOT(d, off_l[L_ACTS])) == NULL) Py_RETURN_NONE;
    Py_INCREF(acts);
    width = PyObject_Length(acts); /* may run Python code: the other fields are read after */
    Py_DECREF(acts);
    if (width < 0) return NULL;
    n = SLOT(d, off_l[L_N]);
    goff = SLOT(d, off_l[L_GOFF]);
    gbits = SLOT(d, off_l[L_GBITS]);
    if (!n || !goff || !gbits || !PyLong_CheckExact(n) || !PyLong_CheckExact(goff) ||
        !PyLong_CheckExact(gbits) || SLOT(d, off_l[L_STALE]) == NULL)
        Py_RETURN_NONE;
    bv = PyLong_AsLongLongAndOverflow(n, &over);
    if (!over) {
        long long g = PyLong_AsLongLongAndOverflow(goff, &over);
        if (!over && ((g < 0 && bv > LLONG_MAX + g) || (g > 0 && bv < LLONG_MIN + g))) over = 1;
        if (!over) bv -= g;
    }
    if (over || PyErr_Occurred() || bv >= 2 * (long long)width) Py_RETURN_NONE; /* _grown() */
    if (bv < 0) Py_RETURN_NONE;
    Py_INCREF(gbits); /* the allocations below may collect, and a finalizer rebind it */
    b = PyLong_FromLongLong(bv);
    bit = b == NULL ? NULL : PyNumber_Lshift(k_one, b);
    Py_XDECREF(b);
    merged = bit == NULL ? NULL : PyNumber_Or(gbits, bit);
    Py_XDECREF(bit);
    Py_DECREF(gbits);
    if (merged == NULL) return NULL;
    slot_put(d, off_l[L_GBITS], merged);
    slot_set(d, off_l[L_STALE], k_zero);
    return Py_NewRef(k_ok);
}

/* forecast_observe(forecaster, step_index, input_tokens) -> True | None: Forecaster.observe()
 * of an exact int step_index >= 1 and exact int input_tokens >= 0 (None: the method, which
 * raises, handles anything else). The sums are Python floats: float + int converts the int
 * as PyLong_AsDouble does, so the doubles here are the ones Python computes (no fused
 * multiply-add: each product is stored before it is added). */
static PyObject *sp_forecast_observe(PyObject *Py_UNUSED(self), PyObject *const *args,
                                     Py_ssize_t nargs) {
    PyObject *f, *idx, *tok, *v[NF], *nv[NF];
    volatile double x, t, xx, xy; /* volatile: rounded to double at each step, as in Python */
    long long ix;
    int i, over;
    if (!guard_nargs("forecast_observe", nargs, 3)) return NULL;
    f = args[0], idx = args[1], tok = args[2];
    if (k_forecaster == NULL || !Py_IS_TYPE(f, k_forecaster) || !PyLong_CheckExact(idx) ||
        !plain_count(tok))
        Py_RETURN_NONE;
    ix = PyLong_AsLongLongAndOverflow(idx, &over);
    if (over || ix < 1 || ix > (1LL << 53)) Py_RETURN_NONE; /* float(ix - 1) is exact below */
    for (i = 0; i < NF; i++) {
        v[i] = SLOT(f, off_f[i]);
        if (v[i] == NULL) Py_RETURN_NONE;
    }
    if (!PyLong_CheckExact(v[F_N]) || !PyLong_CheckExact(v[F_LAST]) ||
        !PyFloat_CheckExact(v[F_SX]) || !PyFloat_CheckExact(v[F_SY]) ||
        !PyFloat_CheckExact(v[F_SXX]) || !PyFloat_CheckExact(v[F_SXY]))
        Py_RETURN_NONE;
    /* held: the allocations below may collect, and a finalizer rebind the fields */
    for (i = 0; i < NF; i++) Py_INCREF(v[i]);
    t = PyLong_AsDouble(tok);
    if (t == -1.0 && PyErr_Occurred()) {
        for (i = 0; i < NF; i++) Py_DECREF(v[i]);
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear(); /* Python raises OverflowError there too: the method's to answer */
        Py_RETURN_NONE;
    }
    x = (double)(ix - 1);
    xx = x * x;
    xy = x * t;
    nv[F_N] = PyNumber_Add(v[F_N], k_one);
    nv[F_SX] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SX]) + x);
    nv[F_SY] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SY]) + t);
    nv[F_SXX] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SXX]) + xx);
    nv[F_SXY] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SXY]) + xy);
    over = PyObject_RichCompareBool(idx, v[F_LAST], Py_GT); /* max(last, idx) keeps last */
    nv[F_LAST] = over > 0 ? Py_NewRef(idx) : Py_NewRef(v[F_LAST]);
    if (over < 0 || !nv[F_N] || !nv[F_SX] || !nv[F_SY] || !nv[F_SXX] || !nv[F_SXY]) {
        for (i = 0; i < NF; i++) Py_XDECREF(nv[i]), Py_DECREF(v[i]);
        return NULL;
    }
    for (i = 0; i < NF; i++) slot_put(f, off_f[i], nv[i]);
    for (i = 0; i < NF; i++) Py_DECREF(v[i]);
    Py_RETURN_TRUE;
}

#endif
