/*
 * The request's end in the native span applier (included by guard/server/applier/_applynative.c: one
 * translation unit, sharing its configuration, kernel() and rank_of()): the tool calls
 * counted per run flushed into the budgets, and the touched runs concluded.
 */
#ifndef GUARD_APPLY_END_H
#define GUARD_APPLY_END_H

/* _spanhost.flush(): each run's tool calls counted in `touched` recorded in its budget (one
 * record per run) and added to its tenant's usage in `spent`. 0, or -1 with an exception.
 * Each pair is held while it is worked on (the kernels and methods may run code that changes
 * the dicts). */
static int flush_one(PyObject *run, PyObject *e, PyObject *spent) {
    PyObject *n, *attempts, *usage, *budget, *tenant, *r, *args[4];
    int t, rc = -1;
    if (!Py_IS_TYPE(e, touched_type) || !Py_IS_TYPE(run, run_type)) {
        PyErr_SetString(PyExc_TypeError, "flush(): not a Touched of a RunState");
        return -1;
    }
    n = SLOT(e, off_tc[T_TOOLS]);
    attempts = SLOT(e, off_tc[T_ATTEMPTS]);
    budget = SLOT(run, off_r[R_BUDGET]);
    tenant = SLOT(run, off_r[R_TENANT]);
    if (n == NULL || attempts == NULL || budget == NULL || tenant == NULL) {
        PyErr_SetString(PyExc_AttributeError, "flush(): slot not set");
        return -1;
    }
    Py_INCREF(n), Py_INCREF(attempts), Py_INCREF(budget), Py_INCREF(tenant);
    usage = NULL;
    t = PyObject_IsTrue(n);
    if (t <= 0) {
        rc = t;
        goto done;
    }
    usage = PyDict_GetItemWithError(spent, tenant);
    if (usage == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, tenant);
        goto done;
    }
    Py_INCREF(usage);
    args[0] = budget, args[1] = usage, args[2] = n, args[3] = attempts;
    t = kernel(K_BUDGET_TOOL_CALLS, args, 4, &r);
    if (t < 0) goto done;
    if (t == 0) { /* the method, then the tenant's usage, as _spanhost.flush() does */
        if (!Py_IS_TYPE(usage, usage_type)) {
            PyErr_SetString(PyExc_TypeError, "flush(): not a Usage");
            goto done;
        }
        args[0] = budget, args[1] = n, args[2] = attempts;
        r = PyObject_VectorcallMethod(s_record_tools, args, 2, attempts_kwnames);
        if (r == NULL) goto done;
        if (slot_add(usage, off_u[U_TOOLS], n) < 0 || slot_add(usage, off_u[U_ATTEMPTS], attempts) < 0) {
            Py_DECREF(r);
            goto done;
        }
    }
    Py_DECREF(r);
    slot_set(e, off_tc[T_TOOLS], k_zero);
    slot_set(e, off_tc[T_ATTEMPTS], k_zero);
    rc = 0;
done:
    Py_DECREF(n), Py_DECREF(attempts), Py_DECREF(budget), Py_DECREF(tenant);
    Py_XDECREF(usage);
    return rc < 0 ? -1 : 0;
}

static int flush(PyObject *touched, PyObject *spent) {
    PyObject *run, *e;
    Py_ssize_t pos = 0;
    int rc;
    while (PyDict_Next(touched, &pos, &run, &e)) {
        Py_INCREF(run), Py_INCREF(e);
        rc = flush_one(run, e, spent);
        Py_DECREF(run), Py_DECREF(e);
        if (rc < 0) return -1;
    }
    return 0;
}

/* flush(touched, spent) -> None (see flush() above) */
static PyObject *sn_flush(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "flush(dict, dict)");
        return NULL;
    }
    if (run_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "flush() before configure()");
        return NULL;
    }
    if (flush(args[0], args[1]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* _decisions._forecast_due(run, run.budget.limits): 1, 0, or -1 on error. */
static int forecast_due(PyObject *run) {
    PyObject *limits, *tokens = NULL, *cost = NULL, *left = NULL, *room = NULL, *lst = NULL;
    PyObject *used = NULL, *budget;
    int rc = -1, gt;
    if ((budget = slot_get(run, off_r[R_BUDGET])) == NULL) return -1;
    limits = PyObject_GetAttr(budget, s_limits);
    Py_DECREF(budget);
    if (limits == NULL) return -1;
    if ((tokens = PyObject_GetAttr(limits, s_max_tokens)) == NULL) goto done;
    if (tokens != Py_None) { /* tokens - run.gate_tokens <= span * max(last_step_tokens, 1) */
        if ((lst = slot_get(run, off_r[R_LAST_STEP_TOKENS])) == NULL) goto done;
        if ((gt = PyObject_RichCompareBool(k_one, lst, Py_GT)) < 0) goto done;
        if ((used = slot_get(run, off_r[R_GATE_TOKENS])) == NULL) goto done;
        if ((left = PyNumber_Subtract(tokens, used)) == NULL) goto done;
        if ((room = PyNumber_Multiply(k_span, gt ? k_one : lst)) == NULL) goto done;
        if ((rc = PyObject_RichCompareBool(left, room, Py_LE)) != 0) goto done;
        rc = -1;
        Py_CLEAR(left);
        Py_CLEAR(room);
        Py_CLEAR(lst);
        Py_CLEAR(used);
    }
    if ((cost = PyObject_GetAttr(limits, s_max_cost)) == NULL) goto done;
    rc = 0;
    if (cost == Py_None) goto done; /* cost - run.gate_cost_usd <= span * step_cost, step_cost > 0 */
    rc = -1;
    if ((lst = slot_get(run, off_r[R_LAST_STEP_COST])) == NULL) goto done;
    if ((rc = PyObject_RichCompareBool(lst, k_zero, Py_GT)) <= 0) goto done;
    rc = -1;
    if ((used = slot_get(run, off_r[R_GATE_COST])) == NULL) goto done;
    if ((left = PyNumber_Subtract(cost, used)) == NULL) goto done;
    if ((room = PyNumber_Multiply(k_span, lst)) == NULL) goto done;
    rc = PyObject_RichCompareBool(left, room, Py_LE);
done:
    Py_DECREF(limits);
    Py_XDECREF(tokens);
    Py_XDECREF(cost);
    Py_XDECREF(left);
    Py_XDECREF(room);
    Py_XDECREF(lst);
    Py_XDECREF(used);
    return rc;
}

/* Whether SpanApplier._decide(run, entry) would do nothing (after touched_at): no parents to
 * decide, and the run stopped, or quiet: no loop verdict above its soft level, its budget's
 * kernel sure of no escalation, and no forecast due. 1 yes, 0 no (or not known), -1 error.
 * The caller holds run and entry. */
static int nothing_to_decide(PyObject *run, PyObject *entry) {
    PyObject *soft = SLOT(run, off_r[R_SOFT]), *verdict, *rank, *q = NULL, *budget, *args[2];
    PyObject *warned;
    int rc;
    long v;
    if (SLOT(run, off_r[R_PARENT]) != Py_None) return 0;
    if (SLOT(run, off_r[R_STOP_REASON]) != Py_None) return 1;
    if (soft == NULL || SLOT(run, off_r[R_BUDGET]) == NULL) return 0;
    Py_INCREF(soft);
    rank = PyObject_GetAttr(soft, s_rank);
    Py_DECREF(soft);
    if (rank == NULL) return -1;
    verdict = SLOT(entry, off_tc[T_VERDICT]);
    if (verdict != NULL && verdict != Py_None && verdict != ok_verdict) {
        long r = PyLong_AsLong(rank);
        if (r == -1 && PyErr_Occurred()) {
            Py_DECREF(rank);
            return -1;
        }
        Py_INCREF(verdict);
        rc = rank_of(verdict, &v);
        Py_DECREF(verdict);
        if (rc < 0 || v > r) {
            Py_DECREF(rank);
            return rc < 0 ? -1 : 0;
        }
    }
    if ((budget = SLOT(run, off_r[R_BUDGET])) == NULL) {
        Py_DECREF(rank);
        return 0;
    }
    Py_INCREF(budget);
    args[0] = budget, args[1] = rank;
    rc = kernel(K_BUDGET_QUIET, args, 2, &q);
    Py_DECREF(rank);
    Py_DECREF(budget);
    if (rc <= 0) return rc;
    Py_DECREF(q);
    if (SLOT(entry, off_tc[T_PHASE]) != before_step) return 1;
    if ((warned = slot_get(run, off_r[R_FORECAST_WARNED])) == NULL) return -1;
    rc = PyObject_IsTrue(warned);
    Py_DECREF(warned);
    if (rc != 0) return rc < 0 ? -1 : 1;
    rc = forecast_due(run);
    return rc < 0 ? -1 : !rc;
}

/* conclude(touched, now, decide) -> None: SpanApplier.conclude()'s loop over the runs, in
 * order: each run's touched_at set to now, then decide(run, entry) unless it would do
 * nothing (see nothing_to_decide). */
static PyObject *sn_conclude(PyObject *Py_UNUSED(self), PyObject *const *args,
                             Py_ssize_t nargs) {
    PyObject *run, *entry, *r, *call[2];
    Py_ssize_t pos = 0;
    int rc;
    if (nargs != 3 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "conclude(dict, now, decide)");
        return NULL;
    }
    if (run_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "conclude() before configure()");
        return NULL;
    }
    while (PyDict_Next(args[0], &pos, &run, &entry)) {
        if (!Py_IS_TYPE(run, run_type) || !Py_IS_TYPE(entry, touched_type)) {
            PyErr_SetString(PyExc_TypeError, "conclude(): not a Touched of a RunState");
            return NULL;
        }
        Py_INCREF(run), Py_INCREF(entry); /* held: what runs below may change the dict */
        slot_set(run, off_r[R_TOUCHED_AT], args[1]);
        rc = nothing_to_decide(run, entry);
        r = NULL;
        if (rc == 0) {
            call[0] = run, call[1] = entry;
            r = PyObject_Vectorcall(args[2], call, 2, NULL);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        Py_DECREF(run), Py_DECREF(entry);
        if (rc < 0) return NULL;
    }
    Py_RETURN_NONE;
}

#endif
